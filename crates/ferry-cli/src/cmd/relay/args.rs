//! `ferry relay`'s flags. `{key}` in a flag's help is the default `help::document_defaults`
//! fills in.
use clap::Args;

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
    /// Retention run by the relay: delete SENT rows older than this, e.g. 7d (what `ferry purge
    /// --older-than` deletes), every quarter of it (at least 1s, at most 1m), on the relay that
    /// owns slot 0 [default: off] (relay.retention).
    #[arg(long, env = "FERRY_RETENTION", value_name = "AGE")]
    pub retention: Option<String>,
    /// Rows per retention delete statement [default: {relay.retention_batch}]
    /// (relay.retention_batch).
    #[arg(long, env = "FERRY_RETENTION_BATCH", value_name = "N")]
    pub retention_batch: Option<usize>,
    /// PostgreSQL: end each retention run with VACUUM (`ferry purge --vacuum`), for a server
    /// or outbox whose autovacuum is off (relay.retention_vacuum).
    #[arg(long)]
    pub retention_vacuum: bool,
}
