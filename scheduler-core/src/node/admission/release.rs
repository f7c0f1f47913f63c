//! Release and cancel: a lease ends (with the service it measured) or a waiting admission is
//! withdrawn; what that frees is dispatched.

use super::{Core, CoreError, Grant, Record, charge};
use crate::Time;
use crate::node::ContainerKey;

impl Core {
    /// Withdraws a waiting admission. Returns `None` when none was waiting, else the grants the
    /// withdrawal made (the virtual time may move on without it).
    pub fn cancel(&mut self, key: &ContainerKey, reason: &str, now: Time) -> Option<Vec<Grant>> {
        self.withdraw(key, reason, now).then(|| self.pump_all(now))
    }

    /// Takes a waiting admission out of its queue, dispatching nothing; whether one waited.
    /// Nothing changes, the clock included, when none did (so nothing is left to dispatch).
    pub(super) fn withdraw(&mut self, key: &ContainerKey, reason: &str, now: Time) -> bool {
        if !self.waiting.contains_key(key) {
            return false;
        }
        self.tick(now);
        let Some(w) = self.waiting_remove(key) else {
            return false;
        };
        let slot = self.slot(w.gpu);
        self.gpus[slot].queue.withdraw(w.flow, |k| k == key);
        self.expire_withdrawn(slot, now);
        let seq = self.next_seq();
        self.log.push(Record::Withdraw {
            seq,
            t_ns: now.as_nanos(),
            gpu: w.gpu,
            key: key.clone(),
            function: w.function,
            reason: reason.to_owned(),
        });
        true
    }

    /// A flow left with nothing queued or running by a withdrawal lingers from its last service,
    /// which may be past already: it goes Inactive now, not at the next call, so the memory room
    /// kept for it is free to the dispatch that follows.
    pub(super) fn expire_withdrawn(&mut self, slot: usize, now: Time) {
        self.gpus[slot].queue.tick(now);
        self.collect_events(slot);
    }

    /// Ends a lease; `measured` is the service it received (seconds) when known. Returns the
    /// grants the freed slot made.
    ///
    /// # Errors
    /// [`CoreError::UnknownLease`]; nothing changes then.
    pub fn release(
        &mut self,
        lease: u64,
        measured: Option<f64>,
        reason: &str,
        now: Time,
    ) -> Result<Vec<Grant>, CoreError> {
        // An unknown lease changes nothing, the clock included.
        let l = self
            .leases
            .remove(&lease)
            .ok_or(CoreError::UnknownLease(lease))?;
        self.tick(now);
        self.lease_of.remove(&l.key);
        let slot = self.slot(l.gpu);
        let g = &mut self.gpus[slot];
        // What a shim reports comes from its container (a burst's end is the interposer's word):
        // no run took longer than its lease was held.
        let held_s = now.secs_since(l.since).max(0.0);
        let measured = measured.map(|m| m.min(held_s));
        // The ticket is outstanding by construction; a failure here would be a bug in this file.
        let _ = g.queue.complete(&l.ticket, measured, now);
        let ran = charge::ended_as_runs_do(reason);
        let tenant = l.tenant.as_deref().unwrap_or_default();
        g.conc
            .released(lease, &l.function, tenant, measured.filter(|_| ran));
        g.running = g.running.saturating_sub(1);
        if l.overtime {
            g.overtime = g.overtime.saturating_sub(1);
        }
        if l.long {
            g.long_running = g.long_running.saturating_sub(1);
        }
        let seq = self.next_seq();
        self.log.push(Record::Release {
            seq,
            t_ns: now.as_nanos(),
            gpu: l.gpu,
            key: l.key,
            function: l.function,
            lease,
            measured_s: measured,
            reason: reason.to_owned(),
        });
        Ok(self.pump_all(now))
    }
}
