//! A fake NVIDIA driver root for the shim's tests: two GPUs' device nodes made with mknod, the
//! control nodes, driver libraries in a real ld.so.cache, nvidia-smi and firmware; and `mqfqd`
//! building the node's edits from it.
#![allow(dead_code, reason = "each test crate uses its own part")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_testkit::Containerd;

pub const VERSION: &str = "550.54.15";
pub const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

pub fn must_run() -> bool {
    std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some()
}

pub fn sh(cmd: &mut Command) -> Result<(), String> {
    let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr)))
    }
}

/// A driver root: two GPUs, control nodes, two driver libraries of this version, one of an old
/// version and one unrelated library, all in a real ld.so.cache; nvidia-smi and firmware.
pub fn fake_root(dir: &Path) -> Result<PathBuf, String> {
    let root = dir.join("root");
    let lib = root.join(LIBDIR);
    for d in [
        lib.clone(),
        root.join("etc"),
        root.join("dev"),
        root.join("usr/bin"),
        root.join(format!("lib/firmware/nvidia/{VERSION}")),
        root.join("proc/driver/nvidia/gpus/0000:3b:00.0"),
        root.join("proc/driver/nvidia/gpus/0000:86:00.0"),
        root.join("var/cache/ldconfig"),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    }
    let src = dir.join("empty.c");
    std::fs::write(&src, "int mqfq_fake_symbol;\n").map_err(|e| e.to_string())?;
    for (soname, file) in [
        ("libcuda.so.1", format!("libcuda.so.{VERSION}")),
        ("libnvidia-ml.so.1", format!("libnvidia-ml.so.{VERSION}")),
        (
            "libnvidia-ptxjitcompiler.so.1",
            "libnvidia-ptxjitcompiler.so.470.1".to_owned(),
        ),
        ("libfoo.so.1", "libfoo.so.1.0".to_owned()),
    ] {
        sh(Command::new("cc")
            .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
            .arg(lib.join(&file))
            .arg(&src))?;
        std::os::unix::fs::symlink(&file, lib.join(soname)).map_err(|e| e.to_string())?;
    }
    std::fs::write(root.join("etc/ld.so.conf"), format!("/{LIBDIR}\n"))
        .map_err(|e| e.to_string())?;
    sh(Command::new("ldconfig").arg("-r").arg(&root))?;
    for (name, major, minor) in [
        ("nvidia0", 195, 0),
        ("nvidia1", 195, 1),
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", 508, 0),
    ] {
        sh(Command::new("mknod")
            .arg(root.join("dev").join(name))
            .args(["c", &major.to_string(), &minor.to_string()]))?;
    }
    let w = |p: &str, t: &str| std::fs::write(root.join(p), t).map_err(|e| e.to_string());
    w(
        "proc/driver/nvidia/version",
        &format!(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {VERSION}  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0\n"
        ),
    )?;
    w(
        "proc/driver/nvidia/gpus/0000:3b:00.0/information",
        "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-aaaaaaaa-0000-4000-8000-000000000000\nDevice Minor: \t 0\n",
    )?;
    w(
        "proc/driver/nvidia/gpus/0000:86:00.0/information",
        "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-bbbbbbbb-0000-4000-8000-000000000000\nDevice Minor: \t 1\n",
    )?;
    w("usr/bin/nvidia-smi", "#!/bin/sh\necho fake nvidia-smi\n")?;
    std::fs::set_permissions(
        root.join("usr/bin/nvidia-smi"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(|e| e.to_string())?;
    w(&format!("lib/firmware/nvidia/{VERSION}/gsp.bin"), "fw")?;
    Ok(root)
}

pub fn root_or_skip(dir: &Path) -> Option<PathBuf> {
    match fake_root(dir) {
        Ok(r) => Some(r),
        Err(e) if must_run() => panic!("fake driver root: {e}"),
        Err(e) => {
            eprintln!("skipped (needs root, cc, ldconfig): {e}");
            None
        }
    }
}

/// mqfqd on two simulated GPUs, building its edits from the fake driver `root`; returns once
/// it has published them where the shims look.
pub fn edits_daemon(c: &Containerd, dir: &Path, root: &Path) -> Reaped {
    let cfg = c.dir().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"simulated\"\nrestart_grace_ms = 0\n\
             mps_pipe_dir = \"{}\"\n[simulated]\ngpus = 2\n[nvidia]\ndriver_root = \"{}\"\ncdi_dirs = []\n\
             edits_file = \"{}\"\nrefresh_interval_ms = 100\n[placement]\nenabled = true\n",
            c.daemon_socket().display(),
            dir.join("mps").display(),
            root.display(),
            c.edits_file().display()
        ),
    )
    .unwrap();
    let daemon = Reaped(
        Command::new(mqfq_testkit::daemon_program("mqfqd"))
            .arg("--config")
            .arg(&cfg)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.edits_file().exists() {
        assert!(Instant::now() < deadline, "mqfqd wrote no edits");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon
}

/// A child killed and reaped when dropped, panics included.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
