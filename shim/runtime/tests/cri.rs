//! The shim through containerd's CRI plugin, with this test playing the kubelet: a pod on
//! runtime handler `mqfq`, a container that logs and exits, one shim for the whole pod.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod cri_kit;

use std::path::Path;

use cri_kit::{
    connect, exit_code, gpu_server, named_pod, no_leftovers, pod_config, run_pod, until_computed,
};
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, PodSandboxStatusRequest,
    RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest, VersionRequest,
};
use mqfq_testkit::{BUSYBOX, Containerd, shim_pids};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one pod's life through CRI, step by step"
)]
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
    // The runtime handler's options (`ConfigPath`, a shim config with `root`) reached runc: the
    // sandbox's state is under this containerd's own root, not the shared default.
    assert!(
        c.runc_dir().join(&pod).join("state.json").is_file(),
        "no runc state for the sandbox in {}",
        c.runc_dir().display()
    );

    let mut ids = Vec::new();
    // The pod has a network namespace of its own, on the kit's bridge network.
    let status = cri
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    assert!(ip.starts_with("10.88.0."), "pod IP {ip:?}\n{}", c.log());

    let show_ip = "echo hello-cri; ip -o -4 addr show eth0".to_owned();
    for (i, cmd) in [show_ip.as_str(), "echo second-container"]
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
        assert_eq!(
            exit_code(&mut cri, id).await,
            Some(0),
            "container {id} did not exit 0 within 30 s"
        );
    }
    let log0 = std::fs::read_to_string(logs.join("c0.log")).unwrap_or_default();
    assert!(log0.contains("stdout F hello-cri"), "{log0:?}");
    assert!(log0.contains(&format!("inet {ip}/24")), "{log0:?}");
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
    no_leftovers(&c).await;
}

/// Five long-running GPU server pods through CRI on a GPU that runs two at a time: every
/// StartContainer returns (none waits for a slot), every server computes, and the kernels of
/// more than two pods never run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_gpu_server_pods_start_and_share_two_slots() {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start_cri(shim.parent().unwrap()) else {
        return;
    };
    let (cuda, d) =
        c.cuda_test_node("[concurrency]\nd_max = 2\nd_initial = 2\n[queue]\nshort_charge_s = 0\n");
    let mut cri = connect(c.socket()).await;
    let logs = c.dir().join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let names = ["p1", "p2", "p3", "p4", "p5"];
    let mut pods = Vec::new();
    for name in names {
        let config = named_pod(&logs, name, name);
        let ids = run_pod(&mut cri, &config, "mqfq", gpu_server(&cuda, name, 20))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", c.log()));
        pods.push(ids);
    }
    until_computed(&c, &cuda, &names, 6).await;
    // The most pods whose kernels ran at one instant, among those that ended by now (the
    // double logs a kernel when it is queued).
    let most = mqfq_testkit::most_at_once(&cuda, &names, mqfq_testkit::monotonic_us());
    assert!(most <= 2, "{most} pods' kernels at once on d_max = 2");
    let records = d.records();
    assert!(
        records
            .iter()
            .filter(|r| r["event"] == "enqueue")
            .all(|r| r["kind"] == "burst"),
        "a start or resume was gated: {records:?}"
    );
    for (pod, _) in &pods {
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
    }
    no_leftovers(&c).await;
    let s = d.wait_for("no lease left", |s| {
        s["leases"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(s["waiting"], 0);
}
