//! How to open a store.
use std::time::Duration;

use ferry_core::Limits;

/// How to open a store.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Pool size (default 10).
    pub max_connections: u32,
    /// How long to wait for a connection (default 10 s).
    pub acquire_timeout: Duration,
    /// Apply the embedded migrations on connect (default true).
    pub migrate: bool,
    /// Enqueue limits: payload size (default 960 KiB), checked before anything is written.
    pub limits: Limits,
    /// Count the rows claims skip as locked
    /// ([`rows_skipped_locked`](ferry_core::RowDispatch::rows_skipped_locked)) where that costs
    /// something (default false). PostgreSQL then recounts the window of every claim that comes
    /// back short: a second walk of the dispatch index, measured at +40–90 % claim latency
    /// (docs/tuning.md); worth it when diagnosing competing relays. MariaDB counts only when
    /// rows were actually passed over, SQLite never skips: both always report.
    pub measure_contention: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            migrate: true,
            limits: Limits::default(),
            measure_contention: false,
        }
    }
}
