//! The cluster's half of placement: what a node publishes about its GPUs, when it publishes,
//! and how a scheduler extender ranks nodes for a pod from what the nodes published.
//!
//! A node's [`NodeSummary`] is small on purpose (models, free memory, utilization, health,
//! queue per function class, the classes of its functions, two fitness sums): the API server
//! stores one object per node, and every write costs every watcher. [`PublishGate`] decides
//! when a changed summary is worth a write: on a threshold crossing (a bucket of utilization,
//! free memory or queue changed, a GPU's health, a function's class), else on a slow
//! heartbeat, and never more often than a minimum interval, so a churning node cannot storm
//! the API server. [`rank`] is the extender's decision, pure: filter and 0–10 scores.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::features::{Bound, Class, Length};
use crate::config::{ConfigError, reject};
use crate::time::Time;

/// The most functions a summary lists (the most recently known; bounded so one node's
/// object stays small whatever its pods name).
pub const MAX_FUNCTIONS: usize = 256;

/// One GPU as a node publishes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GpuSummary {
    /// NVML index.
    pub index: u32,
    /// NVML's name.
    pub name: String,
    /// Dense FP32 TFLOPS of its model.
    pub tflops: f64,
    /// Memory bandwidth of its model, GB/s.
    pub mem_gbps: f64,
    /// Framebuffer bytes.
    pub memory_total: u64,
    /// Framebuffer bytes free.
    pub memory_free: u64,
    /// SM activity where measured, else the share of its slots in use, 0..=1.
    pub utilization: f64,
    /// `healthy`, `overloaded` or `failed` for new containers.
    pub health: String,
    /// Its concurrency limit in force.
    pub limit: u32,
    /// Admissions running on it.
    pub running: u32,
    /// Admissions waiting for it.
    pub queued: u32,
}

/// Figures a GPU summary is held to when read (a published object is anyone's word).
const MAX_TFLOPS: f64 = 10_000.0;
const MAX_MEM_GBPS: f64 = 100_000.0;

/// The most GPUs, queue classes and functions a summary read from the API server keeps.
const MAX_GPUS: usize = 64;
const MAX_CLASSES: usize = 16;

fn finite_in(v: f64, hi: f64) -> f64 {
    if v.is_finite() { v.clamp(0.0, hi) } else { 0.0 }
}

impl GpuSummary {
    fn usable(&self) -> bool {
        self.health != "failed"
    }

    fn clamp(&mut self) {
        self.tflops = finite_in(self.tflops, MAX_TFLOPS);
        self.mem_gbps = finite_in(self.mem_gbps, MAX_MEM_GBPS);
        // Not finite: unknown, counted as busy.
        self.utilization = if self.utilization.is_finite() {
            self.utilization.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.memory_free = self.memory_free.min(self.memory_total);
    }

    fn memory_used_fraction(&self) -> f64 {
        if self.memory_total == 0 {
            return 1.0;
        }
        #[expect(clippy::cast_precision_loss, reason = "memory sizes as fractions")]
        let f = 1.0 - self.memory_free as f64 / self.memory_total as f64;
        f.clamp(0.0, 1.0)
    }
}

/// What a node publishes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSummary {
    /// Its GPUs.
    pub gpus: Vec<GpuSummary>,
    /// Waiting admissions per function class (`compute-short`, …, `probing`).
    pub queue_by_class: BTreeMap<String, u32>,
    /// Functions it has measured, by flow key, with their class.
    pub functions: BTreeMap<String, String>,
    /// Free compute over usable GPUs: Σ TFLOPS × (1 − utilization).
    pub free_tflops: f64,
    /// Free bandwidth over usable GPUs: Σ GB/s × (1 − memory used fraction).
    pub free_mem_gbps: f64,
}

impl NodeSummary {
    /// A summary of `gpus` and `functions` (flow key → class label, queued admissions), the
    /// fitness sums filled in, the function list cut to the first [`MAX_FUNCTIONS`] given.
    /// Figures that are not finite count as 0 (a JSON `null` would not read back).
    #[must_use]
    pub fn new(mut gpus: Vec<GpuSummary>, functions: &[(String, String, u32)]) -> Self {
        for g in &mut gpus {
            g.clamp();
        }
        let mut queue_by_class = BTreeMap::new();
        let mut listed = BTreeMap::new();
        for (f, class, queued) in functions {
            if *queued > 0 {
                *queue_by_class.entry(class.clone()).or_insert(0u32) += queued;
            }
            if listed.len() < MAX_FUNCTIONS && class != "probing" {
                listed.insert(f.clone(), class.clone());
            }
        }
        let usable = || gpus.iter().filter(|g| g.usable());
        let free_tflops = usable()
            .map(|g| g.tflops * (1.0 - g.utilization.clamp(0.0, 1.0)))
            .sum();
        let free_mem_gbps = usable()
            .map(|g| g.mem_gbps * (1.0 - g.memory_used_fraction()))
            .sum();
        NodeSummary {
            queue_by_class,
            functions: listed,
            free_tflops,
            free_mem_gbps,
            gpus,
        }
    }

    /// The summary as the extender may trust it: each GPU's figures held to plausible ranges,
    /// the free sums recomputed from them (never taken from the object), the lists bounded.
    #[must_use]
    pub fn sanitized(mut self) -> Self {
        self.gpus.truncate(MAX_GPUS);
        let functions: Vec<(String, String, u32)> = self
            .functions
            .into_iter()
            .take(MAX_FUNCTIONS)
            .map(|(f, c)| (f, c, 0))
            .collect();
        let mut s = NodeSummary::new(self.gpus, &functions);
        s.queue_by_class = self.queue_by_class.into_iter().take(MAX_CLASSES).collect();
        s
    }

    fn slots(&self) -> (u32, u32) {
        self.gpus
            .iter()
            .filter(|g| g.usable())
            .fold((0, 0), |(l, q), g| {
                (
                    l.saturating_add(g.limit.max(1)),
                    q.saturating_add(g.running).saturating_add(g.queued),
                )
            })
    }
}

/// A class's label as published (`compute-short`, `memory-long`, …); `None` while probing.
#[must_use]
pub fn class_label(c: Class) -> Option<&'static str> {
    match c {
        Class::Probing { .. } => None,
        Class::Known { bound, length, .. } => Some(match (bound, length) {
            (Bound::Compute, Length::Short) => "compute-short",
            (Bound::Compute, Length::Long) => "compute-long",
            (Bound::Memory, Length::Short) => "memory-short",
            (Bound::Memory, Length::Long) => "memory-long",
        }),
    }
}

fn parse_label(s: &str) -> Option<(Bound, Length)> {
    Some(match s {
        "compute-short" => (Bound::Compute, Length::Short),
        "compute-long" => (Bound::Compute, Length::Long),
        "memory-short" => (Bound::Memory, Length::Short),
        "memory-long" => (Bound::Memory, Length::Long),
        _ => return None,
    })
}

/// When a node writes its summary.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublishConfig {
    /// Written at least this often, seconds, changed or not (the extender treats an object
    /// older than three of these as stale).
    pub heartbeat_s: f64,
    /// Never written more often than this, seconds.
    pub min_interval_s: f64,
    /// A GPU's utilization crossing a multiple of this is a change worth a write.
    pub utilization_step: f64,
    /// A GPU's free memory crossing a multiple of this fraction of its total is one too.
    pub memory_step: f64,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            heartbeat_s: 60.0,
            min_interval_s: 10.0,
            utilization_step: 0.25,
            memory_step: 0.25,
        }
    }
}

impl PublishConfig {
    /// Checks the knobs, naming the first bad one.
    ///
    /// # Errors
    /// A knob out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.min_interval_s) {
            return Err(reject(
                "publish.min_interval_s",
                self.min_interval_s,
                "must be > 0",
            ));
        }
        if !(positive(self.heartbeat_s) && self.heartbeat_s >= self.min_interval_s) {
            return Err(reject(
                "publish.heartbeat_s",
                self.heartbeat_s,
                "must be at least min_interval_s",
            ));
        }
        for (name, v) in [
            ("publish.utilization_step", self.utilization_step),
            ("publish.memory_step", self.memory_step),
        ] {
            if !(positive(v) && v <= 1.0) {
                return Err(reject(name, v, "must be in (0, 1]"));
            }
        }
        Ok(())
    }
}

/// Why a summary is written now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// Nothing written yet.
    First,
    /// A threshold was crossed.
    Crossing,
    /// Unchanged for a heartbeat.
    Heartbeat,
}

impl Why {
    /// `first`, `crossing` or `heartbeat`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Why::First => "first",
            Why::Crossing => "crossing",
            Why::Heartbeat => "heartbeat",
        }
    }
}

/// The coarse shape of a summary: two summaries with the same shape differ by nothing worth
/// a write.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape {
    gpus: Vec<(u32, i64, i64, String)>,
    queues: BTreeMap<String, u32>,
    functions: BTreeMap<String, String>,
}

/// Queue lengths in buckets that double: 0–1, 2–3, 4–7, … (a node flipping between none and
/// one waiting is not news).
fn queue_bucket(n: u32) -> u32 {
    32 - (n >> 1).leading_zeros()
}

#[expect(clippy::cast_possible_truncation, reason = "bucket numbers are small")]
fn bucket(v: f64, step: f64) -> i64 {
    (v.clamp(0.0, 1.0) / step).floor() as i64
}

/// Decides when a node writes its summary.
#[derive(Clone, Debug)]
pub struct PublishGate {
    cfg: PublishConfig,
    last: Option<(Shape, Time)>,
    /// Writes failed in a row, and when the next may be tried.
    failures: u32,
    retry_at: Option<Time>,
}

impl PublishGate {
    /// A gate under `cfg`.
    ///
    /// # Errors
    /// A bad knob.
    pub fn new(cfg: PublishConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(PublishGate {
            cfg,
            last: None,
            failures: 0,
            retry_at: None,
        })
    }

    fn shape(&self, s: &NodeSummary) -> Shape {
        Shape {
            gpus: s
                .gpus
                .iter()
                .map(|g| {
                    (
                        g.index,
                        bucket(g.utilization, self.cfg.utilization_step),
                        bucket(1.0 - g.memory_used_fraction(), self.cfg.memory_step),
                        g.health.clone(),
                    )
                })
                .collect(),
            queues: s
                .queue_by_class
                .iter()
                .map(|(c, &n)| (c.clone(), queue_bucket(n)))
                .filter(|&(_, b)| b > 0)
                .collect(),
            functions: s.functions.clone(),
        }
    }

    /// Whether `s` should be written at `now`, and why; `None`: not now. Nothing is
    /// remembered until [`PublishGate::written`] says the write went through.
    #[must_use]
    pub fn due(&self, s: &NodeSummary, now: Time) -> Option<Why> {
        if self.retry_at.is_some_and(|r| now < r) {
            return None;
        }
        let Some((shape, at)) = &self.last else {
            return Some(Why::First);
        };
        let since = now.secs_since(*at);
        if since < self.cfg.min_interval_s {
            return None;
        }
        if *shape != self.shape(s) {
            return Some(Why::Crossing);
        }
        (since >= self.cfg.heartbeat_s).then_some(Why::Heartbeat)
    }

    /// `s` was written at `now`.
    pub fn written(&mut self, s: &NodeSummary, now: Time) {
        self.last = Some((self.shape(s), now));
        self.failures = 0;
        self.retry_at = None;
    }

    /// A write failed at `now`: the next try waits the minimum interval, doubled at each
    /// failure in a row up to the heartbeat, so an API server in trouble is not asked every
    /// tick by every node.
    pub fn failed(&mut self, now: Time) {
        self.failures = self.failures.saturating_add(1);
        let wait = (self.cfg.min_interval_s * 2f64.powi(self.failures.min(16).cast_signed() - 1))
            .min(self.cfg.heartbeat_s);
        self.retry_at = Some(now.plus_secs(wait));
    }
}

/// A node as the extender sees it: its name and its published summary, if any, with its age.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState<'a> {
    /// Node name.
    pub name: &'a str,
    /// What it published and how many seconds ago; `None`: nothing (mqfq not on it).
    pub summary: Option<(&'a NodeSummary, f64)>,
}

/// The extender's answer for one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ranked {
    /// Node name.
    pub name: String,
    /// Why it cannot take the pod; `None`: it can.
    pub failed: Option<String>,
    /// 0..=10 (the extender API's range).
    pub score: i64,
}

/// Highest score the scheduler-extender API takes.
pub const MAX_SCORE: i64 = 10;

/// Ranks `nodes` for a pod of `function` (its flow key, if it names one). A node with a
/// fresh summary and no usable GPU fails; a node with no summary, or one older than
/// `stale_s`, passes with score 0 (the extender must never be why a pod cannot be scheduled
/// when publishing lags). Fresh nodes score by free compute or free bandwidth for the
/// function's class (learned on any node; unknown: free slots), less their queue.
#[must_use]
pub fn rank<'a>(nodes: &[NodeState<'a>], function: Option<&str>, stale_s: f64) -> Vec<Ranked> {
    let fresh = |n: &NodeState<'a>| -> Option<(&'a NodeSummary, f64)> {
        n.summary
            .filter(|&(_, age)| age.is_finite() && age < stale_s)
    };
    let class = function.and_then(|f| {
        nodes
            .iter()
            .filter_map(&fresh)
            .find_map(|(s, _)| s.functions.get(f))
            .and_then(|c| parse_label(c))
    });
    // Each fresh node's raw merit: what it offers the class, shrunk by the work ahead.
    let merit = |s: &NodeSummary| {
        let (limit, load) = s.slots();
        if limit == 0 {
            return 0.0;
        }
        let offer = match class {
            Some((Bound::Compute, _)) => s.free_tflops,
            Some((Bound::Memory, _)) => s.free_mem_gbps,
            None => f64::from(limit.saturating_sub(load)).max(0.0) + 1.0,
        };
        // Expected completion grows with the rounds of work ahead of it.
        offer / (1.0 + f64::from(load) / f64::from(limit))
    };
    let best = nodes
        .iter()
        .filter_map(&fresh)
        .map(|(s, _)| merit(s))
        .fold(0.0_f64, f64::max);
    nodes
        .iter()
        .map(|n| {
            let Some((s, _)) = fresh(n) else {
                return Ranked {
                    name: n.name.to_owned(),
                    failed: None,
                    score: 0,
                };
            };
            // Fails only on its own word that every GPU it has failed.
            if !s.gpus.is_empty() && !s.gpus.iter().any(GpuSummary::usable) {
                return Ranked {
                    name: n.name.to_owned(),
                    failed: Some("mqfq: no usable GPU on this node".to_owned()),
                    score: 0,
                };
            }
            let m = merit(s);
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_precision_loss,
                reason = "MAX_SCORE is 10: the score is 0..=10"
            )]
            let score = if best > 0.0 {
                ((m / best) * MAX_SCORE as f64).round() as i64
            } else {
                0
            };
            Ranked {
                name: n.name.to_owned(),
                failed: None,
                score: score.clamp(0, MAX_SCORE),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
