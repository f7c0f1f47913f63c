//! Placement at the node: GPU health over time, and the node's choices as it probes, places
//! and learns (split from `tests.rs`: features and fitness).

use super::models::{builtin, lookup};
use super::*;
use crate::time::Time;

const T0: Time = Time::ZERO;
use super::tests::{FITNESS_ONLY, core_gpu, gpu, known, measured, pick};

#[test]
fn health_moves_through_failed_and_overloaded_and_back() {
    let cfg = HealthConfig {
        overload_utilization: 0.95,
        overload_samples: 3,
        recover_samples: 2,
        xid_recover_samples: 4,
    };
    let mut h = HealthTracker::default();
    let busy = HealthSample {
        utilization: Some(1.0),
        error: false,
        ..HealthSample::default()
    };
    let calm = HealthSample {
        utilization: Some(0.5),
        error: false,
        ..HealthSample::default()
    };
    assert_eq!(h.observe(busy, &cfg), None);
    assert_eq!(h.observe(busy, &cfg), None);
    assert_eq!(
        h.observe(busy, &cfg),
        Some((Health::Healthy, Health::Overloaded))
    );
    assert_eq!(h.observe(calm, &cfg), None);
    assert_eq!(
        h.observe(calm, &cfg),
        Some((Health::Overloaded, Health::Healthy))
    );
    let err = HealthSample {
        utilization: None,
        error: true,
        ..HealthSample::default()
    };
    assert_eq!(
        h.observe(err, &cfg),
        Some((Health::Healthy, Health::Failed))
    );
    assert_eq!(h.observe(calm, &cfg), None);
    assert_eq!(h.observe(err, &cfg), None, "an error restarts recovery");
    assert_eq!(h.observe(calm, &cfg), None);
    assert_eq!(
        h.observe(calm, &cfg),
        Some((Health::Failed, Health::Healthy))
    );
    assert_eq!(h.errors(), 2);
}

#[test]
fn the_node_probes_new_functions_then_places_them_by_fitness_and_avoids_failed_gpus() {
    let mut p = Placement::new(PlacementConfig::default()).unwrap();
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA H100 80GB HBM3", 1, 0.5),
    ];
    let none = Near::default();
    // New: probed on the idle GPU.
    let c = p
        .choose(&gpus, &[], &[0, 1], "bert", &none, 600, T0)
        .unwrap();
    assert_eq!((c.gpu, c.reason), (0, "probe"));
    measured(&mut p, "bert", 3000.0);
    // Known, compute-bound and long: the H100's free half (33.5 TFLOPS) beats the idle A30.
    let c = p
        .choose(&gpus, &[], &[0, 1], "bert", &none, 600, T0)
        .unwrap();
    assert_eq!((c.gpu, c.reason), (1, "fitness"), "{c:?}");
    // Only the candidates the container was given count.
    assert_eq!(
        p.choose(&gpus, &[], &[0], "bert", &none, 600, T0)
            .unwrap()
            .gpu,
        0
    );
    // GPU 1 fails: avoided until it recovers.
    let err = HealthSample {
        utilization: None,
        error: true,
        ..HealthSample::default()
    };
    assert_eq!(
        p.observe_gpu(1, err),
        Some((Health::Healthy, Health::Failed))
    );
    assert_eq!(
        p.choose(&gpus, &[], &[0, 1], "bert", &none, 600, T0)
            .unwrap()
            .gpu,
        0
    );
    assert_eq!(
        p.choose(&gpus, &[], &[1], "bert", &none, 600, T0),
        Err(PlacementError::NoUsableGpu)
    );
    assert_eq!(
        p.choose(&gpus, &[], &[9], "bert", &none, 600, T0),
        Err(PlacementError::NoUsableGpu),
        "a GPU the core does not know is no candidate"
    );
}

/// Creates in a burst: each placement counts on its GPU until the container's Start shows in
/// the queue (or the hold passes), so two new functions placed at once are spread.
#[test]
fn placements_made_moments_ago_count_as_queued_work() {
    let mut p = Placement::new(PlacementConfig::default()).unwrap();
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA A30", 0, 0.0),
    ];
    let none = Near::default();
    let first = p
        .choose(&gpus, &[], &[0, 1], "a", &none, 600, T0)
        .unwrap()
        .gpu;
    p.placed(first, T0);
    let second = p
        .choose(&gpus, &[], &[0, 1], "b", &none, 600, T0)
        .unwrap()
        .gpu;
    assert_ne!(first, second, "the second Create sees the first");
    p.placed(second, T0);
    // After the hold, only the core's queue counts again.
    let later = Time::from_secs_f64(30.0);
    assert_eq!(
        p.choose(&gpus, &[], &[0, 1], "c", &none, 600, later)
            .unwrap()
            .gpu,
        0
    );
    // A storm of placements is bounded.
    for i in 0..5000 {
        p.placed(i % 2, later);
    }
    // The last 1024 kept, half on each GPU: a tie, broken by index.
    assert_eq!(
        p.choose(&gpus, &[], &[0, 1], "d", &none, 600, later)
            .unwrap()
            .gpu,
        0
    );
    // Two more on GPU 0 push out the oldest two (one each): 513 against 511.
    p.placed(0, later);
    p.placed(0, later);
    assert_eq!(
        p.choose(&gpus, &[], &[0, 1], "e", &none, 600, later)
            .unwrap()
            .gpu,
        1
    );
}

/// A known function naming a partner goes where the partner runs, other things equal.
#[test]
fn a_function_goes_next_to_the_partner_it_names() {
    let mut p = Placement::new(PlacementConfig::default()).unwrap();
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA A30", 0, 0.0),
    ];
    measured(&mut p, "etl", 3000.0);
    let alone = p
        .choose(&gpus, &[], &[0, 1], "etl", &Near::default(), 600, T0)
        .unwrap();
    assert_eq!(alone.gpu, 0, "a tie, broken by index");
    let near = Near {
        partners: [1].into(),
        ..Near::default()
    };
    let c = p
        .choose(&gpus, &[], &[0, 1], "etl", &near, 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 1, "{c:?}");
    assert!(c.breakdown.affinity > 0.0);
}

#[test]
fn busy_time_alone_never_makes_a_gpu_overloaded() {
    let cfg = HealthConfig {
        overload_utilization: 0.9,
        overload_samples: 1,
        recover_samples: 1,
        ..HealthConfig::default()
    };
    let mut h = HealthTracker::default();
    let unmeasured = HealthSample {
        utilization: None,
        error: false,
        ..HealthSample::default()
    };
    for _ in 0..10 {
        assert_eq!(h.observe(unmeasured, &cfg), None);
    }
    assert_eq!(h.state(), Health::Healthy);
}

#[test]
fn an_operators_model_row_overrides_the_builtin_one() {
    let mut table = vec![GpuModel::new("A30", 1.0, 1.0, 1.0)];
    table.extend(builtin());
    assert_eq!(lookup(&table, "NVIDIA A30").tflops, 1.0);
}

#[test]
fn a_queue_on_a_faster_gpu_weighs_less() {
    let queue_only = Weights {
        queue: 1.0,
        fitness: 0.0,
        ..FITNESS_ONLY
    };
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    node[0].queue = 2;
    node[1].queue = 4;
    // Two rounds ahead on a GPU 6.5× faster (3 / 67) finish before one round on the A30 (2 / 10.3).
    let c = pick(&node, known(Bound::Compute, Length::Long), &queue_only);
    assert_eq!(c.gpu, 1, "{c:?}");
    assert!(
        (c.breakdown.queue - 1.0).abs() < 1e-12,
        "the soonest scores 1"
    );
    node[1].queue = 40;
    assert_eq!(
        pick(&node, known(Bound::Compute, Length::Long), &queue_only).gpu,
        0
    );
}

#[test]
fn an_xid_holds_a_gpu_failed_longer_than_a_read_error() {
    let cfg = HealthConfig {
        recover_samples: 2,
        xid_recover_samples: 5,
        ..HealthConfig::default()
    };
    let calm = HealthSample {
        utilization: Some(0.3),
        ..HealthSample::default()
    };
    let xid = HealthSample { xid: true, ..calm };
    let mut h = HealthTracker::default();
    assert_eq!(
        h.observe(xid, &cfg),
        Some((Health::Healthy, Health::Failed))
    );
    for _ in 0..4 {
        assert_eq!(h.observe(calm, &cfg), None, "back before its Xid hold");
    }
    assert_eq!(
        h.observe(calm, &cfg),
        Some((Health::Failed, Health::Healthy))
    );
    // The hold ends with the recovery: a later read error needs only `recover_samples`.
    let err = HealthSample {
        error: true,
        ..HealthSample::default()
    };
    h.observe(err, &cfg);
    h.observe(calm, &cfg);
    assert_eq!(
        h.observe(calm, &cfg),
        Some((Health::Failed, Health::Healthy))
    );
}

#[test]
fn a_gpus_load_variation_and_power_draw_reach_the_choice() {
    let mut p = Placement::new(PlacementConfig::default()).unwrap();
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA A30", 0, 0.0),
    ];
    // GPU 0's load swings between idle and full; GPU 1's stays at 30 %. GPU 0 draws 90 % of
    // its power limit, GPU 1 20 %.
    for i in 0..40 {
        let swing = if i % 2 == 0 { 0.0 } else { 1.0 };
        p.observe_gpu(
            0,
            HealthSample {
                busy: Some(swing),
                power: Some(0.9),
                ..HealthSample::default()
            },
        );
        p.observe_gpu(
            1,
            HealthSample {
                busy: Some(0.3),
                power: Some(0.2),
                ..HealthSample::default()
            },
        );
    }
    // Bad readings change nothing.
    p.observe_gpu(
        1,
        HealthSample {
            busy: Some(f64::NAN),
            power: Some(7.0),
            ..HealthSample::default()
        },
    );
    // A long function is spread to the stable GPU; off peak (3 am), the energy term prefers
    // the one drawing less.
    measured(&mut p, "train", 5000.0);
    let c = p
        .choose(&gpus, &[], &[0, 1], "train", &Near::default(), 180, T0)
        .unwrap();
    assert_eq!(c.gpu, 1, "{c:?}");
    let c0 = p
        .choose(&gpus, &[], &[0], "train", &Near::default(), 180, T0)
        .unwrap();
    assert!(c.breakdown.balance > c0.breakdown.balance, "{c:?} {c0:?}");
    assert!(c.breakdown.energy > c0.breakdown.energy, "{c:?} {c0:?}");
}

#[test]
fn a_gpu_whose_slots_are_taken_has_no_room_however_idle_its_sms_look() {
    let only_fitness = WeightSchedule {
        peak: FITNESS_ONLY,
        off_peak: FITNESS_ONLY,
        ..WeightSchedule::default()
    };
    let mut p = Placement::new(PlacementConfig {
        schedule: only_fitness,
        ..PlacementConfig::default()
    })
    .unwrap();
    measured(&mut p, "train", 5000.0);
    // GPU 0 runs its limit (2) of light work: SM activity 10 %. GPU 1 runs one heavier run
    // (SM activity 50 %) with a slot free.
    let mut gpus = [
        core_gpu(0, "NVIDIA A30", 2, 1.0),
        core_gpu(1, "NVIDIA A30", 1, 1.0),
    ];
    gpus[0].reading.sm_activity = Some(0.1);
    gpus[1].reading.sm_activity = Some(0.5);
    let c = p
        .choose(&gpus, &[], &[0, 1], "train", &Near::default(), 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 1, "{c:?}");
    // With a slot free on GPU 0 too, its idle SMs win.
    gpus[0].running = 1;
    let c = p
        .choose(&gpus, &[], &[0, 1], "train", &Near::default(), 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 0, "{c:?}");
}
