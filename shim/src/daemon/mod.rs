//! `mqfqd`, the node daemon: the node's MQFQ-Sticky admission queue behind a ttrpc socket.
//!
//! - [`core`]: the decisions (queues, limits, leases, the dispatch record), without I/O.
//! - [`monitor`]: GPU monitoring behind a trait (NVML, simulated).
//! - [`config`]: `mqfqd.toml`.
//! - [`server`]: the ttrpc service, shim liveness, the sampling loop, the dispatch log.
//! - [`metrics`]: Prometheus metrics and their HTTP endpoint.

pub mod core;
