//! Flags and subcommands.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

mod node_args;

use node_args::NodeArgs;
#[cfg(test)]
use node_args::parse_weights;

use crate::report::per_invocation_csv;
use crate::workload::{AzureSpec, MixSpec, azure, design_mix};
use crate::{POLICIES, SimConfig, Summary, Trace, run_policy, summarize};
use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

/// Trace-driven simulator of GPU function queueing policies.
#[derive(Debug, Parser)]
#[command(name = "mqfq-sim", version)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one policy over a trace; JSON summary on stdout.
    Run(RunArgs),
    /// Run every policy over one trace; table on stdout, optional CDF plot.
    Compare(CompareArgs),
    /// Generate a trace.
    #[command(subcommand)]
    Gen(GenCmd),
    /// Each concurrency law in closed loop over a table measured on a GPU (the GPU check's
    /// `conc-*.csv`): the limit each settles at.
    Controllers(ControllersArgs),
    /// mqfq-sticky under every placement on a (heterogeneous) node: fitness, least-loaded,
    /// round-robin, random.
    Placements(PlacementsArgs),
    /// mqfq-sticky on several nodes under each way of picking a node: mqfq's extender,
    /// round-robin, random; with each node's API writes per minute.
    Cluster(ClusterArgs),
    /// mqfq-sticky against fcfs on seeded random workloads and nodes (docs/SIMULATOR.md): the
    /// share of draws where it is no worse, and the worst draws.
    Sweep(SweepArgs),
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Draws.
    #[arg(long, default_value_t = 200)]
    draws: u64,
    /// Seed of the sweep.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds of arrivals per draw.
    #[arg(long, default_value_t = 300.0)]
    duration_s: f64,
    /// Functions with mean exec below this are "short", ms.
    #[arg(long, default_value_t = 1000.0)]
    short_ms: f64,
    /// Write every draw's outcome as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// mqfq-sticky's `short_charge_s` on every draw (0: no short-slot reserve).
    #[arg(long)]
    short_charge_s: Option<f64>,
    /// mqfq-sticky's `overtake_bound` on every draw (0: off).
    #[arg(long)]
    overtake_bound: Option<f64>,
    /// mqfq-sticky's maximum burst hold on every draw, seconds (0: none; default: mqfqd's).
    #[arg(long)]
    max_burst_hold_s: Option<f64>,
    /// Instead of running: write draw N's trace to --out and print its node's flags (to look
    /// into one draw with `compare`).
    #[arg(long, requires = "out")]
    write_draw: Option<u64>,
    /// Where --write-draw writes the trace.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// Trace CSV.
    #[arg(long)]
    trace: PathBuf,
    /// Nodes the GPUs are split into, in order (must divide --gpus).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Debug, Args)]
struct PlacementsArgs {
    /// Trace CSV.
    #[arg(long)]
    trace: PathBuf,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Debug, Args)]
struct ControllersArgs {
    /// `streams,busy,sm,dram,bursts_per_s,burst_ms` CSV.
    #[arg(long)]
    table: PathBuf,
    /// Ceiling of D.
    #[arg(long, default_value_t = 8)]
    d_max: u32,
    /// Sample periods to run.
    #[arg(long, default_value_t = 600)]
    samples: usize,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Trace CSV.
    #[arg(long)]
    trace: PathBuf,
    /// fcfs, batch, sjf, paella, mqfq-paper or mqfq-sticky.
    #[arg(long)]
    policy: String,
    /// Where to write one row per invocation.
    #[arg(long)]
    per_invocation: PathBuf,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Debug, Args)]
struct CompareArgs {
    /// Trace CSV.
    #[arg(long)]
    trace: PathBuf,
    /// Write latency CDFs per policy to this SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write every policy's summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write GPU 0's concurrency limit over time per policy to this SVG.
    #[arg(long)]
    plot_d: Option<PathBuf>,
    /// Also run `none` (no admission: every call at once, idle containers keep their memory,
    /// a start past the GPU's memory fails or pages, see --none-memory), what a node runs today.
    #[arg(long)]
    with_none: bool,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Debug, Subcommand)]
enum GenCmd {
    /// The design's mix: 0.02 s matrix, 2.25 s image classification, 4.48 s video functions.
    Mix(MixArgs),
    /// Convert the Azure Functions 2019 public trace to our format.
    Azure(AzureArgs),
}

#[derive(Debug, Args)]
struct MixArgs {
    /// Output trace CSV.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 12)]
    functions: usize,
    /// Fraction of invocations that are short.
    #[arg(long, default_value_t = 0.7)]
    short_frac: f64,
    /// Offered GPU load (1.0 = the GPUs' capacity).
    #[arg(long, default_value_t = 0.8)]
    load: f64,
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    #[arg(long, default_value_t = 600.0)]
    duration_s: f64,
    /// 1 = Poisson; k > 1 = each function on in a window with probability 1/k at k × its rate.
    #[arg(long, default_value_t = 1.0)]
    burst: f64,
    #[arg(long, default_value_t = 30.0)]
    burst_window_s: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Memory pressure: footprints scaled to add up to this many times the GPUs' memory.
    #[arg(long)]
    memory_factor: Option<f64>,
    /// Memory of one GPU, MB, for `--memory-factor` (use the same with `compare`).
    #[arg(long, default_value_t = 24_576.0)]
    gpu_mem_mb: f64,
    /// A flood: the first long function offers this much load (fraction of the GPUs' capacity)
    /// on its own, on top of `--load`.
    #[arg(long)]
    flood: Option<f64>,
    /// Fraction of each kind's functions that are memory-bound (trace column `bw` 0.8, the
    /// others 0.1), for heterogeneous nodes (`--gpu-models`).
    #[arg(long, default_value_t = 0.0)]
    memory_bound: f64,
}

#[derive(Debug, Args)]
struct AzureArgs {
    /// invocations_per_function_md.anon.dNN.csv
    #[arg(long)]
    invocations: PathBuf,
    /// function_durations_percentiles.anon.dNN.csv
    #[arg(long)]
    durations: PathBuf,
    /// app_memory_percentiles.anon.dNN.csv (optional)
    #[arg(long)]
    memory: Option<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Keep the K most-invoked functions.
    #[arg(long, default_value_t = 20)]
    functions: usize,
    #[arg(long, default_value_t = 1)]
    start_minute: usize,
    #[arg(long, default_value_t = 60)]
    minutes: usize,
    #[arg(long, default_value_t = 3072.0)]
    default_mem_mb: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn load_trace(path: &Path) -> Result<Trace> {
    Trace::parse(&read(path)?).with_context(|| format!("in trace {}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn save_trace(path: &Path, t: &Trace) -> Result<()> {
    write(path, &t.to_csv())?;
    eprintln!(
        "wrote {} invocations of {} functions to {}",
        t.invocations.len(),
        t.functions.len(),
        path.display()
    );
    Ok(())
}

impl Cli {
    /// Runs the chosen subcommand.
    ///
    /// # Errors
    /// Bad flags, unreadable files, bad traces.
    pub fn run(self) -> Result<()> {
        match self.cmd {
            Cmd::Run(a) => run(&a),
            Cmd::Compare(a) => compare(&a),
            Cmd::Controllers(a) => controllers(&a),
            Cmd::Placements(a) => {
                if let Some(p) = &a.node.placement {
                    bail!(
                        "--placement {p}: `placements` runs every placement side by side; \
                         `run --placement {p}` runs one"
                    );
                }
                let cfg = a.node.config()?;
                let trace = load_trace(&a.trace)?;
                print!("{}", crate::hetero::report(&trace, &cfg, a.node.short_ms)?);
                Ok(())
            }
            Cmd::Sweep(a) => {
                if a.draws == 0 || !(a.duration_s.is_finite() && a.duration_s > 0.0) {
                    bail!("--draws must be at least 1 and --duration-s > 0");
                }
                if a.max_burst_hold_s
                    .is_some_and(|h| !(h.is_finite() && h >= 0.0))
                {
                    bail!("--max-burst-hold-s must be a finite number >= 0 (0: none)");
                }
                if let (Some(i), Some(out)) = (a.write_draw, &a.out) {
                    let (d, t, cfg) = crate::sweep::draw(a.seed, i, a.duration_s);
                    write(out, &t.to_csv())?;
                    let mems: Vec<String> =
                        cfg.gpu_mem_each_mb.iter().map(|m| format!("{m}")).collect();
                    println!(
                        "--gpus {} --gpu-mems-mb {}    # {d:?}",
                        cfg.gpus,
                        mems.join(",")
                    );
                    return Ok(());
                }
                let outcomes = (0..a.draws)
                    .map(|i| {
                        let knobs = crate::sweep::Knobs {
                            short_charge_s: a.short_charge_s,
                            overtake_bound: a.overtake_bound,
                            max_burst_hold_s: a.max_burst_hold_s,
                        };
                        crate::sweep::run(a.seed, i, a.duration_s, a.short_ms, knobs)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                print!("{}", crate::sweep::report(&outcomes));
                if let Some(j) = &a.json {
                    write(j, &serde_json::to_string_pretty(&outcomes)?)?;
                }
                Ok(())
            }
            Cmd::Cluster(a) => {
                let cfg = SimConfig {
                    nodes: a.nodes,
                    ..a.node.config()?
                };
                let trace = load_trace(&a.trace)?;
                print!("{}", crate::cluster::report(&trace, &cfg, a.node.short_ms)?);
                Ok(())
            }
            Cmd::Gen(GenCmd::Mix(a)) => {
                let t = design_mix(&MixSpec {
                    functions: a.functions,
                    short_frac: a.short_frac,
                    load: a.load,
                    gpus: a.gpus,
                    duration_s: a.duration_s,
                    burst: a.burst,
                    burst_window_s: a.burst_window_s,
                    seed: a.seed,
                    memory_factor: a.memory_factor,
                    gpu_mem_mb: a.gpu_mem_mb,
                    flood: a.flood,
                    memory_bound: a.memory_bound,
                })?;
                save_trace(&a.out, &t)
            }
            Cmd::Gen(GenCmd::Azure(a)) => {
                let mem = a.memory.as_deref().map(read).transpose()?;
                let t = azure(
                    &read(&a.invocations)?,
                    &read(&a.durations)?,
                    mem.as_deref(),
                    &AzureSpec {
                        functions: a.functions,
                        start_minute: a.start_minute,
                        minutes: a.minutes,
                        default_mem_mb: a.default_mem_mb,
                        seed: a.seed,
                    },
                )?;
                save_trace(&a.out, &t)
            }
        }
    }
}

fn run(a: &RunArgs) -> Result<()> {
    if !POLICIES.contains(&a.policy.as_str()) && a.policy != "none" {
        bail!(
            "unknown policy `{}` (expected one of {}, or none)",
            a.policy,
            POLICIES.join(", ")
        );
    }
    let cfg = a.node.config()?;
    let trace = load_trace(&a.trace)?;
    let out = run_policy(&a.policy, &trace, &cfg)?;
    write(&a.per_invocation, &per_invocation_csv(&trace, &out))?;
    let s = summarize(&trace, &out, a.node.short_ms);
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(())
}

fn fmt_s(ms: Option<f64>) -> String {
    ms.map_or_else(|| "-".into(), |v| format!("{:.2}", v / 1e3))
}

/// The comparison table (Markdown) with ratios of `mqfq-sticky` to `fcfs` and `mqfq-paper`.
#[must_use]
pub fn table(sums: &[Summary]) -> String {
    let mut t = String::from(
        "| policy | mean s | p50 s | p99 s | short mean s | long mean s | Jain | GPU busy | busy time | hot/warm/cold | mean limit | share Jain | worst/best slowdown |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in sums {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {:.3} | {:.1} % | {:.1} % | {}/{}/{} | {:.2} | {:.3} | {:.1} |",
            s.policy,
            fmt_s(Some(s.mean_ms)),
            fmt_s(Some(s.p50_ms)),
            fmt_s(Some(s.p99_ms)),
            fmt_s(s.short_mean_ms),
            fmt_s(s.long_mean_ms),
            s.jain_slowdown,
            s.gpu_busy * 100.0,
            s.gpu_busy_time * 100.0,
            s.tiers.hot,
            s.tiers.warm,
            s.tiers.cold,
            s.mean_d,
            s.share.jain,
            s.slowdown_spread
        );
    }
    let find = |n: &str| sums.iter().find(|s| s.policy == n);
    if let (Some(ours), Some(fcfs), Some(paper)) =
        (find("mqfq-sticky"), find("fcfs"), find("mqfq-paper"))
    {
        // (mean, p99, short-function mean) of `a` relative to `b`.
        let ratios = |a: &Summary, b: &Summary| {
            let short = |s: &Summary| s.short_mean_ms.unwrap_or(f64::NAN);
            (
                a.mean_ms / b.mean_ms,
                a.p99_ms / b.p99_ms,
                short(a) / short(b),
            )
        };
        let (mean, p99, short) = ratios(ours, fcfs);
        let _ = writeln!(
            t,
            "\nmqfq-sticky / fcfs: mean {mean:.3}×, p99 {p99:.3}×, short-function mean {short:.3}× ({:.1}× faster)",
            1.0 / short
        );
        if let Some((name, r)) = heaviest_ratio(ours, fcfs) {
            let _ = writeln!(t, "heaviest function ({name}) mean / fcfs: {r:.3}×");
        }
        let (mean, p99, short) = ratios(ours, paper);
        let _ = writeln!(
            t,
            "mqfq-sticky / mqfq-paper: mean {mean:.3}×, p99 {p99:.3}×, short-function mean {short:.3}×"
        );
    }
    t
}

/// The function offering the most GPU time (invocations × solo exec) and its mean latency under
/// `a` over its mean under `b`.
#[expect(clippy::cast_precision_loss, reason = "invocation counts")]
fn heaviest_ratio<'a>(a: &'a Summary, b: &Summary) -> Option<(&'a str, f64)> {
    let heavy = a
        .per_function
        .iter()
        .max_by(|x, y| (x.count as f64 * x.exec_ms).total_cmp(&(y.count as f64 * y.exec_ms)))?;
    let other = b.per_function.iter().find(|f| f.name == heavy.name)?;
    Some((&heavy.name, heavy.mean_ms / other.mean_ms))
}

fn controllers(a: &ControllersArgs) -> Result<()> {
    let text = fs::read_to_string(&a.table).with_context(|| format!("{}", a.table.display()))?;
    let rows =
        crate::controllers::parse(&text).with_context(|| format!("{}", a.table.display()))?;
    let out = crate::controllers::compare(&rows, a.d_max, a.samples.max(2))?;
    print!("{}", crate::controllers::report(&rows, &out));
    Ok(())
}

fn compare(a: &CompareArgs) -> Result<()> {
    let cfg = a.node.config()?;
    let trace = load_trace(&a.trace)?;
    let mut sums = Vec::new();
    let mut cdfs = Vec::new();
    let mut limits = Vec::new();
    let none = a.with_none.then_some("none");
    let mut failed = None;
    for p in POLICIES.into_iter().chain(none) {
        let out = run_policy(p, &trace, &cfg)?;
        if p == "none" {
            failed = Some(out.audit.failed_starts);
        }
        limits.push((p, out.limits.clone()));
        let s = summarize(&trace, &out, a.node.short_ms);
        let mut lat = crate::report::latencies_s(&trace, &out);
        lat.sort_by(f64::total_cmp);
        cdfs.push((p, lat));
        sums.push(s);
    }
    println!(
        "trace: {} ({} invocations, {} functions); {} GPU(s), {} MB, {:?}, profile {:?}, baselines {:?}\n",
        a.trace.display(),
        trace.invocations.len(),
        trace.functions.len(),
        cfg.gpus,
        cfg.mem_label(),
        cfg.mode,
        cfg.profile,
        cfg.baselines
    );
    print!("{}", table(&sums));
    if let Some(n) = failed {
        println!(
            "none: {n} of {} calls failed to start (past the GPU's memory, --none-memory {:?}); its latencies are the others'",
            trace.invocations.len(),
            cfg.none_memory
        );
    }
    if let Some(j) = &a.json {
        write(j, &serde_json::to_string_pretty(&sums)?)?;
    }
    if let Some(p) = &a.plot {
        crate::plot::cdf(p, &cdfs)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.plot_d {
        crate::plot::limits(p, &limits)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_weights_parse_by_name_over_the_defaults() {
        let w = parse_weights("queue=2, balance=0").unwrap();
        let d = scheduler_core::placement::Weights::default();
        assert_eq!((w.queue, w.balance, w.fitness), (2.0, 0.0, d.fitness));
        for (bad, says) in [
            ("speed=2", "unknown weight"),
            ("queue", "not name=value"),
            ("queue=fast", "not a number"),
            ("queue=-1", "queue"),
        ] {
            let e = format!("{:#}", parse_weights(bad).unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
