//! Charging bursts while they run: a burst that never ends (a server that keeps the GPU busy)
//! holds its slot — slots are not preempted — but its flow is charged for the time it holds,
//! step by step, so its other work yields to other flows as it would after a completion.

use crate::Time;

use super::{Core, Kind, Record};

/// How much more service than already charged a running burst has before it is charged again
/// (bounds the dispatch record to one line per second of such a burst).
const STEP_S: f64 = 1.0;

impl Core {
    /// Charges every burst lease that has held its slot `STEP_S` longer than it was charged.
    pub fn charge_running(&mut self, now: Time) {
        let due: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.kind == Kind::Burst)
            .filter(|(_, l)| held_s(l.since, now) >= l.charged + STEP_S)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(l) = self.leases.get(&id) else {
                continue;
            };
            let served = held_s(l.since, now);
            let (ticket, gpu, key, function) = (l.ticket, l.gpu, l.key.clone(), l.function.clone());
            let slot = self.slot(gpu);
            // The ticket is outstanding while its lease is held.
            if !matches!(
                self.gpus[slot].queue.charge_running(&ticket, served),
                Ok(true)
            ) {
                continue;
            }
            if let Some(l) = self.leases.get_mut(&id) {
                l.charged = served;
            }
            let seq = self.next_seq();
            self.log.push(Record::Charge {
                seq,
                t_ns: now.as_nanos(),
                gpu,
                key,
                function,
                lease: id,
                served_s: served,
            });
        }
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "nanoseconds held: exact for 104 days, then rounded to under a µs"
)]
fn held_s(since: Time, now: Time) -> f64 {
    now.as_nanos().saturating_sub(since.as_nanos()) as f64 / 1e9
}

impl Core {
    /// What releasing `lease` now with `measured` and `reason` would teach as one run's GPU
    /// time: the measurement capped at the time the lease was held, and only for a run that
    /// ended as runs do. `None` for an unknown lease. What placement learns features from.
    #[must_use]
    pub fn run_measured(
        &self,
        lease: u64,
        measured: Option<f64>,
        reason: &str,
        now: Time,
    ) -> Option<f64> {
        let l = self.leases.get(&lease)?;
        let held_s = now.secs_since(l.since).max(0.0);
        measured
            .map(|m| m.min(held_s))
            .filter(|_| ended_as_runs_do(reason))
    }
}

/// Only a run that ended as runs do says how long it took (not a kill, a delete, a start that
/// failed, a shim that went away).
pub(super) fn ended_as_runs_do(reason: &str) -> bool {
    matches!(reason, "exit" | "pause" | "idle")
}
