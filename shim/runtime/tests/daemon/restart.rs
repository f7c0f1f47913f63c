//! A daemon that dies, shims that die, and a daemon that is not there yet: no container is lost
//! and no lease or wait outlives its holder.

use super::*;

#[test]
fn a_killed_daemon_loses_no_container_and_leaks_no_lease() {
    let Some(c) = containerd("restart", &[("MQFQ_RECONNECT_GRACE_MS", "60000")]) else {
        return;
    };
    let extra = "[concurrency]\nd_max = 1\nd_initial = 1\n";
    let mut d = mqfqd(c.dir(), &c.daemon_socket(), extra);
    let out = c.dir().join("out");
    std::fs::create_dir_all(out.join("run")).unwrap();
    let slow = "touch /out/run/$ID; sleep 3; ls /out/run | wc -l >> /out/counts; rm /out/run/$ID";
    let runs: Vec<_> = (0..3)
        .map(|i| gpu_run(&c, &format!("r{i}"), "fn", &out, slow))
        .collect();
    let before = d.wait_for("one running, two waiting", |s| {
        leases(s) == 1 && waiting(s) == 2
    });
    // Killed once the granted container runs: killed between its dispatch and the reply
    // reaching the shim, the new daemon rightly queues that start again (nothing to adopt).
    common::until("the granted container ran", || {
        std::fs::read_dir(out.join("run")).unwrap().count() > 0
    });
    d.kill9();
    std::thread::sleep(Duration::from_millis(300));
    d.spawn();
    // The new daemon learns the running container from its shim and queues the other two again.
    let after = d.wait_for("state rebuilt", |s| leases(s) == 1 && waiting(s) == 2);
    assert_ne!(before["boot_id"], after["boot_id"]);
    assert!(
        d.records().iter().any(|r| r["event"] == "adopt"),
        "{:#?}",
        d.records()
    );
    for r in runs {
        let o = r.join().unwrap();
        assert!(o.status.success(), "{}\n{}", text(&o), c.log());
    }
    d.wait_for("no lease left", |s| leases(s) == 0 && waiting(s) == 0);
    let counts = std::fs::read_to_string(out.join("counts")).unwrap();
    assert_eq!(counts.lines().count(), 3, "every container ran");
    assert!(
        counts.lines().all(|n| n.trim() == "1"),
        "one at a time: {counts}"
    );
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

#[test]
fn killed_shims_release_their_leases_and_waits() {
    let Some((c, d, out)) = one_slot("shimkill") else {
        return;
    };
    let a = gpu_run(&c, "holder", "fa", &out, "sleep 300");
    let s = d.wait_for("holder admitted", |s| leases(s) == 1);
    let holder_shim = s["leases"][0]["shim_pid"].as_u64().unwrap();
    let b = gpu_run(&c, "waiter", "fb", &out, "sleep 300");
    d.wait_for("waiter queued", |s| waiting(s) == 1);
    let shims = mqfq_testkit::shim_pids(&c.socket().display().to_string());
    let waiter_shim = shims
        .iter()
        .find(|p| u64::from(**p) != holder_shim)
        .copied()
        .expect("the waiter's shim");
    common::kill9(u64::from(waiter_shim));
    d.wait_for("the dead waiter withdrawn", |s| {
        waiting(s) == 0 && leases(s) == 1
    });
    common::kill9(holder_shim);
    d.wait_for("the dead holder's lease released", |s| {
        leases(s) == 0 && waiting(s) == 0
    });
    assert!(
        d.records()
            .iter()
            .any(|r| r["event"] == "release" && r["reason"] == "shim gone")
    );
    let _ = (a.join(), b.join());
    // containerd cleans up after the dead shims.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = c.ctr(&["task", "ls", "-q"]);
        if String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "tasks left:\n{}", c.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    for id in ["holder", "waiter"] {
        let _ = c.ctr(&["containers", "rm", id]);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

#[test]
fn fail_open_starts_are_counted_and_adopted_fail_closed_refuses() {
    let Some(c) = containerd("failopen", &[]) else {
        return;
    };
    // No daemon: the GPU container starts anyway.
    gpu_detached(&c, "early");
    assert!(c.wait_status("early", "RUNNING"));
    assert!(c.log().contains("fail-open"), "{}", c.log());
    // The daemon comes up: the shim registers the container and reports the fail-open start.
    let d = mqfqd(c.dir(), &c.daemon_socket(), "");
    let s = d.wait_for("the early container adopted", |s| leases(s) == 1);
    assert_eq!(s["fail_open_starts"], 1);
    assert_eq!(s["leases"][0]["container_id"], "early");
    assert!(
        c.ctr(&["task", "kill", "-s", "SIGKILL", "early"])
            .status
            .success()
    );
    d.wait_for("its lease released", |s| leases(s) == 0);
    assert!(c.wait_status("early", "STOPPED"));
    assert!(c.ctr(&["task", "delete", "early"]).status.success());
    assert!(c.ctr(&["containers", "rm", "early"]).status.success());
    drop(d);

    let Some(closed) = containerd("failclosed", &[("MQFQ_FAIL", "closed")]) else {
        return;
    };
    let o = closed.run(
        MQFQ,
        "refused",
        &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
        &["true"],
    );
    assert!(!o.status.success());
    let msg = text(&o);
    assert!(
        msg.contains("unreachable") && msg.contains("MQFQ_FAIL=closed"),
        "{msg}"
    );
    let _ = closed.ctr(&["task", "delete", "-f", "refused"]);
    let _ = closed.ctr(&["containers", "rm", "refused"]);
    assert!(closed.leftovers().is_empty(), "{:?}", closed.leftovers());
}
