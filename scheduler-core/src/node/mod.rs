//! The node's policy: what `mqfqd` decides for each GPU, written once and driven by both the
//! daemon (over real shims, sockets and NVML) and the simulator (over a simulated GPU and clock).
//!
//! - [`admission`] — per-GPU MQFQ-Sticky queues under the dynamic concurrency limit D, the
//!   short-slot reserve, leases, waiting admissions, re-registration and adoption after a daemon
//!   restart, and the dispatch record that replays it.
//! - [`pool`] — the tiered pool: which idle containers keep their memory on the GPU, which are
//!   evicted to the host, which are prefetched back before their next burst.
//! - [`machine`] — the [`Node`]: the two above in one value, driven by [`Input`]s, answering
//!   with grants and pool orders ([`Output`]); the only place they are joined.
//! - [`key`] — how a container is named ([`ContainerKey`]) and which function and tenant names
//!   are accepted ([`is_key`]).
//!
//! Everything here takes time as data and does no I/O; the callers carry out the orders.

pub mod admission;
pub mod key;
pub mod machine;
pub mod pool;

pub use key::{ContainerKey, KeyError, is_key};
pub use machine::{Input, Node, Output, PooledEnd};
