//! The store's hot path on every backend: (c) one claim + ack cycle per batch size, and (d) k
//! concurrent claimers draining the same slots (claim contention).
//!
//! `cargo bench -p ferry-benches --bench store` (set `FERRY_TEST_POSTGRES_URL` /
//! `FERRY_TEST_MYSQL_URL` to include PostgreSQL / MariaDB).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferry_benches::{claim_all, fill, purge_sent, quick, runtime, Feeder, Store};
use ferry_core::{ClaimToken, OutboxStore};

const BATCHES: [usize; 4] = [1, 10, 100, 500];
const CLAIMERS: [usize; 4] = [1, 2, 4, 8];

/// Keeps at least `need` due events in the store, refilling (and purging what was sent) outside
/// the timed section.
struct Supply {
    feeder: Feeder,
    left: usize,
    analyzed: bool,
}

impl Supply {
    async fn ensure(&mut self, s: &Store, need: usize) {
        if self.left >= need {
            return;
        }
        // keep the table (or the memory store) from growing over thousands of iterations
        purge_sent(&*s.store).await;
        let n = (need * 20).max(2_000);
        fill(&*s.store, &mut self.feeder, n).await;
        if !self.analyzed {
            s.analyze().await;
            self.analyzed = true;
        }
        self.left += n;
    }
}

/// (c) one claim of `batch` due events followed by the ack of all of them.
fn claim_ack_cycle(c: &mut Criterion) {
    let rt = runtime();
    let stores = rt.block_on(Store::all());
    let mut g = c.benchmark_group("claim_ack");
    for s in &stores {
        let mut supply = Supply {
            feeder: Feeder::unique(&format!("cyc-{}", s.name)),
            left: 0,
            analyzed: false,
        };
        for batch in BATCHES {
            g.throughput(Throughput::Elements(batch as u64));
            g.bench_function(BenchmarkId::new(s.name, batch), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut timed = Duration::ZERO;
                        for _ in 0..iters {
                            supply.ensure(s, batch).await;
                            let t0 = Instant::now();
                            let got = s.store.claim(&claim_all(batch)).await.expect("claim");
                            let tokens: Vec<ClaimToken> =
                                got.iter().map(|e| e.token.clone()).collect();
                            let r = s.store.ack(&tokens).await.expect("ack");
                            timed += t0.elapsed();
                            assert_eq!(r.applied(), batch, "{}: a short claim", s.name);
                            supply.left -= batch;
                        }
                        timed
                    })
                })
            });
        }
    }
    g.finish();
    for s in stores {
        rt.block_on(s.cleanup());
    }
}

/// What one contention run saw, for the printed summary.
#[derive(Default)]
struct Seen {
    claims: AtomicU64,
    /// Empty claims while some events were still unclaimed: contention (rows held or locked
    /// by the other claimers, or a serialized writer).
    contended: AtomicU64,
    /// Empty claims once every event was claimed (waiting for the last acks): the drain's tail.
    tail: AtomicU64,
    fenced: AtomicU64,
    errors: AtomicU64,
}

/// Drains `total` due events with `k` claimers over the same slots (claim 100 + ack).
async fn drain(store: &Arc<dyn OutboxStore>, k: usize, total: u64, seen: &Arc<Seen>) {
    let sent = Arc::new(AtomicU64::new(0));
    let claimed = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..k)
        .map(|_| {
            let (store, sent, seen) = (store.clone(), sent.clone(), seen.clone());
            let claimed = claimed.clone();
            tokio::spawn(async move {
                while sent.load(Ordering::Relaxed) < total {
                    seen.claims.fetch_add(1, Ordering::Relaxed);
                    let got = match store.claim(&claim_all(100)).await {
                        Ok(g) => g,
                        Err(e) if e.is_transient() => {
                            seen.errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(e) => panic!("claim: {e}"),
                    };
                    if got.is_empty() {
                        // everything due is held by the other claimers right now; back off
                        // (1 ms, below a relay worker's poll_min of 2 ms) instead of spinning
                        let c = if claimed.load(Ordering::Relaxed) < total {
                            &seen.contended
                        } else {
                            &seen.tail
                        };
                        c.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    claimed.fetch_add(got.len() as u64, Ordering::Relaxed);
                    let tokens: Vec<ClaimToken> = got.iter().map(|e| e.token.clone()).collect();
                    let r = loop {
                        match store.ack(&tokens).await {
                            Ok(r) => break r,
                            Err(e) if e.is_transient() => {
                                seen.errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("ack: {e}"),
                        }
                    };
                    seen.fenced.fetch_add(r.fenced() as u64, Ordering::Relaxed);
                    sent.fetch_add(r.applied() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("claimer");
    }
}

/// (d) k claimers competing for the same slots; throughput of the whole drain.
fn claim_contention(c: &mut Criterion) {
    let rt = runtime();
    let stores = rt.block_on(Store::all_with(true));
    let mut g = c.benchmark_group("contention");
    g.sampling_mode(SamplingMode::Flat);
    for s in &stores {
        // sized for ~0.2-0.5 s per drain on 2 cores; every event its own aggregate, so what is
        // measured is contention between claimers, not the predecessor rule
        let total: u64 = match s.name {
            "memory" => 200_000,
            "sqlite" => 10_000,
            _ => 3_000,
        };
        let mut feeder = Feeder::unique(&format!("con-{}", s.name));
        for k in CLAIMERS {
            let seen = Arc::new(Seen::default());
            let skipped_before = s.store.rows_skipped_locked();
            g.throughput(Throughput::Elements(total));
            g.bench_function(BenchmarkId::new(s.name, format!("k{k}")), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut timed = Duration::ZERO;
                        for _ in 0..iters {
                            purge_sent(&*s.store).await;
                            fill(&*s.store, &mut feeder, total as usize).await;
                            s.analyze().await;
                            let t0 = Instant::now();
                            drain(&s.store, k, total, &seen).await;
                            timed += t0.elapsed();
                        }
                        timed
                    })
                })
            });
            let claims = seen.claims.load(Ordering::Relaxed).max(1);
            let skipped = match (skipped_before, s.store.rows_skipped_locked()) {
                (Some(a), Some(b)) => (b - a).to_string(),
                _ => "not measured".to_string(),
            };
            println!(
                "contention {}/k{k}: {claims} claims, {:.2}% empty while events were unclaimed (contended), {:.2}% empty in the drain's tail, rows skipped as locked {skipped}, {} fenced, {} transient errors",
                s.name,
                100.0 * seen.contended.load(Ordering::Relaxed) as f64 / claims as f64,
                100.0 * seen.tail.load(Ordering::Relaxed) as f64 / claims as f64,
                seen.fenced.load(Ordering::Relaxed),
                seen.errors.load(Ordering::Relaxed),
            );
        }
    }
    g.finish();
    for s in stores {
        rt.block_on(s.cleanup());
    }
}

criterion_group! {
    name = cycle;
    config = quick(Duration::from_secs(2));
    targets = claim_ack_cycle
}
criterion_group! {
    name = contention;
    config = quick(Duration::from_secs(3));
    targets = claim_contention
}
criterion_main!(cycle, contention);
