//! The relay's settings: [`RelayConfig`] with every default explained next to it, the
//! per-mode worker defaults ([`WorkerDefaults`]) and the range check ([`RelayConfig::validate`]).
use std::time::Duration;

use ferry_core::{Backoff, DispatchMode};
use ferry_store::Backend;

/// Relay settings. Every default is explained next to it.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Owner id of this process; unique per start (default: `<host>-<pid>-<uuid>`).
    pub owner: String,
    /// Shard workers in this process (default 4, row dispatch's; tools pick per mode with
    /// [`WorkerDefaults`]). Slot `s` goes to worker `s % workers`.
    pub workers: usize,
    /// Max events per claim or cursor read (default 500: amortizes the claim and CAS round
    /// trips; see docs/tuning.md for the sweep).
    pub batch_size: usize,
    /// Batches in flight per worker (default 2: one sending while the next is claimed).
    pub max_in_flight: usize,
    /// Claim lease (default 60 s: twice the Kafka message timeout of 30 s, so a send is
    /// resolved or timed out well before another relay may take the item over). Renewed every
    /// lease/3 while a batch is in flight.
    pub claim_lease: Duration,
    /// Slot-ownership lease (default 15 s: three missed heartbeats).
    pub slot_ttl: Duration,
    /// Ownership heartbeat (default 5 s).
    pub heartbeat: Duration,
    /// Pause after a partial claim or read, and the first poll delay after an empty one; empty
    /// polls double it up to `poll_idle` (default 2 ms).
    pub poll_min: Duration,
    /// Longest poll delay when idle (default 500 ms; with PostgreSQL LISTEN/NOTIFY a commit
    /// wakes the workers earlier).
    pub poll_idle: Duration,
    /// Cursor dispatch: after a read of at least 16 events short of a full batch, a worker waits
    /// this long for each other reader of the database (the workers and relays that split the
    /// slots with it) before it reads again, at most `poll_idle` (default 25 ms; 0 turns it off).
    /// One reader never waits. docs/tuning.md has the measurements.
    pub read_linger: Duration,
    /// Cursor dispatch: after a read of at least 16 events short of a full batch, a worker's
    /// next read starts no sooner than this after that read started, however many readers
    /// there are (default 0; tools take the store's default from [`WorkerDefaults`]: 25 ms on
    /// SQLite, where every advance queues for the one writer with the producers' transactions,
    /// 0 on PostgreSQL and MariaDB). docs/tuning.md has the measurements.
    pub read_interval: Duration,
    /// Retry backoff (default 200 ms doubling to 60 s, with jitter).
    pub backoff: Backoff,
    /// Attempts before a retried event is quarantined (default 10).
    pub max_attempts: u32,
    /// How long shutdown waits for in-flight batches before releasing them (default 10 s).
    pub shutdown_timeout: Duration,
    /// How often the outbox gauges are refreshed (default 5 s).
    pub status_interval: Duration,
    /// Use slot ownership and fencing (default true). `false` claims every slot unfenced —
    /// for tests and single-process tools only; row dispatch only (cursor dispatch is fenced by
    /// slot ownership by construction and always uses it).
    pub ownership: bool,
    /// Dispatch mode (default `None`: the store's preferred one — cursor where the store
    /// supports it, row otherwise). Starting a relay in a mode the outbox is not in converts
    /// the outbox (refused while relays of the other mode are alive).
    pub dispatch: Option<DispatchMode>,
}

/// The worker settings a relay uses where none is configured, by dispatch mode
/// (docs/tuning.md has the measurements behind them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerDefaults {
    /// [`RelayConfig::workers`].
    pub workers: usize,
    /// [`RelayConfig::batch_size`].
    pub batch_size: usize,
    /// [`RelayConfig::max_in_flight`].
    pub max_in_flight: usize,
    /// [`RelayConfig::read_interval`].
    pub read_interval: Duration,
}

impl WorkerDefaults {
    /// Cursor dispatch: one worker, batches of up to 2,000, 4 in flight. Every cursor worker
    /// reads the whole window of new intents and keeps its own slots, so each extra worker
    /// repeats the read; one worker with more batches in flight sends as much with one read.
    /// Cursor reads at most every 25 ms under load on SQLite ([`RelayConfig::read_interval`]),
    /// as fast as they return on PostgreSQL and MariaDB.
    /// Row dispatch: 4 workers (1 on SQLite, whose single writer more workers only queue
    /// on), batches of up to 500, 2 in flight.
    pub fn for_mode(mode: DispatchMode, backend: Backend) -> Self {
        match mode {
            DispatchMode::Cursor => Self {
                workers: 1,
                batch_size: 2000,
                max_in_flight: 4,
                read_interval: match backend {
                    Backend::Sqlite => Duration::from_millis(25),
                    Backend::Postgres | Backend::Mysql => Duration::ZERO,
                },
            },
            DispatchMode::Row => Self {
                workers: if backend == Backend::Sqlite { 1 } else { 4 },
                batch_size: 500,
                max_in_flight: 2,
                read_interval: Duration::ZERO,
            },
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            owner: default_owner(),
            workers: 4,
            batch_size: 500,
            max_in_flight: 2,
            claim_lease: Duration::from_secs(60),
            slot_ttl: Duration::from_secs(15),
            heartbeat: Duration::from_secs(5),
            poll_min: Duration::from_millis(2),
            poll_idle: Duration::from_millis(500),
            read_linger: Duration::from_millis(25),
            read_interval: Duration::ZERO,
            backoff: Backoff::default(),
            max_attempts: 10,
            shutdown_timeout: Duration::from_secs(10),
            status_interval: Duration::from_secs(5),
            ownership: true,
            dispatch: None,
        }
    }
}

/// A unique owner id for this process.
pub fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The longest value of any duration in [`RelayConfig`]: 7 days.
const MAX_DURATION_SETTING: Duration = Duration::from_secs(7 * 86_400);

/// A configuration value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid relay setting {key}: {reason}")]
pub struct ConfigError {
    /// The setting.
    pub key: &'static str,
    /// What is accepted.
    pub reason: String,
}

impl RelayConfig {
    /// Checks every setting; the error names the key and what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_string(),
            })
        };
        if self.workers == 0 || self.workers > ferry_core::SLOT_COUNT as usize {
            return bad(
                "workers",
                "must be between 1 and 256 (one slot per worker at most)",
            );
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad("batch_size", "must be between 1 and 10000");
        }
        if self.max_in_flight == 0 || self.max_in_flight > 64 {
            return bad("max_in_flight", "must be between 1 and 64");
        }
        // Longer settings make no sense for a relay, and unbounded ones overflow deadline
        // arithmetic (`Instant + lease`, `2 × heartbeat`) and the stores' microsecond columns.
        for (key, d) in [
            ("claim_lease", self.claim_lease),
            ("slot_ttl", self.slot_ttl),
            ("heartbeat", self.heartbeat),
            ("poll_min", self.poll_min),
            ("poll_idle", self.poll_idle),
            ("read_linger", self.read_linger),
            ("read_interval", self.read_interval),
            ("backoff_base", self.backoff.base),
            ("backoff_max", self.backoff.max),
            ("shutdown_timeout", self.shutdown_timeout),
            ("status_interval", self.status_interval),
        ] {
            if d > MAX_DURATION_SETTING {
                return bad(key, "must be at most 7d");
            }
        }
        if self.claim_lease < Duration::from_millis(100) {
            return bad("claim_lease", "must be at least 100ms");
        }
        if self.slot_ttl < self.heartbeat * 2 {
            return bad("slot_ttl", "must be at least twice the heartbeat interval");
        }
        if self.heartbeat.is_zero() {
            return bad("heartbeat", "must be greater than zero");
        }
        if self.poll_min.is_zero() || self.poll_idle < self.poll_min {
            return bad(
                "poll_idle",
                "poll_min must be > 0 and poll_idle >= poll_min",
            );
        }
        if self.max_attempts == 0 {
            return bad("max_attempts", "must be at least 1");
        }
        if self.owner.trim().is_empty() || self.owner.len() > 255 {
            return bad("owner", "must be 1 to 255 characters");
        }
        if self.owner.contains('\0') {
            return bad("owner", "must not contain a NUL character");
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Every duration setting is refused above 7 days, by its own name, before a relation
    /// between settings (`slot_ttl ≥ 2 × heartbeat`) is computed with it; an owner id with a
    /// NUL (which PostgreSQL cannot store: every heartbeat would fail) is refused too.
    #[test]
    fn durations_are_bounded_and_the_owner_is_storable() {
        assert_eq!(RelayConfig::default().validate(), Ok(()));
        type Set = fn(&mut RelayConfig, Duration);
        let settings: [(&str, Set); 11] = [
            ("claim_lease", |c, d| c.claim_lease = d),
            ("slot_ttl", |c, d| c.slot_ttl = d),
            ("heartbeat", |c, d| c.heartbeat = d),
            ("poll_min", |c, d| c.poll_min = d),
            ("poll_idle", |c, d| c.poll_idle = d),
            ("read_linger", |c, d| c.read_linger = d),
            ("read_interval", |c, d| c.read_interval = d),
            ("backoff_base", |c, d| c.backoff.base = d),
            ("backoff_max", |c, d| c.backoff.max = d),
            ("shutdown_timeout", |c, d| c.shutdown_timeout = d),
            ("status_interval", |c, d| c.status_interval = d),
        ];
        for (key, set) in settings {
            let mut c = RelayConfig::default();
            set(&mut c, Duration::MAX);
            assert_eq!(c.validate().map_err(|e| e.key), Err(key), "{key}");
            let mut c = RelayConfig::default();
            set(&mut c, MAX_DURATION_SETTING + Duration::from_millis(1));
            assert_eq!(c.validate().map_err(|e| e.key), Err(key), "{key}");
        }
        let c = RelayConfig {
            claim_lease: MAX_DURATION_SETTING,
            ..RelayConfig::default()
        };
        assert_eq!(c.validate(), Ok(()));
        let c = RelayConfig {
            owner: "relay\0-1".into(),
            ..RelayConfig::default()
        };
        assert_eq!(c.validate().map_err(|e| e.key), Err("owner"));
    }
}
