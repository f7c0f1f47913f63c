//! Test harness for the runtime's integration tests: each test gets its own containerd (temp
//! root and state, its own sockets, native snapshotter, debug log) with the shim under test on
//! its PATH, an offline busybox OCI image built here from the host's static busybox, and
//! helpers that report anything a test left behind (shim processes, runc state, mounts).
//!
//! Needs root, `containerd`, `ctr`, `runc` and `/bin/busybox` (Debian: containerd, runc,
//! busybox-static). Without root the tests skip themselves, unless `MQFQ_REQUIRE_CONTAINERD=1`
//! (set by `scripts/test.sh`), which turns a skip into a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod config;
mod cuda;
mod image;
mod mqfqd;
pub use config::{cdi_dir, users_cri_config};
pub use cuda::{CheckpointDouble, build_double, kernel_intervals, monotonic_us, most_at_once};
pub use image::{Item, build_busybox_image, build_image, host_glibc};
pub use mqfqd::{Mqfqd, free_metrics_addr, metric, pool_tiers, scrape};

/// The image every test uses.
pub const BUSYBOX: &str = "docker.io/local/busybox:latest";
/// The CRI sandbox (pause) image: busybox waiting for SIGTERM.
pub const PAUSE: &str = "docker.io/local/pause:latest";
/// busybox with the host's glibc in its layer (`ld-linux` and `libc.so.6`): an image the CUDA
/// interposer can be preloaded into.
pub const GLIBC_IMAGE: &str = "docker.io/local/busybox-glibc:latest";
/// CRI's fixed containerd namespace.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Our runtime name.
pub const MQFQ: &str = "io.containerd.mqfq.v2";

/// A running throwaway containerd.
#[derive(Debug)]
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The namespace tests use.
    pub ns: String,
    /// containerd's (major, minor) version.
    pub version: (u32, u32),
    /// runc's state root for this instance (the namespace is a directory in it).
    runc_root: PathBuf,
    /// Whether the namespace's runc state is this instance's own, removed on drop (not where
    /// runc's default root is shared with the machine's own containers).
    owns_runc_dir: bool,
}

/// `PATH` with the containerd under test first: `MQFQ_CONTAINERD_DIR` (a directory holding
/// `containerd`, `ctr` and `containerd-shim-runc-v2` of one release, as
/// `scripts/fetch-containerd.sh` extracts them), else the system's.
#[must_use]
pub fn tool_path() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    match std::env::var("MQFQ_CONTAINERD_DIR") {
        Ok(d) if !d.is_empty() => format!("{d}:{path}"),
        _ => path,
    }
}

/// `ctr` of the containerd under test, for tests that run it themselves.
#[must_use]
pub fn ctr_command() -> Command {
    let mut c = Command::new("ctr");
    c.env("PATH", tool_path());
    c
}

/// The (major, minor) version of the containerd under test.
///
/// # Panics
/// `containerd --version` cannot be run or read.
#[must_use]
pub fn containerd_version() -> (u32, u32) {
    let o = Command::new("containerd")
        .arg("--version")
        .env("PATH", tool_path())
        .output()
        .expect("containerd --version");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    // "containerd github.com/containerd/containerd[/v2] 1.7.24~ds1 …"
    let v = text
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .unwrap_or_else(|| panic!("no version in {text:?}"));
    let mut parts = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty());
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(1);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Whether `bin` is on the test tools' `PATH` (the containerd under test first).
#[must_use]
pub fn have(bin: &str) -> bool {
    Command::new("sh")
        .env("PATH", tool_path())
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether this machine can run the containerd tests; `Err` explains why not when it must.
///
/// # Errors
/// When `MQFQ_REQUIRE_CONTAINERD=1` and something is missing.
pub fn available() -> Result<bool, String> {
    let mut missing = Vec::new();
    if !is_root() {
        missing.push("root".to_owned());
    }
    for b in ["containerd", "ctr", "runc"] {
        if !have(b) {
            missing.push(b.to_owned());
        }
    }
    if !Path::new("/bin/busybox").exists() {
        missing.push("/bin/busybox (busybox-static)".to_owned());
    }
    // CRI's pods get their own network namespace on the kit's bridge network.
    for p in config::CNI_PLUGINS {
        if !Path::new(config::CNI_BIN).join(p).exists() {
            missing.push(format!(
                "{}/{p} (containernetworking-plugins)",
                config::CNI_BIN
            ));
        }
    }
    for b in ["unshare", "ip"] {
        if !have(b) {
            missing.push(format!("{b} (util-linux, iproute2)"));
        }
    }
    if missing.is_empty() {
        return Ok(true);
    }
    let msg = format!("containerd tests need: {}", missing.join(", "));
    if std::env::var("MQFQ_REQUIRE_CONTAINERD").as_deref() == Ok("1") {
        Err(msg)
    } else {
        eprintln!("SKIPPED: {msg}");
        Ok(false)
    }
}

/// A scratch directory for one containerd instance (its root, state, sockets and log).
///
/// # Panics
/// `/tmp` is not writable.
#[must_use]
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mqfq-it-")
        .tempdir_in("/tmp")
        .expect("temp dir")
}

impl Containerd {
    /// Starts containerd with `shim_dir` first on its PATH and imports the busybox image into
    /// namespace `ns`. Returns `None` (test skipped) when the machine cannot run it.
    ///
    /// # Panics
    /// When the machine should be able to run it but containerd does not come up.
    #[must_use]
    pub fn start(ns: &str, shim_dir: &Path) -> Option<Self> {
        Self::launch(ns, shim_dir, false, &[])
    }

    /// Like [`start`](Self::start), with extra environment for containerd and so for its shims
    /// (`MQFQ_FAIL`, `MQFQ_RECONNECT_GRACE_MS`). The shims always get `MQFQ_DAEMON_SOCKET` =
    /// [`daemon_socket`](Self::daemon_socket), where a test may start its own `mqfqd`.
    #[must_use]
    pub fn start_with_env(ns: &str, shim_dir: &Path, env: &[(&str, &str)]) -> Option<Self> {
        Self::launch(ns, shim_dir, false, env)
    }

    /// Like [`start`](Self::start) with the CRI plugin on (namespace `k8s.io`, runtime handlers
    /// `runc` and `mqfq`, the local pause image, native snapshotter, `restrict_oom_score_adj`).
    /// The CRI socket is [`socket`](Self::socket). Pods that ask for a network namespace of their
    /// own (Kubernetes' default) get one on a bridge network: containerd runs in a network
    /// namespace made for it, where the bridge and its addresses live and die with it, so no
    /// test touches the machine's network or another test's.
    #[must_use]
    pub fn start_cri(shim_dir: &Path) -> Option<Self> {
        Self::launch(CRI_NAMESPACE, shim_dir, true, &[])
    }

    fn launch(ns: &str, shim_dir: &Path, cri: bool, env: &[(&str, &str)]) -> Option<Self> {
        match available() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => panic!("{e}"),
        }
        let dir = scratch_dir();
        let d = dir.path();
        let config = config::containerd_config(d, cri, containerd_version(), shim_dir);
        std::fs::write(d.join("config.toml"), config).expect("write config");
        if cri {
            std::fs::write(d.join(config::SHIM_CONFIG), config::shim_config(d))
                .expect("write shim config");
            std::fs::create_dir_all(d.join("cni/net.d")).expect("CNI config dir");
            std::fs::write(
                d.join("cni/net.d/10-mqfq.conflist"),
                config::cni_conflist(d),
            )
            .expect("write CNI config");
        }
        // The shims get the kit's places for mqfqd, the edits, the interposer and their
        // control directories, under this instance's directory.
        let mut kit_env = vec![
            ("MQFQ_DAEMON_SOCKET", d.join("mqfqd.sock")),
            ("MQFQ_EDITS_FILE", d.join("nvidia-edits.json")),
            ("MQFQ_INTERPOSER", d.join("libmqfq_cuda.so")),
            ("MQFQ_CTL_ROOT", d.join("ctl")),
        ];
        // The tests are ctr users: NVIDIA_VISIBLE_DEVICES grants GPUs (the explicit switch;
        // a test of the default policy sets MQFQ_GPU_ACCESS itself).
        kit_env.push(("MQFQ_GPU_ACCESS", "env".into()));
        kit_env.extend(env.iter().map(|(k, v)| (*k, PathBuf::from(v))));
        let config = d.join("config.toml");
        let runc_root = config::runc_root(d, cri);
        Some(Self::spawn(
            dir, &config, ns, shim_dir, cri, &kit_env, runc_root, true,
        ))
    }

    /// CRI on a config file the caller wrote, as an installed node runs it: `config` (the
    /// system's `/etc/containerd/config.toml`, say) holds [`users_cri_config`] of `dir`, plus
    /// whatever an installer added. The shims get only `env`: every other setting is their
    /// default, and runc keeps its state in its default root (which drop leaves alone: it may
    /// hold the machine's own containers). Returns `None` (test skipped)
    /// when the machine cannot run it.
    ///
    /// # Panics
    /// When the machine should be able to run it but containerd does not come up.
    #[must_use]
    pub fn start_cri_on(
        dir: tempfile::TempDir,
        config: &Path,
        shim_dir: &Path,
        env: &[(&str, &str)],
    ) -> Option<Self> {
        match available() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => panic!("{e}"),
        }
        let env: Vec<(&str, PathBuf)> = env.iter().map(|(k, v)| (*k, PathBuf::from(v))).collect();
        let runc_root = config::runc_root(dir.path(), false);
        Some(Self::spawn(
            dir,
            config,
            CRI_NAMESPACE,
            shim_dir,
            true,
            &env,
            runc_root,
            false,
        ))
    }

    #[expect(clippy::too_many_arguments)]
    fn spawn(
        dir: tempfile::TempDir,
        config: &Path,
        ns: &str,
        shim_dir: &Path,
        cri: bool,
        env: &[(&str, PathBuf)],
        runc_root: PathBuf,
        owns_runc_dir: bool,
    ) -> Self {
        let log = std::fs::File::create(dir.path().join("containerd.log")).expect("log");
        let path = format!("{}:{}", shim_dir.display(), tool_path());
        // CRI instances of the kit's own run in a network namespace of their own (its loopback up
        // for CRI's stream server); one on the machine's config stays in the machine's.
        let mut cmd = if cri && owns_runc_dir {
            let mut c = Command::new("unshare");
            c.args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec containerd \"$@\"",
                "containerd",
            ]);
            c
        } else {
            Command::new("containerd")
        };
        let child = cmd
            .arg("--config")
            .arg(config)
            .env("PATH", path)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        let c = Containerd {
            dir,
            child: Some(child),
            ns: ns.to_owned(),
            version: containerd_version(),
            runc_root,
            owns_runc_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not come up:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let images: &[(&str, &[&str])] = if cri {
            &[
                (BUSYBOX, &["sh"]),
                (
                    PAUSE,
                    &["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
                ),
            ]
        } else {
            &[(BUSYBOX, &["sh"])]
        };
        for (i, (name, cmd)) in images.iter().enumerate() {
            let tar = c.dir.path().join(format!("image{i}.tar"));
            build_busybox_image(&tar, name, cmd).expect("build busybox image");
            c.import_tar(&tar, name);
        }
        c
    }

    fn import_tar(&self, tar: &Path, name: &str) {
        let o = self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "native",
            tar.to_str().expect("utf-8 path"),
        ]);
        assert!(
            o.status.success(),
            "import {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Builds an image of busybox plus `items` named `name` and imports it.
    ///
    /// # Panics
    /// The image cannot be built or imported.
    pub fn import_image(&self, name: &str, items: &[Item]) {
        let tar = self.dir.path().join(format!(
            "image-{}.tar",
            name.replace(|ch: char| !ch.is_ascii_alphanumeric(), "_")
        ));
        build_image(&tar, name, &["sh"], items).expect("build image");
        self.import_tar(&tar, name);
    }

    /// Kills a task (thawing it if paused: frozen processes die once thawed), waits until it is
    /// stopped, deletes it and its container.
    ///
    /// # Panics
    /// It does not stop within 20 s, or ctr refuses the deletes.
    pub fn remove(&self, id: &str) {
        let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let _ = self.ctr(&["task", "resume", id]);
        assert!(self.wait_status(id, "STOPPED"), "{id} stopped");
        assert!(self.ctr(&["task", "delete", id]).status.success());
        assert!(self.ctr(&["containers", "rm", id]).status.success());
    }

    /// Where this containerd's shims look for `mqfqd`.
    #[must_use]
    pub fn daemon_socket(&self) -> PathBuf {
        self.dir.path().join("mqfqd.sock")
    }

    /// Where this containerd's shims read the node's NVIDIA edits.
    #[must_use]
    pub fn edits_file(&self) -> PathBuf {
        self.dir.path().join("nvidia-edits.json")
    }

    /// containerd's socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// The scratch directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `ctr -a <socket> -n <ns> args…` (at most 60 s).
    #[must_use]
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .env("PATH", tool_path())
            .arg("60")
            .arg("ctr")
            .arg("-a")
            .arg(self.socket())
            .arg("-n")
            .arg(&self.ns)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// `ctr run --rm --snapshotter native --runtime <runtime> [extra…] busybox <id> cmd…`.
    #[must_use]
    pub fn run(&self, runtime: &str, id: &str, extra: &[&str], cmd: &[&str]) -> Output {
        self.run_image(runtime, BUSYBOX, id, extra, cmd)
    }

    /// [`run`](Self::run) of another image.
    #[must_use]
    pub fn run_image(
        &self,
        runtime: &str,
        image: &str,
        id: &str,
        extra: &[&str],
        cmd: &[&str],
    ) -> Output {
        let mut args = vec![
            "run",
            "--rm",
            "--snapshotter",
            "native",
            "--runtime",
            runtime,
        ];
        args.extend_from_slice(extra);
        args.push(image);
        args.push(id);
        args.extend_from_slice(cmd);
        self.ctr(&args)
    }

    /// `ctr run -d --snapshotter native --runtime <runtime> busybox <id> cmd…` (detached).
    #[must_use]
    pub fn run_detached(&self, runtime: &str, id: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["run", "-d", "--snapshotter", "native", "--runtime", runtime];
        args.push(BUSYBOX);
        args.push(id);
        args.extend_from_slice(cmd);
        self.ctr(&args)
    }

    /// containerd's log so far (the shim's lines included).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// runc's state directory for this instance's namespace (one directory per container).
    #[must_use]
    pub fn runc_dir(&self) -> PathBuf {
        self.runc_root.join(&self.ns)
    }

    /// Everything a test could have left behind: shim processes serving this containerd, runc
    /// state in this namespace, mounts under the scratch directory, tasks and containers. A
    /// shim exits a moment after its last container is deleted, so what is found is looked for
    /// again for up to 10 s before it counts as left behind.
    #[must_use]
    pub fn leftovers(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.leftovers_now();
            if found.is_empty() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn leftovers_now(&self) -> Vec<String> {
        let mut out = Vec::new();
        let sock = self.socket().display().to_string();
        for pid in shim_pids(&sock) {
            out.push(format!("shim process {pid}"));
        }
        let runc = self.runc_dir();
        if let Ok(rd) = std::fs::read_dir(&runc) {
            for e in rd.flatten() {
                out.push(format!("runc state {}", e.path().display()));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let d = self.dir.path().display().to_string();
        for m in mounts.lines().filter(|l| l.contains(&d)) {
            out.push(format!("mount {m}"));
        }
        let tasks = String::from_utf8_lossy(&self.ctr(&["task", "ls", "-q"]).stdout).into_owned();
        for t in tasks.lines().filter(|l| !l.trim().is_empty()) {
            out.push(format!("task {t}"));
        }
        let cs =
            String::from_utf8_lossy(&self.ctr(&["containers", "ls", "-q"]).stdout).into_owned();
        for c in cs.lines().filter(|l| !l.trim().is_empty()) {
            out.push(format!("container {c}"));
        }
        out
    }

    /// Polls `ctr task ls` until `id` shows `status` (at most 20 s).
    #[must_use]
    pub fn wait_status(&self, id: &str, status: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let o = String::from_utf8_lossy(&self.ctr(&["task", "ls"]).stdout).into_owned();
            if o.lines()
                .any(|l| l.split_whitespace().next() == Some(id) && l.contains(status))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

/// The interposer cargo built for this workspace (`target/<profile>/deps`, beside the calling
/// test binary), built first if this test runs alone.
///
/// # Panics
/// cargo cannot build it.
#[must_use]
pub fn built_interposer() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps folder");
    let so = deps.join("libmqfq_cuda.so");
    if !so.exists() {
        let release = deps.parent().is_some_and(|p| p.ends_with("release"));
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "mqfq-cuda-hook", "--lib"]);
        if release {
            cargo.arg("--release");
        }
        assert!(
            cargo.status().expect("cargo").success(),
            "build the interposer"
        );
    }
    so
}

/// A program of the daemon's crate (`mqfqd`, `mqfqctl`) as cargo built it for this workspace
/// (`target/<profile>/`, above the calling test binary), built first if missing. The shim's tests
/// cannot name another package's binaries through `CARGO_BIN_EXE_*`; `cargo test --workspace`
/// builds them fresh, a lone `cargo test -p mqfq-shim` uses what the last build left.
///
/// # Panics
/// cargo cannot build it.
#[must_use]
pub fn daemon_program(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = profile.join(name);
    if !bin.exists() {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "mqfq-daemon", "--bins"]);
        if profile.ends_with("release") {
            cargo.arg("--release");
        }
        assert!(cargo.status().expect("cargo").success(), "build {name}");
    }
    bin
}

/// Pids of shim processes whose command line names this containerd's socket.
#[must_use]
pub fn shim_pids(sock: &str) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains("containerd-shim") && cmd.contains(sock) {
                v.push(pid);
            }
        }
    }
    v
}

/// SIGTERM, then SIGKILL if `child` has not exited within `grace`, and reaps it: a process that
/// does not stop fails its test by what the test checks, never by hanging the run.
pub(crate) fn terminate(mut child: Child, grace: Duration) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Clean up even when the test failed: tasks, containers, shims, containerd, mounts.
        let tasks = String::from_utf8_lossy(&self.ctr(&["task", "ls", "-q"]).stdout).into_owned();
        for t in tasks.lines().filter(|l| !l.trim().is_empty()) {
            let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", t]);
            let _ = self.ctr(&["task", "delete", "-f", t]);
        }
        let cs =
            String::from_utf8_lossy(&self.ctr(&["containers", "ls", "-q"]).stdout).into_owned();
        for c in cs.lines().filter(|l| !l.trim().is_empty()) {
            let _ = self.ctr(&["containers", "rm", c]);
        }
        if let Some(child) = self.child.take() {
            terminate(child, Duration::from_secs(10));
        }
        let sock = self.socket().display().to_string();
        for pid in shim_pids(&sock) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -F '{}' /proc/self/mountinfo | awk '{{print $5}}' | sort -r | xargs -r -n1 umount -l",
                self.dir.path().display()
            ))
            .status();
        if self.owns_runc_dir {
            let _ = std::fs::remove_dir_all(self.runc_dir());
        }
    }
}

/// The `q`-quantile (nearest rank) of `v`, sorting it; 0 for an empty slice. Shared by the
/// benchmarks and the demo.
#[must_use]
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a sample count; the rank is clamped into 1..=len"
    )]
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The mean of `v`; 0 for an empty slice.
#[must_use]
pub fn mean(v: &[f64]) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "a sample count")]
    let n = v.len().max(1) as f64;
    v.iter().sum::<f64>() / n
}
