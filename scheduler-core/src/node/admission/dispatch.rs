//! Dispatch: while a GPU has a slot under its limit and waiting work fits its memory (and its
//! tenant's share; a slot an overtime lease freed, only another tenant's), the queue's choice is
//! granted a lease. Every call into the core ends here.

use super::{Core, Grant, Kind, Lease, Record};
use crate::Time;

impl Core {
    /// Dispatches on one GPU while slots are free.
    pub(super) fn pump(&mut self, slot: usize, now: Time) -> Vec<Grant> {
        let mut grants = Vec::new();
        if now < self.hold {
            return grants;
        }
        loop {
            let (any, limit) = self.limits_of(slot);
            let running = self.gpus[slot].running;
            if running >= limit {
                break;
            }
            // 0: only the reserve's slot above ⌊D⌋ is free.
            let free = self.free_within(slot, any, limit);
            // A tenant at its share of slots yields to another tenant's work that fits; a
            // slot nobody else can take still goes to it.
            let flow = {
                let (fits, share) = (self.fit_test(slot), self.share_test(slot, limit));
                let over = self.overtime_test(slot);
                let q = &self.gpus[slot].queue;
                q.fitting(free, |f| fits(f) && over(f) && share(f))
                    .or_else(|| q.fitting(free, |f| fits(f) && over(f)))
            };
            let Some(flow) = flow else {
                break;
            };
            let footprint = self.gpus[slot]
                .queue
                .key(flow)
                .map_or(0, |k| self.footprint(k));
            let g = &mut self.gpus[slot];
            let Some(d) = g.queue.dispatch_slot_fitting(now, free, |f| f == flow) else {
                break;
            };
            let long = !g.queue.is_short_flow(d.ticket.flow);
            g.running += 1;
            if long {
                g.long_running += 1;
            }
            let gpu = g.info.index;
            let running = g.running;
            let dval = g.conc.d();
            let key = d.item;
            let (function, tenant, shim_pid, kind) = self
                .waiting_remove(&key)
                .map_or((String::new(), None, 0, Kind::Start), |w| {
                    (w.function, w.tenant, w.shim_pid, w.kind)
                });
            let lease = self.next_lease;
            self.next_lease += 1;
            let waited_ns = now.as_nanos().saturating_sub(d.enqueued_at.as_nanos());
            let seq = self.next_seq();
            self.log.push(Record::Dispatch {
                seq,
                t_ns: now.as_nanos(),
                gpu,
                key: key.clone(),
                function: function.clone(),
                lease,
                free,
                running,
                limit,
                d: dval,
                waited_ns,
                overdue: d.overdue,
            });
            self.lease_of.insert(key.clone(), lease);
            self.leases.insert(
                lease,
                Lease {
                    key: key.clone(),
                    function,
                    tenant,
                    gpu,
                    shim_pid,
                    since: now,
                    kind,
                    charged: d.ticket.charge,
                    ticket: d.ticket,
                    long,
                    epoch: self.epoch,
                    footprint,
                    overtime: false,
                },
            );
            self.gpus[slot].conc.admitted(lease, true);
            grants.push(Grant {
                key,
                lease,
                gpu,
                waited_ns,
            });
        }
        grants
    }

    /// Dispatches on every GPU. Every entry that moved time or the queues ends here, not on the
    /// one GPU it touched: [`Core::tick`] expires sticky flows on all GPUs, and a flow gone
    /// Inactive on another GPU frees the memory room kept for it or lets the virtual time move
    /// on there (a free slot left idle beside fitting work until the next sample, before).
    pub(super) fn pump_all(&mut self, now: Time) -> Vec<Grant> {
        let mut grants: Vec<Grant> = (0..self.gpus.len())
            .flat_map(|s| self.pump(s, now))
            .collect();
        grants.extend(self.rebalance(now));
        grants
    }
}

#[cfg(test)]
mod tests;
