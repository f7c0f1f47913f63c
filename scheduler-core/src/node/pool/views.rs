//! What the pool tells the rest of the node, read-only: each function's residency and
//! footprint for the admission queue, where its warm containers are for placement, the
//! gauges' counts and the status listing. Apart from the decisions (`pool.rs`) they read.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

impl Pool {
    /// Whether the pool holds `key`.
    #[must_use]
    pub fn knows(&self, key: &ContainerKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The tier pooled container `key` is in.
    #[must_use]
    pub fn tier(&self, key: &ContainerKey) -> Option<Tier> {
        self.entries.get(key).map(|e| e.tier)
    }

    /// The order in flight for pooled container `key`, if any.
    #[must_use]
    pub fn pending(&self, key: &ContainerKey) -> Option<Action> {
        self.entries
            .get(key)
            .and_then(|e| e.pending.map(|(a, _)| a))
    }

    /// Bytes the Hot containers on `gpu` hold, as their shims last reported (what a simulated
    /// GPU, which sees no processes, has in use).
    #[must_use]
    pub fn hot_bytes(&self, gpu: u32) -> u64 {
        self.entries
            .values()
            .filter(|e| e.gpu == gpu && e.tier == Tier::Hot)
            .fold(0u64, |sum, e| sum.saturating_add(e.bytes))
    }

    /// Host memory below `host_headroom` at the last tick that read it, in bytes, which the pool
    /// cannot free because it does not reclaim (0: none short, or reclaiming).
    #[must_use]
    pub fn host_short(&self) -> u64 {
        self.host_short
    }

    /// Managed bytes and native bytes per function (summed over its pooled containers), for the
    /// gauges; recounted with [`Pool::tier_counts`].
    #[must_use]
    pub fn memory_by_function(&self) -> BTreeMap<String, (u64, Native)> {
        let mut m: BTreeMap<String, (u64, Native)> = BTreeMap::new();
        for e in self.entries.values() {
            let slot = m.entry(e.function.clone()).or_default();
            slot.0 = slot.0.saturating_add(e.bytes);
            slot.1.add(&e.native);
        }
        m
    }

    /// Containers per (function, tier) when that changed since the last call, else `None`: the
    /// sampler refreshes the gauges only then, not by walking the pool every 100 ms.
    pub fn tier_counts(&mut self) -> Option<TierCounts> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let mut counts = TierCounts::new();
        for e in self.entries.values() {
            *counts.entry((e.function.clone(), e.tier)).or_default() += 1;
        }
        Some(counts)
    }

    /// What the admission queue should know of each pooled function's memory, per GPU holding a
    /// pooled container of it: resident there when an idle container of it there is Hot;
    /// otherwise what serving it there would cost first, in seconds (the restore of its
    /// cheapest Warm container there; 0 when only Cold ones are left: a cold start's cost is not
    /// known here). A GPU not listed holds none of it. Every function that had a pooled container
    /// is listed (with no GPU once none is left) until its flow is forgotten. Sorted by function.
    #[must_use]
    pub fn residency(&self) -> Vec<(String, ByGpu)> {
        let mut out: BTreeMap<&str, BTreeMap<u32, (bool, f64)>> = self
            .functions
            .iter()
            .map(|f| (f.as_str(), BTreeMap::new()))
            .collect();
        for e in self.entries.values() {
            let r = out
                .entry(&e.function)
                .or_default()
                .entry(e.gpu)
                .or_insert((false, f64::INFINITY));
            match e.tier {
                Tier::Hot if !e.busy => r.0 = true,
                Tier::Warm if !e.busy => r.1 = r.1.min(Self::reload_cost(e)),
                _ => {}
            }
        }
        out.into_iter()
            .map(|(f, gpus)| {
                let gpus = gpus
                    .into_iter()
                    .map(|(g, (resident, cost))| {
                        let cost = if resident || !cost.is_finite() {
                            0.0
                        } else {
                            cost
                        };
                        (g, (resident, cost))
                    })
                    .collect();
                (f.to_owned(), gpus)
            })
            .collect()
    }

    /// What each function's containers hold on a GPU as far as the pool measured (the largest of
    /// its containers' bytes: what their shims reported, or what the driver measured their
    /// processes holding, context included, where that is more), for memory admission;
    /// functions with nothing measured are left out. Sorted by function.
    #[must_use]
    pub fn footprints(&self) -> Vec<(String, u64)> {
        let mut out: BTreeMap<&str, u64> = BTreeMap::new();
        for e in self.entries.values() {
            let held = e.bytes.max(e.resident);
            if held > 0 {
                let b = out.entry(&e.function).or_default();
                *b = (*b).max(held);
            }
        }
        out.into_iter().map(|(f, b)| (f.to_owned(), b)).collect()
    }

    /// The GPUs holding a Hot container of `function`, idle or serving a call: its memory is
    /// there (placement's locality; how soon a call could start there is [`Pool::start_costs`]).
    #[must_use]
    pub fn hot_gpus(&self, function: &str) -> BTreeSet<u32> {
        self.presence(function).0
    }

    /// Per GPU holding an idle container of `function`: how long before it could serve a call
    /// there, seconds — 0 for a Hot one, the restore of the cheapest Warm one (or of a Hot one
    /// with an eviction in flight) otherwise. A GPU not listed has no idle container of it (a
    /// call there would start one cold).
    #[must_use]
    pub fn start_costs(&self, function: &str) -> BTreeMap<u32, f64> {
        self.presence(function).1
    }

    /// [`Pool::hot_gpus`] and [`Pool::start_costs`] in one pass over the pool, as placement
    /// asks for both at every choice.
    #[must_use]
    pub fn presence(&self, function: &str) -> (BTreeSet<u32>, BTreeMap<u32, f64>) {
        let mut hot = BTreeSet::new();
        let mut start: BTreeMap<u32, f64> = BTreeMap::new();
        for e in self.entries.values().filter(|e| e.function == function) {
            if e.tier == Tier::Hot {
                hot.insert(e.gpu);
            }
            let cost = match e.tier {
                _ if e.busy => continue,
                Tier::Hot if matches!(e.pending, Some((Action::Evict, _))) => Self::reload_cost(e),
                Tier::Hot => 0.0,
                Tier::Warm => Self::reload_cost(e),
                Tier::Cold => continue,
            };
            let c = start.entry(e.gpu).or_insert(cost);
            *c = c.min(cost);
        }
        (hot, start)
    }

    /// Every pooled container.
    #[must_use]
    pub fn entries(&self, now: Time) -> Vec<EntryView> {
        self.entries
            .iter()
            .map(|(k, e)| EntryView {
                key: k.clone(),
                function: e.function.clone(),
                gpu: e.gpu,
                tier: e.tier,
                bytes: e.bytes,
                busy: e.busy,
                idle_ns: if e.busy {
                    0
                } else {
                    now.as_nanos().saturating_sub(e.last_used.as_nanos())
                },
                pending: e.pending.map(|(a, _)| a),
                uses: e.uses,
                native: e.native,
                resident: e.resident,
            })
            .collect()
    }
}
