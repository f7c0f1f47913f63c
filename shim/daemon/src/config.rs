//! `mqfqd.toml`: every key optional, with the defaults below; unknown keys and bad values stop
//! startup with a message naming the key.
//!
//! ```toml
//! socket = "/run/mqfq/mqfqd.sock"   # root-only ttrpc socket the shims call
//! metrics_addr = "127.0.0.1:9464"   # Prometheus /metrics; "" turns it off
//! profile = "balanced"              # light | balanced | throughput (the design's profiles)
//! policy = "mqfq-sticky"            # mqfq-sticky | fcfs: the order admissions are granted in
//!                                   # (fcfs: same gate, D and pool, FIFO across functions)
//! backend = "auto"                  # auto (NVML, else simulated) | nvml | simulated
//! nvml_library = "libnvidia-ml.so.1"
//! mps_pipe_dir = "/tmp/nvidia-mps"  # an MPS control daemon here puts GPUs in MPS mode
//! sample_interval_ms = 100          # utilization sampling (at most 100)
//! dispatch_log = ""                 # JSON-lines record of every queue decision; "" = off
//! restart_grace_ms = 2000           # after start, dispatch nothing while shims re-register
//!
//! [queue]          # overrides of the profile: overrun_s | overrun_tau, ttl_s | ttl_iat,
//!                  # fallback_charge_s, short_charge_s, overtake_bound = 1.0; memory_admission = true,
//!                  # default_footprint_mb = 4096, late_binding = false
//! [concurrency]    # alpha, u_target (SM activity), d_max, d_initial, slowdown_target
//! [simulated]      # gpus = 1, memory_gib = 80 (or memory_mib), utilization_per_lease = 0.3, mode = "plain"
//! [nvidia]         # pre-created GPU state: edits = true, driver_root = "/",
//!                  # cdi_dirs = ["/etc/cdi", "/var/run/cdi"],
//!                  # edits_file = "/run/mqfq/nvidia-edits.json", refresh_interval_ms = 5000,
//!                  # persistence_mode = true, cuda_library = "libcuda.so.1",
//!                  # warm_budget_mib = 1024, warm_paths = []
//! [pool]           # idle GPU containers: hot_ttl_s = 1800, warm_ttl_s = 7200, headroom = 0.15,
//!                  # prefetch_iat = 5, reclaim = false, host_headroom = 0.1, warm = "uvm",
//!                  # warm_allowed = ["checkpoint", "uvm", "off"]
//! [fairness]       # weights and tenants (see `policy`): trust_annotations = false,
//!                  # tenant_from = "namespace", tenants = {}, [[fairness.rule]] …
//! [limits]         # waiters_per_shim = 256, containers_per_shim = 256, flow_idle_s = 600,
//!                  # max_burst_hold_s = 60
//! ```

use std::path::{Path, PathBuf};

use scheduler_core::config::{
    ConcurrencyConfig, ConcurrencyKnobs, GpuMode, GrantOrder, Overrides, Profile, QueueConfig,
    QueueKnobs,
};
use serde::Deserialize;

/// Where `mqfqd` listens by default (also the shim's default).
pub use mqfq_proto::DEFAULT_SOCKET;

/// A config that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key or a wrong type (toml's message names the key).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message.
        message: String,
    },
    /// A value out of range.
    #[error("{path}: {source}")]
    Value {
        /// The file.
        path: PathBuf,
        /// Which knob and why.
        source: scheduler_core::ConfigError,
    },
}

/// Which GPU monitor to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// NVML when it loads, else simulated.
    #[default]
    Auto,
    /// NVML or fail.
    Nvml,
    /// The simulated GPUs.
    Simulated,
}

/// The simulated GPUs (no NVIDIA GPU needed).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulatedSection {
    /// How many.
    pub gpus: u32,
    /// Memory of each, GiB (80 unless `memory_mib` is given).
    pub memory_gib: Option<u64>,
    /// Memory of each, MiB instead: small GPUs, for tests whose containers hold megabytes.
    pub memory_mib: Option<u64>,
    /// Utilization each lease adds (the simulated GPU saturates at 1).
    pub utilization_per_lease: f64,
    /// plain, mps or mig.
    pub mode: String,
}

impl Default for SimulatedSection {
    fn default() -> Self {
        SimulatedSection {
            gpus: 1,
            memory_gib: None,
            memory_mib: None,
            utilization_per_lease: 0.3,
            mode: "plain".into(),
        }
    }
}

impl SimulatedSection {
    /// Each GPU's memory, bytes.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        match (self.memory_mib, self.memory_gib) {
            (Some(mib), _) => mib << 20,
            (None, gib) => gib.unwrap_or(80) << 30,
        }
    }
}

/// Pre-created GPU state: the NVIDIA edits, a warm driver and warm libraries.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvidiaSection {
    /// Build and publish the edits.
    pub edits: bool,
    /// Where the driver lives (discovery when no CDI spec exists).
    pub driver_root: PathBuf,
    /// CDI spec directories, later ones winning.
    pub cdi_dirs: Vec<PathBuf>,
    /// Where the edits are written for the shims.
    pub edits_file: PathBuf,
    /// How often the sources are checked for changes.
    pub refresh_interval_ms: u64,
    /// Keep the driver initialized: persistence mode on every GPU, else held primary contexts.
    pub persistence_mode: bool,
    /// The CUDA driver library for held contexts.
    pub cuda_library: String,
    /// Page-cache warming budget.
    pub warm_budget_mib: u64,
    /// Extra files or directories to warm (large CUDA libraries of frequent images).
    pub warm_paths: Vec<PathBuf>,
}

impl Default for NvidiaSection {
    fn default() -> Self {
        NvidiaSection {
            edits: true,
            driver_root: PathBuf::from("/"),
            cdi_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
            edits_file: PathBuf::from(crate::nvidia::DEFAULT_EDITS_FILE),
            refresh_interval_ms: 5000,
            persistence_mode: true,
            cuda_library: "libcuda.so.1".into(),
            warm_budget_mib: 1024,
            warm_paths: Vec::new(),
        }
    }
}

/// The pool manager: tiers of idle GPU containers (issue 6).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// An idle Hot container is evicted to Warm after this long.
    pub hot_ttl_s: f64,
    /// A Warm container goes Cold after this long.
    pub warm_ttl_s: f64,
    /// Fraction of each GPU's memory kept free: above capacity × (1 − headroom), evict.
    pub headroom: f64,
    /// Prefetch a pressure victim when its function's last call is within k × its mean
    /// inter-arrival time.
    pub prefetch_iat: f64,
    /// Kill Cold containers (run-to-completion pools); off: the platform owns their lifetime.
    pub reclaim: bool,
    /// Fraction of host memory kept available: below it, Warm containers are reclaimed (with
    /// `reclaim`; without it the shortage is logged).
    pub host_headroom: f64,
    /// How a container's memory goes Warm unless its pod says (`io.mqfq.warm`): `checkpoint`
    /// (the driver's checkpoint API), `uvm` (the interposer's managed memory) or `off`.
    pub warm: mqfq_proto::warm::Warm,
    /// The backends a pod may choose with `io.mqfq.warm` (a Create asking another fails).
    pub warm_allowed: Vec<mqfq_proto::warm::Warm>,
}

impl Default for PoolSection {
    fn default() -> Self {
        let t = scheduler_core::config::TierConfig::default();
        PoolSection {
            hot_ttl_s: t.hot_ttl_s,
            warm_ttl_s: t.warm_ttl_s,
            headroom: t.headroom,
            prefetch_iat: t.prefetch_iat,
            reclaim: false,
            host_headroom: 0.1,
            warm: mqfq_proto::warm::Warm::default(),
            warm_allowed: vec![
                mqfq_proto::warm::Warm::Checkpoint,
                mqfq_proto::warm::Warm::Uvm,
                mqfq_proto::warm::Warm::Off,
            ],
        }
    }
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// ttrpc socket.
    pub socket: PathBuf,
    /// A second socket that answers Status and nothing else (empty: none), for readers such as
    /// the cluster publisher, which must not be able to admit or release.
    pub status_socket: PathBuf,
    /// Metrics listen address ("" = off).
    pub metrics_addr: String,
    /// light, balanced or throughput.
    pub profile: String,
    /// mqfq-sticky or fcfs.
    pub policy: String,
    /// GPU monitor.
    pub backend: Backend,
    /// NVML library to load.
    pub nvml_library: String,
    /// MPS pipe directory.
    pub mps_pipe_dir: PathBuf,
    /// Sampling period.
    pub sample_interval_ms: u64,
    /// Dispatch record file.
    pub dispatch_log: Option<PathBuf>,
    /// How long after start nothing is dispatched, so shims can re-register running
    /// containers (they do every second).
    pub restart_grace_ms: u64,
    /// Queue overrides.
    pub queue: QueueKnobs,
    /// Concurrency overrides.
    pub concurrency: ConcurrencyKnobs,
    /// Simulated GPUs.
    pub simulated: SimulatedSection,
    /// Pre-created GPU state.
    pub nvidia: NvidiaSection,
    /// Tiers of idle GPU containers.
    pub pool: PoolSection,
    /// Who decides weights and tenants.
    pub fairness: super::policy::FairnessSection,
    /// Per-shim caps and forgetting.
    pub limits: super::policy::LimitsSection,
    /// Which GPU a container given several gets.
    pub placement: super::placement::PlacementSection,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            status_socket: PathBuf::new(),
            metrics_addr: "127.0.0.1:9464".into(),
            profile: "balanced".into(),
            policy: GrantOrder::MqfqSticky.as_str().into(),
            backend: Backend::Auto,
            nvml_library: "libnvidia-ml.so.1".into(),
            mps_pipe_dir: PathBuf::from("/tmp/nvidia-mps"),
            sample_interval_ms: 100,
            dispatch_log: None,
            restart_grace_ms: 2000,
            queue: QueueKnobs::default(),
            concurrency: ConcurrencyKnobs::default(),
            simulated: SimulatedSection::default(),
            nvidia: NvidiaSection::default(),
            pool: PoolSection::default(),
            fairness: super::policy::FairnessSection::default(),
            limits: super::policy::LimitsSection::default(),
            placement: super::placement::PlacementSection::default(),
        }
    }
}

use scheduler_core::ConfigError;

fn reject(knob: &'static str, value: impl std::fmt::Display, reason: &'static str) -> ConfigError {
    ConfigError::new(knob, value, reason)
}

impl DaemonConfig {
    /// Reads and checks a file.
    ///
    /// # Errors
    /// Unreadable file, bad TOML, unknown key, or a value out of range — naming the key.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks TOML text (`path` is for messages).
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigFileError> {
        let cfg: DaemonConfig = toml::from_str(text).map_err(|e| ConfigFileError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().to_owned(),
        })?;
        cfg.check().map_err(|source| ConfigFileError::Value {
            path: path.to_owned(),
            source,
        })?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), scheduler_core::ConfigError> {
        self.profile()?;
        self.policy.parse::<GrantOrder>()?;
        self.queue_config()?;
        for mode in [GpuMode::Plain, GpuMode::Mps, GpuMode::Mig] {
            self.concurrency_config(mode)?;
        }
        if self.sample_interval_ms == 0 || self.sample_interval_ms > 100 {
            return Err(reject(
                "sample_interval_ms",
                self.sample_interval_ms,
                "must be 1..=100 (utilization samples at most 100 ms apart)",
            ));
        }
        if !self.metrics_addr.is_empty()
            && self.metrics_addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(reject(
                "metrics_addr",
                &self.metrics_addr,
                "must be ip:port, or empty to turn metrics off",
            ));
        }
        if self.socket.as_os_str().is_empty() || self.socket.as_os_str().len() > 100 {
            return Err(reject(
                "socket",
                self.socket.display(),
                "must be a path of 1..=100 bytes (unix socket limit)",
            ));
        }
        let s = &self.simulated;
        if s.gpus == 0 || s.gpus > 64 {
            return Err(reject("simulated.gpus", s.gpus, "must be 1..=64"));
        }
        match (s.memory_gib, s.memory_mib) {
            (Some(_), Some(_)) => {
                return Err(reject(
                    "simulated.memory_mib",
                    "with memory_gib",
                    "give memory_gib or memory_mib, not both",
                ));
            }
            (Some(v), None) if v == 0 || v > 1 << 20 => {
                return Err(reject("simulated.memory_gib", v, "must be 1..=1048576"));
            }
            (None, Some(v)) if v == 0 || v > 1 << 30 => {
                return Err(reject("simulated.memory_mib", v, "must be 1..=1073741824"));
            }
            _ => {}
        }
        if !(s.utilization_per_lease.is_finite() && s.utilization_per_lease > 0.0) {
            return Err(reject(
                "simulated.utilization_per_lease",
                s.utilization_per_lease,
                "must be a finite number > 0",
            ));
        }
        s.mode
            .parse::<GpuMode>()
            .map_err(|_| reject("simulated.mode", &s.mode, "must be plain, mps or mig"))?;
        scheduler_core::node::pool::Pool::new(self.pool_config()).map_err(|e| ConfigError {
            // The tier policy names its knobs bare; in this file they live under [pool].
            knob: match e.knob {
                "hot_ttl_s" => "pool.hot_ttl_s",
                "warm_ttl_s" => "pool.warm_ttl_s",
                "headroom" => "pool.headroom",
                "prefetch_iat" => "pool.prefetch_iat",
                k => k,
            },
            ..e
        })?;
        if !self.pool.warm_allowed.contains(&self.pool.warm) {
            return Err(reject(
                "pool.warm",
                self.pool.warm,
                "must be one of pool.warm_allowed",
            ));
        }
        self.memory_admission()?;
        self.fairness.check()?;
        self.limits.check()?;
        self.placement.check()?;
        if self.nvidia.refresh_interval_ms < 100 {
            return Err(reject(
                "nvidia.refresh_interval_ms",
                self.nvidia.refresh_interval_ms,
                "must be at least 100",
            ));
        }
        Ok(())
    }

    /// The profile.
    ///
    /// # Errors
    /// An unknown name.
    pub fn profile(&self) -> Result<Profile, scheduler_core::ConfigError> {
        self.profile.parse::<Profile>().map_err(|_| {
            reject(
                "profile",
                &self.profile,
                "must be light, balanced or throughput",
            )
        })
    }

    fn overrides(&self) -> Overrides {
        Overrides {
            queue: self.queue.clone(),
            concurrency: self.concurrency.clone(),
            // mqfqd never drives D from busy-time: the law is not configurable.
            law: None,
            // Checked by `check`; a bad name falls back to the default only here.
            order: self.policy.parse::<GrantOrder>().ok(),
            // The simulator's switch only.
            fixed_d: None,
        }
    }

    /// Memory admission's knobs (`[queue]`'s, within `[pool] headroom`); `None` when
    /// `[queue] memory_admission = false`.
    ///
    /// # Errors
    /// A bad `default_footprint_mb` or `[pool] headroom`.
    pub fn memory_admission(
        &self,
    ) -> Result<Option<scheduler_core::node::admission::MemoryAdmission>, ConfigError> {
        scheduler_core::node::admission::MemoryAdmission::from_knobs(
            &self.queue,
            self.pool.headroom,
        )
    }

    /// The pool manager's knobs.
    #[must_use]
    pub fn pool_config(&self) -> scheduler_core::node::pool::PoolConfig {
        let p = &self.pool;
        scheduler_core::node::pool::PoolConfig {
            tiers: scheduler_core::config::TierConfig {
                hot_ttl_s: p.hot_ttl_s,
                warm_ttl_s: p.warm_ttl_s,
                headroom: p.headroom,
                prefetch_iat: p.prefetch_iat,
            },
            reclaim: p.reclaim,
            host_headroom: p.host_headroom,
        }
    }

    /// Queue knobs: the profile's, overridden.
    ///
    /// # Errors
    /// A knob out of range.
    pub fn queue_config(&self) -> Result<QueueConfig, scheduler_core::ConfigError> {
        let p = self.profile()?;
        let mut q = p.queue();
        let mut c = p.concurrency(GpuMode::Plain);
        self.overrides().apply(&mut q, &mut c, GpuMode::Plain)?;
        Ok(q)
    }

    /// Concurrency knobs for a GPU mode: the profile's, overridden.
    ///
    /// # Errors
    /// A knob out of range.
    pub fn concurrency_config(
        &self,
        mode: GpuMode,
    ) -> Result<ConcurrencyConfig, scheduler_core::ConfigError> {
        let p = self.profile()?;
        let mut q = p.queue();
        let mut c = p.concurrency(mode);
        self.overrides().apply(&mut q, &mut c, mode)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
