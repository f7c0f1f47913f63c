//! The pool's share of the metrics: tier moves, backend work, tier counts and the native
//! memory each function's containers hold, as mqfqd's pool loop reports them.

use scheduler_core::native::Native;
use scheduler_core::node::pool::{PoolEvent, TierCounts};

use super::{Labels, Metrics, function};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn tier_name(t: scheduler_core::tiers::Tier) -> &'static str {
    match t {
        scheduler_core::tiers::Tier::Hot => "hot",
        scheduler_core::tiers::Tier::Warm => "warm",
        scheduler_core::tiers::Tier::Cold => "cold",
    }
}

impl Metrics {
    /// Accounts pool events.
    pub fn pool(&self, events: &[PoolEvent]) {
        for e in events {
            match e {
                PoolEvent::Hit(t) => {
                    self.pool_hits
                        .get_or_create(&labels(&[("tier", tier_name(*t))]))
                        .inc();
                }
                PoolEvent::Moved {
                    action,
                    ok,
                    bytes,
                    seconds,
                } => {
                    let result = if *ok { "ok" } else { "error" };
                    self.pool_moves
                        .get_or_create(&labels(&[("action", action.name()), ("result", result)]))
                        .inc();
                    if !*ok {
                        continue;
                    }
                    let dir = match action {
                        scheduler_core::node::pool::Action::Evict => "to_host",
                        scheduler_core::node::pool::Action::Prefetch
                        | scheduler_core::node::pool::Action::Restore => "to_device",
                        scheduler_core::node::pool::Action::Reclaim => continue,
                    };
                    self.pool_bytes
                        .get_or_create(&labels(&[("direction", dir)]))
                        .inc_by(*bytes);
                    if *action == scheduler_core::node::pool::Action::Restore {
                        self.pool_restore.observe(*seconds);
                    }
                }
            }
        }
    }

    /// Counts one move a shim reported, by its container's Warm-tier backend.
    pub fn pool_backend(&self, backend: &str, action: &str, ok: bool, bytes: u64) {
        let result = if ok { "ok" } else { "error" };
        self.pool_backend_moves
            .get_or_create(&labels(&[
                ("backend", backend),
                ("action", action),
                ("result", result),
            ]))
            .inc();
        if ok {
            // A shim's figure, capped at 1 TiB a move (more than any GPU holds): a hostile one
            // would need millions of reports to wrap the counter.
            self.pool_backend_bytes
                .get_or_create(&labels(&[("backend", backend), ("action", action)]))
                .inc_by(bytes.min(1 << 40));
        }
    }

    /// Sets the pool gauges (per tier, and per function and tier).
    pub fn pool_gauges(&self, counts: &TierCounts) {
        let mut tiers: std::collections::BTreeMap<&str, i64> =
            [("hot", 0), ("warm", 0), ("cold", 0)].into_iter().collect();
        // Functions come and go: the family is rebuilt.
        self.pool_function_containers.clear();
        for ((f, t), n) in counts {
            let t = tier_name(*t);
            *tiers.entry(t).or_default() += n;
            self.pool_function_containers
                .get_or_create(&labels(&[("function", f), ("tier", t)]))
                .set(*n);
        }
        for (t, n) in tiers {
            self.pool_containers
                .get_or_create(&labels(&[("tier", t)]))
                .set(n);
        }
    }

    /// Sets the per-function memory gauges: managed bytes, native bytes by reason (only the
    /// reasons that hold bytes), refused exports.
    pub fn pool_memory(&self, memory: &std::collections::BTreeMap<String, (u64, Native)>) {
        let g = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        // Functions come and go: the families are rebuilt.
        self.pool_function_memory.clear();
        self.pool_function_refused.clear();
        for (f, (managed, native)) in memory {
            self.pool_function_memory
                .get_or_create(&labels(&[("function", f), ("kind", "managed")]))
                .set(g(*managed));
            for (why, bytes) in native.reasons().into_iter().filter(|(_, b)| *b > 0) {
                self.pool_function_memory
                    .get_or_create(&labels(&[("function", f), ("kind", why)]))
                    .set(g(bytes));
            }
            self.pool_function_refused
                .get_or_create(&function(f))
                .set(g(native.refused));
        }
    }
}
