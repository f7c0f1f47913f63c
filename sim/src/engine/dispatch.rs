//! The event loop's steps: arrivals handed to the policy, its signals, dispatch onto slots (the
//! work-conservation audit with it), and the run's output.

use super::*;

/// Where the event loop stands between iterations.
#[derive(Debug)]
pub(super) struct Clock {
    pub(super) first: f64,
    pub(super) next_arrival: usize,
    pub(super) next_sample: f64,
    pub(super) samples: u64,
    pub(super) paper_every: u64,
}

impl Engine<'_> {
    /// Hands the policy every invocation that has arrived by now.
    pub(super) fn arrivals(&mut self, clock: &mut Clock, policy: &mut dyn Policy) {
        let trace = self.trace;
        while let Some(inv) = trace.invocations.get(clock.next_arrival) {
            if inv.arrival_ms > self.now + EPS {
                break;
            }
            let view = PoolView {
                best: &self.best,
                startup_ms: &self.startup,
            };
            policy.arrive(clock.next_arrival, trace, ms(self.now), &view);
            clock.next_arrival += 1;
        }
    }

    /// Acts on the policy's flow signals: prefetch on activation; the eager style evicts a
    /// deactivated flow's idle containers. Under the node's pool, carries out its orders (a flow
    /// that turned Active prefetches there).
    pub(super) fn signals(&mut self, policy: &mut dyn Policy, mem: MemoryStyle) {
        if self.admission == Admission::Node {
            self.pool_orders(policy);
        }
        for s in policy.tick(ms(self.now)) {
            match (s, mem) {
                (Signal::Activated(f), MemoryStyle::EagerPrefetch) => {
                    self.prefetch(f, policy);
                }
                (Signal::Deactivated(f), MemoryStyle::EagerPrefetch) => {
                    let idle: Vec<usize> = self.by_func[f]
                        .iter()
                        .copied()
                        .filter(|&c| {
                            !self.containers[c].busy && self.containers[c].tier == Tier::Hot
                        })
                        .collect();
                    for c in idle {
                        self.evict(c, policy);
                    }
                }
                _ => {}
            }
        }
    }

    /// Dispatches while a slot is free and work waits (the executor picks the GPU).
    pub(super) fn dispatch(&mut self, policy: &mut dyn Policy) {
        let admission = self.admission;
        while policy.queued() > 0 {
            let Some(free) = (0..self.gpus.len())
                .filter(|&g| self.slots_free(g, admission))
                .map(|g| self.limit(g, admission).saturating_sub(self.gpus[g].slots))
                .max()
            else {
                break;
            };
            let view = PoolView {
                best: &self.best,
                startup_ms: &self.startup,
            };
            let Some(batch) = policy.next(self.trace, ms(self.now), &view, free) else {
                break;
            };
            let Some(&head) = batch.first() else { break };
            let f = self.trace.invocations[head].func;
            let g = self
                .choose_gpu(f, admission)
                .expect("a GPU with a free slot exists");
            if self.gpus[g].slots >= self.limit(g, admission) {
                self.audit.over_limit_dispatches += 1;
            }
            if let Admission::Gated { .. } = admission {
                let gpu = &mut self.gpus[g];
                gpu.gate_est = if gpu.slots == 0 {
                    gpu.gate_est + 0.5
                } else {
                    gpu.gate_est + gpu.gate_est / f64::from(gpu.slots)
                };
            }
            self.start_run(g, batch, policy);
        }
    }

    /// Runs what the node's core granted, on the GPU it chose.
    pub(super) fn dispatch_granted(&mut self, policy: &mut dyn Policy) {
        while let Some((inv, g)) = policy.granted() {
            if g >= self.gpus.len() {
                self.audit.over_limit_dispatches += 1;
                continue;
            }
            self.start_run(g, vec![inv], policy);
        }
        for g in 0..self.gpus.len() {
            self.node_limits[g] = policy.node_limits(g);
        }
    }

    /// Work conservation, checked after every step: no GPU may hold a slot free that waiting
    /// work may take — one under the limit any work may take, or the short-slot reserve's with
    /// a short flow waiting within the over-run threshold — where the waiting work's memory
    /// fits (under the node's core, a slot that only memory keeps free is not idle: its
    /// [`Limits::memory_bound`]). A run waiting for memory holds its slot. Counted for every admission kind: the
    /// published gate (`mqfq-paper`) idles slots by design, and the audit shows how often.
    pub(super) fn check_work_conserving(&mut self, policy: &dyn Policy) {
        let idle = match self.admission {
            Admission::Node => self.node_limits.iter().zip(&self.gpus).any(|(l, g)| {
                (l.queued > 0 && !l.memory_bound && g.slots < l.any)
                    || (l.reserve_waiting && g.slots < l.slots)
            }),
            Admission::Dynamic | Admission::Gated { .. } | Admission::Unlimited => {
                policy.queued() > 0
                    && (0..self.gpus.len())
                        .any(|g| self.gpus[g].slots < self.limit(g, self.admission))
            }
        };
        if idle {
            self.audit.idle_with_backlog += 1;
        }
    }

    /// Takes a slot on GPU `g` for `batch` (run back to back on one container).
    pub(super) fn start_run(&mut self, g: usize, batch: Vec<usize>, policy: &mut dyn Policy) {
        let Some(&head) = batch.first() else { return };
        let gpu = &mut self.gpus[g];
        gpu.slots += 1;
        self.audit.max_slots_held = self.audit.max_slots_held.max(gpu.slots);
        let mut rest: VecDeque<usize> = batch.into_iter().collect();
        rest.pop_front();
        let run = Run {
            gpu: g,
            func: self.trace.invocations[head].func,
            container: None,
            rest,
            current: head,
            phase: Phase::WaitMem,
        };
        let slot = match self.runs.iter().position(Option::is_none) {
            Some(i) => {
                self.runs[i] = Some(run);
                i
            }
            None => {
                self.runs.push(Some(run));
                self.runs.len() - 1
            }
        };
        let others_active = self.runs.iter().enumerate().any(|(i, r)| {
            i != slot
                && r.as_ref()
                    .is_some_and(|r| r.gpu == g && !matches!(r.phase, Phase::WaitMem))
        });
        self.acquire(slot, !others_active, policy);
    }

    /// The records, and what the run measured.
    #[expect(clippy::cast_precision_loss, reason = "a GPU count")]
    pub(super) fn output(mut self, policy: &dyn Policy, first: f64) -> SimOutput {
        let mut last_end = first;
        let mut records = Vec::with_capacity(self.records.len());
        for (i, r) in self.records.iter().enumerate() {
            match r {
                Some(r) => {
                    last_end = last_end.max(r.end_ms);
                    records.push(*r);
                }
                None => {
                    self.audit.unfinished += 1;
                    records.push(Record {
                        start_ms: f64::NAN,
                        end_ms: f64::NAN,
                        tier: self.pending_start[i].1,
                        gpu: None,
                    });
                }
            }
        }
        let span = (self.now - first).max(1e-9) * self.cfg.gpus as f64;
        SimOutput {
            policy: policy.name().to_owned(),
            records,
            busy_ms: self.gpus.iter().map(|g| g.busy_ms).sum(),
            busy_time_ms: self.gpus.iter().map(|g| g.any_ms).sum(),
            makespan_ms: last_end - first,
            gpus: self.cfg.gpus,
            audit: self.audit,
            pcie_mb: self.pcie_mb,
            warm: self.warm,
            mean_d: self.d_integral / span,
            mean_slots: self.slot_integral / span,
            limits: self.limits,
            api_writes: policy.api_writes(),
        }
    }
}
