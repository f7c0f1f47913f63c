//! Which GPUs an admission may use and which one it goes to at arrival: the device names a
//! container was given resolved against this node's GPUs, the least loaded of them, and the
//! checks every admission's fields get before anything changes.

use super::{AdmitInfo, Core, CoreError, invalid};
use crate::config::GpuMode;
use crate::node::is_key;

/// The most GPU names an admission may carry (a waiting one keeps them).
const MAX_GPU_NAMES: usize = 64;

impl Core {
    /// Which of this node's GPUs a container's device names cover.
    ///
    /// # Errors
    /// [`CoreError::UnknownGpu`] for a name that matches nothing.
    pub fn resolve(&self, names: &[String]) -> Result<Vec<u32>, CoreError> {
        let all = || self.gpus.iter().map(|g| g.info.index).collect::<Vec<_>>();
        if names.is_empty() {
            return Ok(all());
        }
        let mut out = Vec::new();
        for raw in names {
            let n = raw.trim();
            if n.is_empty() || n == "all" {
                return Ok(all());
            }
            // `2` or MIG `2:1` by index.
            let idx_part = n.split(':').next().unwrap_or(n);
            let found = if let Ok(i) = idx_part.parse::<u32>() {
                self.gpus.iter().find(|g| g.info.index == i)
            } else {
                self.gpus
                    .iter()
                    .find(|g| g.info.uuid == n || g.info.mig.iter().any(|m| m == n))
            };
            if let Some(g) = found {
                if !out.contains(&g.info.index) {
                    out.push(g.info.index);
                }
                continue;
            }
            // NVML (through nvml-wrapper) does not list MIG instances here: a MIG UUID we do not
            // know is on one of the GPUs in MIG mode.
            let mig: Vec<u32> = self
                .gpus
                .iter()
                .filter(|g| n.starts_with("MIG-") && g.info.mode == GpuMode::Mig)
                .map(|g| g.info.index)
                .collect();
            if mig.is_empty() {
                return Err(CoreError::UnknownGpu(n.to_owned()));
            }
            for i in mig {
                if !out.contains(&i) {
                    out.push(i);
                }
            }
        }
        Ok(out)
    }

    pub(super) fn slot(&self, index: u32) -> usize {
        self.gpus
            .iter()
            .position(|g| g.info.index == index)
            .unwrap_or(0)
    }

    /// Least loaded GPU (leases + waiting, relative to its limit) among `candidates`.
    pub(super) fn route(&self, candidates: &[u32]) -> usize {
        let load = |i: usize| {
            let g = &self.gpus[i];
            #[expect(
                clippy::cast_precision_loss,
                reason = "a queue's length: far below 2^52"
            )]
            let busy = f64::from(g.running) + g.queue.queued() as f64;
            busy / f64::from(g.conc.limit())
        };
        candidates
            .iter()
            .map(|&c| self.slot(c))
            .min_by(|&a, &b| load(a).total_cmp(&load(b)).then(a.cmp(&b)))
            .unwrap_or(0)
    }

    /// The checks an admission's fields get (for callers that use them before admitting,
    /// such as placement); the weight in force.
    ///
    /// # Errors
    /// The first invalid field, named.
    pub fn validate(info: &AdmitInfo) -> Result<f64, CoreError> {
        info.key()?;
        if !is_key(&info.function) {
            return Err(invalid(
                "function",
                format!(
                    "{:.64?} must be 1 to 253 characters of A-Z a-z 0-9 . _ - : / @ +",
                    info.function
                ),
            ));
        }
        let w = if info.weight == 0.0 { 1.0 } else { info.weight };
        if !(w.is_finite() && w > 0.0) {
            return Err(invalid(
                "weight",
                format!("{} must be a finite number > 0", info.weight),
            ));
        }
        let tw = info.tenant_weight;
        if !(tw == 0.0 || (tw.is_finite() && tw > 0.0)) {
            return Err(invalid(
                "tenant_weight",
                format!("{tw} must be a finite number > 0"),
            ));
        }
        if info.tenant.as_deref().is_some_and(|t| !is_key(t)) {
            return Err(invalid(
                "tenant",
                "must be 1 to 253 characters of A-Z a-z 0-9 . _ - : / @ +",
            ));
        }
        if info.gpus.len() > MAX_GPU_NAMES {
            return Err(invalid(
                "gpus",
                format!(
                    "{} names, at most {MAX_GPU_NAMES} (one per GPU or MIG instance)",
                    info.gpus.len()
                ),
            ));
        }
        Ok(w)
    }
}
