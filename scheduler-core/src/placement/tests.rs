use super::features::SampleError;
use super::models::{builtin, lookup};
use super::*;
use crate::time::Time;

const T0: Time = Time::ZERO;

fn sample(burst_ms: f64, sm: f64, dram: f64) -> Sample {
    Sample {
        burst_ms,
        sm: Some(sm),
        dram: Some(dram),
        footprint_mib: Some(2048.0),
        transfer_bytes: Some(0.0),
    }
}

/// `function`'s probe runs, compute-bound bursts of `burst_ms`: it is classified after them.
pub(super) fn measured(p: &mut Placement, function: &str, burst_ms: f64) {
    for i in 0..3 {
        p.observe_burst(
            function,
            None,
            &sample(burst_ms, 0.9, 0.1),
            Time::from_secs_f64(f64::from(i)),
        )
        .unwrap();
    }
}

fn feed(f: &mut Features, name: &str, s: &[Sample]) {
    for (i, x) in s.iter().enumerate() {
        let at = Time::from_nanos(u64::try_from(i).unwrap() * 1_000_000_000);
        f.observe(name, x, at).unwrap();
    }
}

#[test]
fn a_function_is_probing_until_its_probe_runs_then_classified() {
    let mut f = Features::new(FeatureConfig::default());
    assert_eq!(f.class("resnet"), Class::Probing { runs_left: 3 });
    feed(&mut f, "resnet", &[sample(40.0, 0.9, 0.2); 2]);
    assert_eq!(f.class("resnet"), Class::Probing { runs_left: 1 });
    feed(&mut f, "resnet", &[sample(40.0, 0.9, 0.2)]);
    assert_eq!(
        f.class("resnet"),
        Class::Known {
            bound: Bound::Compute,
            length: Length::Short,
            stability: Stability::Steady
        }
    );
    // Long, memory-bound, and varying widely from burst to burst.
    let varying: Vec<Sample> = (0..20)
        .map(|i| sample(if i % 2 == 0 { 1500.0 } else { 6000.0 }, 0.3, 0.8))
        .collect();
    feed(&mut f, "stream", &varying);
    assert_eq!(
        f.class("stream"),
        Class::Known {
            bound: Bound::Memory,
            length: Length::Long,
            stability: Stability::Fluctuating
        }
    );
    let g = f.get("stream").unwrap();
    assert!(g.burst_ms.stddev() > 1000.0, "{:?}", g.burst_ms);
    assert!((g.dram.mean() - 0.8).abs() < 1e-9);
}

#[test]
fn a_bad_reading_is_refused_naming_the_field_and_changes_nothing() {
    let mut f = Features::new(FeatureConfig::default());
    for (s, field) in [
        (sample(f64::NAN, 0.5, 0.5), "burst_ms"),
        (sample(10.0, 1.5, 0.5), "sm"),
        (sample(10.0, 0.5, -0.1), "dram"),
    ] {
        assert_eq!(
            f.observe("x", &s, Time::ZERO),
            Err(SampleError::OutOfRange(field))
        );
    }
    assert!(f.is_empty());
}

#[test]
fn a_reading_not_taken_leaves_its_average_alone() {
    let mut f = Features::new(FeatureConfig::default());
    feed(&mut f, "etl", &[sample(40.0, 0.1, 0.8); 3]);
    // Short bursts NVML took no process sample of: only their time is known.
    let unmeasured = Sample {
        burst_ms: 40.0,
        ..Sample::default()
    };
    feed(&mut f, "etl", &[unmeasured; 10]);
    let got = f.get("etl").unwrap();
    assert_eq!(got.runs, 13);
    assert!((got.dram.mean() - 0.8).abs() < 1e-12, "{got:?}");
    assert!((got.footprint_mib.mean() - 2048.0).abs() < 1e-12);
    assert!(matches!(
        f.class("etl"),
        Class::Known {
            bound: Bound::Memory,
            ..
        }
    ));
    // A function never measured by NVML is compute-bound (what its burst time alone says).
    feed(&mut f, "plain", &[unmeasured; 3]);
    assert!(matches!(
        f.class("plain"),
        Class::Known {
            bound: Bound::Compute,
            ..
        }
    ));
}

#[test]
fn the_registry_is_bounded_and_forgets_the_function_seen_least_recently() {
    let mut f = Features::new(FeatureConfig {
        max_functions: 2,
        ..FeatureConfig::default()
    });
    f.observe("a", &sample(1.0, 0.1, 0.1), Time::from_secs_f64(1.0))
        .unwrap();
    f.observe("b", &sample(1.0, 0.1, 0.1), Time::from_secs_f64(2.0))
        .unwrap();
    f.observe("a", &sample(1.0, 0.1, 0.1), Time::from_secs_f64(3.0))
        .unwrap();
    f.observe("c", &sample(1.0, 0.1, 0.1), Time::from_secs_f64(4.0))
        .unwrap();
    assert_eq!(f.len(), 2);
    assert!(f.get("b").is_none(), "b was seen least recently");
    assert!(f.get("a").is_some() && f.get("c").is_some());
}

#[test]
fn feature_and_schedule_knobs_are_checked_by_name() {
    let e = FeatureConfig {
        alpha: 0.0,
        ..FeatureConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.knob, "features.alpha");
    let e = WeightSchedule {
        peak_end_min: 1440,
        ..WeightSchedule::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.knob, "placement.peak_end_min");
    let mut s = WeightSchedule::default();
    s.off_peak.energy = -1.0;
    assert_eq!(s.validate().unwrap_err().knob, "placement.off_peak");
    WeightSchedule::default().validate().unwrap();
    HealthConfig::default().validate().unwrap();
    for m in builtin() {
        m.validate().unwrap();
    }
}

#[test]
fn models_are_looked_up_by_nvml_name_longest_pattern_first() {
    let t = builtin();
    assert_eq!(lookup(&t, "NVIDIA A100-SXM4-40GB").mem_gbps, 1555.0);
    assert_eq!(lookup(&t, "NVIDIA A100-SXM4-80GB").mem_gbps, 2039.0);
    assert_eq!(lookup(&t, "NVIDIA A10G").tflops, 31.2);
    assert_eq!(lookup(&t, "NVIDIA L40S").tflops, 91.6);
    assert_eq!(lookup(&t, "NVIDIA L40").tflops, 90.5);
    assert_eq!(lookup(&t, "NVIDIA L4").tflops, 30.3);
    assert_eq!(lookup(&t, "NVIDIA H100 PCIe").mem_gbps, 2000.0);
    assert_eq!(lookup(&t, "NVIDIA H100 80GB HBM3").mem_gbps, 3350.0);
    assert_eq!(lookup(&t, "Tesla T4").tflops, 8.1);
    assert_eq!(lookup(&t, "mqfq simulated GPU").pattern, "(unknown)");
}

pub(super) fn gpu(index: u32, name: &str) -> GpuView {
    GpuView {
        index,
        model: lookup(&builtin(), name),
        utilization: 0.0,
        utilization_stddev: 0.0,
        memory_used: 0.0,
        queue: 0,
        work_s: None,
        limit: 2,
        power: None,
        health: Health::Healthy,
        resident: false,
        start_s: 0.0,
        partner: false,
    }
}

pub(super) fn known(bound: Bound, length: Length) -> Class {
    Class::Known {
        bound,
        length,
        stability: Stability::Steady,
    }
}

pub(super) fn pick(gpus: &[GpuView], class: Class, w: &Weights) -> Choice {
    choose(
        gpus,
        &Need {
            class,
            features: None,
        },
        w,
        &[],
    )
    .unwrap()
}

pub(super) const FITNESS_ONLY: Weights = Weights {
    fitness: 1.0,
    locality: 0.0,
    queue: 0.0,
    balance: 0.0,
    energy: 0.0,
    affinity: 0.0,
};

#[test]
fn on_a_heterogeneous_node_fitness_follows_free_flops_or_free_bandwidth() {
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    let compute = known(Bound::Compute, Length::Long);
    let memory = known(Bound::Memory, Length::Long);
    assert_eq!(pick(&node, compute, &FITNESS_ONLY).gpu, 1);
    assert_eq!(pick(&node, memory, &FITNESS_ONLY).gpu, 1);
    // The H100 90 % busy: 67 × 0.1 = 6.7 free TFLOPS against the idle A30's 10.3.
    node[1].utilization = 0.9;
    assert_eq!(pick(&node, compute, &FITNESS_ONLY).gpu, 0);
    // Bandwidth does not care about SM load, but about room: 3350 × 0.2 < 933 × 1.
    assert_eq!(pick(&node, memory, &FITNESS_ONLY).gpu, 1);
    node[1].memory_used = 0.8;
    assert_eq!(pick(&node, memory, &FITNESS_ONLY).gpu, 0);
    let c = pick(&node, memory, &FITNESS_ONLY);
    assert!(
        (c.breakdown.fitness - 1.0).abs() < 1e-9,
        "the best is normalized to 1"
    );
    assert_eq!(c.reason, "fitness");
}

#[test]
fn a_memory_bound_function_with_heavy_copies_stays_where_its_memory_is() {
    let mut f = Features::new(FeatureConfig::default());
    for i in 0..5 {
        let s = Sample {
            burst_ms: 10.0,
            sm: Some(0.2),
            dram: Some(0.9),
            footprint_mib: Some(8192.0),
            transfer_bytes: Some(8e9), // 8 GB a burst: 125 ms over a 64 GB/s link, 250 ms at 32 GB/s
        };
        f.observe("etl", &s, Time::from_secs_f64(f64::from(i)))
            .unwrap();
    }
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    node[0].resident = true;
    // Its 10 ms bursts make it short, whose fitness term is its model's speed alone; as a long
    // function, fitness weighs its copies.
    assert!(matches!(
        f.class("etl"),
        Class::Known {
            bound: Bound::Memory,
            length: Length::Short,
            ..
        }
    ));
    let need = Need {
        class: known(Bound::Memory, Length::Long),
        features: f.get("etl"),
    };
    // Without residency it would go to the H100 (3350 GB/s); the copies cost 93 % of a burst
    // there, none on the A30 that holds its memory.
    let c = choose(&node, &need, &FITNESS_ONLY, &[]).unwrap();
    assert_eq!(c.gpu, 0, "{c:?}");
    node[0].resident = false;
    assert_eq!(choose(&node, &need, &FITNESS_ONLY, &[]).unwrap().gpu, 1);
    // As what it is, short, its fitness term packs it onto the slower model either way.
    let short = Need {
        class: f.class("etl"),
        ..need
    };
    for resident in [true, false] {
        node[0].resident = resident;
        assert_eq!(choose(&node, &short, &FITNESS_ONLY, &[]).unwrap().gpu, 0);
    }
}

#[test]
fn peak_and_off_peak_weights_change_the_choice() {
    let s = WeightSchedule {
        peak: Weights {
            energy: 0.0,
            ..FITNESS_ONLY
        },
        off_peak: Weights {
            energy: 3.0,
            ..FITNESS_ONLY
        },
        peak_start_min: 22 * 60,
        peak_end_min: 6 * 60, // wraps past midnight
    };
    assert!(s.is_peak(23 * 60) && s.is_peak(60) && !s.is_peak(12 * 60));
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    node[0].power = Some(0.2);
    node[1].power = Some(0.9);
    let class = known(Bound::Compute, Length::Long);
    assert_eq!(pick(&node, class, s.at(23 * 60)).gpu, 1, "peak: FLOPS");
    assert_eq!(
        pick(&node, class, s.at(12 * 60)).gpu,
        0,
        "off peak: the GPU drawing less"
    );
}

#[test]
fn failed_gpus_are_never_chosen_and_overloaded_ones_only_as_a_last_resort() {
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    node[1].health = Health::Failed;
    let class = known(Bound::Compute, Length::Long);
    assert_eq!(pick(&node, class, &Weights::default()).gpu, 0);
    node[0].health = Health::Overloaded;
    let c = pick(&node, class, &Weights::default());
    assert_eq!((c.gpu, c.reason), (0, "overloaded"));
    node[0].health = Health::Failed;
    let need = Need {
        class,
        features: None,
    };
    assert_eq!(
        choose(&node, &need, &Weights::default(), &[]),
        Err(PlacementError::NoUsableGpu)
    );
    assert_eq!(
        choose(&[], &need, &Weights::default(), &[]),
        Err(PlacementError::NoUsableGpu)
    );
}

#[test]
fn short_functions_pack_long_ones_spread_to_free_and_stable_gpus() {
    let balance = Weights {
        balance: 1.0,
        ..FITNESS_ONLY
    };
    let balance = Weights {
        fitness: 0.0,
        ..balance
    };
    let mut node = vec![
        gpu(0, "NVIDIA A30"),
        gpu(1, "NVIDIA A30"),
        gpu(2, "NVIDIA A30"),
    ];
    node[0].utilization = 0.6;
    node[1].utilization = 0.1;
    node[1].utilization_stddev = 0.2; // free but jumpy
    node[2].utilization = 0.2;
    assert_eq!(
        pick(&node, known(Bound::Compute, Length::Short), &balance).gpu,
        0
    );
    assert_eq!(
        pick(&node, known(Bound::Compute, Length::Long), &balance).gpu,
        2
    );
}

#[test]
fn locality_queue_and_partners_count_with_their_weights() {
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA A30")];
    let class = known(Bound::Compute, Length::Long);
    node[1].resident = true;
    assert_eq!(pick(&node, class, &Weights::default()).gpu, 1);
    node[1].queue = 20;
    node[0].partner = true;
    let c = pick(&node, class, &Weights::default());
    assert_eq!(c.gpu, 0, "{c:?}");
    assert!((c.score - c.breakdown.total()).abs() < 1e-12);
}

#[test]
fn the_work_ahead_on_a_fast_gpu_shares_its_time_whatever_its_limit() {
    let queue_only = Weights {
        fitness: 0.0,
        queue: 1.0,
        ..FITNESS_ONLY
    };
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    let class = known(Bound::Compute, Length::Long);
    let ratio = node[1].model.tflops / node[0].model.tflops;
    assert!(ratio > 2.0, "{ratio}");
    // An idle H100 beats an idle A30.
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
    // With a limit of 8, eight runs ahead on the H100 would be "one round" if co-runners ran
    // at full speed each; they share its time, so once the work ahead outweighs its speed
    // the idle A30 finishes sooner.
    node[1].limit = 8;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "the H100/A30 TFLOPS ratio: > 2 and small"
    )]
    let deeper = ratio.ceil() as u32;
    node[1].queue = deeper;
    let c = pick(&node, class, &queue_only);
    assert_eq!(c.gpu, 0, "{c:?}");
    node[1].queue = deeper - 2;
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
}

#[test]
fn measured_work_ahead_outweighs_counted_runs() {
    let queue_only = Weights {
        fitness: 0.0,
        queue: 1.0,
        ..FITNESS_ONLY
    };
    let class = known(Bound::Compute, Length::Long);
    let mut node = vec![gpu(0, "NVIDIA A30"), gpu(1, "NVIDIA H100 80GB HBM3")];
    // Counted in runs of this function, one queued run on the H100 still looks sooner than
    // an idle A30 (it is more than twice as fast).
    node[1].queue = 1;
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
    // Measured, that one queued invocation is a 20 s job: the A30 finishes this 1 s function
    // first (2.4 s there against 20.4 s).
    node[0].work_s = Some((0.0, 2.4));
    node[1].work_s = Some((20.0, 0.4));
    node[1].limit = 1;
    assert_eq!(pick(&node, class, &queue_only).gpu, 0);
    // Running beside a free slot, the 20 s job only shares the H100 with it: 0.8 s there.
    node[1].limit = 2;
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
    node[1].limit = 1;
    // A short job ahead on the H100: it is sooner again.
    node[1].work_s = Some((0.5, 0.4));
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
    // Seconds are compared only when every candidate has them; else runs are.
    node[0].work_s = None;
    node[1].work_s = Some((20.0, 0.4));
    assert_eq!(pick(&node, class, &queue_only).gpu, 1);
}

#[test]
fn the_node_counts_work_ahead_in_each_gpus_measured_seconds() {
    use crate::queue::WorkAhead;
    let mut p = Placement::new(PlacementConfig::default()).unwrap();
    let gpus = [
        core_gpu(0, "NVIDIA A30", 0, 0.0),
        core_gpu(1, "NVIDIA H100 80GB HBM3", 2, 0.0),
    ];
    measured(&mut p, "bert", 1000.0);
    let none = Near::default();
    // bert measured at 1 s on the A30 only; the H100's two slots hold one 30 s invocation of
    // another function and one of a function not yet measured (counted as one run of bert).
    let ahead = [
        (
            0,
            WorkAhead {
                known_s: 0.0,
                unknown: 0,
                own_s: Some(1.0),
            },
        ),
        (
            1,
            WorkAhead {
                known_s: 30.0,
                unknown: 1,
                own_s: None,
            },
        ),
    ];
    let c = p
        .choose(&gpus, &ahead, &[0, 1], "bert", &none, 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 0, "30 s of work ahead on the H100: {c:?}");
    // With nothing ahead, the H100's speed wins again (bert scaled by the FLOPS ratio there).
    let ahead = [
        (
            0,
            WorkAhead {
                known_s: 0.0,
                unknown: 0,
                own_s: Some(1.0),
            },
        ),
        (1, WorkAhead::default()),
    ];
    let c = p
        .choose(&gpus, &ahead, &[0, 1], "bert", &none, 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 1, "{c:?}");
    // A placement just made there counts as one more run of bert until its Start arrives:
    // enough of them and the A30 is sooner.
    for _ in 0..8 {
        p.placed(1, T0);
    }
    let c = p
        .choose(&gpus, &ahead, &[0, 1], "bert", &none, 600, T0)
        .unwrap();
    assert_eq!(c.gpu, 0, "{c:?}");
}

/// An admission core's view of GPU `index` (24 GiB, D 2) with `running` leases and `busy`.
pub(super) fn core_gpu(
    index: u32,
    name: &str,
    running: u32,
    busy: f64,
) -> crate::node::admission::GpuView {
    crate::node::admission::GpuView {
        info: crate::node::admission::GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: name.into(),
            mode: crate::config::GpuMode::Plain,
            memory_total: 24 << 30,
            mig: Vec::new(),
        },
        d: 2.0,
        limit: 2,
        running,
        reading: crate::concurrency::Reading {
            busy: Some(busy),
            ..Default::default()
        },
        memory_used: 1 << 30,
        virtual_time: 0.0,
        queued: 0,
        memory: crate::node::admission::MemoryView::default(),
    }
}
