//! A second level of fairness: tenants, then functions.
//!
//! Why: with one flow per function, a tenant that runs ten functions gets ten shares of the GPU
//! and one that runs a single function gets one. Hierarchical fair queueing gives each tenant its
//! weight's share, split among its backlogged functions by theirs.
//!
//! How, without a second queue: a flow's *effective* weight at dispatch is
//!
//! ```text
//!   w_f × (W_t × S_all) / (S_t × W_all)
//! ```
//!
//! where `W_t` is its tenant's weight, `S_t` the sum of the weights of the tenant's backlogged
//! flows, and `S_all` / `W_all` the same sums over every tenant with backlog (a flow without a
//! tenant counts as a tenant of its own weight). The charges `c / effective` then give tenant t
//! the fraction `W_t / W_all` of service while every flow is backlogged, and flow f within it
//! `w_f / S_t` of that. The factor `S_all / W_all` keeps virtual time on the scale of a flat
//! queue, so the over-run threshold T still means seconds of service at weight 1: with no tenant,
//! or a single one, the factor is exactly 1 and the queue behaves bit for bit as without tenants
//! (a property test checks this). The ordered indexes do not involve the effective weight — it
//! only enters the charge at dispatch — so a flow joining or leaving a tenant costs
//! O(flows of that tenant + tenants with backlog), never a re-index.

use std::collections::BTreeSet;

use super::{FlowId, MqfqQueue, Phase, QueueError, check_weight};

/// One tenant.
#[derive(Debug, Clone)]
pub(super) struct Tenant {
    weight: f64,
    /// Backlogged flows.
    backlogged: BTreeSet<FlowId>,
    /// Σ weight of `backlogged`, recomputed on every change (no drift).
    sum: f64,
    /// Flows of this tenant (any state).
    flows: usize,
}

impl Default for Tenant {
    fn default() -> Self {
        Tenant {
            weight: 1.0,
            backlogged: BTreeSet::new(),
            sum: 0.0,
            flows: 0,
        }
    }
}

fn resum<T>(flows: &[super::Flow<T>], members: &BTreeSet<FlowId>) -> f64 {
    members.iter().map(|id| flows[id.ix()].weight).sum()
}

impl<T> MqfqQueue<T> {
    /// The flow for `key` in `tenant` (`None`: no tenant), created on first use. A flow's tenant
    /// is fixed by its first call that names one.
    pub fn flow_in(&mut self, key: &str, tenant: Option<&str>) -> FlowId {
        let id = self.flow(key);
        if let Some(t) = tenant
            && self.flows[id.ix()].tenant.is_none()
        {
            let backlogged = self.flows[id.ix()].phase == Phase::Backlogged;
            if backlogged {
                self.leave(id);
            }
            self.tenants.entry(t.to_owned()).or_default().flows += 1;
            self.flows[id.ix()].tenant = Some(t.to_owned());
            if backlogged {
                self.join(id);
            }
        }
        id
    }

    /// Sets a tenant's weight (default 1).
    ///
    /// # Errors
    /// A weight that is not finite and > 0.
    pub fn set_tenant_weight(&mut self, tenant: &str, weight: f64) -> Result<(), QueueError> {
        check_weight(weight)?;
        self.tenants.entry(tenant.to_owned()).or_default().weight = weight;
        Ok(())
    }

    /// A tenant's weight, if it has flows.
    #[must_use]
    pub fn tenant_weight(&self, tenant: &str) -> Option<f64> {
        self.tenants.get(tenant).map(|t| t.weight)
    }

    /// Number of tenants with flows.
    #[must_use]
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// A flow became backlogged: it joins its tenant's share.
    pub(super) fn join(&mut self, id: FlowId) {
        let f = &self.flows[id.ix()];
        match f.tenant.clone() {
            None => {
                self.tenantless_w += f.weight;
                self.tenantless_n += 1;
            }
            Some(name) => {
                let t = self.tenants.entry(name.clone()).or_default();
                t.backlogged.insert(id);
                t.sum = resum(&self.flows, &t.backlogged);
                self.active_tenants.insert(name);
            }
        }
    }

    /// A flow stopped being backlogged.
    pub(super) fn leave(&mut self, id: FlowId) {
        let f = &self.flows[id.ix()];
        match f.tenant.clone() {
            None => {
                self.tenantless_n = self.tenantless_n.saturating_sub(1);
                self.tenantless_w = if self.tenantless_n == 0 {
                    0.0
                } else {
                    (self.tenantless_w - f.weight).max(0.0)
                };
            }
            Some(name) => {
                if let Some(t) = self.tenants.get_mut(&name) {
                    t.backlogged.remove(&id);
                    t.sum = resum(&self.flows, &t.backlogged);
                    if t.backlogged.is_empty() {
                        self.active_tenants.remove(&name);
                    }
                }
            }
        }
    }

    /// A flow of `tenant` was forgotten: the tenant goes with its last flow.
    pub(super) fn tenant_flow_gone(&mut self, tenant: &str) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.flows = t.flows.saturating_sub(1);
            if t.flows == 0 && t.backlogged.is_empty() {
                self.tenants.remove(tenant);
            }
        }
    }

    /// The weight a flow is charged at now (see the module docs); for a flow that is not
    /// backlogged, as if it were.
    pub(super) fn effective(&self, id: FlowId) -> f64 {
        let f = &self.flows[id.ix()];
        let w = f.weight;
        let backlogged = f.phase == Phase::Backlogged;
        let mut s_all = self.tenantless_w;
        let mut w_all = self.tenantless_w;
        for name in &self.active_tenants {
            if let Some(t) = self.tenants.get(name) {
                s_all += t.sum;
                w_all += t.weight;
            }
        }
        let (w_t, s_t) = match &f.tenant {
            None => {
                if !backlogged {
                    s_all += w;
                    w_all += w;
                }
                (w, w)
            }
            Some(name) => {
                let (weight, sum) = self
                    .tenants
                    .get(name)
                    .map_or((1.0, 0.0), |t| (t.weight, t.sum));
                if backlogged {
                    (weight, sum)
                } else {
                    s_all += w;
                    if !self.active_tenants.contains(name) {
                        w_all += weight;
                    }
                    (weight, sum + w)
                }
            }
        };
        let factor = (w_t * s_all) / (s_t * w_all);
        if factor.is_finite() && factor > 0.0 {
            w * factor
        } else {
            w
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Overrun, QueueConfig, Selection, StickyTtl};
    use crate::time::Time;

    fn cfg() -> QueueConfig {
        QueueConfig {
            overrun: Overrun::Fixed(0.0),
            ttl: StickyTtl::Fixed(0.0),
            fallback_ttl_s: 0.0,
            fallback_charge_s: 1.0,
            ewma_alpha: 0.2,
            charge_correction: true,
            selection: Selection::LowestStart,
            short_charge_s: 0.0,
            overtake_bound: 0.0,
        }
    }

    /// Tenant A runs `k` functions, tenant B one; every flow always backlogged, one slot, equal
    /// charges. Returns the dispatches each tenant got.
    #[expect(clippy::cast_precision_loss, reason = "step counts")]
    fn run(k: usize, tenants: bool, wa: f64, steps: usize) -> (usize, usize) {
        let mut q: MqfqQueue<usize> = MqfqQueue::new(cfg()).unwrap();
        let t = |name: &'static str| tenants.then_some(name);
        let mut ids: Vec<(FlowId, bool)> = (0..k)
            .map(|i| (q.flow_in(&format!("a{i}"), t("a")), true))
            .collect();
        ids.push((q.flow_in("b", t("b")), false));
        if tenants {
            q.set_tenant_weight("a", wa).unwrap();
        }
        // Two each, one refilled per dispatch: never empty.
        for (n, &(id, _)) in ids.iter().enumerate() {
            q.enqueue(id, n, Time::ZERO).unwrap();
            q.enqueue(id, n, Time::ZERO).unwrap();
        }
        let (mut a, mut b) = (0, 0);
        for s in 0..steps {
            let now = Time::from_secs_f64(s as f64);
            let d = q.dispatch(now).unwrap();
            let n = d.item;
            if ids[n].1 {
                a += 1;
            } else {
                b += 1;
            }
            q.enqueue(ids[n].0, n, now).unwrap();
            q.complete(&d.ticket, Some(1.0), now).unwrap();
        }
        (a, b)
    }

    #[test]
    fn each_tenant_gets_its_share_however_many_functions_it_runs() {
        for k in 1..6 {
            let (a, b) = run(k, true, 1.0, 600);
            assert!(a.abs_diff(b) <= k + 1, "k={k}: a={a} b={b}");
            // Without tenants, A's k functions take k shares.
            let (a, b) = run(k, false, 1.0, 600);
            assert!(a.abs_diff(k * b) <= 2 * k, "k={k}: a={a} b={b}");
        }
        // Tenant weight 3: three quarters of the GPU.
        let (a, b) = run(4, true, 3.0, 800);
        assert!(a.abs_diff(3 * b) <= 12, "a={a} b={b}");
    }

    #[test]
    fn forgotten_flows_take_their_tenant_with_the_last_one() {
        let mut q: MqfqQueue<u8> = MqfqQueue::new(cfg()).unwrap();
        let f = q.flow_in("f", Some("t"));
        q.enqueue(f, 1, Time::ZERO).unwrap();
        let d = q.dispatch(Time::ZERO).unwrap();
        q.complete(&d.ticket, Some(1.0), Time::ZERO).unwrap();
        q.tick(Time::from_secs_f64(1.0));
        assert_eq!(
            q.forget_idle(Time::from_secs_f64(5.0), 10.0),
            Vec::<String>::new()
        );
        assert_eq!(q.forget_idle(Time::from_secs_f64(20.0), 10.0), ["f"]);
        assert_eq!((q.flow_count(), q.tenant_count()), (0, 0));
        assert!(q.snapshots().is_empty());
        // The slot is reused.
        assert_eq!(q.flow("g"), f);
        assert_eq!(q.snapshot(f).unwrap().key, "g");
    }
}
