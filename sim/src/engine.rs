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
//!   `pcie_gbps` GB/s. No container: `cold_ms`. Evicting victims to make room also moves their
//!   bytes over PCIe first. Transfers on one GPU's link are serialized.
//! - **Memory.** Hot containers (busy, idle, or being restored) count against the GPU's budget
//!   (capacity minus the tier headroom). Victims come from [`TierPolicy`]. A batch that cannot
//!   get memory waits in its slot until some finishes; if nothing else runs on that GPU it is
//!   admitted over budget (unified memory oversubscription) rather than deadlock.
//! - **Co-run.** An executing invocation demands `util` of the GPU's compute. With demands
//!   `Σu ≤ 1` everyone runs at solo speed; above that each runs at `C / Σu` where
//!   `C = 1 + min(gain × (k − 1), gain_max)` is the GPU's capacity with k co-runners (a small,
//!   bounded gain from overlapping). No invocation runs faster than solo, and total work done per
//!   second never exceeds `C ≤ 1 + gain_max`.
//! - **Tiers.** Idle Hot containers are evicted at the hot TTL, Warm ones dropped at the warm TTL.

use std::collections::VecDeque;

use crate::policy::{Admission, MemoryStyle, Policy, PoolView, Signal};
use crate::trace::Trace;
use crate::types::{Audit, Record, SimConfig, SimError, SimOutput};
use scheduler_core::concurrency::ConcurrencyController;
use scheduler_core::config::ConfigError;
use scheduler_core::ewma::Ewma;
use scheduler_core::tiers::{ContainerView, Tier, TierPolicy};
use scheduler_core::time::Time;

#[derive(Debug)]
struct Gpu {
    budget_mb: f64,
    used_mb: f64,
    conc: ConcurrencyController,
    slots: u32,
    long_slots: u32,
    pcie_free_ms: f64,
    gate_est: f64,
    util_smooth: f64,
    busy_ms: f64,
    busy_at_sample: f64,
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
    short: bool,
    container: Option<usize>,
    rest: VecDeque<usize>,
    current: usize,
    phase: Phase,
}

const EPS: f64 = 1e-7;

struct Engine<'t> {
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
    last_arrival: Vec<Option<f64>>,
    iat: Vec<Ewma>,
    audit: Audit,
    pcie_mb: f64,
    now: f64,
    d_integral: f64,
    slot_integral: f64,
    admission: Admission,
    reserve: bool,
}

fn ms(t: f64) -> Time {
    Time::from_millis_f64(t)
}

impl<'t> Engine<'t> {
    fn cold_ms(&self, f: usize) -> f64 {
        self.trace.functions[f].cold_ms.unwrap_or(self.cfg.cold_ms)
    }
    fn mem(&self, f: usize) -> f64 {
        self.trace.functions[f].mem_mb
    }
    fn transfer_ms(&self, mb: f64) -> f64 {
        mb / self.cfg.pcie_gbps
    }

    /// Recomputes a function's best idle tier and tells the policy when residency changes.
    fn refresh(&mut self, f: usize, policy: &mut dyn Policy) {
        let mut best = Tier::Cold;
        let mut ready = f64::INFINITY;
        for &c in &self.by_func[f] {
            let c = &self.containers[c];
            if c.busy {
                continue;
            }
            match c.tier {
                Tier::Hot => {
                    best = Tier::Hot;
                    ready = ready.min(c.ready_ms);
                }
                Tier::Warm if best == Tier::Cold => best = Tier::Warm,
                _ => {}
            }
        }
        let startup = match best {
            Tier::Hot => (ready - self.now).max(0.0),
            Tier::Warm => self.transfer_ms(self.mem(f)),
            Tier::Cold => self.cold_ms(f),
        };
        let cost = if best == Tier::Hot { 0.0 } else { startup };
        let changed = (self.best[f] == Tier::Hot) != (best == Tier::Hot)
            || (best != Tier::Hot && (self.startup[f] - startup).abs() > 1e-9);
        self.startup[f] = startup;
        self.best[f] = best;
        if changed {
            policy.set_resident(f, best == Tier::Hot, cost);
        }
    }

    fn pcie(&mut self, g: usize, mb: f64) -> f64 {
        self.pcie_mb += mb;
        let dur = self.transfer_ms(mb);
        let gpu = &mut self.gpus[g];
        let start = gpu.pcie_free_ms.max(self.now);
        gpu.pcie_free_ms = start + dur;
        gpu.pcie_free_ms
    }

    fn evict(&mut self, c: usize, policy: &mut dyn Policy) {
        let (g, f, mb) = {
            let ct = &mut self.containers[c];
            debug_assert!(ct.tier == Tier::Hot && !ct.busy);
            ct.tier = Tier::Warm;
            (ct.gpu, ct.func, self.trace.functions[ct.func].mem_mb)
        };
        self.gpus[g].used_mb -= mb;
        self.pcie(g, mb);
        self.refresh(f, policy);
    }

    /// Frees memory on GPU `g` so `need` MB fit; `active_ok` allows evicting active flows'
    /// containers. Returns false (and evicts nothing) if it cannot.
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn make_room(&mut self, g: usize, need: f64, active_ok: bool, policy: &mut dyn Policy) -> bool {
        let free = self.gpus[g].budget_mb - self.gpus[g].used_mb;
        if need <= free + EPS {
            return true;
        }
        let bw = self.cfg.pcie_gbps;
        let cands: Vec<ContainerView> = self
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.alive && c.gpu == g && c.tier == Tier::Hot && !c.busy)
            .filter(|(_, c)| active_ok || !policy.active(c.func))
            .map(|(i, c)| {
                let mb = self.trace.functions[c.func].mem_mb;
                ContainerView {
                    id: i as u64,
                    tier: c.tier,
                    busy: c.busy,
                    flow_active: policy.active(c.func),
                    bytes: (mb * 1024.0 * 1024.0) as u64,
                    last_used: ms(c.last_used_ms),
                    uses: c.uses,
                    reload_cost_s: mb / bw / 1e3,
                    priority: c.gdsf,
                }
            })
            .collect();
        let freeable: f64 = cands
            .iter()
            .map(|c| self.trace.functions[self.containers[c.id as usize].func].mem_mb)
            .sum();
        if free + freeable + EPS < need {
            return false;
        }
        let to_bytes = |mb: f64| (mb.max(0.0) * 1024.0 * 1024.0) as u64;
        let victims = self
            .tiers
            .choose_victims(&cands, to_bytes(need), to_bytes(free));
        for v in victims {
            self.evict(v as usize, policy);
        }
        true
    }

    /// The limit in force: ⌊D⌋, but while a short slot is reserved never below the long
    /// invocations running plus the short slot (so a shrinking D cannot shut short flows out).
    fn dynamic_limit(&self, gpu: &Gpu) -> u32 {
        let floor = if self.reserve { gpu.long_slots + 1 } else { 1 };
        gpu.conc
            .limit_at_least(floor.max(if self.reserve { 2 } else { 1 }))
    }

    fn slots_free(&self, g: usize, admission: Admission) -> bool {
        let gpu = &self.gpus[g];
        match admission {
            Admission::Dynamic => gpu.slots < self.dynamic_limit(gpu),
            Admission::Gated { d, util_limit } => {
                gpu.slots < d.min(gpu.conc.config().d_max) && gpu.gate_est <= util_limit
            }
        }
    }

    fn limit(&self, g: usize, admission: Admission) -> u32 {
        match admission {
            Admission::Dynamic => self.dynamic_limit(&self.gpus[g]),
            Admission::Gated { d, .. } => d.min(self.gpus[g].conc.config().d_max),
        }
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

    fn choose_gpu(&self, f: usize, admission: Admission) -> Option<usize> {
        (0..self.gpus.len())
            .filter(|&g| self.slots_free(g, admission))
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

    /// Gives a run its container and startup, or leaves it waiting for memory.
    fn acquire(&mut self, r: usize, force: bool, policy: &mut dyn Policy) {
        let (g, f) = {
            let run = self.runs[r].as_ref().expect("run exists");
            (run.gpu, run.func)
        };
        let mem = self.mem(f);
        let (c, until, tier) = if let Some(c) = self.idle_container(f, g, Tier::Hot) {
            (c, self.containers[c].ready_ms.max(self.now), Tier::Hot)
        } else {
            let warm = self.idle_container(f, g, Tier::Warm);
            if !self.make_room(g, mem, true, policy) {
                if !force {
                    self.runs[r].as_mut().expect("run exists").phase = Phase::WaitMem;
                    return;
                }
                self.audit.over_budget_admissions += 1;
            }
            self.gpus[g].used_mb += mem;
            if let Some(c) = warm {
                let end = self.pcie(g, mem);
                let ct = &mut self.containers[c];
                ct.tier = Tier::Hot;
                ct.ready_ms = end;
                (c, end, Tier::Warm)
            } else {
                let until = (self.now + self.cold_ms(f)).max(self.gpus[g].pcie_free_ms);
                self.containers.push(Container {
                    func: f,
                    gpu: g,
                    tier: Tier::Hot,
                    busy: false,
                    alive: true,
                    last_used_ms: self.now,
                    uses: 0,
                    ready_ms: until,
                    gdsf: 0.0,
                });
                let c = self.containers.len() - 1;
                self.by_func[f].push(c);
                (c, until, Tier::Cold)
            }
        };
        self.containers[c].busy = true;
        let run = self.runs[r].as_mut().expect("run exists");
        run.container = Some(c);
        run.phase = Phase::Startup { until };
        self.pending_start[run.current] = (self.now, tier);
        self.refresh(f, policy);
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
            self.acquire(r, !others_active, policy);
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
        let cap = 1.0 + (self.cfg.corun_gain * f64::from(k - 1)).min(self.cfg.corun_gain_max);
        let speed = if demand <= 1.0 {
            1.0
        } else {
            (cap / demand).min(1.0)
        };
        (speed, demand.min(1.0))
    }

    fn advance(&mut self, to: f64) {
        let dt = to - self.now;
        if dt > 0.0 {
            for g in 0..self.gpus.len() {
                let (speed, util) = self.speeds(g);
                self.gpus[g].busy_ms += util * dt;
                self.d_integral += f64::from(self.limit(g, self.admission)) * dt;
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

    fn finish(&mut self, inv: usize, policy: &mut dyn Policy) {
        let (start, tier) = self.pending_start[inv];
        if self.records[inv].is_some() {
            self.audit.double_completions += 1;
        }
        self.records[inv] = Some(Record {
            start_ms: start,
            end_ms: self.now,
            tier,
        });
        policy.complete(inv, self.trace, self.now - start, ms(self.now));
    }

    fn step_phases(&mut self, policy: &mut dyn Policy, admission: Admission, mem: MemoryStyle) {
        for r in 0..self.runs.len() {
            let Some(run) = self.runs[r].as_ref() else {
                continue;
            };
            match run.phase {
                Phase::Startup { until } if until <= self.now + EPS => {
                    let exec = self.trace.invocations[run.current].exec_ms;
                    self.runs[r].as_mut().expect("run").phase = Phase::Exec { remaining: exec };
                }
                Phase::Exec { remaining } if remaining <= EPS => {
                    let inv = run.current;
                    let c = run.container.expect("executing run has a container");
                    self.finish(inv, policy);
                    let mb = self.mem(self.containers[c].func);
                    let uses = self.containers[c].uses + 1;
                    let credit = self.tiers.credit(
                        uses,
                        mb / self.cfg.pcie_gbps / 1e3,
                        (mb * 1024.0 * 1024.0) as u64,
                    );
                    let ct = &mut self.containers[c];
                    ct.last_used_ms = self.now;
                    ct.uses = uses;
                    ct.gdsf = credit;
                    let run = self.runs[r].as_mut().expect("run");
                    if let Some(next) = run.rest.pop_front() {
                        run.current = next;
                        let exec = self.trace.invocations[next].exec_ms;
                        run.phase = Phase::Exec { remaining: exec };
                        self.pending_start[next] = (self.now, Tier::Hot);
                    } else {
                        let (g, f, short) = (run.gpu, run.func, run.short);
                        self.runs[r] = None;
                        if !short {
                            self.gpus[g].long_slots -= 1;
                        }
                        self.containers[c].busy = false;
                        let gpu = &mut self.gpus[g];
                        if let Admission::Gated { .. } = admission {
                            let n = f64::from(gpu.slots);
                            gpu.gate_est = if gpu.slots <= 1 {
                                0.0
                            } else {
                                gpu.gate_est * (n - 1.0) / n
                            };
                        }
                        gpu.slots -= 1;
                        if mem == MemoryStyle::EagerPrefetch && !policy.active(f) {
                            self.evict(c, policy);
                        }
                        self.refresh(f, policy);
                        self.retry_waiting(g, policy);
                    }
                }
                _ => {}
            }
        }
    }

    fn prefetch(&mut self, f: usize, policy: &mut dyn Policy, evict_ok: bool) {
        if self.best[f] == Tier::Hot {
            return;
        }
        let warm = self.by_func[f]
            .iter()
            .copied()
            .filter(|&c| !self.containers[c].busy && self.containers[c].tier == Tier::Warm)
            .max_by(|&a, &b| {
                self.containers[a]
                    .last_used_ms
                    .total_cmp(&self.containers[b].last_used_ms)
            });
        let Some(c) = warm else { return };
        let g = self.containers[c].gpu;
        let mem = self.mem(f);
        let fits = if evict_ok {
            self.make_room(g, mem, false, policy)
        } else {
            self.gpus[g].budget_mb - self.gpus[g].used_mb >= mem
        };
        if !fits {
            return;
        }
        self.gpus[g].used_mb += mem;
        let end = self.pcie(g, mem);
        let ct = &mut self.containers[c];
        ct.tier = Tier::Hot;
        ct.ready_ms = end;
        self.refresh(f, policy);
    }

    fn housekeeping(&mut self, policy: &mut dyn Policy, mem: MemoryStyle) {
        let now = ms(self.now);
        let mut evict = Vec::new();
        let mut drop = Vec::new();
        for (i, c) in self.containers.iter().enumerate() {
            if !c.alive {
                continue;
            }
            let view = ContainerView {
                id: i as u64,
                tier: c.tier,
                busy: c.busy,
                flow_active: false,
                bytes: 0,
                last_used: ms(c.last_used_ms),
                uses: c.uses,
                reload_cost_s: 0.0,
                priority: c.gdsf,
            };
            match self.tiers.expiry(&view, now) {
                Some(scheduler_core::tiers::TierMove::Evict) => evict.push(i),
                Some(scheduler_core::tiers::TierMove::Drop) => drop.push(i),
                _ => {}
            }
        }
        for c in evict {
            self.evict(c, policy);
        }
        for c in drop {
            let f = self.containers[c].func;
            self.containers[c].alive = false;
            self.containers[c].tier = Tier::Cold;
            self.by_func[f].retain(|&x| x != c);
            self.refresh(f, policy);
        }
        if mem == MemoryStyle::LazyPrefetch {
            for f in 0..self.trace.functions.len() {
                if self.best[f] == Tier::Warm
                    && self.tiers.predicts_arrival(
                        now,
                        self.last_arrival[f].map(ms),
                        self.iat[f].get().map(|x| x / 1e3),
                    )
                {
                    self.prefetch(f, policy, false);
                }
            }
        }
    }
}

/// Runs `policy` over `trace` on the simulated node.
///
/// # Errors
/// A bad knob, or [`SimError::Stuck`] if the event loop stops progressing.
#[expect(clippy::too_many_lines)]
pub fn simulate(
    trace: &Trace,
    policy: &mut dyn Policy,
    cfg: &SimConfig,
) -> Result<SimOutput, SimError> {
    cfg.validate()?;
    let mut q = cfg.profile.queue();
    let mut conc_cfg = cfg.profile.concurrency(cfg.mode);
    cfg.overrides.apply(&mut q, &mut conc_cfg)?;
    let tiers = TierPolicy::new(cfg.tiers.clone())?;
    let budget_mb = cfg.gpu_mem_mb * (1.0 - cfg.tiers.headroom);
    let gpus = (0..cfg.gpus)
        .map(|_| {
            Ok(Gpu {
                budget_mb,
                used_mb: 0.0,
                conc: ConcurrencyController::new(conc_cfg.clone())?,
                slots: 0,
                long_slots: 0,
                pcie_free_ms: 0.0,
                gate_est: 0.0,
                util_smooth: 0.0,
                busy_ms: 0.0,
                busy_at_sample: 0.0,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let n = trace.functions.len();
    let mut e = Engine {
        trace,
        cfg: cfg.clone(),
        tiers,
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
        last_arrival: vec![None; n],
        iat: vec![Ewma::new(0.2); n],
        audit: Audit::default(),
        pcie_mb: 0.0,
        now: 0.0,
        d_integral: 0.0,
        slot_integral: 0.0,
        admission: policy.admission(),
        reserve: false,
    };
    let admission = policy.admission();
    let mem_style = policy.memory();
    let first = trace.invocations.first().map_or(0.0, |i| i.arrival_ms);
    e.now = first;
    let mut next_arrival = 0usize;
    let mut next_sample = first + cfg.sample_ms;
    let mut samples: u64 = 0;
    let paper_every = (500.0 / cfg.sample_ms).round().max(1.0) as u64;
    let mut iterations: u64 = 0;
    let max_iterations = 1_000_000 + 200 * trace.invocations.len() as u64;
    loop {
        iterations += 1;
        if iterations > max_iterations {
            return Err(SimError::Stuck(e.now));
        }
        let busy = e.runs.iter().any(Option::is_some) || policy.queued() > 0;
        let t_arr = trace
            .invocations
            .get(next_arrival)
            .map_or(f64::INFINITY, |i| i.arrival_ms);
        if !busy && t_arr.is_infinite() {
            break;
        }
        if !busy && next_sample < t_arr {
            // Idle: skip to the sample just before the next arrival, feeding the controller
            // the idle samples it would have seen (capped; D saturates long before).
            let skipped = ((t_arr - next_sample) / cfg.sample_ms).floor();
            for g in &mut e.gpus {
                for _ in 0..(skipped as u64).min(64) {
                    g.conc.observe(0.0);
                }
                g.util_smooth *= 0.4f64.powf(skipped.min(64.0));
                g.busy_at_sample = g.busy_ms;
            }
            next_sample += skipped * cfg.sample_ms;
        }
        let t_timer = policy
            .next_timer()
            .map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3);
        let t = t_arr
            .min(e.next_phase_end())
            .min(next_sample)
            .min(t_timer.max(e.now));
        if !t.is_finite() {
            return Err(SimError::Stuck(e.now));
        }
        e.advance(t.max(e.now));
        e.step_phases(policy, admission, mem_style);
        while let Some(inv) = trace.invocations.get(next_arrival) {
            if inv.arrival_ms > e.now + EPS {
                break;
            }
            let f = inv.func;
            if let Some(last) = e.last_arrival[f] {
                e.iat[f].observe(inv.arrival_ms - last);
            }
            e.last_arrival[f] = Some(inv.arrival_ms);
            let view = PoolView {
                best: &e.best,
                startup_ms: &e.startup,
            };
            policy.arrive(next_arrival, trace, ms(e.now), &view);
            next_arrival += 1;
        }
        if e.now + EPS >= next_sample {
            samples += 1;
            for g in &mut e.gpus {
                let u = (g.busy_ms - g.busy_at_sample) / cfg.sample_ms;
                g.busy_at_sample = g.busy_ms;
                g.conc.observe(u);
                if samples.is_multiple_of(paper_every) {
                    g.util_smooth = 0.6 * u + 0.4 * g.util_smooth;
                    g.gate_est = g.util_smooth;
                }
            }
            if samples.is_multiple_of(10) {
                e.housekeeping(policy, mem_style);
            }
            next_sample += cfg.sample_ms;
        }
        for s in policy.tick(ms(e.now)) {
            match (s, mem_style) {
                (Signal::Activated(f), MemoryStyle::LazyPrefetch | MemoryStyle::EagerPrefetch) => {
                    e.prefetch(f, policy, true);
                }
                (Signal::Deactivated(f), MemoryStyle::EagerPrefetch) => {
                    let idle: Vec<usize> = e.by_func[f]
                        .iter()
                        .copied()
                        .filter(|&c| !e.containers[c].busy && e.containers[c].tier == Tier::Hot)
                        .collect();
                    for c in idle {
                        e.evict(c, policy);
                    }
                }
                _ => {}
            }
        }
        // Dispatch while a slot is free and work waits.
        while policy.queued() > 0 {
            e.reserve = policy.reserves_short_slot();
            // A GPU held at one slot (MIG) never reserves its only slot.
            let Some(free) = (0..e.gpus.len())
                .filter(|&g| e.slots_free(g, admission))
                .map(|g| {
                    let limit = e.limit(g, admission);
                    if limit < 2 {
                        u32::MAX
                    } else {
                        limit.saturating_sub(e.gpus[g].slots)
                    }
                })
                .max()
            else {
                break;
            };
            let view = PoolView {
                best: &e.best,
                startup_ms: &e.startup,
            };
            let Some(batch) = policy.next(trace, ms(e.now), &view, free) else {
                break;
            };
            let Some(&head) = batch.first() else { break };
            let f = trace.invocations[head].func;
            let g = e
                .choose_gpu(f, admission)
                .expect("a GPU with a free slot exists");
            let limit = e.limit(g, admission);
            let gpu = &mut e.gpus[g];
            if gpu.slots >= limit {
                e.audit.over_limit_dispatches += 1;
            }
            if let Admission::Gated { .. } = admission {
                gpu.gate_est = if gpu.slots == 0 {
                    gpu.gate_est + 0.5
                } else {
                    gpu.gate_est + gpu.gate_est / f64::from(gpu.slots)
                };
            }
            gpu.slots += 1;
            let short = policy.is_short(f);
            if !short {
                gpu.long_slots += 1;
            }
            e.audit.max_slots_held = e.audit.max_slots_held.max(gpu.slots);
            let mut rest: VecDeque<usize> = batch.into_iter().collect();
            rest.pop_front();
            let run = Run {
                gpu: g,
                func: f,
                short,
                container: None,
                rest,
                current: head,
                phase: Phase::WaitMem,
            };
            let slot = match e.runs.iter().position(Option::is_none) {
                Some(i) => {
                    e.runs[i] = Some(run);
                    i
                }
                None => {
                    e.runs.push(Some(run));
                    e.runs.len() - 1
                }
            };
            let others_active = e.runs.iter().enumerate().any(|(i, r)| {
                i != slot
                    && r.as_ref()
                        .is_some_and(|r| r.gpu == g && !matches!(r.phase, Phase::WaitMem))
            });
            e.acquire(slot, !others_active, policy);
        }
    }
    let mut last_end = first;
    let mut records = Vec::with_capacity(e.records.len());
    for (i, r) in e.records.iter().enumerate() {
        match r {
            Some(r) => {
                last_end = last_end.max(r.end_ms);
                records.push(*r);
            }
            None => {
                e.audit.unfinished += 1;
                records.push(Record {
                    start_ms: f64::NAN,
                    end_ms: f64::NAN,
                    tier: e.pending_start[i].1,
                });
            }
        }
    }
    Ok(SimOutput {
        policy: policy.name().to_owned(),
        records,
        busy_ms: e.gpus.iter().map(|g| g.busy_ms).sum(),
        makespan_ms: last_end - first,
        gpus: cfg.gpus,
        audit: e.audit,
        pcie_mb: e.pcie_mb,
        mean_d: e.d_integral / (e.now - first).max(1e-9) / cfg.gpus as f64,
        mean_slots: e.slot_integral / (e.now - first).max(1e-9) / cfg.gpus as f64,
    })
}
