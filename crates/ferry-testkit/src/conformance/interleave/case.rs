//! One case, end to end: the schedules run, the outbox drained, every check made.
use std::collections::BTreeSet;
use std::time::Instant;

use ferry_core::DispatchMode;

use super::check::{check_delivery, check_versions, Delivered, Intent};
use super::harness::Harness;
use super::plan::Plan;
use super::reader::Reader;
use crate::db::TestDb;

/// Runs `plan` on `db` and drains it in `mode`; panics with every problem found.
pub(super) async fn run_case(db: TestDb, case: &str, plan: Plan, mode: DispatchMode) {
    let t0 = Instant::now();
    let backend = db.backend;
    let label = format!("{} {case} ({} dispatch)", backend.as_str(), mode.as_str());
    let mut reader = Reader::start(&db, mode).await;
    let mut h = Harness::open(&db, plan.sessions()).await;
    h.server
        .exec("CREATE TABLE ferry_it_biz (id VARCHAR(64) PRIMARY KEY, ver BIGINT NOT NULL)")
        .await
        .expect("business table");
    let runs = plan
        .runs(h.locking)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    // each run's prefix and log, in run order
    let mut logs: Vec<(String, Vec<String>)> = Vec::new();
    for run in &runs {
        let p = &run.prefix;
        h.server
            .exec(&format!(
                "INSERT INTO ferry_it_biz (id, ver) VALUES ('{p}X', 0), ('{p}Y', 0), ('{p}Z', 0)"
            ))
            .await
            .expect("business rows");
        let reads = run.read_between.then_some(&mut reader);
        match h.run(p, &run.steps, reads, &db).await {
            Ok(log) => logs.push((p.clone(), log)),
            Err(e) => panic!("{label}, run {p}: {e}"),
        }
    }
    let produced = t0.elapsed();
    let committed = std::mem::take(&mut h.book.committed);
    let discarded = std::mem::take(&mut h.book.discarded);
    let want: BTreeSet<String> = committed.iter().map(|i| i.tag.clone()).collect();
    if let Err(e) = reader.drain(&db, &want).await {
        panic!("{label}: drain: {e}");
    }
    let mut problems = check_versions(&committed);
    let table = h.server.outbox_tags().await.expect("outbox rows");
    if table != want {
        let extra: Vec<&String> = table.difference(&want).collect();
        let missing: Vec<&String> = want.difference(&table).collect();
        problems.push(format!(
            "the outbox holds {extra:?} that no committed step wrote and lacks {missing:?}"
        ));
    }
    let status = db.store.status().await.expect("status");
    if status.pending != 0 || status.claimed != 0 {
        problems.push(format!(
            "after the drain: {} pending, {} claimed",
            status.pending, status.claimed
        ));
    }
    // the delivery problems, by run (an aggregate's id starts with its run's prefix)
    let mut bad_runs = 0;
    let mut shown = Vec::new();
    for (prefix, log) in &logs {
        let of = |agg: &str| agg.starts_with(prefix.as_str());
        let d: Vec<Delivered> = reader
            .delivered
            .iter()
            .filter(|d| of(&d.agg))
            .cloned()
            .collect();
        let c: Vec<Intent> = committed.iter().filter(|i| of(&i.agg)).cloned().collect();
        let x: Vec<Intent> = discarded.iter().filter(|i| of(&i.agg)).cloned().collect();
        let p = check_delivery(&d, &c, &x);
        if p.is_empty() {
            continue;
        }
        bad_runs += 1;
        if shown.len() < 3 {
            let order: Vec<String> = d
                .iter()
                .map(|d| format!("{} v{} [{}]", d.agg, d.version, d.at))
                .collect();
            shown.push(format!(
                "run {prefix}:\n  steps:\n    {}\n  delivered:\n    {}\n  problems:\n    {}",
                log.join("\n    "),
                order.join("\n    "),
                p.join("\n    ")
            ));
        }
    }
    // problems of events outside every run (there should be none)
    let stray: Vec<&Delivered> = reader
        .delivered
        .iter()
        .filter(|d| !logs.iter().any(|(p, _)| d.agg.starts_with(p.as_str())))
        .collect();
    if !stray.is_empty() {
        problems.push(format!("delivered events of no run: {stray:?}"));
    }
    eprintln!(
        "interleave: {label}: {} runs, {} steps, {} waits seen on the server, {} committed and \
         {} rolled-back intents, {} reads; produced in {produced:?}, total {:?}",
        runs.len(),
        h.book.steps,
        h.book.waits,
        committed.len(),
        discarded.len(),
        reader.reads,
        t0.elapsed()
    );
    if let (Plan::Fixed(_), Some((_, log))) = (&plan, logs.first()) {
        let order: Vec<String> = reader
            .delivered
            .iter()
            .map(|d| format!("{} v{} [{}]", d.agg, d.version, d.at))
            .collect();
        eprintln!(
            "  steps:\n    {}\n  delivered:\n    {}",
            log.join("\n    "),
            order.join("\n    ")
        );
    }
    if bad_runs > 0 {
        problems.push(format!(
            "{bad_runs} of {} runs delivered wrongly; the first {}:\n{}",
            runs.len(),
            shown.len(),
            shown.join("\n")
        ));
    }
    assert!(problems.is_empty(), "{label}:\n{}", problems.join("\n"));
}
