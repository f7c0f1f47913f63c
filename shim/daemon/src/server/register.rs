//! `Register`: a shim lists what it runs, what is being admitted and what it holds idle, every
//! second and after a daemon restart; the core adopts or reconciles its leases and the pool
//! re-learns its idle containers.

use std::sync::Arc;

use mqfq_proto::api;
use scheduler_core::node::admission::{CoreError, RunningInfo};
use scheduler_core::node::{ContainerKey, Input, Output};

use super::{Daemon, check_asked, running_info, to_ttrpc};

/// Registers `req`'s shim (see the module docs).
pub(super) fn register(
    d: &Arc<Daemon>,
    req: &api::RegisterRequest,
) -> ttrpc::Result<api::RegisterResponse> {
    let cap = d.lock().node.core().containers_per_shim();
    if req.running.len() + req.idle.len() > cap {
        return Err(to_ttrpc(&CoreError::Limit {
            what: "registered containers",
            limit: cap,
        }));
    }
    for r in req.running.iter().chain(&req.idle) {
        check_asked(r.weight, &r.tenant, &r.pod_namespace).map_err(|e| to_ttrpc(&e))?;
        super::warm_field("running.warm", &r.warm)?;
    }
    let running: Vec<RunningInfo> = req
        .running
        .iter()
        .map(|r| RunningInfo {
            info: running_info(&d.policy, r, req.shim_pid),
            lease: r.lease_id,
        })
        .collect();
    // A key that does not parse cannot be a lease's: it protects nothing.
    let admitting: Vec<ContainerKey> = req
        .admitting
        .iter()
        .filter_map(|k| k.parse().ok())
        .collect();
    let now = d.now();
    let mut inner = d.lock();
    let registered = inner
        .node
        .core_mut()
        .register(
            req.shim_pid,
            &running,
            &admitting,
            req.fail_open_starts,
            now,
        )
        .map_err(|e| to_ttrpc(&e));
    let mut out = Output::default();
    if let Ok(reg) = &registered {
        for ((r, wire), (key, lease)) in running.iter().zip(&req.running).zip(&reg.leases) {
            if wire.pooled && r.lease != *lease {
                // Newly adopted (a restarted daemon, or a fail-open start): running, Hot.
                // Checked above.
                let warm = mqfq_proto::warm::Warm::from_wire(&wire.warm).unwrap_or_default();
                inner.pool_container(key, req.shim_pid, warm);
                let hit = Input::Hit {
                    lease: *lease,
                    container: None,
                };
                if let Ok(more) = inner.node.step(&hit, now) {
                    out.merge(more);
                }
            }
        }
        for (key, lease) in &reg.released {
            tracing::warn!(shim = req.shim_pid, key = %key, lease, "lease the shim no longer lists: released");
            inner.pooled.remove(key);
            inner.node.pool_mut().forget(key);
        }
        out.grants.extend(reg.grants.iter().cloned());
    }
    for r in &req.idle {
        let flow = running_info(&d.policy, r, req.shim_pid).flow_key();
        Daemon::adopt_idle(&mut inner, r, &flow, req.shim_pid, now);
    }
    d.settle(&mut inner, out);
    let registered = registered?;
    d.watch(&mut inner, req.shim_pid);
    // Shims re-register every second: only news is worth a line.
    let new = running
        .iter()
        .zip(&registered.leases)
        .filter(|(r, (_, lease))| r.lease != *lease)
        .count();
    if new > 0 || req.fail_open_starts > 0 {
        tracing::info!(
            shim = req.shim_pid,
            containers = running.len(),
            adopted = new,
            fail_open = req.fail_open_starts,
            "shim registered"
        );
    }
    Ok(api::RegisterResponse {
        leases: registered
            .leases
            .into_iter()
            .map(|(key, lease)| api::Adopted {
                namespace: key.namespace().into(),
                container_id: key.id().into(),
                lease_id: lease,
                ..Default::default()
            })
            .collect(),
        boot_id: d.boot_id.clone(),
        ..Default::default()
    })
}
