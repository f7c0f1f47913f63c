use proptest::prelude::*;

use super::*;
use crate::config::GpuMode;

fn plain() -> ConcurrencyController {
    ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)).unwrap()
}

fn busy(u: f64) -> Signals {
    Signals {
        busy: Some(u),
        sm_activity: None,
    }
}

fn gpm(busy: f64, sm: f64) -> Signals {
    Signals {
        busy: Some(busy),
        sm_activity: Some(sm),
    }
}

/// Runs `n` admissions of `f` together, each measuring `service`, then samples with `s`.
fn round(c: &mut ConcurrencyController, next: &mut u64, n: u32, f: &str, service: f64, s: Signals) {
    let ids: Vec<u64> = (0..n)
        .map(|_| {
            *next += 1;
            c.admitted(*next, true);
            *next
        })
        .collect();
    for id in ids {
        c.released(id, f, "", Some(service));
    }
    c.observe(s, false);
}

/// Runs admissions at the limit, each measuring `service`, for `rounds` samples.
fn at_limit(c: &mut ConcurrencyController, id: &mut u64, rounds: u32, service: f64, s: Signals) {
    for _ in 0..rounds {
        let n = c.limit();
        round(c, id, n, "f", service, s);
    }
}

#[test]
fn the_busy_time_law_is_the_published_one() {
    let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    cfg.law = Law::BusyTime;
    let mut c = ConcurrencyController::new(cfg).unwrap();
    assert_eq!(c.limit(), 2);
    let d1 = c.observe(busy(0.4), false);
    assert!((d1 - 2.0 * (1.0 + 0.2 * 0.5)).abs() < 1e-12);
    for _ in 0..100 {
        c.observe(busy(0.0), false);
    }
    assert_eq!(c.limit(), 8, "clamped at D_max for plain mode");
    for _ in 0..200 {
        c.observe(busy(1.0), false);
    }
    assert_eq!(c.d(), 1.0, "never below 1");
    c.observe(busy(f64::NAN), false);
    assert_eq!(c.d(), 1.0);
    assert_eq!(c.last().busy, None, "NaN is no reading");
}

/// The simulator's fixed D: neither an idle GPU nor runs slowed 8x move it.
#[test]
fn a_fixed_d_holds_whatever_is_measured() {
    let run = |law| {
        let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
        cfg.law = law;
        cfg.d_max = 3;
        cfg.d_initial = 3.0;
        let mut c = ConcurrencyController::new(cfg).unwrap();
        let mut id = 0;
        // A 1 s baseline alone, then runs of three that take 8 s each.
        round(&mut c, &mut id, 1, "f", 1.0, busy(1.0));
        for _ in 0..50 {
            c.observe(busy(0.0), true);
            round(&mut c, &mut id, 3, "f", 8.0, gpm(1.0, 1.0));
        }
        (c.d(), c.limit())
    };
    assert_eq!(run(Law::Fixed), (3.0, 3));
    assert!(
        run(Law::Interference).0 < 3.0,
        "the same runs cut D under the interference law"
    );
}

#[test]
fn busy_time_never_cuts_d_and_lets_it_grow_only_while_the_gpu_is_visibly_idle() {
    let mut c = plain();
    assert_eq!(
        c.observe(gpm(1.0, 0.95), true),
        2.0,
        "SM activity over the target: D holds"
    );
    for _ in 0..100 {
        assert_eq!(c.observe(busy(1.0), true), 2.0, "100 % busy: D holds");
    }
    for _ in 0..100 {
        assert_eq!(c.observe(busy(0.0), false), 2.0, "the limit does not bind");
    }
    // Nothing ended, admissions wait, busy-time at 40 %: the GPU is visibly idle part of the
    // time, and D may grow.
    c.observe(busy(0.4), true);
    assert!((c.d() - 2.0 * (1.0 + 0.2 * 0.5)).abs() < 1e-9, "{}", c.d());
}

#[test]
fn overlap_raises_d_whatever_busy_time_says() {
    let mut c = plain();
    let mut id = 0;
    // Alone: the baseline (1 s at concurrency 1).
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    assert_eq!(c.baseline("f"), Some((1, 1.0)));
    // Two at a time, each 1.2× slower (2 / 1.2 = 1.7 runs' worth of work): pressure 1.2 / 2,
    // D grows although busy-time reads 100 %.
    let d0 = c.d();
    round(&mut c, &mut id, 2, "f", 1.2, busy(1.0));
    let p = 1.2 / 2.0;
    assert!((c.last().pressure.unwrap() - p).abs() < 1e-9);
    assert!((c.last().slowdown.unwrap() - 1.2).abs() < 1e-9);
    assert!((c.d() - d0 * (1.0 + 0.2 * (1.0 - p))).abs() < 1e-9);
}

#[test]
fn time_slicing_never_grows_d() {
    let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    cfg.d_initial = 3.0;
    let mut c = ConcurrencyController::new(cfg).unwrap();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    // Three at a time, each three times as slow (no more work done than one at a time): cut
    // by 2 / 3.
    round(&mut c, &mut id, 3, "f", 3.0, busy(1.0));
    assert!((c.d() - 2.0).abs() < 1e-9, "cut by 1/p: {}", c.d());
    // Two at a time, twice as slow: at the target, D holds.
    for _ in 0..50 {
        round(&mut c, &mut id, 2, "f", 2.0, busy(1.0));
    }
    assert!((c.d() - 2.0).abs() < 1e-9, "{}", c.d());
}

#[test]
fn d_settles_where_the_slowdown_meets_its_target() {
    // Each run keeps 40 % of the GPU busy alone and up to 1.1 GPUs' worth of work gets done:
    // slowdown(k) = max(1, 0.4 k / 1.1), 1.82 at 5 and 2.18 at 6.
    let slow = |k: u32| (0.4 * f64::from(k) / 1.1).max(1.0);
    let mut c = plain();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.4));
    let mut seen = Vec::new();
    for _ in 0..400 {
        let n = c.limit();
        round(&mut c, &mut id, n, "f", slow(n), busy(1.0));
        seen.push(c.limit());
    }
    // It keeps probing the sixth level (AIMD does) but never strays further.
    let tail = &seen[200..];
    assert!(tail.iter().all(|&l| (4..=6).contains(&l)), "{tail:?}");
    let at5 = tail.iter().filter(|&&l| l == 5).count();
    assert!(at5 * 2 > tail.len(), "mostly at 5: {tail:?}");
}

#[test]
fn waiting_admissions_count_as_the_limit_in_use() {
    let mut c = plain();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    // One runs under a limit of 2 (the other slot held for short work) while others wait.
    c.admitted(50, true);
    c.released(50, "f", "", Some(1.0));
    let d0 = c.d();
    c.observe(busy(1.0), true);
    assert!(c.d() > d0);
}

#[test]
fn one_cut_per_round_of_admissions() {
    let mut c = plain();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    at_limit(&mut c, &mut id, 40, 1.0, busy(1.0));
    let d0 = c.d();
    // Four admissions granted before the cut; two end slowed before the sample, two after.
    for k in 1..=4 {
        c.admitted(100 + k, true);
    }
    c.released(101, "f", "", Some(6.0));
    c.released(102, "f", "", Some(6.0));
    let cut = c.observe(busy(1.0), false);
    assert!(
        (cut - d0 * 0.5).abs() < 1e-9,
        "cut at most by half: {cut} vs {d0}"
    );
    c.released(103, "f", "", Some(6.0));
    c.released(104, "f", "", Some(6.0));
    assert_eq!(
        c.observe(busy(1.0), false),
        cut,
        "late news of the old round cuts nothing"
    );
    assert_eq!(c.last().slowdown, None);
}

#[test]
fn growth_needs_the_limit_in_use() {
    let mut c = plain();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    // One at a time under a limit of 2, nobody waiting: speed is fine but says nothing about 3.
    for _ in 0..20 {
        round(&mut c, &mut id, 1, "f", 1.0, gpm(0.4, 0.1));
    }
    assert_eq!(c.d(), 2.0);
}

#[test]
fn sm_activity_gates_growth() {
    let mut c = plain();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, busy(0.5));
    // Busy-time 100 %, SM activity 80 %, no slowdown: grows by the smaller factor.
    let d0 = c.d();
    round(&mut c, &mut id, 2, "f", 1.0, gpm(1.0, 0.8));
    let f_p: f64 = 1.0 + 0.2 * (1.0 - 1.0 / 2.0);
    let f_u = 1.0 + 0.2 * (0.9 - 0.8);
    assert!((c.d() - d0 * f_p.min(f_u)).abs() < 1e-9);
    // SMs saturated: D holds (the slowdown says what saturation costs).
    let d1 = c.d();
    at_limit(&mut c, &mut id, 5, 1.0, gpm(1.0, 1.0));
    assert_eq!(c.d(), d1);
    // No admission ended: SM activity alone grows D while the limit binds, and only then.
    c.observe(gpm(0.2, 0.1), false);
    assert_eq!(c.d(), d1, "the limit did not bind");
    c.observe(gpm(1.0, 0.4), true);
    assert!((c.d() - d1 * (1.0 + 0.2 * 0.5)).abs() < 1e-9);
    // Without GPM, nothing to go on: D holds.
    let d2 = c.d();
    c.observe(busy(1.0), true);
    assert_eq!(c.d(), d2);
}

#[test]
fn a_lying_function_cannot_push_d_below_the_target() {
    let mut c = plain();
    let mut id = 0;
    // Its first run, alone, "took" 2 ms; every later one takes a second.
    round(&mut c, &mut id, 1, "liar", 2e-3, busy(0.5));
    for _ in 0..200 {
        let n = c.limit();
        round(&mut c, &mut id, n, "liar", 1.0, busy(1.0));
    }
    // Each run counts as slowed k× at concurrency k: D settles where k meets the target (2).
    assert_eq!(c.limit(), 2, "{}", c.d());
}

#[test]
fn each_tenant_counts_once_whatever_it_reports() {
    // At concurrency 4, tenant `evil`'s two runs claim the most slowdown there is (4×) while
    // tenants `a` and `b` keep their speed.
    let run = |tenants: [&str; 3]| {
        let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
        cfg.d_initial = 4.0;
        let mut c = ConcurrencyController::new(cfg).unwrap();
        for (i, (f, t)) in [("x", tenants[0]), ("y", tenants[1]), ("z", tenants[2])]
            .into_iter()
            .enumerate()
        {
            c.admitted(i as u64, true);
            c.released(i as u64, f, t, Some(1.0));
        }
        let ids = [
            (10, "x", tenants[0]),
            (11, "x", tenants[0]),
            (12, "y", tenants[1]),
            (13, "z", tenants[2]),
        ];
        for (id, _, _) in ids {
            c.admitted(id, true);
        }
        for (id, f, t) in ids {
            c.released(id, f, t, Some(if f == "x" { 4.0 } else { 1.0 }));
        }
        c.observe(busy(1.0), true);
        c
    };
    // Three tenants: (4 + 1 + 1) / 3 = 2, at the target: D holds.
    let isolated = run(["evil", "a", "b"]);
    assert!((isolated.last().slowdown.unwrap() - 2.0).abs() < 1e-9);
    assert_eq!(isolated.d(), 4.0);
    // One tenant for all (no isolation configured): GPU time decides, (2 · 4 s · 4 + 1 + 1) / 10 s
    // = 3.4, and D is cut.
    let flat = run(["", "", ""]);
    assert!((flat.last().slowdown.unwrap() - 3.4).abs() < 1e-9);
    assert!(flat.d() < 4.0);
}

#[test]
fn releases_that_say_nothing_of_a_run_teach_nothing() {
    let mut c = plain();
    c.admitted(1, true);
    c.released(1, "f", "", Some(1e-6));
    assert_eq!(c.baseline("f"), None, "a microsecond is no run");
    c.admitted(2, true);
    c.released(2, "f", "", Some(f64::INFINITY));
    assert_eq!(c.baseline("f"), None);
    c.admitted(3, true);
    c.released(3, "f", "", Some(0.5));
    assert_eq!(c.baseline("f"), Some((1, 0.5)));
}

#[test]
fn baselines_follow_the_lowest_concurrency_seen_and_adopted_runs_teach_nothing() {
    let mut c = plain();
    c.admitted(1, true);
    c.admitted(2, true);
    c.released(1, "f", "", Some(2.0));
    c.released(2, "f", "", Some(2.0));
    assert_eq!(c.baseline("f"), Some((2, 2.0)));
    c.admitted(3, true);
    c.released(3, "f", "", Some(1.0));
    assert_eq!(
        c.baseline("f"),
        Some((1, 1.0)),
        "a lower concurrency replaces it"
    );
    c.admitted(4, false);
    c.released(4, "g", "", Some(1.0));
    assert_eq!(c.baseline("g"), None);
    c.released(99, "f", "", Some(1.0));
    c.admitted(5, true);
    c.released(5, "h", "", None);
    assert_eq!(c.baseline("h"), None);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn a_baseline_is_learned_only_at_or_below_the_starting_limit() {
    // d_initial is 2 for a plain GPU: a function first seen at 3 in flight learns nothing there.
    let mut c = plain();
    for id in 1..=3 {
        c.admitted(id, true);
    }
    c.released(1, "f", "", Some(3.0));
    assert_eq!(c.baseline("f"), None, "a run at 3 is no reference");
    c.released(2, "f", "", Some(3.0));
    c.released(3, "f", "", Some(3.0));
    c.admitted(4, true);
    c.admitted(5, true);
    c.released(4, "f", "", Some(1.5));
    assert_eq!(c.baseline("f"), Some((2, 1.5)));
    c.released(5, "g", "", Some(1.0));
    assert_eq!(c.baseline("g"), Some((2, 1.0)));
}

#[test]
fn mig_is_one() {
    let mut c = ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Mig, 0.2)).unwrap();
    let mut id = 0;
    round(&mut c, &mut id, 1, "f", 1.0, gpm(0.0, 0.0));
    round(&mut c, &mut id, 1, "f", 1.0, gpm(0.0, 0.0));
    assert_eq!(c.limit(), 1);
    assert_eq!(c.config().d_max, 1);
}

#[test]
fn bad_knobs_are_named() {
    let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    cfg.slowdown_target = 1.0;
    let e = ConcurrencyController::new(cfg.clone()).unwrap_err();
    assert_eq!(e.knob, "slowdown_target");
    cfg.slowdown_target = f64::NAN;
    assert_eq!(
        ConcurrencyController::new(cfg).unwrap_err().knob,
        "slowdown_target"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Admit(u8, u8, bool),
    Release(u8, Option<f64>),
    Sample(Option<f64>, Option<f64>, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), 0u8..4, any::<bool>()).prop_map(|(i, f, m)| Op::Admit(i, f, m)),
        (any::<u8>(), proptest::option::of(-1.0f64..20.0)).prop_map(|(i, s)| Op::Release(i, s)),
        (
            proptest::option::of(-0.5f64..1.5),
            proptest::option::of(-0.5f64..1.5),
            any::<bool>()
        )
            .prop_map(|(b, s, w)| Op::Sample(b, s, w)),
    ]
}

/// Plays `ops`; `funcs` remembers each admission's function for its release.
fn play(c: &mut ConcurrencyController, funcs: &mut [u8; 256], ops: &[Op]) {
    for o in ops {
        match *o {
            Op::Admit(i, f, m) => {
                funcs[usize::from(i)] = f;
                c.admitted(u64::from(i), m);
            }
            Op::Release(i, s) => {
                let f = funcs[usize::from(i)];
                c.released(u64::from(i), &format!("f{f}"), "", s);
            }
            Op::Sample(b, s, w) => {
                c.observe(
                    Signals {
                        busy: b,
                        sm_activity: s,
                    },
                    w,
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn d_stays_within_its_bounds(ops in prop::collection::vec(op(), 1..200), law in any::<bool>()) {
        let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.3);
        if law {
            cfg.law = Law::BusyTime;
        }
        let mut c = ConcurrencyController::new(cfg).unwrap();
        let mut funcs = [0; 256];
        for o in &ops {
            play(&mut c, &mut funcs, std::slice::from_ref(o));
            prop_assert!((1.0..=8.0).contains(&c.d()), "{}", c.d());
            prop_assert!((1..=8).contains(&c.limit()));
        }
    }

    /// The same history, then one more admission ending slower (or with the SMs busier): D
    /// is never higher for it.
    #[test]
    fn the_response_is_monotone(
        ops in prop::collection::vec(op(), 0..120),
        s1 in 0.01f64..10.0,
        s2 in 0.01f64..10.0,
        u1 in 0.0f64..1.0,
        u2 in 0.0f64..1.0,
    ) {
        let mut base = plain();
        play(&mut base, &mut [0; 256], &ops);
        let (slow_lo, slow_hi) = (s1.min(s2), s1.max(s2));
        let (u_lo, u_hi) = (u1.min(u2), u1.max(u2));
        let end = |s: f64, u: f64| {
            let mut c = base.clone();
            c.admitted(1000, true);
            c.released(1000, "f0", "", Some(s));
            c.observe(Signals { busy: Some(1.0), sm_activity: Some(u) }, true)
        };
        prop_assert!(end(slow_lo, u_lo) >= end(slow_hi, u_lo));
        prop_assert!(end(slow_lo, u_lo) >= end(slow_lo, u_hi));
    }
}

#[test]
fn a_tenant_cycling_function_names_relearns_only_its_own_baselines() {
    let mut c = plain();
    c.admitted(1, true);
    c.released(1, "victim/f", "victim", Some(1.0));
    for i in 0..5000u64 {
        c.admitted(i + 2, true);
        c.released(i + 2, &format!("hostile/n{i}"), "hostile", Some(1.0));
    }
    assert_eq!(
        c.baseline("victim/f"),
        Some((1, 1.0)),
        "evicted by another tenant"
    );
    assert_eq!(c.baseline("hostile/n4999"), Some((1, 1.0)));
    assert_eq!(c.baseline("hostile/n0"), None);
}
