//! The cluster manifests in `packaging/kubernetes/cluster/`, checked offline: every document
//! deserializes into its typed Kubernetes struct and serializes back to exactly what the file
//! says (a misspelt or unknown field would be dropped, and the comparison fails); the CRD is
//! the one the code derives.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/cluster")
}

fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join(file)).unwrap();
    parse_all(&text)
}

fn parse_all(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{}: {e}", doc["metadata"]["name"]));
    serde_json::to_value(typed).unwrap()
}

fn check(doc: &Value) {
    let back = match doc["kind"].as_str().unwrap() {
        "Namespace" => round_trip::<Namespace>(doc),
        "ServiceAccount" => round_trip::<ServiceAccount>(doc),
        "Role" => round_trip::<Role>(doc),
        "RoleBinding" => round_trip::<RoleBinding>(doc),
        "DaemonSet" => round_trip::<DaemonSet>(doc),
        "Deployment" => round_trip::<Deployment>(doc),
        "Service" => round_trip::<Service>(doc),
        "DeviceClass" => round_trip::<DeviceClass>(doc),
        "CustomResourceDefinition" => round_trip::<CustomResourceDefinition>(doc),
        "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>(doc),
        "ValidatingAdmissionPolicyBinding" => round_trip::<ValidatingAdmissionPolicyBinding>(doc),
        "RuntimeClass" => round_trip::<RuntimeClass>(doc),
        "NetworkPolicy" => round_trip::<NetworkPolicy>(doc),
        "ConfigMap" => round_trip::<ConfigMap>(doc),
        other => panic!("no typed check for kind {other}"),
    };
    assert_eq!(&back, doc, "fields the typed struct does not know");
}

#[test]
fn every_cluster_manifest_is_what_its_kubernetes_type_accepts() {
    let mut kinds = Vec::new();
    for file in [
        "rbac.yaml",
        "publisher.yaml",
        "extender.yaml",
        "dra-deviceclass.yaml",
        "crd.yaml",
        "node-binding.yaml",
    ] {
        for doc in documents(file) {
            check(&doc);
            kinds.push(doc["kind"].as_str().unwrap().to_owned());
        }
    }
    for k in [
        "DaemonSet",
        "Deployment",
        "Role",
        "DeviceClass",
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing: {kinds:?}");
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let mut doc = documents("extender.yaml").remove(0);
    doc["spec"]["replicass"] = Value::from(3);
    let back = round_trip::<Deployment>(&doc);
    assert_ne!(back, doc);
}

#[test]
fn the_packaged_crd_is_the_derived_one() {
    let packaged = std::fs::read_to_string(dir().join("crd.yaml")).unwrap();
    assert_eq!(
        packaged,
        mqfq_cluster::crd::crd_yaml().unwrap(),
        "regenerate with: mqfq-publish --print-crd > packaging/kubernetes/cluster/crd.yaml"
    );
}

/// `KubeSchedulerConfiguration` has no k8s-openapi type: its extender entries are checked
/// against the fields kube-scheduler's v1 `Extender` has.
#[test]
fn the_scheduler_configuration_names_the_extender_as_meant() {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[expect(dead_code, reason = "parsed to reject unknown fields")]
    struct Extender {
        url_prefix: String,
        filter_verb: Option<String>,
        prioritize_verb: Option<String>,
        bind_verb: Option<String>,
        preempt_verb: Option<String>,
        weight: Option<i64>,
        #[serde(rename = "enableHTTPS")]
        enable_https: Option<bool>,
        http_timeout: Option<String>,
        node_cache_capable: Option<bool>,
        managed_resources: Option<Vec<Value>>,
        ignorable: Option<bool>,
        tls_config: Option<Value>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[expect(dead_code, reason = "parsed to reject unknown fields")]
    struct Config {
        api_version: String,
        kind: String,
        profiles: Vec<Value>,
        extenders: Vec<Extender>,
    }
    let doc = documents("scheduler-config.yaml").remove(0);
    assert_eq!(doc["apiVersion"], "kubescheduler.config.k8s.io/v1");
    let c: Config = serde_json::from_value(doc.clone()).unwrap();
    let x = &doc["extenders"][0];
    assert_eq!(
        x["ignorable"], true,
        "the cluster must keep scheduling without it"
    );
    assert_eq!(x["nodeCacheCapable"], true);
    assert!(
        x["urlPrefix"]
            .as_str()
            .unwrap()
            .contains("mqfq-extender.mqfq-system"),
        "the Service in extender.yaml"
    );
    assert_eq!(c.extenders.len(), 1);
    // Over TLS with a client certificate, as the extender's Deployment serves it.
    assert!(x["urlPrefix"].as_str().unwrap().starts_with("https://"));
    assert_eq!(x["enableHTTPS"], true);
    for f in ["certFile", "keyFile", "caFile"] {
        assert!(x["tlsConfig"][f].is_string(), "tlsConfig.{f}");
    }
    let deploy = documents("extender.yaml").remove(0);
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for flag in ["--tls-cert=", "--tls-key=", "--client-ca="] {
        assert!(args.contains(flag), "{flag} missing: {args}");
    }
}

/// The node-binding policy names the publisher's own service account (as rbac.yaml makes it
/// and publisher.yaml uses it), so it applies to the publisher and to nothing else.
#[test]
fn the_node_binding_policy_names_the_publishers_account() {
    let ds = documents("publisher.yaml").remove(0);
    let sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let ns = ds["metadata"]["namespace"].as_str().unwrap();
    assert!(
        documents("rbac.yaml")
            .iter()
            .any(|d| d["kind"] == "ServiceAccount"
                && d["metadata"]["name"] == sa
                && d["metadata"]["namespace"] == ns),
        "rbac.yaml makes no {ns}/{sa}"
    );
    let policy = documents("node-binding.yaml").remove(0);
    let who = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        who.contains(&format!("\"system:serviceaccount:{ns}:{sa}\"")),
        "{who}"
    );
}

fn node_documents(file: &str) -> Vec<Value> {
    let path = dir().join("../node").join(file);
    parse_all(&std::fs::read_to_string(path).unwrap())
}

/// The node installer's manifests (`packaging/kubernetes/node/`): each document is what its
/// type accepts; the RuntimeClass's handler is the runtime name the registration script
/// writes; the ConfigMap's mqfqd.toml is one mqfqd starts with; the installer and cleanup run
/// the script the image carries, privileged with the host mounted where the script looks.
#[test]
fn the_node_installer_manifests_are_what_kubernetes_and_mqfqd_accept() {
    let mut kinds = Vec::new();
    for file in ["runtimeclass.yaml", "installer.yaml", "cleanup.yaml"] {
        for doc in node_documents(file) {
            check(&doc);
            kinds.push(doc["kind"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        kinds,
        [
            "RuntimeClass",
            "Namespace",
            "ConfigMap",
            "DaemonSet",
            "DaemonSet"
        ]
    );
    let rc = node_documents("runtimeclass.yaml").remove(0);
    let script = std::fs::read_to_string(dir().join("../../install/mqfq-containerd.sh")).unwrap();
    let handler = rc["handler"].as_str().unwrap();
    assert!(
        script.contains(&format!("containerd.runtimes.{handler}]")),
        "the script registers no runtime named {handler}"
    );
    let installer = node_documents("installer.yaml");
    let toml = installer[1]["data"]["mqfqd.toml"].as_str().unwrap();
    let cfg = mqfq_daemon::config::DaemonConfig::parse(toml, Path::new("mqfqd-config"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.status_socket,
        Path::new("/run/mqfq-status/status.sock"),
        "the publisher reads this socket"
    );
    let publisher = documents("publisher.yaml").remove(0);
    assert!(
        publisher["spec"]["template"]["spec"]["containers"][0]["args"][1]
            .as_str()
            .is_some_and(|a| Path::new(a) == cfg.status_socket),
        "the publisher's --socket is the ConfigMap's status_socket"
    );
    for (file, verb) in [("installer.yaml", "install"), ("cleanup.yaml", "uninstall")] {
        let ds = node_documents(file).pop().unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostPID"], true, "{file}: systemctl through PID 1");
        // The work is the init container's; what stays running holds no privilege and no host
        // path (it had stayed privileged with the host's root for the pod's life).
        let idle = &pod["containers"].as_array().unwrap()[..];
        assert_eq!(idle.len(), 1, "{file}");
        let sc = &idle[0]["securityContext"];
        assert!(
            sc["privileged"].is_null() || sc["privileged"] == false,
            "{file}"
        );
        assert_eq!(sc["runAsNonRoot"], true, "{file}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{file}");
        assert!(
            idle[0]["volumeMounts"].is_null(),
            "{file}: a host path in the idle container"
        );
        let c = &pod["initContainers"][0];
        assert_eq!(c["securityContext"]["privileged"], true, "{file}");
        assert!(
            c["args"][0]
                .as_str()
                .unwrap()
                .contains(&format!("mqfq-node-installer.sh {verb}")),
            "{file}"
        );
        assert!(
            c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/host"),
            "{file}: the host at /host, where the script looks"
        );
    }
    // The scrape job keeps GPU nodes and points at mqfqd's metrics port.
    let scrape = node_documents("prometheus-scrape.yaml").remove(0);
    assert_eq!(scrape["job_name"], "mqfqd");
    let port = cfg.metrics_addr.rsplit(':').next().unwrap().to_owned();
    assert!(
        scrape["relabel_configs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["replacement"]
                .as_str()
                .is_some_and(|x| x.ends_with(&port))),
        "{scrape}"
    );
}

/// The images a workload's pod template runs (init containers first).
fn images(doc: &Value) -> Vec<String> {
    let pod = &doc["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .map(|c| c["image"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// `scripts/pin-image.sh` writes every manifest with the image pinned by digest: each workload's
/// every container runs exactly the reference given, the documents still what their types
/// accept; a reference without a digest (a tag a registry may move) is refused by name.
#[test]
fn pinning_the_image_by_digest_reaches_every_workload() {
    let root = dir().join("../../..");
    let script = root.join("scripts/pin-image.sh");
    let out = tempfile::tempdir().unwrap();
    let run = |reference: &str| {
        std::process::Command::new(&script)
            .arg(reference)
            .arg(out.path())
            .output()
            .unwrap()
    };
    for bad in [
        "registry.example/mqfq-shim:0.1.0",
        "registry.example/mqfq-shim@sha256:1234",
        "registry.example/mqfq-shim@sha256:|touch /x",
    ] {
        let o = run(bad);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not an image pinned by digest"),
            "{bad}"
        );
    }
    let pinned = format!("registry.example/mqfq-shim@sha256:{}", "0f".repeat(32));
    // A directory holding anything else is refused, and left as it was.
    std::fs::write(out.path().join("mine.txt"), "keep").unwrap();
    let o = run(&pinned);
    assert_eq!(o.status.code(), Some(2));
    assert!(out.path().join("mine.txt").exists());
    std::fs::remove_file(out.path().join("mine.txt")).unwrap();
    let o = run(&pinned);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Again over its own output: replaced, nothing else left behind.
    let o = run(&pinned);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["cluster", "node"]);
    let mut workloads = 0;
    for (part, file) in [
        ("node", "installer.yaml"),
        ("node", "cleanup.yaml"),
        ("cluster", "extender.yaml"),
        ("cluster", "publisher.yaml"),
    ] {
        let text = std::fs::read_to_string(out.path().join(part).join(file)).unwrap();
        for doc in parse_all(&text) {
            check(&doc);
            let imgs = images(&doc);
            if !imgs.is_empty() {
                workloads += 1;
                assert!(imgs.iter().all(|i| *i == pinned), "{file}: {imgs:?}");
            }
        }
    }
    assert_eq!(workloads, 4, "installer, cleanup, extender, publisher");
    // Nothing else names the image by tag.
    for part in ["node", "cluster"] {
        for f in std::fs::read_dir(out.path().join(part)).unwrap() {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            assert!(!text.contains("image: mqfq-shim:"), "{text}");
        }
    }
}
