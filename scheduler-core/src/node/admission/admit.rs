//! Admit: an admission joins its function's flow on the GPU it is routed to, and is granted at
//! once when a slot and its memory are free.

use super::{AdmitInfo, Core, CoreError, Grant, Record, Waiting, invalid};
use crate::node::ContainerKey;
use crate::{FlowId, MqfqQueue, Time};

impl Core {
    /// Queues an admission; returns every grant this made (possibly the request's own).
    ///
    /// # Errors
    /// Invalid fields, unknown GPU, or the container already waiting; nothing changes then.
    pub fn admit(&mut self, info: &AdmitInfo, now: Time) -> Result<Vec<Grant>, CoreError> {
        let weight = Self::validate(info)?;
        let candidates = self.resolve(&info.gpus)?;
        let key = info.key()?;
        if self.waiting.contains_key(&key) {
            return Err(CoreError::AlreadyWaiting(key));
        }
        if self.waiting_of.get(&info.shim_pid).copied().unwrap_or(0) >= self.limits.0 {
            return Err(CoreError::Limit {
                what: "waiting admissions",
                limit: self.limits.0,
            });
        }
        self.tick(now);
        if let Some(&lease) = self.lease_of.get(&key) {
            // Already admitted (a retried call after a lost reply): the same lease again.
            let l = &self.leases[&lease];
            let mut grants = vec![Grant {
                key,
                lease,
                gpu: l.gpu,
                waited_ns: 0,
            }];
            grants.extend(self.pump_all(now));
            return Ok(grants);
        }
        let slot = self.route(&candidates);
        let seq = self.next_seq();
        let flow_key = info.flow_key();
        let g = &mut self.gpus[slot];
        let flow = Self::flow_of(&mut g.queue, info, &flow_key, weight)?;
        g.queue
            .enqueue(flow, key.clone(), now)
            .map_err(|e| invalid("function", e.to_string()))?;
        let gpu = g.info.index;
        self.collect_events(slot);
        self.log.push(Record::Enqueue {
            seq,
            t_ns: now.as_nanos(),
            gpu,
            key: key.clone(),
            function: flow_key.clone(),
            tenant: info.tenant.clone(),
            tenant_weight: if info.tenant_weight == 0.0 {
                1.0
            } else {
                info.tenant_weight
            },
            weight,
            kind: info.kind,
        });
        self.waiting_insert(
            key,
            Waiting {
                gpu,
                flow,
                function: flow_key,
                tenant: info.tenant.clone(),
                shim_pid: info.shim_pid,
                kind: info.kind,
                candidates,
                info: info.clone(),
                weight,
                since: now,
            },
        );
        Ok(self.pump_all(now))
    }

    /// The flow of an admission, with its weight and its tenant's weight in force.
    pub(super) fn flow_of(
        q: &mut MqfqQueue<ContainerKey>,
        info: &AdmitInfo,
        flow_key: &str,
        weight: f64,
    ) -> Result<FlowId, CoreError> {
        let flow = q.flow_in(flow_key, info.tenant.as_deref());
        q.set_weight(flow, weight)
            .map_err(|_| invalid("weight", format!("{weight} must be a finite number > 0")))?;
        if let Some(t) = &info.tenant {
            let tw = if info.tenant_weight == 0.0 {
                1.0
            } else {
                info.tenant_weight
            };
            q.set_tenant_weight(t, tw)
                .map_err(|_| invalid("tenant_weight", format!("{tw} must be > 0")))?;
        }
        Ok(flow)
    }
}
