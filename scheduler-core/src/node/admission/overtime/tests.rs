use super::super::testing::{GIB, memory_core, secs};
use super::super::*;

fn req(id: &str, function: &str, kind: Kind) -> AdmitInfo {
    AdmitInfo {
        namespace: "ns".into(),
        container_id: id.into(),
        function: function.into(),
        tenant: None,
        tenant_weight: 0.0,
        weight: 0.0,
        gpus: vec![],
        kind,
        shim_pid: 7,
    }
}

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

#[test]
fn however_many_bursts_overstay_the_gpu_runs_at_most_one_more() {
    let mut c = core(2);
    for id in ["hog1", "hog2"] {
        assert_eq!(
            granted(&c.admit(&req(id, "hog", Kind::Burst), secs(0.0)).unwrap()),
            [id]
        );
    }
    for id in ["w1", "w2", "w3"] {
        assert!(
            c.admit(&req(id, id, Kind::Burst), secs(0.5))
                .unwrap()
                .is_empty()
        );
    }
    assert_eq!(c.sample(&[], secs(2.5)).len(), 1);
    assert_eq!(overtime_leases(&mut c).len(), 2);
    assert_eq!(c.limits(0).unwrap().slots, 3);
    // The one let in overstays too: still one more than the limit, no more.
    assert!(c.sample(&[], secs(5.0)).is_empty());
    assert_eq!(overtime_leases(&mut c).len(), 1);
    assert_eq!(c.leases().count(), 3);
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
