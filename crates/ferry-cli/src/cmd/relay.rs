//! `ferry relay`: run the relay until SIGINT/SIGTERM, then drain.
//!
//! `{key}` in a flag's help is the default [`crate::config::document_defaults`] fills in.
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_relay::{KafkaSink, NullSink, Relay, Sink, StdoutSink};
use tokio_util::sync::CancellationToken;

use super::{fail, Database, Failure};
use crate::config::{self, FileConfig, RelaySettings, SinkSpec};

#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Shard workers in this process [default: {relay.workers.cursor} in cursor dispatch; in row
    /// dispatch {relay.workers.row}, and {relay.workers.sqlite} on SQLite, whose single writer
    /// more workers only queue on] (relay.workers).
    #[arg(long, env = "FERRY_WORKERS")]
    pub workers: Option<usize>,
    /// Max events per claim or cursor read [default: {relay.batch_size.cursor} in cursor
    /// dispatch, {relay.batch_size.row} in row dispatch] (relay.batch_size).
    #[arg(long, env = "FERRY_BATCH_SIZE")]
    pub batch_size: Option<usize>,
    /// Batches in flight per worker [default: {relay.in_flight.cursor} in cursor dispatch,
    /// {relay.in_flight.row} in row dispatch] (relay.in_flight).
    #[arg(long, env = "FERRY_IN_FLIGHT")]
    pub in_flight: Option<usize>,
    /// Claim lease, e.g. 60s [default: {relay.claim_lease}] (relay.claim_lease).
    #[arg(long, env = "FERRY_CLAIM_LEASE")]
    pub claim_lease: Option<String>,
    /// Slot ownership lease [default: {relay.slot_ttl}] (relay.slot_ttl).
    #[arg(long, env = "FERRY_SLOT_TTL")]
    pub slot_ttl: Option<String>,
    /// Ownership heartbeat [default: {relay.heartbeat}] (relay.heartbeat).
    #[arg(long, env = "FERRY_HEARTBEAT")]
    pub heartbeat: Option<String>,
    /// Shortest poll delay [default: {relay.poll_min}] (relay.poll_min).
    #[arg(long, env = "FERRY_POLL_MIN")]
    pub poll_min: Option<String>,
    /// Idle poll delay [default: {relay.poll_idle}] (relay.poll_idle).
    #[arg(long, env = "FERRY_POLL_IDLE")]
    pub poll_idle: Option<String>,
    /// Cursor dispatch: after a partial read of 16+ events, wait this long per other reader of
    /// the database before reading again; 0 turns it off [default: {relay.read_linger}]
    /// (relay.read_linger).
    #[arg(long, env = "FERRY_READ_LINGER")]
    pub read_linger: Option<String>,
    /// Cursor dispatch: after a partial read of 16+ events, start the next read no sooner than
    /// this after that read started [default: {relay.read_interval.sqlite} on SQLite,
    /// {relay.read_interval.postgres} on PostgreSQL and MariaDB] (relay.read_interval).
    #[arg(long, env = "FERRY_READ_INTERVAL")]
    pub read_interval: Option<String>,
    /// First retry delay [default: {relay.backoff_base}] (relay.backoff_base).
    #[arg(long, env = "FERRY_BACKOFF_BASE")]
    pub backoff_base: Option<String>,
    /// Longest retry delay [default: {relay.backoff_max}] (relay.backoff_max).
    #[arg(long, env = "FERRY_BACKOFF_MAX")]
    pub backoff_max: Option<String>,
    /// Attempts before quarantine [default: {relay.max_attempts}] (relay.max_attempts).
    #[arg(long, env = "FERRY_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// How long shutdown waits for in-flight sends [default: {relay.shutdown_timeout}]
    /// (relay.shutdown_timeout). The process exits at the latest this plus 10 s after SIGTERM
    /// or SIGINT, whatever the broker or the database does (what was not confirmed stays unsent
    /// and is sent again by the next owner); a second SIGTERM or SIGINT exits at once.
    #[arg(long, env = "FERRY_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<String>,
    /// Owner id of this process [default: host-pid-random] (relay.owner).
    #[arg(long, env = "FERRY_OWNER")]
    pub owner: Option<String>,
    /// Dispatch mode: cursor (one write per event) or row (per-row claims: three writes per
    /// event) [default: {relay.dispatch}] (relay.dispatch).
    #[arg(long, env = "FERRY_DISPATCH")]
    pub dispatch: Option<String>,
    /// Sink: kafka, stdout or null [default: {sink.kind}] (sink.kind).
    #[arg(long, env = "FERRY_SINK")]
    pub sink: Option<String>,
    /// Kafka bootstrap servers [default: {sink.brokers}] (sink.brokers).
    #[arg(long, env = "FERRY_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,
    /// Kafka message.timeout.ms as a duration, in row dispatch (cursor dispatch sets no local
    /// timeout, so that a timed-out record cannot leave a gap) [default: {sink.message_timeout}]
    /// (sink.message_timeout).
    #[arg(long, env = "FERRY_KAFKA_MESSAGE_TIMEOUT")]
    pub kafka_message_timeout: Option<String>,
    /// Kafka linger.ms as a duration [default: {sink.linger}] (sink.linger).
    #[arg(long, env = "FERRY_KAFKA_LINGER")]
    pub kafka_linger: Option<String>,
    /// Extra librdkafka property KEY=VALUE, repeatable (sink.kafka_properties). Properties
    /// that weaken delivery or order (acks other than all, enable.idempotence=false,
    /// enable.gapless.guarantee=false, more than 5 requests in flight, a message or delivery
    /// timeout of 0 or at least the claim lease, retries=0) are refused.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,
    /// Run with this refused Kafka property anyway (repeatable); the relay then logs a WARN
    /// naming it on every start (sink.allow_unsafe_properties).
    #[arg(long = "allow-unsafe-kafka-property", value_name = "KEY")]
    pub allow_unsafe_kafka_property: Vec<String>,
    /// Metrics endpoint address, or "off" [default: {metrics.listen}] (metrics.listen).
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Do not apply migrations on start.
    #[arg(long)]
    pub no_migrate: bool,
    /// Count the due rows claims skip because another relay holds them locked, exported as
    /// ferry_claim_rows_skipped_locked_total. On PostgreSQL this recounts every short claim's
    /// window (+40–90 % claim latency measured); MariaDB and SQLite always report it.
    #[arg(long)]
    pub measure_contention: bool,
    /// Publish SLO target: commit to SENT within this [default: {alerts.slo_target}]
    /// (alerts.slo_target).
    #[arg(long, env = "FERRY_SLO_TARGET")]
    pub slo_target: Option<String>,
    /// Publish SLO objective ratio [default: {alerts.slo_ratio}] (alerts.slo_ratio).
    #[arg(long, env = "FERRY_SLO_RATIO")]
    pub slo_ratio: Option<f64>,
    /// Oldest-intent warning age for ferry_alert_level [default: {alerts.oldest_warning}]
    /// (alerts.oldest_warning).
    #[arg(long, env = "FERRY_OLDEST_WARNING")]
    pub oldest_warning: Option<String>,
    /// Oldest-intent critical age [default: {alerts.oldest_critical}] (alerts.oldest_critical).
    #[arg(long, env = "FERRY_OLDEST_CRITICAL")]
    pub oldest_critical: Option<String>,
    /// Sink stall: events handed to the sink with no ack for this long log a WARN (naming the
    /// sink and its last error, every 30 s while it lasts) and raise ferry_alert_level to 1
    /// [default: {alerts.sink_stall}] (alerts.sink_stall).
    #[arg(long, env = "FERRY_SINK_STALL")]
    pub sink_stall: Option<String>,
}

pub async fn run(args: &RelayArgs, file: &FileConfig, db: &Database) -> Result<u8, Failure> {
    // Validate the settings before touching the database (the librdkafka properties are checked
    // when the producer is created, after the store opened: the sink depends on its mode).
    let settings = config::relay(args, file, db.backend)?;
    // a database that is down, restarting or full when the relay starts is waited for
    let Some(store) = db
        .open_retrying(!args.no_migrate, args.measure_contention)
        .await?
    else {
        tracing::info!("stopped before the database answered");
        return Ok(0);
    };
    run_relay(settings, store).await
}

async fn run_relay(
    settings: RelaySettings,
    store: Arc<dyn ferry_core::OutboxStore>,
) -> Result<u8, Failure> {
    let RelaySettings {
        mut config,
        sink: spec,
        alerts,
        listen,
        unsafe_allowed,
    } = settings;
    for (key, value, why) in &unsafe_allowed {
        tracing::warn!(
            property = %key,
            value = %value,
            "running with a Kafka property that weakens delivery (allowed by --allow-unsafe-kafka-property): {why}"
        );
    }
    let mode = config.dispatch.unwrap_or(if store.cursor().is_some() {
        ferry_core::DispatchMode::Cursor
    } else {
        ferry_core::DispatchMode::Row
    });
    config.dispatch = Some(mode);
    let mut kafka = None;
    let sink: Arc<dyn Sink> = match spec {
        SinkSpec::Null => Arc::new(NullSink),
        SinkSpec::Stdout => Arc::new(StdoutSink),
        SinkSpec::Kafka(mut kc) => {
            // several versions of one key in flight: the producer must not leave gaps
            kc.ordered = mode == ferry_core::DispatchMode::Cursor;
            let s = Arc::new(KafkaSink::new(kc).map_err(|e| fail(2, e.to_string()))?);
            kafka = Some(s.clone());
            s
        }
    };
    let owner = config.owner.clone();
    let shutdown_timeout = config.shutdown_timeout;
    let (workers, batch_size, in_flight) =
        (config.workers, config.batch_size, config.max_in_flight);
    let relay = Relay::new(store, sink, config).map_err(|e| fail(2, e.to_string()))?;
    *relay.metrics().alerts.lock().expect("alerts lock") = alerts;
    let cancel = CancellationToken::new();
    if let Some(addr) = listen {
        let (m, c) = (relay.metrics(), cancel.clone());
        // bound here, so an address in use fails the start with a clear sentence
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            let hint = "set --metrics-listen or \"off\"";
            fail(
                1,
                format!("cannot listen on metrics address {addr}: {e} ({hint})"),
            )
        })?;
        let config = ferry_relay::metrics::ServeConfig::default();
        tokio::spawn(async move {
            if let Err(e) = ferry_relay::metrics::serve(listener, m, config, c).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    {
        let cancel = cancel.clone();
        let bound = shutdown_timeout + SHUTDOWN_GRACE;
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!(
                within_secs = bound.as_secs_f64(),
                "shutdown requested: draining in-flight batches (a second SIGTERM or SIGINT exits at once)"
            );
            cancel.cancel();
            shutdown_watchdog(bound);
            wait_for_signal().await;
            tracing::warn!(
                "second signal: exiting at once; intents not confirmed stay unsent and are sent again by the next owner"
            );
            std::process::exit(EXIT_FORCED.into());
        });
    }
    tracing::info!(%owner, workers, batch_size, in_flight, dispatch = %mode, "relay started");
    relay.run(cancel).await?;
    if let Some(k) = kafka {
        k.flush(Duration::from_secs(5));
    }
    tracing::info!("relay stopped");
    Ok(0)
}

/// How long a shutdown may take beyond `relay.shutdown_timeout`: releasing what is left in
/// flight, giving up the slots, and the Kafka flush (5 s) after the workers stopped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The exit code of a shutdown that did not finish in time, or that a second signal cut
/// short (as a shell reports a process ended by SIGINT).
pub const EXIT_FORCED: u8 = 130;

/// Ends the process `bound` after a shutdown began if it is still running then. A thread of
/// its own, not a task: a runtime whose threads are blocked (a Kafka flush or a producer
/// teardown waiting on a broker that does not answer) cannot hold it back. Exiting there loses
/// nothing: an event is only marked sent after its broker ack, so whatever was in flight is
/// read or claimed again by the next owner once the slot leases expire.
fn shutdown_watchdog(bound: Duration) {
    let _ = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            std::thread::sleep(bound);
            tracing::error!(
                after_secs = bound.as_secs_f64(),
                "shutdown did not finish in time: exiting; intents not confirmed stay unsent and are sent again by the next owner"
            );
            std::process::exit(EXIT_FORCED.into());
        });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
