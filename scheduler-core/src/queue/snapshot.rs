//! Read-only views of the flows, for `mqfqctl status`, metrics and tests.

use serde::Serialize;

use super::{FlowId, FlowState, MqfqQueue};

/// A read-only view of a flow, for `mqfqctl status`, metrics and tests.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlowSnapshot {
    /// The flow's id.
    pub id: FlowId,
    /// Function key.
    pub key: String,
    /// Weight.
    pub weight: f64,
    /// Derived state.
    pub state: FlowState,
    /// Start tag of the head (meaningful while backlogged).
    pub start: f64,
    /// Finish tag of the last charged invocation.
    pub finish: f64,
    /// Invocations queued.
    pub queued: usize,
    /// Invocations running.
    pub in_flight: u32,
    /// Measured service received, seconds.
    pub gpu_time_s: f64,
    /// EWMA of measured service, if known.
    pub service_s: Option<f64>,
    /// EWMA of inter-arrival time, if known.
    pub iat_s: Option<f64>,
    /// Invocations dispatched.
    pub dispatched: u64,
    /// Invocations completed.
    pub completed: u64,
    /// Whether the flow's memory is resident on the GPU (as told by the pool manager).
    pub resident: bool,
    /// Its tenant, if any.
    pub tenant: Option<String>,
}

/// See [`MqfqQueue::work_ahead`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkAhead {
    /// Service, seconds, of the invocations running or queued whose flow has an estimate.
    pub known_s: f64,
    /// Invocations running or queued whose flow has none yet.
    pub unknown: usize,
    /// The asking function's own service estimate on this GPU.
    pub own_s: Option<f64>,
}

impl<T> MqfqQueue<T> {
    /// A snapshot of one flow.
    #[must_use]
    pub fn snapshot(&self, id: FlowId) -> Option<FlowSnapshot> {
        let f = self.flows.get(id.ix()).filter(|f| !f.vacant)?;
        Some(FlowSnapshot {
            id,
            key: f.key.clone(),
            weight: f.weight,
            state: self.state(id)?,
            start: f.start,
            finish: f.finish,
            queued: f.pending.len(),
            in_flight: f.in_flight,
            gpu_time_s: f.gpu_time,
            service_s: f.service.get(),
            iat_s: f.iat.get(),
            dispatched: f.dispatched,
            completed: f.completed,
            resident: f.resident,
            tenant: f.tenant.clone(),
        })
    }

    /// The work this queue's GPU holds or waits for, for placement: the measured service of its
    /// running and queued invocations (flows with a service estimate), how many invocations
    /// have none, and `key`'s own measured service here, if any. Seconds measured on this GPU.
    #[must_use]
    pub fn work_ahead(&self, key: &str) -> WorkAhead {
        let mut w = WorkAhead::default();
        for f in self.flows.iter().filter(|f| !f.vacant) {
            let n = f.pending.len().saturating_add(f.in_flight as usize);
            match f.service.get() {
                #[expect(clippy::cast_precision_loss, reason = "invocation counts")]
                Some(s) => w.known_s += s * n as f64,
                None => w.unknown = w.unknown.saturating_add(n),
            }
            if f.key == key {
                w.own_s = f.service.get();
            }
        }
        w
    }

    /// Snapshots of every flow, in creation order.
    #[must_use]
    pub fn snapshots(&self) -> Vec<FlowSnapshot> {
        (0..self.flows.len())
            .filter_map(|i| u32::try_from(i).ok())
            .filter_map(|i| self.snapshot(FlowId(i)))
            .collect()
    }
}
