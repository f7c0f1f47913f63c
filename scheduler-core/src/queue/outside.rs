//! Changes to the queue that do not come from its own dispatch: adopting an invocation that is
//! already running (the daemon restarted, or a start went through while it was away), and
//! withdrawing a waiting one (its caller went away).

use super::{FlowEvent, FlowId, MqfqQueue, Phase, QueueError, Ticket};
use crate::time::Time;

impl<T> MqfqQueue<T> {
    /// Records an invocation of flow `id` that is already running without having been dispatched
    /// by this queue (the daemon restarted while it ran, or it started while the daemon was
    /// unreachable). It is charged like a dispatch, so the flow pays for it, and it must be
    /// completed with the returned ticket.
    ///
    /// # Errors
    /// Unknown flow.
    pub fn adopt(&mut self, id: FlowId, now: Time) -> Result<Ticket, QueueError> {
        self.get(id)?;
        let was_short = self.counts_short(id);
        let charge = self.charge_of(&self.flows[id.ix()]);
        let v = self.v;
        let phase = self.flows[id.ix()].phase;
        match phase {
            Phase::Backlogged => {
                // The head moves back by the adopted charge, as if it had been dispatched first.
                self.index_remove(id);
                let f = &mut self.flows[id.ix()];
                f.start += charge / f.weight;
                f.finish += charge / f.weight;
                self.index_insert(id);
            }
            Phase::Inactive | Phase::Lingering { .. } | Phase::Running => {
                if let Phase::Lingering { until } = phase {
                    self.expiries.remove(&(until, id));
                }
                if phase == Phase::Inactive {
                    self.events.push(FlowEvent::Activated(id));
                }
                let f = &mut self.flows[id.ix()];
                f.finish = f.finish.max(v) + charge / f.weight;
                f.phase = Phase::Running;
            }
        }
        let f = &mut self.flows[id.ix()];
        let ticket = Ticket {
            id: self.next_ticket,
            flow: id,
            start: f.finish - charge / f.weight,
            finish: f.finish,
            charge,
            v,
        };
        f.in_flight += 1;
        f.dispatched += 1;
        f.last_service = Some(now);
        self.next_ticket += 1;
        self.outstanding.insert(ticket.id, (id, charge));
        self.update_v();
        self.recount(id, was_short);
        Ok(ticket)
    }

    /// Removes the first queued item of flow `id` that matches `pred` (an admission whose caller
    /// went away). The flow keeps its tags.
    pub fn withdraw(&mut self, id: FlowId, mut pred: impl FnMut(&T) -> bool) -> Option<T> {
        let f = self.flows.get(id.ix())?;
        let pos = f.pending.iter().position(|p| pred(&p.item))?;
        let was_short = self.counts_short(id);
        let f = &mut self.flows[id.ix()];
        let item = f.pending.remove(pos)?.item;
        self.queued -= 1;
        if f.pending.is_empty() {
            self.index_remove(id);
            let f = &mut self.flows[id.ix()];
            if f.in_flight > 0 {
                f.phase = Phase::Running;
            } else {
                // Nothing was served: linger from the last service, or go Inactive at once.
                let until = f
                    .last_service
                    .map_or(Time::ZERO, |t| t.plus_secs(self.ttl_of(id)));
                self.flows[id.ix()].phase = Phase::Lingering { until };
                self.expiries.insert((until, id));
            }
            self.update_v();
        }
        self.recount(id, was_short);
        Some(item)
    }
}
