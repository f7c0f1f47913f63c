//! `mqfq-sim`, the trace-driven simulator: how we show, without a GPU, that MQFQ-Sticky beats
//! the alternatives — and where it does not.
//!
//! [`trace`] parses the CSV format, [`workload`] makes synthetic and Azure-derived traces, [`policy`]
//! holds the policies, [`engine`] the simulated node they all run on, and [`report`] the numbers;
//! [`controllers`] replays the concurrency laws over a table measured on a GPU; [`hetero`] gives
//! GPUs models and places invocations on a heterogeneous node; [`cluster`] splits the GPUs into
//! nodes and places each invocation on a node as the cluster's scheduler would.
//! The model is documented in `docs/SIMULATOR.md` and in [`engine`]; [`cli`] and [`plot`] are the
//! command line around it. The decisions themselves are `scheduler_core`'s: this crate adds the
//! workloads, the simulated node and the baselines to compare against.

pub mod build;
pub mod cli;
pub mod cluster;
pub mod controllers;
pub mod engine;
pub mod fairness;
pub mod hetero;
pub mod node;
pub mod plot;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sweep;
pub mod trace;
pub mod types;
pub mod workload;

pub use build::build;
pub use engine::simulate;
pub use policy::{POLICIES, Policy};
pub use report::{Summary, summarize};
pub use trace::{Trace, TraceError};
pub use types::{
    Audit, Baselines, Corun, NoneMemory, Record, SimConfig, SimError, SimOutput, WarmStats,
};

/// Runs the named policy over a trace with the given knobs.
///
/// # Errors
/// An unknown policy or bad knob ([`SimError::Config`]).
pub fn run_policy(name: &str, trace: &Trace, cfg: &SimConfig) -> Result<SimOutput, SimError> {
    let mut p = build(name, trace, cfg)?;
    simulate(trace, p.as_mut(), cfg)
}
