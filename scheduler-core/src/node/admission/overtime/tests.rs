use super::super::testing::{GIB, admit_info as req, memory_core, secs};
use super::super::*;

fn granted(g: &[Grant]) -> Vec<String> {
    g.iter().map(|g| g.key.id().to_owned()).collect()
}

/// A core with D fixed at `d` and a maximum burst hold of 2 s.
fn core(d: u32) -> Core {
    let mut c = memory_core(d, 0.0, 1024);
    c.set_max_burst_hold(Some(2.0)).unwrap();
    c
}

fn overtime_leases(c: &mut Core) -> Vec<u64> {
    c.drain_log()
        .into_iter()
        .filter_map(|r| match r {
            Record::Overtime { lease, .. } => Some(lease),
            _ => None,
        })
        .collect()
}

#[test]
fn a_burst_past_the_maximum_hold_no_longer_keeps_the_next_one_out() {
    let mut c = core(1);
    let hog = c.admit(&req("hog", "hog", Kind::Burst), secs(0.0)).unwrap()[0].lease;
    assert!(
        c.admit(&req("light", "light", Kind::Burst), secs(0.1))
            .unwrap()
            .is_empty()
    );
    assert!(c.sample(&[], secs(1.9)).is_empty());
    assert!(!c.lease(hog).unwrap().overtime);
    c.drain_log();
    // Past the hold: it keeps its slot, and the light burst runs beside it.
    assert_eq!(granted(&c.sample(&[], secs(2.1))), ["light"]);
    assert!(c.lease(hog).unwrap().overtime);
    assert_eq!(overtime_leases(&mut c), [hog]);
    assert_eq!(c.limits(0).unwrap().slots, 2);
    // Marked once.
    c.sample(&[], secs(3.0));
    assert!(overtime_leases(&mut c).is_empty());
    // Once it ends the GPU is back at its limit: a third burst waits for the light one.
    assert!(
        c.admit(&req("third", "third", Kind::Burst), secs(3.1))
            .unwrap()
            .is_empty()
    );
    assert!(
        c.release(hog, Some(3.0), "idle", secs(3.2))
            .unwrap()
            .is_empty()
    );
    assert_eq!(c.limits(0).unwrap().slots, 1);
    let light = c.lease_of(&"ns/light".parse().unwrap()).unwrap();
    assert_eq!(
        granted(&c.release(light, Some(1.0), "idle", secs(3.3)).unwrap()),
        ["third"]
    );
}

/// A flow whose burst overstays does not take the slot that frees, however many of its
/// containers wait (a second endless burst of its own had starved the GPU's other work again);
/// another flow does, and the flow's own work waits for a normal slot.
#[test]
fn a_flow_in_overtime_never_takes_the_slot_it_freed() {
    let mut c = core(1);
    let hog = c
        .admit(&req("hog1", "hog", Kind::Burst), secs(0.0))
        .unwrap()[0]
        .lease;
    assert!(
        c.admit(&req("hog2", "hog", Kind::Burst), secs(0.5))
            .unwrap()
            .is_empty()
    );
    assert!(c.sample(&[], secs(2.1)).is_empty(), "its own second burst");
    assert_eq!(c.limits(0).unwrap().slots, 2);
    assert!(
        c.limits(0).unwrap().memory_bound,
        "no waiting work may take the slot"
    );
    let light = c
        .admit(&req("light", "light", Kind::Burst), secs(2.2))
        .unwrap();
    assert_eq!(granted(&light), ["light"]);
    assert!(
        c.release(light[0].lease, Some(0.1), "idle", secs(2.4))
            .unwrap()
            .is_empty()
    );
    assert!(c.sample(&[], secs(3.0)).is_empty());
    // Once the overstaying burst ends, its flow's next one takes the normal slot.
    assert_eq!(
        granted(&c.release(hog, Some(3.0), "idle", secs(3.1)).unwrap()),
        ["hog2"]
    );
}

/// Another function of the same tenant takes the freed slot (one namespace is one tenant, and
/// its functions must not starve behind a runaway one); several overstaying leases free a slot
/// each, never for their own flow.
#[test]
fn another_flow_of_the_tenant_takes_the_freed_slot_its_own_never() {
    let mut c = core(2);
    let t = |mut r: AdmitInfo| {
        r.tenant = Some("one".into());
        r
    };
    for id in ["a1", "a2"] {
        let got = c.admit(&t(req(id, "hog", Kind::Burst)), secs(0.0)).unwrap();
        assert_eq!(granted(&got), [id]);
    }
    assert!(
        c.admit(&t(req("a3", "hog", Kind::Burst)), secs(0.5))
            .unwrap()
            .is_empty()
    );
    assert!(c.sample(&[], secs(2.5)).is_empty());
    assert_eq!(overtime_leases(&mut c).len(), 2);
    assert_eq!(c.limits(0).unwrap().slots, 4);
    for id in ["b1", "b2"] {
        let got = c.admit(&t(req(id, id, Kind::Burst)), secs(2.6)).unwrap();
        assert_eq!(granted(&got), [id]);
    }
    assert!(c.lease_of(&"ns/a3".parse().unwrap()).is_none());
    assert_eq!(c.leases().count(), 4);
}

#[test]
fn start_and_resume_leases_are_container_lifetimes_never_in_overtime() {
    for kind in [Kind::Start, Kind::Resume] {
        let mut c = core(1);
        let long = c.admit(&req("long", "long", kind), secs(0.0)).unwrap()[0].lease;
        assert!(
            c.admit(&req("next", "next", Kind::Burst), secs(0.1))
                .unwrap()
                .is_empty()
        );
        assert!(c.sample(&[], secs(100.0)).is_empty(), "{kind:?}");
        assert!(!c.lease(long).unwrap().overtime);
        assert!(overtime_leases(&mut c).is_empty());
    }
}

#[test]
fn an_overstaying_burst_still_holds_its_memory() {
    let mut c = core(1);
    c.set_footprint("hog", 16 * GIB, secs(0.0));
    c.set_footprint("big", 8 * GIB, secs(0.0));
    c.set_footprint("small", GIB, secs(0.0));
    c.admit(&req("hog", "hog", Kind::Burst), secs(0.0)).unwrap();
    assert!(
        c.admit(&req("big", "big", Kind::Burst), secs(0.1))
            .unwrap()
            .is_empty()
    );
    // 16 + 8 GiB do not fit the 20.4 GiB budget: the slot stays for memory.
    assert!(c.sample(&[], secs(2.5)).is_empty());
    assert!(c.limits(0).unwrap().memory_bound);
    assert_eq!(
        granted(
            &c.admit(&req("small", "small", Kind::Burst), secs(2.6))
                .unwrap()
        ),
        ["small"]
    );
}

#[test]
fn without_a_maximum_a_burst_keeps_the_queue_for_ever() {
    let mut c = core(1);
    c.set_max_burst_hold(None).unwrap();
    c.admit(&req("hog", "hog", Kind::Burst), secs(0.0)).unwrap();
    assert!(
        c.admit(&req("light", "light", Kind::Burst), secs(0.1))
            .unwrap()
            .is_empty()
    );
    assert!(c.sample(&[], secs(1000.0)).is_empty());
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = c.set_max_burst_hold(Some(bad)).unwrap_err();
        assert!(e.to_string().contains("max_burst_hold_s"), "{e}");
    }
}

/// With the short-slot reserve on (a short flow Active, D under D_max), the reserve does not
/// count overtime leases as long work holding it: an overstaying function's next burst still
/// gets no raised slot (the reserve had counted them, and let it through above them).
#[test]
fn the_short_slot_reserve_does_not_let_an_overstaying_flow_through() {
    let gpu = GpuInfo {
        index: 0,
        uuid: "GPU-0".into(),
        name: "sim".into(),
        mode: crate::GpuMode::Plain,
        memory_total: 24 * GIB,
        mig: vec![],
    };
    let conc = |_| crate::config::ConcurrencyConfig {
        d_max: 8,
        d_initial: 2.0,
        ..crate::config::ConcurrencyConfig::for_mode(crate::GpuMode::Plain, 0.2)
    };
    let mut c = Core::new(vec![gpu], &super::super::testing::qcfg(0.1), conc).unwrap();
    c.set_max_burst_hold(Some(2.0)).unwrap();
    // A short function: one burst of 10 ms.
    let l = c
        .admit(&req("light1", "light", Kind::Burst), secs(0.0))
        .unwrap()[0]
        .lease;
    c.release(l, Some(0.01), "idle", secs(0.05)).unwrap();
    for id in ["a1", "a2"] {
        let got = c.admit(&req(id, "hog", Kind::Burst), secs(0.06)).unwrap();
        assert_eq!(granted(&got), [id]);
    }
    assert!(
        c.admit(&req("a3", "hog", Kind::Burst), secs(0.1))
            .unwrap()
            .is_empty()
    );
    // The light function again, in the reserve's slot, and done: it lingers, Active.
    let got = c
        .admit(&req("light2", "light", Kind::Burst), secs(2.0))
        .unwrap();
    assert_eq!(granted(&got), ["light2"]);
    c.release(got[0].lease, Some(0.01), "idle", secs(2.05))
        .unwrap();
    assert!(c.sample(&[], secs(2.1)).is_empty(), "the hog's third burst");
    assert_eq!(overtime_leases(&mut c).len(), 2);
    assert!(c.lease_of(&"ns/a3".parse().unwrap()).is_none());
    // Another function takes a raised slot.
    let got = c.admit(&req("b", "other", Kind::Burst), secs(2.2)).unwrap();
    assert_eq!(granted(&got), ["b"]);
}
