//! [`DaemonGate`]: admission through mqfqd, and the book of what this shim's GPU containers
//! hold (leases, paused pooled containers, admissions in flight, undelivered releases) that
//! every registration re-sends. The locks it takes are in the `gate` module docs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mqfq_proto::ContainerKey;
use tokio::sync::Mutex;

use super::{BurstReport, Gate, GateConfig, Kind};
use crate::api;
use crate::error::{Error, Result};
use crate::gpu::{GpuSelection, GpuWork};
use crate::memory::Usage;

#[derive(Clone, Debug)]
struct Held {
    key: ContainerKey,
    work: GpuWork,
    /// 0: started fail-open, not known to the daemon yet.
    lease: u64,
    since: Instant,
    pooled: bool,
    kind: Kind,
    /// What the burst measured: its GPU-busy time, reported instead of the time held, and
    /// its bytes and processes.
    burst: Option<BurstReport>,
    /// Its processes' host PIDs, told at a Pause (a burst's are in its report).
    pids: Vec<u32>,
    /// The GPU pairs its checkpointed processes are restored with under this lease (NVML
    /// UUIDs, old → new; empty: where they were).
    onto: Vec<(String, String)>,
    /// A pooled container's memory was evicted when the lease was granted (what it stays if
    /// the lease goes back `unused`).
    was_evicted: bool,
}

/// A pooled container that is paused: no lease, memory Hot or evicted.
#[derive(Clone, Debug)]
struct Idle {
    key: ContainerKey,
    work: GpuWork,
    held: Usage,
    evicted: bool,
}

#[derive(Default)]
struct Conn {
    client: Option<api::AdmissionClient>,
    boot_id: String,
}

/// The gate backed by `mqfqd`.
pub struct DaemonGate {
    cfg: GateConfig,
    conn: Mutex<Conn>,
    /// Orders a registration with releases: a Release waits for a registration in flight, and
    /// a registration reads the set only after a Release in flight was answered. Held across
    /// those two calls (each with a 5 s deadline) on purpose — see [`DaemonGate::register`].
    sync: Mutex<()>,
    held: StdMutex<HashMap<ContainerKey, Held>>,
    /// Paused pooled containers, re-registered so a restarted daemon re-learns its pool.
    idle: StdMutex<HashMap<ContainerKey, Idle>>,
    unreported_fail_open: AtomicU64,
    /// Containers whose Admit is in flight.
    admitting: StdMutex<HashSet<ContainerKey>>,
    /// Releases not delivered yet (the daemon was unreachable), retried.
    unreleased: StdMutex<Vec<api::ReleaseRequest>>,
    heartbeat: AtomicBool,
    /// Whether a daemon ever answered: one that did and went away is waited for.
    seen_daemon: AtomicBool,
}

impl std::fmt::Debug for DaemonGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonGate")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// The gate's key for a container, or `None` for one that cannot be (Create refuses such ids,
/// so only a caller's bug gets here: nothing is held for it).
fn key(ns: &str, id: &str) -> Option<ContainerKey> {
    ContainerKey::new(ns, id).ok()
}

fn gpus(w: &GpuWork) -> Vec<String> {
    match &w.gpus {
        GpuSelection::All => Vec::new(),
        GpuSelection::Devices(d) => d.clone(),
    }
}

/// An admission request for the container (also the form of Advise and Exported).
fn admit_request(
    ns: &str,
    id: &str,
    work: &GpuWork,
    kind: Kind,
    pooled: bool,
) -> api::AdmitRequest {
    api::AdmitRequest {
        namespace: ns.to_owned(),
        container_id: id.to_owned(),
        function: work.function.clone(),
        tenant: work.tenant.clone().unwrap_or_default(),
        weight: work.weight,
        gpus: gpus(work),
        kind: match kind {
            Kind::Start => api::Kind::START,
            Kind::Resume => api::Kind::RESUME,
            Kind::Burst => api::Kind::BURST,
        }
        .into(),
        shim_pid: std::process::id(),
        pooled,
        pod_namespace: work.pod_namespace.clone(),
        partners: work.partners.clone(),
        warm: if pooled { work.warm.as_str() } else { "" }.into(),
        ..Default::default()
    }
}

/// How long Create waits for mqfqd's advice (it never waits longer: no advice then).
const ADVISE_DEADLINE: Duration = Duration::from_millis(500);

/// A registration entry's identity: container, function, weight, GPUs.
fn entry(key: &ContainerKey, work: &GpuWork) -> api::Running {
    api::Running {
        namespace: key.namespace().to_owned(),
        container_id: key.id().to_owned(),
        function: work.function.clone(),
        tenant: work.tenant.clone().unwrap_or_default(),
        weight: work.weight,
        gpus: gpus(work),
        pod_namespace: work.pod_namespace.clone(),
        warm: work.warm.as_str().into(),
        ..Default::default()
    }
}

/// Why the daemon could not be talked to (connecting, or a call that got no answer).
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    /// The socket could not be connected to.
    #[error("connect: {0}")]
    Connect(#[source] ttrpc::Error),
    /// A call got no answer (the daemon went away, or its deadline passed).
    #[error("{call}: {source}")]
    Call {
        /// Which call.
        call: &'static str,
        /// What ttrpc said.
        #[source]
        source: ttrpc::Error,
    },
}

impl LinkError {
    pub(super) fn call(call: &'static str) -> impl FnOnce(ttrpc::Error) -> Self {
        move |source| LinkError::Call { call, source }
    }
}

/// A grant: its lease, and the GPU pairs its checkpointed processes are restored with.
type Granted = (u64, Vec<(String, String)>);

enum Attempt {
    Admitted(Granted),
    Lost(LinkError),
    Refused(Error),
}

enum AdmitFailure {
    /// The daemon said no (bad request, cancelled).
    Refused(Error),
    /// The daemon is unreachable.
    Lost(LinkError),
}

impl DaemonGate {
    /// A gate for `cfg`.
    #[must_use]
    pub fn new(cfg: GateConfig) -> Arc<Self> {
        Arc::new(DaemonGate {
            cfg,
            conn: Mutex::new(Conn::default()),
            sync: Mutex::new(()),
            held: StdMutex::new(HashMap::new()),
            idle: StdMutex::new(HashMap::new()),
            unreported_fail_open: AtomicU64::new(0),
            admitting: StdMutex::new(HashSet::new()),
            unreleased: StdMutex::new(Vec::new()),
            heartbeat: AtomicBool::new(false),
            seen_daemon: AtomicBool::new(false),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<ContainerKey, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn idle(&self) -> MutexGuard<'_, HashMap<ContainerKey, Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a paused pooled container is known here with its memory evicted (`None`: not
    /// idle here), as the next registration reports it.
    #[cfg(test)]
    pub(super) fn idle_evicted(&self, ns: &str, id: &str) -> Option<bool> {
        let k = ContainerKey::new(ns, id).ok()?;
        self.idle().get(&k).map(|i| i.evicted)
    }

    /// Folds what the shim did for the pool into the paused set it re-registers.
    pub(super) fn pool_done(&self, results: &[api::PoolResult]) {
        let mut idle = self.idle();
        for r in results.iter().filter(|r| r.ok) {
            let Ok(k) = ContainerKey::new(&r.namespace, &r.container_id) else {
                continue;
            };
            match r.action.enum_value() {
                Ok(api::PoolAction::EVICT) => {
                    if let Some(i) = idle.get_mut(&k) {
                        i.evicted = true;
                        i.held.managed = i.held.managed.max(r.bytes);
                    }
                }
                Ok(api::PoolAction::PREFETCH) => {
                    if let Some(i) = idle.get_mut(&k) {
                        i.evicted = false;
                    }
                }
                Ok(api::PoolAction::RECLAIM) => {
                    idle.remove(&k);
                }
                _ => {}
            }
        }
    }

    fn admitting(&self) -> MutexGuard<'_, HashSet<ContainerKey>> {
        self.admitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn unreleased(&self) -> MutexGuard<'_, Vec<api::ReleaseRequest>> {
        self.unreleased
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Delivers the releases kept while the daemon was unreachable. One it does not know (it
    /// restarted, or already released it by reconciliation) is done.
    async fn retry_releases(&self, c: &api::AdmissionClient) {
        let mut pending = std::mem::take(&mut *self.unreleased()).into_iter();
        while let Some(req) = pending.next() {
            match c
                .release(ttrpc::context::with_timeout(5_000_000_000), &req)
                .await
            {
                Ok(_) | Err(ttrpc::Error::RpcStatus(_)) => {}
                Err(e) => {
                    // The daemon is not answering: keep this one and the rest for later rather
                    // than wait 5 s for each.
                    tracing::debug!(lease = req.lease_id, "release still undelivered: {e}");
                    self.keep_release(req);
                    for rest in pending.by_ref() {
                        self.keep_release(rest);
                    }
                }
            }
        }
    }

    /// Keeps an undelivered release (at most 4096; past that the daemon's reconciliation of
    /// the registration releases the lease anyway).
    fn keep_release(&self, req: api::ReleaseRequest) {
        let mut u = self.unreleased();
        if u.len() < 4096 {
            u.push(req);
        }
    }

    /// The connected client, connecting and registering first when needed.
    pub(super) async fn client(&self) -> std::result::Result<api::AdmissionClient, LinkError> {
        if let Some(c) = self.conn.lock().await.client.clone() {
            return Ok(c);
        }
        let c = mqfq_proto::connect(&self.cfg.socket)
            .await
            .map_err(LinkError::Connect)?;
        {
            // Another caller connected meanwhile: use its connection (it registers).
            let mut conn = self.conn.lock().await;
            if let Some(other) = &conn.client {
                return Ok(other.clone());
            }
            conn.client = Some(c.clone());
        }
        self.seen_daemon.store(true, Ordering::SeqCst);
        self.register(&c).await?;
        Ok(c)
    }

    pub(super) async fn forget(&self) {
        self.conn.lock().await.client = None;
    }

    /// Sends the held set and adopts the leases the daemon answers with.
    ///
    /// Ordered with releases by `sync`, the one lock held across a call to mqfqd: a set read
    /// before a Release went out, arriving after it, would have the daemon adopt the ended
    /// lease again — and mqfqd releases an unlisted lease only once it predates the shim's
    /// previous registration, so it would stay until the container's next admission, its
    /// Kill, or the shim's death (with the container paused, indefinitely); a stale set would
    /// also withdraw a new Admit of the container as "registered as running". Without the lock
    /// (a counter instead) that happened, as `gate::tests` shows against mqfqd's own service.
    async fn register(&self, c: &api::AdmissionClient) -> std::result::Result<(), LinkError> {
        let _sync = self.sync.lock().await;
        self.retry_releases(c).await;
        let fail_open = self.unreported_fail_open.swap(0, Ordering::SeqCst);
        // In-flight admissions first: one that completes in between is then in `held` (an
        // admission enters `held` before it leaves `admitting`), never in neither.
        let admitting: Vec<String> = self.admitting().iter().map(ToString::to_string).collect();
        let running: Vec<api::Running> = self
            .held()
            .values()
            .map(|h| api::Running {
                lease_id: h.lease,
                running_ns: u64::try_from(h.since.elapsed().as_nanos()).unwrap_or(u64::MAX),
                pooled: h.pooled,
                burst: h.kind == Kind::Burst,
                ..entry(&h.key, &h.work)
            })
            .collect();
        let idle: Vec<api::Running> = self
            .idle()
            .values()
            .map(|i| api::Running {
                pooled: true,
                evicted: i.evicted,
                managed_bytes: i.held.managed,
                native: Some(crate::memory::to_proto(&i.held.native)).into(),
                ..entry(&i.key, &i.work)
            })
            .collect();
        let req = api::RegisterRequest {
            shim_pid: std::process::id(),
            running,
            fail_open_starts: fail_open,
            idle,
            admitting,
            ..Default::default()
        };
        let resp = match c
            .register(ttrpc::context::with_timeout(5_000_000_000), &req)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.unreported_fail_open
                    .fetch_add(fail_open, Ordering::SeqCst);
                return Err(LinkError::call("register")(e));
            }
        };
        {
            let mut held = self.held();
            for a in resp.leases {
                if let Some(h) = key(&a.namespace, &a.container_id).and_then(|k| held.get_mut(&k)) {
                    h.lease = a.lease_id;
                }
            }
        }
        let mut conn = self.conn.lock().await;
        if conn.boot_id != resp.boot_id {
            if !conn.boot_id.is_empty() {
                tracing::info!(boot_id = %resp.boot_id, "mqfqd restarted: containers re-registered");
            }
            conn.boot_id = resp.boot_id;
        }
        Ok(())
    }

    /// Once a second while anything is held (faster while the daemon is away): registration doubles as the liveness check, so a
    /// restarted daemon learns about this shim's containers without waiting for a new call.
    fn start_heartbeat(self: &Arc<Self>) {
        if self.heartbeat.swap(true, Ordering::SeqCst) {
            return;
        }
        let gate = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut connected = true;
            loop {
                // Every second; every 200 ms while the daemon is away, so a restarted one hears
                // from this shim well within its restart grace.
                let period = if connected { 1000 } else { 200 };
                tokio::time::sleep(Duration::from_millis(period)).await;
                let Some(g) = gate.upgrade() else { return };
                let nothing_held = g.held().is_empty();
                let idle = nothing_held && g.unreleased().is_empty();
                if idle && g.unreported_fail_open.load(Ordering::SeqCst) == 0 {
                    continue;
                }
                let cached = g.conn.lock().await.client.clone();
                let ok = match cached {
                    Some(c) => g.register(&c).await.is_ok(),
                    None => g.client().await.is_ok(),
                };
                if !ok {
                    g.forget().await;
                }
                connected = ok;
            }
        });
    }

    /// Admits through the daemon, waiting for it through a restart; the lease, or why not.
    async fn admit_waiting(
        &self,
        req: &api::AdmitRequest,
    ) -> std::result::Result<Granted, AdmitFailure> {
        let first_loss = Instant::now();
        loop {
            match self.attempt(req).await {
                Attempt::Admitted(granted) => return Ok(granted),
                Attempt::Refused(e) => return Err(AdmitFailure::Refused(e)),
                Attempt::Lost(e) => {
                    // A daemon that is not there (no socket, never seen) is not waited for; one
                    // that went away (a restart) is, for the grace period.
                    let absent =
                        !self.seen_daemon.load(Ordering::SeqCst) && !self.cfg.socket.exists();
                    if absent || first_loss.elapsed() >= self.cfg.reconnect_grace {
                        return Err(AdmitFailure::Lost(e));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The fail mode: open (start without a lease, counted and reported) or closed; `open`
    /// overrides closed (a start past its deadline).
    fn fail(
        &self,
        req: &api::AdmitRequest,
        k: &ContainerKey,
        why: &str,
        open: bool,
    ) -> Result<u64> {
        let socket = self.cfg.socket.display();
        let id = &req.container_id;
        if !self.cfg.fail_open && !open {
            self.admitting().remove(k);
            return Err(Error::Unavailable(format!(
                "GPU admission for {id}: mqfqd at {socket}: {why}, and MQFQ_FAIL=closed"
            )));
        }
        tracing::warn!(
            container = %id, function = %req.function, pooled = req.pooled,
            "mqfqd at {socket}: {why}: starting without admission (fail-open)"
        );
        self.unreported_fail_open.fetch_add(1, Ordering::SeqCst);
        Ok(0)
    }

    async fn attempt(&self, req: &api::AdmitRequest) -> Attempt {
        let c = match self.client().await {
            Ok(c) => c,
            Err(e) => {
                self.forget().await;
                return Attempt::Lost(e);
            }
        };
        // The call returns when the queue dispatches it; the caller bounds the wait.
        match c.admit(ttrpc::context::with_timeout(0), req).await {
            Ok(r) => Attempt::Admitted((
                r.lease_id,
                r.restore_onto
                    .iter()
                    .map(|p| (p.old_uuid.clone(), p.new_uuid.clone()))
                    .collect(),
            )),
            Err(ttrpc::Error::RpcStatus(s)) => {
                let msg = format!("mqfqd: {}", s.message);
                Attempt::Refused(match s.code() {
                    ttrpc::Code::INVALID_ARGUMENT => Error::InvalidArgument(msg),
                    ttrpc::Code::CANCELLED => Error::FailedPrecondition(format!(
                        "start of {} cancelled while waiting for GPU admission ({msg})",
                        req.container_id
                    )),
                    _ => Error::FailedPrecondition(msg),
                })
            }
            Err(e) => {
                self.forget().await;
                Attempt::Lost(LinkError::call("admit")(e))
            }
        }
    }
}

mod verbs;
