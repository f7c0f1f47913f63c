//! Pure scheduling logic of mqfq-shim.
//!
//! Everything that decides — which GPU invocation runs next, how many run at once, which
//! container's memory stays on the GPU — lives here, free of tokio, I/O and NVML, with time passed
//! in as data. The daemon (`mqfqd`) and the simulator (`mqfq-sim`) run the very same code, which is
//! what makes the simulator's comparisons mean something for the node.
//!
//! - [`queue`]: the MQFQ-Sticky queue (flows, virtual time, T, sticky TTL, charge correction).
//! - [`concurrency`]: the dynamic concurrency limit D per GPU.
//! - [`tiers`]: Hot / Warm / Cold container tiers and the eviction and prefetch decisions.
//! - [`node`]: the node's policy built from them — per-GPU admission (limit in force, short-slot
//!   reserve, leases, adoption) and the pool's decisions (make room, victims, prefetch, tick).
//! - [`placement`]: which GPU a container gets — measured function features, GPU models,
//!   fitness under peak / off-peak weights, failed and overloaded GPUs.
//! - [`native`]: which functions keep their GPU allocations native (learned from refused exports).
//! - [`config`]: knobs, the design's profiles, validation.
//!
//! Trace formats, workload generators, the simulated executor, the baselines and reports are the
//! simulator's (`sim/`), not decisions the node makes.
#![deny(missing_docs)]

pub mod concurrency;
pub mod config;
pub mod ewma;
pub mod native;
pub mod node;
pub mod placement;
pub mod queue;
pub mod tenant_lru;
pub mod tiers;
pub mod time;
pub mod warm;

pub use config::{ConfigError, GpuMode, Profile, QueueConfig};
pub use queue::{Dispatched, FlowEvent, FlowId, FlowState, MqfqQueue, QueueError, Ticket};
pub use time::Time;
