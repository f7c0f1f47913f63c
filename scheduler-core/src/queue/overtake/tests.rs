use super::super::*;

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// T = 3 s, residency-aware selection, 1 s charges unless hinted (the admission core's test
/// knobs otherwise).
fn cfg(overtake_bound: f64) -> QueueConfig {
    QueueConfig {
        overrun: Overrun::Fixed(3.0),
        overtake_bound,
        ..crate::node::admission::testing::qcfg(0.0)
    }
}

/// Five light flows whose memory is resident, six 1 s calls each, and one call of a flow whose
/// memory is not (a 100 s switch cost, so the residency rule puts every resident flow within T
/// first). `ahead` light calls are queued before it. Where the lone call went in the dispatch
/// order, and whether it was marked overdue.
fn order(bound: f64, ahead: usize) -> (usize, bool) {
    let mut q = MqfqQueue::new(cfg(bound)).unwrap();
    let lone = q.flow("lone");
    q.set_residency(lone, false, 100.0).unwrap();
    let lights: Vec<FlowId> = (0..5).map(|i| q.flow(&format!("light{i}"))).collect();
    for &l in &lights {
        q.set_residency(l, true, 0.0).unwrap();
    }
    let calls: Vec<FlowId> = (0..6).flat_map(|_| lights.iter().copied()).collect();
    for &l in &calls[..ahead] {
        q.enqueue(l, "light", secs(0.0)).unwrap();
    }
    q.enqueue(lone, "lone", secs(0.0)).unwrap();
    for &l in &calls[ahead..] {
        q.enqueue(l, "light", secs(0.0)).unwrap();
    }
    let out: Vec<(&str, bool)> = std::iter::from_fn(|| q.dispatch(secs(0.0)))
        .map(|d| (d.item, d.overdue))
        .collect();
    assert_eq!(out.len(), 31);
    let at = out.iter().position(|&(i, _)| i == "lone").unwrap();
    (at, out[at].1)
}

/// The tie-breaks let every resident flow run up to T ahead of the lone call — 20 calls, each
/// of the five flows at start tags 0 to 3 — before it goes. With the bound at 1 and nothing
/// queued ahead of it, it is overdue once more than T = 3 s of work has been dispatched since it
/// arrived: after four calls.
#[test]
fn a_call_is_overtaken_by_at_most_its_bound_of_work() {
    assert_eq!(order(0.0, 0), (20, false));
    assert_eq!(order(1.0, 0), (4, true));
}

/// The work queued ahead of it when it arrived counts `bound` times: with two 1 s calls ahead,
/// it is due after 1 × 2 + 3 = 5 s at bound 1 and 2 × 2 + 3 = 7 s at bound 2.
#[test]
fn the_bound_scales_the_work_queued_ahead() {
    assert_eq!(order(0.0, 2), (20, false));
    assert_eq!(order(1.0, 2), (6, true));
    assert_eq!(order(2.0, 2), (8, true));
}

/// The bound never lifts the throttle: a flow more than T ahead of V (here a heavy flow of
/// weight 0.1 whose second call starts 40 virtual seconds on) waits for V as before, so a flood
/// is held to its share whatever its calls' dues.
#[test]
fn a_throttled_flow_gets_no_precedence() {
    for bound in [0.0, 1.0] {
        let mut q = MqfqQueue::new(QueueConfig {
            selection: Selection::LowestStart,
            ..cfg(bound)
        })
        .unwrap();
        let heavy = q.flow("heavy");
        let light = q.flow("light");
        q.set_weight(heavy, 0.1).unwrap();
        q.set_charge_hint(heavy, Some(4.0)).unwrap();
        q.enqueue(heavy, "h0", secs(0.0)).unwrap();
        q.enqueue(heavy, "h1", secs(0.0)).unwrap();
        for _ in 0..10 {
            q.enqueue(light, "l", secs(0.0)).unwrap();
        }
        let out: Vec<&str> = std::iter::from_fn(|| q.dispatch(secs(0.0)))
            .map(|d| d.item)
            .collect();
        assert_eq!(
            out.iter().position(|&i| i == "h1"),
            Some(11),
            "bound {bound}"
        );
    }
}

/// An overdue flow that cannot take the slot (its memory does not fit) does not hold it, and
/// does not change how the others are chosen: the fair order's rules (stickiness, residency)
/// pick among them as without the bound, not the lowest start tag that fits; the overdue one
/// goes first once it fits.
#[test]
fn an_overdue_flow_that_does_not_fit_keeps_no_slot() {
    let mut q = MqfqQueue::new(QueueConfig {
        overrun: Overrun::Fixed(10.0),
        ..cfg(1.0)
    })
    .unwrap();
    let lone = q.flow("lone");
    let (a1, a2, b) = (q.flow("a1"), q.flow("a2"), q.flow("b"));
    q.set_residency(lone, false, 100.0).unwrap();
    q.set_residency(a1, true, 0.0).unwrap();
    q.set_residency(a2, true, 0.0).unwrap();
    q.set_residency(b, false, 100.0).unwrap();
    q.enqueue(lone, "lone", secs(0.0)).unwrap();
    for _ in 0..8 {
        q.enqueue(a1, "a1", secs(0.0)).unwrap();
        q.enqueue(a2, "a2", secs(0.0)).unwrap();
        q.enqueue(b, "b", secs(0.0)).unwrap();
    }
    // a1 is served while sticky (8 calls), then a2: 11 s of work, past the lone call's 10.
    let mut items = Vec::new();
    for _ in 0..11 {
        items.push(
            q.dispatch_slot_fitting(secs(0.0), 1, |f| f != lone)
                .unwrap()
                .item,
        );
    }
    assert_eq!(items, [["a1"; 8].as_slice(), &["a2"; 3]].concat());
    // Overdue but without room: the sticky resident flow goes on (the lowest start tag that
    // fits would be b's, at 0).
    let d = q
        .dispatch_slot_fitting(secs(0.0), 1, |f| f != lone)
        .unwrap();
    assert_eq!((d.item, d.overdue), ("a2", false));
    let d = q.dispatch_slot_fitting(secs(0.0), 1, |_| true).unwrap();
    assert_eq!((d.item, d.overdue), ("lone", true));
}

/// Calls of one flow become overdue in their order: one queued behind another is never due
/// before it, even when less work was queued when it arrived.
#[test]
fn a_flow_s_calls_are_due_in_order() {
    let mut q = MqfqQueue::new(cfg(1.0)).unwrap();
    let a = q.flow("a");
    let b = q.flow("b");
    for _ in 0..5 {
        q.enqueue(b, 0, secs(0.0)).unwrap();
    }
    q.enqueue(a, 1, secs(0.0)).unwrap();
    // b's calls leave; a's second call arrives with less queued than its first did.
    for _ in 0..5 {
        q.withdraw(b, |_| true).unwrap();
    }
    q.enqueue(a, 2, secs(0.0)).unwrap();
    let dues: Vec<f64> = q.flows[a.ix()].pending.iter().map(|p| p.due).collect();
    assert_eq!(dues.len(), 2);
    assert!(dues[1] >= dues[0], "{dues:?}");
}

/// Arrival order never overtakes, so the bound has nothing to do there: no call is marked.
#[test]
fn fifo_keeps_no_dues() {
    let mut q = MqfqQueue::new(QueueConfig {
        selection: Selection::Fifo,
        ..cfg(1.0)
    })
    .unwrap();
    let a = q.flow("a");
    q.enqueue(a, 0, secs(0.0)).unwrap();
    assert!(q.overdue.is_empty());
    assert!(!q.dispatch(secs(0.0)).unwrap().overdue);
}

/// A call's due and the work dispatched since are counted in the same units: the estimate it
/// was queued with. A flow whose estimate rises after its calls were queued (a 1 s fallback,
/// then 10 s measured) would otherwise count each later dispatch at the new estimate against
/// dues set at the old one, and calls would turn overdue long before their bound.
#[test]
fn dispatched_work_counts_what_was_queued() {
    let mut q = MqfqQueue::new(cfg(1.0)).unwrap();
    let a = q.flow("a");
    for i in 0..3 {
        q.enqueue(a, i, secs(0.0)).unwrap();
    }
    let first = q.dispatch(secs(0.0)).unwrap();
    q.complete(&first.ticket, Some(10.0), secs(10.0)).unwrap();
    assert!(q.charge_of(&q.flows[a.ix()]) > 1.0);
    while q.dispatch(secs(10.0)).is_some() {}
    assert_eq!(q.served_work, 3.0);
    assert_eq!(q.queued_work, 0.0);
}
