//! Changes that come from the shims rather than from the queue: a shim's registration (adopting
//! running containers, releasing leases it no longer lists), a dead shim, and forgetting idle
//! flows.

use super::{Core, CoreError, Grant, Lease, Record, Registration, RunningInfo, invalid};
use crate::Time;
use crate::node::ContainerKey;

impl Core {
    /// A shim died: its waiting admissions are withdrawn and its leases released. Returns the
    /// withdrawn keys, the released leases, and the grants the freed slots made.
    pub fn shim_gone(&mut self, pid: u32, now: Time) -> (Vec<ContainerKey>, Vec<u64>, Vec<Grant>) {
        let keys: Vec<ContainerKey> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.shim_pid == pid)
            .map(|(k, _)| k.clone())
            .collect();
        // Withdrawn without dispatching in between: a grant here could go to a later key of the
        // same dead shim (released at once below, its flow charged for nothing).
        for k in &keys {
            self.withdraw(k, "shim gone", now);
        }
        let mut grants = Vec::new();
        let leases: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.shim_pid == pid)
            .map(|(&id, _)| id)
            .collect();
        for &id in &leases {
            if let Ok(g) = self.release(id, None, "shim gone", now) {
                grants.extend(g);
            }
        }
        self.registered_at.remove(&pid);
        grants.extend(self.pump_all(now));
        (keys, leases, grants)
    }

    /// A shim (re)registers its running GPU containers. Leases this daemon granted are kept;
    /// the others (granted by a previous daemon, or fail-open starts) are adopted with new
    /// leases. Leases the shim holds for containers it no longer lists — neither running nor
    /// with an Admit in flight (`admitting`) — are released: their Release was lost. Only leases
    /// already held at the shim's previous registration are, so that a registration sent before
    /// an Admit reply reached the shim never releases the lease that reply carries.
    ///
    /// # Errors
    /// An invalid entry or more entries than the per-shim cap; entries before it are kept
    /// (registration is idempotent, the shim sends the whole set again) and nothing is released.
    pub fn register(
        &mut self,
        shim_pid: u32,
        running: &[RunningInfo],
        admitting: &[ContainerKey],
        fail_open_starts: u64,
        now: Time,
    ) -> Result<Registration, CoreError> {
        self.tick(now);
        if running.len() > self.limits.1 {
            return Err(CoreError::Limit {
                what: "registered containers",
                limit: self.limits.1,
            });
        }
        self.epoch += 1;
        let previous = self.registered_at.insert(shim_pid, self.epoch);
        let mut out = Registration::default();
        for r in running {
            out.leases.push(self.register_one(shim_pid, r, now)?);
        }
        // Counted once the registration went through: a refused one is sent again, count and all.
        self.fail_open_starts += fail_open_starts;
        if let Some(previous) = previous {
            let listed: std::collections::HashSet<&ContainerKey> =
                out.leases.iter().map(|(k, _)| k).chain(admitting).collect();
            let lost: Vec<(ContainerKey, u64)> = self
                .leases
                .iter()
                .filter(|(_, l)| {
                    l.shim_pid == shim_pid && l.epoch < previous && !listed.contains(&l.key)
                })
                .map(|(&id, l)| (l.key.clone(), id))
                .collect();
            for (key, id) in lost {
                if let Ok(g) = self.release(id, None, "not registered", now) {
                    out.grants.extend(g);
                }
                out.released.push((key, id));
            }
        }
        // The withdrawals above may let waiting work in, and the clock moved on.
        out.grants.extend(self.pump_all(now));
        Ok(out)
    }

    fn register_one(
        &mut self,
        shim_pid: u32,
        r: &RunningInfo,
        now: Time,
    ) -> Result<(ContainerKey, u64), CoreError> {
        let weight = Self::validate(&r.info)?;
        let key = r.info.key()?;
        if let Some(&lease) = self.lease_of.get(&key) {
            self.set_holder(lease, shim_pid);
            return Ok((key, lease));
        }
        if self.waiting.contains_key(&key) {
            // It runs, so it no longer waits.
            self.withdraw(&key, "registered as running", now);
        }
        let candidates = self.resolve(&r.info.gpus)?;
        let slot = self.route(&candidates);
        let flow_key = r.info.flow_key();
        let g = &mut self.gpus[slot];
        let flow = Self::flow_of(&mut g.queue, &r.info, &flow_key, weight)?;
        let ticket = g
            .queue
            .adopt(flow, now)
            .map_err(|e| invalid("function", e.to_string()))?;
        let long = !g.queue.is_short_flow(flow);
        g.running += 1;
        if long {
            g.long_running += 1;
        }
        let gpu = g.info.index;
        let lease = self.next_lease;
        self.next_lease += 1;
        let seq = self.next_seq();
        self.log.push(Record::Adopt {
            seq,
            t_ns: now.as_nanos(),
            gpu,
            key: key.clone(),
            function: flow_key.clone(),
            tenant: r.info.tenant.clone(),
            lease,
        });
        self.lease_of.insert(key.clone(), lease);
        let footprint = self.footprint(&flow_key);
        self.leases.insert(
            lease,
            Lease {
                key: key.clone(),
                function: flow_key,
                tenant: r.info.tenant.clone(),
                gpu,
                shim_pid,
                since: now,
                kind: r.info.kind,
                charged: ticket.charge,
                ticket,
                long,
                epoch: self.epoch,
                footprint,
                overtime: false,
            },
        );
        // Its run began before this daemon knew it: its measurement teaches no baseline.
        self.gpus[slot].conc.admitted(lease, false);
        Ok((key, lease))
    }

    /// Forgets every GPU queue's flows idle for `idle_s` seconds; returns their keys.
    pub fn forget_idle(&mut self, now: Time, idle_s: f64) -> Vec<String> {
        self.tick(now);
        let mut gone: Vec<String> = self
            .gpus
            .iter_mut()
            .flat_map(|g| g.queue.forget_idle(now, idle_s))
            .collect();
        gone.sort();
        gone.dedup();
        // A key still known on another GPU keeps its series.
        gone.retain(|k| self.gpus.iter().all(|g| g.queue.lookup(k).is_none()));
        // Baselines stay (bounded, least recently used dropped first): a function that comes back
        // after a quiet spell is still measured against its run alone.
        gone
    }
}
