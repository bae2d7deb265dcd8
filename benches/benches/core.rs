//! Pure-CPU pieces of the hot path: shard hashing and per-item outcome folding.
//!
//! `cargo bench -p ferry-benches --bench core`
use std::collections::HashMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_core::{slot_for, CasReport, ClaimToken, Outcome, OutcomeCounts};

/// (a) `slot_for` over typical aggregate keys: a short business key and a UUID.
fn shard_hashing(c: &mut Criterion) {
    let mut g = c.benchmark_group("slot_for");
    let keys = [
        (
            "order-key",
            (0..1024).map(|i| format!("order-{i}")).collect::<Vec<_>>(),
        ),
        (
            "uuid-key",
            (0..1024)
                .map(|i| format!("01890a5d-ac96-774b-bcce-{i:012x}"))
                .collect::<Vec<_>>(),
        ),
    ];
    for (name, keys) in &keys {
        g.throughput(Throughput::Elements(keys.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), keys, |b, keys| {
            b.iter(|| {
                let mut acc = 0u32;
                for k in keys {
                    acc = acc.wrapping_add(u32::from(slot_for(black_box(k))));
                }
                acc
            })
        });
    }
    g.finish();
}

fn tokens(n: usize) -> Vec<ClaimToken> {
    (0..n as i64)
        .map(|i| ClaimToken {
            seq: i * 7 + 1,
            event_id: format!("01890a5d-ac96-774b-bcce-{i:012x}"),
            claim_id: "01890a5d-ac96-774b-bcce-00000000ffff".into(),
            claim_version: 1,
        })
        .collect()
}

/// (b) folding a batch's outcomes and building its CAS report, per batch size.
fn outcome_folding(c: &mut Criterion) {
    let mut g = c.benchmark_group("outcomes");
    for n in [10usize, 100, 500] {
        // 94 % acked, 3 % retry, 2 % unknown, 1 % permanent at 100 and 500 items (10 items: 4
        // acked, 3 retry, 2 unknown, 1 permanent): a bad minute at the broker
        let outcomes: Vec<Outcome> = (0..n)
            .map(|i| match i % 100 {
                0 => Outcome::Permanent("message too large".into()),
                1..=3 => Outcome::Retry("broker busy".into()),
                4..=5 => Outcome::Unknown("timed out".into()),
                _ => Outcome::Acked,
            })
            .collect();
        let toks = tokens(n);
        // the database applied all but every 10th (fenced: taken over)
        let applied: HashMap<i64, (i64, String)> = toks
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 10 != 0)
            .map(|(_, t)| (t.seq, (t.claim_version, t.claim_id.clone())))
            .collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("fold", n), &outcomes, |b, o| {
            b.iter(|| OutcomeCounts::fold(black_box(o)))
        });
        g.bench_with_input(
            BenchmarkId::new("cas_report_from_applied", n),
            &toks,
            |b, t| {
                b.iter(|| {
                    let r = CasReport::from_applied(black_box(t), black_box(&applied));
                    (r.applied(), r.fenced())
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("cas_report_all_applied", n),
            &toks,
            |b, t| b.iter(|| CasReport::all_applied(black_box(t)).applied()),
        );
    }
    g.finish();
}

fn config() -> Criterion {
    ferry_benches::quick(std::time::Duration::from_secs(1)).sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = shard_hashing, outcome_folding
}
criterion_main!(benches);
