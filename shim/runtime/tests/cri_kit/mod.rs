//! What the CRI tests share: a CRI client on containerd's socket, pods that name their
//! function, and a GPU server container over the libcuda double.
#![allow(dead_code, reason = "each test crate uses its own part")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, KeyValue, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use mqfq_testkit::GLIBC_IMAGE;
use tonic::transport::{Channel, Endpoint, Uri};

/// A CRI client on containerd's socket `sock`.
pub async fn connect(sock: PathBuf) -> RuntimeServiceClient<Channel> {
    // Every CRI call fails after 60 s rather than hanging the test run.
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .timeout(Duration::from_secs(60))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move {
                tokio::net::UnixStream::connect(sock)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .expect("connect to CRI");
    RuntimeServiceClient::new(channel)
}

pub fn pod_config(logs: &Path) -> PodSandboxConfig {
    named_pod(logs, "gpu-fn", "cri-fn")
}

/// A pod as Kubernetes makes one by default: its own network namespace (the test kit's bridge
/// network), sharing nothing with the node.
pub fn named_pod(logs: &Path, name: &str, function: &str) -> PodSandboxConfig {
    pod_in(logs, name, function, NamespaceMode::Pod)
}

/// A `hostNetwork: true` pod: for a containerd on the machine's own config, which has no pod
/// network.
pub fn host_network_pod(logs: &Path, name: &str, function: &str) -> PodSandboxConfig {
    pod_in(logs, name, function, NamespaceMode::Node)
}

fn pod_in(logs: &Path, name: &str, function: &str, network: NamespaceMode) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        annotations: [("io.mqfq.function".to_owned(), function.to_owned())].into(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: network as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A GPU server container for CRI: the CUDA client in `serve` mode over the libcuda double
/// (kernels of `ms` on its timeline, logged to `<cuda>/<name>.log`), with the host's glibc.
pub fn gpu_server(cuda: &Path, name: &str, ms: u32) -> ContainerConfig {
    let dir = cuda.display().to_string();
    let env = |k: &str, v: String| KeyValue {
        key: k.into(),
        value: v,
    };
    let mount = |src: &str, dst: &str, readonly: bool| Mount {
        container_path: dst.into(),
        host_path: src.into(),
        readonly,
        ..Default::default()
    };
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: GLIBC_IMAGE.into(),
            ..Default::default()
        }),
        command: vec![format!("{dir}/cuda_client")],
        args: vec!["serve".into(), "2".into(), "10".into()],
        envs: vec![
            env("NVIDIA_VISIBLE_DEVICES", "0".into()),
            env("FAKE_CUDA_KERNEL_MS", ms.to_string()),
            env("FAKE_CUDA_LOG", format!("{dir}/{name}.log")),
            env("LD_LIBRARY_PATH", format!("/lib/x86_64-linux-gnu:{dir}")),
        ],
        mounts: vec![
            mount(&dir, &dir, false),
            mount("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", true),
            mount(
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                "/lib64/ld-linux-x86-64.so.2",
                true,
            ),
        ],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// A busybox container `name` running `sh -c cmd`, logging to `<name>.log`.
pub fn busybox(name: &str, cmd: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: mqfq_testkit::BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), cmd.to_owned()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// RunPodSandbox on `handler`, then CreateContainer and StartContainer of `container` in it:
/// (pod id, container id), or the first error.
///
/// # Errors
/// The CRI call that failed, with its status.
pub async fn run_pod(
    cri: &mut RuntimeServiceClient<Channel>,
    pod: &PodSandboxConfig,
    handler: &str,
    container: ContainerConfig,
) -> Result<(String, String), String> {
    let pod_id = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .map_err(|e| format!("RunPodSandbox: {e}"))?
        .into_inner()
        .pod_sandbox_id;
    let id = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.clone(),
            config: Some(container),
            sandbox_config: Some(pod.clone()),
        })
        .await
        .map_err(|e| format!("CreateContainer: {e}"))?
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .map_err(|e| format!("StartContainer: {e}"))?;
    Ok((pod_id, id))
}

/// Waits (at most 60 s) until the double logged at least `kernels` kernels for each of `names`;
/// fails with each one's count and containerd's log.
pub async fn until_computed(
    c: &mqfq_testkit::Containerd,
    cuda: &Path,
    names: &[&str],
    kernels: usize,
) {
    let counts = || {
        names
            .iter()
            .map(|n| mqfq_testkit::kernel_intervals(cuda, n).len())
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !counts().iter().all(|k| *k >= kernels) {
        assert!(
            Instant::now() < deadline,
            "not every server computed: {names:?} ran {:?} kernels\n{}",
            counts(),
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 30 s) until the removed pods left nothing behind — shims, runc state, mounts —
/// and fails naming what stayed, with containerd's log.
pub async fn no_leftovers(c: &mqfq_testkit::Containerd) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.leftovers().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = c.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}\n{}", c.log());
}

/// The exit code of container `id` once it has exited (at most 30 s; `None` if it did not).
pub async fn exit_code(cri: &mut RuntimeServiceClient<Channel>, id: &str) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let st = cri
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .ok()?
            .into_inner()
            .status?;
        if st.state == ContainerState::ContainerExited as i32 {
            return Some(st.exit_code);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// StopPodSandbox and RemovePodSandbox (its containers go with it).
///
/// # Panics
/// Either call fails.
pub async fn remove_pod(cri: &mut RuntimeServiceClient<Channel>, pod_id: &str) {
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod_id.to_owned(),
    })
    .await
    .expect("StopPodSandbox");
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod_id.to_owned(),
    })
    .await
    .expect("RemovePodSandbox");
}
