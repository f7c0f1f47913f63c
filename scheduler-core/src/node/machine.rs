//! The node: the admission core and the pool in one value, joined here and nowhere else.
//!
//! The core decides who runs (queues, D, leases, memory admission); the pool decides whose memory
//! stays on the GPU. Each needs what the other learns: a grant is a pool hit, a flow turning
//! Active prefetches its Warm containers, and what the pool measured of each function's memory
//! (resident or not, restore cost, footprint) moves the core's order and memory admission. `mqfqd`
//! and the simulator both drive a [`Node`] with [`Input`]s and carry out its [`Output`]; so the
//! same inputs give the same grants and pool orders in both, line for line (the daemon's
//! `same_policy` test replays the simulator's inputs to check it).

use crate::Time;
use crate::native::Native;
use crate::node::ContainerKey;
use crate::node::admission::{AdmitInfo, Core, CoreError, GpuReading, Grant, Record};
use crate::node::pool::{Order, Outcome, Pool, PoolEvent};

/// One thing that happened on the node, as data.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A container asks to run (start, resume or burst).
    Admit(AdmitInfo),
    /// A lease ends after `measured_s` of service (`None`: not measured); with `pooled`, what
    /// became of its pooled container.
    Release {
        /// The lease.
        lease: u64,
        /// Service received, seconds.
        measured_s: Option<f64>,
        /// Why (`idle`, `pause`, `exit`, …: the dispatch record's words).
        reason: String,
        /// The lease's pooled container, idle or gone, when it ran in one.
        pooled: Option<PooledEnd>,
    },
    /// A sampling step: each GPU's reading (D moves, sticky TTLs expire; the pool sees the
    /// memory in use).
    Sample(Vec<GpuReading>),
    /// The pool's timers and pressure, over the memory it last saw, with the host's
    /// (available, total) bytes when known.
    Tick {
        /// Host memory.
        host: Option<(u64, u64)>,
    },
    /// A GPU's memory in use as it is now, between samples (bytes).
    Memory {
        /// NVML index.
        gpu: u32,
        /// In use.
        used: u64,
        /// Capacity.
        total: u64,
    },
    /// Lease `lease`'s burst runs in a pooled container: `container`, or the lease's own key.
    Hit {
        /// The lease.
        lease: u64,
        /// The container, when not the lease's key (the simulator picks it after admission).
        container: Option<ContainerKey>,
    },
    /// A shim's result for one pool action (or its own restore at Resume).
    Report(Outcome),
}

/// A pooled container as its lease ended. One input with the release: the pool hears that the
/// container is idle (or gone) before the core dispatches on the slot and memory it freed, so
/// the memory the GPU keeps for that function is weighed as any resident function's (told
/// after, a second lease of another function took that room and the pool evicted the container
/// its next call wanted).
#[derive(Clone, Debug, PartialEq)]
pub struct PooledEnd {
    /// The container.
    pub key: ContainerKey,
    /// It lives on, idle (paused, or between bursts); otherwise it is gone.
    pub paused: bool,
    /// Its converted (movable) bytes.
    pub bytes: u64,
    /// Its native allocations, when its shim reported them.
    pub native: Option<Native>,
    /// What its processes held on the GPU as the driver measured them, context included
    /// (`mqfqd` with NVML, for releases that name their processes).
    pub resident: Option<u64>,
}

/// What the node decided in answer to one input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// Leases granted, in grant order.
    pub grants: Vec<Grant>,
    /// Pool orders for the shims, in order.
    pub orders: Vec<Order>,
    /// Pool events for the metrics.
    pub events: Vec<PoolEvent>,
}

impl Output {
    /// Appends `other`'s decisions after these.
    pub fn merge(&mut self, other: Output) {
        self.grants.extend(other.grants);
        self.orders.extend(other.orders);
        self.events.extend(other.events);
    }
}

impl From<Vec<Grant>> for Output {
    fn from(grants: Vec<Grant>) -> Self {
        Output {
            grants,
            ..Output::default()
        }
    }
}

/// The admission core and the pool of one node.
#[derive(Debug)]
pub struct Node {
    core: Core,
    pool: Pool,
}

impl Node {
    /// The node over a configured core and pool.
    #[must_use]
    pub fn new(core: Core, pool: Pool) -> Self {
        Node { core, pool }
    }

    /// The admission core (views: leases, GPUs, flows).
    #[must_use]
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The pool (views: entries, presence, memory).
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The core, for what touches it alone (re-registration, cancel, a dead shim, forgetting
    /// idle flows); follow with [`Node::settle`].
    pub fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    /// The pool, for what touches it alone (adopting an idle container, forgetting one, a failed
    /// GPU); follow with [`Node::settle`].
    pub fn pool_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }

    /// The dispatch records written since the last call.
    pub fn drain_log(&mut self) -> Vec<Record> {
        self.core.drain_log()
    }

    /// Takes one input at `now`, then settles (see [`Node::settle`]). A release's pooled
    /// container reaches the pool, and what that changes the core, before the core releases.
    ///
    /// # Errors
    /// What the core refuses (a bad admission, an unknown lease); nothing changed then.
    pub fn step(&mut self, input: &Input, now: Time) -> Result<Output, CoreError> {
        let mut out = Output::default();
        let grants = match input {
            Input::Admit(info) => self.core.admit(info, now)?,
            Input::Release {
                lease,
                measured_s,
                reason,
                pooled,
            } => {
                if let Some(p) = pooled {
                    // A lease the core never granted changes nothing, in the pool either.
                    self.core
                        .lease(*lease)
                        .ok_or(CoreError::UnknownLease(*lease))?;
                    self.pool_released(p, now);
                    out = self.settle(now);
                }
                self.core.release(*lease, *measured_s, reason, now)?
            }
            Input::Sample(readings) => {
                let grants = self.core.sample(readings, now);
                for g in self.core.gpus() {
                    if readings.iter().any(|r| r.index == g.info.index) {
                        self.pool
                            .observe_memory(g.info.index, g.memory_used, g.info.memory_total);
                    }
                }
                grants
            }
            Input::Tick { host } => {
                self.pool.tick(now, *host);
                Vec::new()
            }
            Input::Memory { gpu, used, total } => {
                self.pool.observe_memory(*gpu, *used, *total);
                Vec::new()
            }
            Input::Hit { lease, container } => {
                let l = self
                    .core
                    .lease(*lease)
                    .ok_or(CoreError::UnknownLease(*lease))?;
                let key = container.as_ref().unwrap_or(&l.key);
                self.pool.granted(key, &l.function, l.gpu, l.shim_pid, now);
                Vec::new()
            }
            Input::Report(o) => {
                self.pool.report(o, now);
                Vec::new()
            }
        };
        out.grants.extend(grants);
        out.merge(self.settle(now));
        Ok(out)
    }

    /// The pool hears what became of a lease's container.
    fn pool_released(&mut self, p: &PooledEnd, now: Time) {
        self.pool.released(&p.key, p.paused, p.bytes, now);
        if let Some(n) = p.native {
            self.pool.report_native(&p.key, n);
        }
        if let (true, Some(b)) = (p.paused, p.resident) {
            self.pool.measured_resident(&p.key, b);
        }
    }

    /// Joins the two halves after any change: flows that turned Active prefetch their Warm
    /// containers; the pool's orders and events are taken; what the pool knows of each
    /// function's memory goes to the core (residency and restore cost for MQFQ-Sticky's order,
    /// every time: a flow a GPU's queue first sees later must learn it too; footprints for
    /// memory admission, when they differ from the core's), and what a changed footprint or
    /// memory no longer resident lets the core grant is returned with them.
    pub fn settle(&mut self, now: Time) -> Output {
        let mut out = Output::default();
        // Until nothing more comes of it: what a footprint lets in may turn a flow Active.
        loop {
            for (gpu, function) in self.core.drain_activated() {
                self.pool.activated(gpu, &function, now);
            }
            out.orders.extend(self.pool.take_orders());
            out.events.extend(self.pool.drain_events());
            let before = out.grants.len();
            // Everything the pool knows reaches the core before it dispatches on what memory
            // stopped being resident.
            let mut freed = false;
            for (function, by_gpu) in self.pool.residency() {
                // The pool's costs are measured durations: finite and >= 0, which is all the
                // core checks.
                freed |= self
                    .core
                    .set_residency_by_gpu(&function, &by_gpu)
                    .unwrap_or(false);
            }
            for (function, bytes) in self.pool.footprints() {
                if self.core.footprints().get(&function) != Some(&bytes) {
                    out.grants
                        .extend(self.core.set_footprint(&function, bytes, now));
                }
            }
            if freed {
                out.grants.extend(self.core.tick_all(now));
            }
            if out.grants.len() == before {
                return out;
            }
        }
    }

    /// Forgets flows idle for `idle_s` in the core and their memory in the pool; returns them,
    /// with what the sticky TTLs this expired let the core grant (room kept for a flow that went
    /// Inactive ends here, not at the next input).
    pub fn forget_idle(&mut self, now: Time, idle_s: f64) -> (Vec<String>, Output) {
        let gone = self.core.forget_idle(now, idle_s);
        self.pool.forget_functions(&gone);
        let mut out = Output::from(self.core.tick_all(now));
        out.merge(self.settle(now));
        (gone, out)
    }
}

#[cfg(test)]
mod tests;
