//! `mqfqctl`: the operator's view of `mqfqd` (status, a refreshing top), over the same ttrpc API
//! the shims use.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use mqfq_proto::api;

pub use mqfq_proto::connect;

/// One Status call, with a 5 s deadline.
///
/// # Errors
/// The daemon is unreachable or failed.
pub async fn status(socket: &Path) -> Result<api::StatusResponse, ttrpc::Error> {
    let c = connect(socket).await?;
    c.status(
        ttrpc::context::with_timeout(5_000_000_000),
        &api::StatusRequest::default(),
    )
    .await
}

fn gib(b: u64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "bytes shown in GiB")]
    let g = b as f64 / f64::from(1u32 << 30);
    g
}

/// The status as a table.
#[must_use]
pub fn render(s: &api::StatusResponse) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "mqfqd {} · policy {}{} · backend {} · warm by {} · {} waiting · {} leases · {} fail-open \
         starts reported",
        s.boot_id,
        s.policy,
        if s.late_binding {
            " (late binding)"
        } else {
            ""
        },
        s.backend,
        if s.warm.is_empty() { "uvm" } else { &s.warm },
        s.waiting,
        s.leases.len(),
        s.fail_open_starts
    );
    render_gpus(&mut o, &s.gpus);
    render_flows(&mut o, &s.flows);
    if !s.leases.is_empty() {
        render_leases(&mut o, &s.leases);
    }
    if !s.pool.is_empty() {
        render_pool(&mut o, &s.pool);
    }
    o
}

/// Each GPU's row, with its admitted memory and health when they say something.
fn render_gpus(o: &mut String, gpus: &[api::GpuStatus]) {
    let _ = writeln!(
        o,
        "\n{:>3} {:<7} {:>6} {:>5} {:>7} {:>6} {:>6} {:>6} {:>5} {:>15} {:>9}  NAME",
        "GPU", "MODE", "D", "LIMIT", "RUNNING", "QUEUED", "BUSY", "SM", "SLOW", "MEMORY GiB", "V"
    );
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", v * 100.0));
    for g in gpus {
        let _ = writeln!(
            o,
            "{:>3} {:<7} {:>6.2} {:>5} {:>7} {:>6} {:>5.0}% {:>6} {:>5} {:>7.1}/{:<7.1} {:>9.3}  {}",
            g.index,
            g.mode,
            g.d,
            g.limit,
            g.running,
            g.queued,
            g.utilization * 100.0,
            pct(g.sm_activity),
            g.slowdown
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")),
            gib(g.memory_used),
            gib(g.memory_total),
            g.virtual_time,
            g.name
        );
        if g.memory_budget > 0 {
            let free = g
                .memory_budget
                .saturating_sub(g.memory_held)
                .saturating_sub(g.memory_reserved);
            let _ = writeln!(
                o,
                "    admitted memory GiB: held {:.1}, reserved {:.1}, free {:.1} of {:.1} \
                 (kept {:.1}){}",
                gib(g.memory_held),
                gib(g.memory_reserved),
                gib(free),
                gib(g.memory_budget),
                gib(g.memory_kept),
                if g.memory_blocked {
                    "; work waits for memory"
                } else {
                    ""
                }
            );
        }
        if !g.health.is_empty() && g.health != "healthy" {
            let _ = writeln!(o, "    GPU {} is {} for new containers", g.index, g.health);
        }
    }
}

/// Each flow's row, then the measured features of those placement has classed.
fn render_flows(o: &mut String, flows: &[api::FlowStatus]) {
    let _ = writeln!(
        o,
        "\n{:<28} {:>3} {:<9} {:>9} {:>9} {:>6} {:>8} {:>6} {:>9} {:>9}",
        "FUNCTION",
        "GPU",
        "STATE",
        "START",
        "FINISH",
        "QUEUED",
        "INFLIGHT",
        "WEIGHT",
        "SERVICE s",
        "GPU s"
    );
    for f in flows {
        let _ = writeln!(
            o,
            "{:<28} {:>3} {:<9} {:>9.3} {:>9.3} {:>6} {:>8} {:>6.2} {:>9.3} {:>9.2}",
            f.function,
            f.gpu,
            f.state,
            f.start_tag,
            f.finish_tag,
            f.queued,
            f.in_flight,
            f.weight,
            f.service_s,
            f.gpu_time_s
        );
    }
    for f in flows.iter().filter(|f| !f.class.is_empty()) {
        let _ = writeln!(o, "    {}: {}", f.function, features_text(f));
    }
}

/// Each lease held.
fn render_leases(o: &mut String, leases: &[api::LeaseStatus]) {
    let _ = writeln!(
        o,
        "\n{:>6} {:<36} {:<24} {:<8} {:>3} {:>8} {:>8}",
        "LEASE", "CONTAINER", "FUNCTION", "KIND", "GPU", "SHIM", "HELD s"
    );
    for l in leases {
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds held, shown in seconds"
        )]
        let held = l.held_ns as f64 / 1e9;
        let _ = writeln!(
            o,
            "{:>6} {:<36} {:<24} {:<8} {:>3} {:>8} {:>8.2}",
            l.lease_id,
            format!("{}/{}", l.namespace, l.container_id),
            l.function,
            // A burst past the maximum hold.
            if l.overtime { "overtime" } else { &l.kind },
            l.gpu,
            l.shim_pid,
            held
        );
    }
}

/// A flow's placement class and measured features, in words.
fn features_text(f: &api::FlowStatus) -> String {
    let mut parts = vec![f.class.clone()];
    if let (Some(sm), Some(dram)) = (f.sm_share, f.dram_share) {
        parts.push(format!(
            "SM {:.0} %, DRAM {:.0} %",
            sm * 100.0,
            dram * 100.0
        ));
    }
    if let Some(b) = f.transfer_bytes {
        parts.push(format!(
            "{:.1} MiB copied a burst",
            b / f64::from(1u32 << 20)
        ));
    }
    if let Some(m) = f.footprint_mib {
        parts.push(format!("{m:.0} MiB held"));
    }
    parts.join(", ")
}

/// The pool: one line per function (containers per tier), then one per container.
fn render_pool(o: &mut String, pool: &[api::PoolEntry]) {
    let mut per_function: std::collections::BTreeMap<&str, [usize; 3]> =
        std::collections::BTreeMap::new();
    for e in pool {
        let n = per_function.entry(&e.function).or_default();
        match e.tier.as_str() {
            "hot" => n[0] += 1,
            "warm" => n[1] += 1,
            _ => n[2] += 1,
        }
    }
    let _ = writeln!(
        o,
        "\n{:<28} {:>4} {:>5} {:>5}",
        "POOL FUNCTION", "HOT", "WARM", "COLD"
    );
    for (f, [hot, warm, cold]) in per_function {
        let _ = writeln!(o, "{f:<28} {hot:>4} {warm:>5} {cold:>5}");
    }
    let _ = writeln!(
        o,
        "\n{:<36} {:<24} {:>3} {:<5} {:<10} {:>9} {:>10} {:<5} {:>8} {:>5} {:<8} {:>10}  NATIVE WHY",
        "CONTAINER",
        "FUNCTION",
        "GPU",
        "TIER",
        "WARM BY",
        "MiB",
        "ON GPU MiB",
        "BUSY",
        "IDLE s",
        "USES",
        "PENDING",
        "NATIVE MiB"
    );
    for e in pool {
        let native = e
            .native
            .as_ref()
            .map(mqfq_proto::memory::from_proto)
            .unwrap_or_default();
        #[expect(
            clippy::cast_precision_loss,
            reason = "bytes and nanoseconds, shown in MiB and seconds"
        )]
        let (mib, resident, idle, native_mib) = (
            e.bytes as f64 / 1048576.0,
            e.resident as f64 / 1048576.0,
            e.idle_ns as f64 / 1e9,
            native.total() as f64 / 1048576.0,
        );
        let refused = if native.refused > 0 {
            format!(" ({} exports refused)", native.refused)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "{:<36} {:<24} {:>3} {:<5} {:<10} {:>9.1} {:>10} {:<5} {:>8.1} {:>5} {:<8} {:>10.1}  {}{refused}",
            format!("{}/{}", e.namespace, e.container_id),
            e.function,
            e.gpu,
            e.tier,
            if e.warm.is_empty() { "-" } else { &e.warm },
            mib,
            if e.resident == 0 {
                "-".to_owned()
            } else {
                format!("{resident:.1}")
            },
            if e.busy { "yes" } else { "no" },
            idle,
            e.uses,
            e.pending,
            native_mib,
            native.why()
        );
    }
}

/// A container's native memory as JSON: bytes by reason, their total, refused exports.
fn native_json(n: Option<&api::NativeMemory>) -> serde_json::Value {
    let n = n.map(mqfq_proto::memory::from_proto).unwrap_or_default();
    let mut v = serde_json::to_value(n).unwrap_or_default();
    v["total"] = json!(n.total());
    v
}

/// The status as JSON (for scripts and tests).
#[must_use]
pub fn to_json(s: &api::StatusResponse) -> serde_json::Value {
    json!({
        "boot_id": s.boot_id,
        "backend": s.backend,
        "policy": s.policy,
        "late_binding": s.late_binding,
        "warm": s.warm,
        "waiting": s.waiting,
        "fail_open_starts": s.fail_open_starts,
        "gpus": s.gpus.iter().map(|g| json!({
            "index": g.index, "uuid": g.uuid, "name": g.name, "mode": g.mode, "d": g.d,
            "limit": g.limit, "running": g.running, "queued": g.queued,
            "utilization": g.utilization, "sm_activity": g.sm_activity,
            "slowdown": g.slowdown, "pressure": g.pressure, "memory_used": g.memory_used,
            "memory_total": g.memory_total, "virtual_time": g.virtual_time,
            "health": (!g.health.is_empty()).then_some(&g.health),
            "tflops": g.tflops, "mem_gbps": g.mem_gbps,
            "memory_budget": g.memory_budget, "memory_held": g.memory_held,
            "memory_reserved": g.memory_reserved, "memory_blocked": g.memory_blocked,
            "memory_kept": g.memory_kept,
        })).collect::<Vec<_>>(),
        "flows": s.flows.iter().map(|f| json!({
            "function": f.function, "gpu": f.gpu, "state": f.state, "start_tag": f.start_tag,
            "finish_tag": f.finish_tag, "queued": f.queued, "in_flight": f.in_flight,
            "weight": f.weight, "service_s": f.service_s, "gpu_time_s": f.gpu_time_s,
            "dispatched": f.dispatched, "completed": f.completed,
            "class": (!f.class.is_empty()).then_some(&f.class),
            "sm_share": f.sm_share, "dram_share": f.dram_share,
            "transfer_bytes": f.transfer_bytes, "footprint_mib": f.footprint_mib,
        })).collect::<Vec<_>>(),
        "leases": s.leases.iter().map(|l| json!({
            "lease_id": l.lease_id, "namespace": l.namespace, "container_id": l.container_id,
            "function": l.function, "gpu": l.gpu, "shim_pid": l.shim_pid, "held_ns": l.held_ns,
            "kind": l.kind, "overtime": l.overtime,
        })).collect::<Vec<_>>(),
        "pool": s.pool.iter().map(|e| json!({
            "namespace": e.namespace, "container_id": e.container_id, "function": e.function,
            "gpu": e.gpu, "tier": e.tier, "bytes": e.bytes, "busy": e.busy,
            "idle_ns": e.idle_ns, "pending": e.pending, "uses": e.uses,
            "native": native_json(e.native.as_ref()), "warm": e.warm, "resident": e.resident,
        })).collect::<Vec<_>>(),
    })
}
