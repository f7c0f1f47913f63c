//! The knobs' defaults, validation and overrides.

use super::*;

#[test]
fn profiles_carry_the_design_numbers() {
    let l = Profile::Light;
    assert_eq!(l.queue().overrun, Overrun::TauMultiple(2.0));
    assert_eq!(l.queue().ttl, StickyTtl::IatMultiple(3.0));
    assert_eq!(l.concurrency(GpuMode::Plain).alpha, 0.1);
    let t = Profile::Throughput;
    assert_eq!(t.queue().overrun, Overrun::TauMultiple(10.0));
    assert_eq!(t.queue().ttl, StickyTtl::IatMultiple(8.0));
    assert_eq!(t.concurrency(GpuMode::Mps).alpha, 0.3);
    assert_eq!(t.concurrency(GpuMode::Mps).d_max, 16);
    assert_eq!(Profile::Balanced.concurrency(GpuMode::Mig).d_max, 1);
    assert_eq!(Profile::Balanced.concurrency(GpuMode::Mig).d_initial, 1.0);
    for p in [Profile::Light, Profile::Balanced, Profile::Throughput] {
        p.queue().validate().unwrap();
        p.concurrency(GpuMode::Plain).validate().unwrap();
    }
    TierConfig::default().validate().unwrap();
}

#[test]
fn bad_values_name_the_knob() {
    let mut q = QueueConfig::default();
    let mut c = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    let o = Overrides {
        concurrency: ConcurrencyKnobs {
            alpha: Some(1.5),
            ..ConcurrencyKnobs::default()
        },
        ..Overrides::default()
    };
    assert_eq!(
        o.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err().knob,
        "alpha"
    );
    let o = Overrides {
        queue: QueueKnobs {
            overrun_s: Some(-1.0),
            ..QueueKnobs::default()
        },
        ..Overrides::default()
    };
    let e = o.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err();
    assert_eq!(e.knob, "overrun_s");
    assert!(e.to_string().contains("overrun_s"), "{e}");
    let o = Overrides {
        queue: QueueKnobs {
            ttl_s: Some(1.0),
            ttl_iat: Some(2.0),
            ..QueueKnobs::default()
        },
        ..Overrides::default()
    };
    assert_eq!(
        o.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err().knob,
        "ttl_s"
    );
    let o = Overrides {
        concurrency: ConcurrencyKnobs {
            d_max: Some(0),
            ..ConcurrencyKnobs::default()
        },
        ..Overrides::default()
    };
    assert_eq!(
        o.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err().knob,
        "d_max"
    );
    assert_eq!("fast".parse::<Profile>().unwrap_err().knob, "profile");
    assert_eq!("vgpu".parse::<GpuMode>().unwrap_err().knob, "mode");
    let bad = TierConfig {
        headroom: 1.0,
        ..TierConfig::default()
    };
    assert_eq!(bad.validate().unwrap_err().knob, "headroom");
}

#[test]
fn overrides_apply() {
    let mut q = QueueConfig::default();
    let mut c = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    Overrides {
        queue: QueueKnobs {
            overrun_s: Some(3.0),
            ttl_s: Some(0.5),
            ..QueueKnobs::default()
        },
        concurrency: ConcurrencyKnobs {
            d_max: Some(4),
            ..ConcurrencyKnobs::default()
        },
        ..Overrides::default()
    }
    .apply(&mut q, &mut c, GpuMode::Plain)
    .unwrap();
    assert_eq!(q.overrun, Overrun::Fixed(3.0));
    assert_eq!(q.ttl, StickyTtl::Fixed(0.5));
    assert_eq!(c.d_max, 4);
}

#[test]
fn a_fixed_d_is_its_own_ceiling_and_law() {
    let mut q = QueueConfig::default();
    let mut c = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    Overrides {
        fixed_d: Some(3),
        ..Overrides::default()
    }
    .apply(&mut q, &mut c, GpuMode::Plain)
    .unwrap();
    assert_eq!((c.law, c.d_max, c.d_initial), (Law::Fixed, 3, 3.0));
    for bad in [
        Overrides {
            fixed_d: Some(0),
            ..Overrides::default()
        },
        Overrides {
            fixed_d: Some(2),
            concurrency: ConcurrencyKnobs {
                d_max: Some(4),
                ..ConcurrencyKnobs::default()
            },
            ..Overrides::default()
        },
        Overrides {
            fixed_d: Some(2),
            law: Some(Law::BusyTime),
            ..Overrides::default()
        },
    ] {
        assert_eq!(
            bad.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err().knob,
            "fixed_d"
        );
    }
    assert_eq!("fixed".parse::<Law>().unwrap_err().knob, "d_law");
    let with_d_initial = Overrides {
        fixed_d: Some(2),
        concurrency: ConcurrencyKnobs {
            d_initial: Some(2.0),
            ..ConcurrencyKnobs::default()
        },
        ..Overrides::default()
    };
    assert_eq!(
        with_d_initial
            .apply(&mut q, &mut c, GpuMode::Plain)
            .unwrap_err()
            .knob,
        "fixed_d"
    );
}

#[test]
fn d_initial_is_checked_as_given_on_whole_gpus_and_clamped_under_mps_and_mig() {
    let o = Overrides {
        concurrency: ConcurrencyKnobs {
            d_initial: Some(12.0),
            ..ConcurrencyKnobs::default()
        },
        ..Overrides::default()
    };
    let mut q = QueueConfig::default();
    let mut plain = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    assert_eq!(
        o.apply(&mut q, &mut plain, GpuMode::Plain)
            .unwrap_err()
            .knob,
        "d_initial"
    );
    let mut mig = ConcurrencyConfig::for_mode(GpuMode::Mig, 0.2);
    o.apply(&mut q, &mut mig, GpuMode::Mig).unwrap();
    assert!(
        (mig.d_initial - 1.0).abs() < f64::EPSILON,
        "{}",
        mig.d_initial
    );
}

/// The overtake bound is 0 (off) or at least 1 (a bound under 1 would serve a call before the
/// work arrival order puts ahead of it); `policy = "fcfs"` has none, and setting one with it is
/// an error, as the short-slot reserve is.
#[test]
fn the_overtake_bound_is_off_or_at_least_one() {
    assert!(QueueConfig::default().overtake_bound >= 1.0);
    for (b, ok) in [
        (0.0, true),
        (1.0, true),
        (2.5, true),
        (0.5, false),
        (-1.0, false),
        (f64::NAN, false),
        (f64::INFINITY, false),
    ] {
        let mut q = QueueConfig::default();
        let mut c = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
        let o = Overrides {
            queue: QueueKnobs {
                overtake_bound: Some(b),
                ..QueueKnobs::default()
            },
            ..Overrides::default()
        };
        match o.apply(&mut q, &mut c, GpuMode::Plain) {
            Ok(()) => assert!(ok, "{b} accepted"),
            Err(e) => {
                assert!(!ok, "{b} refused: {e}");
                assert_eq!(e.knob, "overtake_bound");
            }
        }
    }
    let mut q = QueueConfig::default();
    let mut c = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    let o = Overrides {
        order: Some(GrantOrder::Fcfs),
        ..Overrides::default()
    };
    o.apply(&mut q, &mut c, GpuMode::Plain).unwrap();
    assert_eq!(q.overtake_bound, 0.0);
    for b in [0.5, 1.0] {
        let o = Overrides {
            order: Some(GrantOrder::Fcfs),
            queue: QueueKnobs {
                overtake_bound: Some(b),
                ..QueueKnobs::default()
            },
            ..Overrides::default()
        };
        let e = o.apply(&mut q, &mut c, GpuMode::Plain).unwrap_err();
        assert_eq!(e.knob, "overtake_bound");
    }
}
