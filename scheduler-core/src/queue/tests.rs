use super::*;
use crate::config::Profile;

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

fn fixed(t: f64, ttl: f64, selection: Selection) -> QueueConfig {
    QueueConfig {
        overrun: Overrun::Fixed(t),
        ttl: StickyTtl::Fixed(ttl),
        fallback_ttl_s: ttl,
        fallback_charge_s: 1.0,
        ewma_alpha: 0.5,
        charge_correction: true,
        selection,
        short_charge_s: 0.0,
        overtake_bound: 0.0,
    }
}

#[test]
fn lowest_start_tag_first_and_tags_follow_charges() {
    let mut q = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
    let a = q.flow("a");
    let b = q.flow("b");
    q.set_charge_hint(a, Some(2.0)).unwrap();
    q.set_charge_hint(b, Some(1.0)).unwrap();
    for i in 0..3 {
        q.enqueue(a, ("a", i), secs(0.0)).unwrap();
        q.enqueue(b, ("b", i), secs(0.0)).unwrap();
    }
    let mut order = Vec::new();
    while let Some(d) = q.dispatch(secs(0.0)) {
        order.push((d.item.0, d.ticket.start, d.ticket.finish));
    }
    // a: 0→2, 2→4, 4→6; b: 0→1, 1→2, 2→3. Ties broken by flow id.
    assert_eq!(
        order,
        vec![
            ("a", 0.0, 2.0),
            ("b", 0.0, 1.0),
            ("b", 1.0, 2.0),
            ("a", 2.0, 4.0),
            ("b", 2.0, 3.0),
            ("a", 4.0, 6.0),
        ]
    );
}

#[test]
fn flows_more_than_t_ahead_are_throttled() {
    let mut q = MqfqQueue::new(fixed(1.0, 1.0, Selection::Sticky)).unwrap();
    let hog = q.flow("hog");
    let light = q.flow("light");
    q.set_charge_hint(hog, Some(1.0)).unwrap();
    for i in 0..5 {
        q.enqueue(hog, i, secs(0.0)).unwrap();
    }
    q.enqueue(light, 100, secs(0.0)).unwrap();
    // light has S = 0 = V; hog is sticky after its first dispatch and may run while S ≤ V + 1.
    let first = q.dispatch(secs(0.0)).unwrap();
    assert_eq!(first.item, 0);
    let second = q.dispatch(secs(0.0)).unwrap();
    assert_eq!(second.item, 1, "hog at S=1 is still within T of V=0");
    assert_eq!(q.state(hog), Some(FlowState::Throttled), "hog at S=2 > V+T");
    let third = q.dispatch(secs(0.0)).unwrap();
    assert_eq!(
        third.item, 100,
        "light must be served before hog runs further ahead"
    );
    assert_eq!(
        q.virtual_time(),
        2.0,
        "V moves to hog's S once light drained"
    );
}

#[test]
fn resident_flows_preferred_among_eligible() {
    let mut q = MqfqQueue::new(fixed(10.0, 1.0, Selection::StickyResident)).unwrap();
    let cold = q.flow("cold");
    let hot = q.flow("hot");
    q.enqueue(cold, "c", secs(0.0)).unwrap();
    q.enqueue(hot, "h", secs(0.5)).unwrap();
    assert_eq!(q.peek(), Some(cold));
    q.set_resident(hot, true).unwrap();
    assert_eq!(q.peek(), Some(hot));
    assert_eq!(q.dispatch(secs(1.0)).unwrap().item, "h");
    // Residency no longer matters once the resident flow is beyond T.
    let mut q = MqfqQueue::new(fixed(0.5, 1.0, Selection::StickyResident)).unwrap();
    let cold = q.flow("cold");
    let hot = q.flow("hot");
    q.set_resident(hot, true).unwrap();
    q.enqueue(hot, "h0", secs(0.0)).unwrap();
    q.enqueue(hot, "h1", secs(0.0)).unwrap();
    q.enqueue(cold, "c", secs(0.0)).unwrap();
    assert_eq!(q.dispatch(secs(0.0)).unwrap().item, "h0");
    assert_eq!(
        q.dispatch(secs(0.0)).unwrap().item,
        "c",
        "hot at S=1 > V+0.5"
    );
}

#[test]
fn sticky_ttl_then_inactive_with_events() {
    let mut q = MqfqQueue::new(fixed(5.0, 2.0, Selection::StickyResident)).unwrap();
    let f = q.flow("f");
    assert_eq!(q.state(f), Some(FlowState::Inactive));
    q.enqueue(f, (), secs(0.0)).unwrap();
    assert_eq!(q.drain_events(), vec![FlowEvent::Activated(f)]);
    let d = q.dispatch(secs(0.0)).unwrap();
    q.complete(&d.ticket, Some(1.0), secs(1.0)).unwrap();
    q.tick(secs(2.9));
    assert_eq!(
        q.state(f),
        Some(FlowState::Active),
        "within TTL after last service"
    );
    assert!(q.drain_events().is_empty());
    // An arrival inside the TTL keeps it Active: no second activation.
    q.enqueue(f, (), secs(2.95)).unwrap();
    assert!(q.drain_events().is_empty());
    let d = q.dispatch(secs(3.0)).unwrap();
    q.complete(&d.ticket, Some(1.0), secs(4.0)).unwrap();
    assert_eq!(q.next_expiry(), Some(secs(6.0)));
    q.tick(secs(6.0));
    assert_eq!(q.state(f), Some(FlowState::Inactive));
    assert_eq!(q.drain_events(), vec![FlowEvent::Deactivated(f)]);
}

#[test]
fn double_completion_is_rejected_and_changes_nothing() {
    let mut q = MqfqQueue::new(QueueConfig::default()).unwrap();
    let f = q.flow("f");
    q.enqueue(f, (), secs(0.0)).unwrap();
    let d = q.dispatch(secs(0.0)).unwrap();
    q.complete(&d.ticket, Some(0.3), secs(0.3)).unwrap();
    let before = q.snapshot(f).unwrap();
    assert_eq!(
        q.complete(&d.ticket, Some(0.3), secs(0.4)),
        Err(QueueError::UnknownTicket(d.ticket.id))
    );
    assert_eq!(q.snapshot(f).unwrap(), before);
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn measured_service_corrects_the_charge() {
    let mut q = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
    let f = q.flow("f");
    for _ in 0..2 {
        q.enqueue(f, (), secs(0.0)).unwrap();
    }
    let d = q.dispatch(secs(0.0)).unwrap();
    assert_eq!(d.ticket.charge, 1.0, "fallback charge while unknown");
    assert_eq!(q.snapshot(f).unwrap().start, 1.0);
    // It really took 4 s (a cold start, say): the flow pays 3 more.
    q.complete(&d.ticket, Some(4.0), secs(4.0)).unwrap();
    let s = q.snapshot(f).unwrap();
    assert_eq!((s.start, s.finish), (4.0, 4.0));
    let d = q.dispatch(secs(4.0)).unwrap();
    assert_eq!(d.ticket.charge, 4.0, "EWMA now knows the service time");
    // Without correction the tags keep the estimate.
    let mut cfg = fixed(100.0, 1.0, Selection::LowestStart);
    cfg.charge_correction = false;
    let mut q = MqfqQueue::new(cfg).unwrap();
    let f = q.flow("f");
    q.enqueue(f, (), secs(0.0)).unwrap();
    q.enqueue(f, (), secs(0.0)).unwrap();
    let d = q.dispatch(secs(0.0)).unwrap();
    q.complete(&d.ticket, Some(4.0), secs(4.0)).unwrap();
    assert_eq!(q.snapshot(f).unwrap().start, 1.0);
}

#[test]
fn correction_never_moves_v_back() {
    let mut q = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
    let a = q.flow("a");
    let b = q.flow("b");
    q.set_charge_hint(b, Some(5.0)).unwrap();
    q.enqueue(a, (), secs(0.0)).unwrap();
    q.enqueue(a, (), secs(0.0)).unwrap();
    q.enqueue(b, (), secs(0.0)).unwrap();
    q.enqueue(b, (), secs(0.0)).unwrap();
    let da = q.dispatch(secs(0.0)).unwrap(); // a: S 0 → 1
    let db = q.dispatch(secs(0.0)).unwrap(); // b: S 0 → 5
    assert_eq!(q.virtual_time(), 1.0);
    q.complete(&db.ticket, Some(0.0), secs(0.1)).unwrap();
    // b's head would move to 0 < V: clamped at V.
    assert_eq!(q.snapshot(b).unwrap().start, 1.0);
    assert_eq!(q.virtual_time(), 1.0);
    q.complete(&da.ticket, Some(1.0), secs(1.0)).unwrap();
}

#[test]
fn weights_scale_virtual_charges() {
    let mut q = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
    let heavy = q.flow("heavy");
    q.set_weight(heavy, 4.0).unwrap();
    q.set_charge_hint(heavy, Some(2.0)).unwrap();
    q.enqueue(heavy, (), secs(0.0)).unwrap();
    let d = q.dispatch(secs(0.0)).unwrap();
    assert_eq!(d.ticket.finish - d.ticket.start, 0.5);
    assert_eq!(
        q.set_weight(heavy, 0.0).unwrap_err(),
        QueueError::Config(ConfigError {
            knob: "weight",
            value: "0".into(),
            reason: "must be a finite number > 0"
        })
    );
    assert!(matches!(
        q.set_weight(FlowId(99), 1.0),
        Err(QueueError::UnknownFlow(_))
    ));
}

#[test]
fn withdraw_removes_a_waiting_item() {
    let mut q = MqfqQueue::new(QueueConfig::default()).unwrap();
    let f = q.flow("f");
    q.enqueue(f, 1, secs(0.0)).unwrap();
    q.enqueue(f, 2, secs(0.0)).unwrap();
    assert_eq!(q.withdraw(f, |x| *x == 2), Some(2));
    assert_eq!(q.withdraw(f, |x| *x == 2), None);
    assert_eq!(q.withdraw(f, |x| *x == 1), Some(1));
    assert_eq!(q.queued(), 0);
    assert!(q.dispatch(secs(0.0)).is_none());
    q.tick(secs(0.0));
    assert_eq!(q.state(f), Some(FlowState::Inactive));
}

#[test]
fn tau_multiple_overrun_tracks_measured_service() {
    let mut q: MqfqQueue<()> = MqfqQueue::new(Profile::Balanced.queue()).unwrap();
    assert_eq!(q.overrun(), 5.0 * 0.5, "fallback charge before any sample");
    let f = q.flow("f");
    q.enqueue(f, (), secs(0.0)).unwrap();
    let d = q.dispatch(secs(0.0)).unwrap();
    q.complete(&d.ticket, Some(2.0), secs(2.0)).unwrap();
    assert_eq!(q.overrun(), 10.0);
    assert_eq!(q.tau_avg(), Some(2.0));
}

#[test]
fn iat_ttl_rule() {
    let mut cfg = fixed(5.0, 1.0, Selection::Sticky);
    cfg.ttl = StickyTtl::IatMultiple(3.0);
    cfg.fallback_ttl_s = 7.0;
    let mut q = MqfqQueue::new(cfg).unwrap();
    let f = q.flow("f");
    assert_eq!(q.ttl_of(f), 7.0);
    q.enqueue(f, (), secs(0.0)).unwrap();
    q.enqueue(f, (), secs(2.0)).unwrap();
    assert_eq!(q.ttl_of(f), 6.0);
}

#[test]
fn adopted_invocations_are_charged_and_completed_like_dispatched_ones() {
    let mut q = MqfqQueue::new(fixed(100.0, 5.0, Selection::LowestStart)).unwrap();
    let a = q.flow("a");
    let b = q.flow("b");
    // `a` was running when the daemon restarted: adopting it activates the flow and charges it.
    let t = q.adopt(a, secs(0.0)).unwrap();
    assert_eq!(q.drain_events(), vec![FlowEvent::Activated(a)]);
    assert_eq!(q.in_flight(), 1);
    assert_eq!(q.state(a), Some(FlowState::Active));
    assert_eq!((t.start, t.finish), (0.0, 1.0));
    // A new arrival of `a` starts after the adopted charge, so `b` goes first.
    q.enqueue(b, "b1", secs(0.0)).unwrap();
    q.enqueue(a, "a1", secs(0.0)).unwrap();
    assert_eq!(q.dispatch(secs(0.0)).unwrap().item, "b1");
    // Adopting on a backlogged flow pushes its head back by one charge.
    let t2 = q.adopt(a, secs(0.0)).unwrap();
    assert_eq!((t2.start, t2.finish), (1.0, 2.0));
    assert_eq!(q.dispatch(secs(0.0)).unwrap().ticket.start, 2.0);
    q.complete(&t, Some(1.0), secs(1.0)).unwrap();
    q.complete(&t2, Some(1.0), secs(1.0)).unwrap();
    assert_eq!(
        q.complete(&t, None, secs(1.0)).unwrap_err(),
        QueueError::UnknownTicket(t.id)
    );
    assert_eq!(
        q.adopt(FlowId(9), secs(1.0)).unwrap_err(),
        QueueError::UnknownFlow(FlowId(9))
    );
}

#[test]
fn a_running_invocation_is_charged_as_it_runs_and_completes_to_the_same_tags() {
    // Two queues, the same history: one charges the running invocation in steps, the other
    // only at completion; the finish tags agree at the end, and the stepped one is ahead while
    // it runs (its flow yields to others sooner).
    let run = |steps: &[f64]| {
        let mut q = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
        let a = q.flow("a");
        q.set_charge_hint(a, Some(1.0)).unwrap();
        q.enqueue(a, 1, secs(0.0)).unwrap();
        q.enqueue(a, 2, secs(0.0)).unwrap();
        let d = q.dispatch(secs(0.0)).unwrap();
        let mut during = Vec::new();
        for &s in steps {
            q.charge_running(&d.ticket, s).unwrap();
            during.push(q.snapshot(a).unwrap().finish);
        }
        q.complete(&d.ticket, Some(7.5), secs(7.5)).unwrap();
        (
            during,
            q.snapshot(a).unwrap().finish,
            q.snapshot(a).unwrap().start,
        )
    };
    let (during, finish, start) = run(&[2.0, 0.5, 5.0]);
    let (_, finish0, start0) = run(&[]);
    assert!((finish - finish0).abs() < 1e-9, "{finish} vs {finish0}");
    assert!((start - start0).abs() < 1e-9, "{start} vs {start0}");
    // Charged 2 s, then nothing (0.5 < 2), then 5 s: the finish tag follows the service.
    assert_eq!(during, vec![2.0, 2.0, 5.0]);
    // An unknown ticket is an error, not a silent change.
    let mut q: MqfqQueue<u32> = MqfqQueue::new(fixed(100.0, 1.0, Selection::LowestStart)).unwrap();
    let a = q.flow("a");
    q.enqueue(a, 1, secs(0.0)).unwrap();
    let d = q.dispatch(secs(0.0)).unwrap();
    q.complete(&d.ticket, Some(1.0), secs(1.0)).unwrap();
    q.charge_running(&d.ticket, 3.0).unwrap_err();
}

/// FIFO selection serves the oldest item whatever its flow, however far ahead of V its flow
/// is; withdrawing a head (or a flow's only item) keeps the order of the rest.
#[test]
fn fifo_serves_in_arrival_order_across_flows() {
    let mut q = MqfqQueue::new(fixed(0.0, 1.0, Selection::Fifo)).unwrap();
    let hog = q.flow("hog");
    let light = q.flow("light");
    q.set_charge_hint(hog, Some(5.0)).unwrap();
    q.enqueue(hog, "h0", secs(0.0)).unwrap();
    q.enqueue(hog, "h1", secs(0.1)).unwrap();
    q.enqueue(light, "l0", secs(0.2)).unwrap();
    q.enqueue(hog, "h2", secs(0.3)).unwrap();
    q.enqueue(light, "l1", secs(0.4)).unwrap();
    q.enqueue(hog, "h3", secs(0.5)).unwrap();
    let first = q.dispatch(secs(1.0)).unwrap();
    assert_eq!(first.item, "h0");
    // hog is now 5 s ahead of V with T = 0, and still next: FIFO knows no T.
    assert_eq!(q.state(hog), Some(FlowState::Active));
    assert_eq!(q.withdraw(hog, |i| *i == "h1"), Some("h1"));
    assert_eq!(q.withdraw(light, |i| *i == "l1"), Some("l1"));
    let mut order = Vec::new();
    while let Some(d) = q.dispatch(secs(1.0)) {
        order.push(d.item);
    }
    assert_eq!(order, ["l0", "h2", "h3"]);
    assert_eq!(q.queued(), 0);
}

/// Flows that take V on arrival tie with the flow that defines it; the tie goes to the flow
/// served least recently (the lowest finish tag it came back with), not to the lowest index: a
/// light function back from idle is not queued behind every older flow that happens to sit at V.
#[test]
fn equal_start_tags_go_to_the_flow_served_least_recently() {
    for selection in [
        Selection::LowestStart,
        Selection::Sticky,
        Selection::StickyResident,
    ] {
        let mut q = MqfqQueue::new(fixed(0.0, 10.0, selection)).unwrap();
        let a = q.flow("a");
        let z = q.flow("z");
        let c = q.flow("c");
        // c ran 0.1 s, a ran 1 s, z runs on with a second invocation queued.
        for (f, item) in [(c, "c0"), (a, "a0"), (z, "z0"), (z, "z1")] {
            q.enqueue(f, item, secs(0.0)).unwrap();
        }
        let mut tickets = Vec::new();
        for _ in 0..3 {
            let d = q.dispatch(secs(0.0)).unwrap();
            tickets.push((d.item, d.ticket));
        }
        for (item, t) in &tickets {
            let m = if *item == "c0" { 0.1 } else { 1.0 };
            q.complete(t, Some(m), secs(1.0)).unwrap();
        }
        assert!(
            (q.virtual_time() - 1.0).abs() < 1e-9,
            "{}",
            q.virtual_time()
        );
        // a and c come back: both take V = 1.0, as z's next invocation has.
        q.enqueue(a, "a1", secs(1.0)).unwrap();
        q.enqueue(c, "c1", secs(1.0)).unwrap();
        let next = q.dispatch(secs(1.0)).unwrap().item;
        assert_eq!(next, "c1", "{selection:?}");
    }
}
