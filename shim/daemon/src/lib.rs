//! `mqfqd`, the node daemon, and `mqfqctl`: the node's MQFQ-Sticky admission queue and its pool
//! behind a ttrpc socket. The decisions are `scheduler_core::node`'s (the simulator runs the same
//! code); this crate gives them their inputs and carries out their orders.
//!
//! - [`monitor`] — GPU monitoring behind a trait (NVML, simulated).
//! - [`config`] — `mqfqd.toml`.
//! - [`server`] — the ttrpc service, shim liveness, the sampling loop, the dispatch log.
//! - [`metrics`] — Prometheus metrics and their HTTP endpoint.
//! - [`policy`] — weights and tenants from the operator's rules; per-shim caps.
//! - [`warm`] — held primary CUDA contexts, the warm driver where persistence mode is refused.
//! - [`nvidia`] — building the node's NVIDIA edits (CDI import, discovery) and warming the page
//!   cache; the shim applies them.
//! - [`ctl`] — `mqfqctl`'s client and its tables.
//!
//! A separate crate from the shim's so that the binary containerd starts for every pod links
//! none of this (Prometheus, NVML, YAML); both speak `mqfq-proto`.

pub mod config;
pub mod ctl;
pub mod doctor;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod logging;
pub mod metrics;
pub mod monitor;
pub mod nvidia;
pub mod placement;
pub mod policy;
pub mod server;
pub mod warm;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use scheduler_core::GpuMode;

use self::config::{Backend, DaemonConfig};
use self::monitor::{GpuMonitor, NvmlGpus, SimulatedGpus};

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A knob out of range.
    #[error(transparent)]
    Config(#[from] scheduler_core::ConfigError),
    /// The core refused (no GPU).
    #[error(transparent)]
    Core(#[from] scheduler_core::node::admission::CoreError),
    /// The GPU monitor failed.
    #[error(transparent)]
    Monitor(#[from] self::monitor::MonitorError),
    /// Sockets, files.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// Makes every file and socket the daemon creates from here on private to root (umask 077), so
/// the socket is never reachable, even between bind and chmod.
pub fn restrict_umask() {
    let _ = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// The monitor the config asks for; `auto` falls back to simulated GPUs when NVML cannot load.
///
/// # Errors
/// `backend = "nvml"` and NVML fails.
pub fn open_monitor(cfg: &DaemonConfig) -> Result<Box<dyn GpuMonitor>, RunError> {
    let simulated = || -> Result<Box<dyn GpuMonitor>, RunError> {
        let s = &cfg.simulated;
        let mode = s.mode.parse().map_err(RunError::Config)?;
        Ok(Box::new(SimulatedGpus::new(
            s.gpus,
            s.memory_bytes(),
            mode,
            s.utilization_per_lease,
        )))
    };
    match cfg.backend {
        Backend::Simulated => simulated(),
        Backend::Nvml => Ok(Box::new(NvmlGpus::open(
            &cfg.nvml_library,
            &cfg.mps_pipe_dir,
        )?)),
        Backend::Auto => match NvmlGpus::open(&cfg.nvml_library, &cfg.mps_pipe_dir) {
            Ok(n) => Ok(Box::new(n)),
            Err(e) => {
                tracing::warn!("{e}: no NVIDIA GPU monitor, using simulated GPUs");
                simulated()
            }
        },
    }
}

/// The node's admission core for `gpus`, with the config's queue knobs and, per GPU mode, its
/// concurrency knobs: what `mqfqd` runs (the simulator's `mqfq-sticky` runs the same core; the
/// same-sequence test builds it here).
///
/// # Errors
/// Bad config values; no GPU.
pub fn build_core(
    cfg: &DaemonConfig,
    gpus: Vec<scheduler_core::node::admission::GpuInfo>,
) -> Result<scheduler_core::node::admission::Core, RunError> {
    let queue = cfg.queue_config()?;
    let (plain, mps, mig) = (
        cfg.concurrency_config(GpuMode::Plain)?,
        cfg.concurrency_config(GpuMode::Mps)?,
        cfg.concurrency_config(GpuMode::Mig)?,
    );
    let mut core = scheduler_core::node::admission::Core::new(gpus, &queue, |mode| match mode {
        GpuMode::Plain => plain.clone(),
        GpuMode::Mps => mps.clone(),
        GpuMode::Mig => mig.clone(),
    })?;
    core.set_limits(cfg.limits.waiters_per_shim, cfg.limits.containers_per_shim);
    core.set_max_burst_hold(cfg.limits.max_burst_hold())?;
    if let Some(m) = cfg.memory_admission()? {
        core.set_memory(m)?;
    }
    core.set_late_binding(cfg.queue.late_binding_or(false));
    Ok(core)
}

/// The node `mqfqd` runs over `gpus` with `cfg`: [`build_core`] and the pool with its knobs.
///
/// # Errors
/// A knob out of range.
pub fn build_node(
    cfg: &DaemonConfig,
    gpus: Vec<scheduler_core::node::admission::GpuInfo>,
) -> Result<scheduler_core::node::Node, RunError> {
    let core = build_core(cfg, gpus)?;
    let pool = scheduler_core::node::pool::Pool::new(cfg.pool_config())?;
    Ok(scheduler_core::node::Node::new(core, pool))
}

/// The daemon over its node, as the configuration says: restart grace, the pool's memory
/// reading, fairness, the dispatch log, the Warm tier's backends and placement.
fn daemon_for(
    cfg: &DaemonConfig,
    gpus: Vec<scheduler_core::node::admission::GpuInfo>,
    backend: &'static str,
) -> Result<Arc<server::Daemon>, RunError> {
    let mut node = build_node(cfg, gpus)?;
    // Daemon time starts at zero with the daemon.
    node.core_mut().hold_until(scheduler_core::Time::from_nanos(
        cfg.restart_grace_ms.saturating_mul(1_000_000),
    ));
    node.pool_mut().set_measured(backend == "nvml");
    let daemon = server::Daemon::with_policy(
        node,
        backend,
        cfg.dispatch_log.as_deref(),
        cfg.fairness.clone(),
        cfg.limits.flow_idle_s,
    )
    .map_err(io("open dispatch_log"))?;
    daemon.set_warm(cfg.pool.warm, cfg.pool.warm_allowed.clone());
    if cfg.placement.enabled {
        daemon.set_placement(Some(scheduler_core::placement::Placement::new(
            cfg.placement.config(),
        )?));
    }
    Ok(daemon)
}

/// Runs `mqfqd` until `stop` resolves: binds the socket, starts sampling and metrics.
///
/// # Errors
/// Bad config values, the monitor, or the socket / metrics address.
pub async fn run(
    cfg: DaemonConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let collected =
        crate::nvidia::collect_legacy_ldcache(Path::new(crate::nvidia::LEGACY_LDCACHE_DIR));
    if collected > 0 {
        tracing::info!(
            files = collected,
            "removed ld.so.cache files left by an earlier shim in {}",
            crate::nvidia::LEGACY_LDCACHE_DIR
        );
    }
    let mut monitor = open_monitor(&cfg)?;
    let gpus = monitor.devices()?;
    // Kept for the daemon's lifetime: dropping it releases the contexts.
    let _held = if cfg.nvidia.persistence_mode {
        warm_driver(monitor.as_mut(), &cfg.nvidia.cuda_library)
    } else {
        None
    };
    let daemon = daemon_for(&cfg, gpus.clone(), monitor.backend())?;
    let mut server = server::bind(&cfg.socket)
        .map_err(io(format!("listen on {}", cfg.socket.display())))?
        .register_service(mqfq_proto::api::create_admission(Arc::new(
            server::Service(daemon.clone()),
        )));
    let mut status_server = if cfg.status_socket.as_os_str().is_empty() {
        None
    } else {
        Some(
            server::bind(&cfg.status_socket)
                .map_err(io(format!(
                    "listen on status_socket {}",
                    cfg.status_socket.display()
                )))?
                .register_service(mqfq_proto::api::create_admission(Arc::new(
                    server::StatusOnly(daemon.clone()),
                ))),
        )
    };
    let metrics_task = if cfg.metrics_addr.is_empty() {
        None
    } else {
        let l = tokio::net::TcpListener::bind(&cfg.metrics_addr)
            .await
            .map_err(io(format!("metrics_addr {}", cfg.metrics_addr)))?;
        Some(tokio::spawn(metrics::serve(l, daemon.metrics())))
    };
    server.start().await.map_err(|e| RunError::Io {
        what: "start ttrpc server".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    if let Some(s) = status_server.as_mut() {
        s.start().await.map_err(|e| RunError::Io {
            what: "start the status socket's server".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    }
    let edits_task = cfg
        .nvidia
        .edits
        .then(|| tokio::spawn(edits_loop(cfg.nvidia.clone(), cfg.mps_pipe_dir.clone())));
    let sampler = tokio::spawn(
        daemon
            .clone()
            .sample_loop(monitor, Duration::from_millis(cfg.sample_interval_ms)),
    );
    tracing::info!(
        socket = %cfg.socket.display(),
        backend = daemon.status().backend,
        gpus = gpus.len(),
        boot_id = daemon.boot_id(),
        "mqfqd ready"
    );
    stop.await;
    tracing::info!("mqfqd stopping");
    sampler.abort();
    if let Some(t) = edits_task {
        t.abort();
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    let _ = server.shutdown().await;
    let _ = std::fs::remove_file(&cfg.socket);
    if let Some(mut s) = status_server {
        let _ = s.shutdown().await;
        let _ = std::fs::remove_file(&cfg.status_socket);
    }
    Ok(())
}

/// Builds the NVIDIA edits at start and whenever their sources change, publishes them for the
/// shims, and warms the page cache with the files they mount.
async fn edits_loop(cfg: config::NvidiaSection, mps: std::path::PathBuf) {
    let mut last = None;
    loop {
        let fp = crate::nvidia::fingerprint(&cfg.cdi_dirs, &cfg.driver_root, &mps);
        if last.as_ref() != Some(&fp) {
            last = Some(fp);
            let c = cfg.clone();
            let m = mps.clone();
            let built = tokio::task::spawn_blocking(move || {
                crate::nvidia::build(&c.cdi_dirs, &c.driver_root, &m)
            })
            .await
            .ok()
            .flatten();
            publish(&cfg, built).await;
        }
        tokio::time::sleep(Duration::from_millis(cfg.refresh_interval_ms)).await;
    }
}

async fn publish(cfg: &config::NvidiaSection, built: Option<crate::nvidia::edits::NodeEdits>) {
    let Some(edits) = built else {
        if std::fs::remove_file(&cfg.edits_file).is_ok() {
            tracing::info!(
                "no NVIDIA driver any more: removed {}",
                cfg.edits_file.display()
            );
        } else {
            tracing::info!("no NVIDIA driver: GPU containers get no pre-computed edits");
        }
        return;
    };
    if let Some(e) = &edits.error {
        tracing::error!(
            "NVIDIA setup is broken ({}): GPU containers will fail at Create: {e}",
            edits.source
        );
    } else {
        tracing::info!(
            source = %edits.source, driver = %edits.driver_version, gpus = edits.devices.len(),
            mounts = edits.common.mounts.len(), "NVIDIA edits built"
        );
    }
    if let Err(e) = crate::nvidia::store(&cfg.edits_file, &edits) {
        tracing::error!("publish NVIDIA edits: {e}");
        return;
    }
    let mut paths: Vec<std::path::PathBuf> = edits
        .common
        .mounts
        .iter()
        .map(|m| m.host_path.clone().into())
        .collect();
    paths.extend(cfg.warm_paths.iter().cloned());
    let budget = cfg.warm_budget_mib.saturating_mul(1 << 20);
    if let Ok(w) =
        tokio::task::spawn_blocking(move || crate::nvidia::warm::warm(&paths, budget)).await
    {
        tracing::info!(
            files = w.files,
            bytes = w.bytes,
            skipped = w.skipped,
            "page cache warmed"
        );
    }
}

/// Keeps the driver initialized: persistence mode where NVML allows it, else primary contexts
/// held through libcuda; neither is a logged state, not an error.
fn warm_driver(monitor: &mut dyn GpuMonitor, cuda: &str) -> Option<warm::HeldContexts> {
    let persistence = match monitor.keep_driver_warm() {
        Ok(what) => {
            tracing::info!("warm driver: {what}");
            return None;
        }
        Err(e) => e,
    };
    if monitor.backend() != "nvml" {
        return None;
    }
    match warm::HeldContexts::hold(cuda) {
        Ok(h) => {
            tracing::info!(
                "warm driver: persistence mode refused ({persistence}); holding the primary CUDA context of {} GPUs",
                h.count()
            );
            Some(h)
        }
        Err(e) => {
            tracing::warn!(
                "warm driver: persistence mode refused ({persistence}) and {cuda}: {e}; a container's first CUDA call may pay driver initialization"
            );
            None
        }
    }
}
