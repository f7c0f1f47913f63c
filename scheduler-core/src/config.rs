//! Knobs, the design's profiles, and validation.
//!
//! Every knob has a name (the one used in `mqfqd.toml` and on the `mqfq-sim` command line), and
//! every rejection names it, so an operator can fix the file without reading code.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A knob that was given a value it cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid value {value} for `{knob}`: {reason}")]
pub struct ConfigError {
    /// The knob's name, as spelled in the config file.
    pub knob: &'static str,
    /// The rejected value, printed.
    pub value: String,
    /// What the knob accepts.
    pub reason: &'static str,
}

impl ConfigError {
    /// A rejection of `value` for `knob` (for knobs of the crates built on this one, such as
    /// `mqfqd.toml`'s own).
    pub fn new(knob: &'static str, value: impl fmt::Display, reason: &'static str) -> Self {
        ConfigError {
            knob,
            value: value.to_string(),
            reason,
        }
    }
}

/// The default [`QueueConfig::overtake_bound`].
pub const OVERTAKE_BOUND: f64 = 1.0;

pub(crate) fn reject(
    knob: &'static str,
    value: impl fmt::Display,
    reason: &'static str,
) -> ConfigError {
    ConfigError::new(knob, value, reason)
}

fn positive(knob: &'static str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(reject(knob, v, "must be a finite number > 0"))
    }
}

fn non_negative(knob: &'static str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(reject(knob, v, "must be a finite number >= 0"))
    }
}

fn unit_interval(knob: &'static str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(reject(knob, v, "must be in (0, 1]"))
    }
}

/// The over-run threshold T: how far (in virtual seconds) a flow's start tag may run ahead of the
/// global virtual time and still dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overrun {
    /// A fixed T in virtual seconds.
    Fixed(f64),
    /// T = k × τ_avg, the node-wide average service time (falls back to the fallback charge).
    TauMultiple(f64),
}

/// How long a drained flow stays Active (sticky) after its last service.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StickyTtl {
    /// A fixed TTL in seconds.
    Fixed(f64),
    /// k × the flow's average inter-arrival time (the design's rule).
    IatMultiple(f64),
    /// k × the flow's average service time (the published implementation's rule).
    ExecMultiple(f64),
}

/// Which flow the dispatcher serves next, among those within T of V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Keep serving the last flow while it is eligible and resident; otherwise the lowest of
    /// `S` (resident flows) and `S + switch cost / w` (others): locality when it is cheap in
    /// fairness, lowest `S` when it is not.
    StickyResident,
    /// Keep serving the last flow while eligible, then lowest S (the published `mqfq_sticky`).
    Sticky,
    /// Lowest S only (plain MQFQ).
    LowestStart,
    /// The oldest queued item first, whatever its flow: FCFS, for `policy = "fcfs"`. Flows, tags
    /// and events are kept (the pool, the controller and the metrics see the same flows); only
    /// the order changes, and T does not apply.
    Fifo,
}

/// The order the node grants admissions in (`policy` in mqfqd.toml): the A/B switch that lets
/// an operator compare the queue with plain FCFS on the same gate, the same D and the same pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GrantOrder {
    /// MQFQ-Sticky with the profile's knobs.
    #[default]
    MqfqSticky,
    /// First come, first served across functions; no short-slot reserve.
    Fcfs,
}

impl GrantOrder {
    /// The order a queue configuration grants in.
    #[must_use]
    pub fn of(queue: &QueueConfig) -> GrantOrder {
        if queue.selection == Selection::Fifo {
            GrantOrder::Fcfs
        } else {
            GrantOrder::MqfqSticky
        }
    }

    /// The name in the config file.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            GrantOrder::MqfqSticky => "mqfq-sticky",
            GrantOrder::Fcfs => "fcfs",
        }
    }
}

impl std::str::FromStr for GrantOrder {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "mqfq-sticky" => Ok(GrantOrder::MqfqSticky),
            "fcfs" => Ok(GrantOrder::Fcfs),
            _ => Err(reject("policy", s, "must be mqfq-sticky or fcfs")),
        }
    }
}

/// Knobs of the MQFQ-Sticky queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueConfig {
    /// T (`overrun`).
    pub overrun: Overrun,
    /// Sticky TTL rule (`ttl`).
    pub ttl: StickyTtl,
    /// TTL while the rule's input (IAT or service time) is still unknown (`fallback_ttl_s`).
    pub fallback_ttl_s: f64,
    /// Charge of a function whose service time is unknown (`fallback_charge_s`).
    pub fallback_charge_s: f64,
    /// Weight of a new sample in the per-function EWMAs (`ewma_alpha`).
    pub ewma_alpha: f64,
    /// Reconcile tags with the measured service at completion (`charge_correction`).
    pub charge_correction: bool,
    /// Flow selection rule (`selection`).
    pub selection: Selection,
    /// Flows whose charge is at most this are "short" (`short_charge_s`; 0 turns the short-slot
    /// reserve off). While any short flow is Active, a GPU whose slots under D are all taken
    /// keeps one more slot for short flows only, so short functions never wait behind a full set
    /// of long ones; the reserve never holds a slot under D empty while work waits.
    pub short_charge_s: f64,
    /// How far the fair order may overtake a queued call (`overtake_bound`; 0 turns it off):
    /// once the work dispatched since it arrived exceeds this many times the work queued ahead
    /// of it then, plus T, it is served before the fair order's choice (the longest-overdue
    /// first) while its flow is within T of V. Arrival order serves exactly the work queued
    /// ahead first; the bound takes back what the tie-breaks among eligible flows cost a call,
    /// never a Throttled flow's place.
    pub overtake_bound: f64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Profile::Balanced.queue()
    }
}

impl QueueConfig {
    /// Checks every knob; the error names the first bad one.
    ///
    /// # Errors
    /// [`ConfigError`] naming the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.overrun {
            Overrun::Fixed(t) => non_negative("overrun_s", t)?,
            Overrun::TauMultiple(k) => positive("overrun_tau", k)?,
        }
        match self.ttl {
            StickyTtl::Fixed(t) => non_negative("ttl_s", t)?,
            StickyTtl::IatMultiple(k) => non_negative("ttl_iat", k)?,
            StickyTtl::ExecMultiple(k) => non_negative("ttl_exec", k)?,
        }
        non_negative("fallback_ttl_s", self.fallback_ttl_s)?;
        positive("fallback_charge_s", self.fallback_charge_s)?;
        unit_interval("ewma_alpha", self.ewma_alpha)?;
        non_negative("short_charge_s", self.short_charge_s)?;
        let b = self.overtake_bound;
        if b != 0.0 && !(b.is_finite() && b >= 1.0) {
            return Err(reject(
                "overtake_bound",
                b,
                "must be 0 (off) or a finite number >= 1",
            ));
        }
        Ok(())
    }
}

/// How a GPU is shared; sets the ceiling of the concurrency limit D.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMode {
    /// Time-sliced sharing of a whole GPU (D_max 8).
    Plain,
    /// NVIDIA MPS (D_max 16).
    Mps,
    /// One MIG instance (D_max 1).
    Mig,
}

impl GpuMode {
    /// The design's D_max for this mode.
    #[must_use]
    pub fn default_d_max(self) -> u32 {
        match self {
            GpuMode::Plain => 8,
            GpuMode::Mps => 16,
            GpuMode::Mig => 1,
        }
    }
}

impl FromStr for GpuMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "plain" => Ok(GpuMode::Plain),
            "mps" => Ok(GpuMode::Mps),
            "mig" => Ok(GpuMode::Mig),
            _ => Err(reject("mode", s, "expected plain, mps or mig")),
        }
    }
}

/// What moves D (see [`crate::concurrency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Law {
    /// The measured slowdown of admissions against each function's baseline, combined with SM
    /// activity where the GPU reports it (GPM). What `mqfqd` runs.
    #[default]
    Interference,
    /// The published law on NVML's busy-time alone: kept only so that the simulator can show
    /// what it would have done (`mqfq-sim --d-law busy-time`); `mqfqd` never runs it.
    BusyTime,
    /// D held where it starts (`d_initial`), whatever is measured: the simulator's `--fixed-d`,
    /// to tell what the order and the memory cost apart from what D does. Set only through
    /// [`Overrides::fixed_d`]; not a name `d_law` takes, and `mqfqd` never runs it.
    Fixed,
}

impl FromStr for Law {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "interference" => Ok(Law::Interference),
            "busy-time" => Ok(Law::BusyTime),
            _ => Err(reject("d_law", s, "expected interference or busy-time")),
        }
    }
}

/// Knobs of the dynamic concurrency controller.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConcurrencyConfig {
    /// Gain α: how fast D moves per sample (`alpha`).
    pub alpha: f64,
    /// Target SM activity where GPM reports it; the busy-time law's target (`u_target`).
    pub u_target: f64,
    /// Ceiling of D (`d_max`); defaults from the GPU mode.
    pub d_max: u32,
    /// D at start (`d_initial`).
    pub d_initial: f64,
    /// The most an admission should be slowed by its co-runners, against its function's
    /// baseline (`slowdown_target`; default 2: every run keeps half its solo speed, so two busy
    /// kernels time-sliced, 2× each, are never grown past and three are cut).
    pub slowdown_target: f64,
    /// What moves D.
    pub law: Law,
}

impl ConcurrencyConfig {
    /// Defaults for a mode, with the given α.
    #[must_use]
    pub fn for_mode(mode: GpuMode, alpha: f64) -> Self {
        let d_max = mode.default_d_max();
        ConcurrencyConfig {
            alpha,
            u_target: 0.9,
            d_max,
            d_initial: f64::from(d_max.min(2)),
            slowdown_target: 2.0,
            law: Law::Interference,
        }
    }

    /// Checks every knob.
    ///
    /// # Errors
    /// [`ConfigError`] naming the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        unit_interval("alpha", self.alpha)?;
        unit_interval("u_target", self.u_target)?;
        if self.d_max == 0 {
            return Err(reject("d_max", self.d_max, "must be at least 1"));
        }
        if !(self.d_initial.is_finite()
            && self.d_initial >= 1.0
            && self.d_initial <= f64::from(self.d_max))
        {
            return Err(reject("d_initial", self.d_initial, "must be in [1, d_max]"));
        }
        if !(self.slowdown_target.is_finite()
            && self.slowdown_target > 1.0
            && self.slowdown_target <= 10.0)
        {
            return Err(reject(
                "slowdown_target",
                self.slowdown_target,
                "must be in (1, 10]",
            ));
        }
        Ok(())
    }
}

/// Knobs of the pool-tier policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierConfig {
    /// An idle Hot container moves to Warm after this long (`hot_ttl_s`; design: 30 min).
    pub hot_ttl_s: f64,
    /// A Warm container becomes Cold (dropped) after this long (`warm_ttl_s`; design: 2 h).
    pub warm_ttl_s: f64,
    /// Fraction of GPU memory kept free (`headroom`; design: 0.15).
    pub headroom: f64,
    /// Prefetch when the time since a function's last call is below k × its mean inter-arrival
    /// time (`prefetch_iat`; design: 5).
    pub prefetch_iat: f64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            hot_ttl_s: 30.0 * 60.0,
            warm_ttl_s: 2.0 * 3600.0,
            headroom: 0.15,
            prefetch_iat: 5.0,
        }
    }
}

impl TierConfig {
    /// Checks every knob.
    ///
    /// # Errors
    /// [`ConfigError`] naming the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        non_negative("hot_ttl_s", self.hot_ttl_s)?;
        non_negative("warm_ttl_s", self.warm_ttl_s)?;
        if !(self.headroom.is_finite() && (0.0..1.0).contains(&self.headroom)) {
            return Err(reject("headroom", self.headroom, "must be in [0, 1)"));
        }
        non_negative("prefetch_iat", self.prefetch_iat)?;
        Ok(())
    }
}

/// The design's three profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// T = 2 τ_avg, TTL = 3 × IAT, α = 0.1: tight fairness, short residency.
    Light,
    /// T = 5 τ_avg, TTL = 5 × IAT, α = 0.2.
    Balanced,
    /// T = 10 τ_avg, TTL = 8 × IAT, α = 0.3: more locality, looser fairness.
    Throughput,
}

impl FromStr for Profile {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "light" => Ok(Profile::Light),
            "balanced" => Ok(Profile::Balanced),
            "throughput" => Ok(Profile::Throughput),
            _ => Err(reject(
                "profile",
                s,
                "expected light, balanced or throughput",
            )),
        }
    }
}

impl Profile {
    fn numbers(self) -> (f64, f64, f64) {
        match self {
            Profile::Light => (2.0, 3.0, 0.1),
            Profile::Balanced => (5.0, 5.0, 0.2),
            Profile::Throughput => (10.0, 8.0, 0.3),
        }
    }

    /// The queue knobs of this profile.
    #[must_use]
    pub fn queue(self) -> QueueConfig {
        let (t, ttl, _) = self.numbers();
        QueueConfig {
            overrun: Overrun::TauMultiple(t),
            ttl: StickyTtl::IatMultiple(ttl),
            fallback_ttl_s: 2.0,
            fallback_charge_s: 0.5,
            ewma_alpha: 0.2,
            charge_correction: true,
            selection: Selection::StickyResident,
            short_charge_s: 1.0,
            overtake_bound: OVERTAKE_BOUND,
        }
    }

    /// The concurrency knobs of this profile for a GPU mode.
    #[must_use]
    pub fn concurrency(self, mode: GpuMode) -> ConcurrencyConfig {
        ConcurrencyConfig::for_mode(mode, self.numbers().2)
    }
}

/// The queue's knobs over a profile (`None` keeps the profile's value), as `mqfqd.toml`'s
/// `[queue]` table reads them (`deny_unknown_fields`: a misspelt knob is an error) and the
/// simulator's flags set them; the one list of them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueKnobs {
    /// Fixed T, virtual seconds.
    pub overrun_s: Option<f64>,
    /// T as a multiple of τ_avg.
    pub overrun_tau: Option<f64>,
    /// Fixed sticky TTL, seconds.
    pub ttl_s: Option<f64>,
    /// Sticky TTL as a multiple of the flow's inter-arrival time.
    pub ttl_iat: Option<f64>,
    /// Charge of a function before its service time is known.
    pub fallback_charge_s: Option<f64>,
    /// Short-flow threshold of the reserved slot (0 = off).
    pub short_charge_s: Option<f64>,
    /// How far the fair order may overtake a queued call, as a multiple of the work queued
    /// ahead of it when it arrived (0 = off).
    pub overtake_bound: Option<f64>,
    /// GPU memory is admitted with the slots (default on): a lease is granted only where its
    /// function's footprint fits beside the leases held, within capacity less the pool's
    /// headroom. Read through `MemoryAdmission::from_knobs` by whoever builds the admission
    /// core, not by [`Overrides::apply`].
    pub memory_admission: Option<bool>,
    /// What a function is charged before the pool has measured its containers, MiB (4096).
    /// Read with `memory_admission`.
    pub default_footprint_mb: Option<u64>,
    /// Waiting work that may run on several GPUs moves to one of them that frees first. Read
    /// through [`QueueKnobs::late_binding_or`] by whoever builds the admission core.
    pub late_binding: Option<bool>,
}

impl QueueKnobs {
    /// Late binding as these knobs ask; `default` where they say nothing. Its right default is
    /// the runner's: off in `mqfqd`, where a burst runs on the GPU its container holds; on in
    /// the simulator, whose executor runs each grant on the GPU the grant names.
    #[must_use]
    pub fn late_binding_or(&self, default: bool) -> bool {
        self.late_binding.unwrap_or(default)
    }
}

/// The concurrency limit's knobs over a profile, as `[concurrency]` reads them; the one list.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyKnobs {
    /// Gain α.
    pub alpha: Option<f64>,
    /// SM activity above which D stops growing (GPUs with GPM).
    pub u_target: Option<f64>,
    /// Ceiling of D (default from the GPU mode: 8 plain, 16 MPS, 1 MIG).
    pub d_max: Option<u32>,
    /// D at start: as given on whole GPUs; an MPS or MIG ceiling clamps it.
    pub d_initial: Option<f64>,
    /// The most co-runners should slow an admission against its function's baseline (default
    /// 2); above it D is cut.
    pub slowdown_target: Option<f64>,
}

/// Overrides on top of a profile; `None` keeps the profile's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// The queue's.
    pub queue: QueueKnobs,
    /// The concurrency limit's.
    pub concurrency: ConcurrencyKnobs,
    /// What moves D (the simulator's comparison; `mqfqd` is always driven by interference).
    pub law: Option<Law>,
    /// The order admissions are granted in.
    pub order: Option<GrantOrder>,
    /// D held at this many slots on every GPU ([`Law::Fixed`], `d_max` = `d_initial` = it);
    /// not together with `d_max`, `d_initial` or `law`.
    pub fixed_d: Option<u32>,
}

impl Overrides {
    /// Applies the overrides and validates the result; on error nothing is changed.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first knob that is out of range, or two knobs that conflict.
    pub fn apply(
        &self,
        queue_out: &mut QueueConfig,
        conc_out: &mut ConcurrencyConfig,
        mode: GpuMode,
    ) -> Result<(), ConfigError> {
        let mut queue = queue_out.clone();
        let mut conc = conc_out.clone();
        let (q, k) = (&self.queue, &self.concurrency);
        match (q.overrun_s, q.overrun_tau) {
            (Some(_), Some(_)) => {
                return Err(reject(
                    "overrun_s",
                    "set together with overrun_tau",
                    "give T either in seconds or as a multiple of τ_avg",
                ));
            }
            (Some(t), None) => queue.overrun = Overrun::Fixed(t),
            (None, Some(k)) => queue.overrun = Overrun::TauMultiple(k),
            (None, None) => {}
        }
        match (q.ttl_s, q.ttl_iat) {
            (Some(_), Some(_)) => {
                return Err(reject(
                    "ttl_s",
                    "set together with ttl_iat",
                    "give the TTL either in seconds or as a multiple of the IAT",
                ));
            }
            (Some(t), None) => queue.ttl = StickyTtl::Fixed(t),
            (None, Some(k)) => queue.ttl = StickyTtl::IatMultiple(k),
            (None, None) => {}
        }
        if let Some(c) = q.fallback_charge_s {
            queue.fallback_charge_s = c;
        }
        if let Some(c) = q.short_charge_s {
            queue.short_charge_s = c;
        }
        if let Some(b) = q.overtake_bound {
            queue.overtake_bound = b;
        }
        if let Some(a) = k.alpha {
            conc.alpha = a;
        }
        if let Some(u) = k.u_target {
            conc.u_target = u;
        }
        if let Some(d) = k.d_max {
            conc.d_max = d;
            conc.d_initial = conc.d_initial.min(f64::from(d.max(1)));
        }
        if let Some(d) = k.d_initial {
            // Checked as given for whole GPUs; an MPS or MIG ceiling clamps it.
            conc.d_initial = if mode == GpuMode::Plain {
                d
            } else {
                d.min(f64::from(conc.d_max))
            };
        }
        if let Some(t) = k.slowdown_target {
            conc.slowdown_target = t;
        }
        if let Some(l) = self.law {
            conc.law = l;
        }
        if let Some(d) = self.fixed_d {
            if k.d_max.is_some()
                || k.d_initial.is_some()
                || self.law.is_some_and(|l| l != Law::Fixed)
            {
                return Err(reject(
                    "fixed_d",
                    "set together with d_max, d_initial or a law",
                    "a fixed D is its own ceiling and law",
                ));
            }
            if d == 0 {
                return Err(reject("fixed_d", "0", "D is at least 1"));
            }
            conc.law = Law::Fixed;
            conc.d_max = d;
            conc.d_initial = f64::from(d);
        }
        if self.order == Some(GrantOrder::Fcfs) {
            self.arrival_order(&mut queue)?;
        }
        queue.validate()?;
        conc.validate()?;
        *queue_out = queue;
        *conc_out = conc;
        Ok(())
    }

    /// `policy = "fcfs"`: the queue in arrival order, without mqfq-sticky's reserve and
    /// overtake bound (either set with it is an error).
    fn arrival_order(&self, queue: &mut QueueConfig) -> Result<(), ConfigError> {
        let q = &self.queue;
        if q.short_charge_s.is_some_and(|c| c > 0.0) {
            return Err(reject(
                "short_charge_s",
                "set with policy = \"fcfs\"",
                "the short-slot reserve is part of mqfq-sticky; fcfs has none",
            ));
        }
        if q.overtake_bound.is_some_and(|b| b != 0.0) {
            return Err(reject(
                "overtake_bound",
                "set with policy = \"fcfs\"",
                "arrival order overtakes nothing; the bound is part of mqfq-sticky",
            ));
        }
        queue.selection = Selection::Fifo;
        queue.short_charge_s = 0.0;
        queue.overtake_bound = 0.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
