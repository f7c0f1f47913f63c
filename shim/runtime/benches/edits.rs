//! What the shim spends per GPU container on the cached NVIDIA edits (read the node's edits
//! file, select the container's GPUs, apply them to config.json and write it back, create the
//! symlinks in the rootfs) against the floor of the alternative, one hook process per container
//! (fork + exec + reading the OCI state on stdin, with none of the hook's own work). Edits are an
//! 8-GPU node's: 8 device nodes + 4 control nodes, 24 mounts, 12 symlinks.
//! Run: `scripts/bench-edits.sh`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use mqfq_shim::gpu::{GpuSelection, GpuWork};
use mqfq_shim::nvidia::edits::{
    ContainerEdits, DeviceNode, Mount, NamedDevice, NodeEdits, Symlink,
};

fn node(path: &str, major: i64, minor: i64) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        kind: Some("c".into()),
        major: Some(major),
        minor: Some(minor),
        ..DeviceNode::default()
    }
}

fn node_edits() -> NodeEdits {
    let lib = "/usr/lib/x86_64-linux-gnu";
    let mut common = ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: vec![
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-uvm", 508, 0),
            node("/dev/nvidia-uvm-tools", 508, 1),
            node("/dev/nvidia-modeset", 195, 254),
        ],
        ..ContainerEdits::default()
    };
    for i in 0..24 {
        let p = format!("{lib}/libnvidia-thing{i}.so.550.54.15");
        common.mounts.push(Mount {
            host_path: p.clone(),
            container_path: p,
            ..Mount::default()
        });
    }
    for i in 0..12 {
        common.symlinks.push(Symlink {
            link: format!("{lib}/libnvidia-thing{i}.so.1"),
            target: format!("libnvidia-thing{i}.so.550.54.15"),
        });
    }
    NodeEdits {
        source: "bench".into(),
        driver_version: "550.54.15".into(),
        common,
        devices: (0..8)
            .map(|i| NamedDevice {
                names: vec![i.to_string(), format!("GPU-{i:08}")],
                mig: false,
                edits: ContainerEdits {
                    device_nodes: vec![node(&format!("/dev/nvidia{i}"), 195, i)],
                    ..ContainerEdits::default()
                },
            })
            .collect(),
        error: None,
    }
}

/// A config.json of the size containerd writes for a small container.
fn spec() -> serde_json::Value {
    let mounts: Vec<serde_json::Value> = (0..12)
        .map(|i| serde_json::json!({"destination": format!("/m{i}"), "type": "bind", "source": format!("/s{i}"), "options": ["rbind", "ro"]}))
        .collect();
    serde_json::json!({
        "ociVersion": "1.0.2-dev",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=3"], "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_CHOWN"], "permitted": ["CAP_CHOWN"]}},
        "root": {"path": "rootfs"}, "hostname": "bench", "mounts": mounts,
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "namespaces": [{"type": "pid"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore", "/proc/keys"], "readonlyPaths": ["/proc/bus", "/proc/fs"]},
        "annotations": {"io.mqfq.function": "bench"}
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "two comparisons, each timed beside its baseline and printed"
)]
fn main() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().expect("tempdir");
    let edits_file = dir.path().join("nvidia-edits.json");
    mqfq_shim::nvidia::store(&edits_file, &node_edits()).expect("store");
    let spec_text = serde_json::to_vec(&spec()).expect("spec");
    let work = GpuWork {
        function: "bench".into(),
        weight: 1.0,
        tenant: None,
        gpus: GpuSelection::Devices(vec!["3".into()]),
        grant: Some(GpuSelection::Devices(vec!["3".into()])),
        pod_namespace: String::new(),
        placeable: false,
        partners: Vec::new(),
        warm: Default::default(),
    };
    let mut ours = Vec::with_capacity(n);
    for i in 0..n {
        let bundle = dir.path().join(format!("b{i}"));
        std::fs::create_dir_all(bundle.join("rootfs")).expect("bundle");
        std::fs::write(bundle.join("config.json"), &spec_text).expect("config");
        let t = Instant::now();
        let text = std::fs::read(bundle.join("config.json")).expect("read");
        let mut spec: serde_json::Value = serde_json::from_slice(&text).expect("parse");
        let (edits, _) = mqfq_shim::nvidia::prepare(&mut spec, &work, &edits_file)
            .expect("prepare")
            .expect("edits");
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&spec).expect("json"),
        )
        .expect("write");
        let root = mqfq_shim::rootfs::Root::open(&bundle.join("rootfs")).expect("rootfs");
        mqfq_shim::nvidia::rootfs::make_symlinks(&root, &edits).expect("symlinks");
        ours.push(t.elapsed().as_secs_f64() * 1e3);
        let _ = std::fs::remove_dir_all(&bundle);
    }
    let state = serde_json::json!({"ociVersion": "1.0.2", "id": "bench", "status": "created", "pid": 1, "bundle": "/run/bundle"}).to_string();
    let mut hook = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut child = Command::new("/bin/sh")
            .args(["-c", "cat > /dev/null"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(state.as_bytes());
        }
        let _ = child.wait();
        hook.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // ld.so.cache: ours (the image's cache read in-root and merged with the driver libraries,
    // written atomically into the container's rootfs) vs a minimal update-ldcache hook (an
    // ldconfig process per container over the image's library directories). The "image" is this
    // machine's own library set.
    let libs = vec![mqfq_shim::nvidia::edits::Library {
        soname: "libcuda.so.1".into(),
        path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
    }];
    let e = ContainerEdits {
        libraries: libs,
        ..ContainerEdits::default()
    };
    let rootfs = dir.path().join("img");
    std::fs::create_dir_all(rootfs.join("etc")).expect("img");
    let image_cache = std::fs::read("/etc/ld.so.cache").expect("host cache");
    let root = mqfq_shim::rootfs::Root::open(&rootfs).expect("rootfs");
    let mut written = Vec::with_capacity(n);
    for _ in 0..n {
        std::fs::write(rootfs.join("etc/ld.so.cache"), &image_cache).expect("image cache");
        let mut spec = spec();
        let t = Instant::now();
        mqfq_shim::nvidia::rootfs::install_ld_cache(&mut spec, &root, &e, dir.path())
            .expect("install");
        written.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let ldn = n.min(200);
    let mut ldconfig = Vec::with_capacity(ldn);
    for _ in 0..ldn {
        let t = Instant::now();
        let ok = Command::new("ldconfig")
            .arg("-C")
            .arg(dir.path().join("hook.cache"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ldconfig");
        ldconfig.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (w50, w99) = (
        mqfq_testkit::percentile(&mut written, 0.5),
        mqfq_testkit::percentile(&mut written, 0.99),
    );
    let (l50, l99) = (
        mqfq_testkit::percentile(&mut ldconfig, 0.5),
        mqfq_testkit::percentile(&mut ldconfig, 0.99),
    );
    println!(
        "ld.so.cache merged and written into the rootfs by the shim: p50 {w50:.3} ms, p99 {w99:.3} ms"
    );
    println!(
        "ldconfig process per container ({ldn}):                        p50 {l50:.3} ms, p99 {l99:.3} ms"
    );
    let (o50, o99) = (
        mqfq_testkit::percentile(&mut ours, 0.5),
        mqfq_testkit::percentile(&mut ours, 0.99),
    );
    let (h50, h99) = (
        mqfq_testkit::percentile(&mut hook, 0.5),
        mqfq_testkit::percentile(&mut hook, 0.99),
    );
    println!("cached edits applied by the shim ({n} containers): p50 {o50:.3} ms, p99 {o99:.3} ms");
    println!("empty hook process per container ({n}):          p50 {h50:.3} ms, p99 {h99:.3} ms");
    println!("ratio cached / empty hook: p50 {:.2}×", o50 / h50);
}
