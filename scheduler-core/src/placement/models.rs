//! What each GPU model can give: FP32 throughput, memory bandwidth, host link.
//!
//! Fitness weighs a GPU's free FLOPS and free bandwidth, which NVML does not report: they come
//! from this table, keyed by the name NVML gives (`nvmlDeviceGetName`). Figures are the vendor's
//! data-sheet peaks (dense FP32, HBM/GDDR bandwidth, one direction of the PCIe link); only their
//! ratios matter to the score. An operator overrides or adds models in `mqfqd.toml`.

use serde::Serialize;

use crate::config::{ConfigError, reject};

/// One GPU model's capabilities.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    /// Matched as a case-insensitive substring of NVML's device name; the longest match wins.
    pub pattern: String,
    /// Dense FP32 throughput, TFLOPS.
    pub tflops: f64,
    /// Memory bandwidth, GB/s.
    pub mem_gbps: f64,
    /// Host link, GB/s in one direction.
    pub pcie_gbps: f64,
}

impl GpuModel {
    /// A model from its figures.
    #[must_use]
    pub fn new(pattern: &str, tflops: f64, mem_gbps: f64, pcie_gbps: f64) -> Self {
        GpuModel {
            pattern: pattern.to_owned(),
            tflops,
            mem_gbps,
            pcie_gbps,
        }
    }

    /// Checks the figures, naming the field.
    ///
    /// # Errors
    /// An empty pattern or a figure that is not a finite number > 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pattern.trim().is_empty() || self.pattern.len() > 128 {
            return Err(reject(
                "gpu_models.pattern",
                &self.pattern,
                "must be 1-128 characters",
            ));
        }
        for (knob, v) in [
            ("gpu_models.tflops", self.tflops),
            ("gpu_models.mem_gbps", self.mem_gbps),
            ("gpu_models.pcie_gbps", self.pcie_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(reject(knob, v, "must be a finite number > 0"));
            }
        }
        Ok(())
    }
}

/// The built-in table (data-sheet figures).
#[must_use]
pub fn builtin() -> Vec<GpuModel> {
    [
        ("T4", 8.1, 320.0, 16.0),
        ("V100", 15.7, 900.0, 16.0),
        ("A10", 31.2, 600.0, 32.0),
        ("A30", 10.3, 933.0, 32.0),
        ("A100-SXM4-40GB", 19.5, 1555.0, 32.0),
        ("A100-PCIE-40GB", 19.5, 1555.0, 32.0),
        ("A100", 19.5, 2039.0, 32.0),
        ("L4", 30.3, 300.0, 32.0),
        ("L40", 90.5, 864.0, 32.0),
        ("L40S", 91.6, 864.0, 32.0),
        ("A40", 37.4, 696.0, 32.0),
        ("H100 PCIe", 51.0, 2000.0, 64.0),
        ("H100", 67.0, 3350.0, 64.0),
        ("H200", 67.0, 4800.0, 64.0),
    ]
    .into_iter()
    .map(|(p, t, m, l)| GpuModel::new(p, t, m, l))
    .collect()
}

/// Stands in for a GPU no row matches (an A30-class GPU, the simulator's default).
#[must_use]
pub fn fallback() -> GpuModel {
    GpuModel::new("(unknown)", 10.3, 933.0, 32.0)
}

/// The row of `table` whose pattern is the longest case-insensitive substring of `name`
/// (`A100-SXM4-40GB` before `A100`; among equally long ones, the first, so an operator's rows
/// put before the built-in table override it), else [`fallback`].
#[must_use]
pub fn lookup(table: &[GpuModel], name: &str) -> GpuModel {
    table
        .iter()
        .rev()
        .filter(|m| contains_ignore_case(name, &m.pattern))
        .max_by_key(|m| m.pattern.len())
        .cloned()
        .unwrap_or_else(fallback)
}

/// `needle` in `hay`, ASCII case ignored, without allocating (asked per candidate per choice).
fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}
