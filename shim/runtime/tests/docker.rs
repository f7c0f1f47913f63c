//! Docker Engine over the shim, the path OpenWhisk's Docker factory takes with
//! `use-runc=false`: dockerd 26.1 (Debian 13's package, extracted by `scripts/fetch-docker.sh`;
//! `MQFQ_DOCKER_DIR` names it) on a private containerd whose PATH holds the shim, no bridge and no
//! iptables, an image from `docker load`. `docker run --runtime io.containerd.mqfq.v2` runs on
//! the shim, `exec`, `pause` / `unpause` and `rm -f` reach it, and a container annotated as GPU
//! work is admitted by `mqfqd` under the function it names.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mqfq_testkit::{BUSYBOX, Containerd, MQFQ, Mqfqd, shim_pids};

/// A dockerd on a private containerd; killed on drop.
struct Dockerd {
    child: Child,
    sock: PathBuf,
    bin: PathBuf,
    log: PathBuf,
}

impl Dockerd {
    fn start(dir: &Path, c: &Containerd) -> Self {
        let d = c.dir().join("docker");
        std::fs::create_dir_all(&d).unwrap();
        let sock = d.join("docker.sock");
        let log = d.join("dockerd.log");
        let path = format!(
            "{}:{}:{}",
            dir.join("usr/bin").display(),
            dir.join("usr/sbin").display(),
            mqfq_testkit::tool_path()
        );
        let child = Command::new(dir.join("usr/sbin/dockerd"))
            .arg("--containerd")
            .arg(c.socket())
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", sock.display()))
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--storage-driver=vfs",
                "--containerd-namespace=moby",
                "--containerd-plugins-namespace=moby-plugins",
            ])
            .env("PATH", path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start dockerd");
        let dockerd = Self {
            child,
            sock,
            bin: dir.join("usr/bin/docker"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dockerd.docker(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "dockerd did not come up:\n{}",
                dockerd.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        dockerd
    }

    /// `docker args…` on this daemon (at most 60 s).
    fn docker(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .arg("60")
            .arg(&self.bin)
            .arg("--host")
            .arg(format!("unix://{}", self.sock.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("docker")
    }

    /// `docker args…`, which must succeed: its stdout, trimmed.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.docker(args);
        assert!(
            o.status.success(),
            "docker {args:?}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn docker_runs_execs_pauses_and_gates_gpu_work_on_the_shim() {
    let Some(dir) = std::env::var_os("MQFQ_DOCKER_DIR").map(PathBuf::from) else {
        assert!(
            std::env::var_os("MQFQ_REQUIRE_DOCKER").is_none(),
            "MQFQ_DOCKER_DIR is not set (scripts/fetch-docker.sh)"
        );
        eprintln!("SKIPPED: MQFQ_DOCKER_DIR names no Docker (scripts/fetch-docker.sh)");
        return;
    };
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start("moby", shim.parent().unwrap()) else {
        return;
    };
    let daemon = Mqfqd::start(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        c.dir(),
        &c.daemon_socket(),
        "restart_grace_ms = 0\n",
    );
    let docker = Dockerd::start(&dir, &c);
    let tar = c.dir().join("busybox.tar");
    mqfq_testkit::build_busybox_image(&tar, BUSYBOX, &["sh"]).unwrap();
    docker.ok(&["load", "--input", tar.to_str().unwrap()]);
    let run = |extra: &[&str], cmd: &[&str]| {
        let mut a = vec![
            "run",
            "--runtime",
            MQFQ,
            "--network",
            "none",
            "--pull",
            "never",
        ];
        a.extend(extra);
        a.push(BUSYBOX);
        a.extend(cmd);
        docker.ok(&a)
    };

    // A plain container: its output, through the shim.
    assert_eq!(run(&["--rm"], &["echo", "hello-docker"]), "hello-docker");

    // A long-running one: the shim serves it, and exec, pause and unpause reach it.
    let id = run(&["-d"], &["sleep", "300"]);
    let shims = shim_pids(&c.socket().display().to_string());
    assert_eq!(shims.len(), 1, "{shims:?}");
    let exe = std::fs::read_link(format!("/proc/{}/exe", shims[0])).unwrap();
    assert_eq!(exe, shim, "the container's shim is not ours");
    // runc's state is in containerd's root for the runtime, not Docker's runc root
    // (`<exec-root>/runtime-runc`, where OpenWhisk's use-runc=true would look:
    // docs/PLATFORMS.md).
    assert!(c.runc_dir().join(&id).join("state.json").is_file());
    let dockers_runc = c.dir().join("docker/exec/runtime-runc/moby");
    assert!(!dockers_runc.join(&id).exists());
    assert_eq!(docker.ok(&["exec", &id, "echo", "exec-ok"]), "exec-ok");
    docker.ok(&["pause", &id]);
    assert_eq!(
        docker.ok(&["inspect", "--format", "{{.State.Status}}", &id]),
        "paused"
    );
    let task = |want: &str| {
        let o = c.ctr(&["task", "ls"]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l.starts_with(&id) && l.contains(want))
    };
    assert!(task("PAUSED"), "containerd's task is not paused");
    docker.ok(&["unpause", &id]);
    assert!(task("RUNNING"), "containerd's task did not resume");
    docker.ok(&["rm", "--force", &id]);

    // GPU work by annotation: mqfqd admits its Start under the function it names.
    assert_eq!(
        run(
            &[
                "--rm",
                "--annotation",
                "io.mqfq.gpu=true",
                "--annotation",
                "io.mqfq.function=docker-fn",
            ],
            &["echo", "gpu-work"],
        ),
        "gpu-work"
    );
    let admitted = daemon.records().iter().any(|r| {
        r["event"] == "dispatch"
            && r["function"]
                .as_str()
                .is_some_and(|f| f.ends_with("docker-fn"))
    });
    assert!(admitted, "no dispatch of docker-fn: {:?}", daemon.records());
    drop(docker);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shim_pids(&c.socket().display().to_string()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        shim_pids(&c.socket().display().to_string()).is_empty(),
        "a shim outlived its containers"
    );
}
