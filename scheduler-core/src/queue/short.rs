//! Short flows: those charged at most `short_charge_s`. While one is backlogged, running or
//! still claiming (see [`super::linger`]), the short-slot reserve and the memory room beside long
//! flows are kept for it; the counter of such flows is kept incrementally.

use super::{Flow, FlowId, MqfqQueue, Phase, Vt};

impl<T> MqfqQueue<T> {
    /// Whether a flow counts as short now (charge ≤ `short_charge_s`, reserve on).
    #[must_use]
    pub fn is_short_flow(&self, id: FlowId) -> bool {
        self.flows.get(id.ix()).is_some_and(|f| self.is_short(f))
    }

    /// The flow a reserve's slot goes to: the short backlogged flow with the lowest start tag,
    /// if that is within the over-run threshold.
    pub(super) fn reserve_head(&self) -> Option<FlowId> {
        if self.cfg.short_charge_s <= 0.0 {
            return None;
        }
        let limit = self.v + self.overrun();
        self.short_backlog
            .first()
            .filter(|&&(Vt(s), _, _)| s <= limit)
            .map(|&(_, _, id)| id)
    }

    /// Whether [`dispatch_slot`](Self::dispatch_slot) with no free slot below the limit would
    /// dispatch (a reserve's slot has a taker).
    #[must_use]
    pub fn reserve_eligible(&self) -> bool {
        self.reserve_head().is_some()
    }

    /// Flows that count as short (charge ≤ `short_charge_s`) and are not Inactive.
    #[must_use]
    pub fn active_short_flows(&self) -> usize {
        self.active_short
    }

    pub(super) fn counts_short(&self, id: FlowId) -> bool {
        let f = &self.flows[id.ix()];
        let wanted = match f.phase {
            Phase::Inactive => false,
            Phase::Lingering { .. } => f.claim_until.is_some(),
            Phase::Backlogged | Phase::Running => true,
        };
        self.cfg.short_charge_s > 0.0 && wanted && self.charge_of(f) <= self.cfg.short_charge_s
    }

    pub(super) fn recount(&mut self, id: FlowId, was: bool) {
        match (was, self.counts_short(id)) {
            (false, true) => self.active_short += 1,
            (true, false) => self.active_short -= 1,
            _ => {}
        }
    }

    pub(super) fn is_short(&self, f: &Flow<T>) -> bool {
        self.cfg.short_charge_s > 0.0 && self.charge_of(f) <= self.cfg.short_charge_s
    }
}
