//! Which GPU a container gets: fitness for the function's class, combined with locality, queue,
//! balance, energy and affinity in a weighted score.
//!
//! The second design's two fitness formulas: a compute-bound function wants free FLOPS,
//! `FLOPS × (1 − utilization)`; a memory-bound one wants free bandwidth and room,
//! `bandwidth × (1 − memory used fraction)`, less what moving its data costs. The design writes
//! the transfer cost as a subtraction of a time from a bandwidth; here it is the share of a
//! burst the copies would take over the GPU's host link (none where the function's memory is
//! already resident), and the bandwidth is multiplied by what is left, so the units agree. Each
//! term is normalized over the candidates (the best is 1), so only ratios between GPUs matter.
//!
//! Short functions are packed: one gains milliseconds from a faster GPU, while the slots and
//! memory it holds there are taken from long functions that would gain seconds. Its fitness
//! term is the model's speed for its kind of work reversed (the slowest model scores 1, the
//! fastest 0; load does not enter it), and its measured expected completions are compared in
//! absolute time ([`SHORT_SCALE_S`]) rather than as a ratio: 9 ms against 20 ms is no reason to
//! move, a restore or a cold start is. With the default weights it accepts about 0.3 s more on
//! an A30 to leave an H100 (`3 × (1 − e^(−Δ/1 s))` against the 0.85 the reversal gives).
//!
//! A function still being probed runs, among the operator's probe GPUs if any is a candidate,
//! where its measurement is clean (a slot free, less than half busy), then where an idle
//! container of it is readiest, then where it gets the largest share of FLOPS; with no slot free
//! anywhere, the largest share first. A failed GPU is never
//! chosen; an overloaded one only when no healthy candidate is left, because placement must
//! never keep a pod from starting.

use serde::Serialize;

use super::features::{Bound, Class, FunctionFeatures, Length};
use super::models::GpuModel;
use crate::config::{ConfigError, reject};

/// A GPU's condition for new containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Usable.
    Healthy,
    /// Saturated for a while: used only when nothing healthy is left.
    Overloaded,
    /// NVML errors or an Xid: never chosen until it recovers.
    Failed,
}

impl Health {
    /// `healthy`, `overloaded` or `failed` (as status and logs show it).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Overloaded => "overloaded",
            Health::Failed => "failed",
        }
    }
}

/// One candidate GPU as the daemon sees it at the moment of choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// Its model's figures (see [`super::models::lookup`]).
    pub model: GpuModel,
    /// Utilization, 0..=1 (SM activity where the GPU has GPM, else busy-time).
    pub utilization: f64,
    /// Standard deviation of utilization over recent samples (how unstable it is).
    pub utilization_stddev: f64,
    /// Fraction of its memory in use, 0..=1.
    pub memory_used: f64,
    /// Admissions holding or waiting for a slot on it.
    pub queue: u32,
    /// Where the function's service has been measured (here or on another GPU, scaled by the
    /// speed of its kind of work): (seconds of work held or waiting here, the function's own
    /// service here). Expected completion is then their sum; without it, `queue` runs.
    pub work_s: Option<(f64, f64)>,
    /// How many it runs at once (its concurrency limit in force; at least 1 counts).
    pub limit: u32,
    /// Power draw over its limit, 0..=1, where NVML reports power.
    pub power: Option<f64>,
    /// Its condition.
    pub health: Health,
    /// The function's memory is already there (a Hot container of it in the pool, idle or busy).
    pub resident: bool,
    /// Seconds before the function could run there: 0 where an idle container of it holds its
    /// memory, that container's restore where its memory is on the host, a cold start where
    /// none is idle.
    pub start_s: f64,
    /// A function this one names as a partner runs there.
    pub partner: bool,
}

/// How much each term counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    /// Fitness for the function's class.
    pub fitness: f64,
    /// The function's memory already on the GPU.
    pub locality: f64,
    /// A short expected completion against the best candidate's (as a ratio; for a short
    /// function, in absolute time, `exp(−Δ / SHORT_SCALE_S)`): the work ahead in measured
    /// seconds (with a slot free, at most one own service per co-runner: it shares the GPU),
    /// the function's own service there and its start there beyond the readiest candidate's (0
    /// where an idle container holds its memory, a restore or a cold start elsewhere), where
    /// every candidate has them; else
    /// `1 + queue` runs of the function (the work ahead shares the GPU's time) at the GPU's
    /// speed for its kind of work.
    pub queue: f64,
    /// Short functions packed onto busy GPUs, long ones spread to free and stable ones.
    pub balance: f64,
    /// Low power draw.
    pub energy: f64,
    /// Next to the functions it names as partners.
    pub affinity: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            fitness: 1.0,
            locality: 0.5,
            // The expected completion, in measured seconds of the work ahead once functions
            // are measured: the term that keeps a fast GPU from drawing work while a slower
            // one idles (docs/PERFORMANCE.md §1b, where these weights were chosen).
            queue: 3.0,
            balance: 0.1,
            energy: 0.0,
            affinity: 0.3,
        }
    }
}

impl Weights {
    /// Checks every weight (finite, ≥ 0, not all 0), naming the first bad one.
    ///
    /// # Errors
    /// A bad weight; `prefix` names the table it came from.
    pub fn validate(&self, prefix: &'static str) -> Result<(), ConfigError> {
        for v in [
            self.fitness,
            self.locality,
            self.queue,
            self.balance,
            self.energy,
            self.affinity,
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(reject(
                    prefix,
                    v,
                    "every weight must be a finite number >= 0",
                ));
            }
        }
        if self.fitness + self.locality + self.queue + self.balance + self.energy + self.affinity
            <= 0.0
        {
            return Err(reject(prefix, 0, "at least one weight must be > 0"));
        }
        Ok(())
    }
}

/// Peak and off-peak weights by minute of the day.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WeightSchedule {
    /// Weights during peak hours.
    pub peak: Weights,
    /// Weights outside them.
    pub off_peak: Weights,
    /// Peak starts at this minute of the day (0..1440).
    pub peak_start_min: u32,
    /// And ends at this one (exclusive; before the start means it wraps past midnight; equal to
    /// the start means never).
    pub peak_end_min: u32,
}

impl Default for WeightSchedule {
    fn default() -> Self {
        // Off peak, energy counts and queue length less: consolidate rather than spread.
        let peak = Weights::default();
        let off_peak = Weights {
            energy: 0.5,
            queue: 1.5,
            ..peak
        };
        WeightSchedule {
            peak,
            off_peak,
            peak_start_min: 8 * 60,
            peak_end_min: 20 * 60,
        }
    }
}

impl WeightSchedule {
    /// Checks both weight sets and the hours.
    ///
    /// # Errors
    /// A bad weight or a minute past the day.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.peak.validate("placement.peak")?;
        self.off_peak.validate("placement.off_peak")?;
        for (knob, m) in [
            ("placement.peak_start_min", self.peak_start_min),
            ("placement.peak_end_min", self.peak_end_min),
        ] {
            if m >= 1440 {
                return Err(reject(knob, m, "must be a minute of the day, 0-1439"));
            }
        }
        Ok(())
    }

    /// Whether `minute_of_day` (taken modulo a day) is in the peak.
    #[must_use]
    pub fn is_peak(&self, minute_of_day: u32) -> bool {
        let m = minute_of_day % 1440;
        let (s, e) = (self.peak_start_min, self.peak_end_min);
        match s.cmp(&e) {
            std::cmp::Ordering::Less => s <= m && m < e,
            std::cmp::Ordering::Greater => m >= s || m < e,
            std::cmp::Ordering::Equal => false,
        }
    }

    /// The weights in force at `minute_of_day`.
    #[must_use]
    pub fn at(&self, minute_of_day: u32) -> &Weights {
        if self.is_peak(minute_of_day) {
            &self.peak
        } else {
            &self.off_peak
        }
    }
}

/// Each term of a choice's score, weighted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Fitness.
    pub fitness: f64,
    /// Locality.
    pub locality: f64,
    /// Queue.
    pub queue: f64,
    /// Balance.
    pub balance: f64,
    /// Energy.
    pub energy: f64,
    /// Affinity.
    pub affinity: f64,
}

impl Breakdown {
    /// The score: the sum of the terms.
    #[must_use]
    pub fn total(&self) -> f64 {
        self.fitness + self.locality + self.queue + self.balance + self.energy + self.affinity
    }
}

/// A GPU chosen, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// Its NVML index.
    pub gpu: u32,
    /// Its score (0 for a probe's choice).
    pub score: f64,
    /// The terms (all 0 for a probe's choice).
    pub breakdown: Breakdown,
    /// `probe`, `fitness`, or `overloaded` (no healthy candidate was left).
    pub reason: &'static str,
}

/// Why no GPU was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No candidate, or every candidate failed.
    #[error("no usable GPU among the container's candidates")]
    NoUsableGpu,
}

/// What a choice needs to know about the function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Need<'a> {
    /// Its class.
    pub class: Class,
    /// Its measured features (for the transfer cost), if any.
    pub features: Option<&'a FunctionFeatures>,
}

fn clamp01(v: f64) -> f64 {
    if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Raw fitness of `g` for a function of `bound` (higher is better; compared across GPUs only).
fn raw_fitness(g: &GpuView, bound: Bound, features: Option<&FunctionFeatures>) -> f64 {
    match bound {
        Bound::Compute => g.model.tflops * (1.0 - clamp01(g.utilization)),
        Bound::Memory => {
            let transfer_share = match features {
                Some(f) if !g.resident => {
                    let copy_ms = f.transfer_bytes.mean() / (g.model.pcie_gbps * 1e9) * 1e3;
                    let burst = f.burst_ms.mean();
                    if copy_ms + burst > 0.0 {
                        copy_ms / (copy_ms + burst)
                    } else {
                        0.0
                    }
                }
                _ => 0.0,
            };
            g.model.mem_gbps * (1.0 - clamp01(g.memory_used)) * (1.0 - clamp01(transfer_share))
        }
    }
}

/// The time scale on which a short function's expected completions are compared: a difference
/// of this much scores `1/e` of the soonest. Differences of milliseconds barely count, a
/// restore or a cold start does. The default threshold of a short function (`short_ms`), but
/// fixed: it does not follow that knob.
pub const SHORT_SCALE_S: f64 = 1.0;

/// The model's speed for work of `bound`: FLOPS or memory bandwidth.
fn speed(g: &GpuView, bound: Bound) -> f64 {
    match bound {
        Bound::Compute => g.model.tflops,
        Bound::Memory => g.model.mem_gbps,
    }
}

/// Utilization under which a GPU is clean enough to probe a new function on.
const CLEAN_UTILIZATION: f64 = 0.5;

/// `g.start_s` as a time: NaN reads 0, and "never" (infinite) the longest finite time, so it
/// still compares (and a start every candidate shares still cancels).
fn start(g: &GpuView) -> f64 {
    if g.start_s.is_nan() {
        0.0
    } else {
        g.start_s.clamp(0.0, f64::MAX)
    }
}

/// A function not yet measured is probed: on one of the operator's probe GPUs among `pool`
/// (any, if none is there), the readiest with a slot free, else the one that runs it soonest.
fn probe(
    pool: &[&GpuView],
    probe_gpus: &[u32],
    overloaded: bool,
) -> Result<Choice, PlacementError> {
    let probes: Vec<&GpuView> = pool
        .iter()
        .copied()
        .filter(|g| probe_gpus.contains(&g.index))
        .collect();
    let among: &[&GpuView] = if probes.is_empty() { pool } else { &probes };
    // Clean first (a slot free now and less than half busy), then a slot free, then none.
    // With a slot free: where an idle container of it is readiest, then where it gets the
    // largest share of FLOPS, (1 + queue) / FLOPS, so an H100 running one call still beats
    // an idle A30 (the probe run ends sooner there). With none free, that share first (a
    // container ready behind a long queue is not ready), then readiness. Then the least busy.
    let free = |g: &GpuView| g.queue < g.limit.max(1);
    let rank = |g: &GpuView| match (free(g), clamp01(g.utilization) < CLEAN_UTILIZATION) {
        (true, true) => 0_u8,
        (true, false) => 1,
        (false, _) => 2,
    };
    let key = |g: &GpuView| {
        let share = (1.0 + f64::from(g.queue)) / g.model.tflops.max(f64::MIN_POSITIVE);
        let (first, second) = if free(g) {
            (start(g), share)
        } else {
            (share, start(g))
        };
        (
            rank(g),
            first,
            second,
            (g.queue, clamp01(g.utilization), g.index),
        )
    };
    let best = among
        .iter()
        .min_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .ok_or(PlacementError::NoUsableGpu)?;
    Ok(Choice {
        gpu: best.index,
        score: 0.0,
        breakdown: Breakdown::default(),
        reason: if overloaded { "overloaded" } else { "probe" },
    })
}

/// Chooses a GPU among `gpus` for a function with `need`, under `weights`. `probe_gpus` are the
/// operator's GPUs for probing new functions (empty: any).
///
/// # Errors
/// [`PlacementError::NoUsableGpu`] when `gpus` is empty or every one has failed.
pub fn choose(
    gpus: &[GpuView],
    need: &Need<'_>,
    weights: &Weights,
    probe_gpus: &[u32],
) -> Result<Choice, PlacementError> {
    let healthy: Vec<&GpuView> = gpus
        .iter()
        .filter(|g| g.health == Health::Healthy)
        .collect();
    let (pool, overloaded) = if healthy.is_empty() {
        let o: Vec<&GpuView> = gpus
            .iter()
            .filter(|g| g.health == Health::Overloaded)
            .collect();
        (o, true)
    } else {
        (healthy, false)
    };
    if pool.is_empty() {
        return Err(PlacementError::NoUsableGpu);
    }
    let Class::Known { bound, length, .. } = need.class else {
        return probe(&pool, probe_gpus, overloaded);
    };
    let short = length == Length::Short;
    // Long: the design's fitness (free FLOPS or bandwidth, less copies). Short: the model's
    // speed for its kind of work, reversed below, so it packs onto the slowest model, leaving
    // the fastest to work that gains seconds there; load is left to the queue and balance
    // terms (on like GPUs this term is the same everywhere).
    let fit = |g: &GpuView| {
        if short {
            speed(g, bound)
        } else {
            raw_fitness(g, bound, need.features)
        }
    };
    let top = pool.iter().map(|g| fit(g)).fold(0.0_f64, f64::max);
    // Expected completion in units of one run on a unit-speed GPU: the work ahead of it plus
    // its own, at the GPU's speed for its kind of work. Work running or queued there shares the
    // GPU's time: co-runners admitted under a limit of D do not run D times as fast (the
    // controller lets them in for a small gain, at a slowdown each), so counting the work ahead
    // in rounds of `limit` made a busy fast GPU look free and left slower ones idle.
    // Where every candidate knows the work ahead in measured seconds (the queued functions'
    // own service, not runs of this one), that sum is the expected completion, with the time
    // before the function can start there: a short function gains a few milliseconds on a
    // faster GPU and would lose a restore or a cold start on one where it is not resident.
    // Only the start beyond the readiest candidate's counts: a cost every candidate pays (a
    // cold start everywhere) would only flatten the comparison.
    let measured = pool.iter().all(|g| g.work_s.is_some());
    let readiest = pool.iter().map(|g| start(g)).fold(f64::INFINITY, f64::min);
    let completion = |g: &GpuView| match g.work_s {
        Some((ahead, own)) if measured => {
            let own = own.max(f64::MIN_POSITIVE);
            // With a slot free it starts at once and shares the GPU with what runs there: under
            // processor sharing each co-runner delays it by at most one run of it, and by no more
            // than the work there (only the sum is known, so this bounds Σ min(rᵢ, own) from
            // above). Without a free slot, the work ahead drains first.
            let wait = if g.queue < g.limit.max(1) {
                ahead.max(0.0).min(f64::from(g.queue) * own)
            } else {
                ahead.max(0.0)
            };
            wait + own + (start(g) - readiest).max(0.0)
        }
        _ => (1.0 + f64::from(g.queue)) / speed(g, bound).max(f64::MIN_POSITIVE),
    };
    let completions: Vec<f64> = pool.iter().map(|g| completion(g)).collect();
    let soonest = completions.iter().copied().fold(f64::INFINITY, f64::min);
    // A short function's measured completions in absolute time (see the module's docs).
    let soon = |c: f64| {
        if short && measured {
            (-(c - soonest).max(0.0) / SHORT_SCALE_S).exp()
        } else {
            clamp01(soonest / c)
        }
    };
    let mut best: Option<(&GpuView, Breakdown)> = None;
    for (g, &c) in pool.iter().zip(&completions) {
        let u = clamp01(g.utilization);
        let balance = match length {
            Length::Short => u,
            Length::Long => (1.0 - u) * (1.0 - clamp01(g.utilization_stddev * 4.0)),
        };
        let b = Breakdown {
            fitness: weights.fitness
                * if top > 0.0 {
                    let f = clamp01(fit(g) / top);
                    if short { 1.0 - f } else { f }
                } else {
                    0.0
                },
            locality: weights.locality * f64::from(u8::from(g.resident)),
            queue: weights.queue * soon(c),
            balance: weights.balance * balance,
            energy: weights.energy * g.power.map_or(0.5, |p| 1.0 - clamp01(p)),
            affinity: weights.affinity * f64::from(u8::from(g.partner)),
        };
        // Highest score; ties to the lower index, so a choice is reproducible.
        let better = match &best {
            None => true,
            Some((bg, bb)) => {
                b.total() > bb.total() + 1e-12
                    || ((b.total() - bb.total()).abs() <= 1e-12 && g.index < bg.index)
            }
        };
        if better {
            best = Some((g, b));
        }
    }
    let (g, b) = best.ok_or(PlacementError::NoUsableGpu)?;
    Ok(Choice {
        gpu: g.index,
        score: b.total(),
        breakdown: b,
        reason: if overloaded { "overloaded" } else { "fitness" },
    })
}
