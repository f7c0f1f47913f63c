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
        let eff = self.effective(id);
        let v = self.v;
        let phase = self.flows[id.ix()].phase;
        match phase {
            Phase::Backlogged => {
                // The head moves back by the adopted charge, as if it had been dispatched first.
                self.index_remove(id);
                let f = &mut self.flows[id.ix()];
                f.start += charge / eff;
                f.finish += charge / eff;
                // As served just now: no tie goes to it for having waited.
                f.credit = f.start;
                self.index_insert(id);
            }
            Phase::Inactive | Phase::Lingering { .. } | Phase::Running => {
                if let Phase::Lingering { until } = phase {
                    self.expiries.remove(&(until, id));
                }
                if phase == Phase::Inactive {
                    self.events.push(FlowEvent::Activated(id));
                }
                self.drop_claim(id);
                let f = &mut self.flows[id.ix()];
                f.finish = f.finish.max(v) + charge / eff;
                f.phase = Phase::Running;
            }
        }
        let f = &mut self.flows[id.ix()];
        let ticket = Ticket {
            id: self.next_ticket,
            flow: id,
            start: f.finish - charge / eff,
            finish: f.finish,
            charge,
            v,
        };
        f.in_flight += 1;
        f.dispatched += 1;
        f.last_service = Some(now);
        self.served_work += charge;
        self.next_ticket += 1;
        self.outstanding.insert(ticket.id, (id, charge, eff));
        self.update_v();
        self.recount(id, was_short);
        Ok(ticket)
    }

    /// Removes the first queued item of flow `id` that matches `pred` (an admission whose caller
    /// went away). The flow keeps its tags.
    pub fn withdraw(&mut self, id: FlowId, mut pred: impl FnMut(&T) -> bool) -> Option<T> {
        let f = self.flows.get(id.ix()).filter(|f| !f.vacant)?;
        let pos = f.pending.iter().position(|p| pred(&p.item))?;
        let was_short = self.counts_short(id);
        // Out of the indexes while the head is still there (the FIFO index is keyed by it).
        self.index_remove(id);
        let f = &mut self.flows[id.ix()];
        let gone = f.pending.remove(pos)?;
        let item = gone.item;
        self.queued -= 1;
        self.queued_work = super::overtake::unqueued(self.queued_work, self.queued, gone.work);
        if f.pending.is_empty() {
            self.leave(id);
            let f = &mut self.flows[id.ix()];
            if f.in_flight > 0 {
                f.phase = Phase::Running;
            } else {
                // Nothing was served: linger from the last service, or go Inactive at once.
                let until = f
                    .last_service
                    .map_or(Time::ZERO, |t| t.plus_secs(self.ttl_of(id)));
                self.linger(id, until, None);
            }
            self.update_v();
        } else {
            self.index_insert(id);
        }
        self.recount(id, was_short);
        Some(item)
    }
}

impl<T> MqfqQueue<T> {
    /// Forgets flows idle for at least `idle_s` seconds at `now` (Inactive, nothing queued or
    /// running), so that function keys — which come from pods — do not accumulate. Returns their
    /// keys. A forgotten flow that comes back starts afresh at V: it loses at most the lead it
    /// had, which MQFQ bounds by T plus one charge.
    pub fn forget_idle(&mut self, now: Time, idle_s: f64) -> Vec<String> {
        let mut gone = Vec::new();
        for i in 0..self.flows.len() {
            let f = &self.flows[i];
            let last = f.last_service.max(f.last_arrival).unwrap_or(Time::ZERO);
            let idle = f.phase == Phase::Inactive
                && !f.vacant
                && f.pending.is_empty()
                && f.in_flight == 0
                && now.secs_since(last) >= idle_s;
            let Ok(ix) = u32::try_from(i) else { break };
            let id = FlowId(ix);
            if !idle || self.sticky == Some(id) {
                continue;
            }
            let f = &mut self.flows[i];
            f.vacant = true;
            let key = std::mem::take(&mut f.key);
            let tenant = f.tenant.take();
            self.by_key.remove(&key);
            self.free.push(id);
            if let Some(t) = tenant {
                self.tenant_flow_gone(&t);
            }
            gone.push(key);
        }
        gone
    }
}
