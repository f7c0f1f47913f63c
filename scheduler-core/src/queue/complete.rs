//! Completion: a served invocation's measured service corrects its flow's tags (charge
//! correction), and a drained flow starts to linger; a burst still running is charged as it goes.

use super::{MqfqQueue, Phase, QueueError, Ticket};
use crate::Time;

impl<T> MqfqQueue<T> {
    /// Ends a dispatched invocation at `now`. `measured` is the GPU service it received, in
    /// seconds, when known: it feeds the function's EWMA and, with `charge_correction`, replaces
    /// the estimated charge in the flow's tags.
    ///
    /// # Errors
    /// [`QueueError::UnknownTicket`] if the ticket was already completed or is foreign; nothing
    /// changes then.
    pub fn complete(
        &mut self,
        ticket: &Ticket,
        measured: Option<f64>,
        now: Time,
    ) -> Result<(), QueueError> {
        let (id, charge, eff) = self
            .outstanding
            .remove(&ticket.id)
            .ok_or(QueueError::UnknownTicket(ticket.id))?;
        let measured = measured.filter(|m| m.is_finite() && *m >= 0.0);
        let was_short = self.counts_short(id);
        let correct = self.cfg.charge_correction;
        let backlogged = self.flows[id.ix()].phase == Phase::Backlogged;
        if let Some(m) = measured {
            self.tau.observe(m);
            if backlogged {
                self.index_remove(id);
            }
            let v = self.v;
            let f = &mut self.flows[id.ix()];
            f.service.observe(m);
            f.gpu_time += m;
            if correct {
                let delta = (m - charge) / eff;
                f.finish += delta;
                if backlogged {
                    f.start = (f.start + delta).max(v);
                    f.credit = (f.credit + delta).min(f.start);
                }
            }
            if backlogged {
                self.index_insert(id);
            }
        }
        let f = &mut self.flows[id.ix()];
        f.in_flight -= 1;
        f.completed += 1;
        f.last_service = Some(now);
        if f.in_flight == 0 && f.pending.is_empty() {
            let until = now.plus_secs(self.ttl_of(id));
            self.linger(id, until, Some(now));
        }
        self.update_v();
        self.recount(id, was_short);
        Ok(())
    }

    /// Charges an invocation that is still running for the service it has had so far, when
    /// that is more than it was charged: a burst that never ends (a server keeping the GPU
    /// busy) moves its flow's virtual time while it runs, not only at its completion, which
    /// then corrects from this charge (the total is the same as one correction at the end).
    /// Whether anything changed.
    ///
    /// # Errors
    /// `UnknownTicket` if it is not outstanding.
    pub fn charge_running(&mut self, ticket: &Ticket, served: f64) -> Result<bool, QueueError> {
        let &(id, charge, eff) = self
            .outstanding
            .get(&ticket.id)
            .ok_or(QueueError::UnknownTicket(ticket.id))?;
        if !self.cfg.charge_correction || !served.is_finite() || served <= charge {
            return Ok(false);
        }
        let backlogged = self.flows[id.ix()].phase == Phase::Backlogged;
        if backlogged {
            self.index_remove(id);
        }
        let v = self.v;
        let delta = (served - charge) / eff;
        let f = &mut self.flows[id.ix()];
        f.finish += delta;
        if backlogged {
            f.start = (f.start + delta).max(v);
            f.credit = (f.credit + delta).min(f.start);
            self.index_insert(id);
        }
        if let Some(e) = self.outstanding.get_mut(&ticket.id) {
            e.1 = served;
        }
        self.update_v();
        Ok(true)
    }
}
