//! GPU monitoring behind one trait: NVML on NVIDIA nodes, a simulated GPU elsewhere (demo, CI).
//!
//! The daemon samples every `sample_interval_ms` (≤ 100 ms) and hands each GPU's reading to its
//! concurrency controller. NVML's busy-time never cuts D, and lets it grow only on a GPU without GPM in a
//! sample in which no admission ended (see `scheduler_core::concurrency`); where the GPU has GPM (Hopper and later), SM activity,
//! DRAM bandwidth and PCIe rates come from two GPM samples a period apart — one new sample per
//! GPU per period, the previous one kept. The NVML backend loads `libnvidia-ml.so.1` at run
//! time (nvml-wrapper), so a node without the driver still starts; the tests run it against a
//! CPU-only double of the library.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::{EventSet, GpmSample, Nvml};
use scheduler_core::concurrency::Signals;
use scheduler_core::config::GpuMode;

use scheduler_core::node::admission::{GpuInfo, GpuReading};
use scheduler_core::placement::ProcessUse;

/// A monitor that cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// NVML failed (library missing, driver not loaded, a call failed).
    #[error("NVML {what}: {source}")]
    Nvml {
        /// The call.
        what: &'static str,
        /// NVML's error.
        source: nvml_wrapper::error::NvmlError,
    },
}

/// One reading of one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// NVML index.
    pub index: u32,
    /// NVML busy-time over the last sample period (any kernel running), 0–1, where NVML gives it
    /// (not on a GPU in MIG mode).
    pub busy: Option<f64>,
    /// SM activity over the period (GPM), 0–1, where the GPU has it.
    pub sm_activity: Option<f64>,
    /// DRAM bandwidth used over the period (GPM), 0–1, where the GPU has it.
    pub dram_bandwidth: Option<f64>,
    /// Framebuffer bytes in use.
    pub memory_used: u64,
    /// PCIe TX throughput, KB/s, where known.
    pub pcie_tx_kbps: Option<u32>,
    /// PCIe RX throughput, KB/s, where known.
    pub pcie_rx_kbps: Option<u32>,
    /// Power draw, milliwatts, where known.
    pub power_mw: Option<u32>,
    /// The enforced power limit, milliwatts, where known.
    pub power_limit_mw: Option<u32>,
    /// Critical Xid errors NVML reported for this GPU since the last sample (999: unknown).
    pub xids: Vec<u64>,
    /// NVML answered for the node but not for this GPU (lost, fallen off the bus): nothing
    /// else in the sample is a reading.
    pub failed: bool,
    /// Per-process SM and memory-bandwidth samples NVML took since the last that were read
    /// (read at most every [`PROCESS_PERIOD`]; empty in between).
    pub processes: Vec<ProcessUse>,
    /// GPU memory each of its compute processes holds, allocations and CUDA context (host PID,
    /// bytes; 0 where NVML lists one without a figure), as NVML lists them; `None` where it was
    /// not read (simulated GPUs, a driver that does not answer).
    pub held: Option<Vec<(u32, u64)>>,
}

impl Sample {
    /// What the node's admission core is fed.
    #[must_use]
    pub fn reading(&self) -> GpuReading {
        GpuReading {
            index: self.index,
            signals: Signals {
                busy: self.busy,
                sm_activity: self.sm_activity,
            },
            memory_used: self.memory_used,
        }
    }
}

/// Every GPU's sample for the period from what the monitor read and each GPU's `last`
/// (index, memory used): a monitor that failed read none, and each GPU still ends its sample
/// period (the releases since the last one move D) with its last memory figure and no GPU
/// signal; a GPU NVML could not read keeps its last memory figure too.
#[must_use]
pub fn with_last_memory(samples: Vec<Sample>, last: &[(u32, u64)]) -> Vec<Sample> {
    if samples.is_empty() {
        return last
            .iter()
            .map(|&(index, memory_used)| Sample {
                index,
                memory_used,
                ..Sample::default()
            })
            .collect();
    }
    samples
        .into_iter()
        .map(|mut s| {
            if s.failed
                && let Some(&(_, m)) = last.iter().find(|(i, _)| *i == s.index)
            {
                s.memory_used = m;
            }
            s
        })
        .collect()
}

/// What the daemon knows one GPU holds: the simulated backend's whole view of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuLoad {
    /// Leases held on it.
    pub leases: u32,
    /// Bytes its Hot pooled containers hold.
    pub resident_bytes: u64,
}

/// A source of GPU facts and samples.
pub trait GpuMonitor: Send {
    /// `nvml` or `simulated`.
    fn backend(&self) -> &'static str;
    /// The GPUs, with their mode (plain, MPS, MIG).
    ///
    /// # Errors
    /// The backend failed.
    fn devices(&mut self) -> Result<Vec<GpuInfo>, MonitorError>;
    /// A reading of every GPU. `load` is what the daemon knows each GPU holds (by position in
    /// `devices()`), which only the simulated backend uses.
    ///
    /// # Errors
    /// The backend failed.
    fn sample(&mut self, load: &[GpuLoad]) -> Result<Vec<Sample>, MonitorError>;
    /// Keeps the driver initialized between containers (persistence mode), so a new
    /// container's first CUDA call does not pay driver initialization. Returns what was done.
    ///
    /// # Errors
    /// The backend refused (not root, unsupported); the caller logs it and carries on.
    fn keep_driver_warm(&mut self) -> Result<String, MonitorError> {
        Ok(format!("{} GPUs need no warm driver", self.backend()))
    }
}

/// GPUs that exist only in the daemon: busy-time is 100 % while any lease is held (as NVML reads a
/// GPU in use), and SM activity grows with the leases held and saturates at about
/// `1 / per_lease` of them.
#[derive(Debug)]
pub struct SimulatedGpus {
    gpus: Vec<GpuInfo>,
    per_lease: f64,
}

impl SimulatedGpus {
    /// `n` GPUs of `memory` bytes in `mode`; each lease adds `per_lease` utilization.
    #[must_use]
    pub fn new(n: u32, memory: u64, mode: GpuMode, per_lease: f64) -> Self {
        let gpus = (0..n)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-5a5a5a5a-0000-4000-8000-{i:012}"),
                name: "mqfq simulated GPU".into(),
                mode,
                memory_total: memory,
                mig: Vec::new(),
            })
            .collect();
        SimulatedGpus { gpus, per_lease }
    }
}

impl GpuMonitor for SimulatedGpus {
    fn backend(&self) -> &'static str {
        "simulated"
    }
    fn devices(&mut self) -> Result<Vec<GpuInfo>, MonitorError> {
        Ok(self.gpus.clone())
    }
    fn sample(&mut self, load: &[GpuLoad]) -> Result<Vec<Sample>, MonitorError> {
        Ok(self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let l = load.get(i).copied().unwrap_or_default();
                let n = f64::from(l.leases);
                Sample {
                    index: g.index,
                    busy: Some(if n > 0.0 { 1.0 } else { 0.0 }),
                    sm_activity: Some((n * self.per_lease).min(1.0)),
                    // What its pooled containers hold, capped at its size (it had been a nominal
                    // 2 GiB a lease: on a small simulated GPU one lease read as full, and the
                    // pool evicted every idle container for room it had).
                    memory_used: l.resident_bytes.min(g.memory_total),
                    ..Sample::default()
                }
            })
            .collect())
    }
}

/// NVIDIA GPUs through NVML.
pub struct NvmlGpus {
    /// NVML stays loaded for the life of the process (mqfqd opens it once): GPM samples
    /// borrow it from one period to the next.
    nvml: &'static Nvml,
    mps_pipe_dir: PathBuf,
    /// Per NVML index: whether the GPU has GPM, and the previous period's sample.
    gpm: Vec<Gpm>,
    /// Per NVML index: when its process samples were last read, and NVML's timestamp of the
    /// newest one (the next read asks only for later ones).
    processes: Vec<(Option<Instant>, u64)>,
    /// Critical Xid events of every GPU that has them (`None`: the driver would not).
    xid_events: Option<EventSet<'static>>,
}

/// Xid events read per sample at most (the rest wait for the next).
const MAX_XIDS: usize = 64;

/// How often each GPU's per-process utilization samples are read (NVML keeps a buffer of
/// them; reading it at every 100 ms sample would cost for nothing).
pub const PROCESS_PERIOD: Duration = Duration::from_millis(500);

/// NVML wants the two samples of a GPM period more than 100 ms apart (its counters refresh at
/// that rate); between new periods the last reading stands.
const GPM_PERIOD: Duration = Duration::from_millis(150);

#[derive(Default)]
struct Gpm {
    supported: Option<bool>,
    /// The sample the next period is measured from, and when it was taken.
    last: Option<(GpmSample<'static>, Instant)>,
    /// The last period's metrics.
    reading: Option<GpmReading>,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpus")
            .field("mps_pipe_dir", &self.mps_pipe_dir)
            .field(
                "gpm",
                &self.gpm.iter().map(|g| g.supported).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What GPM measured over one period.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GpmReading {
    sm: Option<f64>,
    dram: Option<f64>,
    pcie_tx_bps: Option<f64>,
    pcie_rx_bps: Option<f64>,
}

/// GPM's metrics between two samples; a metric the GPU refuses is `None`.
fn gpm_metrics(nvml: &Nvml, a: &GpmSample<'_>, b: &GpmSample<'_>) -> Option<GpmReading> {
    let ids = [
        GpmMetricId::SmUtil,
        GpmMetricId::DramBwUtil,
        GpmMetricId::PcieTxPerSec,
        GpmMetricId::PcieRxPerSec,
    ];
    let got = nvml_wrapper::gpm::gpm_metrics_get(nvml, a, b, &ids).ok()?;
    let value = |i: usize| {
        got.get(i)
            .and_then(|r| r.as_ref().ok())
            .map(|r| r.value)
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let percent = |i: usize| value(i).map(|v| (v / 100.0).clamp(0.0, 1.0));
    Some(GpmReading {
        sm: percent(0),
        dram: percent(1),
        pcie_tx_bps: value(2),
        pcie_rx_bps: value(3),
    })
}

/// Bytes per second to NVML's KB/s.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "KB/s clamped to u32::MAX; NaN or negative saturates to 0"
)]
fn kbps(bps: f64) -> u32 {
    (bps / 1024.0).min(f64::from(u32::MAX)) as u32
}

fn nvml_err(what: &'static str) -> impl FnOnce(nvml_wrapper::error::NvmlError) -> MonitorError {
    move |source| MonitorError::Nvml { what, source }
}

impl NvmlGpus {
    /// Loads NVML from `library` (a file name searched like `dlopen` does, or a path).
    ///
    /// # Errors
    /// The library is missing or the driver is not loaded.
    pub fn open(library: &str, mps_pipe_dir: &Path) -> Result<Self, MonitorError> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(library))
            .init()
            .map_err(nvml_err("init"))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        Ok(NvmlGpus {
            nvml,
            mps_pipe_dir: mps_pipe_dir.to_owned(),
            gpm: Vec::new(),
            processes: Vec::new(),
            xid_events: xid_events(nvml),
        })
    }

    /// The critical Xid events waiting, by NVML index (never blocks).
    fn pending_xids(&self) -> Vec<(u32, u64)> {
        let Some(set) = &self.xid_events else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while out.len() < MAX_XIDS {
            let Ok(ev) = set.wait(0) else {
                break;
            };
            let xid = match ev.event_data {
                Some(XidError::Value(x)) => x,
                Some(XidError::Unknown) => 999,
                None => continue,
            };
            if let Ok(i) = ev.device.index() {
                out.push((i, xid));
            }
        }
        out
    }

    /// Whether an MPS control daemon is serving this node (its control pipe exists).
    fn mps(&self) -> bool {
        self.mps_pipe_dir.join("control").exists()
    }

    /// Every GPU NVML lists, by index: one that NVML cannot read (lost, fallen off the
    /// bus) is a failed sample, not the node's failure; only NVML itself failing is.
    fn each_or_failed(
        &self,
        mut f: impl FnMut(u32, nvml_wrapper::Device<'static>) -> Result<Sample, MonitorError>,
    ) -> Result<Vec<Sample>, MonitorError> {
        let n = self.nvml.device_count().map_err(nvml_err("device count"))?;
        Ok((0..n)
            .map(|i| {
                let read = self
                    .nvml
                    .device_by_index(i)
                    .map_err(nvml_err("device by index"))
                    .and_then(|d| f(i, d));
                read.unwrap_or_else(|e| {
                    tracing::debug!(gpu = i, "GPU not read: {e}");
                    Sample {
                        index: i,
                        failed: true,
                        ..Sample::default()
                    }
                })
            })
            .collect())
    }

    /// Every GPU NVML lists, by index.
    fn each<T>(
        &self,
        mut f: impl FnMut(u32, nvml_wrapper::Device<'static>) -> Result<T, MonitorError>,
    ) -> Result<Vec<T>, MonitorError> {
        let n = self.nvml.device_count().map_err(nvml_err("device count"))?;
        (0..n)
            .map(|i| {
                let d = self
                    .nvml
                    .device_by_index(i)
                    .map_err(nvml_err("device by index"))?;
                f(i, d)
            })
            .collect()
    }
}

impl GpuMonitor for NvmlGpus {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn devices(&mut self) -> Result<Vec<GpuInfo>, MonitorError> {
        let mps = self.mps();
        self.each(|i, d| {
            // MIG mode is unsupported on most GPUs: that error means "not MIG".
            let mig = d.mig_mode().is_ok_and(|m| m.current == 1);
            let mode = if mig {
                GpuMode::Mig
            } else if mps {
                GpuMode::Mps
            } else {
                GpuMode::Plain
            };
            Ok(GpuInfo {
                index: i,
                uuid: d.uuid().map_err(nvml_err("uuid"))?,
                name: d.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
                mode,
                memory_total: d.memory_info().map_err(nvml_err("memory info"))?.total,
                mig: Vec::new(),
            })
        })
    }

    fn keep_driver_warm(&mut self) -> Result<String, MonitorError> {
        let n = self
            .each(|_, mut d| {
                d.set_persistent(true)
                    .map_err(nvml_err("set persistence mode"))
            })?
            .len();
        Ok(format!("persistence mode on for {n} GPUs"))
    }

    fn sample(&mut self, _load: &[GpuLoad]) -> Result<Vec<Sample>, MonitorError> {
        let xids = self.pending_xids();
        let mut gpm = std::mem::take(&mut self.gpm);
        let mut procs = std::mem::take(&mut self.processes);
        let nvml = self.nvml;
        let out = self.each_or_failed(|i, d| {
            // Busy-time is only reported: a GPU that has none (MIG mode) still samples.
            let busy = d
                .utilization_rates()
                .ok()
                .map(|u| f64::from(u.gpu.min(100)) / 100.0);
            let m = d.memory_info().map_err(nvml_err("memory info"))?;
            let slot = i as usize;
            if gpm.len() <= slot {
                gpm.resize_with(slot + 1, Gpm::default);
            }
            let g = gpm_period(nvml, &d, &mut gpm[slot]).unwrap_or_default();
            // GPM's PCIe rates where it has them: NVML's own counters block ~20 ms each.
            let (tx, rx) = match (g.pcie_tx_bps, g.pcie_rx_bps) {
                (Some(tx), Some(rx)) => (Some(kbps(tx)), Some(kbps(rx))),
                _ => (
                    d.pcie_throughput(PcieUtilCounter::Send).ok(),
                    d.pcie_throughput(PcieUtilCounter::Receive).ok(),
                ),
            };
            Ok(Sample {
                index: i,
                busy,
                sm_activity: g.sm,
                dram_bandwidth: g.dram,
                memory_used: m.used,
                pcie_tx_kbps: tx,
                pcie_rx_kbps: rx,
                power_mw: d.power_usage().ok(),
                power_limit_mw: d.enforced_power_limit().ok(),
                xids: xids
                    .iter()
                    .filter(|(g, _)| *g == i)
                    .map(|(_, x)| *x)
                    .collect(),
                failed: false,
                processes: process_samples(&d, slot, &mut procs),
                held: held_by_process(&d),
            })
        });
        self.gpm = gpm;
        self.processes = procs;
        out
    }
}

/// An event set every GPU that supports critical Xid events is registered in; `None` (logged)
/// when none does or the driver refuses.
fn xid_events(nvml: &'static Nvml) -> Option<EventSet<'static>> {
    let mut set = nvml.create_event_set().ok()?;
    let n = nvml.device_count().ok()?;
    let mut registered = 0;
    for i in 0..n {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        if !d
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
        {
            continue;
        }
        // A refused registration frees the set: Xids are then not watched at all.
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered += 1;
            }
            Err(e) => {
                tracing::warn!(gpu = i, "Xid events not watched: {e}");
                return None;
            }
        }
    }
    (registered > 0).then_some(set)
}

/// GPU `slot`'s per-process samples newer than the last read, once [`PROCESS_PERIOD`] has
/// passed since it; none in between, on a GPU or driver without them, or when NVML has no new
/// sample (it answers NOT_FOUND then).
fn process_samples(
    d: &nvml_wrapper::Device<'static>,
    slot: usize,
    state: &mut Vec<(Option<Instant>, u64)>,
) -> Vec<ProcessUse> {
    if state.len() <= slot {
        state.resize(slot + 1, (None, 0));
    }
    let (last, seen) = &mut state[slot];
    if last.is_some_and(|t| t.elapsed() < PROCESS_PERIOD) {
        return Vec::new();
    }
    *last = Some(Instant::now());
    let Ok(got) = d.process_utilization_stats(*seen) else {
        return Vec::new();
    };
    *seen = got
        .iter()
        .map(|s| s.timestamp)
        .max()
        .unwrap_or(*seen)
        .max(*seen);
    per_process(got.iter().map(|s| (s.pid, s.sm_util, s.mem_util)))
}

/// What each compute process on GPU `d` holds in its memory, where NVML knows it: its own
/// contexts' processes and, on a GPU shared through MPS, the MPS clients (NVML lists those
/// apart; a driver without that list adds none). `None` (logged) when the first list cannot be
/// read: nothing is known of the GPU's processes then.
fn held_by_process(d: &nvml_wrapper::Device<'static>) -> Option<Vec<(u32, u64)>> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let mut all = match d.running_compute_processes() {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("per-process GPU memory not read: {e}");
            return None;
        }
    };
    all.extend(d.mps_running_compute_processes().unwrap_or_default());
    let held = all
        .into_iter()
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => (p.pid, b),
            // Where it is, without a figure (counts nothing).
            UsedGpuMemory::Unavailable => (p.pid, 0),
        })
        .collect();
    Some(held)
}

/// One entry per process from one read of the driver's samples (pid, SM %, memory %): a
/// process the driver sampled several times since the last read gets the mean of its samples,
/// each held to 0–100 %. Summing them would be wrong: they are readings of one share over
/// time, and each recorded entry stands for the share at the moment it is recorded.
fn per_process(samples: impl Iterator<Item = (u32, u32, u32)>) -> Vec<ProcessUse> {
    let mut by_pid: std::collections::BTreeMap<u32, (f64, f64, u32)> = Default::default();
    for (pid, sm, mem) in samples {
        let e = by_pid.entry(pid).or_default();
        e.0 += f64::from(sm.min(100)) / 100.0;
        e.1 += f64::from(mem.min(100)) / 100.0;
        e.2 += 1;
    }
    by_pid
        .into_iter()
        .map(|(pid, (sm, mem, n))| ProcessUse {
            pid,
            sm: sm / f64::from(n),
            mem: mem / f64::from(n),
        })
        .collect()
}

/// GPM on a GPU: once a period has passed since the kept sample, a new one and the metrics
/// between them; in between, the last period's reading. None on a GPU without GPM, before the
/// first period, or when sampling fails (which drops the kept sample; support is asked again).
fn gpm_period(
    nvml: &'static Nvml,
    d: &nvml_wrapper::Device<'static>,
    state: &mut Gpm,
) -> Option<GpmReading> {
    let supported = *state
        .supported
        .get_or_insert_with(|| d.gpm_support().unwrap_or(false));
    if !supported {
        return None;
    }
    if let Some((_, at)) = &state.last
        && at.elapsed() < GPM_PERIOD
    {
        return state.reading;
    }
    let Ok(now) = d.gpm_sample() else {
        *state = Gpm::default();
        return None;
    };
    let taken = Instant::now();
    let got = state
        .last
        .as_ref()
        .and_then(|(last, _)| gpm_metrics(nvml, last, &now));
    state.last = Some((now, taken));
    state.reading = got;
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_utilization_follows_leases_and_saturates() {
        let mut s = SimulatedGpus::new(2, 8 << 30, GpuMode::Plain, 0.3);
        assert_eq!(s.devices().unwrap().len(), 2);
        let load = |leases, resident_bytes| GpuLoad {
            leases,
            resident_bytes,
        };
        let r = s.sample(&[load(1, 3 << 20), load(5, 9 << 30)]).unwrap();
        assert_eq!((r[0].busy, r[1].busy), (Some(1.0), Some(1.0)));
        assert!((r[0].sm_activity.unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(r[1].sm_activity, Some(1.0));
        // Memory in use is what the pool holds there, never past the GPU's size.
        assert_eq!((r[0].memory_used, r[1].memory_used), (3 << 20, 8 << 30));
        let idle = s.sample(&[]).unwrap();
        assert_eq!((idle[0].busy, idle[0].sm_activity), (Some(0.0), Some(0.0)));
        assert_eq!(idle[0].memory_used, 0);
    }

    #[test]
    fn a_process_sampled_several_times_in_one_read_counts_once_at_its_mean() {
        let got = per_process([(7, 40, 10), (9, 250, 0), (7, 80, 30)].into_iter());
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].pid, 7);
        assert!((got[0].sm - 0.6).abs() < 1e-9 && (got[0].mem - 0.2).abs() < 1e-9);
        assert_eq!((got[1].pid, got[1].sm, got[1].mem), (9, 1.0, 0.0));
    }

    #[test]
    fn missing_nvml_is_an_error_not_a_panic() {
        let e = NvmlGpus::open("/nonexistent/libnvidia-ml.so.1", Path::new("/nonexistent"))
            .unwrap_err();
        assert!(e.to_string().contains("NVML init"), "{e}");
    }
}
