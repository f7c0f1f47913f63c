//! Several nodes: the cluster's scheduler picks a node for each invocation, the node's core
//! admits it on one of that node's GPUs.
//!
//! The GPUs are split into `nodes` equal groups in order (node 0 has the first `gpus / nodes`,
//! and so on; `--gpu-models` makes them differ). Every node publishes its summary through
//! `scheduler_core::placement::cluster::PublishGate` at each sample, as `mqfq-publish` does
//! (each write counted: API writes per node per minute), and the `extender` mode picks the
//! node the extender's ranking (`scheduler_core::placement::cluster::rank`) scores highest
//! from what was last *published* — stale by up to the gate's interval, as in a cluster —
//! ties broken at random as kube-scheduler does. `round-robin` and `random` ignore the
//! summaries. Each invocation is its own placement (a pod per request, as OpenWhisk's
//! Kubernetes factory or a cold-starting Knative revision would make it); kube-scheduler's own
//! scores, which also see pods it just bound, are not modelled.

use scheduler_core::Time;
use scheduler_core::config::ConfigError;
use scheduler_core::node::admission::Core;
use scheduler_core::placement::Placement;
use scheduler_core::placement::cluster::{
    GpuSummary, NodeState, NodeSummary, PublishConfig, PublishGate, class_label, rank,
};
use scheduler_core::placement::models::{builtin, lookup};

use crate::rng::SplitMix64;

pub use crate::types::{CLUSTER_MODES, ClusterMode};

/// A summary older than this is ignored by the extender (three default heartbeats).
const STALE_S: f64 = 180.0;

/// The cluster around a node core holding every node's GPUs.
#[derive(Debug)]
pub struct Cluster {
    mode: ClusterMode,
    per: usize,
    gates: Vec<PublishGate>,
    published: Vec<Option<(NodeSummary, Time)>>,
    writes: Vec<u64>,
    turn: usize,
    rng: SplitMix64,
}

impl Cluster {
    /// `nodes` nodes over `gpus` GPUs, picked by `mode`.
    ///
    /// # Errors
    /// `gpus` does not split into `nodes` equal groups.
    pub fn new(mode: ClusterMode, nodes: usize, gpus: usize) -> Result<Self, ConfigError> {
        if nodes == 0 || !gpus.is_multiple_of(nodes) {
            return Err(ConfigError::new(
                "nodes",
                nodes,
                "must divide the number of GPUs",
            ));
        }
        let gate = PublishGate::new(PublishConfig::default())?;
        Ok(Cluster {
            mode,
            per: gpus / nodes,
            gates: vec![gate; nodes],
            published: vec![None; nodes],
            writes: vec![0; nodes],
            turn: 0,
            rng: SplitMix64::new(0x5eed_c1a5),
        })
    }

    /// Writes of each node's object so far.
    #[must_use]
    pub fn writes(&self) -> &[u64] {
        &self.writes
    }

    /// Node `node`'s GPUs, as admission requests name them.
    #[must_use]
    pub fn gpus_of(&self, node: usize) -> Vec<String> {
        (node * self.per..(node + 1) * self.per)
            .map(|g| g.to_string())
            .collect()
    }

    /// One sample period: each node writes its summary if its gate says so. The core's GPUs
    /// and flows are read once and split by node.
    pub fn publish(&mut self, core: &Core, placer: Option<&Placement>, now: Time) {
        let table = builtin();
        let gpus: Vec<GpuSummary> = core
            .gpus()
            .into_iter()
            .map(|g| {
                let model = lookup(&table, &g.info.name);
                GpuSummary {
                    index: g.info.index,
                    tflops: model.tflops,
                    mem_gbps: model.mem_gbps,
                    memory_total: g.info.memory_total,
                    memory_free: g.info.memory_total.saturating_sub(g.memory_used),
                    utilization: g
                        .reading
                        .sm_activity
                        .unwrap_or_else(|| f64::from(g.running) / f64::from(g.limit.max(1))),
                    health: "healthy".into(),
                    limit: g.limit,
                    running: g.running,
                    queued: u32::try_from(g.queued).unwrap_or(u32::MAX),
                    name: g.info.name,
                }
            })
            .collect();
        let flows: Vec<(u32, (String, String, u32))> = core
            .flows()
            .into_iter()
            .map(|(gpu, f)| {
                let class = placer
                    .and_then(|p| class_label(p.features().class(&f.key)))
                    .unwrap_or("probing")
                    .to_owned();
                (
                    gpu,
                    (f.key, class, u32::try_from(f.queued).unwrap_or(u32::MAX)),
                )
            })
            .collect();
        for node in 0..self.gates.len() {
            let range = node * self.per..(node + 1) * self.per;
            let inside = |gpu: u32| usize::try_from(gpu).is_ok_and(|g| range.contains(&g));
            let mine: Vec<GpuSummary> = gpus.iter().filter(|g| inside(g.index)).cloned().collect();
            let functions: Vec<(String, String, u32)> = flows
                .iter()
                .filter(|(gpu, _)| inside(*gpu))
                .map(|(_, f)| f.clone())
                .collect();
            let s = NodeSummary::new(mine, &functions);
            if self.gates[node].due(&s, now).is_some() {
                self.gates[node].written(&s, now);
                self.writes[node] += 1;
                self.published[node] = Some((s, now));
            }
        }
    }

    /// The node an invocation of `function` goes to.
    pub fn pick(&mut self, function: &str, now: Time) -> usize {
        let n = self.gates.len();
        match self.mode {
            ClusterMode::RoundRobin => {
                self.turn = (self.turn + 1) % n;
                self.turn
            }
            ClusterMode::Random => self.rng.below(n),
            ClusterMode::Extender => {
                let names: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
                let states: Vec<NodeState<'_>> = names
                    .iter()
                    .zip(&self.published)
                    .map(|(name, p)| NodeState {
                        name,
                        summary: p.as_ref().map(|(s, at)| (s, now.secs_since(*at))),
                    })
                    .collect();
                let ranked = rank(&states, Some(function), STALE_S);
                let best = ranked
                    .iter()
                    .filter(|r| r.failed.is_none())
                    .map(|r| r.score)
                    .max()
                    .unwrap_or(0);
                let top: Vec<usize> = ranked
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.failed.is_none() && r.score == best)
                    .map(|(i, _)| i)
                    .collect();
                if top.is_empty() {
                    self.rng.below(n)
                } else {
                    top[self.rng.below(top.len())]
                }
            }
        }
    }
}

/// `mqfq-sticky` on `cfg.nodes` nodes under every cluster mode: a Markdown table with each
/// one's mean, P99 and standard deviation of completion time, GPU busy, the nodes' API writes
/// per node per minute, and ratios to `extender`.
///
/// # Errors
/// A bad knob (among them nodes that do not divide the GPUs).
pub fn report(
    trace: &crate::Trace,
    cfg: &crate::SimConfig,
    short_ms: f64,
) -> Result<String, crate::SimError> {
    use std::fmt::Write as _;
    let runs = crate::hetero::sticky_runs(
        trace,
        CLUSTER_MODES.map(|m| crate::SimConfig {
            cluster: m,
            ..cfg.clone()
        }),
        short_ms,
    )?;
    let rows: Vec<_> = runs
        .into_iter()
        .zip(CLUSTER_MODES)
        .map(|(r, m)| {
            #[expect(clippy::cast_precision_loss, reason = "write counts")]
            let writes = r.out.api_writes.iter().sum::<u64>() as f64
                / cfg.nodes.max(1) as f64
                / (r.out.makespan_ms / 60_000.0).max(1e-9);
            (m, r, writes)
        })
        .collect();
    let models = if cfg.gpu_models.is_empty() {
        format!("{} × reference", cfg.gpus)
    } else {
        cfg.gpu_models.join(" + ")
    };
    let mut t = format!(
        "cluster: {} nodes of {} GPUs ({models}); {} invocations, {} functions\n\n\
         | node choice | mean s | p99 s | std s | short mean s | GPU busy | API writes / node / min | mean / extender | std / extender |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        cfg.nodes,
        cfg.gpus / cfg.nodes.max(1),
        trace.invocations.len(),
        trace.functions.len()
    );
    let (em, es) = rows
        .iter()
        .find(|r| r.0 == ClusterMode::Extender)
        .map_or((f64::NAN, f64::NAN), |r| (r.1.mean_s, r.1.std_s));
    for (m, r, writes) in &rows {
        let _ = writeln!(
            t,
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            m.as_str(),
            r.latency_cells(),
            writes,
            r.mean_s / em,
            r.std_s / es
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_nodes_must_divide_the_gpus() {
        for m in CLUSTER_MODES {
            assert_eq!(m.as_str().parse::<ClusterMode>().unwrap(), m);
        }
        assert_eq!("best".parse::<ClusterMode>().unwrap_err().knob, "cluster");
        let cfg = crate::SimConfig {
            gpus: 3,
            nodes: 2,
            ..crate::SimConfig::default()
        };
        assert_eq!(cfg.validate().unwrap_err().knob, "nodes");
        assert_eq!(
            Cluster::new(ClusterMode::Extender, 0, 2).unwrap_err().knob,
            "nodes"
        );
    }

    /// An A30 node and an H100 node, half the functions memory-bound: the extender's node
    /// choice (from what the nodes published, stale by up to the publish interval) beats blind
    /// choices on mean and spread, and no node writes more than the gate allows.
    #[test]
    fn the_extender_beats_round_robin_across_heterogeneous_nodes() {
        let (t, node) = crate::hetero::a30_and_h100(600.0);
        let cfg = crate::SimConfig { nodes: 2, ..node };
        let run = |m: ClusterMode| {
            let c = crate::SimConfig {
                cluster: m,
                ..cfg.clone()
            };
            let out = crate::run_policy("mqfq-sticky", &t, &c).unwrap();
            assert_eq!(out.audit.double_completions, 0);
            assert_eq!(out.api_writes.len(), 2);
            let minutes = out.makespan_ms / 60_000.0;
            for &w in &out.api_writes {
                #[expect(clippy::cast_precision_loss, reason = "write counts")]
                let per_min = w as f64 / minutes;
                assert!(per_min <= 6.5, "{per_min} writes a minute");
                assert!(w > 0);
            }
            crate::hetero::spread(&t, &out)
        };
        let (em, es) = run(ClusterMode::Extender);
        let (rm, rs) = run(ClusterMode::RoundRobin);
        assert!(em * 1.5 < rm, "extender {em} s against round-robin {rm} s");
        assert!(
            es * 2.0 < rs,
            "std: extender {es} s against round-robin {rs} s"
        );
    }
}
