//! The shim's side of admission: Start / Resume of a GPU container wait here until `mqfqd`
//! dispatches them; the lease ends at exit, Pause, Kill or Delete.
//!
//! The gate remembers every GPU container it let run (with its lease, or none for a fail-open
//! start). Whenever it (re)connects — and once a second while it holds any — it registers that
//! set with the daemon, so a restarted daemon rebuilds its state and counts every running
//! container. While the daemon is unreachable the gate fails **open** by default (the task
//! starts, a warning is logged, and the start is counted and reported on reconnect) or
//! **closed** (`MQFQ_FAIL=closed`: Start fails with UNAVAILABLE and the container stays Created).
//!
//! No lease outlives its container: a Release that cannot be delivered is kept and retried (on
//! reconnection and with every heartbeat), every registration also lists the containers whose
//! Admit is in flight, and the daemon releases any lease of this shim that a registration no
//! longer lists. An admission waits at most `MQFQ_ADMIT_TIMEOUT_MS`; past it the waiting
//! admission is withdrawn and the fail mode applies, so a slot lost to a bug never hangs starts.
//!
//! Configuration comes from the shim's environment, which containerd passes on:
//! `MQFQ_DAEMON_SOCKET` (default `/run/mqfq/mqfqd.sock`), `MQFQ_FAIL` (`open` | `closed`),
//! `MQFQ_RECONNECT_GRACE_MS` (how long a lost daemon is waited for before failing open or
//! closed; default 5000), `MQFQ_ADMIT_TIMEOUT_MS` (the longest a Start or Resume waits in the
//! queue; default 100000, below the kubelet's 2-minute runtime request timeout; 0 = no limit).
//!
//! Locks (the task service never calls the gate while holding its `state`): `sync` orders a
//! registration with Releases and is held across those calls to mqfqd on purpose (see
//! `DaemonGate::register`); `conn` guards the cached client and is never held across connecting
//! or a call; the std mutexes over the book (`held`, `idle`, `admitting`, `unreleased`) are taken
//! one at a time and never across an await.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

use crate::api;
use crate::error::{Error, Result};
use crate::gpu::GpuWork;
use crate::memory::Usage;
use mqfq_proto::DEFAULT_SOCKET;

mod daemon;
mod orders;

pub use daemon::DaemonGate;

/// What an admission is for: the node's own word (one `Kind` from the shim to the core).
pub use scheduler_core::node::admission::Kind;

/// Where GPU starts wait.
#[async_trait]
pub trait Gate: Send + Sync + std::fmt::Debug {
    /// Waits until the container may run.
    ///
    /// # Errors
    /// The admission was cancelled, refused (bad request), or the daemon is unreachable and the
    /// gate fails closed.
    async fn admit(
        &self,
        ns: &str,
        id: &str,
        work: &GpuWork,
        kind: Kind,
        pooled: bool,
    ) -> Result<()>;
    /// Withdraws a waiting admission of this container, if any, and ends a lease the daemon holds
    /// for it (also tells the pool a killed or deleted container is gone).
    async fn cancel(&self, ns: &str, id: &str);
    /// Ends the container's lease, if it holds one; `held` is what its CUDA processes hold
    /// (pooled containers, read before a pause; managed 0 = unknown).
    async fn release(&self, ns: &str, id: &str, reason: &str, held: Usage);
    /// The GPU pairs (NVML UUIDs, old → new) the container's checkpointed processes are to be
    /// restored with under the lease it holds: the node granted it on another GPU of the model
    /// they were suspended on. Empty: restore them where they were.
    fn restore_onto(&self, ns: &str, id: &str) -> Vec<(String, String)> {
        let _ = (ns, id);
        Vec::new()
    }
    /// Ends the container's lease at a Pause, as [`Gate::release`] with reason `pause`, naming
    /// the host PIDs of its processes: `mqfqd` reads what NVML measured them holding on the GPU
    /// (their CUDA contexts too), which their own reports leave out.
    async fn pause_release(&self, ns: &str, id: &str, held: Usage, pids: Vec<u32>) {
        let _ = pids;
        self.release(ns, id, "pause", held).await;
    }
    /// Ends a burst's lease (reason `idle`: the container lives on) with what the burst
    /// measured: its GPU-busy time, reported rather than the time the lease was held, the
    /// bytes it copied and its processes (for the function's placement features).
    async fn end_burst(&self, ns: &str, id: &str, report: BurstReport, held: Usage) {
        let _ = report;
        self.release(ns, id, "idle", held).await;
    }
    /// mqfqd's advice for a GPU container being created: `Some("all")` when its function's
    /// containers exported GPU memory (its allocations should then stay native). `None` when
    /// there is none, or no answer within a short deadline (Create never waits on the daemon).
    async fn advise(&self, ns: &str, id: &str, work: &GpuWork) -> Option<Advice> {
        let _ = (ns, id, work);
        None
    }
    /// mqfqd's GPU for a container being created that may use several (`work.gpus` names its
    /// candidates, empty = all): one of them, as named, or `None` (no choice, or no answer within
    /// the short deadline: the container keeps what it was given).
    async fn place(&self, ns: &str, id: &str, work: &GpuWork) -> Option<String> {
        let _ = (ns, id, work);
        None
    }
    /// Tells mqfqd a CUDA process of the container had an export of converted memory refused
    /// (bounded by the same short deadline as [`Gate::advise`]); whether the daemon took it.
    async fn exported(&self, ns: &str, id: &str, work: &GpuWork) -> bool {
        let _ = (ns, id, work);
        false
    }
}

/// mqfqd's advice for a container being created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Advice {
    /// `io.mqfq.native-alloc`'s value it advises (`all`: its function's containers exported
    /// GPU memory), or empty.
    pub native_alloc: String,
    /// The node's Warm-tier backend (empty from an older daemon).
    pub warm: String,
    /// The backends a pod may choose (empty: any).
    pub warm_allowed: Vec<String>,
}

/// What a burst measured, reported with its release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BurstReport {
    /// Its GPU-busy time: from the grant to the last observed completion.
    pub service: Duration,
    /// Bytes its processes copied between host and device (`None`: not counted).
    pub transfer_bytes: Option<u64>,
    /// Host PIDs of the processes that took part (kernel-attested peers of the burst socket).
    pub pids: Vec<u32>,
}

/// The pool's side of the daemon link: its orders (thaw, evict, prefetch, freeze, reclaim) for
/// this shim's paused containers, and what became of them. Apart from [`Gate`] because it is
/// another conversation — a long poll that runs while any container of the shim is pooled, not
/// a call on a task's path — and the task code that obeys orders never admits, nor the
/// reverse.
#[async_trait]
pub trait PoolChannel: Send + Sync + std::fmt::Debug {
    /// Waits up to `wait` for the daemon's pool orders for this shim; empty on timeout or when
    /// the daemon is unreachable (after a short pause, so a caller's loop does not spin).
    async fn pool_orders(&self, wait: Duration) -> Vec<api::PoolOrder>;
    /// Reports what this shim did for the pool.
    async fn pool_report(&self, results: Vec<api::PoolResult>);
}

/// Gate settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// mqfqd's socket.
    pub socket: PathBuf,
    /// Fail open (default) or closed while the daemon is unreachable.
    pub fail_open: bool,
    /// How long a daemon that was there is waited for.
    pub reconnect_grace: Duration,
    /// The longest an admission waits (`None`: no limit).
    pub admit_timeout: Option<Duration>,
}

impl GateConfig {
    /// From the environment (see the module docs).
    ///
    /// # Errors
    /// `MQFQ_FAIL` or `MQFQ_RECONNECT_GRACE_MS` with a value they cannot take.
    pub fn from_env() -> Result<Self> {
        let socket = std::env::var_os("MQFQ_DAEMON_SOCKET")
            .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
        let fail_open = match std::env::var("MQFQ_FAIL").as_deref() {
            Err(_) | Ok("" | "open") => true,
            Ok("closed") => false,
            Ok(v) => {
                return Err(Error::InvalidArgument(format!(
                    "MQFQ_FAIL={v:?}: must be open or closed"
                )));
            }
        };
        let grace = env_ms("MQFQ_RECONNECT_GRACE_MS", 5000, "")?;
        let admit = env_ms("MQFQ_ADMIT_TIMEOUT_MS", 100_000, " (0: no limit)")?;
        Ok(GateConfig {
            socket,
            fail_open,
            reconnect_grace: Duration::from_millis(grace),
            admit_timeout: (admit > 0).then(|| Duration::from_millis(admit)),
        })
    }
}

/// A duration in milliseconds from the environment, or `default`.
fn env_ms(name: &str, default: u64, hint: &str) -> Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v.parse::<u64>().map_err(|_| {
            Error::InvalidArgument(format!("{name}={v:?}: must be milliseconds{hint}"))
        }),
    }
}

#[cfg(test)]
mod tests;
