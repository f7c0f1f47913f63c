//! Property tests of the MQFQ-Sticky queue's invariants.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use proptest::prelude::*;
use scheduler_core::config::{Overrun, QueueConfig, Selection, StickyTtl};
use scheduler_core::{FlowId, MqfqQueue, Ticket, Time};

#[derive(Clone, Debug)]
enum Op {
    Enqueue(usize),
    Dispatch(u32),
    Complete(usize, f64),
    Tick(f64),
    Resident(usize, bool, f64),
    Weight(usize, f64),
}

fn op(flows: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..flows).prop_map(Op::Enqueue),
        3 => prop_oneof![Just(u32::MAX), 0u32..4].prop_map(Op::Dispatch),
        3 => (any::<prop::sample::Index>(), 0.0f64..5.0)
            .prop_map(|(i, m)| Op::Complete(i.index(1 << 16), m)),
        1 => (0.0f64..3.0).prop_map(Op::Tick),
        1 => (0..flows, any::<bool>(), 0.0f64..4.0).prop_map(|(f, r, c)| Op::Resident(f, r, c)),
        1 => (0..flows, 0.1f64..8.0).prop_map(|(f, w)| Op::Weight(f, w)),
    ]
}

fn config() -> impl Strategy<Value = QueueConfig> {
    (
        0.0f64..8.0,
        prop_oneof![
            Just(Selection::StickyResident),
            Just(Selection::Sticky),
            Just(Selection::LowestStart),
            Just(Selection::Fifo)
        ],
        any::<bool>(),
        prop_oneof![Just(0.0), Just(1.0)],
        0.0f64..3.0,
        prop_oneof![Just(0.0), Just(1.0), Just(1.5)],
    )
        .prop_map(
            |(t, selection, correct, short, ttl, overtake)| QueueConfig {
                overrun: Overrun::Fixed(t),
                ttl: StickyTtl::Fixed(ttl),
                fallback_ttl_s: ttl,
                fallback_charge_s: 0.5,
                ewma_alpha: 0.3,
                charge_correction: correct,
                selection,
                short_charge_s: short,
                overtake_bound: overtake,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// V never decreases; no dispatch starts more than T ahead of V (FIFO selection: the
    /// oldest item goes first instead); every enqueued item is dispatched once and completed
    /// once; counters agree with what the test holds and with the flows.
    #[test]
    fn queue_invariants(cfg in config(), ops in prop::collection::vec(op(5), 1..300)) {
        let fifo = cfg.selection == Selection::Fifo;
        let mut q: MqfqQueue<u64> = MqfqQueue::new(cfg).unwrap();
        let flows: Vec<FlowId> = (0..5).map(|i| q.flow(&format!("f{i}"))).collect();
        let mut now = Time::ZERO;
        let mut next_item = 0u64;
        let mut queued = std::collections::HashSet::new();
        let mut running: Vec<(Ticket, u64)> = Vec::new();
        let mut done = std::collections::HashSet::new();
        let mut last_v = q.virtual_time();
        for op in ops {
            now = now.plus_secs(0.01);
            match op {
                Op::Enqueue(f) => {
                    q.enqueue(flows[f], next_item, now).unwrap();
                    queued.insert(next_item);
                    next_item += 1;
                }
                Op::Dispatch(free) => {
                    let t = q.overrun();
                    if let Some(d) = q.dispatch_slot(now, free) {
                        prop_assert!(fifo || d.ticket.start - d.ticket.v <= t + 1e-9,
                            "dispatched {} ahead of V with T = {}", d.ticket.start - d.ticket.v, t);
                        if fifo && free > 0 {
                            prop_assert_eq!(Some(&d.item), queued.iter().min(), "FIFO out of order");
                        }
                        prop_assert!(queued.remove(&d.item), "item dispatched twice or never queued");
                        running.push((d.ticket, d.item));
                    } else if free > 0 {
                        // Work conservation: a slot free under the limit is never refused
                        // while work is queued (the reserve only governs the slot above it).
                        prop_assert_eq!(q.queued(), 0, "work queued but nothing dispatched");
                    }
                }
                Op::Complete(i, m) => {
                    if !running.is_empty() {
                        let (ticket, item) = running.swap_remove(i % running.len());
                        q.complete(&ticket, Some(m), now).unwrap();
                        prop_assert!(q.complete(&ticket, Some(m), now).is_err());
                        prop_assert!(done.insert(item));
                    }
                }
                Op::Tick(dt) => {
                    now = now.plus_secs(dt);
                    q.tick(now);
                }
                Op::Resident(f, r, c) => q.set_residency(flows[f], r, c).unwrap(),
                Op::Weight(f, w) => q.set_weight(flows[f], w).unwrap(),
            }
            let v = q.virtual_time();
            prop_assert!(v >= last_v, "V went back from {last_v} to {v}");
            last_v = v;
            prop_assert_eq!(q.queued(), queued.len());
            prop_assert_eq!(q.in_flight(), running.len());
            // The reserve's count, kept incrementally (claims ending on ticks included), agrees
            // with the flows.
            prop_assert_eq!(q.active_short_flows(), q.active_short_ids().count());
        }
        // Drain: everything still queued is dispatched and completed exactly once.
        while let Some(d) = q.dispatch(now) {
            prop_assert!(queued.remove(&d.item));
            running.push((d.ticket, d.item));
        }
        prop_assert!(queued.is_empty());
        for (t, item) in running.drain(..) {
            q.complete(&t, Some(0.1), now).unwrap();
            prop_assert!(done.insert(item));
        }
        prop_assert_eq!(done.len() as u64, next_item);
        prop_assert_eq!(q.in_flight(), 0);
    }
}

/// Runs `n` always-backlogged flows through `d` slots, each invocation of flow i taking
/// `costs[i]` seconds at speed 1, and returns the largest gap in weighted received service seen
/// at any moment, with the largest cost / weight.
fn backlogged_run(
    costs: &[f64],
    weights: &[f64],
    d: usize,
    cfg: QueueConfig,
    hint: bool,
    steps: usize,
) -> (f64, f64) {
    let mut q: MqfqQueue<usize> = MqfqQueue::new(cfg).unwrap();
    let n = costs.len();
    let ids: Vec<FlowId> = (0..n).map(|i| q.flow(&format!("f{i}"))).collect();
    for i in 0..n {
        q.set_weight(ids[i], weights[i]).unwrap();
        if hint {
            q.set_charge_hint(ids[i], Some(costs[i])).unwrap();
        }
        // Two each, refilled on dispatch: never empty.
        q.enqueue(ids[i], i, Time::ZERO).unwrap();
        q.enqueue(ids[i], i, Time::ZERO).unwrap();
    }
    let mut now = 0.0f64;
    let mut received = vec![0.0; n];
    let mut running: Vec<(f64, Ticket, usize)> = Vec::new();
    let mut worst: f64 = 0.0;
    for _ in 0..steps {
        while running.len() < d {
            let d = q
                .dispatch(Time::from_secs_f64(now))
                .expect("always backlogged");
            let f = d.item;
            received[f] += costs[f];
            q.enqueue(ids[f], f, Time::from_secs_f64(now)).unwrap();
            running.push((now + costs[f], d.ticket, f));
        }
        let gap = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| received[i] / weights[i] - received[j] / weights[j])
            .fold(0.0, f64::max);
        worst = worst.max(gap);
        running.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (end, ticket, f) = running.remove(0);
        now = end;
        q.complete(&ticket, Some(costs[f]), Time::from_secs_f64(now))
            .unwrap();
    }
    let cmax = (0..n).map(|i| costs[i] / weights[i]).fold(0.0, f64::max);
    (worst, cmax)
}

fn fair_cfg(t: f64, selection: Selection) -> QueueConfig {
    QueueConfig {
        overrun: Overrun::Fixed(t),
        ttl: StickyTtl::Fixed(1.0),
        fallback_ttl_s: 1.0,
        fallback_charge_s: 0.5,
        ewma_alpha: 0.2,
        charge_correction: true,
        selection,
        short_charge_s: 0.0,
        overtake_bound: 0.0,
    }
}

fn selection() -> impl Strategy<Value = Selection> {
    prop_oneof![
        Just(Selection::StickyResident),
        Just(Selection::Sticky),
        Just(Selection::LowestStart)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Equal weights, every flow backlogged, charges known: received GPU time per flow stays
    /// equal within T + D × max charge at every moment.
    #[test]
    fn equal_weights_share_equally(
        costs in prop::collection::vec(0.01f64..3.0, 2..7),
        d in 1usize..6,
        t in 0.0f64..6.0,
        sel in selection(),
    ) {
        let w = vec![1.0; costs.len()];
        let (gap, cmax) = backlogged_run(&costs, &w, d, fair_cfg(t, sel), true, 400);
        #[expect(clippy::cast_precision_loss, reason = "D below 6")]
        let bound = t + d as f64 * cmax;
        prop_assert!(gap <= bound + 1e-9, "gap {gap} > bound {bound}");
    }

    /// Weights skew service proportionally: received / weight stays within the same bound.
    #[test]
    fn weights_skew_proportionally(
        flows in prop::collection::vec((0.01f64..3.0, 0.25f64..4.0), 2..6),
        d in 1usize..5,
        t in 0.0f64..6.0,
        sel in selection(),
    ) {
        let costs: Vec<f64> = flows.iter().map(|f| f.0).collect();
        let w: Vec<f64> = flows.iter().map(|f| f.1).collect();
        let (gap, cmax) = backlogged_run(&costs, &w, d, fair_cfg(t, sel), true, 400);
        #[expect(clippy::cast_precision_loss, reason = "D below 5")]
        let bound = t + d as f64 * cmax;
        prop_assert!(gap <= bound + 1e-9, "gap {gap} > bound {bound}");
    }

    /// Charges unknown (fallback, then measured and corrected): the bound widens by one charge
    /// for the estimates still in flight.
    #[test]
    fn measured_charges_keep_fairness(
        costs in prop::collection::vec(0.01f64..3.0, 2..7),
        d in 1usize..6,
        t in 0.0f64..6.0,
        sel in selection(),
    ) {
        let w = vec![1.0; costs.len()];
        let (gap, cmax) = backlogged_run(&costs, &w, d, fair_cfg(t, sel), false, 400);
        let cmax = cmax.max(0.5);
        #[expect(clippy::cast_precision_loss, reason = "D below 6")]
        let bound = t + (d as f64 + 1.0) * cmax;
        prop_assert!(gap <= bound + 1e-9, "gap {gap} > bound {bound}");
    }
}

/// Applies `ops` to a queue whose five flows are in tenant `tenant` (or in none), returning every
/// dispatch (item, start, finish) and every forgotten flow.
fn replay(cfg: &QueueConfig, ops: &[Op], tenant: Option<(&str, f64)>) -> Vec<String> {
    let mut q: MqfqQueue<u64> = MqfqQueue::new(cfg.clone()).unwrap();
    let mut flows: Vec<FlowId> = (0..5)
        .map(|i| q.flow_in(&format!("f{i}"), tenant.map(|t| t.0)))
        .collect();
    if let Some((name, w)) = tenant {
        q.set_tenant_weight(name, w).unwrap();
    }
    let mut out = Vec::new();
    let mut now = Time::ZERO;
    let mut running: Vec<Ticket> = Vec::new();
    let mut item = 0u64;
    for op in ops {
        now = now.plus_secs(0.01);
        match *op {
            Op::Enqueue(f) => {
                // A forgotten flow comes back under the same key.
                flows[f] = q.flow_in(&format!("f{f}"), tenant.map(|t| t.0));
                q.enqueue(flows[f], item, now).unwrap();
                item += 1;
            }
            Op::Dispatch(free) => {
                if let Some(d) = q.dispatch_slot(now, free) {
                    out.push(format!(
                        "{} {:?} {:?}",
                        d.item, d.ticket.start, d.ticket.finish
                    ));
                    running.push(d.ticket);
                }
            }
            Op::Complete(i, m) => {
                if !running.is_empty() {
                    let t = running.swap_remove(i % running.len());
                    q.complete(&t, Some(m), now).unwrap();
                }
            }
            Op::Tick(dt) => {
                now = now.plus_secs(dt);
                q.tick(now);
                for k in q.forget_idle(now, 1.0) {
                    out.push(format!("forgot {k}"));
                }
            }
            Op::Resident(f, r, c) => {
                let _ = q.set_residency(flows[f], r, c);
            }
            Op::Weight(f, w) => {
                let _ = q.set_weight(flows[f], w);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One tenant (of any weight) holding every flow is exactly no tenant at all: the same
    /// dispatches with the same tags, bit for bit, and the same flows forgotten.
    #[test]
    fn a_single_tenant_changes_nothing(
        cfg in config(),
        ops in prop::collection::vec(op(5), 1..300),
        w in 0.1f64..10.0,
    ) {
        let flat = replay(&cfg, &ops, None);
        let one = replay(&cfg, &ops, Some(("t", w)));
        prop_assert_eq!(flat, one);
    }

    /// Tenant A runs `k` functions, tenant B `m`; all backlogged, equal costs: the two tenants
    /// receive service in proportion to their weights, within a bound that does not grow with
    /// time, however many functions each runs.
    #[test]
    fn tenants_share_by_weight_whatever_their_function_counts(
        k in 1usize..6,
        m in 1usize..4,
        wa in 0.5f64..3.0,
        d in 1usize..4,
        t in 0.0f64..3.0,
        sel in selection(),
    ) {
        let mut q: MqfqQueue<usize> = MqfqQueue::new(fair_cfg(t, sel)).unwrap();
        let mut ids = Vec::new();
        for i in 0..k + m {
            let tenant = if i < k { "a" } else { "b" };
            let id = q.flow_in(&format!("f{i}"), Some(tenant));
            q.set_charge_hint(id, Some(1.0)).unwrap();
            q.enqueue(id, i, Time::ZERO).unwrap();
            q.enqueue(id, i, Time::ZERO).unwrap();
            ids.push(id);
        }
        q.set_tenant_weight("a", wa).unwrap();
        let (mut a, mut b) = (0.0f64, 0.0f64);
        let mut running: Vec<(f64, Ticket)> = Vec::new();
        let mut now = 0.0;
        let mut worst: f64 = 0.0;
        for _ in 0..600 {
            while running.len() < d {
                let x = q.dispatch(Time::from_secs_f64(now)).expect("backlogged");
                if x.item < k { a += 1.0 } else { b += 1.0 }
                q.enqueue(ids[x.item], x.item, Time::from_secs_f64(now)).unwrap();
                running.push((now + 1.0, x.ticket));
            }
            worst = worst.max((a / wa - b).abs());
            running.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (end, ticket) = running.remove(0);
            now = end;
            q.complete(&ticket, Some(1.0), Time::from_secs_f64(now)).unwrap();
        }
        #[expect(clippy::cast_precision_loss, reason = "D and function counts below 6")]
        let bound = (t + d as f64 + 2.0) * (k.max(m) as f64 + 1.0) / wa.min(1.0);
        prop_assert!(worst <= bound, "gap {worst} > {bound} (a={a}, b={b})");
    }
}
