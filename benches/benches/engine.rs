//! (f) The engine alone: `Relay` + `MemoryStore` + `NullSink` draining N committed events —
//! shard routing, slot ownership, batched claims, per-item outcomes and the batched fenced ack,
//! with no database and no broker. Goal: ≥ 1,000,000 events/s on 2 cores, so that the engine
//! is never the limit (a store is 50–200× slower per event; docs/performance.md, "The engine
//! alone").
//!
//! `cargo bench -p ferry-benches --bench engine` (reports events/s as elements/s).
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferry_benches::{fill, null_relay, quick, runtime, Feeder};
use ferry_core::OutboxStore;
use ferry_testkit::memory::MemoryStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc; // as in the `ferry` binary

/// Events drained per iteration: ~0.25-0.5 s at the goal rate, long against the relay's 1 ms
/// timer granularity and start-up (slot acquisition, first status scan).
const EVENTS: usize = 400_000;

struct Shape {
    name: &'static str,
    /// `None`: every event its own aggregate; `Some(a)`: `a` aggregates, EVENTS / a versions each.
    aggregates: Option<u64>,
    workers: usize,
    batch: usize,
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "unique/w4/b500",
        aggregates: None,
        workers: 4,
        batch: 500,
    },
    Shape {
        name: "unique/w2/b500",
        aggregates: None,
        workers: 2,
        batch: 500,
    },
    Shape {
        name: "unique/w4/b100",
        aggregates: None,
        workers: 4,
        batch: 100,
    },
    Shape {
        name: "unique/w4/b1000",
        aggregates: None,
        workers: 4,
        batch: 1000,
    },
    // 40,000 aggregates × 10 versions: every ack promotes the aggregate's next version
    Shape {
        name: "chained10/w4/b500",
        aggregates: Some(40_000),
        workers: 4,
        batch: 500,
    },
];

/// One drain: time from starting the relay until every event is SENT.
async fn drain(shape: &Shape) -> Duration {
    let mem = Arc::new(MemoryStore::new());
    let store: Arc<dyn OutboxStore> = mem.clone();
    let mut feeder = match shape.aggregates {
        None => Feeder::unique("eng"),
        Some(a) => Feeder::chained("eng", a),
    };
    fill(&*store, &mut feeder, EVENTS).await;
    let t0 = Instant::now();
    // ownership on: fenced claims, as in production
    let (relay, metrics) = null_relay(store, shape.workers, shape.batch);
    while (metrics.sent.load(Ordering::Relaxed) as usize) < EVENTS {
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let took = t0.elapsed();
    relay.stop().await;
    assert_eq!(metrics.fenced.load(Ordering::Relaxed), 0);
    took
}

fn engine(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("engine");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(EVENTS as u64));
    for shape in &SHAPES {
        g.bench_function(BenchmarkId::new("memory_null", shape.name), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += drain(shape).await;
                    }
                    total
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = quick(Duration::from_secs(5));
    targets = engine
}
criterion_main!(benches);
