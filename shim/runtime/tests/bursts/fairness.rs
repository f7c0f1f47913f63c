//! A flood beside a light server, and processes that lie about their bursts: a light burst
//! waits behind at most one flood burst (or one liar's), and GPU memory moves per light burst at
//! most, never per flood burst.

use super::*;

/// A flooding server (a burst, a 10 ms pause, the next) and a light one (a short burst every
/// 300 ms) on one slot: a light burst never waits behind more than one flood burst, and the
/// dispatch record replays through scheduler-core exactly.
#[test]
fn a_light_server_waits_at_most_one_flood_burst() {
    let Some((c, d, cuda)) = setup(
        "flood",
        &[],
        "[concurrency]\nd_max = 1\nd_initial = 1\n[queue]\nshort_charge_s = 0\n",
    ) else {
        return;
    };
    server(&c, &cuda, "flood", 20, 2, 10);
    d.wait_for("the flood running", |_| kernels(&cuda, "flood").len() >= 10);
    server(&c, &cuda, "light", 10, 1, 300);
    d.wait_for("eight light bursts", |_| kernels(&cuda, "light").len() >= 8);
    stop(&c, "light");
    stop(&c, "flood");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    let records = d.records();
    let ahead = floods_ahead_of_light(&records, |k| k.ends_with("/flood"));
    assert!(
        ahead.iter().all(|&(n, _)| n <= 1),
        "light bursts waited behind flood bursts: {ahead:?}"
    );
    assert!(ahead.len() >= 8, "{ahead:?}");
    common::replay(&records, d.config());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// What [`flood_beside_light`] saw.
struct MemoryRun {
    /// mqfqd's `/metrics` once the light server had run its bursts.
    metrics: String,
    /// `mqfqctl status` then.
    status: Value,
    /// The light server's bursts (kernels) by then.
    light_bursts: usize,
    /// [`floods_ahead_of_light`] over the whole run.
    ahead: Vec<(usize, usize)>,
}

/// The flood above holding most of a simulated 72 MiB GPU (47 MiB: the client's 7 and 40 more)
/// beside a light server of 7 + `light_extra_mib` MiB, on one slot; the pool's budget is 85 %
/// (61 MiB). Runs until the light server has run eight bursts and both containers' memory is
/// known to the pool, then stops both (`None`: no containerd here).
fn flood_beside_light(name: &str, light_extra_mib: u32) -> Option<MemoryRun> {
    const MIB: u64 = 1 << 20;
    let metrics = mqfq_testkit::free_metrics_addr();
    let (c, d, cuda) = setup(
        name,
        &[],
        &format!(
            "metrics_addr = \"{metrics}\"\n[simulated]\nmemory_mib = 72\n\
             [concurrency]\nd_max = 1\nd_initial = 1\n[queue]\nshort_charge_s = 0\n"
        ),
    )?;
    let o = c.run_cuda(
        MQFQ,
        "flood",
        "flood",
        &cuda,
        &["FAKE_CUDA_KERNEL_MS=20", "CLIENT_EXTRA_MIB=40"],
        &["serve", "2", "10"],
    );
    assert!(o.status.success(), "flood: {}", text(&o));
    d.wait_for("the flood running", |_| kernels(&cuda, "flood").len() >= 10);
    let extra = format!("CLIENT_EXTRA_MIB={light_extra_mib}");
    let o = c.run_cuda(
        MQFQ,
        "light",
        "light",
        &cuda,
        &["FAKE_CUDA_KERNEL_MS=10", &extra],
        &["serve", "1", "300"],
    );
    assert!(o.status.success(), "light: {}", text(&o));
    d.wait_for("eight light bursts", |_| kernels(&cuda, "light").len() >= 8);
    let light = (7 + u64::from(light_extra_mib)) * MIB;
    let status = d.wait_for("both pooled with their memory", |s| {
        let bytes = |id: &str| {
            s["pool"].as_array().and_then(|p| {
                p.iter()
                    .find(|e| e["container_id"] == id)
                    .and_then(|e| e["bytes"].as_u64())
            })
        };
        bytes("flood").is_some_and(|b| b >= 47 * MIB) && bytes("light").is_some_and(|b| b >= light)
    });
    let metrics = mqfq_testkit::scrape(&metrics);
    let light_bursts = kernels(&cuda, "light").len();
    stop(&c, "light");
    stop(&c, "flood");
    d.wait_for("no lease left", |s| leases(s).is_empty());
    let ahead = floods_ahead_of_light(&d.records(), |k| k.ends_with("/flood"));
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    Some(MemoryRun {
        metrics,
        status,
        light_bursts,
        ahead,
    })
}

/// The memory moves a scrape counts, by action (`evict`, `prefetch`, `restore`, …), done or not.
fn moves(metrics: &str) -> std::collections::BTreeMap<String, f64> {
    let mut by = std::collections::BTreeMap::new();
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix("mqfq_pool_moves_total{") else {
            continue;
        };
        let action = rest
            .split("action=\"")
            .nth(1)
            .and_then(|a| a.split('"').next())
            .unwrap_or("?");
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *by.entry(action.to_owned()).or_insert(0.0) += v;
    }
    by
}

/// The light server fits beside the flood (7 MiB; 54 of 61): it still waits behind at most one
/// flood burst, both stay resident, and no memory moves — no evict, prefetch or restore. (A
/// simulated GPU had read as full while any lease ran, 2 GiB a lease: the pool evicted the idle
/// server, and each switch between the two restored one.)
#[test]
fn a_flood_holding_most_of_the_memory_beside_a_light_server_moves_no_memory() {
    let Some(run) = flood_beside_light("flood-mem", 0) else {
        return;
    };
    let tiers = mqfq_testkit::pool_tiers(&run.status);
    assert_eq!(
        tiers.get("flood").map(String::as_str),
        Some("hot"),
        "{}",
        run.status
    );
    assert_eq!(
        tiers.get("light").map(String::as_str),
        Some("hot"),
        "{}",
        run.status
    );
    let moved = moves(&run.metrics);
    assert!(moved.values().all(|&n| n == 0.0), "memory moved: {moved:?}");
    assert!(
        run.ahead.iter().all(|&(n, _)| n <= 1),
        "light bursts waited behind flood bursts: {:?}",
        run.ahead
    );
}

/// The light server does not fit beside the flood (27 MiB; 74 of 61): the two take turns on
/// the GPU's memory, and what moves is bounded by the light server's bursts — at most one
/// memory move each way per light burst, never one per flood burst (the thrash of issue 34: a
/// flood restoring at almost every run) — while a light burst still waits behind at most one
/// flood burst.
#[test]
fn a_flood_and_a_light_server_that_do_not_fit_together_move_memory_per_light_burst_only() {
    let Some(run) = flood_beside_light("flood-nofit", 20) else {
        return;
    };
    let moved = moves(&run.metrics);
    let n = |a: &str| moved.get(a).copied().unwrap_or(0.0);
    #[expect(clippy::cast_precision_loss, reason = "a burst count")]
    let bound = 2.0 * (run.light_bursts as f64 + 1.0);
    assert!(
        n("restore") + n("prefetch") <= bound && n("evict") <= bound,
        "{} light bursts, moves {moved:?}",
        run.light_bursts
    );
    assert!(
        run.ahead.iter().all(|&(n, _)| n <= 1),
        "light bursts waited behind flood bursts: {:?}",
        run.ahead
    );
}

/// For each light burst in the dispatch record (its enqueue up to its dispatch): how many flood
/// bursts were dispatched first (`flood`: which keys are the flood's), and how many of those had
/// joined the queue after it (overtook it).
fn floods_ahead_of_light(records: &[Value], flood: impl Fn(&str) -> bool) -> Vec<(usize, usize)> {
    let key = |r: &Value| r["key"].as_str().unwrap_or("").to_owned();
    let mut ahead = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if r["event"] != "enqueue" || !key(r).ends_with("/light") {
            continue;
        }
        let (mut floods, mut overtook) = (0, 0);
        let mut later_arrivals = std::collections::HashSet::new();
        for later in &records[i + 1..] {
            let k = key(later);
            if later["event"] == "dispatch" && k.ends_with("/light") {
                break;
            }
            if later["event"] == "enqueue" {
                later_arrivals.insert(k.clone());
            }
            if later["event"] == "dispatch" && flood(&k) {
                floods += 1;
                if later_arrivals.remove(&k) {
                    overtook += 1;
                }
            }
        }
        ahead.push((floods, overtook));
    }
    ahead
}

/// Four containers whose process speaks the burst socket itself and lies: it holds each lease
/// 50 ms and says its work completed 49 ms ago (`end 49000000`), again at once, for ever; then
/// an honest light server (a 10 ms burst every 300 ms) beside them on two slots, until it has
/// run eight bursts. mqfqd's `extra` config on top of no short-slot reserve and a tiny over-run
/// threshold (the charge alone). Returns the dispatch record, every lease released (`None`: no
/// containerd here, the test skipped as [`setup`] decides).
fn liars_beside_a_light_server(name: &str, extra: &str) -> Option<Vec<Value>> {
    let config = format!(
        "[concurrency]\nd_max = 2\nd_initial = 2\n[queue]\nshort_charge_s = 0\noverrun_s = 0.001\n{extra}"
    );
    let (c, d, cuda) = setup(name, &[], &config)?;
    mqfq_testkit::build_double("hostile_ctl", &cuda).unwrap();
    let liars = ["liar0", "liar1", "liar2", "liar3"];
    for id in liars {
        let o = c.run_cuda_program(
            MQFQ,
            id,
            id,
            &cuda,
            "hostile_ctl",
            &["-d"],
            &["burst", "50", "49000000"],
        );
        assert!(o.status.success(), "{id}: {}", text(&o));
    }
    let liar_dispatches = |d: &Mqfqd| {
        d.records()
            .iter()
            .filter(|r| r["event"] == "dispatch")
            .filter(|r| r["key"].as_str().is_some_and(|k| k.contains("/liar")))
            .count()
    };
    d.wait_for("the liars bursting", |_| liar_dispatches(&d) >= 20);
    server(&c, &cuda, "light", 10, 1, 300);
    d.wait_for("eight light bursts", |_| kernels(&cuda, "light").len() >= 8);
    stop(&c, "light");
    for id in liars {
        stop(&c, id);
    }
    d.wait_for("no lease left", |s| leases(s).is_empty());
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    let records = d.records();
    Some(records)
}

/// The liars above, all in one tenant's flows (`flood`); a lie bills only what the shim can
/// vouch for (its idle time, 5 ms), so their flows are charged ~45 ms a burst and keep no lowest
/// tag. What MQFQ-Sticky alone does not give, lie or not: "at most one of their bursts" ahead of
/// each light burst — flows that come back idle all take V, and the flow served last stays
/// sticky while it is within T of V, so a light burst waits behind one to four of theirs
/// (mostly one). Billed ~0, the liars had overtaken it 15 times in a row.
#[test]
fn lying_burst_ends_do_not_starve_an_honest_server() {
    // Not replayed through the queue alone: in about one run in eight (CI, containerd 1.7) the
    // core's choice among liars that came back at once differed from the queue-only replay's
    // (left for issue 34's same-sequence work, which compares the whole core).
    let Some(records) = liars_beside_a_light_server("liars", "") else {
        return;
    };
    let ahead = floods_ahead_of_light(&records, |k| k.contains("/liar"));
    assert!(ahead.len() >= 8, "{ahead:?}");
    // Never starved: each light burst runs within a few of theirs (the two queued before it,
    // and a sticky flow's turn at V; the first light burst is a new function's, not resident
    // yet).
    assert!(
        ahead[1..].iter().all(|&(n, _)| n <= 4),
        "light bursts waited behind liars' bursts (all, queued after it): {ahead:?}"
    );
    // Each lie was billed what the shim vouches for, not the ~1 ms it claimed.
    let billed: Vec<f64> = records
        .iter()
        .filter(|r| r["event"] == "release")
        .filter(|r| r["key"].as_str().is_some_and(|k| k.contains("/liar")))
        .filter_map(|r| r["measured_s"].as_f64())
        .collect();
    assert!(!billed.is_empty());
    let low = billed.iter().filter(|&&s| s < 0.040).count();
    assert!(
        low * 10 <= billed.len(),
        "{low} of {} billed < 40 ms: {billed:?}",
        billed.len()
    );
}

/// The same four liars as one tenant (`[[fairness.rule]]`, as an operator names a namespace's
/// tenant) and the light server in another: it waits behind at most one of their bursts (issue
/// 34's test). Two rules each give it: billed what the shim vouches for, the liars' tags stay
/// above the light server's (with the tenants' share of slots disabled the test still passes —
/// measured); and while the light server's burst waits the liars' tenant takes no more than its
/// share of the two slots, one, so the next slot that frees is the light server's even where a
/// tenant's tags are lower (the share's own tests: `node/admission/share/tests.rs`).
#[test]
fn a_tenant_of_liars_keeps_an_honest_tenant_behind_at_most_one_of_their_bursts() {
    let rule = "[[fairness.rule]]\nfunction = \"liar*\"\ntenant = \"flood\"\n";
    let Some(records) = liars_beside_a_light_server("liartenant", rule) else {
        return;
    };
    let tenants: std::collections::BTreeSet<(String, String)> = records
        .iter()
        .filter(|r| r["event"] == "enqueue")
        .map(|r| {
            let k = r["key"].as_str().unwrap_or_default();
            let light = if k.ends_with("/light") {
                "light"
            } else {
                "liar"
            };
            (
                light.to_owned(),
                r["tenant"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    assert!(
        tenants.contains(&("liar".into(), "flood".into())),
        "{tenants:?}"
    );
    assert!(
        !tenants.contains(&("light".into(), "flood".into())),
        "{tenants:?}"
    );
    let ahead = floods_ahead_of_light(&records, |k| k.contains("/liar"));
    assert!(ahead.len() >= 8, "{ahead:?}");
    // The first light burst is a new function's, its memory not resident yet.
    assert!(
        ahead[1..].iter().all(|&(n, _)| n <= 1),
        "light bursts waited behind liars' bursts (all, queued after it): {ahead:?}"
    );
}
