//! A profiling aid for bench (f): fills a `MemoryStore` once, then lets `Relay` + `NullSink`
//! drain it while printing the rate every 100 ms and the relay's counters at the end, so a
//! profiler (e.g. `perf record -p <pid>` once "draining" is printed) sees only the engine.
//!
//! `cargo run --release -p ferry-benches --example engine_drain -- [events] [workers] [batch]`
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_benches::{fill, null_relay, runtime, Feeder};
use ferry_core::OutboxStore;
use ferry_testkit::memory::MemoryStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of this process so far (Linux `/proc/self/stat`, clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // utime, stime (fields 14, 15 of the full line)
}

fn main() {
    let (events, workers, batch) = (arg(1, 2_000_000), arg(2, 4), arg(3, 500));
    let rt = runtime();
    rt.block_on(async {
        let store: Arc<dyn OutboxStore> = Arc::new(MemoryStore::new());
        let t = Instant::now();
        fill(&*store, &mut Feeder::unique("p"), events).await;
        eprintln!("filled {events} in {:?}; pid {}", t.elapsed(), std::process::id());
        if let Ok(s) = std::env::var("DRAIN_DELAY_S") {
            // time to attach a profiler
            tokio::time::sleep(Duration::from_secs(s.parse().unwrap_or(0))).await;
        }
        eprintln!("draining");
        let (t0, cpu0) = (Instant::now(), cpu_seconds());
        let (relay, m) = null_relay(store, workers, batch);
        let mut last = (0u64, t0);
        let mut first_sent = None;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent = m.sent.load(Ordering::Relaxed);
            if sent > 0 && first_sent.is_none() {
                first_sent = Some(t0.elapsed());
            }
            let now = Instant::now();
            eprintln!(
                "{:>6.0} ms sent {sent:>9} ({:>9.0}/s)",
                (now - t0).as_secs_f64() * 1e3,
                (sent - last.0) as f64 / (now - last.1).as_secs_f64()
            );
            last = (sent, now);
            if sent as usize >= events {
                break;
            }
        }
        let took = t0.elapsed();
        let cpu = cpu_seconds() - cpu0;
        relay.stop().await;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        println!(
            "events {events} workers {workers} batch {batch}: {:.0} events/s overall ({took:?}), first SENT after {first_sent:?}",
            events as f64 / took.as_secs_f64()
        );
        println!(
            "CPU {cpu:.2} s over {:.2} s wall ({:.2} cores busy): {:.0} events per CPU-second; load average {}",
            took.as_secs_f64(),
            cpu / took.as_secs_f64(),
            events as f64 / cpu.max(0.01),
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
        );
        println!(
            "claims {} (empty {}), claimed items {}, fenced {}, p50 claim {} µs, p50 send {} µs, p50 ack {} µs",
            l(&m.claims),
            l(&m.empty_claims),
            l(&m.claimed_items),
            l(&m.fenced),
            m.claim_latency.snapshot().value_at_quantile(0.5),
            m.send_latency.snapshot().value_at_quantile(0.5),
            m.ack_latency.snapshot().value_at_quantile(0.5),
        );
    });
}
