//! The sampling loop: every `sample_interval_ms` the GPUs' readings move D and the pool,
//! sticky TTLs expire, idle flows are forgotten, and the gauges are refreshed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use scheduler_core::node::Input;
use scheduler_core::node::admission::GpuReading;

use super::{Daemon, pool};
use crate::monitor::{GpuLoad, GpuMonitor, Sample};

impl Daemon {
    /// Runs the sampling loop forever: utilization → D, TTL expiry, gauges.
    pub async fn sample_loop(self: Arc<Self>, mut monitor: Box<dyn GpuMonitor>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut host_was_short = false;
        let mut last_forget = Instant::now();
        loop {
            tick.tick().await;
            if self.flow_idle_s > 0.0 && last_forget.elapsed() >= Duration::from_secs(10) {
                last_forget = Instant::now();
                let now = self.now();
                let gone = {
                    let mut inner = self.lock();
                    let (gone, out) = inner.node.forget_idle(now, self.flow_idle_s);
                    self.settle(&mut inner, out);
                    gone
                };
                if !gone.is_empty() {
                    tracing::info!(flows = gone.len(), "idle flows forgotten");
                    self.metrics.forget_functions(&gone);
                }
            }
            let load: Vec<GpuLoad> = {
                let inner = self.lock();
                inner
                    .node
                    .core()
                    .gpus()
                    .iter()
                    .map(|g| GpuLoad {
                        leases: g.running,
                        resident_bytes: inner.node.pool().hot_bytes(g.info.index),
                    })
                    .collect()
            };
            // NVML calls block: on the blocking pool, not on a worker that serves shims.
            let sampled = tokio::task::spawn_blocking(move || {
                let s = monitor.sample(&load);
                (monitor, s)
            })
            .await;
            let Ok((m, sampled)) = sampled else {
                tracing::error!("GPU sampling panicked: D and the pool stop following the GPUs");
                return;
            };
            monitor = m;
            let samples = match sampled {
                Ok(s) => {
                    if failing {
                        tracing::info!("GPU sampling recovered");
                        failing = false;
                    }
                    s
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "GPU sampling failed: {e}; D follows the admissions' slowdown alone"
                        );
                        failing = true;
                    }
                    Vec::new()
                }
            };
            let host = pool::host_memory();
            let now = self.now();
            let mut inner = self.lock();
            let last: Vec<(u32, u64)> = inner
                .node
                .core()
                .gpus()
                .iter()
                .map(|g| (g.info.index, g.memory_used))
                .collect();
            let samples = crate::monitor::with_last_memory(samples, &last);
            inner.held.keep(&samples);
            self.placement_sample(&mut inner, &samples, failing, now);
            let readings: Vec<GpuReading> = samples.iter().map(Sample::reading).collect();
            // Grants first (a delivered one is a pool hit), then the pool's pressure and timers
            // over the memory just read.
            for input in [Input::Sample(readings), Input::Tick { host }] {
                if let Ok(out) = inner.node.step(&input, now) {
                    self.settle(&mut inner, out);
                }
            }
            say_host_short(&mut host_was_short, inner.node.pool().host_short());
            let gpus = inner.node.core().gpus();
            let fail_open = inner.node.core().fail_open_starts();
            let counts = inner
                .node
                .pool_mut()
                .tier_counts()
                .map(|c| (c, inner.node.pool().memory_by_function()));
            drop(inner);
            self.metrics.gauges(&gpus, fail_open);
            self.metrics.gpm(&samples);
            if let Some((c, memory)) = counts {
                self.metrics.pool_gauges(&c);
                self.metrics.pool_memory(&memory);
            }
        }
    }
}

/// Says when host memory falls below `[pool] host_headroom` with nothing the pool can free
/// (`short` bytes; no `reclaim`), and when it recovers: once per change, not per sample.
fn say_host_short(was_short: &mut bool, short: u64) {
    if (short > 0) == *was_short {
        return;
    }
    *was_short = short > 0;
    if *was_short {
        tracing::warn!(
            short_mib = short >> 20,
            "host memory below [pool] host_headroom, held by Warm containers the pool cannot \
             free ([pool] reclaim is off: the platform owns their lifetimes)"
        );
    } else {
        tracing::info!("host memory back above [pool] host_headroom");
    }
}
