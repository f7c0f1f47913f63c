//! Enqueue: a call joins its flow (an arrival, or a call moved from another GPU's queue); an
//! empty flow takes its start tag from V, and the call its overtake due.

use super::{FlowEvent, FlowId, MqfqQueue, Pending, Phase, QueueError};
use crate::Time;

impl<T> MqfqQueue<T> {
    /// Queues `item` on flow `id` at time `now`.
    ///
    /// # Errors
    /// Unknown flow.
    pub fn enqueue(&mut self, id: FlowId, item: T, now: Time) -> Result<(), QueueError> {
        self.push(id, item, now, true)
    }

    /// Queues `item`, which arrived at `at` and waited in another GPU's queue, on flow `id`: its
    /// wait counts from `at`, and it is not an arrival of the flow here (the inter-arrival
    /// estimate behind the sticky TTL is left alone).
    ///
    /// # Errors
    /// Unknown flow.
    pub fn enqueue_moved(&mut self, id: FlowId, item: T, at: Time) -> Result<(), QueueError> {
        self.push(id, item, at, false)
    }

    fn push(&mut self, id: FlowId, item: T, at: Time, arrival: bool) -> Result<(), QueueError> {
        self.get(id)?;
        let was_short = self.counts_short(id);
        let v = self.v;
        let f = &mut self.flows[id.ix()];
        if arrival {
            if let Some(last) = f.last_arrival {
                f.iat.observe(at.secs_since(last));
            }
            f.last_arrival = Some(at);
        }
        let work = self.charge_of(&self.flows[id.ix()]);
        // Never before the call queued ahead of it in its own flow: it cannot run before it.
        let now_due = self.due_now();
        let due = self.flows[id.ix()]
            .pending
            .back()
            .map_or(now_due, |p| p.due.max(now_due));
        let f = &mut self.flows[id.ix()];
        f.pending.push_back(Pending {
            item,
            at,
            seq: self.next_seq,
            work,
            due,
        });
        self.next_seq += 1;
        self.queued += 1;
        self.queued_work += work;
        if f.pending.len() == 1 {
            f.start = v.max(f.finish);
            f.credit = f.finish;
            match f.phase {
                Phase::Inactive => self.events.push(FlowEvent::Activated(id)),
                Phase::Lingering { until } => {
                    self.expiries.remove(&(until, id));
                }
                Phase::Backlogged | Phase::Running => {}
            }
            self.drop_claim(id);
            let f = &mut self.flows[id.ix()];
            f.phase = Phase::Backlogged;
            self.join(id);
            self.index_insert(id);
            self.update_v();
        }
        self.recount(id, was_short);
        Ok(())
    }
}
