//! The checkpoint backend when the driver is slow or short of memory: a restore that finds no
//! room waits for it, and a container killed while its processes are being checkpointed leaves
//! nothing held.

use super::*;

/// A fresh file for the shims' driver-double log (`FAKE_CUDA_LOG` in their environment): its
/// path, and the path as text for the environment.
fn shim_log(name: &str) -> (std::path::PathBuf, String) {
    let path = std::env::temp_dir().join(format!("{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let text = path.display().to_string();
    (path, text)
}

/// Polls `what` every 20 ms for up to 30 s.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Resume whose restore the driver answers out of memory five times (memory being freed)
/// waits and retries within the move timeout, then restores and unlocks the process; it runs.
#[test]
fn a_checkpoint_restore_without_room_waits_for_it_then_resumes() {
    let (shim_log, log) = shim_log("ckpt-wait");
    let Some((c, d, cuda, ctl, ck)) = checkpoint_node(
        "ckpt-wait",
        &[
            ("FAKE_CUDA_CKPT_FAIL", "restore-oom:5"),
            ("FAKE_CUDA_LOG", &log),
        ],
        "",
    ) else {
        return;
    };
    let flags = ck_flags(&ck);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "w", "ck", &cuda, &flags, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_log(&cuda, "w", "launched", |l| count(l, "launch") >= 3);
    let pid = c.task_pid("w");
    let device = ck.state(&ctl, pid).1;
    assert!(c.ctr(&["task", "pause", "w"]).status.success());
    d.wait_for("checkpointed", |s| tier_is(s, "w", "warm"));
    assert_eq!(ck.state(&ctl, pid), (2, 0, device));

    let o = c.ctr(&["task", "resume", "w"]);
    assert!(o.status.success(), "waited for memory: {}", text(&o));
    assert_eq!(ck.state(&ctl, pid), (0, device, 0), "restored and running");
    let restores = std::fs::read_to_string(&shim_log).unwrap_or_default();
    let tried = |rc: &str| {
        let line = format!("ckpt restore {pid} rc={rc}");
        restores.lines().filter(|l| l.ends_with(&line)).count()
    };
    assert_eq!((tried("2"), tried("0")), (5, 1), "{restores}");
    let launches = count(&driver_log(&cuda, "w"), "launch");
    wait_log(&cuda, "w", "launched after the restore", |l| {
        count(l, "launch") > launches
    });
    c.remove("w");
    nothing_left(&c, &d);
    let _ = std::fs::remove_file(&shim_log);
}

/// A container killed while the driver is checkpointing its process (each checkpoint takes 3 s
/// here) stops, is deleted, and leaves no lease, no pool entry and nothing of itself behind.
#[test]
fn a_container_killed_mid_checkpoint_leaves_nothing_held() {
    let (shim_log, log) = shim_log("ckpt-kill");
    let Some((c, d, cuda, _ctl, ck)) = checkpoint_node(
        "ckpt-kill",
        &[("FAKE_CUDA_CKPT_DELAY_MS", "3000"), ("FAKE_CUDA_LOG", &log)],
        "",
    ) else {
        return;
    };
    let flags = ck_flags(&ck);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "k", "ck", &cuda, &flags, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_log(&cuda, "k", "launched", |l| count(l, "launch") >= 3);
    let pid = c.task_pid("k");
    assert!(c.ctr(&["task", "pause", "k"]).status.success());
    // Its checkpoint under way (the double's controller side says so as it begins).
    let begun = format!("ckpt checkpointing {pid}");
    until("the checkpoint under way", || {
        std::fs::read_to_string(&shim_log).is_ok_and(|l| l.lines().any(|l| l.ends_with(&begun)))
    });
    c.remove("k");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "its process is gone"
    );
    nothing_left(&c, &d);
    let _ = std::fs::remove_file(&shim_log);
}

/// On a node whose Warm tier is `checkpoint`, an MPS client (which the driver's checkpoint does
/// not serve) goes Warm by `uvm` instead: its allocations converted, the pool showing its
/// backend, the shim saying why; a plain container beside it stays under `checkpoint`, and one
/// that asked for `checkpoint` itself gets `off` (nothing converted that it did not ask for).
#[test]
fn an_mps_client_goes_warm_by_uvm_on_a_checkpoint_node() {
    let metrics = mqfq_testkit::free_metrics_addr();
    let extra = format!("metrics_addr = \"{metrics}\"\n");
    let Some((c, d, cuda, _ctl, ck)) = checkpoint_node("ckpt-mps", &[], &extra) else {
        return;
    };
    let mut flags = ck_flags(&ck);
    let plain: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "plain", "fn-plain", &cuda, &plain, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    flags.extend(["--env".into(), "CUDA_MPS_PIPE_DIRECTORY=/tmp/mps".into()]);
    let mps: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "mps", "fn-mps", &cuda, &mps, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    for id in ["plain", "mps"] {
        wait_log(&cuda, id, "launched", |l| count(l, "launch") >= 3);
    }
    let s = d.wait_for("both pooled", |s| {
        entry(s, "plain").is_some() && entry(s, "mps").is_some()
    });
    assert_eq!(
        (
            &entry(&s, "plain").unwrap()["warm"],
            &entry(&s, "mps").unwrap()["warm"]
        ),
        (&"checkpoint".into(), &"uvm".into()),
        "{s:#}"
    );
    assert_eq!(count(&driver_log(&cuda, "plain"), "alloc managed"), 0);
    assert!(
        count(&driver_log(&cuda, "mps"), "alloc managed") > 0,
        "converted"
    );
    assert!(
        c.log()
            .contains("cannot serve this container (an MPS client)"),
        "{}",
        c.log()
    );
    // One that asked for `checkpoint` itself is converted by nothing: `off`, never pooled.
    flags.extend(["--annotation".into(), "io.mqfq.warm=checkpoint".into()]);
    let asked: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o = c.run_cuda_with(MQFQ, "asked", "fn-asked", &cuda, &asked, &["loop"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_log(&cuda, "asked", "launched", |l| count(l, "launch") >= 3);
    assert_eq!(count(&driver_log(&cuda, "asked"), "alloc managed"), 0);
    assert!(entry(&d.status(), "asked").is_none(), "never pooled");
    assert!(c.log().contains("Warm tier by off instead"), "{}", c.log());
    c.remove("asked");
    // Paused, each is evicted by its own backend, as the metrics count them.
    for id in ["plain", "mps"] {
        assert!(c.ctr(&["task", "pause", id]).status.success());
    }
    d.wait_for("both evicted", |s| {
        tier_is(s, "plain", "warm") && tier_is(s, "mps", "warm")
    });
    let m = mqfq_testkit::scrape(&metrics);
    for backend in ["checkpoint", "uvm"] {
        let moved = format!(
            "mqfq_pool_backend_moves_total{{backend=\"{backend}\",action=\"evict\",result=\"ok\"}}"
        );
        assert_eq!(mqfq_testkit::metric(&m, &moved), 1.0, "{m}");
    }
    for id in ["plain", "mps"] {
        c.remove(id);
    }
    nothing_left(&c, &d);
}
