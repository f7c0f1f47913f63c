//! The shim through a real containerd and runc, driven by `ctr` like an operator would.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use mqfq_testkit::{BUSYBOX, Containerd, MQFQ};

fn containerd(name: &str) -> Option<Containerd> {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    Containerd::start(&format!("it-{}-{name}", std::process::id()), shim.parent()?)
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_clean(c: &Containerd) {
    let left = c.leftovers();
    assert!(
        left.is_empty(),
        "left behind: {left:#?}\ncontainerd log:\n{}",
        c.log()
    );
}

fn run_detached(c: &Containerd, id: &str) {
    let o = c.run_detached(MQFQ, id, &["sleep", "300"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(c.wait_status(id, "RUNNING"), "{}", c.log());
}

#[test]
fn run_rm_behaves_exactly_like_runc() {
    let Some(c) = containerd("run") else { return };
    let o = c.run(
        MQFQ,
        "m0",
        &[],
        &["sh", "-c", "echo out; echo err >&2; exit 7"],
    );
    assert_eq!(o.status.code(), Some(7), "{}", err(&o));
    assert_eq!(out(&o), "out\n");
    assert!(err(&o).contains("err"), "{}", err(&o));
    let cases: [&[&str]; 5] = [
        &["echo", "hello"],
        &["sh", "-c", "exit 42"],
        // The shell's own "Killed" notice races with the exit in either runtime: not compared.
        &[
            "sh",
            "-c",
            "sleep 1 & kill -9 $!; wait $! 2>/dev/null; echo $?",
        ],
        &["sh", "-c", "kill -9 $$"],
        &[
            "sh",
            "-c",
            "cat /proc/self/status | grep -c Cap; ls /nonexistent",
        ],
    ];
    for (i, cmd) in cases.iter().enumerate() {
        let ours = c.run(MQFQ, &format!("m{}", i + 1), &[], cmd);
        let runc = c.run("io.containerd.runc.v2", &format!("r{}", i + 1), &[], cmd);
        assert_eq!(ours.status.code(), runc.status.code(), "{cmd:?}");
        assert_eq!(out(&ours), out(&runc), "{cmd:?}");
        assert_eq!(err(&ours), err(&runc), "{cmd:?}");
    }
    // Larger output arrives whole: the exit is published after stdio drained.
    let o = c.run(MQFQ, "big", &[], &["seq", "1", "20000"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).lines().count(), 20000);
    assert_eq!(out(&o).lines().last(), Some("20000"));
    assert_clean(&c);
}

#[test]
fn exec_pause_resume_metrics_kill_delete() {
    let Some(c) = containerd("life") else { return };
    run_detached(&c, "l1");
    let o = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "l1",
        "sh",
        "-c",
        "echo in-exec; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    assert_eq!(out(&o), "in-exec\n");
    assert!(c.ctr(&["task", "pause", "l1"]).status.success());
    assert!(c.wait_status("l1", "PAUSED"));
    assert!(c.ctr(&["task", "resume", "l1"]).status.success());
    assert!(c.wait_status("l1", "RUNNING"));
    let m = c.ctr(&["task", "metrics", "l1"]);
    assert!(m.status.success(), "{}", err(&m));
    assert!(out(&m).contains("memory.usage"), "{}", out(&m));
    let ps = c.ctr(&["task", "ps", "l1"]);
    assert!(
        ps.status.success() && out(&ps).lines().count() >= 2,
        "{}",
        out(&ps)
    );
    assert!(
        c.ctr(&["task", "kill", "-s", "SIGKILL", "l1"])
            .status
            .success()
    );
    assert!(c.wait_status("l1", "STOPPED"), "{}", c.log());
    let d = c.ctr(&["task", "delete", "l1"]);
    assert!(d.status.success(), "{}", err(&d));
    assert!(c.ctr(&["containers", "rm", "l1"]).status.success());
    assert_clean(&c);
}

#[test]
fn a_sigkilled_shim_is_cleaned_up_by_delete() {
    let Some(c) = containerd("crash") else { return };
    run_detached(&c, "k1");
    let pids = mqfq_testkit::shim_pids(&c.socket().display().to_string());
    assert_eq!(pids.len(), 1, "one shim for one container: {pids:?}");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // containerd notices, runs `containerd-shim-mqfq-v2 delete`, and forgets the task.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out(&c.ctr(&["task", "ls", "-q"])).trim().is_empty() {
        assert!(
            Instant::now() < deadline,
            "task never cleaned:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.ctr(&["containers", "rm", "k1"]).status.success());
    assert!(c.log().contains("cleaning up after shim disconnected"));
    // containerd's `delete` run of the shim removes runc state and mounts; give it time.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_clean(&c);
}

#[test]
fn bad_annotations_are_invalid_argument_and_leave_nothing() {
    let Some(c) = containerd("badann") else {
        return;
    };
    let o = c.run(
        MQFQ,
        "b1",
        &["--annotation", "io.mqfq.weight=-3"],
        &["true"],
    );
    assert!(!o.status.success());
    assert!(err(&o).contains("io.mqfq.weight"), "{}", err(&o));
    assert!(err(&o).contains("invalid argument"), "{}", err(&o));
    // A failed `ctr run` leaves ctr's own container record; remove it, then nothing may remain.
    let _ = c.ctr(&["containers", "rm", "b1"]);
    assert_clean(&c);
    // A GPU container's interposer annotation is checked before its rootfs is mounted.
    let o = c.run(
        MQFQ,
        "b2",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=0",
            "--annotation",
            "io.mqfq.native-alloc=../../lib",
        ],
        &["true"],
    );
    assert!(!o.status.success());
    assert!(err(&o).contains("io.mqfq.native-alloc"), "{}", err(&o));
    assert!(err(&o).contains("invalid argument"), "{}", err(&o));
    let _ = c.ctr(&["containers", "rm", "b2"]);
    assert_clean(&c);
}

#[test]
fn gpu_containers_are_classified_and_run() {
    let Some(c) = containerd("gpu") else { return };
    let o = c.run(
        MQFQ,
        "g1",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=0",
            "--annotation",
            "io.mqfq.function=resnet",
            "--annotation",
            "io.mqfq.weight=2",
        ],
        &["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "0\n");
    let log = c.log();
    let line = log
        .lines()
        .find(|l| l.contains("GPU container created"))
        .unwrap_or_else(|| panic!("no classification line in:\n{log}"));
    assert!(line.contains("resnet") && line.contains("g1"), "{line}");
    assert_clean(&c);
}

#[test]
fn log_uris_file_and_binary() {
    let Some(c) = containerd("logs") else { return };
    let file = c.dir().join("file.log");
    let uri = format!("file://{}", file.display());
    let o = c.run(
        MQFQ,
        "f1",
        &["--log-uri", &uri],
        &["sh", "-c", "echo to-out; echo to-err >&2"],
    );
    assert!(o.status.success(), "{}", err(&o));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("to-out") && text.contains("to-err"),
        "{text:?}"
    );

    // A logging binary the way nerdctl's works: fds 3 and 4 are the streams, closing fd 5 says
    // "ready", CONTAINER_ID / CONTAINER_NAMESPACE in the environment, query pairs as arguments.
    let dir = c.dir().join("bin-logs");
    std::fs::create_dir_all(&dir).unwrap();
    let script = c.dir().join("logger.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nd=\"$2\"\necho \"$CONTAINER_NAMESPACE/$CONTAINER_ID\" > \"$d/who\"\n\
         exec 5>&-\ncat <&3 > \"$d/out\" & cat <&4 > \"$d/err\" &\nwait\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let uri = format!("binary://{}?dir={}", script.display(), dir.display());
    let o = c.run(
        MQFQ,
        "b1",
        &["--log-uri", &uri],
        &["sh", "-c", "echo bin-out; echo bin-err >&2"],
    );
    assert!(o.status.success(), "{}", err(&o));
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    while !(read("out").contains("bin-out") && read("err").contains("bin-err")) {
        assert!(
            Instant::now() < deadline,
            "out={:?} err={:?}",
            read("out"),
            read("err")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read("who").trim(), format!("{}/b1", c.ns));
    assert_clean(&c);
}

#[test]
fn terminals_through_a_real_pty() {
    let Some(c) = containerd("tty") else { return };
    // `ctr -t` needs a console of its own: `script` gives it one. `timeout` must stay in the
    // terminal's foreground process group (`--foreground`), or ctr is stopped by SIGTTOU when it
    // puts the console in raw mode; `script` runs the line with $SHELL, so pin that too.
    let sock = c.socket().display().to_string();
    let ctr = |args: &str| {
        std::process::Command::new("script")
            .env("SHELL", "/bin/sh")
            .args([
                "-qec",
                &format!(
                    "exec timeout --foreground 60 ctr -a {sock} -n {} {args}",
                    c.ns
                ),
                "/dev/null",
            ])
            .output()
            .unwrap()
    };
    let o = ctr(&format!(
        "run --rm -t --snapshotter native --runtime {MQFQ} {BUSYBOX} t1 sh -c 'tty; stty size; exit 5'"
    ));
    let text = out(&o);
    assert_eq!(o.status.code(), Some(5), "{text}{}", err(&o));
    assert!(text.contains("/dev/pts/"), "{text}");
    run_detached(&c, "t2");
    let o = ctr("task exec -t --exec-id e1 t2 sh -c 'tty; exit 4'");
    assert_eq!(o.status.code(), Some(4), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("/dev/pts/"), "{}", out(&o));
    assert!(
        c.ctr(&["task", "kill", "-s", "SIGKILL", "t2"])
            .status
            .success()
    );
    assert!(c.wait_status("t2", "STOPPED"));
    assert!(c.ctr(&["task", "delete", "t2"]).status.success());
    assert!(c.ctr(&["containers", "rm", "t2"]).status.success());
    assert_clean(&c);
}

#[test]
fn oom_kills_publish_task_oom() {
    let Some(c) = containerd("oom") else { return };
    let mut events = mqfq_testkit::ctr_command()
        .arg("-a")
        .arg(c.socket())
        .args(["-n", &c.ns, "events"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        let stdout = events.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let mut s = seen.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        })
    };
    let text = || seen.lock().unwrap().clone();
    // The subscription is live once a probe container's exit shows in it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut probes = 0;
    while !text().contains("/tasks/exit") {
        assert!(
            std::time::Instant::now() < deadline,
            "ctr events saw nothing"
        );
        let o = c.run(MQFQ, &format!("probe{probes}"), &[], &["true"]);
        assert!(o.status.success(), "{}", err(&o));
        probes += 1;
    }
    let before = text().len();
    // A 200 MiB buffer in a 32 MiB cgroup.
    let o = c.run(
        MQFQ,
        "o1",
        &["--memory-limit", "33554432"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
    );
    assert_eq!(o.status.code(), Some(137), "{}", err(&o));
    // Its events, in order: the OOM, then the exit (waited for, not slept on).
    let ours = || text()[before..].to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(ours().contains("/tasks/oom") && ours().contains("/tasks/exit")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no OOM and exit events in:\n{}",
            ours()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = events.kill();
    let _ = events.wait();
    let _ = reader.join();
    let text = ours();
    let oom = text.find("/tasks/oom").unwrap();
    let exit = text.find("/tasks/exit").unwrap();
    assert!(oom < exit, "OOM after exit:\n{text}");
    assert_clean(&c);
}

#[test]
fn runtime_config_file_is_honoured_and_checked() {
    let Some(c) = containerd("opts") else { return };
    let good = c.dir().join("good.toml");
    std::fs::write(&good, "binary_name = \"runc\"\n").unwrap();
    let good = good.display().to_string();
    let o = c.run(
        MQFQ,
        "o1",
        &["--runtime-config-path", &good],
        &["echo", "configured"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "configured\n");
    // A runc that does not exist: Create fails with runc's complaint, and leaves nothing.
    let missing = c.dir().join("missing.toml");
    std::fs::write(&missing, "binary_name = \"/nonexistent/runc\"\n").unwrap();
    let missing = missing.display().to_string();
    let o = c.run(MQFQ, "o2", &["--runtime-config-path", &missing], &["true"]);
    assert!(!o.status.success());
    let _ = c.ctr(&["containers", "rm", "o2"]);
    // A misspelt key is an error naming it.
    let typo = c.dir().join("typo.toml");
    std::fs::write(&typo, "binary_nmae = \"runc\"\n").unwrap();
    let typo = typo.display().to_string();
    let o = c.run(MQFQ, "o3", &["--runtime-config-path", &typo], &["true"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("binary_nmae"), "{}", err(&o));
    let _ = c.ctr(&["containers", "rm", "o3"]);
    assert_clean(&c);
}

#[test]
fn version_flag() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"))
        .arg("-v")
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = out(&o);
    assert!(s.contains("mqfq-shim") && s.contains("revision"), "{s}");
}

/// The containerd these tests run on is the line selected: with `MQFQ_CONTAINERD_DIR`, the
/// line `MQFQ_CONTAINERD_LINE` names (scripts/test.sh sets both); without, the system's, as its
/// Debian package says. Its server's version is asked over its socket, not read from a binary
/// on `PATH` (which is how the kit found `c.version`, so comparing the two proves nothing).
#[test]
fn the_containerd_under_test_is_the_selected_one() {
    let Some(c) = containerd("version") else {
        return;
    };
    let want = if std::env::var_os("MQFQ_CONTAINERD_DIR").is_some_and(|d| !d.is_empty()) {
        std::env::var("MQFQ_CONTAINERD_LINE")
            .expect("MQFQ_CONTAINERD_DIR is set without MQFQ_CONTAINERD_LINE, the line it holds")
    } else {
        let o = std::process::Command::new("dpkg-query")
            .args(["-W", "-f=${Version}", "containerd"])
            .output()
            .expect("dpkg-query");
        assert!(
            o.status.success(),
            "the system's containerd is not Debian's package"
        );
        let v = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut parts = v.split('.');
        format!(
            "{}.{}",
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default()
        )
    };
    let o = c.ctr(&["version"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let server = text.split("Server:").nth(1).unwrap_or_default();
    assert!(
        server.contains(&format!("Version:  {want}.")),
        "{text} (expected the {want} line)"
    );
    eprintln!("containerd {want} under test");
}
