//! What the admission tests build their cores from: one queue config, 24 GiB GPUs (or others)
//! with memory admission on.

use super::{AdmitInfo, Core, GpuInfo, Kind, MemoryAdmission};
use crate::Time;
use crate::config::{ConcurrencyConfig, GpuMode, Overrun, QueueConfig, Selection, StickyTtl};

pub(crate) const GIB: u64 = 1 << 30;

pub(crate) fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// T = 0.5 s, TTL 1 s, a 1 s charge until measured, residency-aware selection.
pub(crate) fn qcfg(short_charge_s: f64) -> QueueConfig {
    QueueConfig {
        overrun: Overrun::Fixed(0.5),
        ttl: StickyTtl::Fixed(1.0),
        fallback_ttl_s: 1.0,
        fallback_charge_s: 1.0,
        ewma_alpha: 0.5,
        charge_correction: true,
        selection: Selection::StickyResident,
        short_charge_s,
        overtake_bound: 0.0,
    }
}

/// One 24 GiB GPU with D fixed at `d`, headroom 0.15 (budget 20.4 GiB), memory admission on,
/// charging a function not yet measured `default_mb` MiB.
pub(crate) fn memory_core(d: u32, short_charge_s: f64, default_mb: u64) -> Core {
    memory_core_on(&[24], d, short_charge_s, default_mb)
}

/// [`memory_core`] on GPUs of these sizes (GiB), indexed from 0.
pub(crate) fn memory_core_on(gib: &[u64], d: u32, short_charge_s: f64, default_mb: u64) -> Core {
    let gpus = (0u32..)
        .zip(gib)
        .map(|(index, &g)| GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "sim".into(),
            mode: GpuMode::Plain,
            memory_total: g * GIB,
            mig: vec![],
        })
        .collect();
    let mut c = Core::new(gpus, &qcfg(short_charge_s), |_| ConcurrencyConfig {
        d_max: d,
        d_initial: f64::from(d),
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap();
    c.set_memory(MemoryAdmission::new(0.15, default_mb).unwrap())
        .unwrap();
    c
}

/// An admission of container `ns/<id>` of `function` (no tenant, weight 1) for `kind`.
pub(crate) fn admit_info(id: &str, function: &str, kind: Kind) -> AdmitInfo {
    AdmitInfo {
        namespace: "ns".into(),
        container_id: id.into(),
        function: function.into(),
        tenant: None,
        tenant_weight: 0.0,
        weight: 0.0,
        gpus: vec![],
        kind,
        shim_pid: 7,
    }
}
