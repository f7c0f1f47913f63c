//! The dispatch record: one JSON line per queue decision, enough to replay them exactly.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::node::ContainerKey;

/// One line of the dispatch record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    /// An admission joined its flow's queue.
    Enqueue {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU queue.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Flow (the function, scoped by its tenant).
        function: String,
        /// Its tenant, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
        /// The tenant's weight.
        #[serde(default = "one")]
        tenant_weight: f64,
        /// Weight in force.
        weight: f64,
        /// Start or resume.
        kind: Kind,
    },
    /// The queue dispatched an admission.
    Dispatch {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
        /// The lease granted.
        lease: u64,
        /// Free slots passed to the queue.
        free: u32,
        /// Leases on this GPU after the dispatch.
        running: u32,
        /// The concurrency limit in force.
        limit: u32,
        /// D at the time.
        d: f64,
        /// Time queued, ns.
        waited_ns: u64,
        /// Served ahead of the fair order: the work dispatched since it arrived had passed its
        /// overtake bound (absent in logs from before the bound: false).
        #[serde(default)]
        overdue: bool,
    },
    /// A lease ended.
    Release {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
        /// The lease.
        lease: u64,
        /// Measured service, seconds.
        measured_s: Option<f64>,
        /// Why it ended.
        reason: String,
    },
    /// A running burst was charged for the service it has had so far (it keeps its slot).
    Charge {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
        /// The lease.
        lease: u64,
        /// Service so far, seconds.
        served_s: f64,
    },
    /// A burst lease passed the maximum hold: it keeps its slot, and its GPU's limits rise by
    /// one while it (or another lease there in overtime) is held (no queue change).
    Overtime {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
        /// The lease.
        lease: u64,
        /// How long it had been held, seconds.
        held_s: f64,
    },
    /// A waiting admission left the queue.
    Withdraw {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
        /// Why.
        reason: String,
    },
    /// A waiting admission moved to another of its GPUs' queues (late binding); it waits on.
    Move {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// The GPU it waited on.
        from: u32,
        /// The GPU it waits on now.
        to: u32,
        /// Container key.
        key: ContainerKey,
        /// Function.
        function: String,
    },
    /// A running container was adopted (re-registration, fail-open start).
    Adopt {
        /// Sequence number.
        seq: u64,
        /// Daemon time, ns.
        t_ns: u64,
        /// GPU.
        gpu: u32,
        /// Container key.
        key: ContainerKey,
        /// Flow.
        function: String,
        /// Its tenant, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
        /// The lease it now holds.
        lease: u64,
    },
}

fn one() -> f64 {
    1.0
}
