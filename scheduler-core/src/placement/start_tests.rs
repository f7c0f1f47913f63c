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
        node[1].start_s = start;
        node[1].resident = false;
        assert_eq!(
            pick(&node, Bound::Compute, Length::Short),
            0,
            "{start} s to start on the H100"
        );
        node[1].start_s = 0.0;
        node[1].resident = true;
        node[0].start_s = start;
        node[0].resident = false;
        assert_eq!(
            pick(&node, Bound::Compute, Length::Short),
            1,
            "{start} s to start on the A30"
        );
        node[0].start_s = 0.0;
        node[0].resident = true;
    }
    // A long function resident on both takes the H100.
    assert_eq!(pick(&node, Bound::Compute, Length::Long), 1);
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

#[test]
fn a_probing_function_runs_where_it_is_clean_then_readiest_then_gets_the_most_flops() {
    let mut node: Vec<GpuView> = [(0, "NVIDIA A30"), (1, "NVIDIA A30"), (2, "NVIDIA H100")]
        .into_iter()
        .map(|(i, name)| GpuView {
            work_s: None,
            limit: 2,
            ..gpu(i, name, 1.0, 3.0)
        })
        .collect();
    node[0].queue = 2;
    node[2].utilization = 0.6;
    let need = Need {
        class: Class::Probing { runs_left: 3 },
        features: None,
    };
    let probe = |node: &[GpuView], probe_gpus: &[u32]| {
        let c = choose(node, &need, &Weights::default(), probe_gpus).unwrap();
        assert_eq!(c.reason, "probe");
        c.gpu
    };
    // A cold start everywhere. GPU 0 has no free slot, the H100 is more than half busy:
    // GPU 1 is the only clean one.
    assert_eq!(probe(&node, &[]), 1);
    // The operator's probe GPUs come first when one is a candidate.
    assert_eq!(probe(&node, &[2]), 2);
    assert_eq!(probe(&node, &[7]), 1);
    // Less than half busy with a slot free, the H100 is clean too, and the fastest.
    node[2].utilization = 0.4;
    assert_eq!(probe(&node, &[]), 2);
    // With one call running there (of four slots) it still gives the probe more FLOPS than an
    // idle A30: 67 / 2 against 10.3.
    node[2].queue = 1;
    node[2].limit = 4;
    assert_eq!(probe(&node, &[]), 2);
    // Among clean ones, an idle container ready there beats a faster model.
    node[1].start_s = 0.0;
    assert_eq!(probe(&node, &[]), 1);
    // ... but not cleanliness: a container ready on the full GPU 0 does not draw it.
    node[1].start_s = 3.0;
    node[0].start_s = 0.0;
    assert_eq!(probe(&node, &[]), 2);
    // None clean: where it is readiest, then where it gets the largest share of FLOPS.
    node[1].utilization = 0.9;
    node[2].utilization = 0.7;
    assert_eq!(probe(&node, &[]), 0);
    node[0].start_s = 3.0;
    assert_eq!(probe(&node, &[]), 2);
    node[2].queue = 8;
    assert_eq!(probe(&node, &[]), 1);
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
