//! Exponentially weighted moving averages, used for service times (the charge), inter-arrival
//! times (the sticky TTL) and smoothed utilization.

use serde::Serialize;

/// An EWMA that knows whether it has seen a sample yet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
    samples: u64,
}

impl Ewma {
    /// `alpha` is the weight of a new sample, in (0, 1]. Callers validate it (see
    /// [`crate::config`]); out-of-range values are clamped here so the average stays finite.
    #[must_use]
    pub fn new(alpha: f64) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(1e-6, 1.0)
        } else {
            1.0
        };
        Ewma {
            alpha,
            value: None,
            samples: 0,
        }
    }

    /// Adds a sample; non-finite samples are ignored. The first sample becomes the value.
    pub fn observe(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.samples += 1;
        self.value = Some(match self.value {
            None => x,
            Some(v) => v + self.alpha * (x - v),
        });
    }

    /// The average, if any sample was seen.
    #[must_use]
    pub fn get(&self) -> Option<f64> {
        self.value
    }

    /// The average, or `fallback` before the first sample.
    #[must_use]
    pub fn get_or(&self, fallback: f64) -> f64 {
        self.value.unwrap_or(fallback)
    }

    /// Samples seen.
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_then_smoothing() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.get(), None);
        assert_eq!(e.get_or(7.0), 7.0);
        e.observe(2.0);
        assert_eq!(e.get(), Some(2.0));
        e.observe(4.0);
        assert_eq!(e.get(), Some(3.0));
        e.observe(f64::NAN);
        assert_eq!(e.get(), Some(3.0));
        assert_eq!(e.samples(), 2);
    }
}
