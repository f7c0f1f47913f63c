//! Workload generators: the design's synthetic mix, and a converter from the Azure Functions 2019
//! public trace format to ours.

use std::collections::HashMap;

use crate::rng::SplitMix64;
use crate::trace::{Function, Invocation, Trace, TraceError};

/// One function class of the synthetic mix.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    /// Name prefix.
    pub name: &'static str,
    /// Mean solo exec time, ms.
    pub exec_ms: f64,
    /// GPU memory footprint, MB.
    pub mem_mb: f64,
    /// Solo GPU utilization.
    pub util: f64,
    /// Short (true) or long class.
    pub short: bool,
}

/// The design's functions: 0.02 s matrix multiply, 2.25 s image classification, 4.48 s video.
/// Footprints and utilizations are modelling assumptions (see docs/SIMULATOR.md).
#[must_use]
pub fn design_classes() -> Vec<Class> {
    vec![
        Class {
            name: "matrix",
            exec_ms: 20.0,
            mem_mb: 2048.0,
            util: 0.3,
            short: true,
        },
        Class {
            name: "imgcls",
            exec_ms: 2250.0,
            mem_mb: 3072.0,
            util: 0.7,
            short: false,
        },
        Class {
            name: "video",
            exec_ms: 4480.0,
            mem_mb: 4096.0,
            util: 0.9,
            short: false,
        },
    ]
}

/// Parameters of the synthetic mix.
#[derive(Clone, Debug, PartialEq)]
pub struct MixSpec {
    /// Number of functions (short classes get half, rounded up).
    pub functions: usize,
    /// Fraction of invocations that go to short functions.
    pub short_frac: f64,
    /// Offered load: GPU demand (Σ exec × util per second) over the GPUs' capacity.
    pub load: f64,
    /// GPUs the load is sized for.
    pub gpus: usize,
    /// Trace length, s.
    pub duration_s: f64,
    /// Burstiness: each function is "on" in a window with probability 1/burst, at burst × its
    /// rate (1 = Poisson).
    pub burst: f64,
    /// Burst window, s.
    pub burst_window_s: f64,
    /// Seed.
    pub seed: u64,
    /// Memory pressure: scale the footprints so that they add up to this many times the GPUs'
    /// memory (`None`: the design's 2 / 3 / 4 GB).
    pub memory_factor: Option<f64>,
    /// Memory of one GPU, MB (what `memory_factor` is relative to).
    pub gpu_mem_mb: f64,
    /// A flood: the first long function offers this much load on its own, on top of its share
    /// of `load` (`None`: no flood).
    pub flood: Option<f64>,
    /// Fraction of each kind's functions that are memory-bound (`bw` 0.8; the others 0.1), for
    /// heterogeneous nodes (0: every function compute-bound, `bw` 0).
    pub memory_bound: f64,
}

impl Default for MixSpec {
    fn default() -> Self {
        MixSpec {
            functions: 12,
            short_frac: 0.7,
            load: 0.8,
            gpus: 1,
            duration_s: 600.0,
            burst: 1.0,
            burst_window_s: 30.0,
            seed: 1,
            memory_factor: None,
            gpu_mem_mb: 24_576.0,
            flood: None,
            memory_bound: 0.0,
        }
    }
}

fn spec_err(field: &str, msg: &str) -> TraceError {
    TraceError {
        line: 0,
        message: format!("--{field}: {msg}"),
    }
}

/// Generates the synthetic mix.
///
/// # Errors
/// A parameter out of range, named.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "small function, GPU and window counts; windows ceils a validated positive ratio"
)]
#[expect(
    clippy::too_many_lines,
    reason = "one seeded generator: the order of its random calls is the trace's identity"
)]
pub fn design_mix(spec: &MixSpec) -> Result<Trace, TraceError> {
    if spec.functions < 2 {
        return Err(spec_err("functions", "need at least 2 (short and long)"));
    }
    if !(spec.short_frac > 0.0 && spec.short_frac < 1.0) {
        return Err(spec_err("short-frac", "must be in (0, 1)"));
    }
    if !(spec.load.is_finite() && spec.load > 0.0) {
        return Err(spec_err("load", "must be > 0"));
    }
    if !(spec.duration_s.is_finite() && spec.duration_s > 0.0) {
        return Err(spec_err("duration-s", "must be > 0"));
    }
    if spec.gpus == 0 {
        return Err(spec_err("gpus", "must be at least 1"));
    }
    if !(spec.burst.is_finite() && spec.burst >= 1.0) {
        return Err(spec_err("burst", "must be >= 1"));
    }
    if !(spec.burst_window_s.is_finite() && spec.burst_window_s > 0.0) {
        return Err(spec_err("burst-window-s", "must be > 0"));
    }
    if spec
        .memory_factor
        .is_some_and(|f| !(f.is_finite() && f > 0.0 && f <= 100.0))
    {
        return Err(spec_err("memory-factor", "must be in (0, 100]"));
    }
    if !(spec.gpu_mem_mb.is_finite() && spec.gpu_mem_mb > 0.0) {
        return Err(spec_err("gpu-mem-mb", "must be > 0"));
    }
    if !(0.0..=1.0).contains(&spec.memory_bound) {
        return Err(spec_err("memory-bound", "must be in [0, 1]"));
    }
    if spec
        .flood
        .is_some_and(|f| !(f.is_finite() && f > 0.0 && f <= 10.0))
    {
        return Err(spec_err("flood", "must be in (0, 10]"));
    }
    let classes = design_classes();
    let shorts: Vec<&Class> = classes.iter().filter(|c| c.short).collect();
    let longs: Vec<&Class> = classes.iter().filter(|c| !c.short).collect();
    let n_short = spec.functions.div_ceil(2);
    let n_long = spec.functions - n_short;
    let mut functions = Vec::new();
    // (class, share of all invocations)
    let mut shares = Vec::new();
    // Memory-bound functions spread evenly through each kind (`memory_bound` of them).
    let bound = |i: usize| {
        if spec.memory_bound <= 0.0 {
            0.0
        } else if ((i + 1) as f64 * spec.memory_bound).floor()
            > (i as f64 * spec.memory_bound).floor()
        {
            0.8
        } else {
            0.1
        }
    };
    let mut bws = Vec::new();
    for i in 0..n_short {
        let c = shorts[i % shorts.len()];
        functions.push((format!("{}-{i}", c.name), c));
        shares.push(spec.short_frac / n_short as f64);
        bws.push(bound(i));
    }
    for i in 0..n_long {
        let c = longs[i % longs.len()];
        functions.push((format!("{}-{i}", c.name), c));
        shares.push((1.0 - spec.short_frac) / n_long as f64);
        bws.push(bound(i));
    }
    // Demand per invocation, averaged by share: Σ share × exec × util (in GPU-seconds).
    let demand: f64 = functions
        .iter()
        .zip(&shares)
        .map(|((_, c), s)| s * c.exec_ms / 1e3 * c.util)
        .sum();
    let total_rate = spec.load * spec.gpus as f64 / demand; // invocations per second
    let mut rng = SplitMix64::new(spec.seed);
    let mut invs: Vec<(f64, usize, f64)> = Vec::new();
    let windows = (spec.duration_s / spec.burst_window_s).ceil() as usize;
    for (fi, ((_, c), share)) in functions.iter().zip(&shares).enumerate() {
        let mut rate = total_rate * share;
        if let Some(f) = spec.flood
            && fi == n_short
        {
            rate += f * spec.gpus as f64 / (c.exec_ms / 1e3 * c.util);
        }
        for w in 0..windows {
            let w0 = w as f64 * spec.burst_window_s;
            let w1 = (w0 + spec.burst_window_s).min(spec.duration_s);
            let on = spec.burst <= 1.0 || rng.next_f64() < 1.0 / spec.burst;
            if !on {
                continue;
            }
            let r = rate * spec.burst;
            let mut t = w0 + rng.exp(1.0 / r);
            while t < w1 {
                let exec = c.exec_ms * (0.9 + 0.2 * rng.next_f64());
                invs.push((t * 1e3, fi, exec));
                t += rng.exp(1.0 / r);
            }
        }
    }
    invs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // Memory pressure: every footprint scaled alike, so the classes keep their proportions.
    let scale = spec.memory_factor.map_or(1.0, |f| {
        let total: f64 = functions.iter().map(|(_, c)| c.mem_mb).sum();
        f * spec.gpu_mem_mb * spec.gpus as f64 / total
    });
    Ok(Trace {
        functions: functions
            .iter()
            .zip(&bws)
            .map(|((name, c), &bw)| Function {
                name: name.clone(),
                mem_mb: (c.mem_mb * scale).round(),
                cold_ms: None,
                tenant: None,
                weight: 1.0,
                util: c.util,
                bw,
            })
            .collect(),
        invocations: invs
            .into_iter()
            .map(|(t, f, e)| Invocation {
                arrival_ms: (t * 1e3).round() / 1e3,
                func: f,
                exec_ms: (e * 1e3).round() / 1e3,
            })
            .collect(),
    })
}

/// Options of the Azure converter.
#[derive(Clone, Debug, PartialEq)]
pub struct AzureSpec {
    /// Keep the most-invoked K functions that have durations.
    pub functions: usize,
    /// First minute (1-based) of the day to take.
    pub start_minute: usize,
    /// Minutes to take.
    pub minutes: usize,
    /// Footprint for functions without memory data, MB.
    pub default_mem_mb: f64,
    /// Seed for spreading arrivals within each minute.
    pub seed: u64,
}

impl Default for AzureSpec {
    fn default() -> Self {
        AzureSpec {
            functions: 20,
            start_minute: 1,
            minutes: 60,
            default_mem_mb: 3072.0,
            seed: 1,
        }
    }
}

fn azure_err(file: &str, line: usize, msg: impl AsRef<str>) -> TraceError {
    TraceError {
        line,
        message: format!("{file}: {}", msg.as_ref()),
    }
}

fn header_index<'a>(
    file: &str,
    header: &'a str,
    need: &[&str],
) -> Result<HashMap<&'a str, usize>, TraceError> {
    let idx: HashMap<&str, usize> = header
        .split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, c)| (c, i))
        .collect();
    for n in need {
        if !idx.contains_key(n) {
            return Err(azure_err(file, 1, format!("missing column `{n}`")));
        }
    }
    Ok(idx)
}

/// Converts the Azure Functions 2019 trace (`invocations_per_function_md.anon.dNN.csv`,
/// `function_durations_percentiles.anon.dNN.csv`, optionally `app_memory_percentiles.anon.dNN.csv`)
/// to our format. Per the published reference setup, the warm time is the 25th percentile of the
/// average duration and the cold start is the maximum; each minute's count is spread uniformly at
/// random over that minute.
///
/// # Errors
/// A missing column or malformed number, with file and line.
#[expect(
    clippy::cast_precision_loss,
    clippy::too_many_lines,
    reason = "minute indices"
)]
pub fn azure(
    invocations_csv: &str,
    durations_csv: &str,
    memory_csv: Option<&str>,
    spec: &AzureSpec,
) -> Result<Trace, TraceError> {
    if spec.functions == 0 || spec.minutes == 0 || spec.start_minute == 0 {
        return Err(spec_err(
            "functions/minutes/start-minute",
            "must be at least 1",
        ));
    }
    // Durations, keyed by (app, function).
    let mut dl = durations_csv.lines();
    let dh = dl
        .next()
        .ok_or_else(|| azure_err("durations", 0, "empty file"))?;
    let di = header_index(
        "durations",
        dh,
        &[
            "HashApp",
            "HashFunction",
            "Maximum",
            "percentile_Average_25",
        ],
    )?;
    let mut durations: HashMap<(String, String), (f64, f64)> = HashMap::new();
    for (n, line) in dl.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let get = |c: &str| f.get(di[c]).copied().unwrap_or("");
        let num = |c: &str| -> Result<f64, TraceError> {
            get(c)
                .trim()
                .parse::<f64>()
                .map_err(|_| azure_err("durations", n + 2, format!("`{c}` is not a number")))
        };
        let warm = num("percentile_Average_25")?;
        let cold = num("Maximum")?;
        if warm > 0.0 {
            durations.insert(
                (get("HashApp").to_owned(), get("HashFunction").to_owned()),
                (warm, cold.max(warm)),
            );
        }
    }
    let mut memory: HashMap<String, f64> = HashMap::new();
    if let Some(m) = memory_csv {
        let mut ml = m.lines();
        let mh = ml
            .next()
            .ok_or_else(|| azure_err("memory", 0, "empty file"))?;
        let mi = header_index("memory", mh, &["HashApp", "AverageAllocatedMb"])?;
        for (n, line) in ml.enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(',').collect();
            let app = f.get(mi["HashApp"]).copied().unwrap_or("");
            let mb: f64 = f
                .get(mi["AverageAllocatedMb"])
                .copied()
                .unwrap_or("")
                .trim()
                .parse()
                .map_err(|_| azure_err("memory", n + 2, "`AverageAllocatedMb` is not a number"))?;
            memory.insert(app.to_owned(), mb);
        }
    }
    let mut il = invocations_csv.lines();
    let ih = il
        .next()
        .ok_or_else(|| azure_err("invocations", 0, "empty file"))?;
    let ii = header_index("invocations", ih, &["HashApp", "HashFunction", "1"])?;
    let first_col = ii["1"];
    struct Row {
        app: String,
        func: String,
        counts: Vec<u64>,
        total: u64,
    }
    let mut rows = Vec::new();
    for (n, line) in il.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let app = f.get(ii["HashApp"]).copied().unwrap_or("").to_owned();
        let func = f.get(ii["HashFunction"]).copied().unwrap_or("").to_owned();
        if !durations.contains_key(&(app.clone(), func.clone())) {
            continue;
        }
        let mut counts = Vec::with_capacity(spec.minutes);
        for m in 0..spec.minutes {
            let col = first_col + spec.start_minute - 1 + m;
            let c = match f.get(col) {
                Some(s) if !s.trim().is_empty() => s.trim().parse::<u64>().map_err(|_| {
                    azure_err(
                        "invocations",
                        n + 2,
                        format!("minute {} is not a count", col - first_col + 1),
                    )
                })?,
                _ => 0,
            };
            counts.push(c);
        }
        let total = counts.iter().sum();
        if total > 0 {
            rows.push(Row {
                app,
                func,
                counts,
                total,
            });
        }
    }
    rows.sort_by(|a, b| b.total.cmp(&a.total).then(a.func.cmp(&b.func)));
    rows.truncate(spec.functions);
    if rows.is_empty() {
        return Err(azure_err(
            "invocations",
            0,
            "no function with both invocations in the window and durations",
        ));
    }
    let mut rng = SplitMix64::new(spec.seed);
    let mut functions = Vec::new();
    let mut invs = Vec::new();
    for (fi, r) in rows.iter().enumerate() {
        let (warm, cold) = durations[&(r.app.clone(), r.func.clone())];
        let short: String = r.func.chars().take(10).collect();
        functions.push(Function {
            name: format!("az-{short}"),
            mem_mb: memory.get(&r.app).copied().unwrap_or(spec.default_mem_mb),
            cold_ms: Some(cold),
            tenant: Some(r.app.chars().take(10).collect()),
            weight: 1.0,
            util: 1.0,
            bw: 0.0,
        });
        for (m, &c) in r.counts.iter().enumerate() {
            for _ in 0..c {
                let t = (m as f64 + rng.next_f64()) * 60_000.0;
                invs.push(Invocation {
                    arrival_ms: (t * 1e3).round() / 1e3,
                    func: fi,
                    exec_ms: warm,
                });
            }
        }
    }
    invs.sort_by(|a, b| {
        a.arrival_ms
            .total_cmp(&b.arrival_ms)
            .then(a.func.cmp(&b.func))
    });
    Ok(Trace {
        functions,
        invocations: invs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[expect(clippy::cast_precision_loss, reason = "invocation counts")]
    fn design_mix_hits_its_shares_and_load() {
        // Averaged over a few seeds, so one unlucky stream does not decide.
        let (mut short, mut total, mut demand, mut secs) = (0usize, 0usize, 0.0, 0.0);
        for seed in 1..=4 {
            let spec = MixSpec {
                duration_s: 3600.0,
                seed,
                ..MixSpec::default()
            };
            let t = design_mix(&spec).unwrap();
            assert_eq!(t.functions.len(), 12);
            short += t
                .invocations
                .iter()
                .filter(|i| t.functions[i.func].name.starts_with("matrix"))
                .count();
            total += t.invocations.len();
            demand += t
                .invocations
                .iter()
                .map(|i| i.exec_ms / 1e3 * t.functions[i.func].util)
                .sum::<f64>();
            secs += spec.duration_s;
            assert!(
                t.invocations
                    .windows(2)
                    .all(|w| w[0].arrival_ms <= w[1].arrival_ms)
            );
            let again = Trace::parse(&t.to_csv()).unwrap();
            assert_eq!(again.invocations.len(), t.invocations.len());
            assert_eq!(
                design_mix(&spec).unwrap(),
                t,
                "seeded generation is deterministic"
            );
        }
        let frac = short as f64 / total as f64;
        assert!((frac - 0.7).abs() < 0.02, "short fraction {frac}");
        let load = demand / secs;
        assert!((load - 0.8).abs() < 0.06, "offered load {load}");
    }

    #[test]
    fn bad_spec_names_the_flag() {
        let e = design_mix(&MixSpec {
            load: 0.0,
            ..MixSpec::default()
        })
        .unwrap_err();
        assert!(e.message.contains("--load"), "{e}");
    }

    #[test]
    fn memory_pressure_scales_footprints_to_the_asked_multiple() {
        let spec = MixSpec {
            functions: 40,
            memory_factor: Some(2.5),
            gpu_mem_mb: 20_000.0,
            gpus: 2,
            duration_s: 60.0,
            ..MixSpec::default()
        };
        let t = design_mix(&spec).unwrap();
        let total: f64 = t.functions.iter().map(|f| f.mem_mb).sum();
        assert!((total - 100_000.0).abs() <= 40.0, "{total}");
        // The classes keep their proportions: a video function is twice a matrix one.
        let of = |p: &str| {
            t.functions
                .iter()
                .find(|f| f.name.starts_with(p))
                .unwrap()
                .mem_mb
        };
        assert!((of("video") / of("matrix") - 2.0).abs() < 0.01);
        let e = design_mix(&MixSpec {
            memory_factor: Some(0.0),
            ..MixSpec::default()
        })
        .unwrap_err();
        assert!(e.message.contains("--memory-factor"), "{e}");
    }

    #[test]
    fn flood_adds_its_load_to_one_function_only() {
        let base = MixSpec {
            duration_s: 3600.0,
            ..MixSpec::default()
        };
        let demand_of = |t: &Trace| {
            let mut per = vec![0.0; t.functions.len()];
            for i in &t.invocations {
                per[i.func] += i.exec_ms / 1e3 * t.functions[i.func].util / 3600.0;
            }
            per
        };
        let calm = demand_of(&design_mix(&base).unwrap());
        let flooded = demand_of(
            &design_mix(&MixSpec {
                flood: Some(1.0),
                ..base.clone()
            })
            .unwrap(),
        );
        // The first long function (index 6 of 12) carries the flood; the others keep their load.
        let extra = flooded[6] - calm[6];
        assert!((extra - 1.0).abs() < 0.08, "flood adds {extra}");
        for (i, (a, b)) in calm.iter().zip(&flooded).enumerate() {
            if i != 6 {
                assert!((a - b).abs() < 0.05, "function {i}: {a} vs {b}");
            }
        }
        let e = design_mix(&MixSpec {
            flood: Some(-1.0),
            ..MixSpec::default()
        })
        .unwrap_err();
        assert!(e.message.contains("--flood"), "{e}");
    }

    #[test]
    fn azure_conversion() {
        let inv = "HashOwner,HashApp,HashFunction,Trigger,1,2,3\n\
                   o1,appA,funcAAAAAAAAAA,http,2,0,1\n\
                   o1,appA,funcB,http,0,5,0\n\
                   o2,appC,nodur,timer,9,9,9\n";
        let dur = "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,percentile_Average_0,percentile_Average_1,percentile_Average_25,percentile_Average_50,percentile_Average_75,percentile_Average_99,percentile_Average_100\n\
                   o1,appA,funcAAAAAAAAAA,100,3,50,900,50,50,80,100,120,150,160\n\
                   o1,appA,funcB,10,5,5,40,5,5,7,10,12,14,15\n";
        let mem = "HashOwner,HashApp,SampleCount,AverageAllocatedMb\no1,appA,10,256\n";
        let spec = AzureSpec {
            minutes: 3,
            ..AzureSpec::default()
        };
        let t = azure(inv, dur, Some(mem), &spec).unwrap();
        assert_eq!(t.functions.len(), 2, "function without durations skipped");
        assert_eq!(t.invocations.len(), 8);
        let b = t
            .functions
            .iter()
            .position(|f| f.name == "az-funcB")
            .unwrap();
        assert_eq!(t.functions[b].cold_ms, Some(40.0));
        assert_eq!(t.functions[b].mem_mb, 256.0);
        let bs: Vec<_> = t.invocations.iter().filter(|i| i.func == b).collect();
        assert!(
            bs.iter()
                .all(|i| (60_000.0..120_000.0).contains(&i.arrival_ms))
        );
        assert!(bs.iter().all(|i| i.exec_ms == 7.0));
        let bad = azure(inv, "HashApp,HashFunction\n", None, &spec).unwrap_err();
        assert!(
            bad.to_string().contains("missing column `Maximum`"),
            "{bad}"
        );
    }
}
