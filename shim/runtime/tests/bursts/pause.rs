//! Burst containers that are paused: the pool's thaw takes no lease, a grant reaching a paused
//! container goes back, and one paused mid-burst takes a lease again at Resume.

use super::*;

/// A paused burst container thawed by the pool to move its memory takes no lease in that
/// window (its processes' bursts wait for the Resume), and runs again after it.
#[test]
fn a_paused_server_thawed_for_the_pool_takes_no_lease() {
    let Some((c, d, cuda)) = setup(
        "pausedpool",
        &[],
        "[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\n",
    ) else {
        return;
    };
    // A launch every 20 ms, and each memory move 4 × 40 ms long (one per allocation): the thaw
    // that moves its memory lasts long enough for several launches, each of which begins a
    // burst (the burst check comes before the eviction hold).
    let o = c.run_cuda(
        MQFQ,
        "srv",
        "srv",
        &cuda,
        &["FAKE_CUDA_PREFETCH_MS=40"],
        &["loop"],
    );
    assert!(o.status.success(), "{}", text(&o));
    d.wait_for("bursts admitted", |s| {
        mqfq_testkit::pool_tiers(s).contains_key("srv")
    });
    assert!(c.ctr(&["task", "pause", "srv"]).status.success());
    d.wait_for("evicted while paused, no lease held", |s| {
        mqfq_testkit::pool_tiers(s)
            .get("srv")
            .is_some_and(|t| t == "warm")
            && leases(s).is_empty()
    });
    // Settled: nothing took a lease in the thaw window, and nothing does while it stays paused.
    std::thread::sleep(Duration::from_millis(500));
    let s = d.status();
    assert!(leases(&s).is_empty(), "{s:#}");
    let launches = |c: &str| c.lines().filter(|l| *l == "launch").count();
    let before = launches(&std::fs::read_to_string(cuda.join("srv.log")).unwrap());
    assert!(c.ctr(&["task", "resume", "srv"]).status.success());
    until("launching again after the resume", || {
        launches(&std::fs::read_to_string(cuda.join("srv.log")).unwrap()) > before + 5
    });
    stop(&c, "srv");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// Pause racing a queued burst admission (issue 35): a server whose burst waits for the one
/// slot is paused; the slot frees and the grant goes to it, frozen — it is handed back (no
/// service measured), so another server takes the slot while it stays paused (before, the
/// frozen container held it until its Resume). At Resume it waits for a slot again, and runs.
#[test]
fn a_grant_that_reaches_a_paused_container_goes_back() {
    let Some((c, d, cuda)) = setup(
        "pauserace",
        &[],
        "[concurrency]\nd_max = 1\nd_initial = 1\n[limits]\nmax_burst_hold_s = 0\n",
    ) else {
        return;
    };
    let holds = |s: &Value, id: &str| leases(s).iter().any(|l| l["container_id"] == id);
    endless_server(&c, &cuda, "hog");
    d.wait_for("the hog holding the slot", |s| holds(s, "hog"));
    server(&c, &cuda, "frozen", 10, 1, 100);
    d.wait_for("its burst waiting", |s| s["waiting"] == 1);
    assert!(c.ctr(&["task", "pause", "frozen"]).status.success());
    stop(&c, "hog");
    let handed_back = |d: &Mqfqd| {
        d.records()
            .iter()
            .filter(|r| r["event"] == "release")
            .filter(|r| r["key"].as_str().is_some_and(|k| k.ends_with("/frozen")))
            .map(|r| (r["reason"].clone(), r["measured_s"].clone()))
            .collect::<Vec<_>>()
    };
    d.wait_for("the paused server's grant handed back", |_| {
        !handed_back(&d).is_empty()
    });
    assert_eq!(
        handed_back(&d),
        [(Value::from("unused"), Value::Null)],
        "one release, nothing measured"
    );
    server(&c, &cuda, "other", 10, 1, 100);
    d.wait_for("another server's bursts while it stays paused", |_| {
        kernels(&cuda, "other").len() >= 3
    });
    let s = d.status();
    assert!(!holds(&s, "frozen"), "{s:#}");
    assert!(kernels(&cuda, "frozen").is_empty());
    assert!(c.ctr(&["task", "resume", "frozen"]).status.success());
    d.wait_for("the resumed server's bursts", |_| {
        kernels(&cuda, "frozen").len() >= 2
    });
    stop(&c, "other");
    stop(&c, "frozen");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// A server paused in the middle of a burst gives its slot back while frozen, and takes a slot
/// again (a burst lease) before it is thawed to go on with that burst.
#[test]
fn a_server_paused_mid_burst_takes_a_lease_again_at_resume() {
    let Some((c, d, cuda)) = setup("midburst", &[], "") else {
        return;
    };
    endless_server(&c, &cuda, "busy");
    let holds = |s: &Value| {
        leases(s)
            .iter()
            .any(|l| l["kind"] == "burst" && l["container_id"].as_str() == Some("busy"))
    };
    let dispatched = |s: &Value| {
        s["flows"]
            .as_array()
            .and_then(|f| {
                f.iter()
                    .find(|f| f["function"].as_str().is_some_and(|n| n.ends_with("/busy")))
            })
            .and_then(|f| f["dispatched"].as_u64())
            .unwrap_or(0)
    };
    d.wait_for("a burst lease", holds);
    assert!(c.ctr(&["task", "pause", "busy"]).status.success());
    d.wait_for("no lease while frozen", |s| leases(s).is_empty());
    let before = dispatched(&d.status());
    assert!(c.ctr(&["task", "resume", "busy"]).status.success());
    // Resume took a lease before it thawed the burst: held now, or — on a loaded machine where
    // the thawed server launched nothing within the burst idle time — already given back as idle;
    // either way it was dispatched before `ctr task resume` returned.
    let s = d.status();
    assert!(
        holds(&s) || dispatched(&s) > before,
        "resumed mid-burst without a lease: {s:#}"
    );
    stop(&c, "busy");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    common::replay(&d.records(), d.config());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
