//! Pre-created NVIDIA edits: discovery from a fake driver root built here (libraries named like
//! the driver's with a real ld.so.cache, device nodes made with mknod), CDI import from fixture
//! specs, and an end-to-end `ctr run` of a GPU container that sees the injected nodes and mounts.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_daemon::nvidia::{cdi, discover, edits};
use mqfq_shim::gpu::GpuSelection;
use mqfq_testkit::{Containerd, MQFQ};

mod fake_driver;
use fake_driver::{LIBDIR, VERSION, edits_daemon, must_run, root_or_skip, sh};

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one fake driver root: each kind of edit it yields, in turn"
)]
fn discovery_from_a_fake_driver_root_gives_the_exact_edits() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(root) = root_or_skip(dir.path()) else {
        return;
    };
    let cache = discover::read_ld_cache(&root.join("etc/ld.so.cache")).unwrap();
    assert!(
        cache.contains(&("libcuda.so.1".into(), format!("/{LIBDIR}/libcuda.so.1"))),
        "{cache:?}"
    );
    let e = discover::discover(&root, &dir.path().join("no-mps")).unwrap();
    assert_eq!(e.driver_version, VERSION);
    assert_eq!(e.source, format!("discovery:{}", root.display()));
    let h = |p: &str| root.join(p.trim_start_matches('/')).display().to_string();
    let nodes: Vec<(String, Option<String>, i64, i64)> = e
        .common
        .device_nodes
        .iter()
        .map(|n| {
            (
                n.path.clone(),
                n.host_path.clone(),
                n.major.unwrap(),
                n.minor.unwrap(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/nvidiactl".into(), Some(h("/dev/nvidiactl")), 195, 255),
            ("/dev/nvidia-uvm".into(), Some(h("/dev/nvidia-uvm")), 508, 0),
        ]
    );
    let mut mounts: Vec<(String, String)> = e
        .common
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone()))
        .collect();
    mounts.sort();
    let mut want = vec![
        (
            format!("/{LIBDIR}/libcuda.so.{VERSION}"),
            h(&format!("{LIBDIR}/libcuda.so.{VERSION}")),
        ),
        (
            format!("/{LIBDIR}/libnvidia-ml.so.{VERSION}"),
            h(&format!("{LIBDIR}/libnvidia-ml.so.{VERSION}")),
        ),
        ("/usr/bin/nvidia-smi".into(), h("/usr/bin/nvidia-smi")),
        (
            format!("/lib/firmware/nvidia/{VERSION}"),
            h(&format!("lib/firmware/nvidia/{VERSION}")),
        ),
    ];
    want.sort();
    assert_eq!(
        mounts, want,
        "only this driver version's libraries, no libfoo"
    );
    let links: Vec<(String, String)> = e
        .common
        .symlinks
        .iter()
        .map(|s| (s.link.clone(), s.target.clone()))
        .collect();
    for l in [
        (
            format!("/{LIBDIR}/libcuda.so.1"),
            format!("libcuda.so.{VERSION}"),
        ),
        (format!("/{LIBDIR}/libcuda.so"), "libcuda.so.1".to_owned()),
        (
            format!("/{LIBDIR}/libnvidia-ml.so.1"),
            format!("libnvidia-ml.so.{VERSION}"),
        ),
    ] {
        assert!(links.contains(&l), "{l:?} not in {links:?}");
    }
    assert_eq!(e.common.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let mut libs: Vec<(&str, &str)> = e
        .common
        .libraries
        .iter()
        .map(|l| (l.soname.as_str(), l.path.as_str()))
        .collect();
    libs.sort_unstable();
    assert_eq!(
        libs,
        [
            ("libcuda.so.1", format!("/{LIBDIR}/libcuda.so.1").as_str()),
            (
                "libnvidia-ml.so.1",
                format!("/{LIBDIR}/libnvidia-ml.so.1").as_str()
            ),
        ]
    );
    let names: Vec<&[String]> = e.devices.iter().map(|d| d.names.as_slice()).collect();
    assert_eq!(
        names,
        [
            [
                "0".to_owned(),
                "GPU-aaaaaaaa-0000-4000-8000-000000000000".to_owned()
            ],
            [
                "1".to_owned(),
                "GPU-bbbbbbbb-0000-4000-8000-000000000000".to_owned()
            ],
        ]
    );
    let one = e
        .select(&GpuSelection::Devices(vec![
            "GPU-bbbbbbbb-0000-4000-8000-000000000000".into(),
        ]))
        .unwrap();
    let paths: Vec<&str> = one.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]);
    assert_eq!(
        (one.device_nodes[2].major, one.device_nodes[2].minor),
        (Some(195), Some(1))
    );

    // An MPS daemon's pipe directory is mounted (read-write) when it exists.
    let mps = dir.path().join("mps");
    std::fs::create_dir_all(&mps).unwrap();
    let e = discover::discover(&root, &mps).unwrap();
    let m = e
        .common
        .mounts
        .iter()
        .find(|m| m.container_path == mps.display().to_string())
        .unwrap();
    assert!(!m.options.contains(&"ro".to_owned()));

    // A CDI spec mounting the same library: the soname is read from the ELF file, giving the
    // ld.so.cache entry and the soname link that `update-ldcache` would have made.
    let cdi_dir = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let lib = h(&format!("{LIBDIR}/libcuda.so.{VERSION}"));
    std::fs::write(
        cdi_dir.join("nvidia.json"),
        serde_json::json!({
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": h("/dev/nvidia0")}]}}],
            "containerEdits": {"mounts": [{"hostPath": lib, "containerPath": format!("/{LIBDIR}/libcuda.so.{VERSION}")}]}
        })
        .to_string(),
    )
    .unwrap();
    let c = cdi::import(&[cdi_dir]).unwrap().unwrap();
    assert_eq!(c.common.libraries.len(), 1);
    assert_eq!(c.common.libraries[0].soname, "libcuda.so.1");
    assert_eq!(c.common.symlinks[0].link, format!("/{LIBDIR}/libcuda.so.1"));
    assert_eq!(
        c.devices[0].edits.device_nodes[0].minor,
        Some(0),
        "numbers read from the node"
    );

    // No driver, and a broken cache, say so.
    let err = discover::discover(&dir.path().join("nothing"), &mps).unwrap_err();
    assert!(matches!(err, edits::EditError::NoDriver { .. }), "{err}");
    std::fs::write(
        root.join("etc/ld.so.cache"),
        b"glibc-ld.so.cache1.1\x05\0\0\0",
    )
    .unwrap();
    let err = discover::discover(&root, &mps).unwrap_err().to_string();
    assert!(
        err.contains("ld.so.cache") && err.contains("truncated"),
        "{err}"
    );
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi")
}

#[test]
fn cdi_specs_import_whole_gpus_mig_and_mps() {
    let whole = cdi::import(&[fixtures().join("whole")]).unwrap().unwrap();
    assert_eq!(whole.devices.len(), 1, "index and UUID entries merge");
    assert_eq!(
        whole.devices[0].names,
        ["0", "GPU-1d7a0c2e-0000-4000-8000-000000000000"]
    );
    assert_eq!(whole.common.symlinks.len(), 1);
    assert_eq!(
        whole.common.symlinks[0].link,
        "/usr/lib/x86_64-linux-gnu/libcuda.so"
    );
    assert_eq!(
        whole.common.hooks.len(),
        1,
        "update-ldcache is kept, and reported as not run"
    );
    let mut spec = serde_json::json!({});
    let sel = whole.select(&GpuSelection::All).unwrap();
    let applied = edits::apply(&mut spec, &sel).unwrap();
    assert_eq!((applied.devices, applied.mounts), (3, 1));
    assert_eq!(applied.hooks_skipped, ["update-ldcache"]);

    let mig = cdi::import(&[fixtures().join("mig")]).unwrap().unwrap();
    let m = mig.devices.iter().find(|d| d.mig).unwrap();
    assert_eq!(m.names, ["0:1", "MIG-5e5c6a4e-0000-4000-8000-000000000001"]);
    let sel = mig
        .select(&GpuSelection::Devices(vec![
            "MIG-5e5c6a4e-0000-4000-8000-000000000001".into(),
        ]))
        .unwrap();
    assert_eq!(sel.device_nodes.len(), 4);
    assert_eq!(
        mig.select(&GpuSelection::All).unwrap().device_nodes.len(),
        2,
        "all = whole GPUs"
    );

    let mps = cdi::import(&[fixtures().join("mps")]).unwrap().unwrap();
    assert_eq!(mps.devices.len(), 2);
    assert_eq!(mps.common.mounts[0].container_path, "/tmp/nvidia-mps");
    // A later directory wins.
    let both = cdi::import(&[fixtures().join("whole"), fixtures().join("mps")])
        .unwrap()
        .unwrap();
    assert!(both.source.contains("mps"), "{}", both.source);

    // A stale spec (a node that no longer exists, numbers not given) names the file and node.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("nvidia.json"),
        r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","hostPath":"/nonexistent/nvidia0"}]}}]}"#,
    )
    .unwrap();
    let err = cdi::import(&[dir.path().to_owned()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nvidia.json") && err.contains("/dev/nvidia0") && err.contains("stale"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("nvidia.json"),
        r#"{"kind": "nvidia.com/gpu", "devi"#,
    )
    .unwrap();
    assert!(
        cdi::import(&[dir.path().to_owned()])
            .unwrap_err()
            .to_string()
            .contains("nvidia.json")
    );
    // Other vendors' specs are not ours.
    std::fs::write(
        dir.path().join("nvidia.json"),
        r#"{"cdiVersion":"0.5.0","kind":"vendor.com/fpga","devices":[]}"#,
    )
    .unwrap();
    assert!(cdi::import(&[dir.path().to_owned()]).unwrap().is_none());
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one node's GPU containers: the edits, then each opt-out and failure"
)]
fn a_gpu_container_gets_the_cached_edits_without_a_hook() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(root) = root_or_skip(dir.path()) else {
        return;
    };
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start(
        &format!("it-{}-nv", std::process::id()),
        shim.parent().unwrap(),
    ) else {
        return;
    };
    // mqfqd builds the edits from the fake root and publishes them where the shims look.
    let daemon = edits_daemon(&c, dir.path(), &root);
    // The interposer, installed where this containerd's shims look, and an image with a glibc
    // it loads into.
    std::fs::copy(
        mqfq_testkit::built_interposer(),
        c.dir().join("libmqfq_cuda.so"),
    )
    .unwrap();
    c.import_image(
        mqfq_testkit::GLIBC_IMAGE,
        &mqfq_testkit::host_glibc().unwrap(),
    );
    let script = format!(
        "ls -ln /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm; test -e /dev/nvidia0 || echo no-nvidia0; \
         readlink /{LIBDIR}/libcuda.so.1; readlink /{LIBDIR}/libcuda.so; \
         test -s /{LIBDIR}/libcuda.so.{VERSION} && echo lib-mounted; /usr/bin/nvidia-smi; \
         grep -q libcuda.so.1 /etc/ld.so.cache && echo cache-lists-libcuda; \
         echo pre=$LD_PRELOAD ctl=$MQFQ_CTL_DIR id=$MQFQ_CONTAINER_ID; \
         test -f /usr/lib/mqfq/libmqfq_cuda.so && echo interposer-mounted; \
         touch /run/mqfq/ctl/probe && echo ctl-writable; \
         echo vis=$NVIDIA_VISIBLE_DEVICES"
    );
    let o = c.run_image(
        MQFQ,
        mqfq_testkit::GLIBC_IMAGE,
        "nv1",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=1",
            "--annotation",
            "io.mqfq.function=nv",
        ],
        &["sh", "-c", &script],
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        c.log()
    );
    for want in [
        "195,   1",
        "195, 255",
        "508,   0",
        "no-nvidia0",
        &format!("libcuda.so.{VERSION}"),
        "libcuda.so.1",
        "lib-mounted",
        "fake nvidia-smi",
        "cache-lists-libcuda",
        "pre=/usr/lib/mqfq/libmqfq_cuda.so ctl=/run/mqfq/ctl id=nv1",
        "interposer-mounted",
        "ctl-writable",
        "vis=void",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(c.log().contains("NVIDIA edits applied"), "{}", c.log());
    assert!(
        !c.dir().join("ctl").join(&c.ns).join("nv1").exists(),
        "the control directory goes with the container"
    );
    // Opting out of the interposer.
    let o = c.run(
        MQFQ,
        "nv4",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=0",
            "--annotation",
            "io.mqfq.uvm=off",
        ],
        &["sh", "-c", "echo pre=$LD_PRELOAD"],
    );
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "pre=");
    // An image without a glibc the interposer can load into (static busybox) runs unpooled:
    // preloading it would stop every program of the container from starting.
    let o = c.run(
        MQFQ,
        "nv5",
        &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
        &["sh", "-c", "echo pre=$LD_PRELOAD"],
    );
    assert!(o.status.success(), "{}", c.log());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "pre=");
    assert!(
        c.log().contains("no glibc the interposer can load into"),
        "{}",
        c.log()
    );
    // A GPU the node does not have fails Create, naming it, and leaves nothing behind.
    let o = c.run(
        MQFQ,
        "nv2",
        &["--env", "NVIDIA_VISIBLE_DEVICES=7"],
        &["true"],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert!(
        err.contains("\"7\"") && err.contains("not on this node"),
        "{err}"
    );
    let _ = c.ctr(&["containers", "rm", "nv2"]);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    // An MPS control daemon starts: mqfqd notices and republishes the edits with its pipe dir.
    let mps = dir.path().join("mps");
    std::fs::create_dir_all(&mps).unwrap();
    std::fs::write(mps.join("control"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(c.edits_file())
        .unwrap_or_default()
        .contains(&mps.display().to_string())
    {
        assert!(Instant::now() < deadline, "edits never refreshed for MPS");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(daemon);
    // A broken NVIDIA setup (as mqfqd publishes it) fails GPU containers at Create with the
    // cause, and leaves nothing behind.
    let broken = mqfq_shim::nvidia::edits::NodeEdits {
        source: "cdi:/etc/cdi/nvidia.yaml".into(),
        error: Some("stale or inconsistent spec: device node /dev/nvidia0 missing".into()),
        ..Default::default()
    };
    mqfq_shim::nvidia::store(&c.edits_file(), &broken).unwrap();
    let o = c.run(
        MQFQ,
        "nv3",
        &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
        &["true"],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert!(
        err.contains("stale or inconsistent") && err.contains("/dev/nvidia0"),
        "{err}"
    );
    assert!(
        !err.contains("invalid argument"),
        "the node's fault, not the request's: {err}"
    );
    let _ = c.ctr(&["containers", "rm", "nv3"]);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// The ld.so.cache the shim builds is read by glibc: a program in a chroot finds `libcuda.so.1`
/// in a directory the loader never searches by default only through that cache, and the image's
/// own entries are kept.
#[test]
fn the_built_ld_cache_lets_glibc_find_driver_libraries() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let root = dir.path().join("root");
    let setup = || -> Result<(), String> {
        let libdir = root.join("lib/x86_64-linux-gnu");
        for d in [
            libdir.clone(),
            root.join("lib64"),
            root.join("opt/nv/lib"),
            root.join("etc"),
        ] {
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        }
        for (from, to) in [
            ("/lib/x86_64-linux-gnu/libc.so.6", libdir.join("libc.so.6")),
            (
                "/lib64/ld-linux-x86-64.so.2",
                root.join("lib64/ld-linux-x86-64.so.2"),
            ),
        ] {
            std::fs::copy(from, &to).map_err(|e| format!("{from}: {e}"))?;
        }
        std::fs::write(dir.path().join("lib.c"), "int fake_cuda;\n").map_err(|e| e.to_string())?;
        sh(Command::new("cc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(root.join(format!("opt/nv/lib/libcuda.so.{VERSION}")))
            .arg(dir.path().join("lib.c")))?;
        std::os::unix::fs::symlink(
            format!("libcuda.so.{VERSION}"),
            root.join("opt/nv/lib/libcuda.so.1"),
        )
        .map_err(|e| e.to_string())?;
        std::fs::write(
            dir.path().join("probe.c"),
            "#include <dlfcn.h>\n#include <stdio.h>\nint main(void){void*h=dlopen(\"libcuda.so.1\",RTLD_NOW);\
             if(!h){printf(\"missing: %s\\n\",dlerror());return 1;}printf(\"found\\n\");return 0;}\n",
        )
        .map_err(|e| e.to_string())?;
        sh(Command::new("cc")
            .arg("-o")
            .arg(root.join("probe"))
            .arg(dir.path().join("probe.c")))?;
        // The image's own cache (libc only: /opt/nv/lib is not in its ld.so.conf).
        std::fs::write(root.join("etc/ld.so.conf"), "/lib/x86_64-linux-gnu\n")
            .map_err(|e| e.to_string())?;
        sh(Command::new("ldconfig").arg("-r").arg(&root))
    };
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    if let Err(e) = setup() {
        assert!(!must_run(), "chroot setup: {e}");
        eprintln!("skipped: {e}");
        return;
    }
    let probe = || {
        let o = Command::new("chroot")
            .arg(&root)
            .arg("/probe")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(probe().contains("missing"), "found without our cache?");
    let e = edits::ContainerEdits {
        libraries: vec![edits::Library {
            soname: "libcuda.so.1".into(),
            path: "/opt/nv/lib/libcuda.so.1".into(),
        }],
        ..edits::ContainerEdits::default()
    };
    let mut spec = serde_json::json!({});
    let fs = mqfq_shim::rootfs::Root::open(&root).unwrap();
    let got = mqfq_shim::nvidia::rootfs::install_ld_cache(&mut spec, &fs, &e, dir.path()).unwrap();
    assert!(
        matches!(got, mqfq_shim::nvidia::rootfs::LdCache::Written { image_entries } if image_entries > 0),
        "{got:?}"
    );
    assert!(
        spec.get("mounts").is_none(),
        "written into the rootfs, not mounted"
    );
    // The loader now finds the library, and libc still.
    assert_eq!(probe().trim(), "found");
    let file = root.join("etc/ld.so.cache");
    let listed = Command::new("ldconfig")
        .arg("-p")
        .arg("-C")
        .arg(&file)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("libcuda.so.1") && listed.contains("libc.so.6"),
        "{listed}"
    );
}

/// Issue 17: a container granted every GPU of a two-GPU node gets the one mqfqd chooses — here
/// a new function, probed on the GPU with nothing running — and only that one's device node.
#[test]
fn a_container_given_every_gpu_gets_the_one_mqfqd_places_it_on() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(root) = root_or_skip(dir.path()) else {
        return;
    };
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start(
        &format!("it-{}-place", std::process::id()),
        shim.parent().unwrap(),
    ) else {
        return;
    };
    let _daemon = edits_daemon(&c, dir.path(), &root);
    // GPU 0 busy: a container given it alone holds its lease while it runs (static busybox:
    // no interposer, so its Start is what is admitted).
    let o = c.ctr(&[
        "run",
        "-d",
        "--snapshotter",
        "native",
        "--runtime",
        MQFQ,
        "--env",
        "NVIDIA_VISIBLE_DEVICES=0",
        "--annotation",
        "io.mqfq.function=hog",
        mqfq_testkit::BUSYBOX,
        "hog",
        "sleep",
        "120",
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        c.log()
    );
    assert!(c.wait_status("hog", "RUNNING"), "{}", c.log());
    let look = "for n in 0 1; do test -e /dev/nvidia$n && echo has-nvidia$n; done; echo vis=$NVIDIA_VISIBLE_DEVICES";
    let o = c.run(
        MQFQ,
        "placed",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=all",
            "--annotation",
            "io.mqfq.function=fresh",
        ],
        &["sh", "-c", look],
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        c.log()
    );
    assert!(out.contains("has-nvidia1"), "{out}\n{}", c.log());
    assert!(
        !out.contains("has-nvidia0"),
        "GPU 0 was not chosen, so not given:\n{out}"
    );
    assert!(
        c.log().contains("mqfqd placed the container on one GPU"),
        "{}",
        c.log()
    );
    c.remove("hog");
}
