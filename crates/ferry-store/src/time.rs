//! Durations as the stores bind them.
use std::time::Duration;

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}
