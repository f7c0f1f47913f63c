//! What each function needs from a GPU, measured.
//!
//! Placement by need, not by a static rule, needs a description of the need. Every ended burst
//! of a function's GPU work gives a [`Sample`]: how long the burst held the GPU, the SM and
//! memory-bandwidth utilization NVML attributed to its process over it, its footprint and the
//! bytes it moved between host and device (the interposer's counts). [`Features`] keeps, per
//! function, exponentially weighted means and variances of those, and classifies the function
//! once it has been seen `probe_runs` times: compute- or memory-bound, short or long, steady or
//! fluctuating. Until then it is *probing*, and placement runs it where its measurement is clean.
//!
//! Function names come from pod annotations and image metadata (hostile input): the registry is
//! bounded (`max_functions`; the function seen least recently is forgotten first) and ignores
//! non-finite or negative readings rather than letting one poison an average.

use std::collections::HashMap;

use serde::Serialize;

use crate::config::{ConfigError, reject};
use crate::time::Time;

/// One ended burst of a function's GPU work. Only the burst time is always known: a reading
/// that was not taken (`None`: no NVML process sample fell within a short burst, an
/// interposer that does not count bytes) leaves its average alone rather than pulling it
/// towards zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Time the burst held the GPU, ms.
    pub burst_ms: f64,
    /// SM utilization of its processes over the burst, 0..=1 (NVML process utilization).
    pub sm: Option<f64>,
    /// Memory-bandwidth utilization of its processes over the burst, 0..=1.
    pub dram: Option<f64>,
    /// Device memory it held, MiB.
    pub footprint_mib: Option<f64>,
    /// Bytes copied between host and device during the burst (the interposer's count).
    pub transfer_bytes: Option<f64>,
}

/// Knobs of the measurement and the classification.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FeatureConfig {
    /// Weight of a new sample in every average, (0, 1].
    pub alpha: f64,
    /// Bursts measured before a function is classified (its probe).
    pub probe_runs: u32,
    /// A function whose mean burst is below this is short, ms.
    pub short_ms: f64,
    /// Memory-bound when DRAM utilization ≥ this × SM utilization.
    pub memory_bound_ratio: f64,
    /// Fluctuating when the burst time's coefficient of variation exceeds this.
    pub fluctuating_cv: f64,
    /// Most functions remembered.
    pub max_functions: usize,
}

impl Default for FeatureConfig {
    fn default() -> Self {
        FeatureConfig {
            alpha: 0.2,
            probe_runs: 3,
            short_ms: 1000.0,
            memory_bound_ratio: 1.0,
            fluctuating_cv: 0.5,
            max_functions: 4096,
        }
    }
}

impl FeatureConfig {
    /// Checks every knob, naming the first bad one.
    ///
    /// # Errors
    /// A knob out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.alpha.is_finite() && self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(reject("features.alpha", self.alpha, "must be in (0, 1]"));
        }
        if self.probe_runs == 0 {
            return Err(reject("features.probe_runs", 0, "must be at least 1"));
        }
        for (knob, v) in [
            ("features.short_ms", self.short_ms),
            ("features.memory_bound_ratio", self.memory_bound_ratio),
            ("features.fluctuating_cv", self.fluctuating_cv),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(reject(knob, v, "must be a finite number > 0"));
            }
        }
        if self.max_functions == 0 {
            return Err(reject("features.max_functions", 0, "must be at least 1"));
        }
        Ok(())
    }
}

/// What limits a function's bursts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    /// SM throughput: it wants FLOPS.
    Compute,
    /// Memory bandwidth: it wants bandwidth and free memory.
    Memory,
}

/// How long its bursts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Length {
    /// Below `short_ms`: packed together.
    Short,
    /// Spread to stable GPUs.
    Long,
}

/// How much its bursts vary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stability {
    /// Coefficient of variation at most `fluctuating_cv`.
    Steady,
    /// Above it.
    Fluctuating,
}

/// A function's class, once probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum Class {
    /// Still being measured: this many bursts to go.
    Probing {
        /// Bursts left before classification.
        runs_left: u32,
    },
    /// Measured.
    Known {
        /// Compute- or memory-bound.
        bound: Bound,
        /// Short or long.
        length: Length,
        /// Steady or fluctuating.
        stability: Stability,
    },
}

/// An exponentially weighted mean and variance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Moments {
    mean: f64,
    var: f64,
    seen: bool,
}

impl Moments {
    pub(crate) fn observe(&mut self, alpha: f64, x: f64) {
        if !self.seen {
            *self = Moments {
                mean: x,
                var: 0.0,
                seen: true,
            };
            return;
        }
        let d = x - self.mean;
        self.mean += alpha * d;
        self.var = (1.0 - alpha) * (self.var + alpha * d * d);
    }

    /// The mean (0 before any sample).
    #[must_use]
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The standard deviation.
    #[must_use]
    pub fn stddev(&self) -> f64 {
        self.var.max(0.0).sqrt()
    }

    /// The mean, once a sample was seen.
    #[must_use]
    pub fn measured(&self) -> Option<f64> {
        self.seen.then_some(self.mean)
    }
}

/// One function's measured features.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FunctionFeatures {
    /// Burst time, ms.
    pub burst_ms: Moments,
    /// SM utilization.
    pub sm: Moments,
    /// Memory-bandwidth utilization.
    pub dram: Moments,
    /// Footprint, MiB.
    pub footprint_mib: Moments,
    /// Host↔device bytes per burst.
    pub transfer_bytes: Moments,
    /// Bursts measured.
    pub runs: u64,
    last_seen: Time,
}

impl FunctionFeatures {
    fn new(now: Time) -> Self {
        FunctionFeatures {
            burst_ms: Moments::default(),
            sm: Moments::default(),
            dram: Moments::default(),
            footprint_mib: Moments::default(),
            transfer_bytes: Moments::default(),
            runs: 0,
            last_seen: now,
        }
    }

    /// The class these features give under `cfg`.
    #[must_use]
    pub fn class(&self, cfg: &FeatureConfig) -> Class {
        let probe = u64::from(cfg.probe_runs);
        if self.runs < probe {
            return Class::Probing {
                runs_left: u32::try_from(probe - self.runs).unwrap_or(u32::MAX),
            };
        }
        let bound = if self.dram.mean() >= cfg.memory_bound_ratio * self.sm.mean()
            && self.dram.mean() > 0.0
        {
            Bound::Memory
        } else {
            Bound::Compute
        };
        let length = if self.burst_ms.mean() < cfg.short_ms {
            Length::Short
        } else {
            Length::Long
        };
        let cv = if self.burst_ms.mean() > 0.0 {
            self.burst_ms.stddev() / self.burst_ms.mean()
        } else {
            0.0
        };
        let stability = if cv > cfg.fluctuating_cv {
            Stability::Fluctuating
        } else {
            Stability::Steady
        };
        Class::Known {
            bound,
            length,
            stability,
        }
    }
}

/// Why a sample was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    /// A reading was negative, not finite, or a utilization above 1.
    #[error("sample field `{0}` is out of range")]
    OutOfRange(&'static str),
}

fn check(s: &Sample) -> Result<(), SampleError> {
    for (field, v, max) in [
        ("burst_ms", Some(s.burst_ms), f64::MAX),
        ("sm", s.sm, 1.0),
        ("dram", s.dram, 1.0),
        ("footprint_mib", s.footprint_mib, f64::MAX),
        ("transfer_bytes", s.transfer_bytes, f64::MAX),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && (0.0..=max).contains(&v))) {
            return Err(SampleError::OutOfRange(field));
        }
    }
    Ok(())
}

/// Every function's features, bounded.
#[derive(Clone, Debug)]
pub struct Features {
    cfg: FeatureConfig,
    by_function: HashMap<String, FunctionFeatures>,
    /// The tenant each function was admitted in, where it had one (for the bound).
    tenant_of: HashMap<String, String>,
}

impl Features {
    /// An empty registry (`cfg` validated by the caller, see [`FeatureConfig::validate`]).
    #[must_use]
    pub fn new(cfg: FeatureConfig) -> Self {
        Features {
            cfg,
            by_function: HashMap::new(),
            tenant_of: HashMap::new(),
        }
    }

    /// The knobs in force.
    #[must_use]
    pub fn config(&self) -> &FeatureConfig {
        &self.cfg
    }

    /// Adds one ended burst of `function`'s work. A new function past `max_functions` makes
    /// room by forgetting the one seen least recently of the tenant that holds the most
    /// ([`crate::tenant_lru`]): a tenant cycling function names forgets its own.
    ///
    /// # Errors
    /// A reading out of range (the sample is dropped, nothing changes).
    pub fn observe(
        &mut self,
        function: &str,
        sample: &Sample,
        now: Time,
    ) -> Result<(), SampleError> {
        self.observe_in(function, None, sample, now)
    }

    /// [`observe`](Self::observe) of a function admitted in `tenant`.
    ///
    /// # Errors
    /// A reading out of range (the sample is dropped, nothing changes).
    pub fn observe_in(
        &mut self,
        function: &str,
        tenant: Option<&str>,
        sample: &Sample,
        now: Time,
    ) -> Result<(), SampleError> {
        check(sample)?;
        if !self.by_function.contains_key(function)
            && self.by_function.len() >= self.cfg.max_functions
        {
            let victim = crate::tenant_lru::victim(self.by_function.iter().map(|(name, f)| {
                let tenant = self.tenant_of.get(name).map(String::as_str);
                (name.as_str(), tenant, f.last_seen)
            }))
            .map(str::to_owned);
            if let Some(name) = victim {
                self.by_function.remove(&name);
                self.tenant_of.remove(&name);
            }
        }
        if let Some(t) = tenant
            && !self.by_function.contains_key(function)
        {
            self.tenant_of.insert(function.to_owned(), t.to_owned());
        }
        let a = self.cfg.alpha;
        let f = self
            .by_function
            .entry(function.to_owned())
            .or_insert_with(|| FunctionFeatures::new(now));
        f.burst_ms.observe(a, sample.burst_ms);
        for (m, v) in [
            (&mut f.sm, sample.sm),
            (&mut f.dram, sample.dram),
            (&mut f.footprint_mib, sample.footprint_mib),
            (&mut f.transfer_bytes, sample.transfer_bytes),
        ] {
            if let Some(v) = v {
                m.observe(a, v);
            }
        }
        f.runs += 1;
        f.last_seen = f.last_seen.max(now);
        Ok(())
    }

    /// A function's features, if it was measured.
    #[must_use]
    pub fn get(&self, function: &str) -> Option<&FunctionFeatures> {
        self.by_function.get(function)
    }

    /// A function's class (probing with every run to go if it was never measured).
    #[must_use]
    pub fn class(&self, function: &str) -> Class {
        self.by_function.get(function).map_or(
            Class::Probing {
                runs_left: self.cfg.probe_runs,
            },
            |f| f.class(&self.cfg),
        )
    }

    /// Functions remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_function.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_function.is_empty()
    }
}
