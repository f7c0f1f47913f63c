//! Time as data. The scheduler never reads a clock itself: every call that needs "now" takes a
//! [`Time`] (the daemon passes the time since it started, the simulator its trace's time). That
//! keeps the queue deterministic, lets the simulator run a day of trace in a second, and lets tests
//! step time by hand.

use std::fmt;

/// A point in time, in nanoseconds since an epoch the caller chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Time(u64);

impl Time {
    /// The clock's epoch.
    pub const ZERO: Time = Time(0);

    /// From whole nanoseconds.
    #[must_use]
    pub const fn from_nanos(n: u64) -> Self {
        Time(n)
    }

    /// From (non-negative, finite) milliseconds; negative or NaN input saturates to zero.
    #[must_use]
    pub fn from_millis_f64(ms: f64) -> Self {
        Time::from_secs_f64(ms / 1e3)
    }

    /// From (non-negative, finite) seconds; negative or NaN input saturates to zero.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "seconds checked > 0, rounded; huge values saturate, as meant"
    )]
    pub fn from_secs_f64(s: f64) -> Self {
        if s.is_nan() || s <= 0.0 {
            return Time(0);
        }
        // `as` saturates at u64::MAX for huge values, which is what we want.
        Time((s * 1e9).round() as u64)
    }

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the epoch.
    #[must_use]
    #[expect(
        clippy::cast_precision_loss,
        reason = "nanoseconds: exact for 104 days, then rounded to under a µs"
    )]
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Seconds from `earlier` to `self`, zero if `earlier` is later.
    #[must_use]
    pub fn secs_since(self, earlier: Time) -> f64 {
        Time(self.0.saturating_sub(earlier.0)).as_secs_f64()
    }

    /// `self` plus `secs` seconds (saturating; negative `secs` count as zero).
    #[must_use]
    pub fn plus_secs(self, secs: f64) -> Time {
        Time(self.0.saturating_add(Time::from_secs_f64(secs).0))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_and_saturate() {
        assert_eq!(Time::from_millis_f64(1.5).as_nanos(), 1_500_000);
        assert_eq!(Time::from_secs_f64(-3.0), Time::ZERO);
        assert_eq!(Time::from_secs_f64(f64::NAN), Time::ZERO);
        let t = Time::from_secs_f64(2.0);
        assert!((t.plus_secs(0.25).secs_since(t) - 0.25).abs() < 1e-9);
        assert_eq!(t.secs_since(t.plus_secs(1.0)), 0.0);
    }
}
