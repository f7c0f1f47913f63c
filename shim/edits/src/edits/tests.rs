use super::*;

fn node(path: &str, minor: i64) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        kind: Some("c".into()),
        major: Some(195),
        minor: Some(minor),
        ..DeviceNode::default()
    }
}

fn edits() -> NodeEdits {
    NodeEdits {
        source: "test".into(),
        driver_version: "550.54.15".into(),
        common: ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            device_nodes: vec![node("/dev/nvidiactl", 255)],
            mounts: vec![Mount {
                host_path: "/usr/lib/libcuda.so.550.54.15".into(),
                container_path: "/usr/lib/libcuda.so.550.54.15".into(),
                ..Mount::default()
            }],
            ..ContainerEdits::default()
        },
        devices: vec![
            NamedDevice {
                names: vec!["0".into(), "GPU-aaa".into()],
                mig: false,
                edits: ContainerEdits {
                    device_nodes: vec![node("/dev/nvidia0", 0)],
                    ..ContainerEdits::default()
                },
            },
            NamedDevice {
                names: vec!["1".into(), "GPU-bbb".into()],
                mig: false,
                edits: ContainerEdits {
                    device_nodes: vec![node("/dev/nvidia1", 1)],
                    ..ContainerEdits::default()
                },
            },
            NamedDevice {
                names: vec!["1:0".into(), "MIG-ccc".into()],
                mig: true,
                edits: ContainerEdits {
                    device_nodes: vec![
                        node("/dev/nvidia1", 1),
                        node("/dev/nvidia-caps/nvidia-cap12", 12),
                    ],
                    ..ContainerEdits::default()
                },
            },
        ],
        error: None,
    }
}

fn paths(e: &ContainerEdits) -> Vec<&str> {
    e.device_nodes.iter().map(|d| d.path.as_str()).collect()
}

#[test]
fn selection_gives_exactly_the_requested_devices() {
    let n = edits();
    let all = n.select(&GpuSelection::All).unwrap();
    assert_eq!(
        paths(&all),
        ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]
    );
    let one = n
        .select(&GpuSelection::Devices(vec!["GPU-bbb".into()]))
        .unwrap();
    assert_eq!(paths(&one), ["/dev/nvidiactl", "/dev/nvidia1"]);
    let mig = n
        .select(&GpuSelection::Devices(vec!["MIG-ccc".into()]))
        .unwrap();
    assert_eq!(
        paths(&mig),
        [
            "/dev/nvidiactl",
            "/dev/nvidia1",
            "/dev/nvidia-caps/nvidia-cap12"
        ]
    );
    let e = n
        .select(&GpuSelection::Devices(vec!["7".into()]))
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("\"7\"") && msg.contains("GPU-aaa"), "{msg}");
    assert!(
        e.is_callers(),
        "a GPU the node lacks is the request's fault"
    );
}

#[test]
fn apply_adds_devices_rules_mounts_env_and_drops_legacy_hooks() {
    let mut spec = serde_json::json!({
        "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]},
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "hooks": {"prestart": [
            {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]},
            {"path": "/usr/local/bin/other-hook"}
        ]}
    });
    let mut e = edits()
        .select(&GpuSelection::Devices(vec!["0".into()]))
        .unwrap();
    e.hooks.push(Hook {
        hook_name: "createContainer".into(),
        path: "/usr/bin/nvidia-cdi-hook".into(),
        args: vec!["nvidia-cdi-hook".into(), "update-ldcache".into()],
        env: vec![],
    });
    let a = apply(&mut spec, &e).unwrap();
    assert_eq!((a.devices, a.mounts, a.hooks_dropped), (2, 1, 1));
    assert_eq!(a.hooks_skipped, ["update-ldcache"]);
    assert_eq!(
        spec["process"]["env"],
        serde_json::json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"])
    );
    assert_eq!(
        spec["linux"]["devices"][1],
        serde_json::json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0})
    );
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(rules.len(), 3, "deny-all first, then one allow per node");
    assert_eq!(rules[2]["access"], "rwm");
    assert_eq!(spec["mounts"][1]["options"][0], "ro");
    assert_eq!(spec["hooks"]["prestart"].as_array().unwrap().len(), 1);
    // Applying twice does not duplicate anything.
    let mut again = spec.clone();
    apply(&mut again, &e).unwrap();
    assert_eq!(again["linux"]["devices"], spec["linux"]["devices"]);
    assert_eq!(again["mounts"], spec["mounts"]);
}

#[test]
fn unfilled_device_nodes_and_bad_specs_are_errors() {
    let mut e = ContainerEdits::default();
    e.device_nodes.push(DeviceNode {
        path: "/dev/nvidia9".into(),
        ..DeviceNode::default()
    });
    let err = apply(&mut serde_json::json!({}), &e)
        .unwrap_err()
        .to_string();
    assert!(err.contains("/dev/nvidia9"), "{err}");
    let err = apply(
        &mut serde_json::json!({"process": []}),
        &ContainerEdits::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("process"), "{err}");
    let mut n = NodeEdits::default();
    n.common.device_nodes.push(DeviceNode {
        path: "/dev/nvidiactl".into(),
        host_path: Some("/nonexistent/nvidiactl".into()),
        ..DeviceNode::default()
    });
    let err = n.fill_device_numbers().unwrap_err().to_string();
    assert!(
        err.contains("/dev/nvidiactl") && err.contains("/nonexistent"),
        "{err}"
    );
    let mut n = NodeEdits::default();
    n.common.device_nodes.push(DeviceNode {
        path: "/dev/null".into(),
        ..DeviceNode::default()
    });
    n.fill_device_numbers().unwrap();
    assert_eq!(
        (
            n.common.device_nodes[0].kind.as_deref(),
            n.common.device_nodes[0].major
        ),
        (Some("c"), Some(1))
    );
}

#[test]
fn a_broken_node_fails_every_gpu_selection_with_its_cause() {
    let mut n = edits();
    n.error = Some("stale spec: /dev/nvidia0 missing".into());
    let err = n.select(&GpuSelection::All).unwrap_err();
    assert!(
        !err.is_callers(),
        "a broken node is not the container's fault"
    );
    let e = err.to_string();
    assert!(
        e.contains("stale spec") && e.contains("/dev/nvidia0"),
        "{e}"
    );
}
