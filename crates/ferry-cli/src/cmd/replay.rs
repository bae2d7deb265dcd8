//! `ferry replay`: re-publish retained SENT events of a topic, aggregate and time range through
//! the relay's Kafka sink, marked with the `ferry-replay` header (docs/operations.md, "Replay").
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use ferry_core::replay::ReplayFilter;
use ferry_core::OutboxStore;
use ferry_relay::replay::{
    new_replay_id, run_replay, scan_replay, ReplayError, ReplayPlan, DEFAULT_REPLAY_PAGE,
};
use ferry_relay::{KafkaSink, RelayConfig, Sink};

use super::reconcile::rfc3339_micros;
use super::relay::settings::{kafka_config, KafkaFlags};
use super::{fail, Failure};
use crate::config::{ConfigError, FileConfig};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Topic whose events to replay (repeatable; at least one).
    #[arg(long = "topic", value_name = "TOPIC")]
    pub topic: Vec<String>,
    /// Only this aggregate (repeatable; default: every aggregate of the topics).
    #[arg(long = "aggregate", value_name = "AGGREGATE_ID")]
    pub aggregate: Vec<String>,
    /// Only events created at or after this UTC time (RFC 3339, e.g. 2026-12-06T08:00:00Z).
    #[arg(long)]
    pub from: Option<String>,
    /// Only events created at or before this UTC time (RFC 3339).
    #[arg(long)]
    pub to: Option<String>,
    /// Send every event to this topic instead of its own.
    #[arg(long)]
    pub to_topic: Option<String>,
    /// Print what would be replayed (the count, per topic) and send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The replay id the ferry-replay header carries [default: a new UUIDv7]. Pass a stopped
    /// replay's id to run it again as the same replay (consumers that accept replays process
    /// each event of one replay id once).
    #[arg(long)]
    pub replay_id: Option<String>,
    /// Events per read and per sink batch.
    #[arg(long, default_value_t = DEFAULT_REPLAY_PAGE)]
    pub page_size: usize,
    /// How long a page may wait for the broker's acks before the replay stops, saying how far
    /// it got (the same --replay-id runs it again); while it waits, a line every 10 s says so.
    /// E.g. 30s, 10m.
    #[arg(long, default_value = "2m", value_parser = parse_ack_timeout)]
    pub ack_timeout: Duration,
    /// Kafka bootstrap servers [default: sink.brokers of the config file, else 127.0.0.1:9092].
    #[arg(long, env = "FERRY_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,
    /// Extra librdkafka property KEY=VALUE, repeatable (over sink.kafka_properties); properties
    /// that weaken delivery or order are refused as by `ferry relay`.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,
}

/// `--ack-timeout`: at least one second.
fn parse_ack_timeout(s: &str) -> Result<Duration, String> {
    let d = ferry_core::parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("'{s}' is too short: at least 1s"));
    }
    Ok(d)
}

/// The filter the flags describe; bad timestamps and empty names are refused (exit 2).
fn filter(a: &ReplayArgs) -> Result<ReplayFilter, Failure> {
    let time = |flag: &str, v: &Option<String>| -> Result<Option<i64>, Failure> {
        v.as_deref()
            .map(|s| {
                rfc3339_micros(s.trim()).ok_or_else(|| {
                    fail(
                        2,
                        format!("invalid {flag} {s:?}: use a UTC time like 2026-12-06T08:00:00Z"),
                    )
                })
            })
            .transpose()
    };
    if a.aggregate.iter().any(|x| x.trim().is_empty()) {
        return Err(fail(
            2,
            "invalid --aggregate: an aggregate id must not be empty",
        ));
    }
    if a.to_topic.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(fail(2, "invalid --to-topic: must not be empty"));
    }
    if let Some(t) = a
        .to_topic
        .as_deref()
        .filter(|t| !ferry_core::is_kafka_topic(t))
    {
        return Err(fail(
            2,
            format!("invalid --to-topic {t:?}: a Kafka topic is 1 to 249 characters of letters, digits, '.', '_' and '-' (not '.' or '..')"),
        ));
    }
    if a.page_size == 0 || a.page_size > 100_000 {
        return Err(fail(2, "invalid --page-size: must be between 1 and 100000"));
    }
    let f = ReplayFilter {
        topics: a.topic.clone(),
        aggregates: a.aggregate.clone(),
        from: time("--from", &a.from)?,
        to: time("--to", &a.to)?,
    };
    ferry_core::replay::check_filter(&f).map_err(|e| fail(2, e.to_string()))?;
    Ok(f)
}

/// The relay's Kafka sink, ordered (idempotent, gapless): several versions of one aggregate
/// go in one batch, in order.
fn sink(a: &ReplayArgs, file: &FileConfig) -> Result<KafkaSink, Failure> {
    let lease = RelayConfig::default().claim_lease;
    let mut kc = kafka_config(
        &KafkaFlags {
            brokers: &a.kafka_brokers,
            properties: &a.kafka_property,
            message_timeout: &None,
            linger: &None,
        },
        file,
        lease,
    )?;
    for (k, why) in ferry_relay::sink::kafka::weakening_properties(&kc.extra, lease) {
        if !file
            .sink
            .allow_unsafe_properties
            .iter()
            .any(|x| x.trim() == k)
        {
            return Err(ConfigError(format!("refusing Kafka property {k}: {why}")).into());
        }
    }
    kc.ordered = true;
    KafkaSink::new(kc).map_err(|e| fail(2, e.to_string()))
}

fn failure(e: ReplayError) -> Failure {
    match e {
        ReplayError::Store(e) => e.into(),
        other => fail(1, other.to_string()),
    }
}

pub async fn run(
    a: ReplayArgs,
    file: &FileConfig,
    store: Arc<dyn OutboxStore>,
) -> Result<u8, Failure> {
    let f = filter(&a)?;
    if a.dry_run {
        let (scan, total) = scan_replay(store.as_ref(), &f).await.map_err(failure)?;
        println!("would replay {total} events (dry run: nothing sent)");
        for t in &scan {
            println!(
                "  {}: {} events ({} matching not sent, not replayed)",
                t.topic, t.matched, t.not_sent
            );
        }
        return Ok(0);
    }
    let sink = sink(&a, file)?;
    let plan = ReplayPlan {
        filter: f,
        to_topic: a.to_topic.clone(),
        replay_id: a.replay_id.clone().unwrap_or_else(new_replay_id),
        page_size: a.page_size,
        ack_timeout: a.ack_timeout,
    };
    let mut last = Instant::now();
    let result = run_replay(store.as_ref(), &sink, &plan, |p| {
        if let Some(w) = &p.waiting {
            eprintln!(
                "replay {}: waiting for {}: the last {} events sent, {}s ago, are not acknowledged \
                 yet (last error: {}); {}/{} acknowledged so far; stopping after {}s without the acks",
                plan.replay_id,
                sink.describe(),
                w.events,
                w.waited.as_secs(),
                w.last_error.as_deref().unwrap_or("none reported"),
                p.sent,
                p.total,
                plan.ack_timeout.as_secs()
            );
            return;
        }
        // a progress line at most once a second, and at the end
        if last.elapsed() >= Duration::from_secs(1) || p.sent == p.total {
            last = Instant::now();
            eprintln!(
                "replay {}: sent {}/{} ({:.0} events/s)",
                plan.replay_id,
                p.sent,
                p.total,
                p.rate()
            );
        }
    })
    .await;
    sink.flush(Duration::from_secs(5));
    let s = result.map_err(failure)?;
    println!(
        "replayed {} events (matched {}) in {:.1}s as replay {}",
        s.sent, s.matched, s.elapsed_secs, s.replay_id
    );
    for (topic, n) in &s.sent_per_topic {
        println!("  {topic}: {n}");
    }
    Ok(0)
}
