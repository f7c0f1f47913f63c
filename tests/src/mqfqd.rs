//! A private `mqfqd` for the integration tests: simulated GPUs, a dispatch log, its own socket,
//! stderr kept in a file; `mqfqctl status --json` to look at it. The binaries are the ones cargo
//! built for the test (`CARGO_BIN_EXE_*`), passed in by the caller.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running daemon (SIGTERM at drop, SIGKILL 20 s later).
#[derive(Debug)]
pub struct Mqfqd {
    child: Option<Child>,
    bin: PathBuf,
    ctl: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    stderr: PathBuf,
    /// The daemon's environment beyond this process's (the NVML double's settings).
    env: Vec<(String, std::ffi::OsString)>,
}

impl Mqfqd {
    /// Writes `dir/mqfqd.toml` (simulated backend, no metrics unless `extra` sets
    /// `metrics_addr`, no NVIDIA edits, plus `extra`: top-level keys, then any tables) and starts `bin` on it, waiting until `socket` answers.
    ///
    /// # Panics
    /// The daemon does not come up within 20 s.
    #[must_use]
    pub fn start(bin: &Path, ctl: &Path, dir: &Path, socket: &Path, extra: &str) -> Self {
        Self::start_on_driver(bin, ctl, dir, socket, &dir.join("no-driver"), extra)
    }

    /// As [`start`](Self::start), with the node's NVIDIA edits discovered from the driver root
    /// `driver_root` (a fake one the test built) and published where the shims read them.
    ///
    /// # Panics
    /// The daemon does not come up within 20 s.
    #[must_use]
    pub fn start_on_driver(
        bin: &Path,
        ctl: &Path,
        dir: &Path,
        socket: &Path,
        driver_root: &Path,
        extra: &str,
    ) -> Self {
        let sim = "backend = \"simulated\"\n";
        Self::start_full(bin, ctl, (dir, socket, driver_root), sim, Vec::new(), extra)
    }

    /// As [`start`](Self::start), on NVML through `library` (the NVML double) with `env` (its
    /// settings) in the daemon's environment.
    ///
    /// # Panics
    /// The daemon does not come up within 20 s.
    #[must_use]
    pub fn start_on_nvml(
        bin: &Path,
        ctl: &Path,
        (dir, socket): (&Path, &Path),
        library: &Path,
        env: Vec<(String, std::ffi::OsString)>,
        extra: &str,
    ) -> Self {
        let backend = format!(
            "backend = \"nvml\"\nnvml_library = \"{}\"\nmps_pipe_dir = \"/nonexistent-mps\"\n",
            library.display()
        );
        let driver = dir.join("no-driver");
        Self::start_full(bin, ctl, (dir, socket, &driver), &backend, env, extra)
    }

    fn start_full(
        bin: &Path,
        ctl: &Path,
        (dir, socket, driver_root): (&Path, &Path, &Path),
        backend: &str,
        env: Vec<(String, std::ffi::OsString)>,
        extra: &str,
    ) -> Self {
        let config = dir.join("mqfqd.toml");
        let log = dir.join("dispatch.jsonl");
        let toml = format!(
            "socket = \"{}\"\n{backend}dispatch_log = \"{}\"\n{}{extra}\n\
             [nvidia]\nedits_file = \"{}\"\ndriver_root = \"{}\"\ncdi_dirs = []\n",
            socket.display(),
            log.display(),
            if extra.contains("metrics_addr") {
                ""
            } else {
                "metrics_addr = \"\"\n"
            },
            dir.join("nvidia-edits.json").display(),
            driver_root.display(),
        );
        std::fs::write(&config, toml).expect("write mqfqd.toml");
        let mut d = Mqfqd {
            child: None,
            bin: bin.to_owned(),
            ctl: ctl.to_owned(),
            socket: socket.to_owned(),
            config,
            log,
            stderr: dir.join("mqfqd.log"),
            env,
        };
        d.spawn();
        d
    }

    /// (Re)starts the daemon process on the same config.
    ///
    /// # Panics
    /// It does not come up within 20 s.
    pub fn spawn(&mut self) {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr)
            .expect("mqfqd log");
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stderr(err)
            .spawn()
            .expect("spawn mqfqd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "mqfqd did not come up: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's pid, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its config file.
    #[must_use]
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// What the daemon logged.
    #[must_use]
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `mqfqctl status --json`.
    ///
    /// # Panics
    /// mqfqctl fails or prints something that is not JSON.
    #[must_use]
    pub fn status(&self) -> Value {
        serde_json::from_str(&self.ctl(&["status", "--json"])).expect("mqfqctl --json")
    }

    /// What `mqfqctl <args>` prints for this daemon.
    ///
    /// # Panics
    /// mqfqctl fails.
    #[must_use]
    pub fn ctl(&self, args: &[&str]) -> String {
        let o = Command::new(&self.ctl)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run mqfqctl");
        assert!(
            o.status.success(),
            "mqfqctl: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Polls the status until `pred` holds; returns that status.
    ///
    /// # Panics
    /// Not within 60 s (the message shows the last status and the daemon's log).
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "never {what}: {s:#}\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The dispatch record so far: mqfqd writes it off its lock and answers Status once what it
    /// decided is written, so one Status call comes first (a daemon that is gone has nothing
    /// left to write).
    ///
    /// # Panics
    /// A line that is not JSON.
    #[must_use]
    pub fn records(&self) -> Vec<Value> {
        let _ = Command::new(&self.ctl)
            .arg("--socket")
            .arg(&self.socket)
            .args(["status", "--json"])
            .output();
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("dispatch record line"))
            .collect()
    }
}

/// The tier of each pooled container in a `mqfqctl status --json` answer, by container id; one
/// with an order in flight shows as `tier→order` (`hot→evict`).
#[must_use]
pub fn pool_tiers(status: &Value) -> std::collections::BTreeMap<String, String> {
    status["pool"]
        .as_array()
        .map(|p| {
            p.iter()
                .map(|e| {
                    let tier = e["tier"].as_str().unwrap_or("");
                    let tier = match e["pending"].as_str().unwrap_or("") {
                        "" => tier.to_owned(),
                        order => format!("{tier}→{order}"),
                    };
                    (e["container_id"].as_str().unwrap_or("").to_owned(), tier)
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Mqfqd {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            crate::terminate(c, Duration::from_secs(20));
        }
    }
}

/// A loopback address with a port free now, for mqfqd's `metrics_addr`.
///
/// # Panics
/// No loopback port can be bound.
#[must_use]
pub fn free_metrics_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// The body of `GET /metrics` from a running daemon at `addr`.
///
/// # Panics
/// Nothing listens there, or the answer has no body.
#[must_use]
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap()
}

/// The value of the sample `name` (with its labels, as exposed) in a scrape; 0 when absent.
#[must_use]
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
