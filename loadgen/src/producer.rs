//! Producer tasks: each simulates the application, committing orders and their outbox intents
//! in one transaction per `--orders-per-tx` orders.
//!
//! A producer owns its aggregates' version counters outright, so an aggregate's versions are
//! committed in order without any locking. A failed transaction is retried with the *same*
//! intents (same event ids, versions and payloads); a COMMIT whose outcome was lost is resolved
//! by looking the first order up, never by guessing.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{now_micros, Backoff, NewEvent};
use ferry_testkit::verify::COMMIT_TS_HEADER;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::CommitClock;
use crate::db::{new_histogram, Database, TxError};
use crate::error::{Error, Result};
use crate::spec::{Preload, Workload};
use crate::workload::{self, Ids, KeyPicker, Order};

/// Consecutive failed attempts of one transaction before the producer gives up.
const MAX_ATTEMPTS: u32 = 10;
/// Waits between attempts of a business transaction: 20 ms doubling to 1 s (with half jitter).
const RETRY: Backoff = Backoff {
    base: Duration::from_millis(20),
    max: Duration::from_secs(1),
};

/// What every producer of a run shares.
#[derive(Debug, Clone)]
pub struct ProducerPlan {
    pub ids: Ids,
    pub producers: usize,
    /// Destination topic of every intent.
    pub topic: String,
    pub work: Workload,
}

/// Where the next order's aggregate and version come from.
enum Keys {
    /// Random picks among the producer's aggregates until stopped.
    Random {
        picker: KeyPicker,
        /// versions[i] = last version handed out for local aggregate i (global index i*P + p)
        versions: Vec<i64>,
        agg_ids: Vec<Option<String>>,
    },
    /// The producer's share of a preloaded queue, in order.
    Fixed {
        shape: Preload,
        /// Current aggregate (global index) and the last version handed out for it.
        agg: u64,
        version: u64,
        agg_id: String,
    },
}

impl Keys {
    /// The next (aggregate id, version); `None` when a preload share is exhausted.
    fn next(&mut self, plan: &ProducerPlan, p: usize, rng: &mut StdRng) -> Option<(String, i64)> {
        match self {
            Keys::Random {
                picker,
                versions,
                agg_ids,
            } => {
                let local_idx = picker.pick(rng);
                versions[local_idx] += 1;
                let id = agg_ids[local_idx]
                    .get_or_insert_with(|| plan.ids.aggregate(local_idx * plan.producers + p))
                    .clone();
                Some((id, versions[local_idx]))
            }
            Keys::Fixed {
                shape,
                agg,
                version,
                agg_id,
            } => {
                if *agg >= shape.aggregates() {
                    return None;
                }
                if *version >= shape.versions_of(*agg) {
                    *agg += plan.producers as u64;
                    *version = 0;
                    if *agg >= shape.aggregates() {
                        return None;
                    }
                    *agg_id = plan.ids.aggregate(*agg as usize);
                }
                *version += 1;
                Some((agg_id.clone(), *version as i64))
            }
        }
    }
}

/// Live counters, read by the progress line.
#[derive(Debug, Default)]
pub struct Counters {
    pub enqueued: AtomicU64,
    pub txs: AtomicU64,
    /// Failed attempts that were retried.
    pub retries: AtomicU64,
    /// When each event's COMMIT returned, for the COMMIT → broker-ack latency.
    pub clock: Arc<CommitClock>,
}

/// One producer's final account.
#[derive(Debug)]
pub struct ProducerResult {
    pub producer: usize,
    /// Intents committed: exactly event numbers `0..committed` of this producer.
    pub committed: u64,
    /// Latency of each business transaction (begin → commit returned), µs.
    pub tx_latency: Histogram<u64>,
}

/// Runs producer `p` until `stop`; returns what it committed.
pub async fn run(
    db: Arc<Database>,
    plan: Arc<ProducerPlan>,
    p: usize,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> Result<ProducerResult> {
    let mut keys = match plan.work.preload {
        None => {
            let local = workload::local_aggregates(plan.work.aggregates, plan.producers, p);
            Keys::Random {
                picker: KeyPicker::new(local, plan.work.skew, plan.work.zipf_s),
                versions: vec![0i64; local],
                agg_ids: vec![None; local],
            }
        }
        Some(shape) => Keys::Fixed {
            shape,
            agg: p as u64,
            version: 0,
            agg_id: plan.ids.aggregate(p),
        },
    };
    let mut rng = StdRng::seed_from_u64(plan.work.seed.wrapping_add(p as u64));
    let mut next: u64 = 0;
    let mut exhausted = false;
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

    while !stop.is_cancelled() && !exhausted {
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
        let mut orders = Vec::with_capacity(plan.work.orders_per_tx);
        let mut events: Vec<NewEvent> = Vec::with_capacity(plan.work.orders_per_tx);
        for i in 0..plan.work.orders_per_tx {
            let Some((aggregate_id, version)) = keys.next(&plan, p, &mut rng) else {
                exhausted = true;
                break;
            };
            let n = next + i as u64;
            let order = Order {
                order_id: Ids::order(p, n),
                aggregate_id,
                version,
                amount_cents: rng.gen_range(100..100_000),
            };
            events.push(workload::event(
                &plan.ids,
                p,
                n,
                &order,
                &plan.topic,
                plan.work.payload_bytes,
            ));
            orders.push(order);
        }
        if orders.is_empty() {
            break;
        }
        // The commit timestamp travels in the intent itself, so it is taken just before the
        // transaction's statements run: it slightly over-states commit→ack/consumed (by the
        // insert and COMMIT time), never under-states it.
        let ts = now_micros().to_string();
        for e in &mut events {
            e.headers.insert(COMMIT_TS_HEADER.to_string(), ts.clone());
        }
        let t0 = Instant::now();
        commit_with_retries(&db, p, &orders, &events, &counters).await?;
        counters.clock.committed(
            events.iter().filter_map(|e| e.event_id.as_deref()),
            std::time::Instant::now(),
        );
        let _ = tx_latency.record((t0.elapsed().as_micros() as u64).clamp(1, 3_600_000_000));
        next += orders.len() as u64;
        counters
            .enqueued
            .fetch_add(orders.len() as u64, Ordering::Relaxed);
        counters.txs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(ProducerResult {
        producer: p,
        committed: next,
        tx_latency,
    })
}

/// Commits one transaction, retrying the identical intents after a rollback, and resolving an
/// unknown COMMIT outcome by looking the first order up. Cancellation never interrupts a
/// transaction half-way: the caller only checks `stop` between transactions.
async fn commit_with_retries(
    db: &Database,
    p: usize,
    orders: &[Order],
    events: &[NewEvent],
    counters: &Counters,
) -> Result<()> {
    let give_up = |reason: String| Error::Producer {
        producer: p,
        reason,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let err = match db.commit_orders(orders, events).await {
            Ok(()) => return Ok(()),
            Err(TxError::RolledBack(e)) => e,
            Err(TxError::Unknown(e)) => {
                let first = orders.first().map(|o| o.order_id).unwrap_or_default();
                match resolve(db, first).await {
                    Some(true) => return Ok(()),
                    Some(false) => e,
                    None => {
                        return Err(give_up(format!(
                            "COMMIT failed ({e}) and whether it committed cannot be determined; \
                             stopping rather than guessing"
                        )))
                    }
                }
            }
        };
        counters.retries.fetch_add(1, Ordering::Relaxed);
        if attempt >= MAX_ATTEMPTS {
            return Err(give_up(format!(
                "a business transaction failed {MAX_ATTEMPTS} times in a row; last error: {err}"
            )));
        }
        tracing::warn!(producer = p, attempt, error = %err, "business transaction failed; retrying the same intents");
        tokio::time::sleep(RETRY.delay(attempt)).await;
    }
}

/// Whether the transaction whose first order is `order_id` committed; `None` if the database
/// cannot tell us within a few tries.
async fn resolve(db: &Database, order_id: i64) -> Option<bool> {
    for _ in 0..5 {
        match db.order_exists(order_id).await {
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
    use crate::cli::Skew;

    fn plan(producers: usize, shape: Preload) -> ProducerPlan {
        ProducerPlan {
            ids: Ids { run: "t".into() },
            producers,
            topic: "t".into(),
            work: Workload {
                aggregates: 1,
                skew: Skew::Uniform,
                zipf_s: 1.0,
                orders_per_tx: 7,
                rate: 0,
                payload_bytes: 128,
                seed: 1,
                preload: Some(shape),
            },
        }
    }

    /// Every producer's share, as the producer would hand it out.
    fn drain(plan: &ProducerPlan, p: usize) -> Vec<(String, i64)> {
        let shape = plan.work.preload.unwrap();
        let mut keys = Keys::Fixed {
            shape,
            agg: p as u64,
            version: 0,
            agg_id: plan.ids.aggregate(p),
        };
        let mut rng = StdRng::seed_from_u64(0);
        std::iter::from_fn(|| keys.next(plan, p, &mut rng)).collect()
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
            let producers = shape.producers(producers);
            let plan = plan(producers, shape);
            let mut all = Vec::new();
            for p in 0..producers {
                let mine = drain(&plan, p);
                assert_eq!(
                    mine.len() as u64,
                    shape.share(producers, p),
                    "{total} {k} p{p}"
                );
                // each aggregate's versions are 1..=n, adjacent
                let mut last: Option<(String, i64)> = None;
                for (a, v) in &mine {
                    match &last {
                        Some((la, lv)) if la == a => assert_eq!(*v, lv + 1),
                        _ => assert_eq!(*v, 1),
                    }
                    last = Some((a.clone(), *v));
                }
                all.extend(mine);
            }
            assert_eq!(all.len() as u64, total, "{total} {k}");
            let aggs: std::collections::BTreeSet<_> = all.iter().map(|(a, _)| a.clone()).collect();
            assert_eq!(aggs.len() as u64, shape.aggregates());
        }
        let hot = Preload {
            total: 5000,
            per_aggregate: 5000,
        };
        assert_eq!(hot.aggregates(), 1);
        assert_eq!(hot.producers(8), 1);
    }
}
