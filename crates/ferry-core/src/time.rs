//! Timestamps as the store API carries them.

/// Microseconds since the Unix epoch, the unit every timestamp crosses the store API in.
pub type Micros = i64;

/// The current wall-clock time in microseconds since the Unix epoch.
pub fn now_micros() -> Micros {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
