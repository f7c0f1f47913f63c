//! Late binding: an admission that may run on several GPUs joins the queue of the one it is
//! routed to at arrival; when another of its GPUs then has a free slot that nothing waiting there
//! can take, room for it, and MQFQ's order there would let it run (within the over-run
//! threshold), the oldest such admission moves there instead of waiting beside idle capacity. One queue per GPU keeps MQFQ-Sticky's order per GPU; without
//! this, work bound at arrival waits behind a busy GPU while another idles (the gap between
//! separate queues and one shared queue).
//!
//! Off by default ([`Core::set_late_binding`]): it is right only where the work runs on the GPU
//! its lease names. The simulator's executor runs it there; in `mqfqd` the shim does not move a
//! container's work, so for a container that sees several GPUs a move would only move the
//! accounting (`[queue] late_binding`, off).

use std::collections::BTreeSet;

use super::{Core, Grant, Record, Waiting};
use crate::Time;
use crate::node::ContainerKey;

impl Core {
    /// Lets waiting work move to another of its GPUs (see the module docs).
    pub fn set_late_binding(&mut self, on: bool) {
        self.late_binding = on;
    }

    /// Whether waiting work may move to another of its GPUs.
    #[must_use]
    pub fn late_binding(&self) -> bool {
        self.late_binding
    }

    /// Moves waiting admissions to GPUs that can start them now, and dispatches them there;
    /// each admission moves at most once per call.
    pub(super) fn rebalance(&mut self, now: Time) -> Vec<Grant> {
        let mut grants = Vec::new();
        if !self.late_binding || self.gpus.len() < 2 || now < self.hold || self.waiting.is_empty() {
            return grants;
        }
        let mut moved = BTreeSet::new();
        while let Some((key, to)) = self.pick_move(&moved) {
            moved.insert(key.clone());
            if let Some(from) = self.move_waiting(&key, to, now) {
                grants.extend(self.pump(to, now));
                // What waited behind it where it was (too big for that GPU's room) may fit now.
                grants.extend(self.pump(from, now));
            }
        }
        grants
    }

    /// The oldest admission waiting on another GPU that may run on a GPU with a free slot
    /// (under ⌊D⌋, not the short reserve's; one an overtime lease freed only for another
    /// function), memory for it, and its flow there within the over-run threshold.
    fn pick_move(&self, moved: &BTreeSet<ContainerKey>) -> Option<(ContainerKey, usize)> {
        (0..self.gpus.len()).find_map(|to| {
            let g = &self.gpus[to];
            if self.free_under_d(to) == 0 {
                return None;
            }
            let index = g.info.index;
            let (fits, allows) = (self.room_for(to), self.overtime_allows(to));
            self.waiting
                .iter()
                .filter(|(k, w)| {
                    w.gpu != index
                        && w.candidates.contains(&index)
                        && !moved.contains(*k)
                        && fits(&w.function)
                        && allows(&w.function)
                        && g.queue.within_overrun(&w.function)
                })
                .min_by(|(a, x), (b, y)| x.since.cmp(&y.since).then_with(|| a.cmp(b)))
                .map(|(k, _)| (k.clone(), to))
        })
    }

    /// Takes `key` out of its GPU's queue and queues it on `to`; returns the GPU it left, or
    /// `None` (and nothing changed) when it could not join a flow there.
    fn move_waiting(&mut self, key: &ContainerKey, to: usize, now: Time) -> Option<usize> {
        let w = self.waiting_remove(key)?;
        let index = self.gpus[to].info.index;
        let queue = &mut self.gpus[to].queue;
        let Ok(flow) = Self::flow_of(queue, &w.info, &w.function, w.weight) else {
            self.waiting_insert(key.clone(), w);
            return None;
        };
        let from = self.slot(w.gpu);
        self.gpus[from].queue.withdraw(w.flow, |k| k == key);
        self.expire_withdrawn(from, now);
        // The flow exists: enqueue cannot fail. Its wait still counts from its arrival.
        let _ = self.gpus[to]
            .queue
            .enqueue_moved(flow, key.clone(), w.since);
        self.collect_events(to);
        let seq = self.next_seq();
        self.log.push(Record::Move {
            seq,
            t_ns: now.as_nanos(),
            from: w.gpu,
            to: index,
            key: key.clone(),
            function: w.function.clone(),
        });
        self.waiting_insert(
            key.clone(),
            Waiting {
                gpu: index,
                flow,
                ..w
            },
        );
        self.collect_events(from);
        Some(from)
    }
}

#[cfg(test)]
mod tests;
