//! NVML's per-process utilization samples, kept a short while and attributed to bursts.
//!
//! A function is compute- or memory-bound by what its own processes do on the GPU, not by
//! what the whole GPU does while other work shares it. NVML samples each process's SM and
//! memory-bandwidth utilization; the daemon records them here as they come (per GPU and host
//! PID), and when a burst ends the shim names the processes that took part (their PIDs come
//! from the kernel, not from the container), so the burst's [`super::Sample`] gets the mean of
//! their samples taken while its lease was held. A burst shorter than NVML's sampling period
//! may have none: its utilization is then unknown, not zero.
//!
//! Bounded: samples older than [`KEEP_S`] are dropped, at most [`PER_PROCESS`] are kept per
//! process and [`MAX_PROCESSES`] processes are tracked (the one sampled least recently is
//! forgotten first), whatever NVML returns.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::time::Time;

/// How long a sample is kept, seconds (a lease held longer is judged on its last minutes).
pub const KEEP_S: f64 = 300.0;
/// Samples kept per process.
pub const PER_PROCESS: usize = 512;
/// Processes tracked.
pub const MAX_PROCESSES: usize = 4096;

/// One NVML sample of one process on one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessUse {
    /// Host PID.
    pub pid: u32,
    /// SM utilization, 0..=1.
    pub sm: f64,
    /// Memory-bandwidth utilization, 0..=1.
    pub mem: f64,
}

/// One process's samples on one GPU, oldest first: (when, SM, memory bandwidth).
type Series = VecDeque<(Time, f64, f64)>;

/// The samples of the last [`KEEP_S`], by (GPU, host PID).
#[derive(Clone, Debug, Default)]
pub struct ProcessSamples {
    by_process: HashMap<(u32, u32), Series>,
}

impl ProcessSamples {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what NVML sampled on `gpu` at `now`. Readings out of 0..=1 or not finite are
    /// skipped.
    pub fn record(&mut self, gpu: u32, now: Time, samples: &[ProcessUse]) {
        for s in samples {
            if !(0.0..=1.0).contains(&s.sm) || !(0.0..=1.0).contains(&s.mem) {
                continue;
            }
            let key = (gpu, s.pid);
            if !self.by_process.contains_key(&key) && self.by_process.len() >= MAX_PROCESSES {
                self.forget_one();
            }
            let q = self.by_process.entry(key).or_default();
            if q.len() >= PER_PROCESS {
                q.pop_front();
            }
            q.push_back((now, s.sm, s.mem));
        }
        self.by_process.retain(|_, q| {
            while q.front().is_some_and(|(t, ..)| now.secs_since(*t) > KEEP_S) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }

    /// Drops the process sampled least recently.
    fn forget_one(&mut self) {
        let oldest = self
            .by_process
            .iter()
            .min_by_key(|(k, q)| (q.back().map(|s| s.0), **k))
            .map(|(k, _)| *k);
        if let Some(k) = oldest {
            self.by_process.remove(&k);
        }
    }

    /// The mean SM and memory-bandwidth utilization of `pids` on `gpu` over the samples taken
    /// in `[since, until]`: per sampling instant the processes' figures add up (they share the
    /// burst), and the instants are averaged. `None` when no sample fell in the window.
    #[must_use]
    pub fn mean(&self, gpu: u32, pids: &[u32], since: Time, until: Time) -> Option<(f64, f64)> {
        let mut at: BTreeMap<Time, (f64, f64)> = BTreeMap::new();
        for pid in pids {
            let Some(q) = self.by_process.get(&(gpu, *pid)) else {
                continue;
            };
            for &(t, sm, mem) in q.iter().filter(|(t, ..)| *t >= since && *t <= until) {
                let e = at.entry(t).or_default();
                e.0 += sm;
                e.1 += mem;
            }
        }
        if at.is_empty() {
            return None;
        }
        #[expect(clippy::cast_precision_loss, reason = "a sample count")]
        let n = at.len() as f64;
        let (sm, mem) = at.values().fold((0.0, 0.0), |(a, b), (sm, mem)| {
            (a + sm.min(1.0), b + mem.min(1.0))
        });
        Some((sm / n, mem / n))
    }

    /// Processes tracked.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_process.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_process.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    fn at(pid: u32, sm: f64, mem: f64) -> ProcessUse {
        ProcessUse { pid, sm, mem }
    }

    #[test]
    fn a_burst_gets_the_mean_of_its_own_processes_over_its_lease() {
        let mut p = ProcessSamples::new();
        p.record(0, t(1.0), &[at(10, 0.9, 0.1), at(20, 0.1, 0.9)]);
        p.record(0, t(2.0), &[at(10, 0.7, 0.3), at(11, 0.2, 0.2)]);
        p.record(1, t(2.0), &[at(10, 0.0, 1.0)]);
        p.record(0, t(3.0), &[at(10, 0.5, 0.5)]);
        // Process 10 on GPU 0 over [1.5, 3]: instants 2 and 3.
        let (sm, mem) = p.mean(0, &[10], t(1.5), t(3.0)).unwrap();
        assert!(
            (sm - 0.6).abs() < 1e-12 && (mem - 0.4).abs() < 1e-12,
            "{sm} {mem}"
        );
        // Two processes of one burst add up at each instant.
        let (sm, _) = p.mean(0, &[10, 11], t(1.5), t(2.5)).unwrap();
        assert!((sm - 0.9).abs() < 1e-12, "{sm}");
        // Another function's process, another GPU, or outside the lease: not counted.
        assert_eq!(p.mean(0, &[10], t(3.5), t(9.0)), None);
        assert_eq!(p.mean(2, &[10], t(0.0), t(9.0)), None);
        assert_eq!(p.mean(0, &[99], t(0.0), t(9.0)), None);
        let (_, mem) = p.mean(1, &[10], t(0.0), t(9.0)).unwrap();
        assert!((mem - 1.0).abs() < 1e-12);
    }

    #[test]
    fn nvml_figures_out_of_range_are_skipped_and_sums_stay_in_range() {
        let mut p = ProcessSamples::new();
        p.record(
            0,
            t(1.0),
            &[at(1, f64::NAN, 0.1), at(2, 1.5, 0.1), at(3, 0.2, -0.1)],
        );
        assert!(p.is_empty());
        p.record(0, t(1.0), &[at(1, 0.8, 0.8), at(2, 0.8, 0.8)]);
        assert_eq!(p.mean(0, &[1, 2], t(0.0), t(2.0)), Some((1.0, 1.0)));
    }

    #[test]
    fn the_store_is_bounded_in_time_per_process_and_in_processes() {
        let mut p = ProcessSamples::new();
        for i in 0..(PER_PROCESS + 10) {
            #[expect(
                clippy::cast_precision_loss,
                reason = "a loop index below PER_PROCESS + 10"
            )]
            p.record(0, t(i as f64 * 0.1), &[at(1, 0.5, 0.5)]);
        }
        assert_eq!(p.by_process[&(0, 1)].len(), PER_PROCESS);
        p.record(0, t(KEEP_S + 100.0), &[at(2, 0.5, 0.5)]);
        assert_eq!(p.len(), 1, "process 1's samples aged out");
        let many: Vec<ProcessUse> = (0..u32::try_from(MAX_PROCESSES).unwrap() + 5)
            .map(|pid| at(pid + 10, 0.1, 0.1))
            .collect();
        p.record(0, t(KEEP_S + 101.0), &many);
        assert_eq!(p.len(), MAX_PROCESSES);
        assert!(
            !p.by_process.contains_key(&(0, 2)),
            "the process sampled least recently went first"
        );
    }
}
