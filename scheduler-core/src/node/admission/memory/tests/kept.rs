//! Room kept for the other flows' memory against a flow's second lease (§1a⁵ of
//! docs/PERFORMANCE.md): which flows keep room, where, and until when.

use super::*;

/// `a` (6 GiB) ran once and lingers, its memory resident; `big` (8 GiB) holds one lease.
fn big_running_beside_resident_a() -> Core {
    let mut c = core(4, 0.0);
    c.set_footprint("a", 6 * GIB, secs(0.0));
    c.set_footprint("big", 8 * GIB, secs(0.0));
    c.set_footprint("other", 8 * GIB, secs(0.0));
    let g = c.admit(&req("a1", "a"), secs(0.0)).unwrap();
    c.release(g[0].lease, Some(0.05), "idle", secs(0.05))
        .unwrap();
    assert!(
        c.set_residency("a", true, 0.0, secs(0.05))
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        keys(&c.admit(&req("b1", "big"), secs(0.1)).unwrap()),
        ["ns/b1"]
    );
    c
}

#[test]
fn a_flow_already_running_leaves_room_for_the_other_active_flows_resident_memory() {
    let mut c = big_running_beside_resident_a();
    // 8 + 8 GiB fit the 20.4 GiB budget, but not beside `a`'s resident 6: a second lease of
    // `big` would have the pool evict the container `a` is about to use.
    assert!(c.admit(&req("b2", "big"), secs(0.2)).unwrap().is_empty());
    let l = c.limits(0).unwrap();
    assert!(l.memory_bound && l.queued == 1, "{l:?}");
    // Kept: `a`'s 6 (`big` holds a lease and has nothing resident: none for it).
    let m = c.memory_view(0).unwrap();
    assert!(m.blocked && m.kept == 6 * GIB, "{m:?}");
    // A flow's first lease is never held back for the others' residency.
    assert_eq!(
        keys(&c.admit(&req("o1", "other"), secs(0.3)).unwrap()),
        ["ns/o1"]
    );
    let o1 = c.lease_of(&"ns/o1".parse().unwrap()).unwrap();
    assert!(
        c.release(o1, Some(0.1), "idle", secs(0.4))
            .unwrap()
            .is_empty()
    );
    // `a`'s memory evicted: nothing is kept for it any more, and `big`'s call goes at once.
    assert_eq!(
        keys(&c.set_residency("a", false, 0.5, secs(0.5)).unwrap()),
        ["ns/b2"]
    );
    assert_eq!(c.memory_view(0).unwrap().kept, 0);
}

#[test]
fn the_room_kept_for_a_resident_flow_ends_with_its_sticky_ttl() {
    let mut c = big_running_beside_resident_a();
    assert!(c.admit(&req("b2", "big"), secs(0.2)).unwrap().is_empty());
    // `a` lingers for its 1 s TTL from 0.05 s; Inactive after it, its memory is the pool's to
    // evict again.
    assert!(c.sample(&[], secs(0.9)).is_empty());
    assert_eq!(keys(&c.sample(&[], secs(1.2))), ["ns/b2"]);
}

#[test]
fn a_flow_s_own_resident_memory_is_not_kept_from_it() {
    let mut c = big_running_beside_resident_a();
    // `big`'s own idle container is what its second lease runs in: only `a`'s room counts
    // (8 + 8 + 6 > 20.4 still), so with `a` gone it is granted.
    c.set_residency("big", true, 0.0, secs(0.2)).unwrap();
    assert!(c.admit(&req("b2", "big"), secs(0.2)).unwrap().is_empty());
    assert_eq!(
        keys(&c.set_residency("a", false, 0.5, secs(0.3)).unwrap()),
        ["ns/b2"]
    );
}

#[test]
fn the_short_flow_whose_room_is_kept_counts_once_when_its_memory_is_resident() {
    // Short flows: charged at most 0.1 s; `s` (4 GiB) ran for 0.05 s and is resident.
    let mut c = core(4, 0.1);
    c.set_footprint("s", 4 * GIB, secs(0.0));
    c.set_footprint("big", 8 * GIB, secs(0.0));
    let g = c.admit(&req("s0", "s"), secs(0.0)).unwrap();
    c.release(g[0].lease, Some(0.05), "idle", secs(0.05))
        .unwrap();
    c.set_residency("s", true, 0.0, secs(0.05)).unwrap();
    c.admit(&req("b1", "big"), secs(0.1)).unwrap();
    let m = c.memory_view(0).unwrap();
    assert!(m.reserved == 4 * GIB && m.kept == 4 * GIB, "{m:?}");
    // 8 + 8 + 4 GiB for `s` fit 20.4 GiB; its room and its residency are the same memory.
    assert_eq!(
        keys(&c.admit(&req("b2", "big"), secs(0.1)).unwrap()),
        ["ns/b2"]
    );
}

#[test]
fn a_start_lease_does_not_make_its_function_s_next_call_a_second_lease() {
    let mut c = core(4, 0.0);
    c.set_footprint("a", 6 * GIB, secs(0.0));
    c.set_footprint("big", 8 * GIB, secs(0.0));
    let g = c.admit(&req("a1", "a"), secs(0.0)).unwrap();
    c.release(g[0].lease, Some(0.05), "idle", secs(0.05))
        .unwrap();
    c.set_residency("a", true, 0.0, secs(0.05)).unwrap();
    // A container gated at Start holds its lease for as long as it lives.
    let start = crate::node::admission::testing::admit_info("s1", "big", Kind::Start);
    assert_eq!(keys(&c.admit(&start, secs(0.1)).unwrap()), ["ns/s1"]);
    assert_eq!(
        keys(&c.admit(&req("b1", "big"), secs(0.2)).unwrap()),
        ["ns/b1"]
    );
}

#[test]
fn a_withdrawn_call_of_a_flow_never_served_frees_the_room_kept_for_it_at_once() {
    let mut c = core(2, 0.0);
    c.set_footprint("big", 8 * GIB, secs(0.0));
    c.set_footprint("o", GIB, secs(0.0));
    c.set_footprint("w", 13 * GIB, secs(0.0));
    c.admit(&req("b1", "big"), secs(0.0)).unwrap();
    c.admit(&req("o1", "o"), secs(0.0)).unwrap();
    // Both slots held: `w` and a second `big` call wait; the pool says `w`'s memory is here.
    assert!(c.admit(&req("w1", "w"), secs(0.1)).unwrap().is_empty());
    assert!(c.admit(&req("b2", "big"), secs(0.1)).unwrap().is_empty());
    c.set_residency("w", true, 0.0, secs(0.1)).unwrap();
    // A slot frees: 8 + 13 GiB do not fit, and 8 + 8 + 13 kept for `w` neither.
    let o1 = c.lease_of(&"ns/o1".parse().unwrap()).unwrap();
    assert!(
        c.release(o1, Some(0.1), "idle", secs(0.2))
            .unwrap()
            .is_empty()
    );
    // `w`'s caller goes away: never served here, its flow is Inactive at once.
    let g = c
        .cancel(&"ns/w1".parse().unwrap(), "gone", secs(0.3))
        .unwrap();
    assert_eq!(keys(&g), ["ns/b2"]);
}

#[test]
fn only_memory_resident_on_the_gpu_itself_is_kept_there() {
    let mut c = crate::node::admission::testing::memory_core_on(&[24, 24], 4, 0.0, 4096);
    c.set_footprint("a", 6 * GIB, secs(0.0));
    c.set_footprint("big", 8 * GIB, secs(0.0));
    let mut a = req("a1", "a");
    a.gpus = vec!["0".into()];
    let g = c.admit(&a, secs(0.0)).unwrap();
    c.release(g[0].lease, Some(0.05), "idle", secs(0.05))
        .unwrap();
    // `a` lingers on GPU 0 but its idle container is Hot on GPU 1 only.
    let on_1 = std::collections::BTreeMap::from([(1, (true, 0.0)), (0, (false, 0.2))]);
    assert!(!c.set_residency_by_gpu("a", &on_1).unwrap());
    assert_eq!(c.memory_view(0).unwrap().kept, 0);
    for id in ["b1", "b2"] {
        let mut b = req(id, "big");
        b.gpus = vec!["0".into()];
        assert_eq!(keys(&c.admit(&b, secs(0.1)).unwrap()), [format!("ns/{id}")]);
    }
    // Resident on GPU 0 and then gone from it: memory stopped being resident where `a` lingers.
    let on_0 = std::collections::BTreeMap::from([(0, (true, 0.0))]);
    assert!(!c.set_residency_by_gpu("a", &on_0).unwrap());
    assert_eq!(c.memory_view(0).unwrap().kept, 6 * GIB);
    assert!(
        c.set_residency_by_gpu("a", &std::collections::BTreeMap::new())
            .unwrap()
    );
}

#[test]
fn room_is_kept_for_a_flow_with_calls_waiting_even_where_its_memory_is_gone() {
    // D = 2: `big` (8 GiB) and `h` hold both slots; `w` (13 GiB, nothing of it resident) and a
    // second `big` call wait for a slot.
    let mut c = core(2, 0.0);
    c.set_footprint("big", 8 * GIB, secs(0.0));
    c.set_footprint("h", GIB, secs(0.0));
    c.set_footprint("w", 13 * GIB, secs(0.0));
    c.admit(&req("b1", "big"), secs(0.0)).unwrap();
    c.admit(&req("h1", "h"), secs(0.0)).unwrap();
    assert!(c.admit(&req("w1", "w"), secs(0.1)).unwrap().is_empty());
    assert!(c.admit(&req("b2", "big"), secs(0.1)).unwrap().is_empty());
    let h1 = c.lease_of(&"ns/h1".parse().unwrap()).unwrap();
    assert!(
        c.release(h1, Some(0.1), "idle", secs(0.2))
            .unwrap()
            .is_empty()
    );
    // A slot is free: 8 + 13 GiB do not fit, and `big`'s second lease must leave `w` its 13
    // (8 + 8 alone would fit).
    let q = &c.gpus[0].queue;
    let (big, w) = (q.lookup("big").unwrap(), q.lookup("w").unwrap());
    {
        let fits = c.fit_test(0);
        assert!(!fits(w) && !fits(big));
    }
    assert_eq!(c.memory_view(0).unwrap().kept, 13 * GIB);
    // `big`'s first call ends: `w` runs, and `big`'s waits as a first lease (13 + 8 > 20.4).
    let b1 = c.lease_of(&"ns/b1".parse().unwrap()).unwrap();
    assert_eq!(
        keys(&c.release(b1, Some(1.0), "idle", secs(1.0)).unwrap()),
        ["ns/w1"]
    );
}

#[test]
fn flows_that_each_run_with_nothing_resident_do_not_keep_each_other_to_one_lease() {
    // `a` and `b` (6 GiB each) each hold a lease and have a call waiting; nothing of either is
    // resident. 12 + 6 fit 20.4 GiB: a second lease of one runs (room kept for the other's
    // waiting call would be what its own lease frees).
    let mut c = core(4, 0.0);
    c.set_footprint("a", 6 * GIB, secs(0.0));
    c.set_footprint("b", 6 * GIB, secs(0.0));
    c.set_footprint("h", 8 * GIB, secs(0.0));
    c.admit(&req("h1", "h"), secs(0.0)).unwrap();
    c.admit(&req("a1", "a"), secs(0.0)).unwrap();
    // h: 8, a: 6; b's first lease: 8 + 6 + 6 = 20 fits.
    assert_eq!(
        keys(&c.admit(&req("b1", "b"), secs(0.0)).unwrap()),
        ["ns/b1"]
    );
    assert!(c.admit(&req("a2", "a"), secs(0.1)).unwrap().is_empty());
    assert!(c.admit(&req("b2", "b"), secs(0.1)).unwrap().is_empty());
    // `h` ends: 12 held; a second lease of either needs 18 beside no kept room.
    let h1 = c.lease_of(&"ns/h1".parse().unwrap()).unwrap();
    assert_eq!(
        c.release(h1, Some(0.1), "idle", secs(0.2)).unwrap().len(),
        1
    );
}

#[test]
fn a_throttled_flow_keeps_no_room() {
    let mut c = core(4, 0.0);
    c.set_footprint("b", 2 * GIB, secs(0.0));
    c.set_footprint("c", 19 * GIB, secs(0.0));
    c.admit(&req("b1", "b"), secs(0.0)).unwrap();
    c.set_residency("b", true, 0.0, secs(0.0)).unwrap();
    // `c` does not fit beside `b`'s lease; `b`'s later calls run more than T ahead of it.
    assert!(c.admit(&req("c1", "c"), secs(0.0)).unwrap().is_empty());
    for i in 2..5 {
        c.admit(&req(&format!("b{i}"), "b"), secs(0.0)).unwrap();
    }
    assert_eq!(c.flow_state("b"), Some(crate::FlowState::Throttled));
    // Room is kept for `c` (waiting) only, not for `b`, which the over-run threshold holds back.
    assert_eq!(c.memory_view(0).unwrap().kept, 19 * GIB);
}
