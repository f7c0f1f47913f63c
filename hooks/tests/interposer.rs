//! The interposer over the CPU-only libcuda double, with a client that gets `cuMemAlloc` by
//! direct call, by `dlsym(handle)` and by `cuGetProcAddress_v2`: conversion to managed memory,
//! launches held while evicted, the evict / prefetch / status protocol, and bad control input;
//! burst admission against a shim the test plays in `interposer/bursts.rs`.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "interposer/bursts.rs"]
mod bursts;
mod common;

use common::{Client, Ctl, NONE_APART, interposer};

#[test]
fn without_a_control_dir_nothing_is_converted() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut c) = Client::start(dir.path(), &[]) else {
        return;
    };
    let r = c.report();
    assert!(r.iter().all(|l| l.contains("kind=1")), "{r:?}");
    c.send("quit");
    let _ = c.child.wait();
    let err = c.stderr();
    assert_eq!(err.matches("MQFQ_CTL_DIR is not set").count(), 1, "{err}");
}

/// The client as the shim starts it in container `c1`: a control folder under `dir`, its id.
fn in_container_c1(dir: &Path) -> Option<(Client, PathBuf)> {
    let ctl = dir.join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let c = Client::start(
        dir,
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_CONTAINER_ID", Path::new("c1")),
        ],
    )?;
    Some((c, ctl))
}

#[test]
fn allocations_become_managed_and_launches_wait_while_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut c, ctl)) = in_container_c1(dir.path()) else {
        return;
    };
    // Every path to cuMemAlloc is converted: direct, dlsym(handle), cuGetProcAddress_v2, pitch.
    let r = c.report();
    assert_eq!(
        r,
        [
            "direct rc=0 kind=2",
            "dlsym rc=0 kind=2",
            "procaddr rc=0 kind=2",
            "pitch rc=0 kind=2 pitch=1024"
        ]
    );
    let managed = (1 << 20) + (2 << 20) + (4 << 20) + 1024 * 10;
    let mut s = Ctl::connect(&ctl);
    assert!(s.ask("status").starts_with("error say hello"));
    assert_eq!(s.ask("hello c1"), "ok");
    assert_eq!(
        s.ask("status"),
        format!("ok managed={managed} resident={managed} native=0 evicted=0 {NONE_APART}")
    );
    assert_eq!(s.ask("evict"), format!("ok evicted={managed}"));
    c.send("status");
    assert_eq!(c.line(), "locations 2 2 2 2", "all on the host");
    assert_eq!(
        s.ask("status"),
        format!("ok managed={managed} resident=0 native=0 evicted=1 {NONE_APART}")
    );
    // A launch now waits: prefetch only once the client says it is waiting.
    c.send("launch");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.stderr().contains("cuLaunchKernel waits for prefetch") {
        assert!(
            Instant::now() < deadline,
            "launch did not wait: {}",
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.ask("prefetch"), format!("ok prefetched={managed}"));
    assert_eq!(c.line(), "launched rc=0");
    c.send("status");
    assert_eq!(c.line(), "locations 1 1 1 1", "back on the device");
    // The driver saw: host preference and prefetch, then device, and only then the launch.
    let log = std::fs::read_to_string(dir.path().join("cuda.log")).unwrap();
    let at = |what: &str| {
        log.find(what)
            .unwrap_or_else(|| panic!("{what} not in {log}"))
    };
    assert!(at("advise 3 2") < at("prefetch host"));
    assert!(at("prefetch host") < at("advise 4 1"));
    assert!(at("prefetch device") < at("launch"), "{log}");

    // Bad input is answered, logged, and changes nothing.
    assert!(
        s.ask("evict now please").starts_with("ok"),
        "extra words are ignored"
    );
    assert!(s.ask("prefetch").starts_with("ok"));
    assert_eq!(s.ask("reboot"), "error unknown command \"reboot\"");
    assert_eq!(s.ask(""), "error empty message");
    let mut other = Ctl::connect(&ctl);
    assert_eq!(other.ask("hello c2"), "error wrong container c2");
    let mut long = Ctl::connect(&ctl);
    // One write (the interposer answers and closes after 257 bytes: a second write, such as a
    // separate newline, could meet a closed socket).
    long.0
        .get_mut()
        .write_all(format!("{}\n", "x".repeat(1000)).as_bytes())
        .unwrap();
    let mut reply = String::new();
    long.0.read_line(&mut reply).unwrap();
    assert!(reply.contains("overlong"), "{reply}");
    let mut truncated = UnixStream::connect(
        std::fs::read_dir(&ctl)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    truncated.write_all(b"hello c1\nsta").unwrap();
    drop(truncated);
    assert_eq!(
        s.ask("status"),
        format!("ok managed={managed} resident={managed} native=0 evicted=0 {NONE_APART}")
    );
    c.send("launch");
    assert_eq!(c.line(), "launched rc=0", "the application is unharmed");
    assert!(c.stderr().contains("wrong container c2"), "{}", c.stderr());
}

/// The client in container `c1` whose synchronous copies take `copy_ms` in the driver.
fn slow_copies(dir: &Path, copy_ms: &str) -> Option<(Client, PathBuf)> {
    let ctl = dir.join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let mut c = Client::start(
        dir,
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_CONTAINER_ID", Path::new("c1")),
            ("FAKE_CUDA_COPY_MS", Path::new(copy_ms)),
        ],
    )?;
    assert_eq!(c.report().len(), 4);
    Some((c, ctl))
}

/// Starts a copy on a thread of the client's and returns once the driver is in it.
fn copy_in_driver(c: &mut Client, log: &Path) {
    c.send("copy-bg");
    assert_eq!(c.line(), "started");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("copy begins")
    {
        assert!(Instant::now() < deadline, "the copy never began");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A call already past its residency check when an evict comes (a thread frozen by a Pause
/// just before the driver, thawed for the move) is let finish before any memory moves: it
/// would otherwise run on evicted memory and pull it back to the device.
#[test]
fn an_evict_waits_for_the_calls_under_way() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut c, ctl)) = slow_copies(dir.path(), "400") else {
        return;
    };
    let log = dir.path().join("cuda.log");
    copy_in_driver(&mut c, &log);
    let mut s = Ctl::connect(&ctl);
    assert_eq!(s.ask("hello c1"), "ok");
    assert!(s.ask("evict").starts_with("ok evicted="));
    let log = std::fs::read_to_string(&log).unwrap();
    let at = |what: &str| {
        log.find(what)
            .unwrap_or_else(|| panic!("{what} not in {log}"))
    };
    assert!(at("copy ends") < at("prefetch host"), "{log}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.stderr().contains("copy-bg rc=0") {
        assert!(Instant::now() < deadline, "{}", c.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(s.ask("status").contains("evicted=1"));
}

/// A call that does not return within the evict's drain time (one second) makes the evict
/// answer `busy`, with nothing moved and launches let through.
#[test]
fn an_evict_behind_a_call_that_does_not_return_fails_and_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut c, ctl)) = slow_copies(dir.path(), "3000") else {
        return;
    };
    let log = dir.path().join("cuda.log");
    copy_in_driver(&mut c, &log);
    let mut s = Ctl::connect(&ctl);
    assert_eq!(s.ask("hello c1"), "ok");
    assert_eq!(
        s.ask("evict"),
        "error evict: busy: 1 GPU call(s) still under way after 1s"
    );
    assert!(s.ask("status").contains("evicted=0"));
    c.send("launch");
    assert_eq!(c.line(), "launched rc=0");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("prefetch host"), "{text}");
}

#[test]
fn a_forked_child_converts_and_answers_on_its_own_socket() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let done = dir.path().join("done");
    let Some(mut c) = Client::start(
        dir.path(),
        &[("MQFQ_CTL_DIR", &ctl), ("CLIENT_CHILD_DONE", &done)],
    ) else {
        return;
    };
    c.report();
    let parent = c.child.id();
    c.send("fork");
    let line = c.line();
    let child: u32 = line
        .strip_prefix("child rc=0 kind=2 pid=")
        .unwrap_or_else(|| panic!("{line}"))
        .parse()
        .unwrap();
    assert_ne!(child, parent);
    // The child registers its own socket and knows only its own allocation.
    let sock = ctl.join(format!("cuda-{child}.sock"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "no socket for the child");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut s = Ctl(BufReader::new(UnixStream::connect(&sock).unwrap()));
    assert_eq!(
        s.ask("hello any"),
        "ok",
        "no MQFQ_CONTAINER_ID: any id is accepted"
    );
    assert_eq!(
        s.ask("status"),
        format!(
            "ok managed={} resident={} native=0 evicted=0 {NONE_APART}",
            1 << 20,
            1 << 20
        )
    );
    std::fs::write(&done, "").unwrap();
    assert_eq!(c.line(), "forked");
    // The parent still answers for its own memory.
    let mut p = Ctl(BufReader::new(
        UnixStream::connect(ctl.join(format!("cuda-{parent}.sock"))).unwrap(),
    ));
    assert_eq!(p.ask("hello any"), "ok");
    assert!(p.ask("status").starts_with("ok managed=7350272 "));
}

/// Waits until the client's stderr says `call` is held.
fn wait_held(c: &Client, call: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let what = format!("{call} waits for prefetch");
    while !c.stderr().contains(&what) {
        assert!(
            Instant::now() < deadline,
            "{call} did not wait: {}",
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn native_allocations_are_counted_apart_and_ex_launches_async_copies_and_threads_wait() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut c, ctl)) = in_container_c1(dir.path()) else {
        return;
    };
    c.report();
    let managed = (1 << 20) + (2 << 20) + (4 << 20) + 1024 * 10;
    let mut s = Ctl::connect(&ctl);
    assert_eq!(s.ask("hello c1"), "ok");
    // VMM, stream-ordered (through cuGetProcAddress_v2) and array allocations stay native and
    // are reported apart; managed memory is unchanged.
    c.send("others");
    assert_eq!(c.line(), "others rc=0");
    let array = 256 * 256 * 4;
    assert_eq!(
        s.ask("status"),
        format!(
            "ok managed={managed} resident={managed} native=0 evicted=0 vmm={} async={} array={array} \
             setting=0 library=0 export=0 refused=0 shared=0 sharing=0",
            2 << 20,
            3 << 20
        )
    );
    let log = std::fs::read_to_string(dir.path().join("cuda.log")).unwrap();
    assert!(
        log.contains("alloc native 3145728"),
        "stream-ordered stays native: {log}"
    );
    // While evicted, cuLaunchKernelEx (via cuGetProcAddress_v2) and an async copy wait.
    assert_eq!(s.ask("evict"), format!("ok evicted={managed}"));
    c.send("launchex");
    wait_held(&c, "cuLaunchKernelEx");
    assert_eq!(s.ask("prefetch"), format!("ok prefetched={managed}"));
    assert_eq!(c.line(), "launchedex rc=0");
    assert_eq!(s.ask("evict"), format!("ok evicted={managed}"));
    c.send("copyasync");
    wait_held(&c, "cuMemcpyHtoDAsync");
    assert_eq!(s.ask("prefetch"), format!("ok prefetched={managed}"));
    assert_eq!(c.line(), "copied rc=0");
    let log = std::fs::read_to_string(dir.path().join("cuda.log")).unwrap();
    let last_prefetch = log.rfind("prefetch device").unwrap();
    assert!(
        log.rfind("copy-htod-async").unwrap() > last_prefetch,
        "{log}"
    );
    assert!(log.find("launch-ex").unwrap() < last_prefetch, "{log}");
    // Several threads of one process: each launch waits, all go on after one prefetch.
    assert_eq!(s.ask("evict"), format!("ok evicted={managed}"));
    c.send("threads");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .stderr()
        .matches("cuLaunchKernel waits for prefetch")
        .count()
        < 4
    {
        assert!(
            Instant::now() < deadline,
            "not all four waited: {}",
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.ask("prefetch"), format!("ok prefetched={managed}"));
    assert_eq!(c.line(), "threads rc=0");
    // Freed: the counts go back to zero.
    c.send("free-others");
    assert_eq!(c.line(), "freed rc=0");
    assert_eq!(
        s.ask("status"),
        format!("ok managed={managed} resident={managed} native=0 evicted=0 {NONE_APART}")
    );
}

/// The GPU check's program (`tests/gpu/uvmbench.c`) runs here over the double, whose `inc`
/// kernel really runs on the host: evict and prefetch through its own control socket keep every
/// value, as on a GPU.
#[test]
fn the_gpu_check_program_keeps_its_results_across_evict_and_prefetch() {
    let dir = tempfile::tempdir().unwrap();
    let built = mqfq_testkit::build_double("cuda", dir.path());
    if let Err(e) = built {
        assert!(std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_none(), "{e}");
        return;
    }
    let bench = common::gpu_program(dir.path(), "uvmbench");
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let out = common::run_gpu_program(
        &bench,
        dir.path(),
        &["uvm", "8"],
        &[
            ("LD_PRELOAD", &interposer()),
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_CONTAINER_ID", Path::new("bench")),
        ],
    );
    assert!(out.contains("results_wrong 0 of 2097152"), "{out}");
    assert_eq!(out.matches("reply ok evicted=8388608").count(), 3, "{out}");
    assert_eq!(
        out.matches("reply ok prefetched=8388608").count(),
        3,
        "{out}"
    );
    let log = std::fs::read_to_string(dir.path().join("cuda.log")).unwrap_or_default();
    assert!(log.is_empty() || log.contains("prefetch host"), "{log}");
}

/// The GPU check's oversubscription modes over the double (no interposer): `oversub` touches
/// all of its managed memory every pass, timed, and checks every value; `hold` holds native
/// memory and says so.
#[test]
fn the_gpu_check_program_s_oversubscription_modes_run_over_the_double() {
    let dir = tempfile::tempdir().unwrap();
    if common::built(dir.path(), &["cuda"]).is_none() {
        return;
    }
    let bench = common::gpu_program(dir.path(), "uvmbench");
    let run = |args: &[&str]| common::run_gpu_program(&bench, dir.path(), args, &[]);
    let out = run(&["oversub", "4", "3"]);
    assert_eq!(out.matches("pass_ms ").count(), 3, "{out}");
    assert_eq!(out.matches("fault_GBps ").count(), 1, "{out}");
    assert!(out.contains("results_wrong 0 of 1048576"), "{out}");
    assert_eq!(run(&["hold", "2", "0"]), "holding 2 MiB\n");
}

#[test]
fn an_evicted_process_nobody_prefetches_goes_on_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let Some(mut c) = Client::start(
        dir.path(),
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_EVICT_WAIT_MS", Path::new("300")),
        ],
    ) else {
        return;
    };
    c.report();
    let mut s = Ctl::connect(&ctl);
    assert_eq!(s.ask("hello any"), "ok");
    assert!(s.ask("evict").starts_with("ok evicted="));
    // Nobody prefetches (the shim gave up, or the container was resumed outside it): the
    // launch waits its bounded time, then the process brings its memory back itself.
    c.send("launch");
    let line = c.line_within(Duration::from_secs(20));
    assert_eq!(line.as_deref(), Some("launched rc=0"), "{}", c.stderr());
    assert!(c.stderr().contains("prefetching itself"), "{}", c.stderr());
    let log = std::fs::read_to_string(dir.path().join("cuda.log")).unwrap();
    let launch = log.rfind("launch").unwrap();
    assert!(log.rfind("prefetch device").unwrap() < launch, "{log}");
    assert!(s.ask("status").contains("evicted=0"));
}

#[test]
fn a_broken_stderr_never_takes_the_application_down() {
    let dir = tempfile::tempdir().unwrap();
    let built = mqfq_testkit::build_double("cuda", dir.path())
        .and_then(|_| mqfq_testkit::build_double("cuda_client", dir.path()));
    let client = match built {
        Ok(c) => c,
        Err(e) if std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    // No control folder: the interposer logs at the first allocation — into a pipe nobody
    // reads any more, in a process that ignores SIGPIPE (as Python does): EPIPE.
    let mut child = Command::new(client)
        .env("LD_PRELOAD", interposer())
        .env("FAKE_CUDA_LOG", dir.path().join("cuda.log"))
        .env("CLIENT_IGNORE_SIGPIPE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {out}");
    assert!(
        out.contains("direct rc=0") && out.contains("ready"),
        "{out}"
    );
}

/// The GPU check's concurrency step (`tests/gpu/concbench.c`) over the doubles: worker processes
/// and streams run their bursts (the libcuda double sleeps a `spin` kernel's time), and the
/// sampler reads NVML busy-time and GPM SM activity (the NVML double's files) into the line
/// `tests/gpu/run.sh` turns into the table `mqfq-sim controllers` replays.
#[test]
fn the_gpu_checks_concurrency_program_reads_the_doubles() {
    let dir = tempfile::tempdir().unwrap();
    for double in ["cuda", "nvml"] {
        if let Err(e) = mqfq_testkit::build_double(double, dir.path()) {
            assert!(std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_none(), "{e}");
            return;
        }
    }
    let bench = common::gpu_program(dir.path(), "concbench");
    let (util, sm) = (dir.path().join("util"), dir.path().join("sm"));
    std::fs::write(&util, "100\n").unwrap();
    std::fs::write(&sm, "30\n").unwrap();
    for mode in ["procs", "streams"] {
        let o = Command::new(&bench)
            .args([mode, "2", "1", "4", "2000", "2000"])
            .env("LD_LIBRARY_PATH", dir.path())
            .env("FAKE_NVML_GPUS", "1")
            .env("FAKE_NVML_UTIL", &util)
            .env("FAKE_NVML_GPM", "1")
            .env("FAKE_NVML_SM", &sm)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{mode}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let line = out.lines().next().unwrap_or_default();
        assert!(
            line.starts_with(&format!(
                "conc mode={mode} n=2 busy=1.000 sm=0.300 dram=0.000 "
            )),
            "{line}"
        );
        let field = |k: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        // Two workers of 2 ms bursts and 2 ms gaps for the 0.5 s after the warm-up.
        assert!(field("bursts_per_s") > 0.0, "{line}");
        assert!(field("burst_ms") >= 2.0, "{line}");
    }
}
