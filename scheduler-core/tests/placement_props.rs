//! Property tests of the placement choice: whatever the readings (NaN included), a failed GPU is
//! never chosen, a healthy one is preferred to an overloaded one, a choice exists exactly when a
//! usable candidate does, and its score is finite and the sum of its terms.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use proptest::prelude::*;
use scheduler_core::placement::models::{builtin, lookup};
use scheduler_core::placement::{
    Bound, Class, GpuView, Health, Length, Need, PlacementError, Stability, Weights, choose,
};

fn reading() -> impl Strategy<Value = f64> {
    prop_oneof![8 => 0.0f64..1.0, 1 => Just(f64::NAN), 1 => -1.0f64..3.0]
}

/// Seconds before a call could start: 0, a time, NaN, negative or never.
fn start() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => Just(0.0),
        4 => 0.0f64..10.0,
        1 => Just(f64::NAN),
        1 => -5.0f64..0.0,
        1 => Just(f64::INFINITY),
    ]
}

fn gpu() -> impl Strategy<Value = GpuView> {
    (
        (
            0usize..4,
            reading(),
            reading(),
            reading(),
            0u32..50,
            proptest::option::of(reading()),
        ),
        prop_oneof![
            Just(Health::Healthy),
            Just(Health::Overloaded),
            Just(Health::Failed)
        ],
        any::<bool>(),
        any::<bool>(),
        start(),
    )
        .prop_map(
            |((m, u, sd, mem, q, p), health, resident, partner, start)| GpuView {
                index: 0,
                model: lookup(
                    &builtin(),
                    ["NVIDIA A30", "NVIDIA H100", "Tesla T4", "NVIDIA L4"][m],
                ),
                utilization: u,
                utilization_stddev: sd,
                memory_used: mem,
                queue: q,
                // Measured work on some GPUs, not on others (runs are counted then).
                work_s: (q % 3 == 0).then(|| (f64::from(q) * 0.1, 0.05 + u)),
                limit: q % 4,
                power: p,
                health,
                resident,
                start_s: start,
                partner,
            },
        )
}

fn class() -> impl Strategy<Value = Class> {
    prop_oneof![
        (1u32..5).prop_map(|runs_left| Class::Probing { runs_left }),
        (any::<bool>(), any::<bool>()).prop_map(|(m, s)| Class::Known {
            bound: if m { Bound::Memory } else { Bound::Compute },
            length: if s { Length::Short } else { Length::Long },
            stability: Stability::Steady,
        }),
    ]
}

proptest! {
    #[test]
    fn choices_respect_health_and_stay_finite(
        mut gpus in proptest::collection::vec(gpu(), 0..6),
        class in class(),
        w in (0.0f64..2.0, 0.0f64..2.0, 0.0f64..2.0, 0.0f64..2.0, 0.0f64..2.0, 0.0f64..2.0),
    ) {
        for (i, g) in gpus.iter_mut().enumerate() {
            g.index = u32::try_from(i).unwrap();
        }
        let weights = Weights {
            fitness: w.0, locality: w.1, queue: w.2, balance: w.3, energy: w.4, affinity: w.5,
        };
        let need = Need { class, features: None };
        let any_healthy = gpus.iter().any(|g| g.health == Health::Healthy);
        let any_usable = gpus.iter().any(|g| g.health != Health::Failed);
        match choose(&gpus, &need, &weights, &[]) {
            Ok(c) => {
                let g = &gpus[c.gpu as usize];
                prop_assert_ne!(g.health, Health::Failed);
                if any_healthy {
                    prop_assert_eq!(g.health, Health::Healthy);
                } else {
                    prop_assert_eq!(c.reason, "overloaded");
                }
                prop_assert!(c.score.is_finite());
                prop_assert!((c.score - c.breakdown.total()).abs() < 1e-9);
            }
            Err(PlacementError::NoUsableGpu) => prop_assert!(!any_usable),
        }
    }
}
