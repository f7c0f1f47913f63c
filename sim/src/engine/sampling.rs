//! The monitor's side of the simulated node: what each sample period shows the controllers
//! (busy-time, SM activity where the GPUs have GPM, memory in use) and the idle stretches between
//! arrivals, sampled as the daemon would have sampled them.

use scheduler_core::concurrency::Signals;
use scheduler_core::node::admission::GpuReading;

use super::{Clock, Engine, Model, Policy, gpu_index};

impl<M: Model> Engine<'_, M> {
    /// Idle until the next arrival: skips to the sample just before it, feeding the controllers
    /// the idle samples they would have seen (capped; D saturates long before), and the model
    /// the gap.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "samples skipped: floored, capped at 64, a negative count saturating to 0"
    )]
    pub(super) fn skip_idle(&mut self, clock: &mut Clock, t_arr: f64, policy: &mut dyn Policy) {
        let skipped = ((t_arr - clock.next_sample) / self.cfg.sample_ms).floor();
        let n = (skipped as u64).min(64);
        let idle = self.monitor(0.0, 0.0);
        for g in &mut self.gpus {
            for _ in 0..n {
                g.conc.observe(idle, false);
            }
            g.util_smooth *= 0.4f64.powf(skipped.min(64.0));
            g.busy_at_sample = g.busy_ms;
            g.any_at_sample = g.any_ms;
        }
        let resume = clock.next_sample + skipped * self.cfg.sample_ms;
        if n > 0 {
            M::idle_gap(self, (clock.next_sample, resume), n, idle, policy);
        }
        clock.next_sample = resume;
    }

    /// What the monitor reads: busy-time always, SM activity where the GPUs have GPM.
    fn monitor(&self, busy: f64, sm: f64) -> Signals {
        Signals {
            busy: Some(busy.clamp(0.0, 1.0)),
            sm_activity: self.cfg.gpm.then_some(sm.clamp(0.0, 1.0)),
        }
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "MB clamped >= 0: its bytes fit u64"
    )]
    pub(super) fn used_bytes(&self, g: usize) -> u64 {
        (self.gpus[g].used_mb.max(0.0) * 1024.0 * 1024.0) as u64
    }

    /// A utilization sample on every GPU (D moves; the published gate's estimate every 500 ms),
    /// handed to the model.
    pub(super) fn sample(&mut self, clock: &mut Clock, policy: &mut dyn Policy) {
        clock.samples += 1;
        let waiting = policy.queued() > 0;
        if !self.gpus.is_empty() {
            let limit = M::limit(self, 0);
            if self.limits.last().is_none_or(|&(_, l)| l != limit) {
                self.limits.push(((self.now - clock.first) / 1e3, limit));
            }
        }
        let mut samples = Vec::with_capacity(self.gpus.len());
        for g in 0..self.gpus.len() {
            let used = self.used_bytes(g);
            let gpu = &self.gpus[g];
            let u = (gpu.busy_ms - gpu.busy_at_sample) / self.cfg.sample_ms;
            let any = (gpu.any_ms - gpu.any_at_sample) / self.cfg.sample_ms;
            let signals = self.monitor(any, u);
            let gpu = &mut self.gpus[g];
            gpu.busy_at_sample = gpu.busy_ms;
            gpu.any_at_sample = gpu.any_ms;
            gpu.conc.observe(signals, waiting);
            if clock.samples.is_multiple_of(clock.paper_every) {
                gpu.util_smooth = 0.6 * u + 0.4 * gpu.util_smooth;
                gpu.gate_est = gpu.util_smooth;
            }
            samples.push(GpuReading {
                index: gpu_index(g),
                signals,
                memory_used: used,
            });
        }
        M::sampled(self, clock.samples, &samples, policy);
        clock.next_sample += self.cfg.sample_ms;
    }
}
