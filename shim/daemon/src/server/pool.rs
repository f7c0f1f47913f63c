//! The pool's side of the service: grants and re-registrations feed `scheduler_core::node::pool`, its
//! orders go to the shims through a long poll (`PoolOrders`), and their results come back
//! (`PoolReport`).

use std::sync::Arc;
use std::time::Duration;

use scheduler_core::Time;

use super::{Daemon, Inner, MAX_ORDERS_WAIT_MS, admit_info, check_asked, status, to_ttrpc};
use mqfq_proto::api;
use scheduler_core::node::ContainerKey;
use scheduler_core::node::Output;
use scheduler_core::node::admission::Kind;
use scheduler_core::node::pool::{Action, Order, Outcome};

impl Daemon {
    /// A paused pooled container a shim re-registered: the pool re-learns it. Entries that do not
    /// name a container or a GPU of this node are skipped with a log line (registration is
    /// repeated; one bad entry must not cost the others).
    pub(super) fn adopt_idle(
        inner: &mut Inner,
        r: &api::Running,
        flow: &str,
        shim_pid: u32,
        now: Time,
    ) {
        let Ok(key) = ContainerKey::new(&r.namespace, &r.container_id) else {
            tracing::warn!(
                shim = shim_pid,
                "idle container without a valid namespace and id: skipped"
            );
            return;
        };
        if r.function.is_empty() {
            tracing::warn!(shim = shim_pid, key = %key, "idle container without a function: skipped");
            return;
        }
        let gpu = match inner.node.core().resolve(&r.gpus) {
            Ok(g) if !g.is_empty() => g[0],
            Ok(_) | Err(_) => {
                tracing::warn!(shim = shim_pid, container = %r.container_id, gpus = ?r.gpus,
                    "idle container on no GPU of this node: skipped");
                return;
            }
        };
        if inner.node.core().lease_of(&key).is_some() {
            return;
        }
        // Checked when the registration came in.
        let warm = mqfq_proto::warm::Warm::from_wire(&r.warm).unwrap_or_default();
        inner.pool_container(&key, shim_pid, warm);
        let pool = inner.node.pool_mut();
        pool.adopt_idle(&key, flow, gpu, shim_pid, r.managed_bytes, r.evicted, now);
        if let Some(n) = r.native.as_ref() {
            pool.report_native(&key, mqfq_proto::memory::from_proto(n));
        }
    }

    /// Queues the pool's orders for their shims' long polls.
    pub(super) fn queue_orders(&self, inner: &mut Inner, orders: Vec<Order>) {
        if orders.is_empty() {
            return;
        }
        for o in orders {
            tracing::info!(key = %o.key, action = o.action.name(), shim = o.shim_pid, "pool order");
            inner.orders.entry(o.shim_pid).or_default().push(o);
        }
        self.orders_ready.notify_waiters();
    }
}

/// Advice for a container of `flow` being created; with `exported`, first learns that a
/// container of `flow` had an export of converted memory refused.
pub(super) fn advise(
    d: &Daemon,
    req: &api::AdmitRequest,
    exported: bool,
) -> ttrpc::Result<api::AdviseResponse> {
    check_asked(req.weight, &req.tenant, &req.pod_namespace).map_err(|e| to_ttrpc(&e))?;
    let info = admit_info(&d.policy, req, Kind::Start);
    let flow = info.flow_key();
    let flow = flow.as_str();
    let now = d.now();
    let (native, warm) = {
        let mut inner = d.lock();
        if exported && !flow.is_empty() {
            if !inner.advice.advises(flow, now) {
                tracing::info!(function = %flow,
                    "an export of converted GPU memory was refused: new containers of this \
                     function keep their allocations native");
            }
            inner.advice.learn(flow, info.tenant.as_deref(), now);
        }
        (inner.advice.advises(flow, now), inner.warm.clone())
    };
    Ok(api::AdviseResponse {
        native_alloc: if native { "all" } else { "" }.into(),
        warm: warm.0.as_str().into(),
        warm_allowed: warm.1.iter().map(|w| w.as_str().to_owned()).collect(),
        ..Default::default()
    })
}

/// `PoolOrders`: waits (long poll) for the orders of the calling shim.
pub(super) async fn orders(
    d: &Arc<Daemon>,
    req: api::PoolOrdersRequest,
) -> ttrpc::Result<api::PoolOrdersResponse> {
    if req.shim_pid == 0 {
        return Err(status(
            ttrpc::Code::INVALID_ARGUMENT,
            "invalid `shim_pid`: must be the calling shim's pid",
        ));
    }
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(u64::from(req.wait_ms.min(MAX_ORDERS_WAIT_MS)));
    loop {
        // Registered before looking, so an order queued in between is not missed.
        let ready = d.orders_ready.notified();
        tokio::pin!(ready);
        ready.as_mut().enable();
        {
            let mut inner = d.lock();
            d.watch(&mut inner, req.shim_pid);
            let orders = inner.orders.remove(&req.shim_pid).unwrap_or_default();
            if !orders.is_empty() {
                return Ok(api::PoolOrdersResponse {
                    orders: orders
                        .into_iter()
                        .map(|o| api::PoolOrder {
                            namespace: o.key.namespace().into(),
                            container_id: o.key.id().into(),
                            action: wire_action(o.action).into(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                });
            }
        }
        if tokio::time::timeout_at(deadline, ready).await.is_err() {
            return Ok(api::PoolOrdersResponse::default());
        }
    }
}

/// The most results one `PoolReport` may carry (a shim reports one per order it was given, and
/// holds at most `[limits] containers_per_shim` containers).
const MAX_REPORT_RESULTS: usize = 4096;

/// `PoolReport`: a shim's results become tier moves and metrics.
pub(super) fn report(
    d: &Daemon,
    req: &api::PoolReportRequest,
) -> ttrpc::Result<api::PoolReportResponse> {
    if req.results.len() > MAX_REPORT_RESULTS {
        return Err(status(
            ttrpc::Code::INVALID_ARGUMENT,
            format!(
                "invalid `results`: {} results, at most {MAX_REPORT_RESULTS} in one report",
                req.results.len()
            ),
        ));
    }
    let mut outcomes = Vec::with_capacity(req.results.len());
    for (i, r) in req.results.iter().enumerate() {
        let action = match r.action.enum_value() {
            Ok(a) => from_wire_action(a),
            Err(v) => {
                return Err(status(
                    ttrpc::Code::INVALID_ARGUMENT,
                    format!("invalid `results[{i}].action`: {v} is not a pool action"),
                ));
            }
        };
        let key = ContainerKey::new(&r.namespace, &r.container_id).map_err(|e| {
            status(
                ttrpc::Code::INVALID_ARGUMENT,
                format!(
                    "invalid `results[{i}].{}`: {:?} must be non-empty, without '/'",
                    e.field, e.value
                ),
            )
        })?;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a move's nanoseconds, reported in seconds"
        )]
        outcomes.push(Outcome {
            key,
            action,
            ok: r.ok,
            skipped: r.skipped,
            gone: r.gone,
            bytes: r.bytes,
            seconds: r.duration_ns as f64 / 1e9,
        });
    }
    let now = d.now();
    let mut inner = d.lock();
    for (o, r) in outcomes.iter().zip(&req.results) {
        // Results about containers the pool does not hold change nothing.
        if !inner.node.pool().knows(&o.key) {
            continue;
        }
        if r.ok || r.skipped {
            tracing::info!(key = %o.key, action = o.action.name(), bytes = o.bytes,
                ms = o.seconds * 1e3, skipped = o.skipped, "pool report");
        } else {
            tracing::warn!(key = %o.key, action = o.action.name(), "pool action failed: {}", r.error);
        }
        // A move the shim tried took time or succeeded; one that failed also says `gone` (the
        // shim drops the container): counted, as an error. "No such container" and the like
        // took no time: no move.
        if !o.skipped && (o.ok || o.seconds > 0.0) {
            let warm = inner
                .pooled
                .get(&o.key)
                .map_or_else(Default::default, |p| p.warm);
            d.metrics
                .pool_backend(warm.as_str(), o.action.name(), o.ok, o.bytes);
        }
        // Each result only moves the pool; the node joins what they changed once, below.
        inner.node.pool_mut().report(o, now);
    }
    d.settle(&mut inner, Output::default());
    Ok(api::PoolReportResponse::default())
}

fn wire_action(a: Action) -> api::PoolAction {
    match a {
        Action::Evict => api::PoolAction::EVICT,
        Action::Prefetch => api::PoolAction::PREFETCH,
        Action::Reclaim => api::PoolAction::RECLAIM,
        Action::Restore => api::PoolAction::RESTORE,
    }
}

fn from_wire_action(a: api::PoolAction) -> Action {
    match a {
        api::PoolAction::EVICT => Action::Evict,
        api::PoolAction::PREFETCH => Action::Prefetch,
        api::PoolAction::RECLAIM => Action::Reclaim,
        api::PoolAction::RESTORE => Action::Restore,
    }
}

/// Host memory (available, total) from /proc/meminfo, bytes.
pub(super) fn host_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}
