//! Whether a GPU should take new containers: failed (NVML errors, an Xid) or overloaded
//! (saturated sample after sample) GPUs are avoided until they recover.
//!
//! The daemon feeds one [`HealthSample`] per GPU per sampling period; the tracker is a small
//! state machine with explicit transitions, and reports each change so it can be logged,
//! counted and shown by `mqfqctl`. It also keeps what fitness weighs besides the state: how
//! much the GPU's load varies from sample to sample (long functions go to stable GPUs) and
//! its power draw against its limit (the energy term).

use serde::Serialize;

use super::features::Moments;
use super::fitness::Health;
use crate::config::{ConfigError, reject};

/// Weight of a new sample in the load's mean and variance (about the last 20 samples).
const LOAD_ALPHA: f64 = 0.05;

/// One sampling period's evidence about a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct HealthSample {
    /// SM activity, 0..=1, where the GPU measures it (GPM); `None` judges no overload.
    /// Busy-time is no measure of overload: it reads 100 % while any one kernel runs, which
    /// is what a GPU admitting work under a concurrency limit is meant to look like.
    pub utilization: Option<f64>,
    /// NVML failed to read this GPU in this period. A period in which NVML itself could not
    /// be reached is evidence against no GPU in particular: the daemon sends no sample for it.
    pub error: bool,
    /// NVML reported an Xid error that says the GPU itself is failing (a double-bit ECC
    /// error, fallen off the bus, …: `placement.xids`): failed for `xid_recover_samples`.
    pub xid: bool,
    /// NVML busy-time, 0..=1: the load whose variance is tracked where SM activity is not
    /// measured.
    pub busy: Option<f64>,
    /// Power draw over the enforced limit, 0..=1, where NVML reports both.
    pub power: Option<f64>,
}

/// Knobs of the tracker.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HealthConfig {
    /// Utilization at or above this is saturated.
    pub overload_utilization: f64,
    /// Consecutive saturated samples that make a GPU overloaded.
    pub overload_samples: u32,
    /// Consecutive clean samples that bring a failed or overloaded GPU back.
    pub recover_samples: u32,
    /// Consecutive clean samples that bring back a GPU failed by an Xid.
    pub xid_recover_samples: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        // At 100 ms samples: overloaded after 30 s saturated, back after 60 s clean.
        HealthConfig {
            overload_utilization: 0.98,
            overload_samples: 300,
            recover_samples: 600,
            // 30 minutes: an Xid that says the GPU is failing usually wants a reset.
            xid_recover_samples: 18_000,
        }
    }
}

impl HealthConfig {
    /// Checks the knobs, naming the first bad one.
    ///
    /// # Errors
    /// A knob out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let u = self.overload_utilization;
        if !(u.is_finite() && u > 0.0 && u <= 1.0) {
            return Err(reject(
                "placement.overload_utilization",
                u,
                "must be in (0, 1]",
            ));
        }
        if self.overload_samples == 0 {
            return Err(reject(
                "placement.overload_samples",
                0,
                "must be at least 1",
            ));
        }
        if self.recover_samples == 0 {
            return Err(reject("placement.recover_samples", 0, "must be at least 1"));
        }
        if self.xid_recover_samples == 0 {
            return Err(reject(
                "placement.xid_recover_samples",
                0,
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// One GPU's health over time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HealthTracker {
    state: Health,
    saturated_run: u32,
    clean_run: u32,
    errors: u64,
    /// The failure came from an Xid: recovery takes `xid_recover_samples`.
    xid: bool,
    load: Moments,
    power: Option<f64>,
}

impl Default for HealthTracker {
    fn default() -> Self {
        HealthTracker {
            state: Health::Healthy,
            saturated_run: 0,
            clean_run: 0,
            errors: 0,
            xid: false,
            load: Moments::default(),
            power: None,
        }
    }
}

impl HealthTracker {
    /// Its condition now.
    #[must_use]
    pub fn state(&self) -> Health {
        self.state
    }

    /// Periods with an error seen so far.
    #[must_use]
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// How much its load varies from sample to sample (standard deviation, 0..=1).
    #[must_use]
    pub fn load_stddev(&self) -> f64 {
        self.load.stddev().min(1.0)
    }

    /// Its last power draw over its limit, where known.
    #[must_use]
    pub fn power(&self) -> Option<f64> {
        self.power
    }

    /// Takes one period's sample; returns `(from, to)` when the condition changed.
    pub fn observe(&mut self, s: HealthSample, cfg: &HealthConfig) -> Option<(Health, Health)> {
        let from = self.state;
        let unit = |v: Option<f64>| v.filter(|x| x.is_finite() && (0.0..=1.0).contains(x));
        if let Some(load) = unit(s.utilization).or(unit(s.busy)) {
            self.load.observe(LOAD_ALPHA, load);
        }
        if !s.error {
            self.power = unit(s.power);
        }
        let saturated = s
            .utilization
            .is_some_and(|u| u.is_finite() && u >= cfg.overload_utilization);
        if s.error || s.xid {
            self.errors += 1;
            self.clean_run = 0;
            self.saturated_run = 0;
            self.state = Health::Failed;
            self.xid |= s.xid;
        } else {
            self.saturated_run = if saturated {
                self.saturated_run.saturating_add(1)
            } else {
                0
            };
            // Clean: no error, and (to leave overload) not saturated.
            let clean = match self.state {
                Health::Failed => true,
                Health::Overloaded | Health::Healthy => !saturated,
            };
            self.clean_run = if clean {
                self.clean_run.saturating_add(1)
            } else {
                0
            };
            let recover = if self.xid {
                cfg.xid_recover_samples.max(cfg.recover_samples)
            } else {
                cfg.recover_samples
            };
            self.state = match self.state {
                Health::Healthy if self.saturated_run >= cfg.overload_samples => Health::Overloaded,
                Health::Failed | Health::Overloaded if self.clean_run >= recover => {
                    self.clean_run = 0;
                    self.xid = false;
                    Health::Healthy
                }
                other => other,
            };
        }
        (from != self.state).then_some((from, self.state))
    }
}
