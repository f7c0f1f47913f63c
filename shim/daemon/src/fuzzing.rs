//! Entry points for the daemon's fuzz targets in `fuzz/` (feature `fuzzing`; not part of the
//! runtime): what a node's files say (CDI specs, `mqfqd.toml`) and what a shim sends `mqfqd`.
//! Each must answer (a value or an error) and never panic, hang or allocate without bound; some
//! also check a property that must hold whatever the input.

use std::path::Path;

use arbitrary::Arbitrary;
use mqfq_proto::api;
use mqfq_proto::api::Admission;
use protobuf::Message;

/// A CDI spec, as JSON or YAML (the first byte picks).
pub fn cdi(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let file = if pick % 2 == 0 {
        "nvidia.json"
    } else {
        "nvidia.yaml"
    };
    if let Ok(mut node) = crate::nvidia::cdi::parse(Path::new(file), text) {
        let _ = node.select(&mqfq_edits::GpuSelection::All);
        let _ = serde_json::to_string(&node);
        node.error = None;
    }
}

/// `mqfqd.toml`: every accepted config yields working knobs and a pool.
pub fn daemon_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = crate::config::DaemonConfig::parse(text, Path::new("mqfqd.toml")) {
        cfg.queue_config().expect("checked");
        scheduler_core::node::pool::Pool::new(cfg.pool_config()).expect("checked");
        let _ = cfg.fairness.resolve(crate::policy::Asked {
            namespace: "ns",
            pod_namespace: "pod",
            function: "f",
            tenant: "t",
            weight: 2.0,
        });
    }
}

/// A container key from a small set, so requests meet each other.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct Key {
    ns: u8,
    id: u8,
}

impl Key {
    fn ns(self) -> String {
        format!("ns{}", self.ns % 3)
    }
    fn id(self) -> String {
        format!("c{}", self.id % 8)
    }
}

/// One registration entry.
#[derive(Clone, Debug, Arbitrary)]
pub struct Entry {
    key: Key,
    function: u8,
    tenant: String,
    weight: f64,
    gpus: Vec<u8>,
    lease: u8,
    pooled: bool,
    evicted: bool,
    bytes: u64,
}

impl Entry {
    fn wire(&self) -> api::Running {
        api::Running {
            namespace: self.key.ns(),
            container_id: self.key.id(),
            function: format!("f{}", self.function % 4),
            tenant: self.tenant.clone(),
            weight: self.weight,
            gpus: self.gpus.iter().map(|g| (g % 3).to_string()).collect(),
            lease_id: u64::from(self.lease),
            pooled: self.pooled,
            evicted: self.evicted,
            managed_bytes: self.bytes,
            ..Default::default()
        }
    }
}

/// What a shim can send `mqfqd`.
#[derive(Clone, Debug, Arbitrary)]
pub enum Request {
    /// Admit (runs until granted, alongside the rest).
    Admit {
        /// Which container.
        key: Key,
        /// Function index.
        function: u8,
        /// Asked tenant.
        tenant: String,
        /// Asked weight.
        weight: f64,
        /// GPUs.
        gpus: Vec<String>,
        /// Kind on the wire.
        kind: i32,
        /// Pooled.
        pooled: bool,
        /// The pod's namespace.
        pod_namespace: String,
    },
    /// Release a lease.
    Release {
        /// Lease id.
        lease: u8,
        /// Measured service.
        service_ns: u64,
        /// Reason.
        pause: bool,
        /// Managed bytes.
        bytes: u64,
        /// Native bytes (library) and refused exports (its low bits).
        native: u64,
    },
    /// Advise at Create, or report a refused export.
    Advise {
        /// Function index.
        function: u8,
        /// Asked tenant.
        tenant: String,
        /// Report an export first.
        exported: bool,
    },
    /// Cancel.
    Cancel(Key),
    /// Register.
    Register {
        /// Running.
        running: Vec<Entry>,
        /// Idle.
        idle: Vec<Entry>,
        /// Admitting.
        admitting: Vec<Key>,
        /// Fail-open starts.
        fail_open: u8,
    },
    /// A pool report.
    Report {
        /// Which container.
        key: Key,
        /// Action on the wire.
        action: i32,
        /// ok / skipped / gone.
        flags: u8,
        /// Bytes.
        bytes: u64,
    },
    /// Status.
    Status,
    /// Raw bytes through a message's protobuf decoder, then its handler.
    Raw {
        /// Which message.
        which: u8,
        /// Bytes.
        bytes: Vec<u8>,
    },
}

fn ctx() -> ttrpc::r#async::TtrpcContext {
    ttrpc::r#async::TtrpcContext {
        mh: ttrpc::MessageHeader::default(),
        metadata: std::collections::HashMap::new(),
        timeout_nano: 0,
    }
}

/// Drives `mqfqd`'s request handlers with a sequence of requests from one shim (this process,
/// so no other process is watched), then checks its books: every GPU's running count equals
/// the leases on it, and no GPU runs more than it has slots for ever being granted.
pub fn mqfqd_requests(reqs: &[Request]) {
    use scheduler_core::node::admission::{Core, GpuInfo};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let gpus = (0..2)
        .map(|i| GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "fuzz".into(),
            mode: scheduler_core::GpuMode::Plain,
            memory_total: 80 << 30,
            mig: Vec::new(),
        })
        .collect();
    let qcfg = scheduler_core::QueueConfig::default();
    let mut core = Core::new(gpus, &qcfg, |m| {
        scheduler_core::Profile::Balanced.concurrency(m)
    })
    .expect("core");
    core.set_limits(16, 16);
    let pool =
        scheduler_core::node::pool::Pool::new(crate::config::DaemonConfig::default().pool_config())
            .expect("pool");
    let daemon = crate::server::Daemon::with_policy(
        scheduler_core::node::Node::new(core, pool),
        "simulated",
        None,
        crate::policy::FairnessSection::default(),
        0.0,
    )
    .expect("daemon");
    let svc = crate::server::Service(daemon.clone());
    let me = std::process::id();
    rt.block_on(async {
        let mut waiting = Vec::new();
        for r in reqs.iter().take(64) {
            apply(&svc, r, me, &mut waiting).await;
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        for h in waiting {
            h.abort();
        }
    });
    let s = daemon.status();
    for g in &s.gpus {
        let held = s.leases.iter().filter(|l| l.gpu == g.index).count();
        assert_eq!(u64::from(g.running), held as u64, "{s:?}");
    }
}

/// One fuzzed request carried out on the service.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per request of the API, each built from the fuzzer's bytes"
)]
async fn apply(
    svc: &crate::server::Service,
    r: &Request,
    me: u32,
    waiting: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    match r {
        Request::Admit {
            key,
            function,
            tenant,
            weight,
            gpus,
            kind,
            pooled,
            pod_namespace,
        } => {
            let req = api::AdmitRequest {
                namespace: key.ns(),
                container_id: key.id(),
                function: format!("f{}", function % 4),
                tenant: tenant.clone(),
                weight: *weight,
                gpus: gpus.clone(),
                kind: protobuf::EnumOrUnknown::from_i32(*kind),
                shim_pid: me,
                pooled: *pooled,
                pod_namespace: pod_namespace.clone(),
                ..Default::default()
            };
            let s = svc.clone();
            waiting.push(tokio::spawn(async move {
                let _ = s.admit(&ctx(), req).await;
            }));
        }
        Request::Release {
            lease,
            service_ns,
            pause,
            bytes,
            native,
        } => {
            let n = scheduler_core::native::Native {
                library: *native,
                refused: native & 3,
                ..Default::default()
            };
            let req = api::ReleaseRequest {
                lease_id: u64::from(*lease),
                service_ns: *service_ns,
                reason: if *pause { "pause" } else { "exit" }.into(),
                managed_bytes: *bytes,
                native: Some(mqfq_proto::memory::to_proto(&n)).into(),
                ..Default::default()
            };
            let _ = svc.release(&ctx(), req).await;
        }
        Request::Advise {
            function,
            tenant,
            exported,
        } => {
            let req = api::AdmitRequest {
                function: format!("f{}", function % 4),
                tenant: tenant.clone(),
                shim_pid: me,
                ..Default::default()
            };
            let r = if *exported {
                svc.exported(&ctx(), req).await
            } else {
                svc.advise(&ctx(), req).await
            };
            if let Ok(r) = r {
                assert!(
                    r.native_alloc.is_empty() || r.native_alloc == "all",
                    "{r:?}"
                );
            }
        }
        Request::Cancel(key) => {
            let req = api::CancelRequest {
                namespace: key.ns(),
                container_id: key.id(),
                ..Default::default()
            };
            let _ = svc.cancel(&ctx(), req).await;
        }
        Request::Register {
            running,
            idle,
            admitting,
            fail_open,
        } => {
            let req = api::RegisterRequest {
                shim_pid: me,
                running: running.iter().map(Entry::wire).collect(),
                idle: idle.iter().map(Entry::wire).collect(),
                admitting: admitting
                    .iter()
                    .map(|k| format!("{}/{}", k.ns(), k.id()))
                    .collect(),
                fail_open_starts: u64::from(*fail_open),
                ..Default::default()
            };
            let _ = svc.register(&ctx(), req).await;
        }
        Request::Report {
            key,
            action,
            flags,
            bytes,
        } => {
            let req = api::PoolReportRequest {
                shim_pid: me,
                results: vec![api::PoolResult {
                    namespace: key.ns(),
                    container_id: key.id(),
                    action: protobuf::EnumOrUnknown::from_i32(*action),
                    ok: flags & 1 != 0,
                    skipped: flags & 2 != 0,
                    gone: flags & 4 != 0,
                    bytes: *bytes,
                    ..Default::default()
                }],
                ..Default::default()
            };
            let _ = svc.pool_report(&ctx(), req).await;
        }
        Request::Status => {
            let _ = svc.status(&ctx(), api::StatusRequest::default()).await;
        }
        Request::Raw { which, bytes } => match which % 4 {
            0 => {
                if let Ok(mut req) = api::ReleaseRequest::parse_from_bytes(bytes) {
                    req.lease_id %= 256;
                    let _ = svc.release(&ctx(), req).await;
                }
            }
            1 => {
                if let Ok(mut req) = api::RegisterRequest::parse_from_bytes(bytes) {
                    req.shim_pid = me;
                    let _ = svc.register(&ctx(), req).await;
                }
            }
            2 => {
                if let Ok(mut req) = api::PoolReportRequest::parse_from_bytes(bytes) {
                    req.shim_pid = me;
                    let _ = svc.pool_report(&ctx(), req).await;
                }
            }
            _ => {
                if let Ok(req) = api::CancelRequest::parse_from_bytes(bytes) {
                    let _ = svc.cancel(&ctx(), req).await;
                }
            }
        },
    }
}
