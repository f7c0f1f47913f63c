//! A tenant's share of a GPU's slots. Virtual time shares *service*, but a slot is held for a
//! whole burst or run, and a tenant whose flows keep the lowest tags (many containers, short
//! charges) would take every slot that frees while another tenant's work waits. So while work of
//! another tenant waits on a GPU and could take the slot (its memory fits), a tenant that holds
//! its weighted share of the GPU's slots — ⌈limit × its weight / the competing tenants' weights⌉,
//! at least one — takes no more. A slot no other tenant can use still goes to it: the cap never
//! leaves a slot idle (work conservation). Containers without a tenant count as one tenant here
//! (the queue weighs each tenantless flow as a tenant of its own): a node with tenants off has
//! one flat queue and no cap, and one that mixes the two gives the tenantless flows one share.

use std::collections::{HashMap, HashSet};

use super::Core;
use crate::FlowId;

impl Core {
    /// For GPU `slot` under a limit of `limit` leases: whether a flow's tenant may take another
    /// slot now (see the module docs). Accepts every flow while fewer than two tenants compete.
    pub(super) fn share_test(&self, slot: usize, limit: u32) -> impl Fn(FlowId) -> bool + '_ {
        let index = self.gpus[slot].info.index;
        let fits = self.fit_test(slot);
        let mut held: HashMap<Option<&str>, u32> = HashMap::new();
        for l in self.leases.values().filter(|l| l.gpu == index) {
            *held.entry(l.tenant.as_deref()).or_default() += 1;
        }
        // Each waiting flow's tenant (a flow is one function of one tenant), and the tenants
        // whose waiting work could take a slot.
        let mut tenant_of: HashMap<FlowId, Option<&str>> = HashMap::new();
        for w in self.waiting.values().filter(|w| w.gpu == index) {
            tenant_of.insert(w.flow, w.tenant.as_deref());
        }
        // One tenant (or none) here: nothing to share, and no fit test to run.
        let tenants: HashSet<Option<&str>> =
            held.keys().chain(tenant_of.values()).copied().collect();
        let mut ready: HashSet<Option<&str>> = HashSet::new();
        if tenants.len() >= 2 {
            for (&flow, &t) in &tenant_of {
                if !ready.contains(&t) && fits(flow) {
                    ready.insert(t);
                }
            }
        }
        let competing: HashSet<Option<&str>> = held.keys().chain(ready.iter()).copied().collect();
        let q = &self.gpus[slot].queue;
        let weight = |t: Option<&str>| t.and_then(|t| q.tenant_weight(t)).unwrap_or(1.0);
        let total: f64 = competing.iter().map(|&t| weight(t)).sum();
        move |flow| {
            if competing.len() < 2 {
                return true;
            }
            let Some(&t) = tenant_of.get(&flow) else {
                return true;
            };
            if !ready.iter().any(|&o| o != t) {
                return true;
            }
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "slots: limit × a positive weight share, ceiled; saturating lifts the cap"
            )]
            let share = ((f64::from(limit) * weight(t) / total).ceil() as u32).max(1);
            held.get(&t).copied().unwrap_or(0) < share
        }
    }
}

#[cfg(test)]
mod tests;
