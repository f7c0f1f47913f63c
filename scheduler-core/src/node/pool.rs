//! The pool manager's decisions (issue 6), without I/O: which idle GPU containers keep their
//! memory on the GPU (Hot), which are evicted to host memory through unified memory (Warm), and
//! which the pool gives up on (Cold), using `scheduler-core`'s [`TierPolicy`].
//!
//! The daemon decides; the shim that owns a container acts (it alone can thaw a paused container
//! for the interposer to move its memory, serialized with its own Pause / Resume) and reports
//! back. So this module turns what the daemon sees (grants, releases, flows turning Active, GPU
//! and host memory, time) into [`Order`]s, and order results into tier moves:
//!
//! - A pooled container is Hot after its lease ends at Pause (its memory stays on the GPU).
//! - Hot → Warm at hot-TTL expiry, or under GPU-memory pressure (more in use than capacity minus
//!   headroom): idle containers of inactive flows first, then by GDSF priority.
//! - Warm → Hot when its flow turns Active, or when an arrival is predicted for a container that
//!   pressure evicted — only if its bytes fit under the budget (never a prefetch that would force
//!   another eviction). A Warm container that is admitted is restored by its shim at Resume
//!   before the task runs; room is made for it first.
//! - Warm → Cold at warm-TTL expiry or under host-memory pressure; a Cold container is killed
//!   only when `reclaim` is on (off by default: FaaS platforms own container lifetime).
//!
//! The shim keeps the truth about its containers' memory (it knows whether it evicted them); the
//! daemon's view may lag by one report, never decide wrongly for safety: an order for a
//! container that is no longer idle is skipped by the shim and changes nothing here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::Time;
use crate::config::TierConfig;
use crate::tiers::{ContainerView, Tier, TierPolicy};
use serde::Serialize;

use crate::native::Native;
use crate::node::ContainerKey;

/// What the pool asks a shim to do with a container (and, for `Restore`, what a shim reports
/// doing on its own at Resume).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Move its memory to the host (Hot → Warm).
    Evict,
    /// Move its memory back to the GPU (Warm → Hot) while it stays idle.
    Prefetch,
    /// Kill it (Cold, with `reclaim` on).
    Reclaim,
    /// Its shim brought its memory back at Resume (reports only).
    Restore,
}

impl Action {
    /// Lower-case name (metrics, status).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Action::Evict => "evict",
            Action::Prefetch => "prefetch",
            Action::Reclaim => "reclaim",
            Action::Restore => "restore",
        }
    }
}

/// An order for the shim `shim_pid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// The container.
    pub key: ContainerKey,
    /// The shim that owns the container.
    pub shim_pid: u32,
    /// What to do.
    pub action: Action,
}

/// Where a function's memory is, by GPU index: whether it is resident there (an idle container of
/// it is Hot) and what serving it there would cost first, seconds ([`Pool::residency`]).
pub type ByGpu = BTreeMap<u32, (bool, f64)>;

/// What a shim reports about one action.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The container.
    pub key: ContainerKey,
    /// The action.
    pub action: Action,
    /// Done.
    pub ok: bool,
    /// Not done because the container was not idle any more; nothing changes.
    pub skipped: bool,
    /// The shim has no such container any more: forget it.
    pub gone: bool,
    /// Bytes moved.
    pub bytes: u64,
    /// Time it took in the shim.
    pub seconds: f64,
}

/// Something for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolEvent {
    /// A pooled container was admitted; the tier it was in (Cold: a new container).
    Hit(Tier),
    /// An action finished.
    Moved {
        /// Which.
        action: Action,
        /// Whether it worked.
        ok: bool,
        /// Bytes moved.
        bytes: u64,
        /// Seconds it took.
        seconds: f64,
    },
}

/// The `[pool]` knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// TTLs, GPU headroom, prefetch prediction.
    pub tiers: TierConfig,
    /// Kill Cold containers.
    pub reclaim: bool,
    /// Fraction of host memory that must stay available, else Warm containers are reclaimed
    /// (only with `reclaim`: without it nothing can be freed, see [`Pool::host_short`]).
    pub host_headroom: f64,
}

/// Why a container was evicted: a pressure victim may be prefetched when its function's next
/// call is predicted; a container evicted for being idle past the hot TTL is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Ttl,
    Pressure,
}

#[derive(Clone, Debug)]
struct Entry {
    function: String,
    gpu: u32,
    shim_pid: u32,
    tier: Tier,
    busy: bool,
    bytes: u64,
    last_used: Time,
    uses: u64,
    priority: f64,
    /// Measured restore time, seconds.
    reload_s: Option<f64>,
    pending: Option<(Action, Time)>,
    evicted_for: Why,
    /// No new order before this (after a failed one).
    backoff_until: Time,
    /// What it keeps native, as its shim last reported (shown, not decided on).
    native: Native,
    /// What its processes held on the GPU at its last release as the driver measured them
    /// (NVML's per-process used memory: allocations, native ones and the CUDA context); 0 where
    /// not measured.
    resident: u64,
}

/// One pooled container, for status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EntryView {
    /// The container.
    pub key: ContainerKey,
    /// Function.
    pub function: String,
    /// GPU.
    pub gpu: u32,
    /// Tier.
    pub tier: Tier,
    /// Managed bytes, last known.
    pub bytes: u64,
    /// Holds a lease.
    pub busy: bool,
    /// Since its last use, ns.
    pub idle_ns: u64,
    /// Order in flight.
    pub pending: Option<Action>,
    /// Invocations.
    pub uses: u64,
    /// What it keeps native, and why (last report).
    pub native: Native,
    /// What its processes held on the GPU at its last release, measured by the driver
    /// (context included; 0: not measured).
    pub resident: u64,
}

#[derive(Clone, Copy, Debug)]
struct Calls {
    last: Time,
    mean_iat_s: Option<f64>,
}

/// An order not reported within this long is given up (the shim may have hung or lost it).
const ORDER_TIMEOUT_S: f64 = 60.0;
/// After a failed order, none for the same container for this long.
const BACKOFF_S: f64 = 10.0;
/// How long a GPU must go without a pressure eviction before its pressure victims are brought
/// back for predicted calls (docs/PERFORMANCE.md §1a′ measures it).
const PRESSURE_QUIET_S: f64 = 30.0;
/// Restore speed assumed before one is measured: PCIe 4.0 ×16 at about 12 GB/s.
const ASSUMED_BYTES_PER_S: f64 = 12e9;

/// The pool.
#[derive(Debug)]
pub struct Pool {
    policy: TierPolicy,
    reclaim: bool,
    host_headroom: f64,
    /// Bytes of host memory below its headroom at the last tick that gave the figure, which
    /// the pool could not free (no `reclaim`); 0 when none.
    host_short: u64,
    entries: BTreeMap<ContainerKey, Entry>,
    /// Functions that had a pooled container, until the daemon forgets their flows: one whose
    /// last container left is reported not resident, not left resident in the core.
    functions: BTreeSet<String>,
    calls: HashMap<String, Calls>,
    memory: HashMap<u32, (u64, u64)>,
    orders: Vec<Order>,
    events: Vec<PoolEvent>,
    /// Containers joined, left or changed tier since [`Pool::tier_counts`] last answered.
    changed: bool,
    /// Whether GPU memory figures are measured (NVML) rather than simulated.
    measured: bool,
    /// When each GPU last had containers evicted for memory pressure.
    last_pressure: HashMap<u32, Time>,
}

/// Pooled containers per (function, tier).
pub type TierCounts = BTreeMap<(String, Tier), i64>;

impl Pool {
    /// A pool with checked knobs.
    ///
    /// # Errors
    /// A knob out of range, named.
    pub fn new(cfg: PoolConfig) -> Result<Self, crate::ConfigError> {
        if !(cfg.host_headroom.is_finite() && (0.0..1.0).contains(&cfg.host_headroom)) {
            return Err(crate::ConfigError::new(
                "pool.host_headroom",
                cfg.host_headroom,
                "must be in [0, 1)",
            ));
        }
        Ok(Pool {
            policy: TierPolicy::new(cfg.tiers)?,
            reclaim: cfg.reclaim,
            host_headroom: cfg.host_headroom,
            host_short: 0,
            entries: BTreeMap::new(),
            functions: BTreeSet::new(),
            calls: HashMap::new(),
            memory: HashMap::new(),
            orders: Vec::new(),
            events: Vec::new(),
            changed: true,
            measured: false,
            last_pressure: HashMap::new(),
        })
    }

    /// Says that GPU memory figures come from the driver (NVML): they are then the truth about
    /// memory in use, and what containers claim never adds to them.
    pub fn set_measured(&mut self, measured: bool) {
        self.measured = measured;
    }

    /// A byte figure container `key` (through its shim) claims, made believable: never more than
    /// the GPU has in use (measured) or has at all (simulated), less what the other Hot
    /// containers on it are known to hold; nothing while the GPU's memory is not known yet. The
    /// figures come from the container's own processes: where the driver measures memory, a lie
    /// may cost that container its place in the pool, never another container's memory; on a
    /// simulated GPU a claim up to its free memory is believed (docs/SECURITY.md).
    fn believable(&self, key: &ContainerKey, gpu: u32, bytes: u64) -> u64 {
        let Some(&(used, total)) = self.memory.get(&gpu) else {
            return 0;
        };
        let others: u64 = self
            .entries
            .iter()
            .filter(|(k, e)| *k != key && e.gpu == gpu && e.tier == Tier::Hot)
            .fold(0u64, |sum, (_, e)| sum.saturating_add(e.bytes));
        let cap = if self.measured { used } else { total };
        bytes.min(cap.saturating_sub(others))
    }

    #[expect(
        clippy::cast_precision_loss,
        reason = "a container's bytes: an estimated reload time needs no exact bits"
    )]
    fn reload_cost(e: &Entry) -> f64 {
        e.reload_s
            .unwrap_or(e.bytes as f64 / ASSUMED_BYTES_PER_S + 0.01)
    }

    fn order(&mut self, key: &ContainerKey, action: Action, now: Time) {
        if let Some(e) = self.entries.get_mut(key) {
            e.pending = Some((action, now));
            self.orders.push(Order {
                key: key.clone(),
                shim_pid: e.shim_pid,
                action,
            });
        }
    }

    /// A lease was granted. For a pooled container this counts a hit in the tier it was in and,
    /// when its memory is on the host, makes room for it on the GPU.
    pub fn granted(
        &mut self,
        key: &ContainerKey,
        function: &str,
        gpu: u32,
        shim_pid: u32,
        now: Time,
    ) -> Tier {
        let calls = self.calls.entry(function.to_owned()).or_insert(Calls {
            last: now,
            mean_iat_s: None,
        });
        let iat = now.secs_since(calls.last);
        if iat > 0.0 {
            calls.mean_iat_s = Some(calls.mean_iat_s.map_or(iat, |m| 0.8 * m + 0.2 * iat));
        }
        calls.last = now;
        self.functions.insert(function.to_owned());
        let e = self.entries.entry(key.clone()).or_insert(Entry {
            function: function.to_owned(),
            gpu,
            shim_pid,
            tier: Tier::Cold,
            busy: false,
            bytes: 0,
            last_used: now,
            uses: 0,
            priority: 0.0,
            reload_s: None,
            pending: None,
            evicted_for: Why::Ttl,
            backoff_until: Time::ZERO,
            native: Native::default(),
            resident: 0,
        });
        let was = e.tier;
        self.changed = true;
        e.busy = true;
        e.shim_pid = shim_pid;
        e.gpu = gpu;
        e.uses += 1;
        e.last_used = now;
        if was == Tier::Cold && e.bytes == 0 {
            // A new container: nothing to restore.
            e.tier = Tier::Hot;
        }
        let (uses, bytes) = (e.uses, e.bytes);
        let cost = Self::reload_cost(e);
        e.priority = self.policy.credit(uses, cost, bytes);
        self.events.push(PoolEvent::Hit(was));
        if was != Tier::Hot {
            self.make_room(gpu, bytes, now);
        }
        was
    }

    /// A shim re-registers a paused container (this daemon restarted, or lost it): known ones
    /// keep what the pool knows; unknown ones join idle, Warm if the shim evicted them, with the
    /// hot TTL counted from now.
    #[expect(clippy::too_many_arguments)]
    pub fn adopt_idle(
        &mut self,
        key: &ContainerKey,
        function: &str,
        gpu: u32,
        shim_pid: u32,
        bytes: u64,
        evicted: bool,
        now: Time,
    ) {
        if let Some(e) = self.entries.get(key) {
            // Adopted before its GPU's memory was known (a restarted daemon hears its shims
            // before its first sample): the size is believed once it can be.
            let known = (e.bytes == 0).then(|| self.believable(key, e.gpu, bytes));
            if let Some(e) = self.entries.get_mut(key) {
                e.shim_pid = shim_pid;
                if let Some(b) = known.filter(|&b| b > 0) {
                    e.bytes = b;
                    self.changed = true;
                }
            }
            return;
        }
        let bytes = self.believable(key, gpu, bytes);
        let priority = self.policy.credit(1, 0.01, bytes);
        self.functions.insert(function.to_owned());
        self.changed = true;
        self.entries.insert(
            key.clone(),
            Entry {
                function: function.to_owned(),
                gpu,
                shim_pid,
                tier: if evicted { Tier::Warm } else { Tier::Hot },
                busy: false,
                bytes,
                last_used: now,
                uses: 0,
                priority,
                reload_s: None,
                pending: None,
                evicted_for: Why::Ttl,
                backoff_until: Time::ZERO,
                native: Native::default(),
                resident: 0,
            },
        );
    }

    /// A lease ended. `paused`: the container lives on, idle, holding `bytes` (0 = unknown, keep
    /// the last figure); otherwise it is gone.
    pub fn released(&mut self, key: &ContainerKey, paused: bool, bytes: u64, now: Time) {
        if !paused {
            self.changed |= self.entries.remove(key).is_some();
            return;
        }
        let gpu = self.entries.get(key).map(|e| e.gpu);
        let bytes = gpu.map_or(0, |g| self.believable(key, g, bytes));
        if let Some(e) = self.entries.get_mut(key) {
            e.busy = false;
            e.last_used = now;
            if bytes > 0 {
                e.bytes = bytes;
            }
        }
    }

    /// What a pooled container's processes held on its GPU when its lease ended, as the driver
    /// measured them (NVML's per-process used memory over the host PIDs its release named): its
    /// whole footprint, the CUDA context included, which its own reports leave out. Held to
    /// the GPU's capacity; 0 changes nothing.
    pub fn measured_resident(&mut self, key: &ContainerKey, bytes: u64) {
        if let Some(e) = self.entries.get_mut(key)
            && bytes > 0
        {
            let cap = self
                .memory
                .get(&e.gpu)
                .map_or(u64::MAX, |&(_, total)| total);
            e.resident = bytes.min(cap);
        }
    }

    /// What a pooled container keeps native, as its shim read it with its managed bytes.
    pub fn report_native(&mut self, key: &ContainerKey, native: Native) {
        if let Some(e) = self.entries.get_mut(key)
            && e.native != native
        {
            e.native = native;
            self.changed = true;
        }
    }

    /// A container that holds no lease was killed or deleted: it leaves the pool.
    pub fn forget(&mut self, key: &ContainerKey) {
        self.changed |= self.entries.remove(key).is_some();
        self.orders.retain(|o| o.key != *key);
    }

    /// Functions whose flows the daemon forgot: their call statistics go too.
    pub fn forget_functions(&mut self, functions: &[String]) {
        for f in functions {
            self.calls.remove(f);
            self.functions.remove(f);
        }
    }

    /// A container's shim died: its containers leave the pool.
    pub fn shim_gone(&mut self, pid: u32) {
        let before = self.entries.len();
        self.entries.retain(|_, e| e.shim_pid != pid);
        self.changed |= self.entries.len() != before;
        self.orders.retain(|o| o.shim_pid != pid);
    }

    /// A GPU's memory: in use and total, bytes.
    pub fn observe_memory(&mut self, gpu: u32, used: u64, total: u64) {
        self.memory.insert(gpu, (used, total));
    }

    /// A shim's report. Returns whether it was about a known container.
    pub fn report(&mut self, o: &Outcome, now: Time) -> bool {
        if o.gone {
            let known = self.entries.remove(&o.key).is_some();
            self.changed |= known;
            return known;
        }
        let Some(gpu) = self.entries.get(&o.key).map(|e| e.gpu) else {
            return false;
        };
        let reported = self.believable(&o.key, gpu, o.bytes);
        let o = &Outcome {
            bytes: reported,
            ..o.clone()
        };
        let Some(e) = self.entries.get_mut(&o.key) else {
            return false;
        };
        if e.pending.is_some_and(|(a, _)| a == o.action) {
            e.pending = None;
        }
        if !o.skipped {
            self.events.push(PoolEvent::Moved {
                action: o.action,
                ok: o.ok,
                bytes: o.bytes,
                seconds: o.seconds,
            });
        }
        if o.skipped {
            return true;
        }
        if !o.ok {
            e.backoff_until = now.plus_secs(BACKOFF_S);
            return true;
        }
        self.changed = true;
        match o.action {
            Action::Evict => {
                e.tier = Tier::Warm;
                e.bytes = o.bytes.max(e.bytes);
                // The same bytes back over the same link: the best guess at its restore until
                // one is measured (a GPU's link may be twice the assumed speed, or half).
                if e.reload_s.is_none() && o.seconds > 0.0 {
                    e.reload_s = Some(o.seconds);
                }
            }
            Action::Prefetch | Action::Restore => {
                e.tier = Tier::Hot;
                // Brought back because a call is expected: its hot TTL starts again.
                e.last_used = now;
                if o.bytes > 0 {
                    e.bytes = o.bytes;
                }
                if o.action == Action::Restore || o.seconds > 0.0 {
                    e.reload_s = Some(o.seconds);
                }
            }
            Action::Reclaim => {
                self.entries.remove(&o.key);
            }
        }
        true
    }

    /// Orders made since the last call.
    pub fn take_orders(&mut self) -> Vec<Order> {
        std::mem::take(&mut self.orders)
    }

    /// Events since the last call.
    pub fn drain_events(&mut self) -> Vec<PoolEvent> {
        std::mem::take(&mut self.events)
    }
}

mod pressure;
mod views;

#[cfg(test)]
mod tests;
