//! The event loop's steps: arrivals handed to the policy, the executor's own dispatch onto slots,
//! the work-conservation audit, and the run's output.

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

impl<M: Model> Engine<'_, M> {
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

    /// Dispatches while a slot is free and work waits (the executor picks the GPU): how every
    /// model but the node's dispatches.
    pub(super) fn dispatch_own(&mut self, policy: &mut dyn Policy) {
        while policy.queued() > 0 {
            let Some(free) = (0..self.gpus.len())
                .filter(|&g| M::slots_free(self, g))
                .map(|g| M::limit(self, g).saturating_sub(self.gpus[g].slots))
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
            let g = self.choose_gpu(f).expect("a GPU with a free slot exists");
            if self.gpus[g].slots >= M::limit(self, g) {
                self.audit.over_limit_dispatches += 1;
            }
            M::dispatched(self, g);
            self.start_run(g, batch, policy);
        }
    }

    /// Work conservation, checked after every step: no GPU may hold a slot free that waiting
    /// work may take — one under the limit any work may take, or the short-slot reserve's with
    /// a short flow waiting within the over-run threshold — where the waiting work's memory
    /// fits (under the node's core, a slot that only memory keeps free is not idle: its
    /// [`Limits::memory_bound`]). A run waiting for memory holds its slot. Counted for every
    /// model: the published gate (`mqfq-paper`) idles slots by design, and the audit shows how
    /// often.
    ///
    /// [`Limits::memory_bound`]: scheduler_core::node::admission::Limits::memory_bound
    pub(super) fn check_work_conserving(&mut self, policy: &dyn Policy) {
        if M::idle_slot(self, policy) {
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
        M::acquire(self, slot, !others_active, policy);
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
