//! Container tiers (Hot / Warm / Cold) and the decisions that move containers between them.
//!
//! - **Hot**: the container's memory is on the GPU; running again costs nothing extra.
//! - **Warm**: memory evicted to host through unified memory; running again costs a prefetch of its
//!   resident bytes over PCIe.
//! - **Cold**: no container (never created, or dropped); running again costs a cold start.
//!
//! This module only decides; the pool manager (and the simulator) act.
//!
//! # Victim ranking: GreedyDual-Size-Frequency
//! Under GPU-memory pressure, idle Hot containers of **inactive** flows go first, least recently
//! used first (their flows promised no residency). Then idle containers of active flows, lowest
//! GDSF priority first. A container's priority is set each time it is used:
//! `H = L + frequency × reload_cost / size`, where `L` is the priority of the last victim. `L`
//! only grows, so a container not used for a while falls behind those used since (recency),
//! one used often climbs (frequency), and a big or cheap-to-reload one sits lower (size, cost). GDSF was chosen over LRU-K
//! because it weighs all three things the design asks for in one number with no window to tune:
//! frequency (uses), footprint (size: evicting one large container frees what several small ones
//! would) and recency (through `L`); and it takes the reload cost, which differs by orders of
//! magnitude between a 20 ms function and a multi-GB model. FaasCache (ASPLOS'21) showed it
//! beating LRU for function keep-alive.

use serde::Serialize;

use crate::config::TierConfig;
use crate::time::Time;

/// Where a container's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Memory on the GPU.
    Hot,
    /// Memory on the host (unified memory, evicted).
    Warm,
    /// No container.
    Cold,
}

/// A move between tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TierMove {
    /// Cold → Hot: a container is created.
    Create,
    /// Hot → Warm: memory pushed to host.
    Evict,
    /// Warm → Hot: memory prefetched back.
    Prefetch,
    /// Warm → Cold or Hot → Cold: the container is dropped.
    Drop,
}

/// A move that makes no sense from a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {mv:?} a {from:?} container")]
pub struct TierError {
    /// The tier the container was in.
    pub from: Tier,
    /// The move asked for.
    pub mv: TierMove,
}

impl Tier {
    /// The tier after `mv`, or an error for a move that is not allowed from here.
    ///
    /// # Errors
    /// [`TierError`] for e.g. evicting a Warm container or prefetching a Cold one.
    pub fn apply(self, mv: TierMove) -> Result<Tier, TierError> {
        match (self, mv) {
            (Tier::Cold, TierMove::Create) | (Tier::Warm, TierMove::Prefetch) => Ok(Tier::Hot),
            (Tier::Hot, TierMove::Evict) => Ok(Tier::Warm),
            (Tier::Hot | Tier::Warm, TierMove::Drop) => Ok(Tier::Cold),
            (from, mv) => Err(TierError { from, mv }),
        }
    }
}

/// What the policy needs to know about a container.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ContainerView {
    /// The caller's handle for the container.
    pub id: u64,
    /// Its tier.
    pub tier: Tier,
    /// Whether it is serving an invocation now (never a victim).
    pub busy: bool,
    /// Whether its function's flow is Active (or has work waiting).
    pub flow_active: bool,
    /// Bytes on the GPU when Hot.
    pub bytes: u64,
    /// Last time it served an invocation (or was created).
    pub last_used: Time,
    /// Invocations it has served.
    pub uses: u64,
    /// Seconds it would cost to bring it back if evicted.
    pub reload_cost_s: f64,
    /// Its GDSF priority, as returned by [`TierPolicy::credit`] at its last use.
    pub priority: f64,
}

/// The tier policy: TTLs, the memory budget, victim choice, prefetch triggers.
#[derive(Clone, Debug, Serialize)]
pub struct TierPolicy {
    cfg: TierConfig,
    inflation: f64,
}

impl TierPolicy {
    /// A policy with validated knobs.
    ///
    /// # Errors
    /// [`crate::ConfigError`] naming a bad knob.
    pub fn new(cfg: TierConfig) -> Result<Self, crate::ConfigError> {
        cfg.validate()?;
        Ok(TierPolicy {
            cfg,
            inflation: 0.0,
        })
    }

    /// The knobs.
    #[must_use]
    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }

    /// Bytes of a GPU's memory that Hot containers may use: capacity minus headroom.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "GPU bytes, far below 2^52, times a share in (0, 1]: fit u64, >= 0"
    )]
    pub fn budget(&self, capacity_bytes: u64) -> u64 {
        (capacity_bytes as f64 * (1.0 - self.cfg.headroom)) as u64
    }

    /// The GDSF priority a container earns when it is used (higher = keep): the current
    /// inflation plus `uses × reload_cost / size`. Store it with the container.
    #[must_use]
    #[expect(
        clippy::cast_precision_loss,
        reason = "bytes and use counts: a priority needs no exact bits"
    )]
    pub fn credit(&self, uses: u64, reload_cost_s: f64, bytes: u64) -> f64 {
        let size_mb = (bytes as f64 / (1024.0 * 1024.0)).max(1.0);
        self.inflation + (uses.max(1) as f64) * reload_cost_s.max(0.0) / size_mb
    }

    /// The inflation `L` (priority of the last active-flow victim).
    #[must_use]
    pub fn inflation(&self) -> f64 {
        self.inflation
    }

    /// Chooses idle Hot containers to evict so that `need` more bytes fit when `free` bytes are
    /// free now. Returns victims in eviction order; if even all idle Hot containers are not enough
    /// it returns all of them (the caller decides whether to wait). Ages the GDSF clock.
    pub fn choose_victims(
        &mut self,
        candidates: &[ContainerView],
        need: u64,
        free: u64,
    ) -> Vec<u64> {
        if need <= free {
            return Vec::new();
        }
        let mut idle: Vec<&ContainerView> = candidates
            .iter()
            .filter(|c| c.tier == Tier::Hot && !c.busy)
            .collect();
        idle.sort_by(|a, b| {
            // Inactive flows first, by last use; then active flows, by GDSF priority.
            a.flow_active.cmp(&b.flow_active).then_with(|| {
                if a.flow_active {
                    a.priority.total_cmp(&b.priority)
                } else {
                    a.last_used.cmp(&b.last_used)
                }
            })
        });
        let mut freed = free;
        let mut out = Vec::new();
        for c in idle {
            if freed >= need {
                break;
            }
            if c.flow_active {
                self.inflation = self.inflation.max(c.priority);
            }
            freed = freed.saturating_add(c.bytes);
            out.push(c.id);
        }
        out
    }

    /// The TTL move due for an idle container at `now`, if any: Hot past the hot TTL is evicted,
    /// Warm past the warm TTL is dropped.
    #[must_use]
    pub fn expiry(&self, c: &ContainerView, now: Time) -> Option<TierMove> {
        if c.busy {
            return None;
        }
        let idle = now.secs_since(c.last_used);
        match c.tier {
            Tier::Hot if idle >= self.cfg.hot_ttl_s => Some(TierMove::Evict),
            Tier::Warm if idle >= self.cfg.warm_ttl_s => Some(TierMove::Drop),
            _ => None,
        }
    }

    /// Predicted arrival: prefetch a function's Warm memory when the time since its last call is
    /// below `prefetch_iat × mean inter-arrival time`.
    #[must_use]
    pub fn predicts_arrival(
        &self,
        now: Time,
        last_call: Option<Time>,
        mean_iat_s: Option<f64>,
    ) -> bool {
        match (last_call, mean_iat_s) {
            (Some(last), Some(iat)) if iat > 0.0 => {
                now.secs_since(last) < self.cfg.prefetch_iat * iat
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1024 * 1024;

    fn c(id: u64, active: bool, mb: u64, last: f64, uses: u64, cost: f64) -> ContainerView {
        let p = TierPolicy::new(TierConfig::default()).unwrap();
        ContainerView {
            id,
            tier: Tier::Hot,
            busy: false,
            flow_active: active,
            bytes: mb * MB,
            last_used: Time::from_secs_f64(last),
            uses,
            reload_cost_s: cost,
            priority: p.credit(uses, cost, mb * MB),
        }
    }

    #[test]
    fn tier_state_machine() {
        assert_eq!(Tier::Cold.apply(TierMove::Create), Ok(Tier::Hot));
        assert_eq!(Tier::Hot.apply(TierMove::Evict), Ok(Tier::Warm));
        assert_eq!(Tier::Warm.apply(TierMove::Prefetch), Ok(Tier::Hot));
        assert_eq!(Tier::Warm.apply(TierMove::Drop), Ok(Tier::Cold));
        assert_eq!(
            Tier::Warm.apply(TierMove::Evict),
            Err(TierError {
                from: Tier::Warm,
                mv: TierMove::Evict
            })
        );
        Tier::Cold.apply(TierMove::Prefetch).unwrap_err();
        Tier::Hot.apply(TierMove::Create).unwrap_err();
    }

    #[test]
    fn inactive_first_by_lru_then_gdsf() {
        let mut p = TierPolicy::new(TierConfig::default()).unwrap();
        let mut busy = c(9, false, 1000, 0.0, 1, 1.0);
        busy.busy = true;
        let cands = [
            c(1, true, 1000, 1.0, 100, 0.5), // frequent, active: keep
            c(2, false, 1000, 5.0, 1, 0.5),  // inactive, newer
            c(3, false, 1000, 2.0, 1, 0.5),  // inactive, older: first
            c(4, true, 1000, 9.0, 1, 0.5),   // active, rare: before 1
            busy,
        ];
        assert_eq!(p.choose_victims(&cands, 500 * MB, 0), vec![3]);
        assert_eq!(p.choose_victims(&cands, 2500 * MB, 0), vec![3, 2, 4]);
        assert_eq!(
            p.choose_victims(&cands, 100 * MB, 200 * MB),
            Vec::<u64>::new()
        );
        assert_eq!(
            p.choose_victims(&cands, 100_000 * MB, 0),
            vec![3, 2, 4, 1],
            "never the busy one"
        );
    }

    #[test]
    fn gdsf_weighs_size_and_cost() {
        let small_costly = c(1, true, 100, 0.0, 1, 2.0);
        let big_cheap = c(2, true, 8000, 0.0, 1, 2.0);
        assert!(small_costly.priority > big_cheap.priority);
    }

    #[test]
    fn gdsf_ages_what_was_not_used_since() {
        let mut p = TierPolicy::new(TierConfig::default()).unwrap();
        // A was used 10 times long ago; B once, but after an eviction raised L.
        let a = ContainerView {
            priority: p.credit(10, 1.0, 1024 * MB),
            ..c(1, true, 1024, 0.0, 10, 1.0)
        };
        let victim = ContainerView {
            priority: 0.05,
            ..c(9, true, 1024, 0.0, 1, 1.0)
        };
        assert_eq!(p.choose_victims(&[victim], 1, 0), vec![9]);
        assert_eq!(p.inflation(), 0.05);
        let b = ContainerView {
            priority: p.credit(1, 1.0, 1024 * MB),
            ..c(2, true, 1024, 5.0, 1, 1.0)
        };
        assert!(
            b.priority > a.priority,
            "recent use outranks old frequency once L moved"
        );
        assert_eq!(p.choose_victims(&[a, b], 1, 0), vec![1]);
    }

    #[test]
    fn ttls_and_budget_and_prediction() {
        let p = TierPolicy::new(TierConfig::default()).unwrap();
        let hot = c(1, false, 10, 0.0, 1, 1.0);
        assert_eq!(p.expiry(&hot, Time::from_secs_f64(1799.0)), None);
        assert_eq!(
            p.expiry(&hot, Time::from_secs_f64(1800.0)),
            Some(TierMove::Evict)
        );
        let warm = ContainerView {
            tier: Tier::Warm,
            ..hot
        };
        assert_eq!(
            p.expiry(&warm, Time::from_secs_f64(7200.0)),
            Some(TierMove::Drop)
        );
        assert_eq!(p.budget(1000), 850);
        let now = Time::from_secs_f64(10.0);
        assert!(p.predicts_arrival(now, Some(Time::from_secs_f64(6.0)), Some(1.0)));
        assert!(!p.predicts_arrival(now, Some(Time::from_secs_f64(4.0)), Some(1.0)));
        assert!(!p.predicts_arrival(now, None, Some(1.0)));
    }
}
