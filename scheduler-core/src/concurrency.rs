//! The dynamic concurrency limit D of one GPU.
//!
//! `D_new = D × (1 + α (U_target − U))`, clamped to `[1, D_max]`, once per utilization sample
//! (samples come as data, at most 100 ms apart). Below the target utilization D grows
//! geometrically, above it D shrinks, so the GPU runs as many invocations as keep it busy and no
//! more: extra co-runners would only slow each other down. The limit handed out is `⌊D⌋`.

use serde::Serialize;

use crate::config::{ConcurrencyConfig, ConfigError};

/// D for one GPU (or one MIG instance).
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyController {
    cfg: ConcurrencyConfig,
    d: f64,
    last_u: Option<f64>,
}

impl ConcurrencyController {
    /// A controller at `d_initial`.
    ///
    /// # Errors
    /// [`ConfigError`] naming a bad knob.
    pub fn new(cfg: ConcurrencyConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let d = cfg.d_initial;
        Ok(ConcurrencyController {
            cfg,
            d,
            last_u: None,
        })
    }

    /// Feeds one utilization sample in [0, 1] (values outside are clamped, NaN ignored) and
    /// returns the new D.
    pub fn observe(&mut self, utilization: f64) -> f64 {
        if utilization.is_nan() {
            return self.d;
        }
        let u = utilization.clamp(0.0, 1.0);
        self.last_u = Some(u);
        let next = self.d * (1.0 + self.cfg.alpha * (self.cfg.u_target - u));
        self.d = next.clamp(1.0, f64::from(self.cfg.d_max));
        self.d
    }

    /// The real-valued D.
    #[must_use]
    pub fn d(&self) -> f64 {
        self.d
    }

    /// How many invocations may run now: `⌊D⌋`, at least 1.
    #[must_use]
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn limit(&self) -> u32 {
        // d is clamped to [1, d_max] with d_max a u32, so the cast is exact after floor.
        (self.d.floor() as u32).max(1)
    }

    /// `⌊D⌋` raised to `floor` (but never above D_max): the dispatcher's floor of 2 while the
    /// short-slot reserve is in force.
    #[must_use]
    pub fn limit_at_least(&self, floor: u32) -> u32 {
        self.limit().max(floor.min(self.cfg.d_max))
    }

    /// The last utilization sample, if any.
    #[must_use]
    pub fn last_utilization(&self) -> Option<f64> {
        self.last_u
    }

    /// The knobs.
    #[must_use]
    pub fn config(&self) -> &ConcurrencyConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuMode;

    #[test]
    fn grows_when_idle_shrinks_when_saturated_and_stays_clamped() {
        let mut c =
            ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)).unwrap();
        assert_eq!(c.limit(), 2);
        let d1 = c.observe(0.4);
        assert!((d1 - 2.0 * (1.0 + 0.2 * 0.5)).abs() < 1e-12);
        for _ in 0..100 {
            c.observe(0.0);
        }
        assert_eq!(c.limit(), 8, "clamped at D_max for plain mode");
        for _ in 0..200 {
            c.observe(1.0);
        }
        assert_eq!(c.d(), 1.0, "never below 1");
        c.observe(f64::NAN);
        assert_eq!(c.d(), 1.0);
        assert_eq!(c.last_utilization(), Some(1.0));
    }

    #[test]
    fn floor_is_capped_by_d_max() {
        let c = ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Mig, 0.2)).unwrap();
        assert_eq!(c.limit_at_least(2), 1);
        let mut c =
            ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)).unwrap();
        for _ in 0..100 {
            c.observe(1.0);
        }
        assert_eq!(c.limit(), 1);
        assert_eq!(c.limit_at_least(2), 2);
    }

    #[test]
    fn at_target_d_holds() {
        let mut c =
            ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Mps, 0.3)).unwrap();
        let d0 = c.d();
        assert_eq!(c.observe(0.9), d0);
    }

    #[test]
    fn mig_is_one() {
        let mut c =
            ConcurrencyController::new(ConcurrencyConfig::for_mode(GpuMode::Mig, 0.2)).unwrap();
        c.observe(0.0);
        assert_eq!(c.limit(), 1);
    }
}
