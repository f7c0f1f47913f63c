//! Prometheus metrics of `mqfqd` and a minimal HTTP endpoint for them (`GET /metrics`).
//!
//! Per-function counters and queue lengths move as the dispatch record is written (no scan of
//! the flows), per-GPU gauges at every sample, so a scrape costs one text encoding and never
//! takes the admission lock.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use scheduler_core::node::admission::{GpuView, Record};

type Labels = Vec<(String, String)>;

fn function(f: &str) -> Labels {
    vec![("function".into(), f.into())]
}

fn gpu(i: u32) -> Labels {
    vec![("gpu".into(), i.to_string())]
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    queue_length: Family<Labels, Gauge>,
    queue_wait: Family<Labels, Histogram>,
    gpu_time: Family<Labels, Counter<f64, AtomicU64>>,
    admitted: Family<Labels, Counter>,
    overdue: Family<Labels, Counter>,
    admissions: Family<Labels, Counter>,
    completed: Family<Labels, Counter>,
    d: Family<Labels, Gauge<f64, AtomicU64>>,
    limit: Family<Labels, Gauge>,
    running: Family<Labels, Gauge>,
    utilization: Family<Labels, Gauge<f64, AtomicU64>>,
    sm_activity: Family<Labels, Gauge<f64, AtomicU64>>,
    dram_bandwidth: Family<Labels, Gauge<f64, AtomicU64>>,
    slowdown: Family<Labels, Gauge<f64, AtomicU64>>,
    memory_used: Family<Labels, Gauge>,
    memory_total: Family<Labels, Gauge>,
    memory_admitted: Family<Labels, Gauge>,
    fail_open: Gauge,
    dead_shim_releases: Counter,
    overtime: Family<Labels, Counter>,
    pool_hits: Family<Labels, Counter>,
    pool_moves: Family<Labels, Counter>,
    pool_bytes: Family<Labels, Counter>,
    pool_backend_moves: Family<Labels, Counter>,
    pool_backend_bytes: Family<Labels, Counter>,
    pool_restore: Histogram,
    pool_containers: Family<Labels, Gauge>,
    pool_function_containers: Family<Labels, Gauge>,
    pool_function_memory: Family<Labels, Gauge>,
    pool_function_refused: Family<Labels, Gauge>,
    placements: Family<Labels, Counter>,
    gpu_health: Family<Labels, Gauge>,
    xids: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family.
    #[must_use]
    #[expect(
        clippy::too_many_lines,
        reason = "the one list of metric families with their help texts, as /metrics shows them"
    )]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mqfq");
        let m = Metrics {
            queue_length: Family::default(),
            queue_wait: Family::new_with_constructor(|| {
                Histogram::new([
                    0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ])
            }),
            gpu_time: Family::default(),
            admitted: Family::default(),
            overdue: Family::default(),
            completed: Family::default(),
            d: Family::default(),
            limit: Family::default(),
            running: Family::default(),
            utilization: Family::default(),
            sm_activity: Family::default(),
            dram_bandwidth: Family::default(),
            slowdown: Family::default(),
            memory_used: Family::default(),
            memory_total: Family::default(),
            memory_admitted: Family::default(),
            fail_open: Gauge::default(),
            dead_shim_releases: Counter::default(),
            overtime: Family::default(),
            admissions: Family::default(),
            pool_hits: Family::default(),
            pool_backend_moves: Family::default(),
            pool_backend_bytes: Family::default(),
            pool_moves: Family::default(),
            pool_bytes: Family::default(),
            pool_restore: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            pool_containers: Family::default(),
            pool_function_containers: Family::default(),
            pool_function_memory: Family::default(),
            pool_function_refused: Family::default(),
            placements: Family::default(),
            gpu_health: Family::default(),
            xids: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "placements",
            "GPU choices for containers given several, per chosen GPU and reason (probe, fitness, overloaded)",
            m.placements.clone(),
        );
        registry.register(
            "gpu_health",
            "Per GPU: 0 healthy, 1 overloaded, 2 failed (avoided for new containers)",
            m.gpu_health.clone(),
        );
        registry.register(
            "gpu_xid",
            "Critical Xid errors NVML reported, per GPU and Xid (values past 1000 counted as other)",
            m.xids.clone(),
        );
        registry.register(
            "queue_length",
            "Admissions waiting, per function",
            m.queue_length.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time from Admit to dispatch, per function",
            m.queue_wait.clone(),
        );
        registry.register(
            "gpu_time_seconds",
            "Measured GPU service (lease time), per function",
            m.gpu_time.clone(),
        );
        registry.register(
            "admitted",
            "Admissions dispatched, per function",
            m.admitted.clone(),
        );
        registry.register(
            "overdue_admitted",
            "Admissions dispatched ahead of the fair order by the overtake bound, per function",
            m.overdue.clone(),
        );
        registry.register(
            "admissions",
            "Admissions asked for, by kind (start, resume, burst)",
            m.admissions.clone(),
        );
        registry.register(
            "completed",
            "Leases ended, per function",
            m.completed.clone(),
        );
        registry.register(
            "gpu_concurrency_d",
            "Dynamic concurrency D, per GPU",
            m.d.clone(),
        );
        registry.register(
            "gpu_concurrency_limit",
            "Concurrency limit in force, per GPU",
            m.limit.clone(),
        );
        registry.register("gpu_leases", "Leases held, per GPU", m.running.clone());
        registry.register(
            "gpu_utilization_ratio",
            "NVML busy-time (any kernel running) over the last sample, per GPU; never cuts D, and lets it grow only without GPM in a sample in which no admission ended",
            m.utilization.clone(),
        );
        registry.register(
            "gpu_sm_activity_ratio",
            "SM activity over the last sample (GPM, Hopper and later), per GPU",
            m.sm_activity.clone(),
        );
        registry.register(
            "gpu_dram_bandwidth_ratio",
            "DRAM bandwidth used over the last sample (GPM), per GPU",
            m.dram_bandwidth.clone(),
        );
        registry.register(
            "gpu_slowdown_ratio",
            "Slowdown of the admissions that ended in the last sample against their functions' baselines, per GPU",
            m.slowdown.clone(),
        );
        registry.register(
            "gpu_memory_used_bytes",
            "GPU memory in use",
            m.memory_used.clone(),
        );
        registry.register(
            "gpu_memory_total_bytes",
            "GPU memory size",
            m.memory_total.clone(),
        );
        registry.register(
            "gpu_memory_admitted_bytes",
            "Memory admission per GPU: kind=budget (capacity less headroom), held (footprints of the leases held), reserved (room kept for the largest active short flow), kept (footprints of the flows whose memory the GPU keeps: Active and resident there, or with calls waiting; kept from a flow's second lease)",
            m.memory_admitted.clone(),
        );
        registry.register(
            "fail_open_starts",
            "GPU task starts shims let through without a lease while mqfqd was unreachable (as reported on reconnect)",
            m.fail_open.clone(),
        );
        registry.register(
            "dead_shim_releases",
            "Leases released because their shim died",
            m.dead_shim_releases.clone(),
        );
        registry.register(
            "burst_overtime",
            "Burst leases held past [limits] max_burst_hold_s (they keep running; their GPU takes one more lease, for another function, while each is held)",
            m.overtime.clone(),
        );
        registry.register(
            "pool_hits",
            "Admissions of pooled containers by the tier they were in (cold: a new container)",
            m.pool_hits.clone(),
        );
        registry.register(
            "pool_moves",
            "Pool actions (evict, prefetch, restore, reclaim) by result",
            m.pool_moves.clone(),
        );
        registry.register(
            "pool_moved_bytes",
            "Bytes moved by the pool, by direction (to_host, to_device)",
            m.pool_bytes.clone(),
        );
        registry.register(
            "pool_backend_moves",
            "Moves the shims reported, by Warm-tier backend (checkpoint, uvm), action and result",
            m.pool_backend_moves.clone(),
        );
        registry.register(
            "pool_backend_bytes",
            "Bytes the shims' successful moves carried, by Warm-tier backend and action",
            m.pool_backend_bytes.clone(),
        );
        registry.register(
            "pool_restore_seconds",
            "Time a shim took to bring an admitted Warm container's memory back",
            m.pool_restore.clone(),
        );
        registry.register(
            "pool_containers",
            "Pooled containers per tier",
            m.pool_containers.clone(),
        );
        registry.register(
            "pool_function_containers",
            "Pooled containers per function and tier",
            m.pool_function_containers.clone(),
        );
        registry.register(
            "pool_function_memory_bytes",
            "GPU memory of pooled containers per function, by kind: managed (the pool moves it) \
             or why it stays native (vmm, stream-ordered, array, setting, library, export, other)",
            m.pool_function_memory.clone(),
        );
        registry.register(
            "pool_function_exports_refused",
            "Export requests (IPC, dma-buf, RDMA tokens) the driver refused on converted memory, \
             per function, summed over its pooled containers",
            m.pool_function_refused.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Drops the per-function series of forgotten flows (function keys come from pods: kept
    /// forever they would grow without bound).
    pub fn forget_functions(&self, functions: &[String]) {
        for f in functions {
            let l = self::function(f);
            self.queue_length.remove(&l);
            self.queue_wait.remove(&l);
            self.gpu_time.remove(&l);
            self.admitted.remove(&l);
            self.overdue.remove(&l);
            self.completed.remove(&l);
        }
    }

    /// Accounts the dispatch record.
    pub fn record(&self, records: &[Record]) {
        for r in records {
            match r {
                Record::Enqueue { function, kind, .. } => {
                    self.queue_length
                        .get_or_create(&self::function(function))
                        .inc();
                    self.admissions
                        .get_or_create(&vec![("kind".into(), kind.as_str().into())])
                        .inc();
                }
                // Still waiting, on another GPU: neither a new admission nor one gone.
                Record::Move { .. } => {}
                Record::Withdraw { function, .. } => {
                    self.queue_length
                        .get_or_create(&self::function(function))
                        .dec();
                }
                Record::Dispatch {
                    function,
                    waited_ns,
                    overdue,
                    ..
                } => {
                    self.queue_length
                        .get_or_create(&self::function(function))
                        .dec();
                    self.admitted.get_or_create(&self::function(function)).inc();
                    if *overdue {
                        self.overdue.get_or_create(&self::function(function)).inc();
                    }
                    #[expect(
                        clippy::cast_precision_loss,
                        reason = "a wait in ns, observed in seconds"
                    )]
                    self.queue_wait
                        .get_or_create(&self::function(function))
                        .observe(*waited_ns as f64 / 1e9);
                }
                Record::Charge { .. } => {}
                Record::Overtime { function, .. } => {
                    self.overtime.get_or_create(&self::function(function)).inc();
                }
                Record::Adopt { function, .. } => {
                    self.admitted.get_or_create(&self::function(function)).inc();
                }
                Record::Release {
                    function,
                    measured_s,
                    reason,
                    ..
                } => {
                    self.completed
                        .get_or_create(&self::function(function))
                        .inc();
                    if let Some(s) = measured_s {
                        self.gpu_time
                            .get_or_create(&self::function(function))
                            .inc_by(*s);
                    }
                    if reason == "shim gone" {
                        self.dead_shim_releases.inc();
                    }
                }
            }
        }
    }

    /// Refreshes the per-GPU gauges.
    pub fn gauges(&self, gpus: &[GpuView], fail_open: u64) {
        for g in gpus {
            let l = gpu(g.info.index);
            self.d.get_or_create(&l).set(g.d);
            self.limit.get_or_create(&l).set(i64::from(g.limit));
            self.running.get_or_create(&l).set(i64::from(g.running));
            self.utilization
                .get_or_create(&l)
                .set(g.reading.busy.unwrap_or(0.0));
            // Last value seen: a sample in which no admission ended says nothing new.
            if let Some(s) = g.reading.slowdown {
                self.slowdown.get_or_create(&l).set(s);
            }
            self.memory_used
                .get_or_create(&l)
                .set(i64::try_from(g.memory_used).unwrap_or(i64::MAX));
            self.memory_total
                .get_or_create(&l)
                .set(i64::try_from(g.info.memory_total).unwrap_or(i64::MAX));
            for (kind, v) in [
                ("budget", g.memory.budget),
                ("held", g.memory.held),
                ("reserved", g.memory.reserved),
                ("kept", g.memory.kept),
            ] {
                let mut k = l.clone();
                k.push(("kind".into(), kind.into()));
                self.memory_admitted
                    .get_or_create(&k)
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
        self.fail_open
            .set(i64::try_from(fail_open).unwrap_or(i64::MAX));
    }

    /// The GPM gauges from the monitor's samples; a GPU without GPM has no such series.
    pub fn gpm(&self, samples: &[crate::monitor::Sample]) {
        for s in samples {
            let l = gpu(s.index);
            for (family, v) in [
                (&self.sm_activity, s.sm_activity),
                (&self.dram_bandwidth, s.dram_bandwidth),
            ] {
                match v {
                    Some(v) => {
                        family.get_or_create(&l).set(v);
                    }
                    None => {
                        family.remove(&l);
                    }
                }
            }
        }
    }

    /// The text exposition.
    #[must_use]
    pub fn render(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &self.registry);
        s
    }

    /// The exposition with one unlabelled sample in every family, so each family's name and
    /// kind show (an empty family prints nothing). For checks of what dashboards query
    /// (`tests/dashboard.rs`); a daemon never calls it.
    #[doc(hidden)]
    #[must_use]
    pub fn every_family_for_tests(&self) -> String {
        let none = Labels::new();
        for f in [
            &self.queue_length,
            &self.limit,
            &self.running,
            &self.memory_used,
            &self.memory_total,
            &self.memory_admitted,
            &self.pool_containers,
            &self.pool_function_containers,
            &self.pool_function_memory,
            &self.pool_function_refused,
            &self.gpu_health,
        ] {
            f.get_or_create(&none).set(0);
        }
        for f in [
            &self.d,
            &self.utilization,
            &self.sm_activity,
            &self.dram_bandwidth,
            &self.slowdown,
        ] {
            f.get_or_create(&none).set(0.0);
        }
        for f in [
            &self.admitted,
            &self.admissions,
            &self.completed,
            &self.pool_hits,
            &self.pool_moves,
            &self.pool_bytes,
            &self.pool_backend_moves,
            &self.pool_backend_bytes,
            &self.placements,
            &self.xids,
        ] {
            f.get_or_create(&none).inc();
        }
        self.gpu_time.get_or_create(&none).inc();
        self.queue_wait.get_or_create(&none).observe(0.0);
        self.pool_restore.observe(0.0);
        self.fail_open.set(0);
        self.dead_shim_releases.inc();
        self.render()
    }
}

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 32;
/// The whole exchange (request head in, page out) must finish within this.
const EXCHANGE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `GET /metrics` on `listener`: at most [`MAX_CONNECTIONS`] at once, each bounded in size
/// (a 4 KiB request head) and in time (`EXCHANGE_DEADLINE` for the whole exchange, so a client
/// that trickles bytes is cut off); an accept error (out of descriptors) pauses accepting
/// briefly instead of spinning.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut conn = match listener.accept().await {
            Ok((c, _)) => c,
            Err(e) => {
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let exchange = async {
                let mut buf = vec![0u8; 4096];
                let mut len = 0;
                // Read the request head (bounded), then answer and close.
                while len < buf.len() {
                    match conn.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buf[..len]);
                let (status, body) = match (
                    head.split_whitespace().next(),
                    head.split_whitespace().nth(1),
                ) {
                    (Some("GET"), Some("/metrics")) => ("200 OK", metrics.render()),
                    (Some("GET"), Some(_)) => ("404 Not Found", "try /metrics\n".to_owned()),
                    _ => ("400 Bad Request", "bad request\n".to_owned()),
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            };
            let _ = tokio::time::timeout(EXCHANGE_DEADLINE, exchange).await;
        });
    }
}

impl Metrics {
    /// A placement choice.
    pub fn placed(&self, gpu_index: u32, reason: &str) {
        let mut l = gpu(gpu_index);
        l.push(("reason".into(), reason.into()));
        self.placements.get_or_create(&l).inc();
    }

    /// A GPU's health for new containers.
    pub fn set_gpu_health(&self, gpu_index: u32, h: scheduler_core::placement::Health) {
        let v = match h {
            scheduler_core::placement::Health::Healthy => 0,
            scheduler_core::placement::Health::Overloaded => 1,
            scheduler_core::placement::Health::Failed => 2,
        };
        self.gpu_health.get_or_create(&gpu(gpu_index)).set(v);
    }

    /// A critical Xid NVML reported for a GPU.
    pub fn xid(&self, gpu_index: u32, xid: u64) {
        let x = if xid <= 1000 {
            xid.to_string()
        } else {
            "other".to_owned()
        };
        let mut l = gpu(gpu_index);
        l.push(("xid".into(), x));
        self.xids.get_or_create(&l).inc();
    }
}

mod pool;
#[cfg(test)]
mod tests;
