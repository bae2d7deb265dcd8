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

use ferry_core::{OutboxStore, PurgeRequest, SlotId};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Metrics, RetentionConfig};

/// The slot whose owner runs retention.
const LEADER_SLOT: SlotId = 0;

/// Runs `config`'s purge every period until `cancel`, while this relay owns slot 0 (always
/// when `owned` is `None`: no slot ownership). A run in progress is finished first.
pub(crate) async fn run(
    store: Arc<dyn OutboxStore>,
    config: RetentionConfig,
    metrics: Arc<Metrics>,
    owned: Option<watch::Receiver<Vec<SlotId>>>,
    cancel: CancellationToken,
) {
    let mut due = Instant::now() + config.every;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(due) => {}
        }
        let this = due;
        due = next_run(this, config.every, Instant::now());
        if let Some(owned) = &owned {
            if !owned.borrow().contains(&LEADER_SLOT) {
                continue;
            }
        }
        let started = Instant::now();
        let result = store
            .purge_sent(&PurgeRequest {
                older_than: config.older_than,
                batch: config.batch,
                consumer: None,
                dry_run: false,
                vacuum: config.vacuum,
            })
            .await;
        metrics.retention_runs.fetch_add(1, Ordering::Relaxed);
        let took_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(n) => {
                metrics.retention_purged.fetch_add(n, Ordering::Relaxed);
                if n > 0 {
                    tracing::info!(
                        deleted = n,
                        took_ms,
                        older_than_secs = config.older_than.as_secs_f64(),
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
        due = next_run(this, config.every, Instant::now());
    }
}

/// When the run due at `due` that ended at `now` is followed: one period after `due`, or at
/// once when the run overran the period (no catching up with the runs it overran).
fn next_run(due: Instant, every: std::time::Duration, now: Instant) -> Instant {
    (due + every).max(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_run_longer_than_the_period_is_followed_at_once_without_catching_up() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(next_run(t, s, t + s / 2), t + s);
        assert_eq!(next_run(t, s, t + s * 3), t + s * 3);
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
