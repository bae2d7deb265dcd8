//! Producer tasks: each simulates the application, committing orders and their outbox intents
//! in one transaction per [`Workload::orders_per_tx`] orders.
//!
//! Producers share the aggregates. A transaction's orders pick their aggregates among all of the
//! run's aggregates (or take the next block of a preloaded queue, which the producers share
//! too), and the transaction touches them in random order: it takes each order's version from
//! the aggregate's business row ([`tx::commit`]) and holds that row's lock until it
//! ends, so producers wait for each other's aggregates, and two transactions that lock two
//! aggregates in opposite orders deadlock (the database rolls one back). A rolled-back
//! transaction is retried with the same orders and event ids, which take new versions: the old
//! ones rolled back with it and never existed. A COMMIT whose outcome was lost is resolved by
//! looking the first order up, never by guessing; if it committed, its versions are the ones
//! that attempt took.
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{now_micros, Backoff, NewEvent};
use ferry_inbox::InboxPool as Pool;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shape::{Ids, KeyPicker, Order, Preload, Workload};
use super::tx::{self, Rollback, TxError};
use crate::verify::{new_histogram, COMMIT_TS_HEADER};

/// Consecutive failed attempts of one transaction, for reasons other than contention, before
/// the producer gives up.
const MAX_ATTEMPTS: u32 = 10;
/// Waits between attempts of a business transaction that failed for reasons other than
/// contention: 20 ms doubling to 1 s (with half jitter).
const RETRY: Backoff = Backoff {
    base: Duration::from_millis(20),
    max: Duration::from_secs(1),
};
/// Consecutive attempts of one transaction lost to contention (deadlock, lock wait,
/// serialization failure) before the producer gives up: about 45 s of backoff, far more than
/// any run's contention has cost (a stop ends the retries sooner).
const MAX_CONTENTION_ATTEMPTS: u32 = 200;
/// Waits after a deadlock or lock wait: 2 ms doubling to 250 ms (with half jitter), short
/// because the transaction that won usually commits within milliseconds.
const CONTENTION_RETRY: Backoff = Backoff {
    base: Duration::from_millis(2),
    max: Duration::from_millis(250),
};

/// A producer gave up: repeated failures, or a COMMIT whose outcome it could not determine.
#[derive(Debug, thiserror::Error)]
#[error("producer {producer}: {reason}")]
pub struct ProducerError {
    /// The producer.
    pub producer: usize,
    /// Why, with the last error.
    pub reason: String,
}

/// Told of every committed transaction's events, the instant its COMMIT returned (loadgen's
/// COMMIT → broker-ack clock).
pub trait CommitObserver: std::fmt::Debug + Send + Sync {
    /// The COMMIT of events `ids` returned at `at`.
    fn committed(&self, ids: &[String], at: std::time::Instant);
}

/// What every producer of a run shares.
#[derive(Debug)]
pub struct ProducerPlan {
    /// The run's identities.
    pub ids: Ids,
    /// Producers of the run.
    pub producers: usize,
    /// Destination topic of every intent.
    pub topic: String,
    /// Where the transactions' aggregates come from (one source for all producers).
    pub keys: KeySource,
    /// The workload.
    pub work: Workload,
    /// Told of every COMMIT that returned.
    pub observer: Option<Arc<dyn CommitObserver>>,
}

impl ProducerPlan {
    /// The plan of `producers` producers of run `ids` committing `work` to `topic`.
    pub fn new(ids: Ids, producers: usize, topic: &str, work: Workload) -> Self {
        Self {
            ids,
            producers,
            topic: topic.to_string(),
            keys: KeySource::new(&work, producers),
            work,
            observer: None,
        }
    }
}

/// Where the aggregates of the run's transactions come from; by default every producer draws
/// from the same source, so any two producers may pick the same aggregate.
#[derive(Debug)]
pub enum KeySource {
    /// Random picks among all of the run's aggregates ([`Workload::aggregates`],
    /// [`Workload::skew`]) until stopped.
    Random(KeyPicker),
    /// [`Workload::producers_own_aggregates`]: producer `p` picks among its own aggregates only (global
    /// index `i * producers + p`; picker `p` ranks them), so no two producers ever touch the
    /// same aggregate and their transactions never wait for each other.
    Owned(Vec<KeyPicker>),
    /// The orders of a preloaded queue ([`Preload`]), handed out in blocks from one counter;
    /// exhausted once every order was taken.
    Preload {
        /// The queue.
        shape: Preload,
        /// The next order to hand out.
        next: AtomicU64,
    },
}

impl KeySource {
    /// The source `work` describes for `producers` producers.
    pub fn new(work: &Workload, producers: usize) -> Self {
        match work.preload {
            None if work.producers_own_aggregates => KeySource::Owned(
                (0..producers)
                    .map(|p| {
                        let n = owned_aggregates(work.aggregates, producers, p);
                        KeyPicker::new(n as usize, work.skew, work.zipf_s)
                    })
                    .collect(),
            ),
            None => KeySource::Random(KeyPicker::new(
                work.aggregates as usize,
                work.skew,
                work.zipf_s,
            )),
            Some(shape) => KeySource::Preload {
                shape,
                next: AtomicU64::new(0),
            },
        }
    }

    /// The aggregates (indices) of producer `p`'s next transaction's at most `n` orders, in the
    /// order the transaction takes their versions and locks: random, so two transactions can
    /// lock the same aggregates in opposite orders. Empty once a preloaded queue is exhausted.
    pub fn next_tx(&self, p: usize, n: usize, rng: &mut impl Rng) -> Vec<u64> {
        match self {
            // independent picks are in random order already (and may repeat an aggregate: its
            // versions then follow each other within the transaction)
            KeySource::Random(picker) => (0..n).map(|_| picker.pick(rng) as u64).collect(),
            KeySource::Owned(pickers) => {
                let producers = pickers.len() as u64;
                (0..n)
                    .map(|_| pickers[p].pick(rng) as u64 * producers + p as u64)
                    .collect()
            }
            KeySource::Preload { shape, next } => {
                let mut aggs: Vec<u64> = take(next, n as u64, shape.total)
                    .map(|i| shape.aggregate_of(i))
                    .collect();
                aggs.shuffle(rng);
                aggs
            }
        }
    }
}

/// Number of aggregates producer `p` of `producers` owns out of `total` (those whose index is
/// `p` modulo `producers`).
fn owned_aggregates(total: u64, producers: usize, p: usize) -> u64 {
    let (producers, p) = (producers.max(1) as u64, p as u64);
    total.saturating_sub(p).div_ceil(producers)
}

/// The next block of at most `n` of the orders `0..total`, from the shared counter `next`.
fn take(next: &AtomicU64, n: u64, total: u64) -> Range<u64> {
    let start = next.fetch_add(n, Ordering::Relaxed).min(total);
    start..(start + n).min(total)
}

/// Live counters, read by the progress line.
#[derive(Debug, Default)]
pub struct Counters {
    /// Intents committed.
    pub enqueued: AtomicU64,
    /// Transactions committed.
    pub txs: AtomicU64,
    /// Failed attempts that were retried (or abandoned at the end of the load).
    pub retries: AtomicU64,
    /// Of which the database broke a deadlock.
    pub deadlocks: AtomicU64,
    /// Of which a lock wait timed out (or SQLite was busy).
    pub lock_waits: AtomicU64,
    /// Of which another conflict (serialization failure).
    pub conflicts: AtomicU64,
}

impl Counters {
    /// Counts one failed attempt that rolled back for `why`.
    fn rolled_back(&self, why: Rollback) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        let counter = match why {
            Rollback::Deadlock => &self.deadlocks,
            Rollback::LockWait => &self.lock_waits,
            Rollback::Conflict => &self.conflicts,
            Rollback::Other => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One producer's final account.
#[derive(Debug)]
pub struct ProducerResult {
    /// The producer.
    pub producer: usize,
    /// Intents committed: exactly event numbers `0..committed` of this producer (a transaction
    /// abandoned at the end of the load, after a rollback, committed nothing and used none).
    pub committed: u64,
    /// Latency of each business transaction (begin → commit returned), µs.
    pub tx_latency: Histogram<u64>,
}

/// Starts `plan.producers` producers ([`run`]) on `pool` until `stop`; [`join_all`] collects
/// them.
pub fn spawn_all(
    pool: &Pool,
    plan: Arc<ProducerPlan>,
    counters: &Arc<Counters>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<Result<ProducerResult, ProducerError>>> {
    (0..plan.producers)
        .map(|p| {
            let (pool, plan, counters) = (pool.clone(), plan.clone(), counters.clone());
            tokio::spawn(run(pool, plan, p, counters, stop.clone()))
        })
        .collect()
}

/// Joins the producers [`spawn_all`] started: their results, and the errors of those that
/// failed (a panic included).
pub async fn join_all(
    handles: Vec<JoinHandle<Result<ProducerResult, ProducerError>>>,
) -> (Vec<ProducerResult>, Vec<String>) {
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.await {
            Ok(Ok(r)) => ok.push(r),
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(e) => errors.push(format!("a producer task panicked: {e}")),
        }
    }
    (ok, errors)
}

/// What `results` committed together.
pub fn committed(results: &[ProducerResult]) -> u64 {
    results.iter().map(|r| r.committed).sum()
}

/// Runs producer `p` on `pool` (a migrated outbox with [`tx::create_tables`]'s tables) until
/// `stop`, or until a preloaded queue is exhausted; returns what it committed.
pub async fn run(
    pool: Pool,
    plan: Arc<ProducerPlan>,
    p: usize,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> Result<ProducerResult, ProducerError> {
    let mut rng = StdRng::seed_from_u64(plan.work.seed.wrapping_add(p as u64));
    let mut next: u64 = 0;
    let mut tx_latency = new_histogram();
    // Pacing: transaction t is due at start + t * interval; a producer that fell more than a
    // second behind forgets the debt instead of bursting to catch up. Producer p starts p/P of
    // an interval late, so the producers' transactions arrive evenly spaced, not all at once.
    let interval = (plan.work.rate > 0).then(|| {
        Duration::from_secs_f64(
            plan.work.orders_per_tx as f64 * plan.producers as f64 / plan.work.rate as f64,
        )
    });
    let mut due = Instant::now()
        + interval.map_or(Duration::ZERO, |i| {
            i.mul_f64(p as f64 / plan.producers.max(1) as f64)
        });

    while !stop.is_cancelled() {
        if let Some(interval) = interval {
            let now = Instant::now();
            if now > due + Duration::from_secs(1) {
                due = now;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            due += interval;
        }
        let aggs = plan.keys.next_tx(p, plan.work.orders_per_tx, &mut rng);
        if aggs.is_empty() {
            break;
        }
        let mut orders: Vec<Order> = aggs
            .iter()
            .enumerate()
            .map(|(i, a)| Order {
                order_id: Ids::order(p, next + i as u64),
                aggregate_id: plan.ids.aggregate(*a as usize),
                version: 0,
                amount_cents: rng.gen_range(100..100_000),
            })
            .collect();
        // The commit timestamp travels in the intent itself, so it is taken just before the
        // transaction's statements run: it slightly over-states commit→ack/consumed (by the
        // transaction's own time, lock waits and retries included), never under-states it.
        let ts = now_micros().to_string();
        let first = next;
        let intents = |orders: &[Order]| -> Vec<NewEvent> {
            orders
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let n = first + i as u64;
                    let mut e = super::shape::event(
                        &plan.ids,
                        p,
                        n,
                        o,
                        &plan.topic,
                        plan.work.payload_bytes,
                    );
                    e.headers.insert(COMMIT_TS_HEADER.to_string(), ts.clone());
                    e
                })
                .collect()
        };
        let t0 = Instant::now();
        if !commit_with_retries(&pool, p, &mut orders, &intents, &counters, &stop).await? {
            break;
        }
        let n = orders.len() as u64;
        if let Some(observer) = &plan.observer {
            let ids: Vec<String> = (next..next + n).map(|i| plan.ids.event(p, i)).collect();
            observer.committed(&ids, std::time::Instant::now());
        }
        let _ = tx_latency.record((t0.elapsed().as_micros() as u64).clamp(1, 3_600_000_000));
        next += n;
        counters.enqueued.fetch_add(n, Ordering::Relaxed);
        counters.txs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(ProducerResult {
        producer: p,
        committed: next,
        tx_latency,
    })
}

/// Commits one transaction, retrying its orders after a rollback (each attempt takes new
/// versions), and resolving an unknown COMMIT outcome by looking the first order up. Returns
/// `false` when `stop` came while the transaction was rolled back: it is abandoned, nothing of
/// it committed. A stop never interrupts an attempt half-way.
async fn commit_with_retries(
    pool: &Pool,
    p: usize,
    orders: &mut [Order],
    intents: &(dyn Fn(&[Order]) -> Vec<NewEvent> + Sync),
    counters: &Counters,
    stop: &CancellationToken,
) -> Result<bool, ProducerError> {
    let give_up = |reason: String| ProducerError {
        producer: p,
        reason,
    };
    // consecutive failures: lost to contention, and for any other reason
    let (mut contended, mut failed) = (0, 0);
    loop {
        let (why, err) = match tx::commit(pool, orders, intents).await {
            Ok(()) => return Ok(true),
            Err(TxError::RolledBack(why, e)) => (why, e),
            Err(TxError::Unknown(e)) => {
                let first = orders.first().map(|o| o.order_id).unwrap_or_default();
                match resolve(pool, first).await {
                    Some(true) => return Ok(true),
                    Some(false) => (Rollback::Other, e),
                    None => {
                        return Err(give_up(format!(
                            "COMMIT failed ({e}) and whether it committed cannot be determined; \
                             stopping rather than guessing"
                        )))
                    }
                }
            }
        };
        counters.rolled_back(why);
        let delay = if why.is_contention() {
            contended += 1;
            if contended >= MAX_CONTENTION_ATTEMPTS {
                return Err(give_up(format!(
                    "a business transaction lost {MAX_CONTENTION_ATTEMPTS} times in a row to \
                     contention; last error: {err}"
                )));
            }
            // expected with shared aggregates: counted and reported, not logged
            tracing::debug!(producer = p, attempt = contended, error = %err, "business transaction rolled back by contention; retrying");
            CONTENTION_RETRY.delay(contended)
        } else {
            failed += 1;
            if failed >= MAX_ATTEMPTS {
                return Err(give_up(format!(
                    "a business transaction failed {MAX_ATTEMPTS} times in a row; last error: {err}"
                )));
            }
            tracing::warn!(producer = p, attempt = failed, error = %err, "business transaction failed; retrying its orders");
            RETRY.delay(failed)
        };
        tokio::select! {
            _ = stop.cancelled() => return Ok(false),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Whether the transaction whose first order is `order_id` committed; `None` if the database
/// cannot tell us within a few tries.
async fn resolve(pool: &Pool, order_id: i64) -> Option<bool> {
    for _ in 0..5 {
        match tx::order_exists(pool, order_id).await {
            Ok(b) => return Some(b),
            Err(e) => {
                tracing::warn!(error = %e, "cannot resolve a COMMIT outcome yet");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::shape::Skew;
    use std::collections::{BTreeMap, BTreeSet};

    fn work(aggregates: u64, preload: Option<Preload>) -> Workload {
        Workload {
            aggregates,
            skew: Skew::Uniform,
            zipf_s: 1.0,
            orders_per_tx: 7,
            rate: 0,
            payload_bytes: 128,
            seed: 1,
            producers_own_aggregates: false,
            preload,
        }
    }

    /// Every transaction of `producers` producers taking turns on `keys`, until it is empty.
    fn drain(keys: &KeySource, producers: usize) -> Vec<Vec<u64>> {
        let mut rngs: Vec<StdRng> = (0..producers as u64).map(StdRng::seed_from_u64).collect();
        let mut txs = Vec::new();
        'outer: loop {
            for (p, rng) in rngs.iter_mut().enumerate() {
                let tx = keys.next_tx(p, 7, rng);
                if tx.is_empty() {
                    break 'outer;
                }
                txs.push(tx);
            }
        }
        txs
    }

    #[test]
    fn preload_shapes_are_exact() {
        for (total, k, producers) in [
            (20_000, 1, 2),
            (5000, 5000, 8),
            (10, 3, 2),
            (7, 7, 1),
            (9, 2, 8),
        ] {
            let shape = Preload {
                total,
                per_aggregate: k,
            };
            let keys = KeySource::new(&work(1, Some(shape)), producers);
            let mut orders: BTreeMap<u64, u64> = BTreeMap::new();
            for a in drain(&keys, producers).into_iter().flatten() {
                *orders.entry(a).or_default() += 1;
            }
            // every aggregate gets exactly its versions' worth of orders, nothing more
            assert_eq!(orders.len() as u64, shape.aggregates(), "{total} {k}");
            for (a, n) in &orders {
                assert_eq!(*n, shape.versions_of(*a), "{total} {k} a{a}");
            }
            assert_eq!(orders.values().sum::<u64>(), total);
        }
        let hot = Preload {
            total: 5000,
            per_aggregate: 5000,
        };
        assert_eq!(hot.aggregates(), 1);
    }

    #[test]
    fn every_producer_picks_among_all_aggregates() {
        // one aggregate, more producers than aggregates: no producer is left without one
        for aggregates in [1u64, 3] {
            let keys = KeySource::new(&work(aggregates, None), 8);
            for p in 0..8 {
                let mut rng = StdRng::seed_from_u64(p as u64);
                let picked: BTreeSet<u64> =
                    (0..20).flat_map(|_| keys.next_tx(p, 7, &mut rng)).collect();
                assert_eq!(
                    picked,
                    (0..aggregates).collect(),
                    "p{p} of 8, {aggregates} aggregates"
                );
            }
        }
    }

    #[test]
    fn transactions_lock_aggregates_in_random_order() {
        // among many transactions touching aggregates 0 and 1, both lock orders occur: two of
        // them can each hold one row and wait for the other's
        let first_of_two = |keys: &KeySource, rng: &mut StdRng| {
            let tx = keys.next_tx(0, 7, rng);
            let i0 = tx.iter().position(|a| *a == 0)?;
            let i1 = tx.iter().position(|a| *a == 1)?;
            Some(i0 < i1)
        };
        let random = KeySource::new(&work(2, None), 8);
        let preload = || {
            let shape = Preload {
                total: 2,
                per_aggregate: 1,
            };
            KeySource::new(&work(1, Some(shape)), 8)
        };
        let mut rng = StdRng::seed_from_u64(7);
        let orders: BTreeSet<bool> = (0..50)
            .filter_map(|_| first_of_two(&random, &mut rng))
            .collect();
        assert_eq!(orders, BTreeSet::from([false, true]));
        // a preloaded queue's block is shuffled too
        let orders: BTreeSet<bool> = (0..50)
            .filter_map(|_| first_of_two(&preload(), &mut rng))
            .collect();
        assert_eq!(orders, BTreeSet::from([false, true]));
    }

    #[test]
    fn owned_aggregates_are_partitioned_exactly() {
        for (total, producers) in [(10, 3), (3, 3), (100_000, 7), (5, 5)] {
            let owned: u64 = (0..producers)
                .map(|p| owned_aggregates(total, producers, p))
                .sum();
            assert_eq!(owned, total);
            let mut w = work(total, None);
            w.producers_own_aggregates = true;
            let keys = KeySource::new(&w, producers);
            let mut seen = BTreeMap::new();
            for p in 0..producers {
                let mut rng = StdRng::seed_from_u64(p as u64);
                for a in (0..50).flat_map(|_| keys.next_tx(p, 7, &mut rng)) {
                    assert!(a < total, "{a} of {total}");
                    // no aggregate is picked by two producers
                    assert_eq!(*seen.entry(a).or_insert(p), p, "aggregate {a}");
                }
            }
        }
    }

    #[test]
    fn blocks_never_overlap_and_end_at_the_total() {
        let next = AtomicU64::new(0);
        assert_eq!(take(&next, 4, 10), 0..4);
        assert_eq!(take(&next, 4, 10), 4..8);
        assert_eq!(take(&next, 4, 10), 8..10);
        assert!(take(&next, 4, 10).is_empty());
        assert!(take(&next, 4, 10).is_empty());
    }
}
