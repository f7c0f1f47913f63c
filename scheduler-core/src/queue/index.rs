//! The ordered sets dispatch reads, and the selection rule over them: backlogged flows by start
//! tag (short and long kept apart for the reserve's slot), resident flows, the others by start
//! plus switch cost, and arrival order for `Selection::Fifo`. Every change to a flow's start,
//! cost, weight, charge or head goes through [`MqfqQueue::index_remove`] before and
//! [`MqfqQueue::index_insert`] after, so no dispatch ever scans the flows.

use super::{FlowId, MqfqQueue, Phase, Tag, Vt};
use crate::config::Selection;

impl<T> MqfqQueue<T> {
    pub(super) fn index_insert(&mut self, id: FlowId) {
        let f = &self.flows[id.ix()];
        let key = (Vt(f.start), Vt(f.credit), id);
        if self.is_short(f) {
            self.short_backlog.insert(key);
        } else {
            self.long_backlog.insert(key);
        }
        if f.resident {
            self.resident_backlog.insert(key);
        } else {
            self.penalized
                .insert((Vt(f.start + f.switch_cost / f.weight), Vt(f.credit), id));
        }
        if self.cfg.selection == Selection::Fifo
            && let Some(head) = f.pending.front()
        {
            self.fifo.insert((head.seq, id));
        }
        if self.overtaking()
            && let Some(head) = f.pending.front()
        {
            self.overdue.insert((Vt(head.due), id));
        }
    }

    /// Removes the flow from the indexes; call before changing its start, cost, weight or charge.
    pub(super) fn index_remove(&mut self, id: FlowId) {
        let f = &self.flows[id.ix()];
        let key = (Vt(f.start), Vt(f.credit), id);
        if self.is_short(f) {
            self.short_backlog.remove(&key);
        } else {
            self.long_backlog.remove(&key);
        }
        if f.resident {
            self.resident_backlog.remove(&key);
        } else {
            self.penalized
                .remove(&(Vt(f.start + f.switch_cost / f.weight), Vt(f.credit), id));
        }
        if let Some(head) = f.pending.front() {
            self.fifo.remove(&(head.seq, id));
            self.overdue.remove(&(Vt(head.due), id));
        }
    }

    /// The backlogged flow with the lowest start tag (short and long flows are kept apart so each
    /// flow sits in one of them; the minimum is the lower of the two heads).
    pub(super) fn lowest(&self) -> Option<(f64, FlowId)> {
        let s = self.short_backlog.first();
        let l = self.long_backlog.first();
        let best: Option<&Tag> = match (s, l) {
            (Some(a), Some(b)) => Some(if b < a { b } else { a }),
            (a, b) => a.or(b),
        };
        best.map(|&(Vt(v), _, id)| (v, id))
    }

    pub(super) fn update_v(&mut self) {
        if let Some((min, _)) = self.lowest()
            && min > self.v
        {
            self.v = min;
        }
    }

    pub(super) fn select(&self) -> Option<FlowId> {
        if self.cfg.selection == Selection::Fifo {
            return self.fifo.first().map(|&(_, id)| id);
        }
        let limit = self.v + self.overrun();
        let sticky_first = matches!(
            self.cfg.selection,
            Selection::Sticky | Selection::StickyResident
        );
        if sticky_first && let Some(s) = self.sticky {
            let f = &self.flows[s.ix()];
            // Stickiness exists to reuse resident memory: with residency-aware selection a
            // sticky flow whose memory is gone (or whose containers are all busy) gets no
            // precedence.
            let resident_ok = self.cfg.selection == Selection::Sticky || f.resident;
            if f.phase == Phase::Backlogged && f.start <= limit && resident_ok {
                return Some(s);
            }
        }
        if self.cfg.selection == Selection::StickyResident {
            let resident = self
                .resident_backlog
                .first()
                .filter(|&&(Vt(s), _, _)| s <= limit)
                .copied();
            let other = self
                .penalized
                .first()
                .filter(|&&(_, _, id)| self.flows[id.ix()].start <= limit)
                .copied();
            let best = match (resident, other) {
                (Some(r), Some(o)) => Some(if o.0 < r.0 { o } else { r }),
                (r, o) => r.or(o),
            };
            if let Some((_, _, id)) = best {
                return Some(id);
            }
        }
        self.lowest().map(|(_, id)| id)
    }
}
