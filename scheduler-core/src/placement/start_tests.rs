//! Where a function's idle containers are: the time before it could start on each GPU counts
//! in its expected completion there, and decides among clean GPUs where it is probed.

use super::tests::{core_gpu, measured};
use super::*;
use crate::queue::WorkAhead;
use crate::time::Time;

fn gpu(index: u32, name: &str, own_s: f64, start_s: f64) -> GpuView {
    GpuView {
        work_s: Some((0.0, own_s)),
        limit: 4,
        resident: start_s == 0.0,
        start_s,
        ..super::tests::gpu(index, name)
    }
}

fn pick(gpus: &[GpuView], bound: Bound, length: Length) -> u32 {
    let need = Need {
        class: Class::Known {
            bound,
            length,
            stability: Stability::Steady,
        },
        features: None,
    };
    choose(gpus, &need, &Weights::default(), &[]).unwrap().gpu
}

#[test]
fn a_short_function_stays_where_its_memory_is_rather_than_gain_milliseconds_elsewhere() {
    // 20 ms on the A30, 4 ms on the H100.
    let mut node = vec![
        gpu(0, "NVIDIA A30", 0.020, 0.0),
        gpu(1, "NVIDIA H100 80GB HBM3", 0.004, 0.0),
    ];
    assert_eq!(
        pick(&node, Bound::Compute, Length::Short),
        0,
        "resident on both: packed on the A30, the H100 left to work that gains seconds there"
    );
    // Its memory on the host (a 170 ms restore) or no container at all (a cold start) on one
    // of them: it goes where its memory is, whichever GPU that is.
    for start in [0.17, 3.0] {
        for (away, stays) in [(1, 0), (0, 1)] {
            node[away].start_s = start;
            node[away].resident = false;
            assert_eq!(
                pick(&node, Bound::Compute, Length::Short),
                stays,
                "{start} s to start on GPU {away}"
            );
            node[away].start_s = 0.0;
            node[away].resident = true;
        }
    }
    // A long function resident on both takes the H100.
    assert_eq!(pick(&node, Bound::Compute, Length::Long), 1);
}

#[test]
fn a_short_function_leaves_the_fast_gpu_only_while_it_costs_little() {
    // Resident on both; the A30 has no slot free behind `ahead` seconds of work.
    let on = |ahead: f64| {
        let mut node = vec![
            gpu(0, "NVIDIA A30", 0.020, 0.0),
            gpu(1, "NVIDIA H100 80GB HBM3", 0.004, 0.0),
        ];
        node[0].queue = 4;
        node[0].work_s = Some((ahead, 0.020));
        pick(&node, Bound::Compute, Length::Short)
    };
    assert_eq!(on(0.1), 0, "0.1 s more to leave the H100 free");
    assert_eq!(on(2.0), 1, "2 s is too much");
}

#[test]
fn on_like_gpus_a_short_function_does_not_wait_on_the_busy_one() {
    // Two A30s, resident on both: one saturated (no slot free, 0.3 s of work ahead, all its
    // SMs busy and its memory full), one idle. Packing does not mean queueing.
    let mut node = vec![
        gpu(0, "NVIDIA A30", 0.020, 0.0),
        gpu(1, "NVIDIA A30", 0.020, 0.0),
    ];
    node[0].queue = 4;
    node[0].work_s = Some((0.3, 0.020));
    node[0].utilization = 1.0;
    node[0].memory_used = 0.95;
    for bound in [Bound::Compute, Bound::Memory] {
        assert_eq!(pick(&node, bound, Length::Short), 1, "{bound:?}");
    }
}

#[test]
fn a_long_function_pays_a_restore_where_it_gains_seconds() {
    // 4.5 s on the A30 where it is resident, 1.1 s on the H100 after a 0.33 s restore.
    let mut node = vec![
        gpu(0, "NVIDIA A30", 4.5, 0.0),
        gpu(1, "NVIDIA H100 80GB HBM3", 1.1, 0.33),
    ];
    assert_eq!(pick(&node, Bound::Memory, Length::Long), 1);
    // A cold start there costs more than the gain.
    node[1].start_s = 4.0;
    assert_eq!(pick(&node, Bound::Memory, Length::Long), 0);
    // A start every candidate pays is no reason to prefer one: cold everywhere, the faster.
    node[0].start_s = 4.0;
    node[0].resident = false;
    assert_eq!(pick(&node, Bound::Memory, Length::Long), 1);
}

/// Three candidates for a probe: (queue, limit, utilization, start) of an A30, an A30, an H100.
fn probe_on(specs: [(u32, u32, f64, f64); 3], probe_gpus: &[u32]) -> u32 {
    let node: Vec<GpuView> = [(0, "NVIDIA A30"), (1, "NVIDIA A30"), (2, "NVIDIA H100")]
        .into_iter()
        .zip(specs)
        .map(
            |((i, name), (queue, limit, utilization, start_s))| GpuView {
                work_s: None,
                queue,
                limit,
                utilization,
                resident: start_s == 0.0,
                ..gpu(i, name, 1.0, start_s)
            },
        )
        .collect();
    let need = Need {
        class: Class::Probing { runs_left: 3 },
        features: None,
    };
    let c = choose(&node, &need, &Weights::default(), probe_gpus).unwrap();
    assert_eq!(c.reason, "probe");
    c.gpu
}

#[test]
fn a_probing_function_runs_where_it_is_clean_then_readiest_then_gets_the_most_flops() {
    const COLD: f64 = 3.0;
    // GPU 0 has no free slot, the H100 is more than half busy: GPU 1 is the only clean one.
    let base = [(2, 2, 0.0, COLD), (0, 2, 0.0, COLD), (0, 2, 0.6, COLD)];
    assert_eq!(probe_on(base, &[]), 1);
    // The operator's probe GPUs come first when one is a candidate.
    assert_eq!(probe_on(base, &[2]), 2);
    assert_eq!(probe_on(base, &[7]), 1);
    // Clean too, the H100 gives the probe the most FLOPS...
    let clean_h100 = [(2, 2, 0.0, COLD), (0, 2, 0.0, COLD), (0, 2, 0.4, COLD)];
    assert_eq!(probe_on(clean_h100, &[]), 2);
    // ... with one call running there (67 / 2 against 10.3), not with seven (67 / 8).
    let mut s = clean_h100;
    s[2] = (1, 4, 0.4, COLD);
    assert_eq!(probe_on(s, &[]), 2);
    s[2] = (7, 8, 0.4, COLD);
    assert_eq!(probe_on(s, &[]), 1);
    // Among clean ones an idle container ready there beats a faster model; on a GPU with no
    // slot free it does not.
    let mut s = clean_h100;
    s[1].3 = 0.0;
    assert_eq!(probe_on(s, &[]), 1);
    let mut s = clean_h100;
    s[0].3 = 0.0;
    assert_eq!(probe_on(s, &[]), 2);
    // None clean: a slot free first, then readiness, then the share.
    let busy = [(2, 2, 0.0, 0.0), (0, 2, 0.9, COLD), (0, 2, 0.7, COLD)];
    assert_eq!(probe_on(busy, &[]), 2);
    let mut s = busy;
    s[1].3 = 0.0;
    assert_eq!(probe_on(s, &[]), 1);
    // No slot free anywhere: the largest share first (9 / 67 against 3 / 10.3 and 7 / 10.3),
    // a container ready behind a queue notwithstanding; then readiness.
    let full = [(2, 2, 0.9, 0.0), (6, 6, 0.9, 0.0), (8, 8, 0.9, COLD)];
    assert_eq!(probe_on(full, &[]), 2);
    let mut s = full;
    s[2].0 = 40;
    s[2].1 = 40;
    assert_eq!(probe_on(s, &[]), 0);
}

/// The node reads the pool's start costs from `Near`, and prices a GPU it does not list (no
/// idle container there) at the configured cold start.
#[test]
fn the_node_prices_a_gpu_without_an_idle_container_at_the_cold_start() {
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA H100 80GB HBM3", 0, 0.0),
    ];
    let ahead = [
        (
            0,
            WorkAhead {
                own_s: Some(2.0),
                ..WorkAhead::default()
            },
        ),
        (
            1,
            WorkAhead {
                own_s: Some(0.3),
                ..WorkAhead::default()
            },
        ),
    ];
    let placement = |cold_start_s: f64| {
        let mut p = Placement::new(PlacementConfig {
            cold_start_s,
            ..PlacementConfig::default()
        })
        .unwrap();
        measured(&mut p, "f", 2000.0);
        p
    };
    // Its idle container is on the A30; the H100 has none.
    let near = Near {
        resident: [0].into(),
        start_s: [(0, 0.0)].into(),
        ..Near::default()
    };
    let choose = |p: &Placement| {
        p.choose(&gpus, &ahead, &[0, 1], "f", &near, 600, Time::ZERO)
            .unwrap()
            .gpu
    };
    assert_eq!(
        choose(&placement(3.0)),
        0,
        "a 3 s cold start outweighs 1.7 s"
    );
    assert_eq!(choose(&placement(0.5)), 1, "a 0.5 s one does not");
    for bad in [-1.0, f64::NAN, 1e9] {
        let e = Placement::new(PlacementConfig {
            cold_start_s: bad,
            ..PlacementConfig::default()
        })
        .unwrap_err();
        assert_eq!(e.knob, "placement.cold_start_s", "{bad}");
    }
}
