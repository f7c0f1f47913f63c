//! The pool end to end: real containerd + runc + the shim + `mqfqd`, containers running a CUDA
//! client (against the CPU-only libcuda double) under the injected interposer. Idle (paused)
//! containers are evicted when mqfqd's hot TTL expires, restored at Resume before they run, and
//! a paused one is prefetched when its function's flow turns Active — all driven by mqfqd.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

#[path = "pool/faults.rs"]
mod faults;
#[path = "pool/ipc.rs"]
mod ipc;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use mqfq_testkit::{CheckpointDouble, Containerd, MQFQ, Mqfqd};
use serde_json::Value;

/// What the client allocates: 1 + 2 + 4 MiB and a 1024-byte pitch × 10 rows.
const MANAGED: u64 = (1 + 2 + 4) * 1024 * 1024 + 1024 * 10;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn interposer() -> PathBuf {
    mqfq_testkit::built_interposer()
}

fn run_client(c: &Containerd, id: &str, cuda: &Path) {
    let o = c.run_cuda_client(MQFQ, id, "pf", cuda);
    assert!(o.status.success(), "{}", text(&o));
}

fn driver_log(cuda: &Path, id: &str) -> Vec<String> {
    std::fs::read_to_string(cuda.join(format!("{id}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn wait_log(cuda: &Path, id: &str, what: &str, pred: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pred(&driver_log(cuda, id)) {
        assert!(
            Instant::now() < deadline,
            "{id}: never {what}: {:?}",
            driver_log(cuda, id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn count(log: &[String], prefix: &str) -> usize {
    log.iter().filter(|l| l.starts_with(prefix)).count()
}

fn entry<'a>(s: &'a Value, id: &str) -> Option<&'a Value> {
    s["pool"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == id)
}

fn tier_is(s: &Value, id: &str, tier: &str) -> bool {
    mqfq_testkit::pool_tiers(s)
        .get(id)
        .is_some_and(|t| t == tier)
}

/// Once evicted, a process launches nothing until its memory is prefetched back.
fn no_launch_while_evicted(log: &[String]) {
    let mut evicted = false;
    for l in log {
        if l.starts_with("prefetch host") {
            evicted = true;
        } else if l.starts_with("prefetch device") {
            evicted = false;
        } else if l == "launch" {
            assert!(!evicted, "a launch while evicted: {log:?}");
        }
    }
}

/// A containerd whose shims find the interposer, the doubles built, and an mqfqd whose pool
/// evicts after 1 s of idleness (a function's flow turns inactive 0.3 s after its last use);
/// also the daemon's metrics port. The shims gate Start and Resume (`MQFQ_BURST=off`, the
/// OpenWhisk-with-pauses setup); `shim/runtime/tests/bursts.rs` has the pool under burst admission.
fn setup(name: &str) -> Option<(Containerd, Mqfqd, PathBuf, String)> {
    setup_with(name, "")
}

/// [`setup`] with more of mqfqd's `[pool]` section.
fn setup_with(name: &str, pool: &str) -> Option<(Containerd, Mqfqd, PathBuf, String)> {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let c = Containerd::start_with_env(
        &format!("it-{}-{name}", std::process::id()),
        shim.parent().unwrap(),
        &[("MQFQ_BURST", "off")],
    )?;
    let cuda = c.install_cuda(&interposer()).unwrap();
    let metrics = mqfq_testkit::free_metrics_addr();
    let d = Mqfqd::start(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        c.dir(),
        &c.daemon_socket(),
        &format!(
            "metrics_addr = \"{metrics}\"\nrestart_grace_ms = 0\n\
             [queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\n{pool}"
        ),
    );
    Some((c, d, cuda, metrics))
}

/// Resumes an evicted container: Resume returns once its memory is back (all four ranges
/// prefetched, no launch before that), it launches again, and the pool has it Hot and busy.
fn resume_restored(c: &Containerd, d: &Mqfqd, cuda: &Path, id: &str) {
    let launches = count(&driver_log(cuda, id), "launch");
    let o = c.ctr(&["task", "resume", id]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(c.wait_status(id, "RUNNING"));
    wait_log(cuda, id, "launched after the restore", |l| {
        count(l, "launch") > launches
    });
    let log = driver_log(cuda, id);
    assert_eq!(count(&log, "prefetch device"), 4, "{log:?}");
    no_launch_while_evicted(&log);
    d.wait_for("restored and running", |s| {
        entry(s, id).is_some_and(|e| e["tier"] == "hot" && e["busy"] == true)
    });
}

#[test]
fn idle_containers_are_evicted_restored_at_resume_and_prefetched_on_activation() {
    let Some((c, d, cuda, port)) = setup("pool") else {
        return;
    };

    for id in ["a", "b"] {
        run_client(&c, id, &cuda);
    }
    for id in ["a", "b"] {
        wait_log(&cuda, id, "launched", |l| count(l, "launch") >= 3);
        let log = driver_log(&cuda, id);
        assert_eq!(count(&log, "alloc managed"), 4, "converted: {log:?}");
        assert_eq!(count(&log, "alloc native"), 0, "{log:?}");
    }
    d.wait_for("both pooled and running", |s| {
        ["a", "b"]
            .iter()
            .all(|id| entry(s, id).is_some_and(|e| e["busy"] == true && e["tier"] == "hot"))
    });

    // Pause: the lease goes back with the bytes; after 1 s idle mqfqd has them evicted.
    for id in ["a", "b"] {
        assert!(c.ctr(&["task", "pause", id]).status.success());
    }
    let s = d.wait_for("both evicted", |s| {
        tier_is(s, "a", "warm") && tier_is(s, "b", "warm")
    });
    for id in ["a", "b"] {
        let e = entry(&s, id).unwrap();
        assert_eq!(e["bytes"], MANAGED, "{e}");
        assert_eq!(e["warm"], "uvm", "{e}");
        assert_eq!(e["busy"], false);
        assert!(c.wait_status(id, "PAUSED"), "still paused for containerd");
        let log = driver_log(&cuda, id);
        assert_eq!(count(&log, "prefetch host"), 4, "{log:?}");
        assert_eq!(count(&log, "prefetch device"), 0, "{log:?}");
    }

    // Resume a: admitted, thawed, its memory back before it launches again. Its flow turning
    // Active has mqfqd prefetch b too, which stays paused.
    resume_restored(&c, &d, &cuda, "a");
    wait_log(&cuda, "b", "prefetched while paused", |l| {
        count(l, "prefetch device") == 4
    });
    assert!(c.wait_status("b", "PAUSED"));
    no_launch_while_evicted(&driver_log(&cuda, "b"));
    // The driver's log shows the prefetch before the shim's report of it reaches mqfqd: the
    // metrics are read once mqfqd has it (b is Hot again).
    d.wait_for("b's prefetch reported", |s| tier_is(s, "b", "hot"));

    let m = mqfq_testkit::scrape(&port);
    assert_eq!(
        mqfq_testkit::metric(&m, "mqfq_pool_hits_total{tier=\"cold\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        mqfq_testkit::metric(&m, "mqfq_pool_hits_total{tier=\"warm\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        mqfq_testkit::metric(&m, "mqfq_pool_restore_seconds_count"),
        1.0,
        "{m}"
    );
    assert!(
        mqfq_testkit::metric(
            &m,
            "mqfq_pool_moves_total{action=\"prefetch\",result=\"ok\"}"
        ) >= 1.0,
        "{m}"
    );
    #[expect(clippy::cast_precision_loss, reason = "MANAGED is a few MiB: exact")]
    let both = 2.0 * MANAGED as f64;
    assert!(
        mqfq_testkit::metric(&m, "mqfq_pool_moved_bytes_total{direction=\"to_host\"}") >= both,
        "{m}"
    );
    assert!(
        mqfq_testkit::metric(&m, "mqfq_pool_moved_bytes_total{direction=\"to_device\"}") >= both,
        "{m}"
    );

    // Gone containers leave the pool; nothing is left behind.
    for id in ["a", "b"] {
        c.remove(id);
    }
    assert!(!c.dir().join("ctl").join(&c.ns).join("a").exists());
    nothing_left(&c, &d);
}

#[test]
fn a_restarted_daemon_relearns_paused_containers_from_their_shims() {
    let Some((c, mut d, cuda, _)) = setup("pool-restart") else {
        return;
    };
    run_client(&c, "r", &cuda);
    wait_log(&cuda, "r", "launched", |l| count(l, "launch") >= 3);
    assert!(c.ctr(&["task", "pause", "r"]).status.success());
    d.wait_for("paused, idle", |s| {
        entry(s, "r").is_some_and(|e| e["busy"] == false)
    });
    // A new daemon knows nothing; the shim re-registers the paused container (with its bytes)
    // and the new daemon's pool evicts it when its hot TTL runs out.
    d.kill9();
    d.spawn();
    let s = d.wait_for("re-learned and evicted", |s| tier_is(s, "r", "warm"));
    assert_eq!(entry(&s, "r").unwrap()["bytes"], MANAGED);
    assert!(c.wait_status("r", "PAUSED"));
    let log = driver_log(&cuda, "r");
    assert_eq!(count(&log, "prefetch host"), 4, "{log:?}");
    // Resume restores it as usual.
    resume_restored(&c, &d, &cuda, "r");
    c.remove("r");
    d.wait_for("the pool empty", |s| {
        s["pool"].as_array().is_none_or(Vec::is_empty)
    });
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Issue 13 end to end: what each container keeps native, and why, reaches `mqfqctl status` and
/// the metrics — a communication library's buffer, the function's setting (the annotation), and
/// a refused export — read by the shim at Pause.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "three containers' native memory followed to status and metrics"
)]
fn native_memory_and_its_reasons_reach_mqfqctl_and_the_metrics() {
    const MIB: u64 = 1 << 20;
    let Some((c, d, cuda, port)) = setup("native") else {
        return;
    };
    for double in ["commlib", "ipc_client"] {
        mqfq_testkit::build_double(double, &cuda).unwrap();
    }
    let meet = cuda.join("meet");
    std::fs::create_dir_all(&meet).unwrap();
    let meet = meet.display().to_string();
    let runs: [(&str, &str, &[&str], &[&str]); 3] = [
        ("lib", "fn-lib", &[], &["lib"]),
        (
            "set",
            "fn-set",
            &["--annotation", "io.mqfq.native-alloc=all"],
            &["attrs"],
        ),
        ("exp", "fn-exp", &[], &["export", &meet]),
    ];
    for (id, function, flags, args) in runs {
        let mut all = vec!["-d", "--env", "CLIENT_HOLD=1"];
        all.extend(flags);
        let o = c.run_cuda_program(MQFQ, id, function, &cuda, "ipc_client", &all, args);
        assert!(o.status.success(), "{}", text(&o));
    }
    d.wait_for("all three pooled", |s| {
        ["lib", "set", "exp"]
            .iter()
            .all(|id| entry(s, id).is_some())
    });
    for id in ["lib", "set", "exp"] {
        assert!(c.ctr(&["task", "pause", id]).status.success());
    }
    let reported = |s: &Value, id: &str| entry(s, id).is_some_and(|e| e["busy"] == false);
    let s = d.wait_for("all three paused and reported", |s| {
        ["lib", "set", "exp"].iter().all(|id| reported(s, id))
    });
    let native = |id: &str| entry(&s, id).unwrap()["native"].clone();
    let bytes = |id: &str| entry(&s, id).unwrap()["bytes"].as_u64().unwrap();
    assert_eq!(
        (
            native("lib")["library"].as_u64(),
            native("lib")["total"].as_u64(),
            bytes("lib")
        ),
        (Some(MIB), Some(MIB), 0),
        "{s:#}"
    );
    assert_eq!(
        (native("set")["setting"].as_u64(), bytes("set")),
        (Some(MIB), 0),
        "{s:#}"
    );
    assert_eq!(
        (
            native("exp")["export"].as_u64(),
            native("exp")["refused"].as_u64(),
            bytes("exp")
        ),
        (Some(MIB), Some(1), MIB),
        "the refused buffer stays managed, the next one native: {s:#}"
    );
    let table = d.ctl(&["status"]);
    let line = table
        .lines()
        .find(|l| l.contains("/exp "))
        .unwrap_or_default();
    assert!(line.contains("export (1 exports refused)"), "{table}");
    // The gauges follow within the sampler's period.
    #[expect(clippy::cast_precision_loss, reason = "MIB is 2^20: exact")]
    let mib = MIB as f64;
    let function = |id: &str| {
        entry(&s, id).unwrap()["function"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let want = [
        ("lib", "library", mib),
        ("lib", "managed", 0.0),
        ("set", "setting", mib),
        ("exp", "export", mib),
        ("exp", "managed", mib),
    ]
    .map(|(id, kind, v)| {
        let f = function(id);
        (
            format!("mqfq_pool_function_memory_bytes{{function=\"{f}\",kind=\"{kind}\"}}"),
            v,
        )
    });
    let refused = format!(
        "mqfq_pool_function_exports_refused{{function=\"{}\"}}",
        function("exp")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = mqfq_testkit::scrape(&port);
        let ok = want.iter().all(|(n, v)| mqfq_testkit::metric(&m, n) == *v)
            && mqfq_testkit::metric(&m, &refused) == 1.0;
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "{want:?} {refused}: {m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in ["lib", "set", "exp"] {
        c.remove(id);
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// A function whose container had an export of converted memory refused (its process then
/// exited) gets its next containers created with native allocations — the node learned it
/// (the advice shows as the annotation in the bundle) — while another function's stay managed;
/// one under `io.mqfq.warm=checkpoint` exports on its first try.
#[test]
fn a_function_that_exported_gets_native_allocations_in_its_next_containers() {
    let Some((c, d, cuda, _port)) = setup("learn") else {
        return;
    };
    for double in ["commlib", "ipc_client"] {
        mqfq_testkit::build_double(double, &cuda).unwrap();
    }
    let meet = cuda.join("meet-learn");
    std::fs::create_dir_all(&meet).unwrap();
    let meet = meet.display().to_string();
    let run = |id: &str, function: &str, args: &[&str]| {
        let flags = ["--rm", "--env", "CLIENT_EXIT=1"];
        let o = c.run_cuda_program(MQFQ, id, function, &cuda, "ipc_client", &flags, args);
        let out = text(&o);
        assert!(o.status.success(), "{id}: {out}");
        out
    };
    let first = run("x1", "fn-x", &["export", &meet]);
    assert!(first.contains("export rc=1 kind=2"), "{first}");
    // The shim reports it off its exit path: wait until the daemon has it.
    let learned = "an export of converted GPU memory was refused";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !d.stderr().contains(learned) {
        assert!(Instant::now() < deadline, "never learned: {}", d.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = run("x2", "fn-x", &["alloc"]);
    assert!(
        again.contains("alloc rc=0 kind=1"),
        "advised native: {again}"
    );
    let other = run("y1", "fn-y", &["alloc"]);
    assert!(
        other.contains("alloc rc=0 kind=2"),
        "another function converts: {other}"
    );
    assert!(
        d.stderr()
            .contains("new containers of this function keep their allocations native"),
        "{}",
        d.stderr()
    );
    // Under the checkpoint backend nothing is converted: a new function's first export works.
    let flags = [
        "--rm",
        "--env",
        "CLIENT_EXIT=1",
        "--annotation",
        "io.mqfq.warm=checkpoint",
    ];
    let o = c.run_cuda_program(MQFQ, "z1", "fn-z", &cuda, "ipc_client", &flags, &["dmabuf"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("dmabuf rc=0 kind=1"),
        "exported native memory: {out}"
    );
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// The pool and the leases empty, and nothing of the containers left.
fn nothing_left(c: &Containerd, d: &Mqfqd) {
    d.wait_for("the pool empty", |s| {
        s["pool"].as_array().is_none_or(Vec::is_empty)
            && s["leases"].as_array().is_none_or(Vec::is_empty)
    });
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Whether process `pid`'s cgroup is frozen (cgroup v1's freezer, or v2's `cgroup.freeze`).
fn frozen(pid: u32) -> bool {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    cgroups.lines().any(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "freezer") {
            let state = format!("/sys/fs/cgroup/freezer{path}/freezer.state");
            std::fs::read_to_string(state).is_ok_and(|s| s.trim() == "FROZEN")
        } else if controllers.is_empty() {
            let freeze = format!("/sys/fs/cgroup{path}/cgroup.freeze");
            std::fs::read_to_string(freeze).is_ok_and(|s| s.trim() == "1")
        } else {
            false
        }
    })
}

/// A containerd whose shims drive the libcuda double's checkpoint API (with `env` beside it) and
/// gate Start and Resume, the doubles built (`ckpt_ctl` too), and an mqfqd with `extra` config
/// whose pool evicts by checkpoint after 1 s of idleness.
fn checkpoint_node(
    name: &str,
    env: &[(&str, &str)],
    extra: &str,
) -> Option<(Containerd, Mqfqd, PathBuf, PathBuf, CheckpointDouble)> {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let ck = CheckpointDouble::new().unwrap();
    let owned = ck.shim_env();
    let mut all: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.push(("MQFQ_BURST", "off"));
    all.extend_from_slice(env);
    let c = Containerd::start_with_env(
        &format!("it-{}-{name}", std::process::id()),
        shim.parent().unwrap(),
        &all,
    )?;
    let cuda = c.install_cuda(&interposer()).unwrap();
    let ctl = mqfq_testkit::build_double("ckpt_ctl", &cuda).unwrap();
    let d = Mqfqd::start(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        c.dir(),
        &c.daemon_socket(),
        &format!(
            "{extra}restart_grace_ms = 0\n[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\n\
             warm = \"checkpoint\"\n"
        ),
    );
    Some((c, d, cuda, ctl, ck))
}

/// `ctr run` flags for a detached CUDA client whose processes publish checkpoint pages.
fn ck_flags(ck: &CheckpointDouble) -> Vec<String> {
    let mut flags = vec!["-d".to_owned()];
    flags.extend(ck.container_flags());
    flags
}

/// `[pool] warm = "checkpoint"`: the container's allocations stay native (nothing converted),
/// its paused processes are suspended whole by the driver's checkpoint API from the shim (the
/// double's page shows its device bytes on the host and the process checkpointed), the pool
/// counts the bytes, and Resume restores and unlocks it before it runs again; one killed while
/// checkpointed leaves nothing behind.
#[test]
fn checkpoint_backend_suspends_a_paused_container_and_resume_restores_it() {
    let metrics = mqfq_testkit::free_metrics_addr();
    let Some((c, d, cuda, ctl, ck)) =
        checkpoint_node("ckpt", &[], &format!("metrics_addr = \"{metrics}\"\n"))
    else {
        return;
    };
    let flags = ck_flags(&ck);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    for id in ["k", "k2"] {
        let o = c.run_cuda_with(MQFQ, id, "ck", &cuda, &flags, &["loop"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    wait_log(&cuda, "k", "launched", |l| count(l, "launch") >= 3);
    let log = driver_log(&cuda, "k");
    assert_eq!(
        count(&log, "alloc managed"),
        0,
        "nothing converted: {log:?}"
    );
    assert_eq!(count(&log, "alloc native"), 4, "{log:?}");
    let pid = c.task_pid("k");
    let (state, device, host_bytes) = ck.state(&ctl, pid);
    assert_eq!((state, host_bytes), (0, 0), "running, all on the device");
    assert!(device > 0);
    d.wait_for("pooled and running", |s| {
        ["k", "k2"]
            .iter()
            .all(|id| entry(s, id).is_some_and(|e| e["busy"] == true && e["tier"] == "hot"))
    });

    // Paused and idle past the hot TTL: suspended by checkpoint, the pool counting its bytes.
    for id in ["k", "k2"] {
        assert!(c.ctr(&["task", "pause", id]).status.success());
    }
    let s = d.wait_for("checkpointed", |s| {
        tier_is(s, "k", "warm") && tier_is(s, "k2", "warm")
    });
    assert_eq!(entry(&s, "k").unwrap()["bytes"], MANAGED);
    assert_eq!(entry(&s, "k").unwrap()["warm"], "checkpoint");
    assert_eq!(
        (&s["warm"], &s["late_binding"]),
        (&"checkpoint".into(), &false.into())
    );
    assert!(c.wait_status("k", "PAUSED"), "still paused for containerd");
    assert_eq!(
        ck.state(&ctl, pid),
        (2, 0, device),
        "checkpointed: its device bytes on the host"
    );
    let launches = count(&driver_log(&cuda, "k"), "launch");
    // Killed while checkpointed (containerd's kill, then a Resume that restores a dying
    // process): nothing hangs, and it leaves no lease and no pool entry.
    let k2 = c.task_pid("k2");
    assert_eq!(ck.state(&ctl, k2).0, 2);
    c.remove("k2");
    d.wait_for("k2 gone from the pool", |s| entry(s, "k2").is_none());

    // Resume: restored and unlocked before it runs; it launches again.
    let o = c.ctr(&["task", "resume", "k"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(ck.state(&ctl, pid), (0, device, 0), "restored at Resume");
    wait_log(&cuda, "k", "launched after the restore", |l| {
        count(l, "launch") > launches
    });
    d.wait_for("restored and running", |s| {
        entry(s, "k").is_some_and(|e| e["tier"] == "hot" && e["busy"] == true)
    });
    // Two suspended; k restored (k2's restore, if its dying process got one, may come after
    // the pool forgot it, and then counts nowhere).
    let m = mqfq_testkit::scrape(&metrics);
    #[expect(clippy::cast_precision_loss, reason = "MANAGED is a few MiB: exact")]
    let managed = MANAGED as f64;
    for (action, n) in [("evict", 2.0), ("restore", 1.0)] {
        let moves = format!(
            "mqfq_pool_backend_moves_total{{backend=\"checkpoint\",action=\"{action}\",result=\"ok\"}}"
        );
        let bytes =
            format!("mqfq_pool_backend_bytes_total{{backend=\"checkpoint\",action=\"{action}\"}}");
        if action == "evict" {
            assert_eq!(mqfq_testkit::metric(&m, &moves), n, "{m}");
            assert_eq!(mqfq_testkit::metric(&m, &bytes), n * managed, "{m}");
        } else {
            assert!(mqfq_testkit::metric(&m, &moves) >= n, "{m}");
            assert!(mqfq_testkit::metric(&m, &bytes) >= n * managed, "{m}");
        }
    }

    c.remove("k");
    nothing_left(&c, &d);
}

/// Under `checkpoint`, a restore that finds no GPU memory (the driver double answers out of
/// memory) within the move timeout fails the Resume: the container stays paused and suspended,
/// and holds no lease. Killed afterwards, its Resume finds the process gone and it ends.
#[test]
fn a_checkpoint_restore_without_memory_fails_the_resume_and_holds_nothing() {
    let Some((c, d, cuda, ctl, ck)) = checkpoint_node(
        "ckpt-oom",
        &[
            ("FAKE_CUDA_CKPT_FAIL", "restore-oom"),
            ("MQFQ_POOL_MOVE_TIMEOUT_MS", "1000"),
        ],
        "",
    ) else {
        return;
    };
    let flags = ck_flags(&ck);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "m", "ck", &cuda, &flags, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_log(&cuda, "m", "launched", |l| count(l, "launch") >= 3);
    assert!(c.ctr(&["task", "pause", "m"]).status.success());
    d.wait_for("checkpointed", |s| tier_is(s, "m", "warm"));
    let pid = c.task_pid("m");
    assert_eq!(ck.state(&ctl, pid).0, 2);

    let o = c.ctr(&["task", "resume", "m"]);
    assert!(!o.status.success(), "the Resume must fail: {}", text(&o));
    assert!(
        text(&o).contains("could not be restored"),
        "says why: {}",
        text(&o)
    );
    assert!(c.wait_status("m", "PAUSED"), "paused for containerd");
    assert!(frozen(pid), "frozen again, not only said to be");
    assert_eq!(ck.state(&ctl, pid).0, 2, "still checkpointed");
    // Its lease went back as one it could not use: the pool still has it, Warm.
    let s = d.wait_for("no lease held", |s| {
        s["leases"].as_array().is_none_or(Vec::is_empty)
    });
    assert!(tier_is(&s, "m", "warm"), "{s}");

    c.remove("m");
    nothing_left(&c, &d);
}

/// A node that allows only `uvm` and `off` (`[pool] warm_allowed`): a pod asking for
/// `checkpoint` fails at Create with an error naming the annotation, and leaves nothing; one
/// asking for `off` runs, its allocations not converted and its container never pooled.
#[test]
fn a_pod_may_choose_only_the_warm_backends_the_node_allows() {
    let Some((c, d, cuda, _)) = setup_with("deny", "warm_allowed = [\"uvm\", \"off\"]\n") else {
        return;
    };
    let flags = ["-d", "--annotation", "io.mqfq.warm=checkpoint"];
    let o = c.run_cuda_with(MQFQ, "no", "fn-no", &cuda, &flags, &["loop"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("io.mqfq.warm=checkpoint: not allowed on this node"),
        "{}",
        text(&o)
    );
    let _ = c.ctr(&["containers", "rm", "no"]);
    let flags = ["-d", "--annotation", "io.mqfq.warm=off"];
    let o = c.run_cuda_with(MQFQ, "off", "fn-off", &cuda, &flags, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_log(&cuda, "off", "launched", |l| count(l, "launch") >= 3);
    let log = driver_log(&cuda, "off");
    assert_eq!(
        count(&log, "alloc managed"),
        0,
        "nothing converted: {log:?}"
    );
    let s = d.status();
    assert!(entry(&s, "off").is_none(), "never pooled: {s}");
    c.remove("off");
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
