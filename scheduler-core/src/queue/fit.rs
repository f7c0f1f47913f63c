//! Dispatch under a second resource. The node admits GPU memory as well as slots: a flow whose
//! footprint does not fit beside the leases held must not take a slot (its restore would evict
//! memory that running work needs, and the PCIe link thrashes). When the flow the rule picks does
//! not fit, the slot goes to the backlogged flow with the lowest start tag that fits and is within
//! the over-run threshold T of V — the same bound that lets any flow run ahead of V. A flow that
//! does not fit keeps V from passing its start tag, so the others run at most T ahead of it before
//! nothing else is eligible, the GPU drains, and it fits: waiting for memory is bounded by T for a
//! flow's first lease. A second one may also wait for room kept for other flows (the node's memory
//! admission), until its own lease ends and its next call is a first lease again.

use super::{FlowId, MqfqQueue, Tag, Vt};
use crate::time::Time;

use super::Dispatched;

impl<T> MqfqQueue<T> {
    /// Whether work of flow `key` queued now would start within the over-run threshold T of V,
    /// so that MQFQ's order lets it run (a flow the queue does not know starts at V).
    #[must_use]
    pub fn within_overrun(&self, key: &str) -> bool {
        let Some(id) = self.lookup(key) else {
            return true;
        };
        let f = &self.flows[id.ix()];
        let start = if f.pending.is_empty() {
            self.v.max(f.finish)
        } else {
            f.start
        };
        start <= self.v + self.overrun()
    }

    /// The flow [`dispatch_slot_fitting`](Self::dispatch_slot_fitting) would serve, without
    /// serving it.
    pub fn fitting(&self, free_slots: u32, fits: impl Fn(FlowId) -> bool) -> Option<FlowId> {
        self.choose(free_slots, fits).map(|(id, _)| id)
    }

    /// [`fitting`](Self::fitting)'s choice, and whether the overtake bound made it (an overdue
    /// flow's head served before the fair order's choice).
    pub(super) fn choose(
        &self,
        free_slots: u32,
        fits: impl Fn(FlowId) -> bool,
    ) -> Option<(FlowId, bool)> {
        if free_slots > 0
            && let Some(id) = self.overdue_head(&fits)
        {
            return Some((id, true));
        }
        self.fair_fitting(free_slots, fits).map(|id| (id, false))
    }

    /// The fair order's choice among the flows `fits` accepts (the overtake bound aside).
    fn fair_fitting(&self, free_slots: u32, fits: impl Fn(FlowId) -> bool) -> Option<FlowId> {
        let first = if free_slots == 0 {
            self.reserve_head()
        } else {
            self.select()
        }?;
        if fits(first) {
            return Some(first);
        }
        let limit = self.v + self.overrun();
        let longs = (free_slots > 0)
            .then(|| self.long_backlog.iter())
            .into_iter()
            .flatten();
        let within = |&&(Vt(s), _, _): &&Tag| s <= limit;
        let short = self
            .short_backlog
            .iter()
            .take_while(within)
            .find(|&&(_, _, id)| fits(id));
        let long = longs.take_while(within).find(|&&(_, _, id)| fits(id));
        match (short, long) {
            (Some(a), Some(b)) => Some(if b < a { b.2 } else { a.2 }),
            (a, b) => a.or(b).map(|&(_, _, id)| id),
        }
    }

    /// Like [`dispatch_slot`](Self::dispatch_slot), serving only a flow `fits` accepts (see the
    /// module docs); `None` when no eligible flow fits.
    pub fn dispatch_slot_fitting(
        &mut self,
        now: Time,
        free_slots: u32,
        fits: impl Fn(FlowId) -> bool,
    ) -> Option<Dispatched<T>> {
        let (id, overdue) = self.choose(free_slots, fits)?;
        self.dispatch_flow(now, id, overdue)
    }

    /// The flows that count as short and are not Inactive (the short-slot reserve's takers).
    pub fn active_short_ids(&self) -> impl Iterator<Item = FlowId> + '_ {
        (0..self.flows.len())
            .map(|i| FlowId(u32::try_from(i).unwrap_or(u32::MAX)))
            .filter(|&id| !self.flows[id.ix()].vacant && self.counts_short(id))
    }
}
