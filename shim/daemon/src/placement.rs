//! `[placement]` in `mqfqd.toml`: which GPU a container that may use several gets (issue 17).
//!
//! The decisions are `scheduler_core::placement`'s; this is the file's side of them (keys,
//! defaults, checks) and the clock they need (the minute of the day, for peak weights).

use scheduler_core::ConfigError;
use scheduler_core::placement::features::FeatureConfig;
use scheduler_core::placement::models::builtin;
use scheduler_core::placement::{GpuModel, HealthConfig, PlacementConfig, WeightSchedule, Weights};
use serde::Deserialize;

/// The `[placement]` table.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementSection {
    /// Choose a GPU for containers given several (opt-in: only for nodes whose multi-GPU grants
    /// come from `NVIDIA_VISIBLE_DEVICES`, not from a device plugin or CDI); off: they keep all
    /// they were given.
    pub enabled: bool,
    /// GPUs new functions are probed on (empty: any candidate; the cleanest, readiest, then
    /// the one giving the probe the most FLOPS).
    pub probe_gpus: Vec<u32>,
    /// Bursts measured before a function is classified.
    pub probe_runs: u32,
    /// Peak hours, minutes of the day in UTC.
    pub peak_start_min: u32,
    /// End of the peak (exclusive; before the start wraps past midnight).
    pub peak_end_min: u32,
    /// Weights during the peak (a table given replaces the default; keys it omits take the
    /// peak defaults).
    pub peak: Option<Weights>,
    /// Weights outside it.
    pub off_peak: Option<Weights>,
    /// Utilization at or above which a GPU is saturated.
    pub overload_utilization: f64,
    /// Saturated samples in a row that make a GPU overloaded.
    pub overload_samples: u32,
    /// Clean samples in a row that bring a failed or overloaded GPU back.
    pub recover_samples: u32,
    /// Clean samples in a row that bring back a GPU failed by a fatal Xid.
    pub xid_recover_samples: u32,
    /// Critical Xids that fail a GPU for new containers (default: those NVIDIA's catalog
    /// answers with a drain or reset).
    pub fatal_xids: Vec<u64>,
    /// GPU models beyond (or overriding) the built-in table.
    pub models: Vec<GpuModel>,
    /// What a cold start of a GPU container costs on this node, seconds: the price placement
    /// puts on a GPU where no idle container of the function is.
    pub cold_start_s: f64,
}

impl Default for PlacementSection {
    fn default() -> Self {
        let s = WeightSchedule::default();
        let h = HealthConfig::default();
        PlacementSection {
            enabled: false,
            probe_gpus: Vec::new(),
            probe_runs: FeatureConfig::default().probe_runs,
            peak_start_min: s.peak_start_min,
            peak_end_min: s.peak_end_min,
            peak: None,
            off_peak: None,
            overload_utilization: h.overload_utilization,
            overload_samples: h.overload_samples,
            recover_samples: h.recover_samples,
            xid_recover_samples: h.xid_recover_samples,
            fatal_xids: scheduler_core::placement::node::FATAL_XIDS.to_vec(),
            models: Vec::new(),
            cold_start_s: scheduler_core::placement::node::COLD_START_S,
        }
    }
}

impl PlacementSection {
    /// The core's configuration: the operator's models before the built-in ones.
    #[must_use]
    pub fn config(&self) -> PlacementConfig {
        let d = WeightSchedule::default();
        let mut models = self.models.clone();
        models.extend(builtin());
        PlacementConfig {
            schedule: WeightSchedule {
                peak: self.peak.unwrap_or(d.peak),
                off_peak: self.off_peak.unwrap_or(d.off_peak),
                peak_start_min: self.peak_start_min,
                peak_end_min: self.peak_end_min,
            },
            models,
            probe_gpus: self.probe_gpus.clone(),
            features: FeatureConfig {
                probe_runs: self.probe_runs,
                ..FeatureConfig::default()
            },
            health: HealthConfig {
                overload_utilization: self.overload_utilization,
                overload_samples: self.overload_samples,
                recover_samples: self.recover_samples,
                xid_recover_samples: self.xid_recover_samples,
            },
            fatal_xids: self.fatal_xids.clone(),
            cold_start_s: self.cold_start_s,
        }
    }

    /// Checks the table, naming the key.
    ///
    /// # Errors
    /// A bad key.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.models.len() > 256 {
            return Err(ConfigError::new(
                "placement.models",
                self.models.len(),
                "at most 256 rows",
            ));
        }
        self.config().validate().map_err(|e| ConfigError {
            // The core names its knobs by their own tables; here they are all under [placement].
            knob: match e.knob {
                "features.probe_runs" => "placement.probe_runs",
                "gpu_models.pattern" => "placement.models.pattern",
                "gpu_models.tflops" => "placement.models.tflops",
                "gpu_models.mem_gbps" => "placement.models.mem_gbps",
                "gpu_models.pcie_gbps" => "placement.models.pcie_gbps",
                k => k,
            },
            ..e
        })
    }
}

/// The minute of the day in UTC, from the system clock.
#[must_use]
pub fn minute_of_day_utc() -> u32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from((secs / 60) % 1440).unwrap_or(0)
}
