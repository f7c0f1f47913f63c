//! The simulated node: GPUs with D slots, container memory, PCIe, co-run sharing. Every policy
//! runs on this same executor; only the order of work (and, for the MQFQ policies, memory hints)
//! differs.
//!
//! # Model
//! - **Slots.** A dispatched batch holds one of the GPU's D slots from dispatch until its last
//!   invocation ends, through startup (cold start or restore) and execution, back to back on one
//!   container. D comes from [`ConcurrencyController`] fed with the GPU's utilization averaged
//!   over each `sample_ms`, or is fixed with the published utilization gate (`mqfq-paper`).
//! - **Startup.** Hot container: none. Warm container (memory on host): its `mem_mb` over PCIe at
//!   `pcie_gbps` GB/s (on a node of GPU models, scaled by each model's host link against the
//!   reference A30's: an H100's PCIe 5.0 moves twice as fast). No container: `cold_ms`. Evicting victims to make room also moves their
//!   bytes over PCIe first. Transfers on one GPU's link are serialized. With a CUDA context per
//!   container (`context_mb`), a Warm container keeps it on its GPU under `uvm`; under
//!   `checkpoint` the context moves too, at `checkpoint_gbps` (issue 36).
//! - **Memory.** Hot containers (busy, idle, or being restored) count against the GPU's budget
//!   (capacity minus the tier headroom). Victims come from [`TierPolicy`]. A batch that cannot
//!   get memory waits in its slot until some finishes; if nothing else runs on that GPU it is
//!   admitted over budget (unified memory oversubscription) rather than deadlock.
//! - **Co-run.** An executing invocation demands `util` of the GPU's compute. With demands
//!   `Σu ≤ 1` everyone runs at solo speed; above that each runs at `C / Σu` where
//!   `C = 1 + min(gain × (k − 1), gain_max)` is the GPU's capacity with k co-runners (a small,
//!   bounded gain from overlapping; time-sliced, `1 − cost` with two or more: `Corun`). No
//!   invocation runs faster than solo, and total work done per second never exceeds
//!   `C ≤ 1 + gain_max`.
//! - **Tiers.** Idle Hot containers are evicted at the hot TTL, Warm ones dropped at the warm TTL.

use std::collections::VecDeque;

mod budget;
mod dispatch;
mod memory;
mod model;
mod node;
mod physical;
mod sampling;

pub use crate::node::pool_config;

use crate::policy::{Gate, MemoryModel, MemoryStyle, NAIVE_GATE, PUBLISHED_GATE, Policy, PoolView};
use crate::trace::Trace;
use crate::types::{Audit, Baselines, Record, SimConfig, SimError, SimOutput, WarmStats};
use dispatch::Clock;
use model::{Budget, Model, NodePool, Physical};
use scheduler_core::concurrency::ConcurrencyController;
use scheduler_core::config::ConfigError;
use scheduler_core::tiers::{Tier, TierPolicy};
use scheduler_core::time::Time;
use scheduler_core::warm::Warm;

#[derive(Debug)]
struct Gpu {
    budget_mb: f64,
    used_mb: f64,
    conc: ConcurrencyController,
    slots: u32,
    /// Its host link, GB/s (`pcie_gbps` scaled by its model's link against the reference's).
    link_gbps: f64,
    pcie_free_ms: f64,
    gate_est: f64,
    util_smooth: f64,
    /// Σ over time of the SM share in use (SM activity, as GPM reads it).
    busy_ms: f64,
    busy_at_sample: f64,
    /// Time in which any invocation executed (busy-time, as NVML's `utilization.gpu` reads it).
    any_ms: f64,
    any_at_sample: f64,
}

#[derive(Debug)]
struct Container {
    func: usize,
    gpu: usize,
    tier: Tier,
    busy: bool,
    alive: bool,
    last_used_ms: f64,
    uses: u64,
    ready_ms: f64,
    /// When its last eviction's transfer ends on its GPU's link (a move elsewhere waits for it).
    evicted_until_ms: f64,
    /// Claimed on another GPU than the one it was checkpointed on, its restore not yet begun.
    moving: bool,
    gdsf: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    WaitMem,
    Startup { until: f64 },
    Exec { remaining: f64 },
}

#[derive(Debug)]
struct Run {
    gpu: usize,
    func: usize,
    container: Option<usize>,
    rest: VecDeque<usize>,
    current: usize,
    phase: Phase,
}

const EPS: f64 = 1e-7;

struct Engine<'t, M> {
    trace: &'t Trace,
    cfg: SimConfig,
    tiers: TierPolicy,
    gpus: Vec<Gpu>,
    containers: Vec<Container>,
    by_func: Vec<Vec<usize>>,
    runs: Vec<Option<Run>>,
    best: Vec<Tier>,
    startup: Vec<f64>,
    records: Vec<Option<Record>>,
    pending_start: Vec<(f64, Tier)>,
    /// When each invocation's execution began (its burst, as the daemon measures it).
    exec_start: Vec<f64>,
    /// GPU 0's limit in force over time: `(seconds since the first arrival, limit)` at each
    /// change.
    limits: Vec<(f64, u32)>,
    audit: Audit,
    pcie_mb: f64,
    warm: WarmStats,
    /// GPU memory Warm containers hold now, MB.
    warm_gpu_mb: f64,
    now: f64,
    d_integral: f64,
    slot_integral: f64,
    /// The memory model's own state.
    model: M,
    /// `[gpu][function]`: solo run time on that GPU's model over the reference's.
    exec_factor: Vec<Vec<f64>>,
}

fn ms(t: f64) -> Time {
    Time::from_millis_f64(t)
}

impl<M: Model> Engine<'_, M> {
    fn cold_ms(&self, f: usize) -> f64 {
        self.trace.functions[f].cold_ms.unwrap_or(self.cfg.cold_ms)
    }
    fn mem(&self, f: usize) -> f64 {
        self.trace.functions[f].mem_mb
    }
    /// What a Hot container of `f` holds on its GPU: its memory and its CUDA context.
    fn hot_mb(&self, f: usize) -> f64 {
        self.mem(f) + self.cfg.context_mb
    }
    /// What an evict or a restore of `f`'s container moves: under `uvm` its memory (the
    /// context stays on the GPU), under `checkpoint` all it holds.
    fn moved_mb(&self, f: usize) -> f64 {
        match self.cfg.warm {
            Warm::Uvm | Warm::Off => self.mem(f),
            Warm::Checkpoint => self.hot_mb(f),
        }
    }
    /// What a Warm container of `f` still holds on its GPU (its context under `uvm`).
    fn warm_mb(&self, f: usize) -> f64 {
        self.hot_mb(f) - self.moved_mb(f)
    }
    /// The share of the link's rate a move gets: 1 under `uvm` (a prefetch at the link's
    /// rate), the checkpoint rate's share of it under `checkpoint`.
    fn move_share(&self, g: usize) -> f64 {
        match self.cfg.warm {
            Warm::Uvm | Warm::Off => 1.0,
            Warm::Checkpoint => (self.cfg.checkpoint_gbps / self.gpus[g].link_gbps).min(1.0),
        }
    }
    /// Milliseconds an evict or restore of `mb` takes on GPU `g`.
    fn move_ms(&self, g: usize, mb: f64) -> f64 {
        self.transfer_ms(g, mb) / self.move_share(g)
    }
    /// A container of `f` went Warm (`true`) or left Warm: what Warm containers hold on the
    /// GPUs follows.
    fn warm_moved(&mut self, f: usize, into: bool) {
        let mb = self.warm_mb(f);
        if into {
            self.warm_gpu_mb += mb;
            self.warm.peak_warm_gpu_mb = self.warm.peak_warm_gpu_mb.max(self.warm_gpu_mb);
        } else {
            self.warm_gpu_mb -= mb;
        }
    }
    /// A Warm container's memory is back at `until`.
    fn restored(&mut self, until: f64) {
        self.warm.restores += 1;
        self.warm.restore_ms += until - self.now;
    }
    /// Milliseconds to move `mb` over GPU `g`'s host link.
    fn transfer_ms(&self, g: usize, mb: f64) -> f64 {
        mb / self.gpus[g].link_gbps
    }

    fn idle_container(&self, f: usize, g: usize, tier: Tier) -> Option<usize> {
        self.by_func[f]
            .iter()
            .copied()
            .filter(|&c| {
                let c = &self.containers[c];
                c.gpu == g && !c.busy && c.tier == tier
            })
            .min_by(|&a, &b| {
                self.containers[a]
                    .ready_ms
                    .total_cmp(&self.containers[b].ready_ms)
            })
    }

    fn choose_gpu(&self, f: usize) -> Option<usize> {
        (0..self.gpus.len())
            .filter(|&g| M::slots_free(self, g))
            .min_by(|&a, &b| {
                let rank = |g| {
                    if self.idle_container(f, g, Tier::Hot).is_some() {
                        0
                    } else if self.idle_container(f, g, Tier::Warm).is_some() {
                        1
                    } else {
                        2
                    }
                };
                let free = |g: usize| self.gpus[g].budget_mb - self.gpus[g].used_mb;
                rank(a)
                    .cmp(&rank(b))
                    .then(free(b).total_cmp(&free(a)))
                    .then(a.cmp(&b))
            })
    }

    /// Brings container `c` onto its GPU — a restore over PCIe when Warm, a cold start when
    /// Cold — with its memory counted there; returns when it is ready.
    fn bring_in(&mut self, c: usize) -> f64 {
        let (f, g, was) = {
            let ct = &self.containers[c];
            (ct.func, ct.gpu, ct.tier)
        };
        let until = if was == Tier::Warm {
            let moved = self.moved_mb(f);
            self.gpus[g].used_mb += moved;
            self.warm_moved(f, false);
            let until = self.move_link(g, moved);
            self.restored(until);
            until
        } else {
            self.gpus[g].used_mb += self.hot_mb(f);
            (self.now + self.cold_ms(f)).max(self.gpus[g].pcie_free_ms)
        };
        let ct = &mut self.containers[c];
        ct.tier = Tier::Hot;
        ct.ready_ms = until;
        until
    }

    /// Run `r` has its container: startup until `until`, from a container that was `tier`.
    fn starting_up(&mut self, r: usize, until: f64, tier: Tier, policy: &mut dyn Policy) {
        let run = self.runs[r].as_mut().expect("run exists");
        run.phase = Phase::Startup { until };
        self.pending_start[run.current] = (self.now, tier);
        let f = run.func;
        self.refresh(f, policy);
    }

    /// A container of `f` on GPU `g` that does not exist yet (Cold, no memory).
    fn new_container(&mut self, f: usize, g: usize) -> usize {
        self.containers.push(Container {
            func: f,
            gpu: g,
            tier: Tier::Cold,
            busy: false,
            alive: true,
            last_used_ms: self.now,
            uses: 0,
            ready_ms: self.now,
            evicted_until_ms: self.now,
            moving: false,
            gdsf: 0.0,
        });
        let c = self.containers.len() - 1;
        self.by_func[f].push(c);
        c
    }

    /// Run `r`'s GPU and function.
    fn run_site(&self, r: usize) -> (usize, usize) {
        let run = self.runs[r].as_ref().expect("run exists");
        (run.gpu, run.func)
    }

    fn retry_waiting(&mut self, g: usize, policy: &mut dyn Policy) {
        let waiting: Vec<usize> = (0..self.runs.len())
            .filter(|&r| {
                self.runs[r]
                    .as_ref()
                    .is_some_and(|run| run.gpu == g && run.phase == Phase::WaitMem)
            })
            .collect();
        for r in waiting {
            let others_active = self
                .runs
                .iter()
                .flatten()
                .any(|run| run.gpu == g && !matches!(run.phase, Phase::WaitMem));
            M::acquire(self, r, !others_active, policy);
        }
    }

    fn speeds(&self, g: usize) -> (f64, f64) {
        let (mut demand, mut k) = (0.0, 0u32);
        for run in self.runs.iter().flatten() {
            if run.gpu == g && matches!(run.phase, Phase::Exec { .. }) {
                demand += self.trace.functions[run.func].util;
                k += 1;
            }
        }
        if k == 0 {
            return (1.0, 0.0);
        }
        let speed = self
            .cfg
            .corun
            .speed(k, demand, self.cfg.corun_gain, self.cfg.corun_gain_max);
        (speed, demand.min(1.0))
    }

    fn advance(&mut self, to: f64) {
        let dt = to - self.now;
        if dt > 0.0 {
            for g in 0..self.gpus.len() {
                let (speed, util) = self.speeds(g);
                self.gpus[g].busy_ms += util * dt;
                if util > 0.0 {
                    self.gpus[g].any_ms += dt;
                }
                let limit = M::d_in_force(self, g);
                self.d_integral += f64::from(limit) * dt;
                self.slot_integral += f64::from(self.gpus[g].slots) * dt;
                for run in self.runs.iter_mut().flatten() {
                    if run.gpu == g
                        && let Phase::Exec { remaining } = &mut run.phase
                    {
                        *remaining -= speed * dt;
                    }
                }
            }
        }
        self.now = to;
    }

    fn next_phase_end(&self) -> f64 {
        let mut t = f64::INFINITY;
        let speeds: Vec<f64> = (0..self.gpus.len()).map(|g| self.speeds(g).0).collect();
        for run in self.runs.iter().flatten() {
            match run.phase {
                Phase::Startup { until } => t = t.min(until),
                Phase::Exec { remaining } => {
                    t = t.min(self.now + remaining.max(0.0) / speeds[run.gpu]);
                }
                Phase::WaitMem => {}
            }
        }
        t
    }

    /// Run `r` starts executing `inv`: a burst begins.
    fn begin_exec(&mut self, r: usize, inv: usize) {
        let run = self.runs[r].as_mut().expect("run");
        run.phase = Phase::Exec {
            remaining: self.trace.invocations[inv].exec_ms * self.exec_factor[run.gpu][run.func],
        };
        let g = run.gpu;
        self.exec_start[inv] = self.now;
        M::exec_began(self, g, inv);
    }

    /// `inv` ended on GPU `g`.
    fn finish(&mut self, inv: usize, g: usize, policy: &mut dyn Policy) {
        let (start, tier) = self.pending_start[inv];
        // What the daemon measures of a burst: its execution, co-runners' slowdown included.
        let service_ms = self.now - self.exec_start[inv];
        if self.records[inv].is_some() {
            self.audit.double_completions += 1;
        }
        self.records[inv] = Some(Record {
            start_ms: start,
            end_ms: self.now,
            tier,
            gpu: Some(g),
        });
        M::exec_ended(self, g, inv, service_ms, policy);
    }

    fn step_phases(&mut self, policy: &mut dyn Policy) {
        for r in 0..self.runs.len() {
            let Some(run) = self.runs[r].as_ref() else {
                continue;
            };
            match run.phase {
                Phase::Startup { until } if until <= self.now + EPS => {
                    let inv = run.current;
                    self.begin_exec(r, inv);
                }
                Phase::Exec { remaining } if remaining <= EPS => {
                    let (inv, g) = (run.current, run.gpu);
                    let c = run.container.expect("executing run has a container");
                    self.finish(inv, g, policy);
                    let mb = self.mem(self.containers[c].func);
                    let uses = self.containers[c].uses + 1;
                    #[expect(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "a footprint in MB, finite and >= 0: its bytes fit u64"
                    )]
                    let credit = self.tiers.credit(
                        uses,
                        self.transfer_ms(g, mb) / 1e3,
                        (mb * 1024.0 * 1024.0) as u64,
                    );
                    let ct = &mut self.containers[c];
                    ct.last_used_ms = self.now;
                    ct.uses = uses;
                    ct.gdsf = credit;
                    let run = self.runs[r].as_mut().expect("run");
                    if let Some(next) = run.rest.pop_front() {
                        run.current = next;
                        self.pending_start[next] = (self.now, Tier::Hot);
                        self.begin_exec(r, next);
                    } else {
                        let (g, f) = (run.gpu, run.func);
                        self.runs[r] = None;
                        self.containers[c].busy = false;
                        self.gpus[g].slots -= 1;
                        M::released(self, c, g, f, policy);
                        self.refresh(f, policy);
                        self.retry_waiting(g, policy);
                    }
                }
                _ => {}
            }
        }
    }
}

fn gpu_index(g: usize) -> u32 {
    u32::try_from(g).unwrap_or(u32::MAX)
}

/// The simulated node for `cfg`, before the first event.
fn engine<'t, M: Model>(
    trace: &'t Trace,
    cfg: &SimConfig,
    model: M,
) -> Result<Engine<'t, M>, SimError> {
    let mut q = cfg.profile.queue();
    let mut conc_cfg = cfg.profile.concurrency(cfg.mode);
    cfg.overrides.apply(&mut q, &mut conc_cfg, cfg.mode)?;
    let links = crate::hetero::link_factors(&cfg.gpu_models, cfg.gpus);
    let gpus = (0..cfg.gpus)
        .map(|g| {
            Ok(Gpu {
                link_gbps: cfg.pcie_gbps * links.get(g).copied().unwrap_or(1.0),
                budget_mb: cfg.mem_mb(g) * (1.0 - cfg.tiers.headroom),
                used_mb: 0.0,
                conc: ConcurrencyController::new(conc_cfg.clone())?,
                slots: 0,
                pcie_free_ms: 0.0,
                gate_est: 0.0,
                util_smooth: 0.0,
                busy_ms: 0.0,
                busy_at_sample: 0.0,
                any_ms: 0.0,
                any_at_sample: 0.0,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let n = trace.functions.len();
    Ok(Engine {
        trace,
        cfg: cfg.clone(),
        tiers: TierPolicy::new(cfg.tiers.clone())?,
        gpus,
        containers: Vec::new(),
        by_func: vec![Vec::new(); n],
        runs: Vec::new(),
        best: vec![Tier::Cold; n],
        startup: (0..n)
            .map(|f| trace.functions[f].cold_ms.unwrap_or(cfg.cold_ms))
            .collect(),
        records: vec![None; trace.invocations.len()],
        pending_start: vec![(0.0, Tier::Cold); trace.invocations.len()],
        exec_start: vec![0.0; trace.invocations.len()],
        limits: Vec::new(),
        audit: Audit::default(),
        pcie_mb: 0.0,
        warm: WarmStats::default(),
        warm_gpu_mb: 0.0,
        now: trace.invocations.first().map_or(0.0, |i| i.arrival_ms),
        d_integral: 0.0,
        slot_integral: 0.0,
        model,
        exec_factor: crate::hetero::exec_factors(&cfg.gpu_models, cfg.gpus, trace),
    })
}

/// Runs `policy` over `trace` on the simulated node.
///
/// # Errors
/// A bad knob, or [`SimError::Stuck`] if the event loop stops progressing.
pub fn simulate(
    trace: &Trace,
    policy: &mut dyn Policy,
    cfg: &SimConfig,
) -> Result<SimOutput, SimError> {
    cfg.validate()?;
    let model = match (cfg.baselines, policy.model()) {
        // A baseline as the seed ran it.
        (
            Baselines::Paper,
            MemoryModel::Budget {
                gate: Gate::Dynamic,
                ..
            },
        ) => MemoryModel::Budget {
            gate: PUBLISHED_GATE,
            style: MemoryStyle::EvictAfterUse,
        },
        (
            Baselines::Naive,
            MemoryModel::Budget {
                gate: Gate::Dynamic,
                ..
            },
        ) => MemoryModel::Budget {
            gate: NAIVE_GATE,
            style: MemoryStyle::ColdEveryCall,
        },
        (_, m) => m,
    };
    match model {
        MemoryModel::Node => run(engine(trace, cfg, NodePool::new(cfg.gpus))?, policy),
        MemoryModel::Budget { gate, style } => {
            run(engine(trace, cfg, Budget { gate, style })?, policy)
        }
        MemoryModel::Physical => run(engine(trace, cfg, Physical)?, policy),
    }
}

/// The event loop, on the memory model `M`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "samples per 500 ms: rounded and >= 1, sample_ms being finite and > 0"
)]
fn run<M: Model>(mut e: Engine<'_, M>, policy: &mut dyn Policy) -> Result<SimOutput, SimError> {
    M::start(&mut e, policy);
    let (trace, sample_ms) = (e.trace, e.cfg.sample_ms);
    let first = e.now;
    let mut clock = Clock {
        first,
        next_arrival: 0,
        next_sample: first + sample_ms,
        samples: 0,
        paper_every: (500.0 / sample_ms).round().max(1.0) as u64,
    };
    let max_iterations = 1_000_000 + 200 * trace.invocations.len() as u64;
    for _ in 0..max_iterations {
        let busy = e.runs.iter().any(Option::is_some) || policy.queued() > 0;
        let t_arr = trace
            .invocations
            .get(clock.next_arrival)
            .map_or(f64::INFINITY, |i| i.arrival_ms);
        if !busy && t_arr.is_infinite() {
            return Ok(e.output(policy, clock.first));
        }
        if !busy && clock.next_sample < t_arr {
            e.skip_idle(&mut clock, t_arr, policy);
        }
        let t_timer = policy
            .next_timer()
            .map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3);
        let t = t_arr
            .min(e.next_phase_end())
            .min(clock.next_sample)
            .min(t_timer.max(e.now));
        if !t.is_finite() {
            return Err(SimError::Stuck(e.now));
        }
        e.advance(t.max(e.now));
        e.step_phases(policy);
        e.arrivals(&mut clock, policy);
        if e.now + EPS >= clock.next_sample {
            e.sample(&mut clock, policy);
        }
        M::signals(&mut e, policy);
        M::dispatch(&mut e, policy);
        e.check_work_conserving(policy);
    }
    Err(SimError::Stuck(e.now))
}
