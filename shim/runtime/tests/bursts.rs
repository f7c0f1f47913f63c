//! Burst leases end to end (issue 12): real containerd + runc + the shim + `mqfqd`, with
//! long-running GPU servers (the CUDA client's `serve` mode over the CPU-only libcuda double,
//! whose kernels take real time on a per-process timeline) under the injected interposer.
//! Their containers start at once; their GPU work is what waits for the queue.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;
use common::until;
#[path = "bursts/fairness.rs"]
mod fairness;
#[path = "bursts/pause.rs"]
mod pause;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use mqfq_testkit::{Containerd, MQFQ, Mqfqd};
use serde_json::Value;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A containerd whose shims find the interposer (shim settings `env`), the doubles built,
/// and an mqfqd with `extra` config.
fn setup(name: &str, env: &[(&str, &str)], extra: &str) -> Option<(Containerd, Mqfqd, PathBuf)> {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let c = Containerd::start_with_env(
        &format!("it-{}-{name}", std::process::id()),
        shim.parent().unwrap(),
        env,
    )?;
    let (cuda, d) = c.cuda_test_node(extra);
    Some((c, d, cuda))
}

/// A GPU server: `kernels` kernels of `ms` each per request, `gap_ms` between requests.
fn server(c: &Containerd, cuda: &Path, id: &str, ms: u32, kernels: u32, gap_ms: u32) {
    let kernel = format!("FAKE_CUDA_KERNEL_MS={ms}");
    let (k, g) = (kernels.to_string(), gap_ms.to_string());
    let o = c.run_cuda(MQFQ, id, id, cuda, &[&kernel], &["serve", &k, &g]);
    assert!(o.status.success(), "{id}: {}", text(&o));
}

fn kernels(cuda: &Path, id: &str) -> Vec<(i64, i64)> {
    mqfq_testkit::kernel_intervals(cuda, id)
}

fn leases(s: &Value) -> Vec<Value> {
    s["leases"].as_array().cloned().unwrap_or_default()
}

fn stop(c: &Containerd, id: &str) {
    let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    assert!(c.wait_status(id, "STOPPED"), "{id} did not stop");
    assert!(c.ctr(&["task", "delete", id]).status.success());
    assert!(c.ctr(&["containers", "rm", id]).status.success());
}

/// Five long-running GPU servers on a GPU that runs two at a time: all five start (nothing
/// gates a burst-mode container's start), every one serves, and their kernels never run more
/// than two containers at once. The queue saw bursts, never starts.
#[test]
fn five_gpu_servers_start_at_once_and_their_kernels_respect_the_limit() {
    let Some((c, d, cuda)) = setup(
        "five",
        &[],
        "[concurrency]\nd_max = 2\nd_initial = 2\n[queue]\nshort_charge_s = 0\n",
    ) else {
        return;
    };
    let ids = ["s1", "s2", "s3", "s4", "s5"];
    for id in ids {
        server(&c, &cuda, id, 20, 2, 10);
    }
    for id in ids {
        assert!(c.wait_status(id, "RUNNING"), "{id} is not running");
    }
    // Every server gets GPU time.
    d.wait_for("every server's kernels ran", |_| {
        ids.iter().all(|id| kernels(&cuda, id).len() >= 6)
    });
    let until = mqfq_testkit::monotonic_us();
    let most = mqfq_testkit::most_at_once(&cuda, &ids, until);
    assert!(
        most <= 2,
        "{most} containers' kernels ran at once on d_max = 2"
    );
    assert!(most >= 1);
    let records = d.records();
    let kinds: Vec<&str> = records
        .iter()
        .filter(|r| r["event"] == "enqueue")
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert!(!kinds.is_empty());
    assert!(kinds.iter().all(|k| *k == "burst"), "{kinds:?}");
    assert!(
        records
            .iter()
            .filter(|r| r["event"] == "dispatch")
            .all(|r| r["limit"].as_u64().unwrap_or(0) <= 2)
    );
    for id in ids {
        stop(&c, id);
    }
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// An idle server holds no lease: after a few requests it waits a long time, and mqfqctl shows
/// its lease gone while the container runs on; its next request asks again. A process killed
/// mid-burst leaves no lease behind.
#[test]
fn an_idle_server_holds_no_lease_and_a_killed_one_leaves_none() {
    let Some((c, d, cuda)) = setup("idle", &[], "") else {
        return;
    };
    // Requests of 3 × 30 ms every 2 s.
    server(&c, &cuda, "idle", 30, 3, 2000);
    d.wait_for("a burst admitted", |_| !kernels(&cuda, "idle").is_empty());
    d.wait_for("the burst's lease released while the server runs", |s| {
        leases(s).is_empty()
            && d.records()
                .iter()
                .any(|r| r["event"] == "release" && r["reason"] == "idle")
    });
    assert!(c.wait_status("idle", "RUNNING"));
    // The service charged is GPU-busy time (three 30 ms kernels), not the 2 s between requests.
    let measured: Vec<f64> = d
        .records()
        .iter()
        .filter(|r| r["event"] == "release" && r["reason"] == "idle")
        .filter_map(|r| r["measured_s"].as_f64())
        .collect();
    assert!(
        measured.iter().all(|m| *m < 1.0),
        "charged more than the burst: {measured:?}"
    );
    // A server that is busy all the time, killed mid-burst.
    server(&c, &cuda, "busy", 50, 4, 0);
    let held = d.wait_for("the busy server holds a burst lease", |s| {
        leases(s)
            .iter()
            .any(|l| l["container_id"] == "busy" && l["kind"] == "burst")
    });
    assert!(!held["leases"].as_array().unwrap().is_empty());
    stop(&c, "busy");
    d.wait_for("its lease released", |s| {
        leases(s).iter().all(|l| l["container_id"] != "busy")
    });
    stop(&c, "idle");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// What a burst measured reaches placement (issue 17): the interposer counts the server's
/// copies to the device, the shim passes them with the release (and the PIDs of the processes,
/// from the kernel), and mqfqd learns the function's bytes per burst.
#[test]
fn a_servers_copies_reach_its_functions_features() {
    let Some((c, d, cuda)) = setup("copies", &[], "[placement]\nenabled = true\n") else {
        return;
    };
    // 64 KiB to the device and one 10 ms kernel per request, a request every 300 ms.
    let o = c.run_cuda(
        MQFQ,
        "copies",
        "copies",
        &cuda,
        &["FAKE_CUDA_KERNEL_MS=10"],
        &["serve", "1", "300", "-1", "65536"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = d.wait_for("the function's copies measured", |s| {
        s["flows"].as_array().is_some_and(|f| {
            f.iter()
                .any(|f| f["transfer_bytes"].as_f64().is_some_and(|b| b >= 65536.0))
        })
    });
    let bytes = s["flows"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f["transfer_bytes"].as_f64())
        .unwrap();
    // One request a burst (the 300 ms gap ends each); two would be the most a slow machine
    // could run together.
    assert!((65536.0..=131_072.0).contains(&bytes), "{s}");
    stop(&c, "copies");
    d.wait_for("no lease left", |s| leases(s).is_empty());
}

/// A process that speaks the burst socket itself and cycles `begin`/`end` as fast as it can (no
/// hold, no idle) is paced (issue 35): the container's next admission reaches mqfqd no sooner
/// than the burst idle time (5 ms) after its last release, so it costs mqfqd at most two calls
/// per idle time, not two per round trip (~0.2 ms before).
#[test]
fn a_process_cycling_bursts_is_paced_to_the_idle_time() {
    let Some((c, d, cuda)) = setup("pace", &[], "") else {
        return;
    };
    mqfq_testkit::build_double("hostile_ctl", &cuda).unwrap();
    let o = c.run_cuda_program(
        MQFQ,
        "cycler",
        "cycler",
        &cuda,
        "hostile_ctl",
        &["-d"],
        &["burst", "0", "0"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let enqueued = |d: &Mqfqd| {
        d.records()
            .iter()
            .filter(|r| r["event"] == "enqueue")
            .count()
    };
    d.wait_for("fifty of its bursts", |_| enqueued(&d) >= 50);
    stop(&c, "cycler");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    // Each admission after a release, how long after it (ms).
    let mut released: Option<u64> = None;
    let mut gaps = Vec::new();
    for r in d.records() {
        let t = r["t_ns"].as_u64().unwrap();
        match r["event"].as_str() {
            Some("release") => released = Some(t),
            Some("enqueue") => {
                if let Some(at) = released.take() {
                    #[expect(clippy::cast_precision_loss, reason = "a gap in ns, shown in ms")]
                    gaps.push((t - at) as f64 / 1e6);
                }
            }
            _ => {}
        }
    }
    assert!(gaps.len() >= 40, "{gaps:?}");
    assert!(
        gaps.iter().all(|&g| g >= 5.0),
        "admissions sooner than 5 ms after a release: {gaps:?}"
    );
    common::replay(&d.records(), d.config());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// The pool follows bursts: an idle server (running, never paused) is evicted once its hot TTL
/// passes, without a freeze, and its next burst runs only after its memory is back.
#[test]
fn an_idle_server_is_evicted_and_its_next_burst_waits_for_its_memory() {
    let Some((c, d, cuda)) = setup(
        "pool",
        &[],
        "[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\n",
    ) else {
        return;
    };
    // A request every 3 s: idle long enough to be evicted between requests.
    server(&c, &cuda, "srv", 20, 2, 3000);
    let log = || {
        std::fs::read_to_string(cuda.join("srv.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    d.wait_for("evicted while idle, then a burst restored", |_| {
        let l = log();
        let evicted = l.iter().position(|x| x.starts_with("prefetch host"));
        evicted.is_some_and(|e| l[e..].iter().any(|x| x.starts_with("prefetch device")))
            && l.iter().filter(|x| x.starts_with("kernel ")).count() >= 4
    });
    assert!(c.wait_status("srv", "RUNNING"), "never paused");
    // Once evicted, no launch until the memory is back.
    let mut evicted = false;
    for x in log() {
        if x.starts_with("prefetch host") {
            evicted = true;
        } else if x.starts_with("prefetch device") {
            evicted = false;
        } else if x == "launch" {
            assert!(!evicted, "a launch while evicted: {:?}", log());
        }
    }
    assert!(c.log().contains("restored"), "{}", c.log());
    stop(&c, "srv");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Under `[pool] warm = "checkpoint"` a server that is never paused is suspended whole by the
/// driver's checkpoint API while idle between requests (its allocations were never converted),
/// and its next request's burst has it restored and unlocked before its kernels run.
#[test]
fn an_idle_server_is_checkpointed_and_its_next_burst_restores_it() {
    let ck = mqfq_testkit::CheckpointDouble::new().unwrap();
    let env = ck.shim_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let Some((c, d, cuda)) = setup(
        "ckpt",
        &env,
        "[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\nwarm = \"checkpoint\"\n",
    ) else {
        return;
    };
    let ctl = mqfq_testkit::build_double("ckpt_ctl", &cuda).unwrap();
    let mut flags = vec![
        "-d".to_owned(),
        "--env".into(),
        "FAKE_CUDA_KERNEL_MS=20".into(),
    ];
    flags.extend(ck.container_flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // A request every 3 s: idle long enough to be suspended between requests.
    let o = c.run_cuda_with(MQFQ, "srv", "srv", &cuda, &flags, &["serve", "2", "3000"]);
    assert!(o.status.success(), "{}", text(&o));
    let pid = c.task_pid("srv");
    until("checkpointed while idle", || ck.state(&ctl, pid).0 == 2);
    let (_, device, host) = ck.state(&ctl, pid);
    assert_eq!(device, 0, "no GPU memory held while Warm");
    assert!(host > 0);
    let before = kernels(&cuda, "srv").len();
    until("restored by its next burst", || {
        ck.state(&ctl, pid) == (0, host, 0) && kernels(&cuda, "srv").len() > before
    });
    assert!(c.wait_status("srv", "RUNNING"), "never paused");
    assert!(c.log().contains("restored"), "{}", c.log());
    let log = std::fs::read_to_string(cuda.join("srv.log")).unwrap_or_default();
    assert!(!log.contains("alloc managed"), "nothing converted: {log}");
    stop(&c, "srv");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Waits until the server's kernel count has not moved for 1 s; returns it.
fn settled(cuda: &Path, id: &str) -> usize {
    let mut last = kernels(cuda, id).len();
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while since.elapsed() < Duration::from_secs(1) {
        assert!(Instant::now() < deadline, "{id} never stopped");
        std::thread::sleep(Duration::from_millis(50));
        let n = kernels(cuda, id).len();
        if n != last {
            (last, since) = (n, Instant::now());
        }
    }
    last
}

/// mqfqd killed while servers burst: fail-open, bursts go on (counted) and the restarted
/// daemon learns the servers again; fail-closed, bursts wait until it is back. Nothing hangs,
/// no lease is left.
#[test]
fn bursts_fail_open_or_closed_while_mqfqd_is_away() {
    for fail in ["open", "closed"] {
        let Some((c, mut d, cuda)) = setup(
            &format!("away-{fail}"),
            &[("MQFQ_FAIL", fail), ("MQFQ_RECONNECT_GRACE_MS", "300")],
            "",
        ) else {
            return;
        };
        server(&c, &cuda, "srv", 10, 1, 50);
        d.wait_for("bursts admitted", |_| kernels(&cuda, "srv").len() >= 5);
        d.kill9();
        if fail == "open" {
            let n = kernels(&cuda, "srv").len();
            until("bursts go on without mqfqd", || {
                kernels(&cuda, "srv").len() >= n + 20
            });
            assert!(c.log().contains("fail-open"), "{}", c.log());
        } else {
            let n = settled(&cuda, "srv");
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(
                kernels(&cuda, "srv").len(),
                n,
                "a burst ran with mqfqd away"
            );
        }
        d.spawn();
        let n = kernels(&cuda, "srv").len();
        d.wait_for("bursts admitted again", |_| {
            kernels(&cuda, "srv").len() >= n + 5
        });
        stop(&c, "srv");
        d.wait_for("no lease left", |s| leases(s).is_empty());
        assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    }
}

/// The shim killed while its server bursts: the daemon releases its lease (pidfd) and
/// containerd cleans up after the dead shim; nothing hangs, nothing is left.
#[test]
fn a_killed_shim_leaves_no_burst_lease() {
    let Some((c, d, cuda)) = setup("shimkill", &[], "") else {
        return;
    };
    // As servers do, it ignores SIGPIPE: its stdout went to the shim.
    let o = c.run_cuda(
        MQFQ,
        "srv",
        "srv",
        &cuda,
        &["FAKE_CUDA_KERNEL_MS=30", "CLIENT_IGNORE_SIGPIPE=1"],
        &["serve", "3", "0"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = d.wait_for("a burst lease", |s| {
        leases(s).iter().any(|l| l["kind"] == "burst")
    });
    let shim = leases(&s)[0]["shim_pid"].as_u64().unwrap();
    common::kill9(shim);
    d.wait_for("its lease released", |s| leases(s).is_empty());
    assert!(
        d.records()
            .iter()
            .any(|r| r["event"] == "release" && r["reason"] == "shim gone")
    );
    until("containerd cleaned up the task", || {
        let o = c.ctr(&["task", "ls", "-q"]);
        String::from_utf8_lossy(&o.stdout).trim().is_empty()
    });
    let _ = c.ctr(&["containers", "rm", "srv"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Heavy and light servers together under the default queue knobs (the short-slot reserve on):
/// their kernels never run in more containers at once than the limit mqfqd had in force.
#[test]
fn mixed_servers_never_exceed_the_limit_in_force() {
    let Some((c, d, cuda)) = setup(
        "mixed",
        &[],
        "[concurrency]\nd_max = 3\nd_initial = 3\n[queue]\nshort_charge_s = 0\n",
    ) else {
        return;
    };
    let ids = ["b1", "b2", "b3", "e1", "c1"];
    for (id, k, ms, gap) in [
        ("b1", 4, 30, 10),
        ("b2", 4, 30, 10),
        ("b3", 4, 30, 10),
        ("e1", 2, 10, 100),
        ("c1", 1, 10, 200),
    ] {
        server(&c, &cuda, id, ms, k, gap);
    }
    d.wait_for("every server computed", |_| {
        ids.iter().all(|id| kernels(&cuda, id).len() >= 10)
    });
    let until = mqfq_testkit::monotonic_us();
    for id in ids {
        stop(&c, id);
    }
    let records = d.records();
    let limit = records
        .iter()
        .filter(|r| r["event"] == "dispatch")
        .filter_map(|r| r["limit"].as_u64())
        .max()
        .unwrap_or(0);
    let most = mqfq_testkit::most_at_once(&cuda, &ids, until);
    assert!(
        most as u64 <= limit,
        "{most} containers' kernels at once, limit {limit}\n{records:#?}"
    );
}

/// Starts server `id` whose GPU work never finishes (a launch every 20 ms of 30 ms kernels), so
/// its burst never ends.
fn endless_server(c: &Containerd, cuda: &Path, id: &str) {
    let o = c.run_cuda(MQFQ, id, id, cuda, &["FAKE_CUDA_KERNEL_MS=30"], &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A server that never lets its GPU work finish (a launch every 20 ms of 30 ms kernels): its
/// burst never ends, keeps its slot, and is charged while it runs, a step per second; the
/// record, charges included, replays through scheduler-core.
#[test]
fn a_burst_that_never_ends_is_charged_as_it_runs() {
    let Some((c, d, cuda)) = setup("endless", &[], "") else {
        return;
    };
    endless_server(&c, &cuda, "hog");
    let charges = |d: &Mqfqd| {
        d.records()
            .iter()
            .filter(|r| r["event"] == "charge")
            .filter_map(|r| r["served_s"].as_f64())
            .collect::<Vec<_>>()
    };
    d.wait_for("charged twice while it runs", |s| {
        charges(&d).len() >= 2 && leases(s).iter().any(|l| l["kind"] == "burst")
    });
    let served = charges(&d);
    assert!(served.windows(2).all(|w| w[1] >= w[0] + 1.0), "{served:?}");
    stop(&c, "hog");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    common::replay(&d.records(), d.config());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// The maximum burst hold: on one slot, a server whose burst never ends would keep every other
/// burst out for as long as it runs. Past `max_burst_hold_s` its lease is in overtime — it
/// keeps running and its slot — and a light server's bursts run beside it; mqfqctl shows the
/// lease in overtime, and the record replays through scheduler-core.
#[test]
fn a_burst_past_the_maximum_hold_no_longer_keeps_the_others_out() {
    let Some((c, d, cuda)) = setup(
        "overtime",
        &[],
        "[concurrency]\nd_max = 1\nd_initial = 1\n[limits]\nmax_burst_hold_s = 1\n",
    ) else {
        return;
    };
    endless_server(&c, &cuda, "hog");
    d.wait_for("the hog holding the slot", |s| {
        leases(s).iter().any(|l| l["kind"] == "burst")
    });
    server(&c, &cuda, "light", 10, 1, 200);
    d.wait_for("three light bursts", |_| kernels(&cuda, "light").len() >= 3);
    let s = d.status();
    let hog: Vec<Value> = leases(&s)
        .into_iter()
        .filter(|l| l["container_id"] == "hog")
        .collect();
    assert!(
        hog.len() == 1 && hog[0]["overtime"] == true,
        "the hog's lease: {hog:?}"
    );
    let records = d.records();
    let overtime: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "overtime")
        .collect();
    assert!(
        overtime.len() == 1
            && overtime[0]["key"]
                .as_str()
                .is_some_and(|k| k.ends_with("/hog")),
        "{overtime:?}"
    );
    stop(&c, "light");
    stop(&c, "hog");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    common::replay(&d.records(), d.config());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Containers that do not run as host root — a pod's `runAsUser`, and a pod in a user
/// namespace (`hostUsers: false`) — reach their shim's burst socket like root ones: both get
/// burst leases, and on one slot their kernels never overlap with each other's or a root
/// server's (a server that could not connect would run ungated beside the others).
#[test]
fn servers_run_as_another_user_or_in_a_user_namespace_are_admitted() {
    let Some((c, d, cuda)) = setup(
        "users",
        &[],
        "[concurrency]\nd_max = 1\nd_initial = 1\n[queue]\nshort_charge_s = 0\n",
    ) else {
        return;
    };
    // Beside a server run as host root, as the other tests run theirs.
    let mut runs: Vec<(&str, &[&str])> = vec![
        ("root", &[]),
        (
            "userns",
            &["--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"],
        ),
    ];
    // ctr 1.6 has no `--user` (the CRI test runs `runAsUser` pods on every line).
    if c.version >= (1, 7) {
        runs.push(("uid1000", &["--user", "1000:1000"]));
    }
    for &(id, flags) in &runs {
        // The double's log, written by the container's own user (the folder is root's).
        let log = cuda.join(format!("{id}.log"));
        std::fs::write(&log, "").unwrap();
        std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let mut all = vec!["-d", "--env", "FAKE_CUDA_KERNEL_MS=20"];
        all.extend_from_slice(flags);
        let o = c.run_cuda_with(MQFQ, id, id, &cuda, &all, &["serve", "2", "10"]);
        assert!(o.status.success(), "{id}: {}", text(&o));
    }
    let ids: Vec<&str> = runs.iter().map(|r| r.0).collect();
    d.wait_for("both servers' kernels ran", |_| {
        ids.iter().all(|id| kernels(&cuda, id).len() >= 6)
    });
    let until = mqfq_testkit::monotonic_us();
    let records = d.records();
    for &id in &ids {
        let burst = |r: &&Value| {
            r["event"] == "enqueue"
                && r["kind"] == "burst"
                && r["key"]
                    .as_str()
                    .is_some_and(|k| k.ends_with(&format!("/{id}")))
        };
        assert!(
            records.iter().filter(burst).count() >= 2,
            "{id} took no burst lease: {records:?}"
        );
    }
    let most = mqfq_testkit::most_at_once(&cuda, &ids, until);
    assert!(
        most <= 1,
        "{most} containers' kernels ran at once on d_max = 1"
    );
    for &id in &ids {
        stop(&c, id);
    }
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
