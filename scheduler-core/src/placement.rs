//! Placement by need: which GPU of a node a container should get.
//!
//! The first design admits work on whichever GPU a container was given; on a heterogeneous node
//! (an A30 next to an H100, MIG slices of different sizes) that wastes the better GPU on work
//! that cannot use it and queues work that could. This module holds the node's placement
//! decisions, pure like the rest of the crate:
//!
//! - [`features`]: each function's needs, measured from its bursts (EWMA means and variances of
//!   burst time, SM and memory-bandwidth utilization, footprint, host↔device bytes) and its class
//!   (compute- or memory-bound, short or long, steady or fluctuating) once probed.
//! - [`models`]: what each GPU model offers (FLOPS, bandwidth, host link), by NVML name.
//! - [`fitness`]: the choice — the design's two fitness formulas combined with locality, queue,
//!   balance, energy and affinity under peak / off-peak weights.
//! - [`health`]: failed and overloaded GPUs, avoided for new containers until they recover.
//! - [`cluster`]: what a node publishes for the cluster's scheduler, when, and how the
//!   scheduler extender ranks nodes from it.
//!
//! The daemon gathers the inputs (NVML, the pool's residency, the queue) and applies the choice;
//! the simulator replays it on a heterogeneous node.

pub mod cluster;
pub mod features;
pub mod fitness;
pub mod health;
pub mod models;
pub mod node;
pub mod processes;

pub use features::{
    Bound, Class, FeatureConfig, Features, FunctionFeatures, Length, Sample, Stability,
};
pub use fitness::{Choice, GpuView, Health, Need, PlacementError, WeightSchedule, Weights, choose};
pub use health::{HealthConfig, HealthSample, HealthTracker};
pub use models::GpuModel;
pub use node::{Near, Placement, PlacementConfig};
pub use processes::{ProcessSamples, ProcessUse};

#[cfg(test)]
mod node_tests;
#[cfg(test)]
mod start_tests;
#[cfg(test)]
mod tests;
