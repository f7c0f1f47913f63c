//! The overtake bound: how far the fair order may run ahead of a queued call. Arrival order
//! serves exactly the work queued ahead of a call before it; fair queueing serves later arrivals
//! of other flows first, which is what makes short functions fast and what a heavy function's
//! tail pays. With `overtake_bound = b`, a call that arrived with work `A` queued ahead of it is
//! overdue once more than `b × A + T` of work has been dispatched since, and is then served
//! before the fair order's choice, the longest-overdue first — if its flow is eligible (within T
//! of V). The bound reorders only what fairness leaves open: the choice among eligible flows,
//! which the tie-breaks make (lowest start tag, stickiness, residency and its switch cost, memory
//! fit), and which let several flows each run up to T ahead of a waiting one. A Throttled flow
//! gets no precedence, so a flood, whose flow runs far past T, is held to its share as before
//! (measured: without that condition the bound turned a flood back into arrival order).
//! Measured in work (estimated charges, slot-seconds), not time, so it needs neither D nor a
//! clock; a call is charged like any dispatch, so its flow still pays for its turn.

use super::{FlowId, MqfqQueue, Vt};
use crate::config::Selection;

impl<T> MqfqQueue<T> {
    /// Whether the bound is in force: set, and an order that can overtake (arrival order never
    /// does).
    pub(super) fn overtaking(&self) -> bool {
        self.cfg.overtake_bound > 0.0 && self.cfg.selection != Selection::Fifo
    }

    /// The dispatched-work count at which a call queued now becomes overdue.
    pub(super) fn due_now(&self) -> f64 {
        if self.overtaking() {
            self.served_work + self.cfg.overtake_bound * self.queued_work + self.overrun()
        } else {
            f64::INFINITY
        }
    }

    /// The flow whose head is overdue longest among the eligible ones (within T of V) that `fits`
    /// accepts, if any.
    pub(super) fn overdue_head(&self, fits: impl Fn(FlowId) -> bool) -> Option<FlowId> {
        let limit = self.v + self.overrun();
        self.overdue
            .iter()
            .take_while(|&&(Vt(due), _)| due < self.served_work)
            .map(|&(_, id)| id)
            .filter(|&id| self.flows[id.ix()].start <= limit)
            .find(|&id| fits(id))
    }
}

/// The queued work once a call of estimated `work` left, `queued` calls remaining (exactly 0
/// when none remain, so rounding never accumulates).
pub(super) fn unqueued(queued_work: f64, queued: usize, work: f64) -> f64 {
    if queued == 0 {
        0.0
    } else {
        (queued_work - work).max(0.0)
    }
}

#[cfg(test)]
mod tests;
