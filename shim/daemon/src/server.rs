//! The ttrpc service of `mqfqd`: Admit blocks on a oneshot until the core grants it; shim
//! liveness through pidfds (a dead shim's leases are released and its waits withdrawn); the
//! sampling loop that drives D; the dispatch log and metrics.

use std::collections::{HashMap, HashSet};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use scheduler_core::Time;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use ttrpc::r#async::TtrpcContext;

use super::metrics::Metrics;
use super::policy::{Asked, FairnessSection};
use mqfq_proto::api;
use mqfq_proto::warm::Warm;
use scheduler_core::node::ContainerKey;
use scheduler_core::node::admission::{AdmitInfo, CoreError, Grant, Kind};
use scheduler_core::node::pool::Order;
use scheduler_core::node::{Input, Node, Output};

mod held;
mod log;
mod place;
mod pool;
mod register;
mod sample;
mod socket;
mod status;

pub use socket::bind;
pub use status::StatusOnly;

type Waiter = oneshot::Sender<Result<Grant, Withdrawn>>;

/// Why a waiting admission was withdrawn (its Admit answers CANCELLED saying so).
#[derive(Debug, thiserror::Error)]
enum Withdrawn {
    /// The shim that asked exited (its pidfd fired).
    #[error("shim {0} exited")]
    ShimGone(u32),
    /// The shim cancelled it (Kill or Delete of a waiting start, or its own deadline).
    #[error("cancelled by the shim")]
    Cancelled,
}

struct Inner {
    /// The node's admission core and pool, joined.
    node: Node,
    /// Functions whose containers exported converted memory (their next ones stay native).
    advice: scheduler_core::native::NativeAdvice,
    /// Containers with the CUDA interposer (their memory is pooled).
    pooled: HashMap<ContainerKey, Pooled>,
    /// Pool orders not yet fetched, per shim pid.
    orders: HashMap<u32, Vec<Order>>,
    waiters: HashMap<ContainerKey, Waiter>,
    watched: HashSet<u32>,
    /// Which GPU a container given several gets (None: off).
    placement: Option<scheduler_core::placement::Placement>,
    /// The Warm-tier backend of containers whose pod did not choose one, and those a pod may.
    warm: (Warm, Vec<Warm>),
    /// GPU memory each process held at the last sample, as NVML measured it: (GPU, host PID) →
    /// bytes (empty on simulated GPUs).
    held: held::Held,
}

/// A pooled container: the shim that holds it, and how its memory goes Warm.
#[derive(Clone, Copy, Debug)]
struct Pooled {
    shim: u32,
    warm: Warm,
    /// The GPU NVML last saw its processes on (at a release that named them); `None` where
    /// not measured.
    on_gpu: Option<u32>,
}

impl Inner {
    /// Container `key` is pooled, held by shim `shim`, going Warm by `warm` (every Admit and
    /// registration says so again); where its processes were measured stays known.
    fn pool_container(&mut self, key: &ContainerKey, shim: u32, warm: Warm) {
        let on_gpu = self.pooled.get(key).and_then(|p| p.on_gpu);
        self.pooled
            .insert(key.clone(), Pooled { shim, warm, on_gpu });
    }
}

/// A request's `warm`, or INVALID_ARGUMENT naming `field`.
fn warm_field(field: &str, value: &str) -> ttrpc::Result<Warm> {
    Warm::from_wire(value).map_err(|e| {
        status(
            ttrpc::Code::INVALID_ARGUMENT,
            format!("invalid `{field}`: {e}"),
        )
    })
}

/// The daemon's shared state.
pub struct Daemon {
    inner: Mutex<Inner>,
    started: Instant,
    boot_id: String,
    backend: &'static str,
    metrics: Arc<Metrics>,
    /// The dispatch log's writer, if one is configured.
    log: Option<log::DispatchLog>,
    /// Woken when pool orders are queued for any shim.
    orders_ready: tokio::sync::Notify,
    /// Weights and tenants.
    policy: FairnessSection,
    /// Flows idle this long are forgotten (0: never).
    flow_idle_s: f64,
}

/// The longest a PoolOrders call waits for orders.
const MAX_ORDERS_WAIT_MS: u32 = 30_000;

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("boot_id", &self.boot_id)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

fn status(code: ttrpc::Code, msg: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
}

/// The one mapping from core errors to ttrpc codes.
#[must_use]
pub fn to_ttrpc(e: &CoreError) -> ttrpc::Error {
    let code = match e {
        CoreError::Invalid { .. } | CoreError::UnknownGpu(_) | CoreError::Config(_) => {
            ttrpc::Code::INVALID_ARGUMENT
        }
        CoreError::AlreadyWaiting(_) => ttrpc::Code::ALREADY_EXISTS,
        CoreError::UnknownLease(_) => ttrpc::Code::NOT_FOUND,
        CoreError::Limit { .. } => ttrpc::Code::RESOURCE_EXHAUSTED,
    };
    status(code, e)
}

/// What the shim asked for, with the operator's policy applied: the tenant and weights in
/// force are the daemon's decision, never the pod's alone.
fn decided(
    policy: &FairnessSection,
    namespace: &str,
    pod_namespace: &str,
    function: &str,
    tenant: &str,
    weight: f64,
) -> super::policy::Decided {
    policy.resolve(Asked {
        namespace,
        pod_namespace,
        function,
        tenant,
        weight,
    })
}

/// What a shim relays from a pod is checked even where the policy ignores it: a malformed
/// request is refused, not silently reinterpreted.
fn check_asked(weight: f64, tenant: &str, pod_namespace: &str) -> Result<(), CoreError> {
    let bad = |field: &'static str, reason: String| CoreError::Invalid { field, reason };
    if !(weight.is_finite() && weight >= 0.0) {
        return Err(bad(
            "weight",
            format!("{weight} must be a finite number >= 0 (0: none)"),
        ));
    }
    for (field, v) in [("tenant", tenant), ("pod_namespace", pod_namespace)] {
        if v.len() > 253 || !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(
                field,
                format!("{v:.40?} must be at most 253 printable characters"),
            ));
        }
    }
    Ok(())
}

fn admit_info(policy: &FairnessSection, req: &api::AdmitRequest, kind: Kind) -> AdmitInfo {
    let d = decided(
        policy,
        &req.namespace,
        &req.pod_namespace,
        &req.function,
        &req.tenant,
        req.weight,
    );
    AdmitInfo {
        namespace: req.namespace.clone(),
        container_id: req.container_id.clone(),
        function: req.function.clone(),
        tenant: d.tenant,
        tenant_weight: d.tenant_weight,
        weight: d.weight,
        gpus: req.gpus.clone(),
        kind,
        shim_pid: req.shim_pid,
    }
}

fn running_info(policy: &FairnessSection, r: &api::Running, shim_pid: u32) -> AdmitInfo {
    let d = decided(
        policy,
        &r.namespace,
        &r.pod_namespace,
        &r.function,
        &r.tenant,
        r.weight,
    );
    AdmitInfo {
        namespace: r.namespace.clone(),
        container_id: r.container_id.clone(),
        function: r.function.clone(),
        tenant: d.tenant,
        tenant_weight: d.tenant_weight,
        weight: d.weight,
        gpus: r.gpus.clone(),
        kind: if r.burst { Kind::Burst } else { Kind::Start },
        shim_pid,
    }
}

impl Daemon {
    /// A daemon over `node`, writing the dispatch record to `log` when given.
    ///
    /// # Errors
    /// The log file cannot be opened.
    pub fn new(
        node: Node,
        backend: &'static str,
        log: Option<&Path>,
    ) -> std::io::Result<Arc<Self>> {
        Self::with_policy(node, backend, log, FairnessSection::default(), 0.0)
    }

    /// [`new`](Self::new) with the operator's fairness policy and the idle time after which a
    /// flow is forgotten (0: never).
    ///
    /// # Errors
    /// The log file cannot be opened.
    pub fn with_policy(
        node: Node,
        backend: &'static str,
        log: Option<&Path>,
        policy: FairnessSection,
        flow_idle_s: f64,
    ) -> std::io::Result<Arc<Self>> {
        let log = log.map(log::DispatchLog::open).transpose()?;
        let boot_id = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        Ok(Arc::new(Daemon {
            inner: Mutex::new(Inner {
                node,
                advice: Default::default(),
                pooled: HashMap::new(),
                orders: HashMap::new(),
                waiters: HashMap::new(),
                watched: HashSet::new(),
                placement: None,
                warm: (Warm::default(), Vec::new()),
                held: held::Held::default(),
            }),
            started: Instant::now(),
            boot_id,
            backend,
            metrics: Arc::new(Metrics::new()),
            log,
            orders_ready: tokio::sync::Notify::new(),
            policy,
            flow_idle_s,
        }))
    }

    /// The metrics.
    #[must_use]
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Identifies this run of the daemon.
    #[must_use]
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug; the state is still consistent enough
        // to keep serving (every core operation validates before it changes anything).
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Carries out what the node decided: grants to their waiters (a grant nobody waits for any
    /// more is released at once, which may grant the next one; a delivered grant of a pooled
    /// container is a pool hit), pool orders to their shims, events to the metrics; then writes
    /// the record.
    fn settle(&self, inner: &mut Inner, out: impl Into<Output>) {
        let now = self.now();
        let mut out = out.into();
        out.merge(inner.node.settle(now));
        loop {
            self.queue_orders(inner, std::mem::take(&mut out.orders));
            let events = std::mem::take(&mut out.events);
            if !events.is_empty() {
                self.metrics.pool(&events);
            }
            let grants = std::mem::take(&mut out.grants);
            if grants.is_empty() {
                break;
            }
            for g in grants {
                let delivered = match inner.waiters.remove(&g.key) {
                    Some(tx) => tx.send(Ok(g.clone())).is_ok(),
                    None => false,
                };
                let then = if !delivered {
                    tracing::info!(key = %g.key, lease = g.lease, "grant without a waiter: released");
                    Input::Release {
                        lease: g.lease,
                        measured_s: None,
                        reason: "caller gone".into(),
                        pooled: None,
                    }
                } else if inner.pooled.contains_key(&g.key) {
                    Input::Hit {
                        lease: g.lease,
                        container: None,
                    }
                } else {
                    continue;
                };
                if let Ok(more) = inner.node.step(&then, now) {
                    out.merge(more);
                }
            }
        }
        let records = inner.node.drain_log();
        if records.is_empty() {
            return;
        }
        self.metrics.record(&records);
        if let Some(log) = &self.log {
            log.write(records);
        }
    }

    /// Watches a shim's pid: when it exits, its leases and waits go.
    fn watch(self: &Arc<Self>, inner: &mut Inner, pid: u32) {
        if pid == 0 || !inner.watched.insert(pid) {
            return;
        }
        let Ok(raw) = i32::try_from(pid) else { return };
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is
        // passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
        let daemon = self.clone();
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!(
                pid,
                "cannot watch shim: {err}; its leases end only by Release"
            );
            if err.raw_os_error() == Some(libc::ESRCH) {
                // Already gone.
                tokio::spawn(async move { daemon.shim_gone(pid) });
            }
            return;
        }
        // SAFETY: `fd` is a new pidfd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) };
        tokio::spawn(async move {
            // SAFETY: the pidfd is owned by the AsyncFd for as long as it is registered.
            match unsafe { AsyncFd::register(fd) } {
                Ok(afd) => {
                    // A pidfd turns readable when the process exits.
                    let _ = afd.readable().await;
                }
                Err(e) => tracing::warn!(pid, "cannot poll shim pidfd: {e}"),
            }
            daemon.shim_gone(pid);
        });
    }

    fn shim_gone(&self, pid: u32) {
        let now = self.now();
        let mut inner = self.lock();
        inner.watched.remove(&pid);
        let (keys, leases, grants) = inner.node.core_mut().shim_gone(pid, now);
        for k in &keys {
            if let Some(tx) = inner.waiters.remove(k) {
                let _ = tx.send(Err(Withdrawn::ShimGone(pid)));
            }
        }
        if !keys.is_empty() || !leases.is_empty() {
            tracing::info!(pid, withdrawn = ?keys, released = ?leases, "shim gone");
        }
        inner.node.pool_mut().shim_gone(pid);
        inner.orders.remove(&pid);
        inner.pooled.retain(|_, p| p.shim != pid);
        self.settle(&mut inner, grants);
    }
}

/// The ttrpc service object.
#[derive(Debug, Clone)]
pub struct Service(pub Arc<Daemon>);

#[async_trait]
impl api::Admission for Service {
    async fn admit(
        &self,
        _ctx: &TtrpcContext,
        req: api::AdmitRequest,
    ) -> ttrpc::Result<api::AdmitResponse> {
        let d = &self.0;
        let kind = match req.kind.enum_value() {
            Ok(api::Kind::START) => Kind::Start,
            Ok(api::Kind::RESUME) => Kind::Resume,
            Ok(api::Kind::BURST) => Kind::Burst,
            Err(v) => {
                return Err(status(
                    ttrpc::Code::INVALID_ARGUMENT,
                    format!("invalid `kind`: {v} is not START, RESUME or BURST"),
                ));
            }
        };
        check_asked(req.weight, &req.tenant, &req.pod_namespace).map_err(|e| to_ttrpc(&e))?;
        let warm = warm_field("warm", &req.warm)?;
        let info = admit_info(&d.policy, &req, kind);
        let key = info.key().map_err(|e| to_ttrpc(&e))?;
        let (tx, rx) = oneshot::channel();
        {
            let now = d.now();
            let mut inner = d.lock();
            if inner.waiters.contains_key(&key) {
                return Err(to_ttrpc(&CoreError::AlreadyWaiting(key)));
            }
            inner.waiters.insert(key.clone(), tx);
            if req.pooled {
                inner.pool_container(&key, req.shim_pid, warm);
            }
            match inner.node.step(&Input::Admit(info), now) {
                Ok(out) => d.settle(&mut inner, out),
                Err(e) => {
                    inner.waiters.remove(&key);
                    if !matches!(e, CoreError::AlreadyWaiting(_)) {
                        inner.pooled.remove(&key);
                    }
                    return Err(to_ttrpc(&e));
                }
            }
            d.watch(&mut inner, req.shim_pid);
        }
        match rx.await {
            Ok(Ok(g)) => Ok(api::AdmitResponse {
                lease_id: g.lease,
                gpu: g.gpu,
                waited_ns: g.waited_ns,
                restore_onto: d.restore_onto(&key, g.gpu, &req.gpus),
                ..Default::default()
            }),
            Ok(Err(why)) => Err(status(
                ttrpc::Code::CANCELLED,
                format!("admission of {key} cancelled: {why}"),
            )),
            Err(_) => Err(status(
                ttrpc::Code::CANCELLED,
                format!("admission of {key} cancelled"),
            )),
        }
    }

    async fn release(
        &self,
        _ctx: &TtrpcContext,
        req: api::ReleaseRequest,
    ) -> ttrpc::Result<api::ReleaseResponse> {
        let d = &self.0;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a service time in ns, as seconds: exact for 104 days"
        )]
        let measured = (req.service_ns > 0).then(|| req.service_ns as f64 / 1e9);
        let reason = if req.reason.is_empty() {
            "release"
        } else {
            &req.reason
        };
        let now = d.now();
        let mut inner = d.lock();
        let lease = inner.node.core().lease(req.lease_id).map(|l| {
            (
                l.key.clone(),
                l.function.clone(),
                l.gpu,
                l.since,
                l.tenant.clone(),
            )
        });
        let ran = inner
            .node
            .core()
            .run_measured(req.lease_id, measured, reason, now);
        // Only for a lease the core holds (under this lock): its release cannot then be refused,
        // so what `pooled_end` changes in `pooled` stands with it.
        let pooled = lease.as_ref().and_then(|(key, _, gpu, _, _)| {
            Daemon::pooled_end(&mut inner, key.clone(), *gpu, reason, &req)
        });
        let release = Input::Release {
            lease: req.lease_id,
            measured_s: measured,
            reason: reason.to_owned(),
            pooled,
        };
        let out = inner.node.step(&release, now).map_err(|e| to_ttrpc(&e))?;
        if let (Some((_, function, gpu, since, tenant)), Some(service_s)) = (&lease, ran) {
            let held = req.native.as_ref().map_or(0, |n| {
                mqfq_proto::memory::from_proto(n)
                    .total()
                    .saturating_add(req.managed_bytes)
            });
            let run = place::Ended {
                function,
                tenant: tenant.as_deref(),
                gpu: *gpu,
                since: *since,
                service_s,
                pids: &req.pids,
                transfer_bytes: req.transfer_bytes,
                footprint: (held > 0).then_some(held),
            };
            Daemon::placement_learn(&mut inner, &run, now);
        }
        d.settle(&mut inner, out);
        Ok(api::ReleaseResponse::default())
    }

    async fn cancel(
        &self,
        _ctx: &TtrpcContext,
        req: api::CancelRequest,
    ) -> ttrpc::Result<api::CancelResponse> {
        let d = &self.0;
        let key = ContainerKey::new(&req.namespace, &req.container_id)
            .map_err(|e| status(ttrpc::Code::INVALID_ARGUMENT, e.to_string()))?;
        let now = d.now();
        let mut inner = d.lock();
        let mut grants = inner.node.core_mut().cancel(&key, "cancelled", now);
        let withdrawn = grants.is_some();
        // Cancel comes with every Kill and Delete of a GPU container, and when a shim gave up
        // waiting: a lease it holds ends here (a grant that raced the shim's deadline would
        // otherwise be held by nobody), and the container leaves the pool.
        // Out of the pool first: no order for it is taken with the release's answer.
        inner.pooled.remove(&key);
        inner.node.pool_mut().forget(&key);
        let mut out = Output::from(grants.take().unwrap_or_default());
        if let Some(lease) = inner.node.core().lease_of(&key) {
            let release = Input::Release {
                lease,
                measured_s: None,
                reason: "cancelled".into(),
                pooled: None,
            };
            if let Ok(more) = inner.node.step(&release, now) {
                out.merge(more);
            }
        }
        if let Some(tx) = inner.waiters.remove(&key) {
            let _ = tx.send(Err(Withdrawn::Cancelled));
        }
        d.settle(&mut inner, out);
        Ok(api::CancelResponse {
            withdrawn,
            ..Default::default()
        })
    }

    async fn register(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterRequest,
    ) -> ttrpc::Result<api::RegisterResponse> {
        register::register(&self.0, &req)
    }

    async fn status(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StatusRequest,
    ) -> ttrpc::Result<api::StatusResponse> {
        Ok(self.0.status_flushed().await)
    }

    async fn pool_orders(
        &self,
        _ctx: &TtrpcContext,
        req: api::PoolOrdersRequest,
    ) -> ttrpc::Result<api::PoolOrdersResponse> {
        pool::orders(&self.0, req).await
    }

    async fn pool_report(
        &self,
        _ctx: &TtrpcContext,
        req: api::PoolReportRequest,
    ) -> ttrpc::Result<api::PoolReportResponse> {
        pool::report(&self.0, &req)
    }

    async fn advise(
        &self,
        _ctx: &TtrpcContext,
        req: api::AdmitRequest,
    ) -> ttrpc::Result<api::AdviseResponse> {
        pool::advise(&self.0, &req, false)
    }

    async fn exported(
        &self,
        _ctx: &TtrpcContext,
        req: api::AdmitRequest,
    ) -> ttrpc::Result<api::AdviseResponse> {
        pool::advise(&self.0, &req, true)
    }

    async fn place(
        &self,
        _ctx: &TtrpcContext,
        req: api::AdmitRequest,
    ) -> ttrpc::Result<api::PlaceResponse> {
        place::place(&self.0, &req)
    }
}

#[cfg(test)]
mod tests;
