//! What the daemon's integration tests share: mqfqd started on a config and waited for, its
//! status through mqfqctl, a clean stop.
#![allow(dead_code, reason = "each test crate uses its own part")]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `mqfqctl status --json` on `sock`, if it answers.
pub fn status(sock: &Path) -> Option<Value> {
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(sock)
        .args(["status", "--json"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())?
}

/// Starts mqfqd on `cfg` with `env`, stderr to `log`, and waits (at most 30 s) until it answers
/// on `sock`.
pub fn serving(cfg: &Path, sock: &Path, log: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_mqfqd"))
        .arg("--config")
        .arg(cfg)
        .envs(env.iter().copied())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(sock).is_none() {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGTERM (a clean stop), then reap.
pub fn stop(mut child: Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
}

/// Writes mqfqd's config `<dir>/mqfqd.toml`: its socket `<dir>/d.sock`, then `rest` (TOML).
/// Returns (config, socket).
pub fn write_config(dir: &Path, rest: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let cfg = dir.join("mqfqd.toml");
    let sock = dir.join("d.sock");
    std::fs::write(&cfg, format!("socket = \"{}\"\n{rest}", sock.display())).unwrap();
    (cfg, sock)
}

/// The NVML double (`tests/doubles`) built into `dir`; `None` (the test skips) where no C
/// compiler is at hand, unless the run must be complete (`MQFQ_REQUIRE_CONTAINERD`).
pub fn nvml_double(dir: &Path) -> Option<std::path::PathBuf> {
    match mqfq_testkit::build_double("nvml", dir) {
        Ok(l) => Some(l),
        Err(e) if std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}
