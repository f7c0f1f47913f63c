//! What the admission tests build their cores from: one queue config, one 24 GiB GPU with memory
//! admission on.

use super::{Core, GpuInfo, MemoryAdmission};
use crate::Time;
use crate::config::{ConcurrencyConfig, GpuMode, Overrun, QueueConfig, Selection, StickyTtl};

pub(super) const GIB: u64 = 1 << 30;

pub(super) fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// T = 0.5 s, TTL 1 s, a 1 s charge until measured, residency-aware selection.
pub(super) fn qcfg(short_charge_s: f64) -> QueueConfig {
    QueueConfig {
        overrun: Overrun::Fixed(0.5),
        ttl: StickyTtl::Fixed(1.0),
        fallback_ttl_s: 1.0,
        fallback_charge_s: 1.0,
        ewma_alpha: 0.5,
        charge_correction: true,
        selection: Selection::StickyResident,
        short_charge_s,
    }
}

/// One 24 GiB GPU with D fixed at `d`, headroom 0.15 (budget 20.4 GiB), memory admission on,
/// charging a function not yet measured `default_mb` MiB.
pub(super) fn memory_core(d: u32, short_charge_s: f64, default_mb: u64) -> Core {
    let gpu = GpuInfo {
        index: 0,
        uuid: "GPU-0".into(),
        name: "sim".into(),
        mode: GpuMode::Plain,
        memory_total: 24 * GIB,
        mig: vec![],
    };
    let mut c = Core::new(vec![gpu], &qcfg(short_charge_s), |_| ConcurrencyConfig {
        d_max: d,
        d_initial: f64::from(d),
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap();
    c.set_memory(MemoryAdmission::new(0.15, default_mb).unwrap())
        .unwrap();
    c
}
