//! `mqfqctl doctor` against fake nodes: a node set up as docs/USAGE.md says passes (the
//! simulated GPUs a warning), and each way of breaking it is found, named, given a fix and
//! makes the exit code 1 where GPU containers would not go through the runtime.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

const DRIVER: &str = "550.54.15";

/// A node's files under `root`, set up right.
fn good_node(root: &Path, bin: &Path) {
    let w = |p: &str, text: &[u8]| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    };
    w("usr/local/bin/containerd-shim-mqfq-v2", b"#!/bin/sh\n");
    w(
        "etc/containerd/config.toml",
        b"version = 2\nimports = [\"conf.d/mqfq.toml\"]\n",
    );
    w(
        "etc/containerd/conf.d/mqfq.toml",
        b"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.mqfq]\n\
          runtime_type = \"io.containerd.mqfq.v2\"\npod_annotations = [\"io.mqfq.*\"]\n",
    );
    let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
    elf.resize(64, 0);
    w("usr/lib/mqfq/libmqfq_cuda.so", &elf);
    std::fs::set_permissions(
        root.join("usr/lib/mqfq/libmqfq_cuda.so"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    w(
        "proc/driver/nvidia/version",
        format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Tue Feb 20 2024\n")
            .as_bytes(),
    );
    w(
        "var/run/cdi/nvidia.yaml",
        format!("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n# /usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}\n").as_bytes(),
    );
    containerd_says(
        bin,
        "containerd github.com/containerd/containerd v1.7.22 7f7fdf5",
    );
}

/// A fake containerd that prints `banner` for `--version`.
fn containerd_says(bin: &Path, banner: &str) {
    std::fs::write(bin, format!("#!/bin/sh\necho '{banner}'\n")).unwrap();
    std::fs::set_permissions(bin, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn doctor(root: &Path, bin: &Path, sock: &Path) -> (i32, Vec<Value>) {
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(sock)
        .args(["doctor", "--json", "--root"])
        .arg(root)
        .arg("--containerd")
        .arg(bin)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code().unwrap(), v.as_array().unwrap().clone())
}

/// The finding of `check` whose detail mentions `about` (or the first, for "").
fn finding<'a>(all: &'a [Value], check: &str, about: &str) -> &'a Value {
    all.iter()
        .find(|f| f["check"] == check && f["detail"].as_str().unwrap().contains(about))
        .unwrap_or_else(|| panic!("no {check} finding about {about:?}: {all:#?}"))
}

#[test]
fn doctor_passes_a_good_node_and_names_each_break() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the checks want root-owned files, which only root can make");
        return;
    }
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let root = dir.path().join("node");
    let bin = dir.path().join("containerd");
    good_node(&root, &bin);
    let run_dir = dir.path().join("run/mqfq");
    let sock = run_dir.join("mqfqd.sock");
    let cfg = dir.path().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"simulated\"\n[nvidia]\nedits = false\n",
            sock.display()
        ),
    )
    .unwrap();
    let mut d = Command::new(env!("CARGO_BIN_EXE_mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "mqfqd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let (code, all) = doctor(&root, &bin, &sock);
    let bad: Vec<&Value> = all.iter().filter(|f| f["level"] != "ok").collect();
    assert_eq!(code, 0, "{all:#?}");
    assert_eq!(bad.len(), 1, "only the simulated GPUs: {bad:#?}");
    assert_eq!(bad[0]["check"], "gpus");
    assert_eq!(finding(&all, "containerd", "1.7")["level"], "ok");
    assert_eq!(finding(&all, "runtime", "conf.d/mqfq.toml")["level"], "ok");
    assert_eq!(finding(&all, "cdi", DRIVER)["level"], "ok");
    // Imports as containerd reads them: a glob over conf.d, and a file importing itself.
    std::fs::write(
        root.join("etc/containerd/config.toml"),
        "version = 2\nimports = [\"config.toml\", \"/etc/containerd/conf.d/*.toml\"]\n",
    )
    .unwrap();
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(code, 0, "{all:#?}");
    assert_eq!(finding(&all, "runtime", "conf.d/mqfq.toml")["level"], "ok");
    // containerd 2.x's registration: runc's type, the shim as runtime_path.
    std::fs::write(
        root.join("etc/containerd/config.toml"),
        "version = 3\nimports = [\"conf.d/mqfq.toml\"]\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/containerd/conf.d/mqfq.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]\n\
         runtime_type = \"io.containerd.runc.v2\"\n\
         runtime_path = \"/usr/local/bin/containerd-shim-mqfq-v2\"\n\
         pod_annotations = [\"io.mqfq.*\"]\n",
    )
    .unwrap();
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(code, 0, "{all:#?}");
    assert_eq!(finding(&all, "runtime", "conf.d/mqfq.toml")["level"], "ok");
    assert!(all.iter().all(|f| f["check"] != "features"), "{all:#?}");
    good_node(&root, &bin);

    // Each break, alone, then mended.
    type Break = (
        &'static str,
        &'static str,
        &'static str,
        i32,
        Box<dyn Fn(&Path)>,
    );
    let cases: Vec<Break> = vec![
        (
            "shim",
            "PATH",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::remove_file(r.join("usr/local/bin/containerd-shim-mqfq-v2")).unwrap();
            }),
        ),
        (
            "runtime",
            "runtime_type",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::write(r.join("etc/containerd/conf.d/mqfq.toml"), "version = 2\n").unwrap();
            }),
        ),
        (
            "runtime",
            "config.toml",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::write(r.join("etc/containerd/config.toml"), "version = [\n").unwrap();
            }),
        ),
        (
            "annotations",
            "io.mqfq.*",
            "warn",
            0,
            Box::new(|r: &Path| {
                std::fs::write(
                r.join("etc/containerd/conf.d/mqfq.toml"),
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]\n\
                 runtime_type = \"io.containerd.mqfq.v2\"\n",
            )
            .unwrap();
            }),
        ),
        (
            "features",
            "recursive read-only",
            "warn",
            0,
            Box::new(|r: &Path| {
                std::fs::write(
                    r.join("etc/containerd/config.toml"),
                    "version = 3\nimports = [\"conf.d/mqfq.toml\"]\n",
                )
                .unwrap();
                std::fs::write(
                    r.join("etc/containerd/conf.d/mqfq.toml"),
                    "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]\n\
                     runtime_type = \"io.containerd.mqfq.v2\"\npod_annotations = [\"io.mqfq.*\"]\n",
                )
                .unwrap();
            }),
        ),
        (
            "options",
            "ConfigPath",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::write(
                    r.join("etc/containerd/config.toml"),
                    "version = 3\nimports = [\"conf.d/mqfq.toml\"]\n\
                     [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq.options]\n\
                     ConfigPath = \"/etc/mqfq/shim.toml\"\nBinaryName = \"runc\"\n",
                )
                .unwrap();
                std::fs::write(
                    r.join("etc/containerd/conf.d/mqfq.toml"),
                    "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]\n\
                     runtime_type = \"io.containerd.runc.v2\"\n\
                     runtime_path = \"/usr/local/bin/containerd-shim-mqfq-v2\"\n\
                     pod_annotations = [\"io.mqfq.*\"]\n",
                )
                .unwrap();
            }),
        ),
        (
            "interposer",
            "mode 666",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::set_permissions(
                    r.join("usr/lib/mqfq/libmqfq_cuda.so"),
                    std::fs::Permissions::from_mode(0o666),
                )
                .unwrap();
            }),
        ),
        (
            "interposer",
            "ELF",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::write(r.join("usr/lib/mqfq/libmqfq_cuda.so"), "#!/bin/sh\n").unwrap();
            }),
        ),
        (
            "interposer",
            "missing",
            "warn",
            0,
            Box::new(|r: &Path| {
                std::fs::remove_file(r.join("usr/lib/mqfq/libmqfq_cuda.so")).unwrap();
            }),
        ),
        (
            "cdi",
            "another driver",
            "fail",
            1,
            Box::new(|r: &Path| {
                std::fs::write(
                    r.join("var/run/cdi/nvidia.yaml"),
                    "# libcuda.so.535.104.05\n",
                )
                .unwrap();
            }),
        ),
    ];
    for (check, about, level, want_code, brk) in cases {
        good_node(&root, &bin);
        brk(&root);
        let (code, all) = doctor(&root, &bin, &sock);
        let f = finding(&all, check, about);
        assert_eq!(f["level"], level, "{f}");
        assert!(f["fix"].as_str().is_some_and(|x| !x.is_empty()), "{f}");
        assert_eq!(code, want_code, "{check} {about}: {all:#?}");
    }

    // A containerd that never answers: doctor gives up on it and says so.
    good_node(&root, &bin);
    std::fs::write(&bin, "#!/bin/sh\nexec sleep 60\n").unwrap();
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(finding(&all, "containerd", "no answer")["level"], "fail");
    assert_eq!(code, 1);

    // An old containerd; a runtime directory others can write.
    good_node(&root, &bin);
    containerd_says(
        &bin,
        "containerd github.com/containerd/containerd v1.5.9 abc",
    );
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(
        finding(&all, "containerd", "older than 1.6")["level"],
        "fail"
    );
    assert_eq!(code, 1);
    good_node(&root, &bin);
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(finding(&all, "runtime dir", "mode 777")["level"], "fail");
    assert_eq!(code, 1);
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    // mqfqd gone.
    let _ = Command::new("kill").arg(d.id().to_string()).status();
    let _ = d.wait();
    let (code, all) = doctor(&root, &bin, &sock);
    assert_eq!(finding(&all, "mqfqd", "mqfqd.sock")["level"], "fail");
    assert_eq!(code, 1);
    // The table form says the same, each fix under its finding.
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(&sock)
        .args(["doctor", "--root"])
        .arg(&root)
        .arg("--containerd")
        .arg(&bin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("FAIL  mqfqd") && text.contains("fix: systemctl"),
        "{text}"
    );
    let _: PathBuf = root;
}
