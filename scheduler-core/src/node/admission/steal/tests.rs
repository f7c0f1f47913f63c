//! Late binding: waiting work moves to a GPU of its own that has a free slot and room, and
//! never to one it may not use or has no room on.

use super::super::testing::{GIB, admit_info, memory_core_on, secs};
use super::super::{Core, Grant, Kind, Record};

fn keys(g: &[Grant]) -> Vec<(String, u32)> {
    g.iter().map(|g| (g.key.to_string(), g.gpu)).collect()
}

/// Two 24 GiB GPUs, one slot each, late binding on, these functions' footprints measured;
/// `a` (function `f`) holds GPU 0 and `b` (function `g`) GPU 1. Returns the core and their
/// leases.
fn a_and_b(footprints: &[(&str, u64)]) -> (Core, u64, u64) {
    let mut core = memory_core_on(&[24, 24], 1, 0.0, 1024);
    core.set_late_binding(true);
    for (function, bytes) in footprints {
        core.set_footprint(function, *bytes, secs(0.0));
    }
    let a = core
        .admit(&admit_info("a", "f", Kind::Burst), secs(0.0))
        .unwrap();
    let b = core
        .admit(&admit_info("b", "g", Kind::Burst), secs(0.0))
        .unwrap();
    assert_eq!(keys(&a), [("ns/a".into(), 0)]);
    assert_eq!(keys(&b), [("ns/b".into(), 1)]);
    (core, a[0].lease, b[0].lease)
}

/// [`a_and_b`], and `c` (on `c_gpus`; empty: any) waits on GPU 0, where it was routed.
fn two_busy_gpus(c_gpus: &[&str]) -> (Core, u64, u64) {
    let (mut core, a, b) = a_and_b(&[]);
    let mut c = admit_info("c", "h", Kind::Burst);
    c.gpus = c_gpus.iter().map(|s| (*s).to_owned()).collect();
    assert!(core.admit(&c, secs(0.1)).unwrap().is_empty());
    (core, a, b)
}

#[test]
fn work_waiting_on_a_busy_gpu_starts_on_the_one_that_frees_first() {
    let (mut core, _, b) = two_busy_gpus(&[]);
    // GPU 1 frees: `c`, queued on GPU 0, moves there and starts now, not after `a`.
    let grants = core.release(b, Some(1.0), "idle", secs(1.0)).unwrap();
    assert_eq!(keys(&grants), [("ns/c".into(), 1)]);
    // Its wait counts from its arrival, not from the move.
    assert_eq!(grants[0].waited_ns, 900_000_000);
    let log = core.drain_log();
    assert!(log.iter().any(|r| matches!(r,
        Record::Move { key, from: 0, to: 1, .. } if key == "ns/c")));
    assert!(log.iter().any(|r| matches!(r,
        Record::Dispatch { key, gpu: 1, waited_ns: 900_000_000, .. } if key == "ns/c")));
    assert_eq!(core.waiting(), 0);
}

#[test]
fn work_bound_to_one_gpu_never_moves() {
    let (mut core, a, b) = two_busy_gpus(&["0"]);
    assert!(
        core.release(b, Some(1.0), "idle", secs(1.0))
            .unwrap()
            .is_empty()
    );
    assert_eq!(core.waiting(), 1);
    let grants = core.release(a, Some(1.0), "idle", secs(2.0)).unwrap();
    assert_eq!(keys(&grants), [("ns/c".into(), 0)]);
}

/// `a` holds GPU 0 and `b` (4 GiB measured) GPU 1; `c` of `function`, routed to GPU 0, waits;
/// then GPU 1 gets a second slot. Returns what that granted.
fn second_slot_beside_b(function: &str, bytes: u64) -> (Core, Vec<Grant>, u64) {
    let (mut core, a, _) = a_and_b(&[("g", 4 * GIB), (function, bytes)]);
    let c = admit_info("c", function, Kind::Burst);
    assert!(core.admit(&c, secs(0.1)).unwrap().is_empty());
    // D is per GPU: a second slot on GPU 1 only.
    core.gpus[1].conc =
        crate::concurrency::ConcurrencyController::new(crate::config::ConcurrencyConfig {
            d_max: 2,
            d_initial: 2.0,
            ..crate::config::ConcurrencyConfig::for_mode(crate::config::GpuMode::Plain, 0.2)
        })
        .unwrap();
    let grants = core.pump_all(secs(0.2));
    (core, grants, a)
}

#[test]
fn work_moves_only_where_its_memory_fits() {
    // 10 GiB beside `b`'s 4 fits GPU 1's 20.4 GiB budget: it moves and starts.
    let (_, grants, _) = second_slot_beside_b("mid", 10 * GIB);
    assert_eq!(keys(&grants), [("ns/c".into(), 1)]);
    // 18 GiB does not: it waits for GPU 0, and starts there when `a` ends.
    let (mut core, grants, a) = second_slot_beside_b("big", 18 * GIB);
    assert!(grants.is_empty());
    assert_eq!(core.waiting(), 1);
    let grants = core.release(a, Some(1.0), "idle", secs(1.0)).unwrap();
    assert_eq!(keys(&grants), [("ns/c".into(), 0)]);
}

#[test]
fn off_by_default_work_stays_where_it_was_routed() {
    let mut core = memory_core_on(&[24, 24], 1, 0.0, 1024);
    let _ = core.admit(&admit_info("a", "f", Kind::Burst), secs(0.0));
    let b = core
        .admit(&admit_info("b", "g", Kind::Burst), secs(0.0))
        .unwrap();
    assert!(
        core.admit(&admit_info("c", "h", Kind::Burst), secs(0.1))
            .unwrap()
            .is_empty()
    );
    assert!(
        core.release(b[0].lease, Some(1.0), "idle", secs(1.0))
            .unwrap()
            .is_empty()
    );
    assert_eq!(core.waiting(), 1);
}

#[test]
fn an_admission_names_at_most_64_gpus() {
    // A waiting admission keeps its GPU names (to move among them): their number is bounded.
    let mut core = memory_core_on(&[24], 1, 0.0, 1024);
    let mut info = admit_info("a", "f", Kind::Burst);
    info.gpus = vec!["0".into(); 65];
    let err = core.admit(&info, secs(0.0)).unwrap_err();
    assert!(
        matches!(err, super::super::CoreError::Invalid { field: "gpus", .. }),
        "{err}"
    );
    info.gpus.truncate(64);
    assert_eq!(core.admit(&info, secs(0.0)).unwrap().len(), 1);
}
