//! Pods shaped as Kubernetes makes them, through containerd's CRI plugin on every containerd
//! line: each in its own network namespace (the kit's bridge network); GPU servers run as a
//! non-root user and in a user namespace; GPUs given by the device plugin's device specs and
//! by a CDI spec shaped like the NVIDIA toolkit's, each with NVIDIA's control nodes beside the
//! GPU; and the runtime's features as containerd 2.x asks them (`-info`), which decide whether
//! the kubelet may run recursive read-only mounts on the handler.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod cri_kit;
mod fake_driver;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cri_kit::{
    busybox, connect, exit_code, gpu_server, named_pod, no_leftovers, remove_pod, run_pod,
    until_computed,
};
use k8s_cri::v1::{
    CdiDevice, Device, IdMapping, Int64Value, LinuxContainerConfig, LinuxContainerSecurityContext,
    Mount, NamespaceMode, StatusRequest, UserNamespace,
};
use mqfq_testkit::{Containerd, Mqfqd};
use serde_json::Value;

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"))
        .parent()
        .unwrap()
        .to_owned()
}

fn logs(c: &Containerd) -> PathBuf {
    let l = c.dir().join("pod-logs");
    std::fs::create_dir_all(&l).unwrap();
    l
}

fn user(uid: i64) -> LinuxContainerConfig {
    LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_user: Some(Int64Value { value: uid }),
            run_as_group: Some(Int64Value { value: uid }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// GPU servers as pods run them: one as `runAsUser: 1000`, one in a user namespace
/// (`hostUsers: false`, where CRI can run one: see [`userns_pods`]), beside one run as root, on
/// one GPU slot. Each takes burst leases through its shim's socket, and their kernels never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_root_and_user_namespace_gpu_pods_are_admitted() {
    let Some(c) = Containerd::start_cri(&shim_dir()) else {
        return;
    };
    let (cuda, d) =
        c.cuda_test_node("[concurrency]\nd_max = 1\nd_initial = 1\n[queue]\nshort_charge_s = 0\n");
    let mut cri = connect(c.socket()).await;
    let logs = logs(&c);
    let mut names = vec!["root", "uid1000"];
    if userns_pods(&mut cri).await {
        names.push("userns");
    }
    let mut pods = Vec::new();
    for &name in &names {
        // The double's log, written by the container's own user (the folder is root's).
        let log = cuda.join(format!("{name}.log"));
        std::fs::write(&log, "").unwrap();
        std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let mut pod = named_pod(&logs, name, name);
        let mut server = gpu_server(&cuda, name, 20);
        match name {
            "uid1000" => server.linux = Some(user(1000)),
            "userns" => {
                let map = vec![IdMapping {
                    host_id: 65536 * 4,
                    container_id: 0,
                    length: 65536,
                }];
                let ns = pod
                    .linux
                    .as_mut()
                    .and_then(|l| l.security_context.as_mut())
                    .and_then(|s| s.namespace_options.as_mut())
                    .unwrap();
                ns.userns_options = Some(UserNamespace {
                    mode: NamespaceMode::Pod as i32,
                    uids: map.clone(),
                    gids: map,
                });
                // The kubelet gives each container the pod's namespaces.
                server.linux = Some(LinuxContainerConfig {
                    security_context: Some(LinuxContainerSecurityContext {
                        namespace_options: Some(ns.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
            _ => {}
        }
        let ids = run_pod(&mut cri, &pod, "mqfq", server)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", c.log()));
        pods.push(ids);
    }
    until_computed(&c, &cuda, &names, 6).await;
    let most = mqfq_testkit::most_at_once(&cuda, &names, mqfq_testkit::monotonic_us());
    assert!(most <= 1, "{most} pods' kernels at once on d_max = 1");
    let records = d.records();
    for name in &names {
        let bursts = records
            .iter()
            .filter(|r| r["event"] == "enqueue" && r["kind"] == "burst")
            .filter(|r| {
                r["function"]
                    .as_str()
                    .is_some_and(|f| f.ends_with(&format!("/{name}")))
            })
            .count();
        assert!(bursts >= 2, "{name} took no burst lease: {records:?}");
    }
    for (pod, _) in &pods {
        remove_pod(&mut cri, pod).await;
    }
    no_leftovers(&c).await;
    d.wait_for("no lease left", |s| {
        s["leases"].as_array().is_some_and(Vec::is_empty)
    });
}

/// What CRI says the `mqfq` and `runc` handlers support (its Status), checked equal: the shim
/// reports its runc's features. `None` each where CRI knows none (containerd 1.x).
async fn handler_features(
    cri: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
) -> (
    Option<k8s_cri::v1::RuntimeHandlerFeatures>,
    Option<k8s_cri::v1::RuntimeHandlerFeatures>,
) {
    let status = cri
        .status(StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let of = |name: &str| {
        status
            .runtime_handlers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.features)
    };
    let (ours, runcs) = (of("mqfq"), of("runc"));
    assert_eq!(ours, runcs, "{status:?}");
    (ours, runcs)
}

/// Whether CRI runs pods in user namespaces on the handler (`hostUsers: false`): containerd 2.x,
/// with a runc that ID-maps mounts (1.2 or later; Debian 12's 1.1 does not). Where it does not,
/// runc's own handler does not either (the two handlers' features are held equal), and the
/// kubelet would not ask; `ctr run --uidmap` runs the shim's user-namespace case on every line
/// (`shim/runtime/tests/bursts.rs`).
async fn userns_pods(
    cri: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
) -> bool {
    let ours = handler_features(cri)
        .await
        .0
        .is_some_and(|f| f.user_namespaces);
    if !ours {
        eprintln!("CRI runs no pod in a user namespace here (containerd 1.x, or runc < 1.2)");
    }
    ours
}

/// NVIDIA's control nodes beside the fake root's GPUs, as a real driver has them: modeset on
/// 195:254, nvidia-uvm-tools beside nvidia-uvm (major 508), a MIG capability node.
fn control_nodes(root: &Path) {
    let dev = root.join("dev");
    std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
    for (name, major, minor) in [
        ("nvidia-modeset", 195, 254),
        ("nvidia-uvm-tools", 508, 1),
        ("nvidia-caps/nvidia-cap1", 509, 1),
    ] {
        fake_driver::sh(
            std::process::Command::new("mknod")
                .arg(dev.join(name))
                .args(["c", &major.to_string(), &minor.to_string()]),
        )
        .unwrap();
    }
}

/// What `nvidia-ctk cdi generate` writes, in small: GPUs by index and `all`, the control nodes
/// and a driver library for every device, `NVIDIA_VISIBLE_DEVICES=void`.
fn toolkit_cdi_spec(root: &Path) -> String {
    let node = |p: &str| serde_json::json!({"path": p, "hostPath": root.join(&p[1..])});
    let lib = format!(
        "/{}/libcuda.so.{}",
        fake_driver::LIBDIR,
        fake_driver::VERSION
    );
    serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node("/dev/nvidia0")]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node("/dev/nvidia1")]}},
            {"name": "all", "containerEdits":
                {"deviceNodes": [node("/dev/nvidia0"), node("/dev/nvidia1")]}},
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                node("/dev/nvidia-modeset"), node("/dev/nvidia-uvm"),
                node("/dev/nvidia-uvm-tools"), node("/dev/nvidiactl"),
            ],
            "mounts": [{"hostPath": root.join(&lib[1..]), "containerPath": lib,
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
        },
    })
    .to_string()
}

/// A GPU pod given GPU 0 by the device plugin (its device specs: the GPU and every control node,
/// on every containerd line) and by CDI (a toolkit-shaped spec; containerd 1.7 and later) runs
/// with GPU 0 alone: `/dev/nvidia-modeset` (195:254) had been read as GPU 254 and failed Create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_pods_given_nvidia_devices_are_granted_their_gpu_only() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(root) = fake_driver::root_or_skip(dir.path()) else {
        return;
    };
    control_nodes(&root);
    let Some(c) = Containerd::start_cri(&shim_dir()) else {
        return;
    };
    let d = Mqfqd::start_on_driver(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        c.dir(),
        &c.daemon_socket(),
        &root,
        "restart_grace_ms = 0\n[simulated]\ngpus = 2\n",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.edits_file().exists() {
        assert!(Instant::now() < deadline, "mqfqd wrote no edits");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cdi = mqfq_testkit::cdi_dir(c.dir());
    std::fs::create_dir_all(&cdi).unwrap();
    std::fs::write(cdi.join("nvidia.json"), toolkit_cdi_spec(&root)).unwrap();
    let mut cri = connect(c.socket()).await;
    let logs = logs(&c);
    let look = "ls -ln /dev/nvidia0 /dev/nvidia-modeset /dev/nvidiactl && \
                test ! -e /dev/nvidia1 && echo only-gpu0; sleep 60";
    let mut ways = vec!["plugin"];
    if c.version >= (1, 7) {
        ways.push("cdi");
    }
    for way in ways {
        let mut ctr = busybox(way, look);
        if way == "cdi" {
            ctr.cdi_devices = vec![CdiDevice {
                name: "nvidia.com/gpu=0".into(),
            }];
        } else {
            ctr.devices = [
                "nvidia0",
                "nvidiactl",
                "nvidia-modeset",
                "nvidia-uvm",
                "nvidia-uvm-tools",
                "nvidia-caps/nvidia-cap1",
            ]
            .iter()
            .map(|n| Device {
                container_path: format!("/dev/{n}"),
                host_path: root.join("dev").join(n).display().to_string(),
                permissions: "rw".into(),
            })
            .collect();
        }
        let (pod, id) = run_pod(&mut cri, &named_pod(&logs, way, way), "mqfq", ctr)
            .await
            .unwrap_or_else(|e| panic!("{way}: {e}\n{}", c.log()));
        // Without the interposer (static busybox) its start is what waits: the lease names the
        // GPU it holds.
        let s = d.wait_for("the pod's lease", |s| {
            s["leases"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l["container_id"] == id.as_str()))
        });
        let gpus: Vec<&Value> = s["leases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["container_id"] == id.as_str())
            .map(|l| &l["gpu"])
            .collect();
        assert_eq!(gpus, [&Value::from(0)], "{way}: {s:#}");
        let out = std::fs::read_to_string(logs.join(format!("{way}.log"))).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = out;
        while !out.contains("only-gpu0") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            out = std::fs::read_to_string(logs.join(format!("{way}.log"))).unwrap_or_default();
        }
        assert!(
            out.contains("195,   0") && out.contains("195, 254"),
            "{way}: {out}"
        );
        assert!(out.contains("only-gpu0"), "{way}: {out}");
        remove_pod(&mut cri, &pod).await;
    }
    no_leftovers(&c).await;
}

/// `-info` with options it cannot decode fails, and says why (containerd quotes this stderr
/// when the runtime's features cannot be read): the decoder's own error, not only which field.
#[test]
fn info_with_bad_options_says_why() {
    use std::io::Write;
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let mut child = std::process::Command::new(shim)
        .arg("-info")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\xff\xff\xff")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let why = err
        .split_once("invalid argument: runtime options: ")
        .map(|(_, why)| why.trim());
    assert!(why.is_some_and(|w| !w.is_empty()), "{err}");
}

/// `containerd-shim-mqfq-v2 -info` as containerd 2.x runs it: the features of the runc the shim
/// delegates to, as runc's own shim reports them. On 2.x, CRI then gives the handler what it
/// gives runc-v2 — recursive read-only mounts and user namespaces — and a pod's recursive
/// read-only mount holds on its submounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_reports_runcs_features_and_recursive_read_only_mounts_hold() {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start_cri(&shim_dir()) else {
        return;
    };
    let o = std::process::Command::new(shim)
        .arg("-info")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let info = <containerd_shim_protos::types::introspection::RuntimeInfo as
        containerd_shim_protos::protobuf::Message>::parse_from_bytes(&o.stdout)
    .unwrap();
    assert_eq!(info.name, "io.containerd.mqfq.v2");
    let ours: Value = serde_json::from_slice(&info.features.value).unwrap();
    let runc = std::process::Command::new("runc")
        .arg("features")
        .output()
        .unwrap();
    let runcs: Value = serde_json::from_slice(&runc.stdout).unwrap();
    assert_eq!(ours, runcs);
    if c.version.0 < 2 {
        // containerd 1.x asks no runtime for its features, and CRI 1.x has no such mounts.
        eprintln!("containerd {:?}: no runtime features to compare", c.version);
        return;
    }
    let mut cri = connect(c.socket()).await;
    let (mqfq, _) = handler_features(&mut cri).await;
    let mqfq = mqfq.expect("containerd 2.x reports the handler's features");
    assert!(mqfq.recursive_read_only_mounts, "{mqfq:?}");
    // A volume with a submount, mounted recursively read-only: the submount is read-only too.
    let vol = c.dir().join("rro");
    std::fs::create_dir_all(vol.join("sub")).unwrap();
    fake_driver::sh(
        std::process::Command::new("mount")
            .args(["-t", "tmpfs", "rro-sub"])
            .arg(vol.join("sub")),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let sub = Unmount(vol.join("sub"));
    let logs = logs(&c);
    let mut ctr = busybox(
        "rro",
        "touch /vol/sub/x 2>/dev/null && echo writable || echo read-only",
    );
    ctr.mounts = vec![Mount {
        container_path: "/vol".into(),
        host_path: vol.display().to_string(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    }];
    let (pod, id) = run_pod(&mut cri, &named_pod(&logs, "rro", "rro"), "mqfq", ctr)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!(exit_code(&mut cri, &id).await, Some(0));
    let out = std::fs::read_to_string(logs.join("rro.log")).unwrap_or_default();
    assert!(out.contains("stdout F read-only"), "{out}");
    remove_pod(&mut cri, &pod).await;
    drop(sub);
    no_leftovers(&c).await;
}
