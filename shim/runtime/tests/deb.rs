//! The Debian package on this machine, as an operator uses it: `dpkg -i` on a node whose
//! containerd config holds the user's own CRI settings registers the runtime (containerd sees
//! handler `mqfq` without losing those settings), `mqfqd` runs as its systemd unit would start it,
//! containerd on that config runs a plain pod and a GPU pod (the libcuda double, through the
//! packaged interposer) on the packaged shim, and `mqfqctl status` shows the GPU function;
//! `dpkg -r` then `dpkg -P` leave the user's config byte for byte and nothing of the package,
//! and containerd still starts on that config and runs a runc pod.
//!
//! It changes the machine (`/usr/bin`, `/etc`), so it runs only when `MQFQ_DEB` names the
//! package (`scripts/test.sh` builds it with `scripts/build-deb.sh`), and refuses to run where
//! the package is installed already, where systemd runs (the package's scripts would restart
//! the machine's containerd) or where any containerd runs. The system's
//! `/etc/containerd/config.toml` is put back afterwards, pass or fail (and by `scripts/test.sh`
//! from a copy on disk, should the test be killed).
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod cri_kit;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use cri_kit::{busybox, connect, exit_code, gpu_server, host_network_pod, remove_pod, run_pod};
use mqfq_testkit::{Containerd, shim_pids, users_cri_config};
use serde_json::Value;

const CONFIG: &str = "/etc/containerd/config.toml";
const PACKAGE: &str = "mqfq-shim";
/// The glibc the README and INSTALL-DEBIAN say the programs need.
const DOCUMENTED_GLIBC: &str = "2.34";

fn dpkg(args: &[&str]) -> Output {
    Command::new("dpkg")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .expect("dpkg")
}

/// dpkg's status of the package ("" when dpkg has never heard of it).
fn status() -> String {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .expect("dpkg-query");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether dpkg knows the package in any state but "not installed" (installed, half done, or
/// removed with its conffiles kept).
fn present() -> bool {
    let s = status();
    !s.trim().is_empty() && !s.contains("not-installed")
}

/// Puts the machine back whatever happens: purges the package, restores containerd's config,
/// stops the mqfqd this test started.
struct Machine {
    config: Option<Vec<u8>>,
    mqfqd: Option<Child>,
}

impl Drop for Machine {
    fn drop(&mut self) {
        if let Some(mut d) = self.mqfqd.take() {
            let _ = Command::new("kill").arg(d.id().to_string()).status();
            let _ = d.wait();
        }
        if present() {
            let _ = dpkg(&["-P", PACKAGE]);
        }
        match &self.config {
            Some(bytes) => {
                let _ = std::fs::write(CONFIG, bytes);
            }
            None => {
                let _ = std::fs::remove_file(CONFIG);
            }
        }
    }
}

/// A scratch directory at a fixed path (containerd's root, state and sockets; the user's config
/// names them), made again for the second containerd after the first one's is gone.
fn scratch(path: &Path) -> tempfile::TempDir {
    let _ = std::fs::remove_dir_all(path);
    tempfile::Builder::new()
        .prefix(path.file_name().unwrap())
        .rand_bytes(0)
        .tempdir_in(path.parent().unwrap())
        .expect("scratch directory")
}

/// `mqfqd` as the packaged unit starts it (its `ExecStart=`), stderr to `log`; waits until the
/// packaged `mqfqctl` reaches it on its default socket.
fn start_mqfqd(log: &Path) -> Child {
    let unit = std::fs::read_to_string("/lib/systemd/system/mqfqd.service").expect("the unit");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let argv: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(argv[0], "/usr/bin/mqfqd", "{exec}");
    let child = Command::new(argv[0])
        .args(&argv[1..])
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start mqfqd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while mqfqctl_status().is_none() {
        assert!(
            Instant::now() < deadline,
            "mqfqd did not answer:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn mqfqctl_status() -> Option<Value> {
    let o = Command::new("/usr/bin/mqfqctl")
        .args(["status", "--json"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())?
}

/// A pod of one busybox container on `handler` that prints `word`: Ok once it exited 0 and
/// logged it (the pod removed again), or why not.
async fn plain_pod(c: &Containerd, name: &str, handler: &str, word: &str) -> Result<(), String> {
    let mut cri = connect(c.socket()).await;
    let logs = c.dir().join(format!("{name}-logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let pod = host_network_pod(&logs, name, name);
    let (pod_id, id) = run_pod(
        &mut cri,
        &pod,
        handler,
        busybox("c", &format!("echo {word}")),
    )
    .await?;
    let code = exit_code(&mut cri, &id).await;
    let log = std::fs::read_to_string(logs.join("c.log")).unwrap_or_default();
    remove_pod(&mut cri, &pod_id).await;
    if code != Some(0) || !log.contains(&format!("stdout F {word}")) {
        return Err(format!("exit {code:?}, log {log:?}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "the package's life: install, GPU pods, remove and purge, in order"
)]
async fn the_package_installs_runs_gpu_pods_and_purges_to_the_users_config() {
    let Some(deb) = std::env::var_os("MQFQ_DEB") else {
        eprintln!("SKIPPED: MQFQ_DEB names no package (scripts/test.sh builds one)");
        return;
    };
    let deb = PathBuf::from(deb);
    // It restarts nothing and shares runc's default root: only where no containerd runs and
    // no systemd would restart one onto the test's config.
    assert!(
        !Path::new("/run/systemd/system").exists(),
        "systemd runs here: the package's scripts would restart the machine's containerd"
    );
    let running: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "containerd")
        })
        .map(|e| e.file_name())
        .collect();
    assert!(
        running.is_empty(),
        "a containerd runs here (pids {running:?})"
    );
    assert!(
        !present(),
        "{PACKAGE} is on this machine ({}): this test installs and purges it itself",
        status()
    );
    let mut machine = Machine {
        config: std::fs::read(CONFIG).ok(),
        mqfqd: None,
    };
    let major = mqfq_testkit::containerd_version().0;
    let scratch_path = PathBuf::from(format!("/tmp/mqfq-deb-{}", std::process::id()));
    let dir = scratch(&scratch_path);
    let users = users_cri_config(dir.path(), major);
    std::fs::create_dir_all("/etc/containerd").unwrap();
    std::fs::write(CONFIG, &users).unwrap();

    // The glibc the package asks for (dpkg-shlibdeps' reading of the binaries) is this one's.
    let depends = Command::new("dpkg-deb")
        .args(["-f", deb.to_str().unwrap(), "Depends"])
        .output()
        .unwrap();
    let depends = String::from_utf8_lossy(&depends.stdout).into_owned();
    let glibc = depends
        .split(',')
        .find_map(|d| d.trim().strip_prefix("libc6 (>= "))
        .and_then(|v| v.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no libc6 minimum in Depends: {depends}"));
    // It asks for no less than the packaged programs need (the newest GLIBC_ version they
    // reference, read from the installed files below), and the docs' "glibc 2.34 or later"
    // is no less than it.
    let at_least = |a: &str, b: &str| {
        Command::new("dpkg")
            .args(["--compare-versions", a, "ge", b])
            .status()
            .unwrap()
            .success()
    };
    assert!(
        at_least(DOCUMENTED_GLIBC, glibc),
        "the package needs glibc {glibc}; the docs say {DOCUMENTED_GLIBC}"
    );

    // Install: the files where the package says, the runtime registered.
    let needs = |path: &str| {
        let v = mqfq_shim::elf::glibc_needed(&std::fs::read(path).unwrap())
            .unwrap_or_else(|| panic!("{path} references no GLIBC_ version"));
        format!("{}.{}", v.0, v.1)
    };
    let o = dpkg(&["-i", deb.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "dpkg -i: {said}");
    for f in [
        "/usr/bin/containerd-shim-mqfq-v2",
        "/usr/bin/mqfqd",
        "/usr/bin/mqfqctl",
        "/usr/lib/mqfq/libmqfq_cuda.so",
        "/usr/lib/mqfq/mqfq-containerd.sh",
        "/lib/systemd/system/mqfqd.service",
        "/etc/mqfq/mqfqd.toml",
        "/usr/share/man/man8/mqfqctl.8.gz",
        "/usr/share/bash-completion/completions/mqfqctl",
    ] {
        assert!(Path::new(f).is_file(), "{f} not installed");
    }
    for program in [
        "/usr/bin/containerd-shim-mqfq-v2",
        "/usr/bin/mqfqd",
        "/usr/bin/mqfqctl",
    ] {
        let n = needs(program);
        assert!(
            at_least(glibc, &n),
            "{program} needs glibc {n}; the package asks for {glibc}"
        );
    }
    let conffiles = Command::new("dpkg-query")
        .args(["-W", "-f=${Conffiles}", PACKAGE])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&conffiles.stdout).contains("/etc/mqfq/mqfqd.toml"),
        "mqfqd.toml is not a conffile"
    );
    let registered = std::fs::read_to_string(CONFIG).unwrap();
    assert!(registered.starts_with(&users) || major >= 2, "{registered}");
    let dump = Command::new("containerd")
        .args(["--config", CONFIG, "config", "dump"])
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("io.containerd.mqfq.v2") || dump.contains("/usr/bin/containerd-shim-mqfq-v2"),
        "{dump}"
    );
    assert!(
        dump.contains(mqfq_testkit::PAUSE),
        "the user's sandbox image lost: {dump}"
    );
    // Installing again changes nothing.
    assert!(dpkg(&["-i", deb.to_str().unwrap()]).status.success());
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), registered);

    machine.mqfqd = Some(start_mqfqd(&dir.path().join("mqfqd.log")));
    // containerd on the system's config; the shims find everything at its packaged default,
    // and (the node's ctr-style users being trusted here) NVIDIA_VISIBLE_DEVICES grants a GPU.
    let Some(c) = Containerd::start_cri_on(
        dir,
        Path::new(CONFIG),
        Path::new("/usr/bin"),
        &[("MQFQ_GPU_ACCESS", "env")],
    ) else {
        return;
    };
    plain_pod(&c, "plain", "mqfq", "from-the-package")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));

    // docs/INSTALL-DEBIAN.md's ctr line: GPU work by annotation, admitted by the packaged mqfqd
    // under its function.
    let o = c.run(
        mqfq_testkit::MQFQ,
        "g1",
        &[
            "--rm",
            "--annotation",
            "io.mqfq.gpu=true",
            "--annotation",
            "io.mqfq.function=hello",
        ],
        &["echo", "gpu-work"],
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("gpu-work"),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        c.log()
    );
    let s = mqfqctl_status().expect("mqfqctl status");
    assert!(
        s["flows"].as_array().is_some_and(|f| f
            .iter()
            .any(|f| f["function"].as_str().is_some_and(|n| n.ends_with("hello")))),
        "mqfqctl status shows no flow of function hello: {s}"
    );

    // A GPU server pod: its bursts go through the packaged interposer to mqfqd.
    let cuda = c
        .install_cuda(Path::new("/usr/lib/mqfq/libmqfq_cuda.so"))
        .unwrap();
    let mut cri = connect(c.socket()).await;
    let logs = c.dir().join("gpu-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pod = host_network_pod(&logs, "gpu", "deb-gpu");
    let (pod_id, _) = run_pod(&mut cri, &pod, "mqfq", gpu_server(&cuda, "gpu", 20))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let shims = shim_pids(&c.socket().display().to_string());
    assert_eq!(shims.len(), 1, "{shims:?}");
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", shims[0])).unwrap(),
        Path::new("/usr/bin/containerd-shim-mqfq-v2")
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while mqfq_testkit::kernel_intervals(&cuda, "gpu").len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the GPU pod never computed\n{}",
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = mqfqctl_status().expect("mqfqctl status");
    assert!(
        s["flows"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["function"]
                .as_str()
                .is_some_and(|n| n.ends_with("deb-gpu")))),
        "mqfqctl status shows no deb-gpu flow: {s}"
    );
    remove_pod(&mut cri, &pod_id).await;
    drop(cri);
    drop(c);

    // Remove, then purge: the user's config byte for byte, nothing of the package left.
    let o = dpkg(&["-r", PACKAGE]);
    assert!(
        o.status.success(),
        "dpkg -r: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), users);
    assert!(!Path::new("/usr/bin/mqfqd").exists());
    assert!(
        Path::new("/etc/mqfq/mqfqd.toml").exists(),
        "remove keeps the conffile"
    );
    let o = dpkg(&["-P", PACKAGE]);
    assert!(
        o.status.success(),
        "dpkg -P: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), users);
    assert!(!present(), "{}", status());
    for gone in [
        "/etc/mqfq",
        "/usr/lib/mqfq",
        "/lib/systemd/system/mqfqd.service",
        "/etc/systemd/system/multi-user.target.wants/mqfqd.service",
        "/etc/containerd/conf.d/mqfq.toml",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} left after purge");
    }
    if let Some(mut d) = machine.mqfqd.take() {
        let _ = Command::new("kill").arg(d.id().to_string()).status();
        let _ = d.wait();
    }

    // containerd still starts on the user's config: runc pods run, handler mqfq is gone.
    let Some(c) = Containerd::start_cri_on(
        scratch(&scratch_path),
        Path::new(CONFIG),
        Path::new("/usr/bin"),
        &[],
    ) else {
        return;
    };
    plain_pod(&c, "after", "runc", "runc-after-purge")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let err = plain_pod(&c, "gone", "mqfq", "x").await.unwrap_err();
    assert!(err.contains("RunPodSandbox"), "{err}");
    drop(c);
    drop(machine);
}
