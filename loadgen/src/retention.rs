//! `--retention <age>`: while the run goes on, delete delivered intents older than `age` the
//! way production does, through ferry's own purge ([`OutboxStore::purge_sent`], what `ferry
//! purge --older-than <age> --batch <n>` calls), on a connection pool of its own, every
//! `age / 4` (at least 1 s, at most 1 min), concurrently with the producers and the relays.
//!
//! The verification stays exact with rows deleted under it: purge deletes only SENT rows, and
//! the purger counts every row each call reports deleted, so the store's checks compare
//! `rows + purged` and `SENT rows + purged` with what the producers committed. The order of
//! SENT marks (row dispatch without a consumer) is checked before every purge run as well,
//! over the rows about to be deleted: see [`PurgeTally::order_pairs`].
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{BoxFuture, OutboxStore, PurgeRequest};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::db::Database;
use crate::spec::Retention;

/// Failed purge runs whose errors the report keeps.
const ERROR_EXAMPLES: usize = 5;
/// Order-violating pairs the pre-purge check keeps (any one fails the run).
const MAX_ORDER_PAIRS: usize = 1000;

/// DELETE statements of outbox rows one `purge_sent` call ran to delete `n` rows, as row
/// dispatch runs them: `batch` rows at a time until a statement deletes fewer, so every full
/// batch and one short one. In cursor dispatch a run deletes by ranges of `batch` seq values
/// (`ops::purge_cursor`), about as many when the rows are dense in `seq`; an estimate there.
pub fn delete_statements(n: u64, batch: usize) -> u64 {
    n / batch.max(1) as u64 + 1
}

/// Whether purge runs end with a `VACUUM`: what an operator of this server has to do, for with
/// autovacuum off nothing reclaims the purged rows, and every later purge and read walks them
/// (`ferry purge --vacuum`).
pub async fn needs_vacuum(store: &dyn OutboxStore) -> bool {
    store
        .server_warnings()
        .await
        .map(|w| {
            w.iter().any(|w| {
                matches!(
                    w.setting.as_str(),
                    "autovacuum" | "track_counts" | "ferry_outbox.autovacuum_enabled"
                )
            })
        })
        .unwrap_or(false)
}

/// The tally of `--retention-in-relays`: what the relays' retention counted (`relays`, their
/// registries once they stopped).
pub fn relays_tally(
    relays: &[Arc<ferry_relay::Metrics>],
    vacuum: bool,
    batch: usize,
) -> PurgeTally {
    let sum = |f: fn(&ferry_relay::Metrics) -> &AtomicU64| {
        relays
            .iter()
            .map(|m| f(m).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let purged = sum(|m| &m.retention_purged);
    let runs: Vec<_> = relays.iter().map(|m| m.retention_run.snapshot()).collect();
    // hdrhistogram keeps 3 significant digits: the time and the longest run within 0.1 %
    let busy_us: f64 = runs.iter().map(|h| h.mean() * h.len() as f64).sum();
    let longest = runs.iter().map(|h| h.max()).max().unwrap_or(0);
    PurgeTally {
        runs: sum(|m| &m.retention_runs),
        failed_runs: sum(|m| &m.retention_failed_runs),
        purged,
        // an estimate: every run's full batches and one short one
        statements: purged / batch.max(1) as u64 + sum(|m| &m.retention_runs),
        busy: Duration::from_micros(busy_us as u64),
        longest: Duration::from_micros(longest),
        deleted_any: purged > 0,
        vacuum,
        ..PurgeTally::default()
    }
}

/// What the purger did.
#[derive(Debug, Clone, Default)]
pub struct PurgeTally {
    /// `purge_sent` calls.
    pub runs: u64,
    /// Of which failed: a failed call reports no count, and the batches it committed before
    /// its error are not counted (see [`crate::run`]'s store check).
    pub failed_runs: u64,
    /// Rows the calls reported deleted.
    pub purged: u64,
    /// DELETE statements of outbox rows ([`delete_statements`]).
    pub statements: u64,
    /// Wall time inside `purge_sent`.
    pub busy: Duration,
    /// The longest call.
    pub longest: Duration,
    /// Up to five errors.
    pub errors: Vec<String>,
    /// Outbox rows and bytes read before the last run that found nothing to delete yet (the
    /// outbox as it grows without retention).
    pub before_first_delete: Option<(i64, i64)>,
    /// Whether a run has deleted rows.
    pub deleted_any: bool,
    /// Row dispatch without a consumer: pairs `(aggregate, later version)` of successive
    /// versions found out of order by the checks before the runs, which see every pair the
    /// run may delete; the end-of-run check adds those it no longer sees.
    pub order_pairs: BTreeSet<(String, i64)>,
    /// Each run ended with `VACUUM ferry_outbox` (PostgreSQL whose autovacuum is off).
    pub vacuum: bool,
    /// Pre-purge order checks run, those that failed, and their time.
    pub order_checks: u64,
    pub order_check_failures: u64,
    pub order_check_busy: Duration,
    /// `--fold-orders`: business orders folded, and the time spent folding (and vacuuming
    /// `loadgen_orders`) after the purge runs.
    pub orders_folded: u64,
    pub fold_busy: Duration,
}

impl PurgeTally {
    /// Counts one call that took `took`.
    pub fn count(&mut self, result: Result<u64, String>, took: Duration, batch: usize) {
        self.runs += 1;
        self.busy += took;
        self.longest = self.longest.max(took);
        match result {
            Ok(n) => {
                self.purged += n;
                self.statements += delete_statements(n, batch);
                self.deleted_any |= n > 0;
            }
            Err(e) => {
                self.failed_runs += 1;
                if self.errors.len() < ERROR_EXAMPLES {
                    self.errors.push(e);
                }
            }
        }
    }
}

/// What the purger acts on: the store, and the checks before each run.
pub trait PurgeTarget: Send + Sync + 'static {
    /// Before a run: order check, size sample (errors are noted in the tally, not fatal).
    fn before_run<'a>(&'a self, tally: &'a mut PurgeTally) -> BoxFuture<'a, ()>;
    /// One purge: the rows deleted.
    fn purge(&self) -> BoxFuture<'_, Result<u64, String>>;
    /// Rows per statement.
    fn batch(&self) -> usize;
    /// After a run: work of the load generator's own (`--fold-orders`), counted apart.
    fn after_run<'a>(&'a self, _tally: &'a mut PurgeTally) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The running purger.
pub struct Purger {
    stop: CancellationToken,
    handle: JoinHandle<PurgeTally>,
}

impl Purger {
    /// Starts purging `target` every `every`, the first run one period from now; `purged`
    /// follows the rows purged so far (the progress line).
    pub fn start(target: impl PurgeTarget, every: Duration, purged: Arc<AtomicU64>) -> Self {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(purge_loop(target, every, stop.clone(), purged));
        Self { stop, handle }
    }

    /// Stops after the run in progress, if any, and returns the tally.
    pub async fn stop(self) -> PurgeTally {
        self.stop.cancel();
        self.handle.await.unwrap_or_else(|e| PurgeTally {
            failed_runs: 1,
            errors: vec![format!("the purge task failed: {e}")],
            ..PurgeTally::default()
        })
    }
}

/// Runs `target`'s purge every `every` until `stop` (a run in progress is finished first).
async fn purge_loop(
    target: impl PurgeTarget,
    every: Duration,
    stop: CancellationToken,
    purged: Arc<AtomicU64>,
) -> PurgeTally {
    let mut tally = PurgeTally::default();
    let mut due = Instant::now() + every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return tally,
            _ = tokio::time::sleep_until(due) => {}
        }
        target.before_run(&mut tally).await;
        let t = Instant::now();
        let result = target.purge().await;
        let took = t.elapsed();
        tally.count(result, took, target.batch());
        purged.store(tally.purged, Ordering::Relaxed);
        target.after_run(&mut tally).await;
        due = ferry_relay::RetentionConfig::next_run(due, every, Instant::now());
    }
}

/// The run's outbox, purged through a store of the purger's own.
pub struct StorePurge {
    pub store: Arc<dyn OutboxStore>,
    pub db: Arc<Database>,
    pub retention: Retention,
    /// Check the order of SENT marks before each run (row dispatch without a consumer).
    pub check_order: bool,
    /// Vacuum the outbox after each run that deleted rows (`ferry purge --vacuum`): the
    /// server's or the outbox's autovacuum is off, as `ferry status` reports.
    pub vacuum: bool,
}

impl PurgeTarget for StorePurge {
    fn before_run<'a>(&'a self, tally: &'a mut PurgeTally) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tally.vacuum = self.vacuum;
            if self.check_order && tally.order_pairs.len() < MAX_ORDER_PAIRS {
                let t = Instant::now();
                match self.db.sent_order_violation_pairs(MAX_ORDER_PAIRS).await {
                    Ok(pairs) => tally.order_pairs.extend(pairs),
                    Err(e) => {
                        // without it, a pair this run deletes goes unchecked: the run fails
                        tally.order_check_failures += 1;
                        if tally.errors.len() < ERROR_EXAMPLES {
                            tally
                                .errors
                                .push(format!("order check before a purge: {e}"));
                        }
                    }
                }
                tally.order_checks += 1;
                tally.order_check_busy += t.elapsed();
            }
            if !tally.deleted_any {
                if let (Ok(rows), Ok(Some(bytes))) =
                    (self.db.count_rows().await, self.db.outbox_bytes().await)
                {
                    tally.before_first_delete = Some((rows, bytes));
                }
            }
        })
    }

    fn purge(&self) -> BoxFuture<'_, Result<u64, String>> {
        Box::pin(async move {
            self.store
                .purge_sent(&PurgeRequest {
                    older_than: self.retention.age,
                    batch: self.retention.batch,
                    consumer: None,
                    dry_run: false,
                    vacuum: self.vacuum,
                })
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn batch(&self) -> usize {
        self.retention.batch
    }

    fn after_run<'a>(&'a self, tally: &'a mut PurgeTally) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if !self.retention.fold_orders {
                return;
            }
            let t = Instant::now();
            match self.db.fold_orders(self.retention.age, self.vacuum).await {
                Ok(n) => tally.orders_folded += n,
                Err(e) => {
                    // the version check reads whatever was folded: a failed fold loses nothing
                    if tally.errors.len() < ERROR_EXAMPLES {
                        tally.errors.push(format!("fold business orders: {e}"));
                    }
                }
            }
            tally.fold_busy += t.elapsed();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::purge_every;
    use std::sync::Mutex;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_run_every_quarter_of_the_age_within_bounds() {
        assert_eq!(purge_every(2 * S), S);
        assert_eq!(purge_every(S / 10), S);
        assert_eq!(purge_every(30 * S), S * 15 / 2);
        assert_eq!(purge_every(7 * 86_400 * S), 60 * S);
        assert_eq!(Retention::new(30 * S, 500).every, S * 15 / 2);
    }

    #[test]
    fn statements_are_the_full_batches_and_one_short() {
        assert_eq!(delete_statements(0, 1000), 1);
        assert_eq!(delete_statements(999, 1000), 1);
        // 1000 deleted: a full batch, then one that found nothing
        assert_eq!(delete_statements(1000, 1000), 2);
        assert_eq!(delete_statements(2500, 1000), 3);
    }

    #[test]
    fn the_tally_counts_rows_statements_and_failures() {
        let mut t = PurgeTally::default();
        t.count(Ok(0), S / 100, 1000);
        assert!(!t.deleted_any);
        t.count(Ok(2500), S / 10, 1000);
        t.count(Err("deadlock".into()), S / 20, 1000);
        assert_eq!(
            (t.runs, t.failed_runs, t.purged, t.statements),
            (3, 1, 2500, 4)
        );
        assert!(t.deleted_any);
        assert_eq!(t.busy, S * 16 / 100);
        assert_eq!(t.longest, S / 10);
        assert_eq!(t.errors, ["deadlock"]);
    }

    /// A target that returns canned results and logs what was called when.
    struct Fake {
        results: Mutex<Vec<Result<u64, String>>>,
        log: Arc<Mutex<Vec<(&'static str, Instant)>>>,
        slow: Duration,
    }

    impl PurgeTarget for Fake {
        fn before_run<'a>(&'a self, _: &'a mut PurgeTally) -> BoxFuture<'a, ()> {
            self.log.lock().unwrap().push(("check", Instant::now()));
            Box::pin(async {})
        }
        fn purge(&self) -> BoxFuture<'_, Result<u64, String>> {
            Box::pin(async move {
                self.log.lock().unwrap().push(("purge", Instant::now()));
                tokio::time::sleep(self.slow).await;
                let mut r = self.results.lock().unwrap();
                if r.is_empty() {
                    Ok(0)
                } else {
                    r.remove(0)
                }
            })
        }
        fn batch(&self) -> usize {
            10
        }
    }

    #[tokio::test]
    async fn the_purger_runs_on_its_cadence_and_finishes_a_run_before_stopping() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            results: Mutex::new(vec![Ok(25), Err("busy".into()), Ok(3)]),
            log: log.clone(),
            slow: Duration::from_millis(60),
        };
        let every = Duration::from_millis(100);
        let t0 = Instant::now();
        let purged = Arc::new(AtomicU64::new(0));
        let p = Purger::start(fake, every, purged.clone());
        // runs start at 100, 200, 300 ms (each takes 60 ms); stop during the third
        tokio::time::sleep(Duration::from_millis(330)).await;
        assert_eq!(purged.load(Ordering::Relaxed), 25);
        let tally = p.stop().await;
        let stopped = t0.elapsed();
        assert_eq!((tally.runs, tally.failed_runs, tally.purged), (3, 1, 28));
        // 25 rows: two full batches of 10 and one short; the failed run counts no statement
        assert_eq!(tally.statements, 3 + 1);
        assert!(stopped >= Duration::from_millis(360), "{stopped:?}");
        let log = log.lock().unwrap();
        let kinds: Vec<&str> = log.iter().map(|(k, _)| *k).collect();
        // the check comes before each purge
        assert_eq!(
            kinds,
            ["check", "purge", "check", "purge", "check", "purge"]
        );
        for (k, (_, at)) in log.iter().filter(|(k, _)| *k == "purge").enumerate() {
            let since = at.duration_since(t0);
            let want = every * (k as u32 + 1);
            assert!(
                since >= want && since < want + Duration::from_millis(60),
                "run {k} at {since:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_run_slower_than_the_period_is_followed_at_once() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            results: Mutex::new(Vec::new()),
            log: log.clone(),
            slow: Duration::from_millis(150),
        };
        let p = Purger::start(fake, Duration::from_millis(50), Arc::default());
        tokio::time::sleep(Duration::from_millis(420)).await;
        let tally = p.stop().await;
        let starts: Vec<Instant> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == "purge")
            .map(|(_, t)| *t)
            .collect();
        // 50 ms, then back to back every 150 ms: 50, 200, 350 (not a burst of missed runs)
        assert_eq!(tally.runs, 3, "{starts:?}");
        for w in starts.windows(2) {
            let gap = w[1].duration_since(w[0]);
            assert!(
                gap >= Duration::from_millis(150) && gap < Duration::from_millis(210),
                "{gap:?}"
            );
        }
    }
}
