//! The Status answer: the daemon's whole state as `mqfqctl status` and the cluster publisher
//! read it; and the read-only service of the status socket, which answers it and nothing else.

use std::sync::Arc;

use async_trait::async_trait;
use mqfq_proto::api;
use scheduler_core::node::admission::Core;
use scheduler_core::node::pool::Action;
use scheduler_core::placement::cluster::class_label;
use scheduler_core::placement::models::{builtin, lookup};
use ttrpc::r#async::TtrpcContext;

use super::Daemon;

/// The status socket's service: Status, and nothing else — every other call gets the
/// generated answer (NOT_FOUND), so a reader given this socket (the cluster publisher's pod)
/// cannot admit, release, register or order the pool.
#[derive(Debug, Clone)]
pub struct StatusOnly(pub Arc<Daemon>);

#[async_trait]
impl api::Admission for StatusOnly {
    async fn status(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StatusRequest,
    ) -> ttrpc::Result<api::StatusResponse> {
        Ok(self.0.status_flushed().await)
    }
}

impl Daemon {
    /// The Status answer, once what it shows is in the dispatch log.
    pub(super) async fn status_flushed(&self) -> api::StatusResponse {
        if let Some(log) = &self.log {
            log.flush().await;
        }
        self.status()
    }

    /// The Status answer.
    #[must_use]
    pub fn status(&self) -> api::StatusResponse {
        let now = self.now();
        let inner = self.lock();
        let core = inner.node.core();
        let gpus = gpu_rows(&inner);
        let flows = core
            .flows()
            .into_iter()
            .map(|(gpu, f)| {
                let measured = inner
                    .placement
                    .as_ref()
                    .and_then(|p| p.features().get(&f.key));
                api::FlowStatus {
                    sm_share: measured.and_then(|m| m.sm.measured()),
                    dram_share: measured.and_then(|m| m.dram.measured()),
                    transfer_bytes: measured.and_then(|m| m.transfer_bytes.measured()),
                    footprint_mib: measured.and_then(|m| m.footprint_mib.measured()),
                    class: inner.placement.as_ref().map_or_else(String::new, |p| {
                        class_label(p.features().class(&f.key))
                            .unwrap_or("probing")
                            .to_owned()
                    }),
                    function: f.key,
                    gpu,
                    state: Core::state_name(f.state).into(),
                    start_tag: f.start,
                    finish_tag: f.finish,
                    queued: f.queued as u64,
                    in_flight: f.in_flight,
                    weight: f.weight,
                    service_s: f.service_s.unwrap_or(0.0),
                    gpu_time_s: f.gpu_time_s,
                    dispatched: f.dispatched,
                    completed: f.completed,
                    tenant: f.tenant.unwrap_or_default(),
                    ..Default::default()
                }
            })
            .collect();
        let leases = core
            .leases()
            .map(|(id, l)| api::LeaseStatus {
                lease_id: id,
                namespace: l.key.namespace().into(),
                container_id: l.key.id().into(),
                function: l.function.clone(),
                gpu: l.gpu,
                shim_pid: l.shim_pid,
                held_ns: now.as_nanos().saturating_sub(l.since.as_nanos()),
                kind: l.kind.as_str().to_owned(),
                overtime: l.overtime,
                ..Default::default()
            })
            .collect();
        let pool = inner
            .node
            .pool()
            .entries(now)
            .into_iter()
            .map(|e| api::PoolEntry {
                namespace: e.key.namespace().into(),
                container_id: e.key.id().into(),
                function: e.function,
                gpu: e.gpu,
                tier: format!("{:?}", e.tier).to_lowercase(),
                bytes: e.bytes,
                busy: e.busy,
                idle_ns: e.idle_ns,
                pending: e.pending.map_or("", Action::name).into(),
                uses: e.uses,
                native: Some(mqfq_proto::memory::to_proto(&e.native)).into(),
                warm: inner
                    .pooled
                    .get(&e.key)
                    .map_or("", |p| p.warm.as_str())
                    .into(),
                resident: e.resident,
                ..Default::default()
            })
            .collect();
        api::StatusResponse {
            pool,
            boot_id: self.boot_id.clone(),
            backend: self.backend.into(),
            policy: core.order().as_str().into(),
            late_binding: core.late_binding(),
            warm: inner.warm.0.as_str().into(),
            gpus,
            flows,
            leases,
            waiting: core.waiting() as u64,
            fail_open_starts: core.fail_open_starts(),
            ..Default::default()
        }
    }
}

/// Each GPU's row: the core's view, its model's figures and placement's health.
fn gpu_rows(inner: &super::Inner) -> Vec<api::GpuStatus> {
    let builtin_models;
    let models = match &inner.placement {
        Some(p) => &p.config().models,
        None => {
            builtin_models = builtin();
            &builtin_models
        }
    };
    inner
        .node
        .core()
        .gpus()
        .into_iter()
        .map(|g| {
            let model = lookup(models, &g.info.name);
            let mem = g.memory;
            api::GpuStatus {
                memory_budget: mem.budget,
                memory_held: mem.held,
                memory_reserved: mem.reserved,
                memory_kept: mem.kept,
                memory_blocked: mem.blocked,
                tflops: model.tflops,
                mem_gbps: model.mem_gbps,
                index: g.info.index,
                uuid: g.info.uuid,
                name: g.info.name,
                mode: format!("{:?}", g.info.mode).to_lowercase(),
                d: g.d,
                limit: g.limit,
                running: g.running,
                utilization: g.reading.busy.unwrap_or(0.0),
                sm_activity: g.reading.sm_activity,
                slowdown: g.reading.slowdown,
                pressure: g.reading.pressure,
                memory_used: g.memory_used,
                memory_total: g.info.memory_total,
                virtual_time: g.virtual_time,
                queued: g.queued as u64,
                health: inner
                    .placement
                    .as_ref()
                    .map_or_else(String::new, |p| p.health(g.info.index).name().to_owned()),
                ..Default::default()
            }
        })
        .collect()
}
