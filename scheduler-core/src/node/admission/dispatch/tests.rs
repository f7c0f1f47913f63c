use super::super::testing::{admit_info, qcfg};
use super::super::{Core, Grant, Kind};
use crate::Time;
use crate::config::{ConcurrencyConfig, GpuMode, QueueConfig};
use crate::node::admission::GpuInfo;

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

fn keys(g: &[Grant]) -> Vec<String> {
    g.iter().map(|g| g.key.to_string()).collect()
}

/// One 1 GiB plain GPU, index 0.
fn gpu() -> GpuInfo {
    GpuInfo {
        index: 0,
        uuid: "GPU-0".into(),
        name: "sim".into(),
        mode: GpuMode::Plain,
        memory_total: 1 << 30,
        mig: vec![],
    }
}

/// One GPU with D fixed at its ceiling `d`, the short-slot reserve on (0.5 s), and the overtake
/// bound given.
fn core(d: u32, overtake_bound: f64) -> Core {
    let cfg = QueueConfig {
        overtake_bound,
        ..qcfg(0.5)
    };
    Core::new(vec![gpu()], &cfg, |_| ConcurrencyConfig {
        d_max: d,
        d_initial: f64::from(d),
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap()
}

fn admit(c: &mut Core, id: &str, function: &str, t: f64) -> Vec<String> {
    keys(
        &c.admit(&admit_info(id, function, Kind::Burst), secs(t))
            .unwrap(),
    )
}

/// The reserve keeps one slot for short work above the long work running; a short lease that
/// runs is taken to hold it. Before, every lease counted against the slots under ⌊D⌋, so short
/// leases turning over on all three slots of a D = 3 GPU left a long call no slot at all (it
/// could start only once fewer than two leases of any kind ran): the README demo's fourth 3 s
/// call waited for the light functions to stop arriving.
#[test]
fn short_leases_turning_over_leave_the_slots_under_d_to_the_fair_order() {
    let mut c = core(3, 0.0);
    // "short" is measured short (10 ms) and stays Active.
    let w = c
        .admit(&admit_info("w", "short", Kind::Burst), secs(0.0))
        .unwrap();
    c.release(w[0].lease, Some(0.01), "exit", secs(0.05))
        .unwrap();
    let mut leases = Vec::new();
    for id in ["s0", "s1", "s2"] {
        let g = c
            .admit(&admit_info(id, "short", Kind::Burst), secs(0.1))
            .unwrap();
        assert_eq!(keys(&g), [format!("ns/{id}")]);
        leases.push(g[0].lease);
    }
    assert!(admit(&mut c, "l0", "long", 0.2).is_empty());
    assert!(admit(&mut c, "s3", "short", 0.2).is_empty());
    // Two short leases run: one holds the reserve, one a slot under D; the other slot under D
    // goes by the fair order, to the long flow that has had nothing.
    let g = c.release(leases[0], Some(0.01), "exit", secs(0.3)).unwrap();
    assert_eq!(keys(&g), ["ns/l0"]);
    // Two short leases and a long one hold all three; the short call waits for one of them.
    assert_eq!(c.waiting(), 1);
    let g = c.release(leases[1], Some(0.01), "exit", secs(0.4)).unwrap();
    assert_eq!(keys(&g), ["ns/s3"]);
}

/// A short lease in overtime gives its slot back through the limits already; it is not also
/// taken to hold the reserve's slot, or long work would take every slot and short work would
/// wait behind a full set of long leases.
#[test]
fn a_short_lease_in_overtime_is_not_counted_twice() {
    let mut c = core(3, 0.0);
    c.set_max_burst_hold(Some(2.0)).unwrap();
    for f in ["short", "tiny"] {
        let w = c.admit(&admit_info(f, f, Kind::Burst), secs(0.0)).unwrap();
        c.release(w[0].lease, Some(0.01), "exit", secs(0.05))
            .unwrap();
    }
    let s0 = c
        .admit(&admit_info("s0", "short", Kind::Burst), secs(0.1))
        .unwrap()[0]
        .lease;
    // s0 holds on past the maximum hold: in overtime, its slot handed back.
    c.sample(&[], secs(2.2));
    assert!(c.lease(s0).is_some_and(|l| l.overtime));
    let mut granted = Vec::new();
    for id in ["l0", "l1", "l2", "l3"] {
        granted.extend(admit(&mut c, id, "long", 2.3));
    }
    assert_eq!(granted, ["ns/l0", "ns/l1"]);
    // The slot above them is the reserve's: another short function's call takes it.
    assert_eq!(admit(&mut c, "t0", "tiny", 2.4), ["ns/t0"]);
}

/// Below D_max the reserve adds no slot while the long leases are fewer than D, so a GPU whose
/// leases fill D has nothing free, short lease or not: late binding must not move work onto it
/// and the memory view must not call it held back by memory.
#[test]
fn a_full_gpu_has_no_free_slot_below_d_max() {
    let mut c = Core::new(vec![gpu()], &qcfg(0.5), |_| ConcurrencyConfig {
        d_max: 8,
        d_initial: 2.0,
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap();
    let w = c
        .admit(&admit_info("w", "short", Kind::Burst), secs(0.0))
        .unwrap();
    c.release(w[0].lease, Some(0.01), "exit", secs(0.05))
        .unwrap();
    assert_eq!(admit(&mut c, "s0", "short", 0.1), ["ns/s0"]);
    assert_eq!(admit(&mut c, "l0", "long", 0.1), ["ns/l0"]);
    assert!(admit(&mut c, "l1", "long", 0.1).is_empty());
    let l = c.limits(0).unwrap();
    assert_eq!((l.any, l.slots, l.free), (2, 2, 0), "{l:?}");
}
