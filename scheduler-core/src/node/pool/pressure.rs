//! The pool's pressure: what moves containers between tiers when memory runs short or time
//! passes — making room on a GPU, prefetching an Active function's Warm containers, TTL expiry,
//! host-memory pressure, a failed GPU — apart from the bookkeeping of what containers hold
//! (`pool.rs`).

use super::*;

impl Pool {
    /// Bytes in use on a GPU as far as the pool can tell, counting prefetches in flight and not
    /// evictions in flight. The sampled figure where the driver measures it; elsewhere (a
    /// simulated GPU, which sees no containers) what Hot containers hold, never less than the
    /// last sample (a figure from before an eviction counts until the next one).
    pub(super) fn in_use(&self, gpu: u32) -> (u64, u64) {
        let (sampled, total) = self.memory.get(&gpu).copied().unwrap_or((0, 0));
        let mut hot = 0u64;
        let mut coming = 0u64;
        let mut going = 0u64;
        for e in self.entries.values().filter(|e| e.gpu == gpu) {
            if e.tier == Tier::Hot {
                hot = hot.saturating_add(e.bytes);
            }
            match e.pending {
                Some((Action::Prefetch, _)) => coming = coming.saturating_add(e.bytes),
                Some((Action::Evict, _)) => going = going.saturating_add(e.bytes),
                _ => {}
            }
        }
        let base = if self.measured {
            sampled
        } else {
            sampled.max(hot)
        };
        (base.saturating_add(coming).saturating_sub(going), total)
    }

    pub(super) fn free_in_budget(&self, gpu: u32) -> u64 {
        let (used, total) = self.in_use(gpu);
        self.policy.budget(total).saturating_sub(used)
    }

    fn orderable(e: &Entry, now: Time) -> bool {
        !e.busy && e.pending.is_none() && now >= e.backoff_until
    }

    /// Evicts idle Hot containers of `gpu` until `need` more bytes fit under the budget.
    pub(super) fn make_room(&mut self, gpu: u32, need: u64, now: Time) {
        let free = self.free_in_budget(gpu);
        if need <= free {
            return;
        }
        let views: Vec<(ContainerKey, ContainerView)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.gpu == gpu && e.tier == Tier::Hot && Self::orderable(e, now))
            .enumerate()
            .map(|(i, (k, e))| {
                let active = self
                    .calls
                    .get(&e.function)
                    .is_some_and(|c| self.function_active(c, now));
                (
                    k.clone(),
                    ContainerView {
                        id: i as u64,
                        tier: e.tier,
                        busy: e.busy,
                        flow_active: active,
                        bytes: e.bytes,
                        last_used: e.last_used,
                        uses: e.uses,
                        reload_cost_s: Self::reload_cost(e),
                        priority: e.priority,
                    },
                )
            })
            .collect();
        let cands: Vec<ContainerView> = views.iter().map(|(_, v)| *v).collect();
        let victims = self.policy.choose_victims(&cands, need, free);
        if !victims.is_empty() {
            self.last_pressure.insert(gpu, now);
        }
        for id in victims {
            let Ok(i) = usize::try_from(id) else { continue };
            let key = views[i].0.clone();
            if let Some(e) = self.entries.get_mut(&key) {
                e.evicted_for = Why::Pressure;
            }
            self.order(&key, Action::Evict, now);
        }
    }

    /// Whether a function counts as active for victim choice: called within its sticky window
    /// (the prediction window of the tier policy).
    fn function_active(&self, c: &Calls, now: Time) -> bool {
        self.policy
            .predicts_arrival(now, Some(c.last), c.mean_iat_s)
    }

    /// Prefetches the idle Warm containers of `function` on `gpu` whose known size fits under the
    /// budget.
    fn prefetch_function(&mut self, gpu: u32, function: &str, only_pressure: bool, now: Time) {
        let keys: Vec<(ContainerKey, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.gpu == gpu
                    && e.function == function
                    && e.tier == Tier::Warm
                    && Self::orderable(e, now)
                    && (!only_pressure || e.evicted_for == Why::Pressure)
            })
            .map(|(k, e)| (k.clone(), e.bytes))
            .collect();
        let mut free = self.free_in_budget(gpu);
        for (key, bytes) in keys {
            // A size not known (nothing believable reported) cannot be shown to fit: such a
            // container is restored at its next admission instead.
            if bytes > 0 && bytes <= free {
                // As `in_use` will count it from now: a prefetch in flight.
                free -= bytes;
                self.order(&key, Action::Prefetch, now);
            }
        }
    }

    /// A flow turned Active: its Warm containers are prefetched where they fit.
    pub fn activated(&mut self, gpu: u32, function: &str, now: Time) {
        self.prefetch_function(gpu, function, false, now);
    }

    /// GPU `gpu` failed: its idle containers go Cold (reclaimed where reclaim is on), so that
    /// their functions start again where placement sends them instead of waiting on a GPU that
    /// cannot run them. Busy ones are left to end. Returns how many went.
    pub fn gpu_failed(&mut self, gpu: u32, now: Time) -> usize {
        let idle: Vec<ContainerKey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.gpu == gpu && e.tier != Tier::Cold && Self::orderable(e, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &idle {
            self.make_cold(k, now);
        }
        idle.len()
    }

    /// Timers and pressure: TTL expiry, GPU-memory pressure, predicted arrivals, host-memory
    /// pressure (`host`: available and total bytes, when known).
    pub fn tick(&mut self, now: Time, host: Option<(u64, u64)>) {
        // Orders never answered are given up.
        for e in self.entries.values_mut() {
            if let Some((_, since)) = e.pending
                && now.secs_since(since) > ORDER_TIMEOUT_S
            {
                e.pending = None;
            }
        }
        // Host memory first: whether it is short decides whether idle containers may move there.
        match host {
            Some((avail, total)) => self.host_pressure(avail, total, now),
            // Not read this time: nothing known to be short.
            None => self.host_short = 0,
        }
        self.expire(now);
        // GPU-memory pressure.
        // In GPU order: the same inputs give the same orders, in the same order.
        let mut gpus: Vec<u32> = self.memory.keys().copied().collect();
        gpus.sort_unstable();
        for gpu in gpus {
            let (used, total) = self.in_use(gpu);
            let budget = self.policy.budget(total);
            if total > 0 && used > budget {
                self.make_room(gpu, used - budget, now);
            }
        }
        // Predicted arrivals: pressure victims of functions whose next call is due, on GPUs
        // that have had no pressure for a while — where memory is contended, a container
        // brought back ahead of its call takes the room the next admitted run needs, is evicted
        // again, and its two moves delay that run's restore on the same link.
        let quiet = |gpu: u32| {
            self.last_pressure
                .get(&gpu)
                .is_none_or(|&t| now.secs_since(t) >= PRESSURE_QUIET_S)
        };
        let due: Vec<(u32, String)> = self
            .entries
            .values()
            .filter(|e| e.tier == Tier::Warm && e.evicted_for == Why::Pressure)
            .filter(|e| quiet(e.gpu))
            .filter(|e| {
                self.calls
                    .get(&e.function)
                    .is_some_and(|c| self.function_active(c, now))
            })
            .map(|e| (e.gpu, e.function.clone()))
            .collect();
        for (gpu, f) in due {
            self.prefetch_function(gpu, &f, true, now);
        }
    }

    /// TTLs: Hot past the hot TTL is evicted (not while host memory is short without
    /// `reclaim`), Warm past the warm TTL goes Cold.
    fn expire(&mut self, now: Time) {
        let mut ttl: Vec<(ContainerKey, crate::tiers::TierMove)> = Vec::new();
        for (k, e) in &self.entries {
            if !Self::orderable(e, now) || e.tier == Tier::Cold {
                continue;
            }
            let view = ContainerView {
                id: 0,
                tier: e.tier,
                busy: e.busy,
                flow_active: false,
                bytes: e.bytes,
                last_used: e.last_used,
                uses: e.uses,
                reload_cost_s: Self::reload_cost(e),
                priority: e.priority,
            };
            if let Some(m) = self.policy.expiry(&view, now) {
                ttl.push((k.clone(), m));
            }
        }
        for (k, m) in ttl {
            match m {
                // Host memory short and nothing the pool may free: an idle container moving to
                // host memory only for its TTL would add to it (GPU pressure still evicts).
                crate::tiers::TierMove::Evict if self.host_short > 0 => {}
                crate::tiers::TierMove::Evict => {
                    if let Some(e) = self.entries.get_mut(&k) {
                        e.evicted_for = Why::Ttl;
                    }
                    self.order(&k, Action::Evict, now);
                }
                _ => self.make_cold(&k, now),
            }
        }
    }

    /// Host memory below its headroom: with `reclaim`, Warm containers, least recently used
    /// first, are reclaimed until enough bytes are given up. Without it the node can free none
    /// of them (the platform owns their lifetimes), and calling them Cold would only make the
    /// core price their restore as a cold start: the shortage is kept for the daemon to say.
    fn host_pressure(&mut self, avail: u64, total: u64, now: Time) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "host bytes, far below 2^52, times a share in [0, 1): fit u64, >= 0"
        )]
        let floor = (total as f64 * self.host_headroom) as u64;
        // Kept only where nothing can be freed; with `reclaim` the orders below free it.
        self.host_short = if self.reclaim {
            0
        } else {
            floor.saturating_sub(avail)
        };
        if avail >= floor || !self.reclaim {
            return;
        }
        let mut warm: Vec<(Time, ContainerKey, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.tier == Tier::Warm && Self::orderable(e, now))
            .map(|(k, e)| (e.last_used, k.clone(), e.bytes))
            .collect();
        warm.sort();
        let mut short = floor - avail;
        for (_, k, bytes) in warm {
            if short == 0 {
                break;
            }
            self.make_cold(&k, now);
            short = short.saturating_sub(bytes);
        }
    }

    pub(super) fn make_cold(&mut self, key: &ContainerKey, now: Time) {
        if self.reclaim {
            self.order(key, Action::Reclaim, now);
        } else if let Some(e) = self.entries.get_mut(key) {
            e.tier = Tier::Cold;
            self.changed = true;
        }
    }
}
