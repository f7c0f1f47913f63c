//! Classification and grants from specs as containerd, CRI, Docker and the device plugins write them.

use serde_json::json;

use super::*;

const ENV: GpuAccess = GpuAccess {
    env: true,
    cdi_annotations: false,
};

fn with(spec: &Value, access: GpuAccess) -> Option<GpuWork> {
    match classify(spec, "cid", access).unwrap() {
        Classification::Gpu(w) => Some(w),
        Classification::NotGpu => None,
    }
}

fn gpu(spec: &Value) -> GpuWork {
    with(spec, GpuAccess::default()).unwrap_or_else(|| panic!("expected GPU work for {spec}"))
}

fn devs(d: &[&str]) -> GpuSelection {
    GpuSelection::Devices(d.iter().map(|s| (*s).to_owned()).collect())
}

#[test]
fn plain_containers_are_not_gpu_work() {
    let spec = json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]},
                      "linux": {"devices": [{"path": "/dev/fuse"}]}});
    assert_eq!(with(&spec, ENV), None);
    assert_eq!(
        with(&json!({"process": {"env": ["CUDA_VISIBLE_DEVICES="]}}), ENV),
        None
    );
}

#[test]
fn an_image_env_grants_no_gpu_and_does_not_make_gpu_work() {
    // nvidia/cuda images carry NVIDIA_VISIBLE_DEVICES=all in their ENV: under CRI that must
    // not give the pod every GPU of the node, nor gate it.
    let pod = json!({"annotations": {"io.kubernetes.cri.container-type": "container"},
                     "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=0"]}});
    assert_eq!(with(&pod, GpuAccess::default()), None);
    // Nor a pod's own CDI annotation (when containerd is told to pass it through).
    let cdi = json!({"annotations": {"io.kubernetes.cri.container-type": "container",
                                     "cdi.k8s.io/x": "nvidia.com/gpu=all"}});
    assert_eq!(with(&cdi, GpuAccess::default()), None);
    let w = with(
        &cdi,
        GpuAccess {
            env: false,
            cdi_annotations: true,
        },
    )
    .unwrap();
    assert_eq!(w.grant, Some(GpuSelection::All));
    assert!(
        !w.placeable,
        "a CDI grant is the platform's: never narrowed"
    );
    // io.mqfq.gpu classifies, never grants; under CRI, without a GPU from the platform, it
    // does not even take a queue slot.
    let ask = json!({"annotations": {"io.mqfq.gpu": "true"},
                     "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}});
    let w = gpu(&ask);
    assert_eq!((w.grant, w.gpus), (None, devs(&["1"])));
    let pod_ask = json!({"annotations": {"io.mqfq.gpu": "true",
                                         "io.kubernetes.cri.container-type": "container"}});
    assert_eq!(with(&pod_ask, ENV), None);
    // The explicit switch (ctr / Docker hosts) and privileged containers take the env.
    let env = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0,GPU-abc"]}});
    assert_eq!(with(&env, GpuAccess::default()), None);
    assert!(with(&env, ENV).unwrap().placeable);
    // One that picks its GPUs by CUDA index keeps the whole grant: narrowed, its indices
    // would name other devices.
    let picks =
        json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=1"]}});
    assert!(!with(&picks, ENV).unwrap().placeable);
    // Partners: up to eight valid names; anything else names the annotation.
    let named = json!({"annotations": {"io.mqfq.partners": "embed, rank"},
                       "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
    assert_eq!(with(&named, ENV).unwrap().partners, ["embed", "rank"]);
    for bad in ["a b", "a,b,c,d,e,f,g,h,i"] {
        let spec = json!({"annotations": {"io.mqfq.partners": bad},
                          "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        let e = classify(&spec, "cid", ENV).unwrap_err();
        assert!(e.to_string().contains("io.mqfq.partners"), "{e}");
    }
    assert_eq!(
        with(&env, ENV).unwrap().grant,
        Some(devs(&["0", "GPU-abc"]))
    );
    let privileged = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        "linux": {"resources": {"devices": [{"allow": true, "access": "rwm"}]}}});
    assert_eq!(gpu(&privileged).grant, Some(GpuSelection::All));
    // A capability is not privilege: SYS_ADMIN added to an nvidia/cuda image gets no GPU.
    let capable = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"],
        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}},
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
    assert_eq!(with(&capable, GpuAccess::default()), None);
}

#[test]
fn what_the_platform_assigned_grants() {
    // Device nodes containerd (CDI) or a device plugin put in the spec.
    let w = gpu(
        &json!({"annotations": {"io.kubernetes.cri.container-type": "container"},
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
                "linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia3"}]}}),
    );
    assert_eq!(
        (w.grant.clone(), w.gpus),
        (Some(devs(&["3"])), devs(&["3"]))
    );
    // NVIDIA's volume-mount device list.
    let w = gpu(&json!({"mounts": [
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/GPU-1"},
        {"source": "/host/x", "destination": "/var/run/nvidia-container-devices/GPU-2"},
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/GPU-3"}]}));
    assert_eq!(w.grant, Some(devs(&["GPU-1", "GPU-3"])));
    // CDI annotations outside CRI (the caller is the node's root).
    let w = gpu(&json!({"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0,nvidia.com/gpu=1"}}));
    assert_eq!(w.grant, Some(devs(&["0", "1"])));
    // The device plugin's CDI vendor and MIG devices are NVIDIA's too.
    let w = gpu(&json!({"annotations": {"cdi.k8s.io/gpu":
        "k8s.device-plugin.nvidia.com/gpu=GPU-1, nvidia.com/mig=0:1"}}));
    assert_eq!(w.grant, Some(devs(&["GPU-1", "0:1"])));
    // A CDI device is NVIDIA's only by its vendor and class: another vendor's device named
    // `0` or `all` is no GPU grant (it had given GPU 0, and every GPU).
    for other in [
        "vendor.com/fpga=0",
        "example.com/gpu=all",
        "nvidia.com.evil.io/gpu=0",
        "nvidia.com/nic=0",
        "gpu=0",
    ] {
        let spec = json!({"annotations": {"cdi.k8s.io/x": other}});
        assert_eq!(with(&spec, GpuAccess::default()), None, "{other}");
    }
    let mixed = json!({"annotations": {"cdi.k8s.io/x": "vendor.com/fpga=all,nvidia.com/gpu=1"}});
    assert_eq!(gpu(&mixed).grant, Some(devs(&["1"])));
    // A GPU node under a name of its own counts by its number.
    let w = gpu(&json!({"linux": {"devices": [
        {"path": "/dev/dri-gpu", "type": "c", "major": 195, "minor": 2}]}}));
    assert_eq!(w.grant, Some(devs(&["2"])));
    // A container holding a GPU cannot leave the queue.
    let w = gpu(&json!({"annotations": {"io.mqfq.gpu": "false"},
                        "linux": {"devices": [{"path": "/dev/nvidia0"}]}}));
    assert_eq!(w.grant, Some(devs(&["0"])));
}

/// The device nodes NVIDIA's CDI spec (`nvidia-ctk cdi generate`) and the device plugin put
/// beside a GPU: only the GPU is granted. `/dev/nvidia-modeset` (195:254) had been read as
/// GPU 254, and Create then failed on an unknown device.
#[test]
fn only_gpu_nodes_are_gpus_not_nvidias_control_nodes() {
    let node = |path: &str, major: i64, minor: i64| json!({"path": path, "type": "c", "major": major, "minor": minor});
    let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "container"},
        "linux": {"devices": [
            node("/dev/nvidia0", 195, 0),
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-modeset", 195, 254),
            node("/dev/nvidia-uvm", 507, 0),
            node("/dev/nvidia-uvm-tools", 507, 1),
            node("/dev/nvidia-caps/nvidia-cap1", 510, 1),
            node("/dev/nvidia-caps/nvidia-cap2", 510, 2),
    ]}});
    let w = gpu(&spec);
    assert_eq!((w.grant, w.gpus), (Some(devs(&["0"])), devs(&["0"])));
    // Control nodes alone are no GPU.
    let control = json!({"annotations": {"io.kubernetes.cri.container-type": "container"},
        "linux": {"devices": [
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-modeset", 195, 254),
            node("/dev/nvidia-uvm", 507, 0),
            node("/dev/nvidia-caps/nvidia-cap1", 510, 1),
    ]}});
    assert_eq!(with(&control, GpuAccess::default()), None);
    // A GPU's numbers under a control node's name are a GPU: the name cannot take it out of
    // the queue.
    let renamed = json!({"annotations": {"io.kubernetes.cri.container-type": "container"},
        "linux": {"devices": [node("/dev/nvidia-uvm", 195, 3)]}});
    assert_eq!(gpu(&renamed).grant, Some(devs(&["3"])));
}

#[test]
fn legacy_hooks_and_the_explicit_annotation_classify_without_granting() {
    let docker = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=2"]},
        "hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook",
                                 "args": ["nvidia-container-runtime-hook", "prestart"]}]}});
    let w = gpu(&docker);
    assert_eq!((w.grant, w.gpus), (None, devs(&["2"])));
    let ctr = json!({"hooks": {"prestart": [{"path": "/usr/bin/containerd",
        "args": ["containerd", "oci-hook", "--", "/usr/bin/nvidia-container-cli", "configure"]}]}});
    assert_eq!(gpu(&ctr).gpus, GpuSelection::All);
    let off = json!({"annotations": {"io.mqfq.gpu": "false"},
                     "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
    assert_eq!(with(&off, GpuAccess::default()), None);
    assert!(
        with(&off, ENV).is_some(),
        "with the env switch the env is a grant"
    );
    let pause = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox"},
                       "linux": {"devices": [{"path": "/dev/nvidia0"}]}});
    assert_eq!(with(&pause, ENV), None);
    assert_eq!(
        GpuAccess::parse("env, cdi-annotations").unwrap(),
        GpuAccess {
            env: true,
            cdi_annotations: true
        }
    );
    assert_eq!(GpuAccess::parse("platform").unwrap(), GpuAccess::default());
    let e = GpuAccess::parse("all").unwrap_err().to_string();
    assert!(e.contains("MQFQ_GPU_ACCESS"), "{e}");
}

#[test]
fn function_key_sources_in_order() {
    let base = |mut ann: Value| {
        ann["io.mqfq.gpu"] = json!("true");
        json!({"annotations": ann})
    };
    let w = gpu(&base(
        json!({"io.mqfq.function": "resnet", "serving.knative.dev/service": "x",
               "io.mqfq.weight": "2.5", "io.mqfq.tenant": "acme"}),
    ));
    assert_eq!(
        (w.function.as_str(), w.weight, w.tenant.as_deref()),
        ("resnet", 2.5, Some("acme"))
    );
    let w = gpu(&base(json!({"serving.knative.dev/service": "hello",
                              "io.kubernetes.cri.sandbox-namespace": "prod"})));
    assert_eq!(w.function, "knative/prod/hello");
    assert_eq!(w.pod_namespace, "prod");
    assert_eq!(w.weight, 0.0, "no weight asked for");
    let w = gpu(&base(
        json!({"serving.knative.dev/revision": "hello-00001"}),
    ));
    assert_eq!(w.function, "knative/default/hello-00001");
    let w = gpu(&base(
        json!({"io.kubernetes.cri.sandbox-name": "wsk0_12_guest_classify"}),
    ));
    assert_eq!(w.function, "openwhisk/guest_classify");
    let w = gpu(&base(
        json!({"io.kubernetes.cri.image-name": "docker.io/acme/resnet:1"}),
    ));
    assert_eq!(w.function, "docker.io/acme/resnet:1");
    assert_eq!(gpu(&base(json!({}))).function, "cid");
    // Derived from names the pod chose: only the key alphabet survives.
    let w = gpu(&base(json!({"serving.knative.dev/service": "a\"b c\\"})));
    assert_eq!(w.function, "knative/default/a_b_c_");
}

#[test]
fn malformed_annotations_name_themselves_even_on_non_gpu_containers() {
    for (k, v) in [
        ("io.mqfq.weight", "0"),
        ("io.mqfq.weight", "-1"),
        ("io.mqfq.weight", "NaN"),
        ("io.mqfq.weight", "heavy"),
        ("io.mqfq.gpu", "maybe"),
        ("io.mqfq.function", ""),
        ("io.mqfq.function", "has space"),
        ("io.mqfq.tenant", "tab\there"),
        ("io.mqfq.function", "x\\"),
        ("io.mqfq.function", "x\",gpu=\"9"),
    ] {
        let spec = json!({"annotations": {k: v}});
        match classify(&spec, "c", ENV) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(k), "{msg}"),
            other => panic!("{k}={v:?}: {other:?}"),
        }
    }
    let long = "f".repeat(254);
    classify(
        &json!({"annotations": {"io.mqfq.function": long}}),
        "c",
        ENV,
    )
    .unwrap_err();
    // A value as long as the pod author likes is shown cut (the error goes back to the
    // platform and into logs).
    let huge = format!("{}é", "a b".repeat(100_000));
    match classify(
        &json!({"annotations": {"io.mqfq.partners": huge}}),
        "c",
        ENV,
    ) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("io.mqfq.partners") && msg.len() < 300, "{msg}");
        }
        other => panic!("{other:?}"),
    }
}
