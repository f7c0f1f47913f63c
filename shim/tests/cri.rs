//! The shim through containerd's CRI plugin, with this test playing the kubelet: a pod on
//! runtime handler `mqfq`, a container that logs and exits, one shim for the whole pod.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
    VersionRequest,
};
use mqfq_testkit::{BUSYBOX, Containerd, shim_pids};
use tonic::transport::{Channel, Endpoint, Uri};

async fn connect(sock: PathBuf) -> RuntimeServiceClient<Channel> {
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
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

fn pod_config(logs: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "gpu-fn".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        annotations: [("io.mqfq.function".to_owned(), "cri-fn".to_owned())].into(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_through_cri_one_shim_per_pod() {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start_cri(shim.parent().unwrap()) else {
        return;
    };
    let mut cri = connect(c.socket()).await;
    let v = cri
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "containerd");

    let logs = c.dir().join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let config = pod_config(&logs);
    let pod = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "mqfq".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.log()))
        .into_inner()
        .pod_sandbox_id;

    let mut ids = Vec::new();
    for (i, cmd) in ["echo hello-cri", "echo second-container"]
        .iter()
        .enumerate()
    {
        let id = cri
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: format!("c{i}"),
                        attempt: 0,
                    }),
                    image: Some(ImageSpec {
                        image: BUSYBOX.into(),
                        ..Default::default()
                    }),
                    command: vec!["sh".into(), "-c".into(), (*cmd).to_owned()],
                    log_path: format!("c{i}.log"),
                    ..Default::default()
                }),
                sandbox_config: Some(config.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", c.log()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", c.log()));
        ids.push(id);
    }

    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = cri
                .container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
            if st.state == ContainerState::ContainerExited as i32 {
                assert_eq!(st.exit_code, 0, "{st:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "container {id} never exited: {st:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let log0 = std::fs::read_to_string(logs.join("c0.log")).unwrap_or_default();
    assert!(log0.contains("stdout F hello-cri"), "{log0:?}");
    let log1 = std::fs::read_to_string(logs.join("c1.log")).unwrap_or_default();
    assert!(log1.contains("stdout F second-container"), "{log1:?}");

    // One shim serves the pod: the sandbox and both containers.
    let shims = shim_pids(&c.socket().display().to_string());
    assert_eq!(shims.len(), 1, "shims: {shims:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", shims[0])).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("containerd-shim-mqfq-v2"),
        "the pod's shim is not ours: {}",
        String::from_utf8_lossy(&cmdline)
    );

    for id in &ids {
        cri.remove_container(RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    }
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", c.log()));
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();

    // The shim exits once the pod is gone; runc state and mounts go with it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.leftovers().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = c.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}\n{}", c.log());
}
