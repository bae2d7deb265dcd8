//! Retention run by the relay itself ([`RetentionConfig`]): the SENT rows older than the window
//! are deleted beside the dispatch, by the same store call as `ferry purge`
//! ([`OutboxStore::purge_sent`]), so an outbox stays flat under steady load without a
//! scheduler outside the relay.
//!
//! One relay of a database purges at a time: the one that owns slot 0 (slot ownership elects
//! it, and moves it when that relay stops or dies). A relay without slot ownership (row
//! dispatch with ownership off, a single-process tool) purges on its own. Two purges meeting
//! while slot 0 changes hands is harmless: each deletes only SENT rows, in short transactions,
//! and a row the other already deleted is simply not counted.
//!
//! What a run may delete, and why it cannot lose an event that is still owed, is `purge_sent`'s
//! contract (docs/operations.md, "Retention"): never a PENDING, CLAIMED, QUARANTINED or SKIPPED
//! row, in cursor dispatch only a row behind its slot's cursor.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{OutboxStore, PurgeRequest, SlotId};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ConfigError;
use crate::metrics::Metrics;

/// Retention a relay runs beside its dispatch ([`crate::Relay::with_retention`]): every
/// [`RetentionConfig::every`], the relay that owns slot 0 (every relay without slot
/// ownership) runs [`RetentionConfig::purge`] through [`OutboxStore::purge_sent`], exactly
/// what `ferry purge` runs.
#[derive(Debug, Clone, Copy)]
pub struct RetentionConfig {
    /// Time between the starts of two runs (default: a quarter of the window, between 1 s and
    /// 1 min).
    pub every: Duration,
    /// What each run deletes: the SENT rows older than `older_than` (row dispatch: by
    /// `sent_at`; cursor dispatch: by `created_at`), `batch` rows per statement (default
    /// 1,000, `ferry purge`'s), optionally only those a consumer has consumed, and on
    /// PostgreSQL a `VACUUM` after the run with `vacuum`. `dry_run` is refused.
    pub purge: PurgeRequest<'static>,
}

impl RetentionConfig {
    /// The longest retention window: 10 years.
    pub const MAX_AGE: Duration = Duration::from_secs(3650 * 86_400);

    /// Retention of SENT rows older than `older_than`, with the default batch and period.
    pub fn new(older_than: Duration) -> Self {
        Self {
            every: Self::default_every(older_than),
            purge: PurgeRequest {
                older_than,
                batch: PurgeRequest::DEFAULT_BATCH,
                consumer: None,
                dry_run: false,
                vacuum: false,
            },
        }
    }

    /// A quarter of the window, between 1 s and 1 min: a row is deleted at most that long
    /// after it became old enough, and a run between two finds about a quarter-window's worth
    /// of rows to delete (or, for long windows, a minute's worth).
    pub fn default_every(older_than: Duration) -> Duration {
        (older_than / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// When the run due at `due` that ended at `now` is followed: one period (`every`) after
    /// `due`, or at once when the run overran the period (no catching up with the runs it
    /// overran).
    pub fn next_run(due: Instant, every: Duration, now: Instant) -> Instant {
        (due + every).max(now)
    }

    /// Checks every setting; the error names the key and what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_string(),
            })
        };
        let p = &self.purge;
        if p.older_than.is_zero() || p.older_than > Self::MAX_AGE {
            return bad(
                "retention",
                "must be longer than 0 and at most 3650d (SENT rows older than this are deleted)",
            );
        }
        if p.batch == 0 || p.batch > 100_000 {
            return bad("retention_batch", "must be between 1 and 100000");
        }
        if self.every.is_zero() || self.every > Duration::from_secs(7 * 86_400) {
            return bad("retention_every", "must be longer than 0 and at most 7d");
        }
        if p.dry_run {
            return bad(
                "retention",
                "a dry run deletes nothing: use ferry purge --dry-run",
            );
        }
        Ok(())
    }
}

/// The slot whose owner runs retention.
const LEADER_SLOT: SlotId = 0;

/// Runs `config`'s purge every period until `cancel`, while this relay owns slot 0 (always
/// when `owned` is `None`: no slot ownership). A run in progress when `cancel` fires gets
/// `grace` to finish (the relay's shutdown timeout, which its sends get too); a longer one (the
/// first run over a large backlog of old rows) is dropped then. Each of its statements is a
/// transaction of its own, so what it deleted stays deleted and the rest waits for the next
/// relay's run; it counts as a failed run, since the rows it deleted are not counted.
pub(crate) async fn run(
    store: Arc<dyn OutboxStore>,
    config: RetentionConfig,
    metrics: Arc<Metrics>,
    owned: Option<watch::Receiver<Vec<SlotId>>>,
    cancel: CancellationToken,
    grace: Duration,
) {
    let mut due = Instant::now() + config.every;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(due) => {}
        }
        let this = due;
        due = RetentionConfig::next_run(this, config.every, Instant::now());
        if let Some(owned) = &owned {
            if !owned.borrow().contains(&LEADER_SLOT) {
                continue;
            }
        }
        let started = Instant::now();
        let purge = store.purge_sent(&config.purge);
        tokio::pin!(purge);
        let result = tokio::select! {
            r = &mut purge => r,
            _ = async {
                cancel.cancelled().await;
                tokio::time::sleep(grace).await;
            } => {
                metrics.retention_runs.fetch_add(1, Ordering::Relaxed);
                metrics.retention_failed_runs.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    grace_secs = grace.as_secs_f64(),
                    "retention run stopped by the shutdown; the rows it deleted stay deleted (not counted), the next owner of slot 0 deletes the rest"
                );
                return;
            }
        };
        let took = started.elapsed().as_micros() as u64;
        // timed before it is counted: a scrape never sees a finished run missing from the histogram
        metrics.retention_run.record_us(took);
        metrics.retention_runs.fetch_add(1, Ordering::Relaxed);
        let took_ms = took / 1000;
        match result {
            Ok(n) => {
                metrics.retention_purged.fetch_add(n, Ordering::Relaxed);
                if n > 0 {
                    tracing::info!(
                        deleted = n,
                        took_ms,
                        older_than_secs = config.purge.older_than.as_secs_f64(),
                        "retention: deleted SENT rows older than the window"
                    );
                }
            }
            Err(e) => {
                metrics
                    .retention_failed_runs
                    .fetch_add(1, Ordering::Relaxed);
                metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, took_ms, "retention run failed; the next period tries again");
            }
        }
        // a run longer than the period starts the next one at once, without catching up
        due = RetentionConfig::next_run(this, config.every, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_longer_than_the_period_is_followed_at_once_without_catching_up() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(RetentionConfig::next_run(t, s, t + s / 2), t + s);
        assert_eq!(RetentionConfig::next_run(t, s, t + s * 3), t + s * 3);
    }

    #[test]
    fn the_default_period_is_a_quarter_of_the_window_within_bounds() {
        let every = RetentionConfig::default_every;
        assert_eq!(every(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(every(Duration::from_secs(20)), Duration::from_secs(5));
        assert_eq!(
            every(Duration::from_secs(7 * 86_400)),
            Duration::from_secs(60)
        );
    }
}
