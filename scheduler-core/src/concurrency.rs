//! The dynamic concurrency limit D of one GPU.
//!
//! NVML's busy-time (`utilization.gpu`) is the share of time in which *any* kernel ran: with a
//! steady stream of invocations it reads ~100 % while one small kernel keeps a tenth of the SMs
//! busy, so a law on it alone pins D near 1. D therefore follows what concurrency costs,
//! measured on the admissions themselves, whatever the GPU:
//!
//! - Each function's **baseline** service time is learned at the lowest concurrency it has run at
//!   (the most admissions in flight on the GPU during its run), and only at or below D's starting
//!   limit (`d_initial`): a function first seen at D_max would take its slowed run as its
//!   reference, measure no slowdown, and let D grow on it. An admission's **slowdown** is
//!   the service it measured (Release carries it) over that baseline, bounded to `[1, k]` at
//!   concurrency k (fair sharing slows no run more; measurements under 1 ms teach nothing). The
//!   sample's slowdown is each tenant's mean weighted by GPU time, averaged over the tenants —
//!   a tenant's reports come from its own containers, so one tenant moves D by its share of the
//!   tenants — and its **pressure** that over `slowdown_target`, the most co-runners should slow
//!   a run. Overlap that fills idle SMs costs little; time slicing of busy kernels
//!   costs k× at concurrency k.
//! - **SM activity**, where the GPU reports it (GPM on Hopper and later), gates growth: D grows
//!   only while the SMs are below `u_target`. In a sample in which no measured admission ended
//!   (leases that live long, long bursts), it alone may let D grow — without GPM busy-time, which
//!   is never below SM activity, does — while under `u_target`. Neither ever cuts D (the
//!   slowdown says what saturation costs), so busy-time reading 100 % leaves D where it is.
//!
//! Once per sample: pressure p > 1 cuts D by `max(½, 1/p)` (multiplicative decrease, as
//! delay-based congestion control does); p ≤ 1 grows it by `1 + α (1 − p)`, capped by
//! `1 + α (u* − sm)` and never below 1 — and only with evidence: a pressure measured this sample
//! (or, when nothing ended, SM activity or busy-time under `u*`) while the limit bound (it was in
//! use, or admissions waited). After a cut, admissions granted
//! before it no longer count (one cut per round of admissions), so the lag between a cut and its
//! effect does not cut again. D stays in `[1, D_max]`; the limit is `⌊D⌋`.
//!
//! [`Law::BusyTime`] keeps the published law `D ← D (1 + α (U* − busy))` so that the simulator
//! can show what it would have done; `mqfqd` never runs it.

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::config::Law;
use crate::config::{ConcurrencyConfig, ConfigError};

/// Most a single decrease takes off D.
const MAX_DECREASE: f64 = 0.5;
/// EWMA weight of a new baseline measurement, and of a new slowdown at a level.
const BASELINE_ALPHA: f64 = 0.2;
/// Functions whose baselines are kept; past it, the least recently used is dropped.
const MAX_BASELINES: usize = 4096;
/// A measurement shorter than this teaches nothing: releases that carry no real service (a grant
/// nobody used, a burst whose processes were gone) arrive as microseconds.
const MIN_MEASURED_S: f64 = 1e-3;

/// What the monitor read of a GPU over one sample period; `None`: not available.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Signals {
    /// NVML busy-time, 0–1: the input of [`Law::BusyTime`]; under the interference law it may
    /// only let D grow, on a GPU without GPM, in a sample in which no admission ended.
    pub busy: Option<f64>,
    /// SM activity, 0–1 (GPM), where the GPU has it.
    pub sm_activity: Option<f64>,
}

/// What the controller last saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Reading {
    /// NVML busy-time, 0–1.
    pub busy: Option<f64>,
    /// SM activity, 0–1.
    pub sm_activity: Option<f64>,
    /// Weighted slowdown of the admissions that ended in the sample, against their baselines.
    pub slowdown: Option<f64>,
    /// That over `slowdown_target` (> 1: D is cut).
    pub pressure: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
struct InFlight {
    /// Most admissions in flight on this GPU while this one was.
    peak: u32,
    /// The decrease round it was granted in.
    round: u64,
    /// Whether its measurement covers its whole run (an adopted admission's does not).
    measurable: bool,
}

#[derive(Clone, Debug, Serialize)]
struct Baseline {
    /// The concurrency it was learned at.
    level: u32,
    /// Service time there, seconds (EWMA).
    service_s: f64,
    /// Last use, in releases, for eviction.
    used: u64,
    /// The tenant of the function ("" for none), for the registry's bound.
    tenant: String,
}

/// D for one GPU (or one MIG instance).
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyController {
    cfg: ConcurrencyConfig,
    d: f64,
    last: Reading,
    inflight: BTreeMap<u64, InFlight>,
    baselines: BTreeMap<String, Baseline>,
    /// Per tenant, Σ service × slowdown and Σ service of this sample's counted releases.
    window: BTreeMap<String, (f64, f64)>,
    /// A measured admission ended in this sample (counted or not).
    ended: bool,
    round: u64,
    releases: u64,
    /// Most admissions in flight during this sample.
    peak_running: u32,
}

impl ConcurrencyController {
    /// A controller at `d_initial`.
    ///
    /// # Errors
    /// [`ConfigError`] naming a bad knob.
    pub fn new(cfg: ConcurrencyConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let d = cfg.d_initial;
        Ok(ConcurrencyController {
            cfg,
            d,
            last: Reading::default(),
            inflight: BTreeMap::new(),
            baselines: BTreeMap::new(),
            window: BTreeMap::new(),
            ended: false,
            round: 0,
            releases: 0,
            peak_running: 0,
        })
    }

    /// An admission began (`id` unique among those in flight). `measurable`: its release will
    /// carry the service of its whole run (false for one adopted after a restart).
    pub fn admitted(&mut self, id: u64, measurable: bool) {
        let running = u32::try_from(self.inflight.len() + 1).unwrap_or(u32::MAX);
        for f in self.inflight.values_mut() {
            f.peak = f.peak.max(running);
        }
        self.inflight.insert(
            id,
            InFlight {
                peak: running,
                round: self.round,
                measurable,
            },
        );
        self.peak_running = self.peak_running.max(running);
    }

    /// Admission `id`, of `function` of `tenant` (empty: none; the operator's unit of isolation),
    /// ended after `measured` seconds of service (when known).
    pub fn released(&mut self, id: u64, function: &str, tenant: &str, measured: Option<f64>) {
        let Some(f) = self.inflight.remove(&id) else {
            return;
        };
        let Some(s) = measured.filter(|s| s.is_finite() && *s >= MIN_MEASURED_S) else {
            return;
        };
        if !f.measurable {
            return;
        }
        self.ended = true;
        self.releases += 1;
        let used = self.releases;
        let counted = f.round == self.round;
        let reference = self.reference_level();
        match self.baselines.get_mut(function) {
            Some(b) if f.peak >= b.level => {
                // k runs sharing a GPU fairly slow each other k× at most, and none runs faster
                // than alone: a measurement that says otherwise (a lying container, a poisoned
                // baseline) counts as the bound it crossed.
                let slowdown = (s / b.service_s).clamp(1.0, f64::from(f.peak.max(1)));
                if f.peak == b.level {
                    b.service_s += BASELINE_ALPHA * (s - b.service_s);
                }
                b.used = used;
                if counted {
                    let add = (s * slowdown, s);
                    match self.window.get_mut(tenant) {
                        Some(w) => *w = (w.0 + add.0, w.1 + add.1),
                        None => {
                            self.window.insert(tenant.to_owned(), add);
                        }
                    }
                }
            }
            // A run at more concurrency than D starts at is never its own reference: learned
            // there, a baseline already holds the slowdown it should measure, and D grows on it.
            None if f.peak > reference => {}
            _ => {
                // First seen, or seen at a lower concurrency than before: the new baseline.
                self.baselines.insert(
                    function.to_owned(),
                    Baseline {
                        level: f.peak,
                        service_s: s,
                        used,
                        tenant: tenant.to_owned(),
                    },
                );
                self.trim();
            }
        }
    }

    fn trim(&mut self) {
        while self.baselines.len() > MAX_BASELINES {
            // The least recently used of the tenant holding the most: a tenant cycling
            // function names relearns its own baselines, not others'.
            let oldest = crate::tenant_lru::victim(self.baselines.iter().map(|(k, b)| {
                (
                    k.as_str(),
                    Some(b.tenant.as_str()).filter(|t| !t.is_empty()),
                    b.used,
                )
            }))
            .map(str::to_owned);
            match oldest {
                Some(k) => self.baselines.remove(&k),
                None => break,
            };
        }
    }

    /// Ends a sample period: D moves on what it saw (see the module docs) and is returned.
    /// `waiting`: admissions waited for a slot (the limit bound even if not all of it was in
    /// use, as when a slot is held for short work).
    pub fn observe(&mut self, signals: Signals, waiting: bool) -> f64 {
        self.observe_with(signals, waiting, true)
    }

    /// [`observe`](Self::observe); with `may_grow` false D does not grow this sample (what
    /// waits is held back by something other than slots, such as memory), though it may be cut.
    pub fn observe_with(&mut self, signals: Signals, waiting: bool, may_grow: bool) -> f64 {
        let unit = |v: Option<f64>| v.filter(|v| !v.is_nan()).map(|v| v.clamp(0.0, 1.0));
        let busy = unit(signals.busy);
        let sm = unit(signals.sm_activity);
        // Each tenant's slowdown weighted by its GPU time, then every tenant alike: one tenant's
        // reports move the GPU's D by its share of the tenants, whatever it claims.
        let (sum, tenants) = self
            .window
            .values()
            .filter(|(_, w)| *w > 0.0)
            .fold((0.0, 0u32), |(sum, n), (sw, w)| (sum + sw / w, n + 1));
        let slowdown = (tenants > 0).then(|| sum / f64::from(tenants));
        let pressure = slowdown.map(|s| s / self.cfg.slowdown_target);
        let factor = match self.cfg.law {
            Law::BusyTime => busy.map_or(1.0, |u| self.f_u(u)),
            Law::Fixed => 1.0,
            Law::Interference => {
                let binds = waiting || self.peak_running >= self.limit();
                match (pressure, sm) {
                    (Some(p), _) if p > 1.0 => {
                        self.round += 1;
                        (1.0 / p).max(1.0 - MAX_DECREASE)
                    }
                    (Some(p), _) if binds => {
                        let grow = 1.0 + self.cfg.alpha * (1.0 - p);
                        sm.map_or(grow, |u| grow.min(self.f_u(u))).max(1.0)
                    }
                    // No admission ended (long-lived leases, long bursts): SM activity — or,
                    // without GPM, busy-time, which is never below it — may let D grow while
                    // it is under the target. Neither ever cuts D.
                    (None, _) if binds && !self.ended => {
                        sm.or(busy).map_or(1.0, |u| self.f_u(u).max(1.0))
                    }
                    _ => 1.0,
                }
            }
        };
        let factor = if may_grow { factor } else { factor.min(1.0) };
        self.d = (self.d * factor).clamp(1.0, f64::from(self.cfg.d_max));
        self.last = Reading {
            busy,
            sm_activity: sm,
            slowdown,
            pressure,
        };
        self.window.clear();
        self.ended = false;
        self.peak_running = u32::try_from(self.inflight.len()).unwrap_or(u32::MAX);
        self.d
    }

    /// The most concurrency a baseline is learned at: D's starting limit.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "d_initial is validated in [1, d_max], d_max a u32: exact after floor"
    )]
    fn reference_level(&self) -> u32 {
        (self.cfg.d_initial.floor() as u32).max(1)
    }

    /// The factor a utilization asks for.
    fn f_u(&self, u: f64) -> f64 {
        1.0 + self.cfg.alpha * (self.cfg.u_target - u)
    }

    /// The real-valued D.
    #[must_use]
    pub fn d(&self) -> f64 {
        self.d
    }

    /// How many invocations may run now: `⌊D⌋`, at least 1.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "D is clamped to [1, d_max], d_max a u32: exact after floor"
    )]
    pub fn limit(&self) -> u32 {
        // d is clamped to [1, d_max] with d_max a u32, so the cast is exact after floor.
        (self.d.floor() as u32).max(1)
    }

    /// What the last sample saw.
    #[must_use]
    pub fn last(&self) -> Reading {
        self.last
    }

    /// A function's baseline: the concurrency it was learned at and the service time there.
    #[must_use]
    pub fn baseline(&self, function: &str) -> Option<(u32, f64)> {
        self.baselines.get(function).map(|b| (b.level, b.service_s))
    }

    /// Admissions in flight.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The knobs.
    #[must_use]
    pub fn config(&self) -> &ConcurrencyConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests;
