//! The runtime against an attacker, through a real containerd: hostile images (symlinks at every
//! level of the library, binary and firmware paths; FIFO, device, huge and crafted
//! `ld.so.cache`), pods that claim GPUs they were not given, and container processes that plant
//! symlinks, stall, flood and lie on the interposer's control socket. Nothing outside the
//! test's temporary directories may change, no Create, Pause or Resume may wait past its
//! deadline, and nothing may be left behind.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use mqfq_shim::nvidia::edits::{
    ContainerEdits, DeviceNode, Library, NamedDevice, NodeEdits, Symlink,
};
use mqfq_testkit::{Containerd, GLIBC_IMAGE, Item, MQFQ, Mqfqd};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn shim_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"))
        .parent()
        .unwrap()
}

/// Every file under `dir` with its kind and content (what "nothing changed" compares).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let what = if md.is_dir() {
                todo.push(p.clone());
                "dir".to_owned()
            } else if md.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else {
                format!("file {:?}", std::fs::read(&p).unwrap_or_default())
            };
            out.insert(p, what);
        }
    }
    out
}

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The node's edits: one GPU (its node is /dev/null's numbers, harmless), the driver's symlinks
/// in the library, binary and firmware directories, and libcuda for the ld.so.cache.
fn edits() -> NodeEdits {
    let link = |link: &str, target: &str| Symlink {
        link: link.into(),
        target: target.into(),
    };
    NodeEdits {
        source: "security-test".into(),
        driver_version: "550.54.15".into(),
        common: ContainerEdits {
            symlinks: vec![
                link(&format!("{LIBDIR}/libcuda.so"), "libcuda.so.1"),
                link(&format!("{LIBDIR}/libcuda.so.1"), "libcuda.so.550.54.15"),
                link("/usr/bin/nvidia-smi-link", "nvidia-smi"),
                link("/lib/firmware/nvidia/550.54.15/gsp.bin", "gsp_ga10x.bin"),
            ],
            libraries: vec![Library {
                soname: "libcuda.so.1".into(),
                path: format!("{LIBDIR}/libcuda.so.1"),
            }],
            ..ContainerEdits::default()
        },
        devices: vec![NamedDevice {
            names: vec!["0".into()],
            mig: false,
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    kind: Some("c".into()),
                    major: Some(1),
                    minor: Some(3),
                    ..DeviceNode::default()
                }],
                ..ContainerEdits::default()
            },
        }],
        error: None,
    }
}

/// An ld.so.cache whose entries all point at one long string (amplified by a copying parser),
/// made by the shim's own writer, which stores a string once however many entries share it.
fn crafted_cache(n: usize) -> Vec<u8> {
    let key = "l".repeat(4096);
    let e = mqfq_shim::nvidia::ldcache::Entry {
        flags: 0x0303,
        key: key.as_str().into(),
        value: key.as_str().into(),
        osversion: 0,
        hwcap: 0,
    };
    mqfq_shim::nvidia::ldcache::write(&vec![e; n])
}

/// A path inside the image for a host path (the image's symlinks point at the host).
fn rel(p: &Path) -> String {
    p.to_string_lossy().trim_start_matches('/').to_owned()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one table of hostile images, each run and checked the same way"
)]
fn hostile_images_cannot_make_the_shim_write_or_read_on_the_host() {
    let Some(c) = Containerd::start(&format!("it-{}-hostile", std::process::id()), shim_dir())
    else {
        return;
    };
    mqfq_shim::nvidia::store(&c.edits_file(), &edits()).unwrap();
    // The "host": directories and files the images point at.
    let host = c.dir().join("host");
    for d in ["lib", "usr", "bin", "fw", "etc"] {
        std::fs::create_dir_all(host.join(d)).unwrap();
    }
    std::fs::write(
        host.join("etc/ld.so.cache"),
        b"host cache, not a container's",
    )
    .unwrap();
    std::fs::write(host.join("lib/keep"), b"host library").unwrap();
    let before = snapshot(&host);
    let up = "../".repeat(12);
    let dir = |p: &str| Item::Dir(p.into());
    let sym = |p: &str, t: String| Item::Symlink(p.into(), t);
    let h = |p: &str| host.join(p).display().to_string();
    // (image, items, outcome): whether Create can succeed. An image link whose in-root target
    // does not exist is refused; one whose in-root target exists gets the links there.
    let cases: Vec<(&str, Vec<Item>, bool)> = vec![
        (
            "abs-libdir",
            vec![
                dir("usr"),
                dir("usr/lib"),
                sym("usr/lib/x86_64-linux-gnu", h("lib")),
            ],
            false,
        ),
        (
            "rel-libdir",
            vec![
                dir("usr"),
                sym("usr/lib", format!("{up}{}", rel(&host.join("lib")))),
            ],
            false,
        ),
        ("abs-usr", vec![sym("usr", h("usr"))], false),
        ("abs-bin", vec![dir("usr"), sym("usr/bin", h("bin"))], false),
        (
            "abs-firmware",
            vec![dir("lib"), sym("lib/firmware", h("fw"))],
            false,
        ),
        (
            // The same link, with its target existing inside the image: links go there.
            "abs-libdir-inside",
            {
                let mut v = vec![
                    dir("usr"),
                    dir("usr/lib"),
                    sym("usr/lib/x86_64-linux-gnu", h("lib")),
                ];
                let mut p = String::new();
                for part in rel(&host.join("lib")).split('/') {
                    p = if p.is_empty() {
                        part.to_owned()
                    } else {
                        format!("{p}/{part}")
                    };
                    v.push(dir(&p));
                }
                v
            },
            true,
        ),
        (
            "cache-link",
            vec![sym("etc/ld.so.cache", h("etc/ld.so.cache"))],
            true,
        ),
        (
            "cache-rel-link",
            vec![sym(
                "etc/ld.so.cache",
                format!("{up}{}", rel(&host.join("etc/ld.so.cache"))),
            )],
            true,
        ),
        (
            "cache-fifo",
            vec![Item::Fifo("etc/ld.so.cache".into())],
            true,
        ),
        (
            "cache-device",
            vec![Item::CharDev("etc/ld.so.cache".into(), 1, 5)],
            true,
        ),
        (
            "cache-huge",
            vec![Item::File(
                "etc/ld.so.cache".into(),
                vec![0; (16 << 20) + 1],
                0o644,
            )],
            true,
        ),
        (
            "cache-crafted",
            vec![Item::File(
                "etc/ld.so.cache".into(),
                crafted_cache(6000),
                0o644,
            )],
            true,
        ),
    ];
    for (name, items, ok) in cases {
        let image = format!("docker.io/local/hostile-{name}:latest");
        c.import_image(&image, &items);
        let started = Instant::now();
        let o = c.run_image(
            MQFQ,
            &image,
            &format!("h-{name}"),
            &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
            &[
                "sh",
                "-c",
                "grep -q libcuda.so.1 /etc/ld.so.cache && echo cache-lists-libcuda; \
                           readlink /usr/lib/x86_64-linux-gnu/libcuda.so",
            ],
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(30), "{name}: {took:?}");
        assert_eq!(
            snapshot(&host),
            before,
            "{name}: the host changed\n{}",
            text(&o)
        );
        if ok {
            assert!(o.status.success(), "{name}: {}\n{}", text(&o), c.log());
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("cache-lists-libcuda"), "{name}: {out}");
            assert!(out.contains("libcuda.so.1"), "{name}: {out}");
        } else {
            assert!(!o.status.success(), "{name}: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("in the container"), "{name}: {err}");
            let _ = c.ctr(&["containers", "rm", &format!("h-{name}")]);
        }
        assert!(c.leftovers().is_empty(), "{name}: {:?}", c.leftovers());
    }
}

/// `ldconfig` inside a GPU container works: the cache the shim made is a file of the rootfs, not
/// a mount over it (rename onto a mount point fails with EBUSY).
#[test]
fn ldconfig_runs_in_a_gpu_container() {
    let Some(c) = Containerd::start(&format!("it-{}-ldconfig", std::process::id()), shim_dir())
    else {
        return;
    };
    mqfq_shim::nvidia::store(&c.edits_file(), &edits()).unwrap();
    let mut items = mqfq_testkit::host_glibc().unwrap();
    items.push(Item::Dir("sbin".into()));
    items.push(Item::File(
        "sbin/ldconfig".into(),
        std::fs::read("/sbin/ldconfig").unwrap(),
        0o755,
    ));
    items.push(Item::File(
        "etc/ld.so.conf".into(),
        b"/lib/x86_64-linux-gnu\n".to_vec(),
        0o644,
    ));
    c.import_image("docker.io/local/ldconfig:latest", &items);
    let o = c.run_image(
        MQFQ,
        "docker.io/local/ldconfig:latest",
        "ldc",
        &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
        &["sh", "-c", "grep -q libcuda.so.1 /etc/ld.so.cache && echo before-ok; \
                       /sbin/ldconfig && echo ldconfig-ok; grep -q libc.so.6 /etc/ld.so.cache && echo after-ok"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}\n{}", c.log());
    for want in ["before-ok", "ldconfig-ok", "after-ok"] {
        assert!(out.contains(want), "{want} missing: {out}");
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Under the default policy a pod gets GPU devices only from what the platform assigned: not
/// from the image's `NVIDIA_VISIBLE_DEVICES`, not from `io.mqfq.gpu`.
#[test]
fn only_the_platform_grants_gpus() {
    let Some(c) = Containerd::start_with_env(
        &format!("it-{}-access", std::process::id()),
        shim_dir(),
        &[("MQFQ_GPU_ACCESS", "platform")],
    ) else {
        return;
    };
    mqfq_shim::nvidia::store(&c.edits_file(), &edits()).unwrap();
    let probe = "test -e /dev/nvidia0 && echo has-gpu || echo no-gpu";
    let run = |id: &str, extra: &[&str]| {
        let o = c.run(MQFQ, id, extra, &["sh", "-c", probe]);
        assert!(o.status.success(), "{id}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    // What an nvidia/cuda image's ENV says, and what a pod may annotate.
    assert_eq!(
        run("a1", &["--env", "NVIDIA_VISIBLE_DEVICES=all"]),
        "no-gpu"
    );
    assert_eq!(run("a2", &["--env", "CUDA_VISIBLE_DEVICES=0"]), "no-gpu");
    assert_eq!(run("a3", &["--annotation", "io.mqfq.gpu=true"]), "no-gpu");
    // NVIDIA's volume-mount device list, as the device plugin gives it.
    assert_eq!(
        run(
            "a4",
            &[
                "--mount",
                "type=bind,src=/dev/null,dst=/var/run/nvidia-container-devices/0,options=rbind:ro"
            ]
        ),
        "has-gpu"
    );
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Starts a GPU container running the hostile control-socket program in `mode`.
fn hostile(c: &Containerd, bin: &Path, id: &str, args: &[&str]) {
    let dir = bin.parent().unwrap().display().to_string();
    let mut cmd = vec![format!("{dir}/hostile_ctl")];
    cmd.extend(args.iter().map(|s| (*s).to_owned()));
    let mut a: Vec<String> = [
        "run",
        "-d",
        "--snapshotter",
        "native",
        "--runtime",
        MQFQ,
        "--env",
        "NVIDIA_VISIBLE_DEVICES=0",
        "--annotation",
        "io.mqfq.function=hostile",
        "--mount",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    a.push(format!("type=bind,src={dir},dst={dir},options=rbind:ro"));
    a.push(GLIBC_IMAGE.into());
    a.push(id.into());
    a.extend(cmd);
    let args: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = c.ctr(&args);
    assert!(o.status.success(), "{id}: {}\n{}", text(&o), c.log());
}

/// Container processes that plant symlinks, stall, flood and lie on the control socket: Pause
/// answers within its deadline, the memory move is given up, the container stays paused and is
/// never thawed for the pool again, nothing reaches the host socket, claims stay believable.
/// (Start / Resume gating, so each container holds a lease from its start.)
#[test]
fn hostile_control_sockets_cannot_hold_or_steer_the_runtime() {
    let Some(c) = Containerd::start_with_env(
        &format!("it-{}-ctl", std::process::id()),
        shim_dir(),
        &[("MQFQ_POOL_MOVE_TIMEOUT_MS", "1500"), ("MQFQ_BURST", "off")],
    ) else {
        return;
    };
    let cuda = c.install_cuda(&mqfq_testkit::built_interposer()).unwrap();
    let bin = mqfq_testkit::build_double("hostile_ctl", &cuda).unwrap();
    let d = Mqfqd::start(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        c.dir(),
        &c.daemon_socket(),
        // Four containers hold their Start leases for good: SM activity at 0.1 a lease lets D
        // grow to four while nothing ends (no release, no slowdown to go on).
        "restart_grace_ms = 0\n[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\n\
         [simulated]\nutilization_per_lease = 0.1\n",
    );
    // A host socket a container would like the shim (root) to talk to.
    let host_sock = c.dir().join("host.sock");
    let host = std::os::unix::net::UnixListener::bind(&host_sock).unwrap();
    host.set_nonblocking(true).unwrap();
    let ids = ["stall", "flood", "lie", "link"];
    for id in ids {
        match id {
            "link" => hostile(&c, &bin, id, &["symlink", &host_sock.display().to_string()]),
            mode => hostile(&c, &bin, id, &[mode]),
        }
    }
    d.wait_for("every hostile container running", |s| {
        s["leases"].as_array().is_some_and(|l| l.len() == ids.len())
    });
    std::thread::sleep(Duration::from_millis(300));
    for id in ids {
        let started = Instant::now();
        let o = c.ctr(&["task", "pause", id]);
        assert!(o.status.success(), "{id}: {}", text(&o));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{id}: pause took {:?}",
            started.elapsed()
        );
    }
    // The staller and the flooder are dropped from the pool at Pause (their status failed);
    // the liar's and the link-planter's memory is "evicted" when the hot TTL passes.
    let s = d.wait_for("the pool settled", |s| {
        let tiers = mqfq_testkit::pool_tiers(s);
        !tiers.contains_key("stall")
            && !tiers.contains_key("flood")
            && tiers.get("lie").is_some_and(|t| t == "warm")
            && tiers.get("link").is_some_and(|t| t == "warm")
    });
    assert!(
        c.log().matches("dropped from the GPU memory pool").count() >= 2,
        "{}",
        c.log()
    );
    let total = s["gpus"][0]["memory_total"].as_u64().unwrap();
    for e in s["pool"].as_array().unwrap() {
        assert!(e["bytes"].as_u64().unwrap() <= total, "{e}");
    }
    for id in ids {
        assert!(c.wait_status(id, "PAUSED"), "{id} stays paused");
    }
    assert!(
        host.accept().is_err(),
        "the shim never connected to the host socket"
    );
    let log = c.log();
    assert!(log.contains("not a socket"), "{log}");
    for id in ids {
        c.remove(id);
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
