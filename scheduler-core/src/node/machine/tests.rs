//! The joins, each from its input: a grant is a pool hit, a flow turning Active prefetches its
//! Warm containers, what the pool measures reaches the core (and may grant), and the same inputs
//! give the same answers.

use super::*;
use crate::config::TierConfig;
use crate::node::admission::Kind;
use crate::node::admission::testing::{GIB, admit_info, memory_core_on, secs};
use crate::node::pool::{Action, PoolConfig};
use crate::tiers::Tier;

fn node(default_mb: u64) -> Node {
    node_on(&[24], default_mb)
}

/// [`node`] on GPUs of these sizes (GiB), all sampled idle at 0.
fn node_on(gib: &[u64], default_mb: u64) -> Node {
    let pool = Pool::new(PoolConfig {
        tiers: TierConfig {
            hot_ttl_s: 600.0,
            warm_ttl_s: 3600.0,
            headroom: 0.15,
            prefetch_iat: 5.0,
        },
        reclaim: false,
        host_headroom: 0.1,
    })
    .unwrap();
    let mut n = Node::new(memory_core_on(gib, 2, 0.0, default_mb), pool);
    // The pool believes no bytes on a GPU it has not seen.
    let idle = (0u32..)
        .zip(gib)
        .map(|(index, _)| GpuReading {
            index,
            signals: crate::concurrency::Signals {
                busy: Some(0.0),
                sm_activity: None,
            },
            memory_used: 0,
        })
        .collect();
    n.step(&Input::Sample(idle), secs(0.0)).unwrap();
    n
}

fn admit(n: &mut Node, id: &str, function: &str, at: f64) -> Output {
    n.step(
        &Input::Admit(admit_info(id, function, Kind::Burst)),
        secs(at),
    )
    .unwrap()
}

/// Lease `lease` ends at `at`; its container `ns/<id>` stays, idle, holding `bytes` (and what
/// the driver measured, where it did).
fn release_idle(
    n: &mut Node,
    lease: u64,
    id: &str,
    (bytes, resident): (u64, Option<u64>),
    at: f64,
) -> Output {
    let r = Input::Release {
        lease,
        measured_s: Some(0.1),
        reason: "idle".into(),
        pooled: Some(PooledEnd {
            key: format!("ns/{id}").parse().unwrap(),
            paused: true,
            bytes,
            native: None,
            resident,
        }),
    };
    n.step(&r, secs(at)).unwrap()
}

fn hit(n: &mut Node, lease: u64, at: f64) {
    let hit = Input::Hit {
        lease,
        container: None,
    };
    n.step(&hit, secs(at)).unwrap();
}

/// Container `ns/<id>` of `function` runs one burst at `at` and stays idle holding `bytes`.
fn one_burst(n: &mut Node, id: &str, function: &str, bytes: u64, at: f64) {
    one_measured_burst(n, id, function, (bytes, None), at);
}

/// [`one_burst`], its release reporting `bytes` and, where measured, what the driver saw its
/// processes holding.
fn one_measured_burst(
    n: &mut Node,
    id: &str,
    function: &str,
    (bytes, resident): (u64, Option<u64>),
    at: f64,
) {
    let lease = admit(n, id, function, at).grants[0].lease;
    hit(n, lease, at);
    release_idle(n, lease, id, (bytes, resident), at + 0.1);
}

fn tier(n: &Node, key: &str) -> Option<Tier> {
    n.pool()
        .entries(secs(0.0))
        .into_iter()
        .find(|e| e.key == key)
        .map(|e| e.tier)
}

#[test]
fn a_hit_puts_the_lease_s_container_in_the_pool_and_its_bytes_reach_the_core() {
    let mut n = node(1024);
    one_burst(&mut n, "a", "f", 3 * GIB, 0.0);
    assert_eq!(tier(&n, "ns/a"), Some(Tier::Hot));
    assert_eq!(n.core().footprints().get("f"), Some(&(3 * GIB)));
    // A lease the core never granted is refused, and nothing joins the pool.
    let bogus = Input::Hit {
        lease: 999,
        container: None,
    };
    assert!(matches!(
        n.step(&bogus, secs(1.0)),
        Err(CoreError::UnknownLease(999))
    ));
    assert_eq!(n.pool().entries(secs(1.0)).len(), 1);
}

#[test]
fn what_the_driver_measured_a_container_holding_is_its_function_s_footprint() {
    // The shim reports the 3 GiB it can move; the driver saw its processes hold 12 GiB (their
    // CUDA contexts too): the function is charged 12 GiB, on a 24 GiB GPU whose budget is 20.4.
    let mut n = node(1024);
    one_measured_burst(&mut n, "a", "f", (3 * GIB, Some(12 * GIB)), 0.0);
    assert_eq!(n.core().footprints().get("f"), Some(&(12 * GIB)));
    let e = n.pool().entries(secs(1.0)).into_iter().next().unwrap();
    assert_eq!((e.bytes, e.resident), (3 * GIB, 12 * GIB), "both shown");
    // One call of f runs; a second waits for memory beside a free slot (at 3 GiB both would run).
    assert_eq!(admit(&mut n, "b", "f", 1.0).grants.len(), 1);
    assert!(admit(&mut n, "c", "f", 1.1).grants.is_empty());
    // Measured less than reported: the report stands. Past the GPU's capacity: held to it.
    let mut n = node(1024);
    one_measured_burst(&mut n, "a", "f", (3 * GIB, Some(GIB)), 0.0);
    assert_eq!(n.core().footprints().get("f"), Some(&(3 * GIB)));
    one_measured_burst(&mut n, "b", "h", (GIB, Some(100 * GIB)), 1.0);
    assert_eq!(n.core().footprints().get("h"), Some(&(24 * GIB)));
}

#[test]
fn a_flow_turning_active_prefetches_its_evicted_container() {
    let mut n = node(1024);
    one_burst(&mut n, "a", "f", 3 * GIB, 0.0);
    let evicted = Input::Report(Outcome {
        key: "ns/a".parse().unwrap(),
        action: Action::Evict,
        ok: true,
        skipped: false,
        gone: false,
        bytes: 3 * GIB,
        seconds: 0.1,
    });
    n.step(&evicted, secs(1.0)).unwrap();
    assert_eq!(tier(&n, "ns/a"), Some(Tier::Warm));
    // A sticky TTL later the flow is Inactive; a new call of it turns it Active again, and the
    // node orders its Warm container back in the same answer.
    let out = admit(&mut n, "b", "f", 30.0);
    assert_eq!(out.grants.len(), 1);
    assert!(
        out.orders
            .iter()
            .any(|o| o.key == "ns/a" && o.action == Action::Prefetch),
        "{out:?}"
    );
}

#[test]
fn a_footprint_measured_smaller_grants_waiting_work_in_the_same_answer() {
    // Charged 16 GiB until measured: a second lease does not fit in a 20.4 GiB budget.
    let mut n = node(16 * 1024);
    let first = admit(&mut n, "a", "f", 0.0);
    assert_eq!(first.grants.len(), 1);
    assert!(admit(&mut n, "b", "f", 0.1).grants.is_empty());
    // A shim re-registers an idle container of the function holding 2 GiB: the pool learns the
    // footprint and the node's settle hands the core what it now lets in.
    n.pool_mut().adopt_idle(
        &"ns/c".parse().unwrap(),
        "f",
        0,
        7,
        2 * GIB,
        false,
        secs(0.2),
    );
    let out = n.settle(secs(0.2));
    assert_eq!(out.grants.len(), 1, "{out:?}");
    assert_eq!(out.grants[0].key, "ns/b");
}

#[test]
fn the_same_inputs_give_the_same_answers_in_a_second_node() {
    // Two GPUs under memory pressure at once: the evictions come in the same order from every
    // node (no answer depends on a hash map's order).
    let run = || {
        let mut n = node_on(&[24, 24], 1024);
        let mut outs = Vec::new();
        for i in 0..8u32 {
            let at = f64::from(i) * 0.3;
            let mut info = admit_info(&format!("c{i}"), &format!("f{i}"), Kind::Burst);
            info.gpus = vec![(i % 2).to_string()];
            let out = n.step(&Input::Admit(info), secs(at)).unwrap();
            for g in &out.grants {
                let hit = Input::Hit {
                    lease: g.lease,
                    container: None,
                };
                n.step(&hit, secs(at)).unwrap();
                let id = format!("c{i}");
                outs.push(release_idle(
                    &mut n,
                    g.lease,
                    &id,
                    (5 * GIB, None),
                    at + 0.1,
                ));
            }
            outs.push(out);
        }
        for gpu in 0..2 {
            let pressure = Input::Memory {
                gpu,
                used: 23 * GIB,
                total: 24 * GIB,
            };
            outs.push(n.step(&pressure, secs(5.0)).unwrap());
        }
        let tick = n.step(&Input::Tick { host: None }, secs(5.0)).unwrap();
        let gpus: std::collections::BTreeSet<u32> = tick
            .orders
            .iter()
            .filter_map(|o| {
                n.pool()
                    .entries(secs(5.0))
                    .into_iter()
                    .find(|e| e.key == o.key)
            })
            .map(|e| e.gpu)
            .collect();
        assert_eq!(gpus.len(), 2, "evictions on both GPUs: {tick:?}");
        outs.push(tick);
        outs
    };
    let first = run();
    for _ in 0..8 {
        assert_eq!(first, run());
    }
}

/// Two slots on a 24 GiB GPU (20.4 GiB budget); f and g hold 8 GiB each, idle on it. f runs in
/// its container `ns/fa` and g in its own; g's second call waits for a slot. The leases of f
/// and g.
fn f_and_g_running_g2_waiting() -> (Node, u64, u64) {
    let mut n = node(1024);
    one_burst(&mut n, "fa", "f", 8 * GIB, 0.0);
    one_burst(&mut n, "ga", "g", 8 * GIB, 0.5);
    let f1 = admit(&mut n, "f1", "f", 1.0).grants[0].lease;
    let hit_f = Input::Hit {
        lease: f1,
        container: Some("ns/fa".parse().unwrap()),
    };
    n.step(&hit_f, secs(1.0)).unwrap();
    let g1 = admit(&mut n, "g1", "g", 1.0).grants[0].lease;
    hit(&mut n, g1, 1.0);
    assert!(admit(&mut n, "g2", "g", 1.1).grants.is_empty());
    (n, f1, g1)
}

#[test]
fn a_released_container_s_memory_is_kept_before_the_freed_slot_is_dispatched() {
    let (mut n, f1, g1) = f_and_g_running_g2_waiting();
    // f's lease ends and its container stays, idle, holding its 8 GiB: the freed slot is not
    // given to g's second lease, for which only 4.4 GiB would be left beside f's memory
    // (told after the release, the pool still had f's container busy and g2 took the room).
    let out = release_idle(&mut n, f1, "fa", (8 * GIB, None), 1.2);
    assert!(out.grants.is_empty(), "{out:?}");
    assert!(out.orders.is_empty(), "f's container stays: {out:?}");
    assert_eq!(tier(&n, "ns/fa"), Some(Tier::Hot));
    // f's next call finds it there.
    let f2 = admit(&mut n, "f2", "f", 1.3);
    assert_eq!(f2.grants.len(), 1);
    // A container whose lease ends with its exit leaves the pool in the same input.
    let exit = Input::Release {
        lease: g1,
        measured_s: Some(0.1),
        reason: "exit".into(),
        pooled: Some(PooledEnd {
            key: "ns/ga".parse().unwrap(),
            paused: false,
            bytes: 0,
            native: None,
            resident: None,
        }),
    };
    n.step(&exit, secs(1.35)).unwrap();
    assert_eq!(tier(&n, "ns/ga"), None);
    // An unknown lease with a container changes nothing, in the pool either.
    let before = n.pool().entries(secs(1.4));
    let bogus = Input::Release {
        lease: 999,
        measured_s: None,
        reason: "idle".into(),
        pooled: Some(PooledEnd {
            key: "ns/fa".parse().unwrap(),
            paused: false,
            bytes: 0,
            native: None,
            resident: None,
        }),
    };
    assert!(matches!(
        n.step(&bogus, secs(1.4)),
        Err(CoreError::UnknownLease(999))
    ));
    assert_eq!(n.pool().entries(secs(1.4)), before);
}

#[test]
fn forgetting_idle_flows_grants_what_their_expired_ttls_let_in() {
    // f's idle container keeps its room, and g's second call waits.
    let (mut n, f1, _) = f_and_g_running_g2_waiting();
    let out = release_idle(&mut n, f1, "fa", (8 * GIB, None), 1.2);
    assert!(out.grants.is_empty());
    // Long past f's sticky TTL, the periodic forgetting (nothing idle long enough to forget) is
    // the first input: f is Inactive, its room is no longer kept, and g2 runs now.
    let (gone, out) = n.forget_idle(secs(40.0), 3600.0);
    assert!(gone.is_empty());
    let keys: Vec<String> = out.grants.iter().map(|g| g.key.to_string()).collect();
    assert_eq!(keys, ["ns/g2"]);
}
