//! Property tests of the simulator: every policy, random traces and nodes.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use mqfq_sim::sweep::Knobs;
use mqfq_sim::trace::{Function, Invocation};
use mqfq_sim::{POLICIES, SimConfig, Trace, run_policy};
use proptest::prelude::*;
use scheduler_core::GpuMode;
use scheduler_core::tiers::Tier;

fn trace() -> impl Strategy<Value = Trace> {
    let funcs = prop::collection::vec(
        (1.0f64..8000.0, 0.0f64..5000.0, 0.05f64..1.0, 0.5f64..3.0),
        1..6,
    );
    funcs.prop_flat_map(|fs| {
        let n = fs.len();
        let invs = prop::collection::vec((0.0f64..2000.0, 0..n, 1.0f64..3000.0), 1..80);
        (Just(fs), invs).prop_map(|(fs, mut invs)| {
            invs.sort_by(|a, b| a.0.total_cmp(&b.0));
            Trace {
                functions: fs
                    .iter()
                    .enumerate()
                    .map(|(i, &(mem, cold, util, w))| Function {
                        name: format!("f{i}"),
                        mem_mb: mem,
                        cold_ms: Some(cold),
                        tenant: None,
                        weight: w,
                        util,
                        bw: 0.0,
                    })
                    .collect(),
                invocations: invs
                    .into_iter()
                    .map(|(t, f, e)| Invocation {
                        arrival_ms: t * 10.0,
                        func: f,
                        exec_ms: e,
                    })
                    .collect(),
            }
        })
    })
}

fn node() -> impl Strategy<Value = SimConfig> {
    (
        1usize..4,
        4000.0f64..40000.0,
        prop_oneof![Just(GpuMode::Plain), Just(GpuMode::Mps), Just(GpuMode::Mig)],
        1.0f64..32.0,
    )
        .prop_map(|(gpus, mem, mode, bw)| SimConfig {
            gpus,
            gpu_mem_mb: mem,
            mode,
            pcie_gbps: bw,
            ..SimConfig::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// For every policy: each invocation completes exactly once, never before it arrived and
    /// never faster than its solo exec time; slots never exceed the limit at dispatch; the GPUs
    /// never do more work than their capacity allows; no step ends with a slot free under the
    /// limit any work may take while work waits for that GPU, nor the short-slot reserve's while
    /// a short flow waits within the over-run threshold (work conservation: the over-run
    /// threshold, the reserve and sticky flows reorder work but never idle a slot).
    /// `mqfq-paper`'s published utilization gate idles slots by design: the audit counts them
    /// for it as for the others, and only its count is not held to zero.
    #[test]
    fn every_policy_is_sound(t in trace(), cfg in node()) {
        for p in POLICIES {
            let out = run_policy(p, &t, &cfg).unwrap();
            prop_assert_eq!(out.audit.unfinished, 0, "{}", p);
            prop_assert_eq!(out.audit.double_completions, 0, "{}", p);
            prop_assert_eq!(out.audit.over_limit_dispatches, 0, "{}", p);
            if p != "mqfq-paper" {
                prop_assert_eq!(out.audit.idle_with_backlog, 0, "{} left a slot idle with a backlog", p);
            }
            prop_assert!(out.audit.max_slots_held <= cfg.mode.default_d_max(), "{}", p);
            prop_assert_eq!(out.records.len(), t.invocations.len());
            let mut work = 0.0;
            for (inv, r) in t.invocations.iter().zip(&out.records) {
                prop_assert!(r.start_ms + 1e-6 >= inv.arrival_ms, "{} started before arrival", p);
                prop_assert!(r.end_ms - r.start_ms + 1e-6 >= inv.exec_ms,
                    "{}: ran in {} < solo {}", p, r.end_ms - r.start_ms, inv.exec_ms);
                work += inv.exec_ms * t.functions[inv.func].util;
            }
            #[expect(clippy::cast_precision_loss, reason = "a GPU count")]
            let gpus = cfg.gpus as f64;
            let capacity = out.makespan_ms * gpus * (1.0 + cfg.corun_gain_max);
            prop_assert!(work <= capacity + 1e-6, "{}: work {} > capacity {}", p, work, capacity);
            prop_assert!(out.busy_ms <= out.makespan_ms * gpus + 1e-6);
        }
    }
}

#[test]
fn unknown_policy_is_a_clear_error() {
    let t = Trace::parse("time_ms,function,exec_ms,mem_mb\n0,a,1,1\n").unwrap();
    let e = run_policy("lottery", &t, &SimConfig::default()).unwrap_err();
    assert!(e.to_string().contains("`policy`"), "{e}");
    assert!(e.to_string().contains("lottery"), "{e}");
}

#[test]
fn bad_node_knob_is_named() {
    let t = Trace::parse("time_ms,function,exec_ms,mem_mb\n0,a,1,1\n").unwrap();
    let cfg = SimConfig {
        pcie_gbps: 0.0,
        ..SimConfig::default()
    };
    let e = run_policy("fcfs", &t, &cfg).unwrap_err();
    assert!(e.to_string().contains("pcie-gbps"), "{e}");
}

/// Under mqfq-sticky the node's pool decides memory: a call after the hot TTL finds its
/// container evicted (a restore over PCIe), one after the warm TTL finds it reclaimed (a cold
/// start). Without the pool's timers every call after the first would find it Hot.
#[test]
fn the_node_pool_evicts_and_reclaims_in_the_simulator() {
    let t = Trace::parse(
        "time_ms,function,exec_ms,mem_mb,cold_ms\n\
         0,f,50,1200,2000\n\
         20000,f,50,1200,2000\n\
         200000,f,50,1200,2000\n",
    )
    .unwrap();
    let cfg = SimConfig {
        tiers: scheduler_core::config::TierConfig {
            hot_ttl_s: 10.0,
            warm_ttl_s: 60.0,
            ..Default::default()
        },
        ..SimConfig::default()
    };
    let out = run_policy("mqfq-sticky", &t, &cfg).unwrap();
    let delay: Vec<f64> = out
        .records
        .iter()
        .zip(&t.invocations)
        .map(|(r, i)| r.end_ms - i.arrival_ms - i.exec_ms)
        .collect();
    // 1200 MB at 12 GB/s: 100 ms.
    assert!(delay[0] >= 2000.0, "first call: a cold start, {delay:?}");
    assert!(
        (50.0..500.0).contains(&delay[1]),
        "after the hot TTL: a restore, {delay:?}"
    );
    assert!(
        delay[2] >= 2000.0,
        "after the warm TTL: a cold start, {delay:?}"
    );
}

/// The Warm-tier backends (issue 36), for the node's pool and a baseline's alike: one container
/// evicted at the hot TTL and restored for the next call. Under `uvm` its 400 MB context stays on
/// the GPU while Warm and the restore moves its 1200 MB at the link's 12 GB/s (100 ms); under
/// `checkpoint` nothing stays and the restore moves all 1600 MB at 8 GB/s (200 ms).
#[test]
fn the_warm_backends_differ_in_what_stays_on_the_gpu_and_what_a_restore_moves() {
    use scheduler_core::warm::Warm;
    let t = Trace::parse(
        "time_ms,function,exec_ms,mem_mb,cold_ms\n\
         0,f,50,1200,2000\n\
         20000,f,50,1200,2000\n",
    )
    .unwrap();
    let cfg = |warm, context_mb| SimConfig {
        tiers: scheduler_core::config::TierConfig {
            hot_ttl_s: 10.0,
            warm_ttl_s: 600.0,
            ..Default::default()
        },
        warm,
        context_mb,
        ..SimConfig::default()
    };
    let run = |t: &Trace, p: &str, c: &SimConfig| run_policy(p, t, c).unwrap().warm;
    let uvm = run(&t, "mqfq-sticky", &cfg(Warm::Uvm, 400.0));
    let ckpt = run(&t, "mqfq-sticky", &cfg(Warm::Checkpoint, 400.0));
    let plain = run(&t, "mqfq-sticky", &cfg(Warm::Uvm, 0.0));
    assert_eq!((uvm.restores, ckpt.restores, plain.restores), (1, 1, 1));
    assert!((uvm.peak_warm_gpu_mb - 400.0).abs() < 1e-6, "{uvm:?}");
    assert!(ckpt.peak_warm_gpu_mb.abs() < 1e-6, "{ckpt:?}");
    assert!(plain.peak_warm_gpu_mb.abs() < 1e-6, "{plain:?}");
    assert!((uvm.restore_ms - 100.0).abs() < 1.0, "{uvm:?}");
    assert!((ckpt.restore_ms - 200.0).abs() < 1.0, "{ckpt:?}");
    // A baseline's pool evicts under pressure (at its keep-alive's end it drops, never
    // evicts): g does not fit beside f, so f goes Warm, and comes back for its next call.
    let pressure = Trace::parse(
        "time_ms,function,exec_ms,mem_mb,cold_ms\n\
         0,f,50,1200,2000\n\
         5000,g,50,19000,2000\n\
         20000,f,50,1200,2000\n",
    )
    .unwrap();
    let uvm = run(&pressure, "fcfs", &cfg(Warm::Uvm, 400.0));
    let ckpt = run(&pressure, "fcfs", &cfg(Warm::Checkpoint, 400.0));
    assert!(uvm.restores >= 1 && ckpt.restores >= 1, "{uvm:?} {ckpt:?}");
    assert!(uvm.peak_warm_gpu_mb >= 400.0 - 1e-6, "{uvm:?}");
    assert!(ckpt.peak_warm_gpu_mb.abs() < 1e-6, "{ckpt:?}");
    let bad = SimConfig {
        checkpoint_gbps: 0.0,
        ..SimConfig::default()
    };
    let e = run_policy("fcfs", &t, &bad).unwrap_err().to_string();
    assert!(e.contains("checkpoint-gbps"), "{e}");
}

/// A Warm container restored onto another GPU of the same model (issue 36, `mqfqd`'s
/// `restore_onto`): f's one container goes Warm on the GPU it ran on; a long call of h then takes
/// that GPU's only slot, so f's next call is granted the other GPU. Under `checkpoint` its
/// container is restored there (a restore, no cold start); under `uvm` (its context stays where
/// it was) a new container starts cold; between GPUs of different memory, too.
#[test]
fn a_checkpointed_container_is_restored_onto_another_gpu_of_its_model() {
    use scheduler_core::warm::Warm;
    let t = Trace::parse(
        "time_ms,function,exec_ms,mem_mb,cold_ms\n\
         0,f,50,1200,2000\n\
         15000,h,100000,1000,0\n\
         20000,f,50,1200,2000\n",
    )
    .unwrap();
    let cfg = |warm, mems: Vec<f64>| SimConfig {
        gpus: 2,
        gpu_mem_each_mb: mems,
        tiers: scheduler_core::config::TierConfig {
            hot_ttl_s: 10.0,
            warm_ttl_s: 600.0,
            ..Default::default()
        },
        overrides: scheduler_core::config::Overrides {
            fixed_d: Some(1),
            ..Default::default()
        },
        warm,
        ..SimConfig::default()
    };
    let same = vec![24576.0, 24576.0];
    let out = run_policy("mqfq-sticky", &t, &cfg(Warm::Checkpoint, same.clone())).unwrap();
    let (first, h, second) = (&out.records[0], &out.records[1], &out.records[2]);
    assert_eq!(h.gpu, first.gpu, "h took f's GPU: {:?}", out.records);
    assert_ne!(second.gpu, first.gpu, "{:?}", out.records);
    assert_eq!(second.tier, Tier::Warm, "{:?}", out.records);
    assert_eq!(
        (out.warm.restores, out.warm.moved),
        (1, 1),
        "{:?}",
        out.warm
    );
    // 1200 MB at 8 GB/s: 150 ms, not the 2 s cold start.
    assert!(second.end_ms - 20000.0 - 50.0 < 1000.0, "{second:?}");
    assert_eq!(out.audit.over_budget_admissions, 0);
    // A checkpoint still on its way to the host when the call comes (12 s at 0.1 GB/s): the
    // restore onto the other GPU begins once it is done.
    let slow = SimConfig {
        checkpoint_gbps: 0.1,
        ..cfg(Warm::Checkpoint, same.clone())
    };
    let out = run_policy("mqfq-sticky", &t, &slow).unwrap();
    assert_eq!(out.warm.moved, 1, "{:?}", out.warm);
    // Restored alone it would end 12 s after the call (and its 50 ms); it ends after the
    // checkpoint's remaining ~4 s as well.
    let waited = out.records[2].end_ms - 20000.0;
    assert!(waited > 14000.0, "{waited} ms");
    for (warm, mems) in [
        (Warm::Uvm, same),
        (Warm::Checkpoint, vec![24576.0, 40960.0]),
    ] {
        let out = run_policy("mqfq-sticky", &t, &cfg(warm, mems)).unwrap();
        assert_ne!(out.records[2].gpu, out.records[0].gpu);
        assert_eq!(out.records[2].tier, Tier::Cold, "{:?}", out.records);
        assert_eq!(out.warm.moved, 0);
    }
}

/// A steady stream of small kernels (each keeps 20 % of the SMs busy alone), offered at 2.5×
/// what one-at-a-time can serve: busy-time reads ~100 % throughout.
fn small_kernels() -> Trace {
    Trace {
        functions: (0..4)
            .map(|i| Function {
                name: format!("k{i}"),
                mem_mb: 100.0,
                cold_ms: Some(0.0),
                tenant: None,
                weight: 1.0,
                util: 0.2,
                bw: 0.0,
            })
            .collect(),
        invocations: (0..4000)
            .map(|i| Invocation {
                arrival_ms: f64::from(i) * 20.0,
                func: usize::try_from(i % 4).unwrap(),
                exec_ms: 50.0,
            })
            .collect(),
    }
}

#[test]
#[expect(clippy::cast_precision_loss, reason = "an invocation count")]
fn busy_time_pins_d_where_measured_interference_lets_it_grow() {
    let t = small_kernels();
    let mean = |policy: &str, law: &str, gpm: bool| {
        let mut cfg = SimConfig {
            gpm,
            ..SimConfig::default()
        };
        cfg.overrides.law = Some(law.parse().unwrap());
        let out = run_policy(policy, &t, &cfg).unwrap();
        assert_eq!(out.audit.unfinished, 0);
        let lat: f64 = t
            .invocations
            .iter()
            .zip(&out.records)
            .map(|(i, r)| r.end_ms - i.arrival_ms)
            .sum::<f64>()
            / t.invocations.len() as f64;
        (out.mean_d, lat, out.limits)
    };
    for policy in ["fcfs", "mqfq-sticky"] {
        let (d_busy, lat_busy, _) = mean(policy, "busy-time", true);
        let (d_ours, lat_ours, limits) = mean(policy, "interference", true);
        let (d_no_gpm, _, _) = mean(policy, "interference", false);
        assert!(d_busy < 2.2, "{policy}: busy-time D {d_busy}");
        assert!(
            d_ours > 3.0 && d_no_gpm > 3.0,
            "{policy}: {d_ours} {d_no_gpm}"
        );
        assert!(
            lat_ours * 5.0 < lat_busy,
            "{policy}: {lat_ours} vs {lat_busy}"
        );
        assert!(limits.len() > 1, "D over time is recorded");
    }
}

/// `baselines = paper`: the baselines run behind the published gate (never more than two slots)
/// and push a container's memory to the host after every use, so each later call of a function
/// restores it (Warm); the strong baselines find it Hot. mqfq-sticky is not affected.
#[test]
fn paper_and_naive_baselines_restore_or_start_every_call() {
    use mqfq_sim::Baselines;
    use scheduler_core::tiers::Tier;
    let mut csv = String::from("time_ms,function,exec_ms,mem_mb,cold_ms\n");
    for i in 0..4 {
        csv.push_str(&format!("{},f,50,1200,2000\n", i * 5000));
    }
    for _ in 0..6 {
        csv.push_str("30000,g,400,100,10\n");
    }
    let t = Trace::parse(&csv).unwrap();
    let paper = SimConfig {
        baselines: Baselines::Paper,
        ..SimConfig::default()
    };
    let tiers = |cfg: &SimConfig, p: &str| {
        let out = run_policy(p, &t, cfg).unwrap();
        let f: Vec<Tier> = out.records[..4].iter().map(|r| r.tier).collect();
        (f, out.audit.max_slots_held)
    };
    for p in ["fcfs", "sjf", "paella"] {
        let (strong, _) = tiers(&SimConfig::default(), p);
        assert_eq!(strong, [Tier::Cold, Tier::Hot, Tier::Hot, Tier::Hot], "{p}");
        let (weak, weak_slots) = tiers(&paper, p);
        assert_eq!(
            weak,
            [Tier::Cold, Tier::Warm, Tier::Warm, Tier::Warm],
            "{p}"
        );
        assert!(
            weak_slots <= 2,
            "{p}: {weak_slots} slots behind the published gate"
        );
    }
    assert_eq!(
        tiers(&paper, "mqfq-sticky"),
        tiers(&SimConfig::default(), "mqfq-sticky")
    );
    // `baselines = naive`: no warm pool, so every call of `f` (5 s apart) starts cold, on at
    // most two slots; mqfq-sticky is not affected either.
    let naive = SimConfig {
        baselines: Baselines::Naive,
        ..SimConfig::default()
    };
    for p in ["fcfs", "sjf", "paella"] {
        let (cold, slots) = tiers(&naive, p);
        assert_eq!(cold, [Tier::Cold; 4], "{p}");
        assert!(slots <= 2, "{p}: {slots} slots at a fixed D of 2");
    }
    assert_eq!(
        tiers(&naive, "mqfq-sticky"),
        tiers(&SimConfig::default(), "mqfq-sticky")
    );
}

/// `none`, no admission: ten 5 GB functions called at once on a 24 GB GPU all start at once;
/// the four that fit run and the other six fail to start (their allocations fail), or, with
/// managed memory, all run and page the excess in over PCIe. mqfq-sticky runs every call.
#[test]
fn none_fails_starts_past_memory_or_pages_them_in() {
    use mqfq_sim::NoneMemory;
    let mut csv = String::from("time_ms,function,exec_ms,mem_mb,cold_ms\n");
    for f in 0..10 {
        csv.push_str(&format!("0,f{f},1000,5000,100\n"));
    }
    let t = Trace::parse(&csv).unwrap();
    let fail = run_policy("none", &t, &SimConfig::default()).unwrap();
    assert_eq!(fail.audit.failed_starts, 6);
    assert_eq!(fail.audit.unfinished, 0);
    let ran = fail.records.iter().filter(|r| r.end_ms.is_finite()).count();
    assert_eq!(ran, 4);
    assert_eq!(fail.pcie_mb, 0.0);
    let uvm_cfg = SimConfig {
        none_memory: NoneMemory::Uvm,
        ..SimConfig::default()
    };
    let uvm = run_policy("none", &t, &uvm_cfg).unwrap();
    assert_eq!(uvm.audit.failed_starts, 0);
    assert!(uvm.records.iter().all(|r| r.end_ms.is_finite()));
    assert!(uvm.pcie_mb > 0.0, "the excess is paged in");
    assert_eq!(uvm.audit.max_slots_held, 10, "no admission: all at once");
    let sticky = run_policy("mqfq-sticky", &t, &SimConfig::default()).unwrap();
    assert_eq!(sticky.audit.failed_starts, 0);
    assert!(sticky.records.iter().all(|r| r.end_ms.is_finite()));
    let e = "swap".parse::<NoneMemory>().unwrap_err();
    assert!(e.to_string().contains("none-memory"), "{e}");
    // Thrashing: the six started past memory each run beside co-runners that need more than the
    // GPU holds, so each pages its whole 5 GB in, at a quarter of the link's rate.
    let thrash_cfg = SimConfig {
        none_memory: "uvm-thrash".parse().unwrap(),
        ..SimConfig::default()
    };
    let thrash = run_policy("none", &t, &thrash_cfg).unwrap();
    assert_eq!(thrash.audit.failed_starts, 0);
    assert!(
        (thrash.pcie_mb - 30_000.0).abs() < 1e-6,
        "{}",
        thrash.pcie_mb
    );
    assert!(
        uvm.pcie_mb < thrash.pcie_mb,
        "{} {}",
        uvm.pcie_mb,
        thrash.pcie_mb
    );
    let last_end = |o: &mqfq_sim::SimOutput| o.records.iter().map(|r| r.end_ms).fold(0.0, f64::max);
    assert!(last_end(&thrash) > last_end(&uvm));
}

/// Co-running: overlapping kernels gain a little (k co-runners get up to 1.15 of the GPU),
/// time-sliced contexts gain nothing and lose the switching cost. Two 1 s calls that each keep
/// the GPU busy, at once, under `none`: 2 / 1.05 s under overlap, 2 / 0.95 s time-sliced at a
/// 5 % cost; alone, either runs in 1 s.
#[test]
fn time_sliced_co_runners_gain_nothing_and_pay_the_switch() {
    use mqfq_sim::Corun;
    let ts = Corun::TimeSlice { cost: 0.05 };
    assert_eq!(Corun::Overlap.speed(1, 0.5, 0.05, 0.15), 1.0);
    assert!((Corun::Overlap.speed(2, 2.0, 0.05, 0.15) - 1.05 / 2.0).abs() < 1e-12);
    assert!((Corun::Overlap.speed(10, 10.0, 0.05, 0.15) - 1.15 / 10.0).abs() < 1e-12);
    assert_eq!(ts.speed(1, 1.0, 0.05, 0.15), 1.0);
    assert_eq!(ts.speed(2, 0.9, 0.05, 0.15), 1.0, "room for both");
    assert!((ts.speed(2, 0.97, 0.05, 0.15) - 0.95 / 0.97).abs() < 1e-12);
    assert!((ts.speed(2, 2.0, 0.05, 0.15) - 0.95 / 2.0).abs() < 1e-12);
    let t =
        Trace::parse("time_ms,function,exec_ms,mem_mb,cold_ms\n0,a,1000,100,0\n0,b,1000,100,0\n")
            .unwrap();
    let end = |corun| {
        let cfg = SimConfig {
            corun,
            ..SimConfig::default()
        };
        let o = run_policy("none", &t, &cfg).unwrap();
        o.records.iter().map(|r| r.end_ms).fold(0.0, f64::max)
    };
    assert!((end(Corun::Overlap) - 2000.0 / 1.05).abs() < 1e-6);
    assert!((end(ts) - 2000.0 / 0.95).abs() < 1e-6);
    let bad = SimConfig {
        corun: Corun::TimeSlice { cost: 1.0 },
        ..SimConfig::default()
    };
    let e = run_policy("none", &t, &bad).unwrap_err();
    assert!(e.to_string().contains("timeslice-cost"), "{e}");
}

/// The random sweep draws what it says (5–60 functions, 0.2–20 GB, 10 ms–10 s, 1–4 GPUs of
/// 16–80 GB, load 0.5–1.3), the same for the same seed and index, and every draw runs both
/// policies to the end.
#[test]
fn the_random_sweep_draws_within_its_ranges_and_runs_every_draw() {
    for i in 0..6 {
        let (d, t, cfg) = mqfq_sim::sweep::draw(7, i, 40.0);
        assert_eq!(mqfq_sim::sweep::draw(7, i, 40.0).1, t, "draw {i} is seeded");
        assert!((5..=60).contains(&d.functions) && t.functions.len() == d.functions);
        assert!((1..=4).contains(&cfg.gpus) && cfg.gpu_mem_each_mb.len() == cfg.gpus);
        assert!(
            cfg.gpu_mem_each_mb
                .iter()
                .all(|m| (16_384.0..=81_920.0).contains(m))
        );
        assert!((0.5..=1.3).contains(&d.load));
        let smallest = cfg
            .gpu_mem_each_mb
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let largest = 20_000f64.min(0.85 * smallest) + 0.5;
        assert!(
            t.functions
                .iter()
                .all(|f| f.mem_mb >= 200.0 && f.mem_mb <= largest)
        );
        assert!(
            t.invocations
                .iter()
                .all(|v| (9.0..=11_000.0).contains(&v.exec_ms))
        );
        let o = mqfq_sim::sweep::run(7, i, 40.0, 1000.0, Knobs::default()).unwrap();
        assert!(o.mean_ratio.is_finite() && o.mean_ratio > 0.0, "{o:?}");
        for p in ["fcfs", "mqfq-sticky"] {
            let out = run_policy(p, &t, &cfg).unwrap();
            assert_eq!(out.audit.unfinished, 0, "draw {i}: {p}");
            assert_eq!(out.audit.double_completions, 0, "draw {i}: {p}");
        }
    }
    let report =
        mqfq_sim::sweep::report(&[
            mqfq_sim::sweep::run(7, 0, 40.0, 1000.0, Knobs::default()).unwrap()
        ]);
    assert!(report.contains("1 draws: mean ≤ 1.0× fcfs on"), "{report}");
}
