//! GPU monitoring behind one trait: NVML on NVIDIA nodes, a simulated GPU elsewhere (demo, CI).
//!
//! The daemon samples every `sample_interval_ms` (≤ 100 ms) and feeds utilization to the
//! concurrency controller of each GPU. The NVML backend loads `libnvidia-ml.so.1` at run time
//! (nvml-wrapper), so a node without the driver still starts; the tests run it against a CPU-only
//! double of the library.

use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use scheduler_core::config::GpuMode;

use scheduler_core::node::admission::GpuInfo;

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
    /// Busy fraction over the last sample period, 0–1.
    pub utilization: f64,
    /// Framebuffer bytes in use.
    pub memory_used: u64,
    /// PCIe TX throughput, KB/s, where known.
    pub pcie_tx_kbps: Option<u32>,
    /// PCIe RX throughput, KB/s, where known.
    pub pcie_rx_kbps: Option<u32>,
    /// Power draw, milliwatts, where known.
    pub power_mw: Option<u32>,
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
    /// A reading of every GPU. `leases` is how many leases each GPU holds (by position in
    /// `devices()`), which only the simulated backend uses.
    ///
    /// # Errors
    /// The backend failed.
    fn sample(&mut self, leases: &[u32]) -> Result<Vec<Sample>, MonitorError>;
    /// Keeps the driver initialized between containers (persistence mode), so a new
    /// container's first CUDA call does not pay driver initialization. Returns what was done.
    ///
    /// # Errors
    /// The backend refused (not root, unsupported); the caller logs it and carries on.
    fn keep_driver_warm(&mut self) -> Result<String, MonitorError> {
        Ok(format!("{} GPUs need no warm driver", self.backend()))
    }
}

/// GPUs that exist only in the daemon: utilization grows with the leases held and saturates, so
/// dynamic D behaves as on a GPU that is fully used at about `1 / per_lease` invocations.
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
    fn sample(&mut self, leases: &[u32]) -> Result<Vec<Sample>, MonitorError> {
        Ok(self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let n = f64::from(leases.get(i).copied().unwrap_or(0));
                let u = (n * self.per_lease).min(1.0);
                Sample {
                    index: g.index,
                    utilization: u,
                    // A nominal 2 GiB per running invocation, capped at the GPU's size.
                    memory_used: (leases.get(i).copied().unwrap_or(0) as u64 * (2 << 30))
                        .min(g.memory_total),
                    ..Sample::default()
                }
            })
            .collect())
    }
}

/// NVIDIA GPUs through NVML.
#[derive(Debug)]
pub struct NvmlGpus {
    nvml: Nvml,
    mps_pipe_dir: PathBuf,
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
        Ok(NvmlGpus {
            nvml,
            mps_pipe_dir: mps_pipe_dir.to_owned(),
        })
    }

    /// Whether an MPS control daemon is serving this node (its control pipe exists).
    fn mps(&self) -> bool {
        self.mps_pipe_dir.join("control").exists()
    }

    /// Every GPU NVML lists, by index.
    fn each<T>(
        &self,
        mut f: impl FnMut(u32, nvml_wrapper::Device<'_>) -> Result<T, MonitorError>,
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

    fn sample(&mut self, _leases: &[u32]) -> Result<Vec<Sample>, MonitorError> {
        self.each(|i, d| {
            let u = d.utilization_rates().map_err(nvml_err("utilization"))?;
            let m = d.memory_info().map_err(nvml_err("memory info"))?;
            Ok(Sample {
                index: i,
                utilization: f64::from(u.gpu.min(100)) / 100.0,
                memory_used: m.used,
                pcie_tx_kbps: d.pcie_throughput(PcieUtilCounter::Send).ok(),
                pcie_rx_kbps: d.pcie_throughput(PcieUtilCounter::Receive).ok(),
                power_mw: d.power_usage().ok(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_utilization_follows_leases_and_saturates() {
        let mut s = SimulatedGpus::new(2, 8 << 30, GpuMode::Plain, 0.3);
        assert_eq!(s.devices().unwrap().len(), 2);
        let r = s.sample(&[1, 5]).unwrap();
        assert!((r[0].utilization - 0.3).abs() < 1e-9);
        assert_eq!(r[1].utilization, 1.0);
        assert_eq!(r[1].memory_used, 8 << 30);
    }

    #[test]
    fn missing_nvml_is_an_error_not_a_panic() {
        let e = NvmlGpus::open("/nonexistent/libnvidia-ml.so.1", Path::new("/nonexistent"))
            .unwrap_err();
        assert!(e.to_string().contains("NVML init"), "{e}");
    }
}
