//! Policies by name, for the CLI and the tests: the baselines (`policy.rs`) and ours, the node's
//! own core and pool (`node.rs`). Apart from both so that neither names the other.

use scheduler_core::config::ConfigError;

use crate::node;
use crate::policy::{Fcfs, Mqfq, NoAdmission, OldestBatch, Paella, Policy, Sjf};
use crate::trace::Trace;
use crate::types::SimConfig;

/// Builds a policy by name.
///
/// # Errors
/// [`ConfigError`] for an unknown name (knob `policy`) or a bad override.
pub fn build(name: &str, trace: &Trace, cfg: &SimConfig) -> Result<Box<dyn Policy>, ConfigError> {
    let n = trace.functions.len();
    Ok(match name {
        "fcfs" => Box::new(Fcfs::default()),
        "none" => Box::new(NoAdmission::default()),
        "batch" => Box::new(OldestBatch::new(n)),
        "sjf" => Box::new(Sjf::new(n)),
        "paella" => Box::new(Paella::new(n)),
        "mqfq-paper" => Box::new(Mqfq::paper(trace)?),
        "mqfq-sticky" => {
            let mut q = cfg.profile.queue();
            let mut c = cfg.profile.concurrency(cfg.mode);
            cfg.overrides.apply(&mut q, &mut c, cfg.mode)?;
            let mut gpus = node::gpu_infos(cfg.gpus, |g| cfg.mem_mb(g), cfg.mode);
            for (g, name) in gpus.iter_mut().zip(&cfg.gpu_models) {
                g.name.clone_from(name);
            }
            let pool = node::pool_config(cfg);
            let mut p = node::NodeMqfq::new(trace, gpus, &q, &c, pool, false)?;
            p.set_core_knobs(cfg)?;
            p.set_placement(cfg.placement, cfg.placement_weights, cfg.cold_ms / 1e3)?;
            if cfg.nodes > 1 {
                p.set_cluster(cfg.cluster, cfg.nodes)?;
            }
            Box::new(p)
        }
        other => {
            return Err(ConfigError {
                knob: "policy",
                value: other.to_owned(),
                reason: "expected one of fcfs, batch, sjf, paella, mqfq-paper, mqfq-sticky",
            });
        }
    })
}
