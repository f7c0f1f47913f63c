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
    // 20 ms on the A30 where its memory is, 4 ms on the H100.
    let mut node = vec![
        gpu(0, "NVIDIA A30", 0.020, 0.0),
        gpu(1, "NVIDIA H100 80GB HBM3", 0.004, 0.0),
    ];
    assert_eq!(
        pick(&node, Bound::Compute, Length::Short),
        1,
        "resident on both: the faster"
    );
    // Its memory on the host there (a 170 ms restore) or no container at all (a cold start):
    // the 16 ms it would gain are not worth it.
    for start in [0.17, 3.0] {
        node[1].start_s = start;
        node[1].resident = false;
        assert_eq!(
            pick(&node, Bound::Compute, Length::Short),
            0,
            "{start} s to start on the H100"
        );
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

#[test]
fn a_probing_function_runs_where_its_measurement_is_clean() {
    let mut node: Vec<GpuView> = [(0, "NVIDIA A30"), (1, "NVIDIA A30"), (2, "NVIDIA H100")]
        .into_iter()
        .map(|(i, name)| GpuView {
            work_s: None,
            limit: 2,
            ..gpu(i, name, 1.0, 0.0)
        })
        .collect();
    node[0].queue = 2;
    node[2].utilization = 0.6;
    let need = Need {
        class: Class::Probing { runs_left: 3 },
        features: None,
    };
    // GPU 0 has no free slot, the H100 is more than half busy: GPU 1.
    let c = choose(&node, &need, &Weights::default(), &[]).unwrap();
    assert_eq!((c.gpu, c.reason), (1, "probe"));
    // The operator's probe GPUs come first when one is a candidate.
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[2]).unwrap().gpu,
        2
    );
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[7]).unwrap().gpu,
        1
    );
    // Less than half busy with a slot free, the H100 is clean too, and the fastest.
    node[2].utilization = 0.4;
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[]).unwrap().gpu,
        2
    );
    // Among clean ones, an idle container ready there beats a faster model.
    node[2].start_s = 3.0;
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[]).unwrap().gpu,
        1
    );
    // None clean: the least busy.
    node[1].utilization = 0.9;
    node[2].utilization = 0.7;
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[]).unwrap().gpu,
        2
    );
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
