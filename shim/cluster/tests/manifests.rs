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
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
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
    serde_saphyr::from_multiple::<Value>(&text)
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
