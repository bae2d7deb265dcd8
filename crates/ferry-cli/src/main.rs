//! `ferry`: migrate, relay, status, quarantine and enqueue for the ferry outbox relay.
//!
//! Settings come from built-in defaults, then a TOML file (`--config`), then `FERRY_*`
//! environment variables, then flags (each later source wins). Exit codes: 0 success, 1 runtime
//! error, 2 bad usage or configuration; `status` exits 2 at a warning and 3 at a critical alert.
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ferry_core::{Backoff, Limits, NewEvent, OutboxStore};
use ferry_relay::{KafkaConfig, KafkaSink, NullSink, Relay, RelayConfig, Sink, StdoutSink};
use ferry_store::{redact_url, ConnectOptions};
use tokio_util::sync::CancellationToken;

mod config;
mod lab;

use config::{duration, pick, ConfigError, FileConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser, Debug)]
#[command(
    name = "ferry",
    version,
    about = "Transactional-outbox relay: claim, send, confirm — fenced and in order."
)]
struct Cli {
    /// TOML configuration file (see docs/operations.md for every key).
    #[arg(long, global = true, env = "FERRY_CONFIG")]
    config: Option<PathBuf>,
    /// Database URL: postgres://…, mysql://… (MariaDB too) or sqlite://path.db. Never printed
    /// with its password.
    #[arg(
        long,
        global = true,
        env = "FERRY_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. info, ferry_relay=debug. PostgreSQL notices
    /// (sqlx::postgres::notice) are logged from warn unless the filter names them.
    #[arg(long, global = true, env = "FERRY_LOG", default_value = "info")]
    log: String,
    /// Log format: text (colours only when stderr is a terminal) or json (one object per line,
    /// for log shippers).
    #[arg(long, global = true, env = "FERRY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

// parsed once per process: the size of the relay's arguments does not matter
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Apply the embedded schema migrations (waits for a concurrent migrate; never double-applies).
    Migrate,
    /// Run the relay until SIGINT/SIGTERM, then drain gracefully and exit 0.
    Relay(RelayArgs),
    /// Show backlog, oldest intent age, unknown exposure, quarantine and slot owners.
    /// Exits 2 past the warning threshold (or with blocked aggregates), 3 past the critical one.
    Status(StatusArgs),
    /// Inspect and resolve quarantined events.
    Quarantine {
        #[command(subcommand)]
        cmd: QuarantineCmd,
    },
    /// Enqueue events from JSON (an object, an array, or JSON lines) for demos and scripts.
    Enqueue(EnqueueArgs),
    /// Delete SENT rows older than the retention window, in bounded batches. Never touches
    /// PENDING, CLAIMED, QUARANTINED or SKIPPED rows.
    Purge(PurgeArgs),
    /// Classify every intent under a fixed watermark into mutually exclusive classes.
    Reconcile(ReconcileArgs),
    /// The reliability lab: run the outbox's failure cases (rollback, crash windows, stale claims,
    /// partial batches) on a fresh database (temporary SQLite file by default, or a new
    /// schema/database on --database-url) with a real Kafka receiver (the embedded mock cluster)
    /// and a consumer Inbox; print the durable facts; exit 1 if an expectation did not hold.
    Lab(LabArgs),
}

#[derive(Args, Debug)]
struct LabArgs {
    /// all, rollback, committed, send-before-mark, mark-before-send, stale-claim, stale-cursor,
    /// batch, two-sessions (two sessions claiming at once with a lease expiry and a stale CAS) or
    /// kafka-duplicate (the same event id sent twice, one Inbox effect).
    #[arg(long, default_value = "all")]
    case: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct PurgeArgs {
    /// Retention window: only SENT rows whose sent_at is older than this, e.g. 7d or 36h.
    #[arg(long)]
    older_than: String,
    /// Rows per delete statement (each its own short transaction).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Only rows this consumer's Inbox (ferry_inbox, same database) recorded as consumed.
    #[arg(long)]
    consumer: Option<String>,
    /// Only count what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct ReconcileArgs {
    /// Fixed watermark: an outbox seq (e.g. 120000) or an RFC 3339 UTC time
    /// (e.g. 2026-11-30T10:00:00Z). Pick one older than your longest producer transaction.
    #[arg(long)]
    watermark: String,
    /// Consumer whose Inbox (ferry_inbox, same database) proves consumption.
    #[arg(long)]
    consumer: Option<String>,
    /// Business table to check for rows with no intent (e.g. orders).
    #[arg(long)]
    business_table: Option<String>,
    /// Its id column.
    #[arg(long, default_value = "id")]
    business_id_column: String,
    /// aggregate_id = prefix || id.
    #[arg(long, default_value = "")]
    aggregate_prefix: String,
    /// Only business rows with id <= this.
    #[arg(long)]
    business_max_id: Option<i64>,
    /// Ids listed per class that must be listed.
    #[arg(long, default_value_t = 50)]
    list_limit: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RelayArgs {
    /// Shard workers in this process [default: 1 in cursor dispatch; in row dispatch 4, and 1
    /// on SQLite, whose single writer more workers only queue on] (relay.workers).
    #[arg(long, env = "FERRY_WORKERS")]
    workers: Option<usize>,
    /// Max events per claim or cursor read [default: 2000 in cursor dispatch, 500 in row
    /// dispatch] (relay.batch_size).
    #[arg(long, env = "FERRY_BATCH_SIZE")]
    batch_size: Option<usize>,
    /// Batches in flight per worker [default: 4 in cursor dispatch, 2 in row dispatch]
    /// (relay.in_flight).
    #[arg(long, env = "FERRY_IN_FLIGHT")]
    in_flight: Option<usize>,
    /// Claim lease, e.g. 60s [default: 60s] (relay.claim_lease).
    #[arg(long, env = "FERRY_CLAIM_LEASE")]
    claim_lease: Option<String>,
    /// Slot ownership lease [default: 15s] (relay.slot_ttl).
    #[arg(long, env = "FERRY_SLOT_TTL")]
    slot_ttl: Option<String>,
    /// Ownership heartbeat [default: 5s] (relay.heartbeat).
    #[arg(long, env = "FERRY_HEARTBEAT")]
    heartbeat: Option<String>,
    /// Shortest poll delay [default: 2ms] (relay.poll_min).
    #[arg(long, env = "FERRY_POLL_MIN")]
    poll_min: Option<String>,
    /// Idle poll delay [default: 500ms] (relay.poll_idle).
    #[arg(long, env = "FERRY_POLL_IDLE")]
    poll_idle: Option<String>,
    /// First retry delay [default: 200ms] (relay.backoff_base).
    #[arg(long, env = "FERRY_BACKOFF_BASE")]
    backoff_base: Option<String>,
    /// Longest retry delay [default: 60s] (relay.backoff_max).
    #[arg(long, env = "FERRY_BACKOFF_MAX")]
    backoff_max: Option<String>,
    /// Attempts before quarantine [default: 10] (relay.max_attempts).
    #[arg(long, env = "FERRY_MAX_ATTEMPTS")]
    max_attempts: Option<u32>,
    /// How long shutdown waits for in-flight sends [default: 10s] (relay.shutdown_timeout).
    #[arg(long, env = "FERRY_SHUTDOWN_TIMEOUT")]
    shutdown_timeout: Option<String>,
    /// Owner id of this process [default: host-pid-random] (relay.owner).
    #[arg(long, env = "FERRY_OWNER")]
    owner: Option<String>,
    /// Dispatch mode: cursor (one write per event) or row (per-row claims: three writes per
    /// event) [default: cursor]
    /// (relay.dispatch).
    #[arg(long, env = "FERRY_DISPATCH")]
    dispatch: Option<String>,
    /// Sink: kafka, stdout or null [default: kafka] (sink.kind).
    #[arg(long, env = "FERRY_SINK")]
    sink: Option<String>,
    /// Kafka bootstrap servers [default: 127.0.0.1:9092] (sink.brokers).
    #[arg(long, env = "FERRY_KAFKA_BROKERS")]
    kafka_brokers: Option<String>,
    /// Kafka message.timeout.ms as a duration [default: 30s] (sink.message_timeout).
    #[arg(long, env = "FERRY_KAFKA_MESSAGE_TIMEOUT")]
    kafka_message_timeout: Option<String>,
    /// Kafka linger.ms as a duration [default: 1ms] (sink.linger).
    #[arg(long, env = "FERRY_KAFKA_LINGER")]
    kafka_linger: Option<String>,
    /// Extra librdkafka property KEY=VALUE, repeatable (sink.kafka_properties).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    kafka_property: Vec<String>,
    /// Metrics endpoint address, or "off" [default: 127.0.0.1:9464] (metrics.listen).
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Do not apply migrations on start.
    #[arg(long)]
    no_migrate: bool,
    /// Count the due rows claims skip because another relay holds them locked, exported as
    /// ferry_claim_rows_skipped_locked_total. On PostgreSQL this recounts every short claim's
    /// window (+40–90 % claim latency measured); MariaDB and SQLite always report it.
    #[arg(long)]
    measure_contention: bool,
    /// Publish SLO target: commit to SENT within this [default: 30s] (alerts.slo_target).
    #[arg(long, env = "FERRY_SLO_TARGET")]
    slo_target: Option<String>,
    /// Publish SLO objective ratio [default: 0.999] (alerts.slo_ratio).
    #[arg(long, env = "FERRY_SLO_RATIO")]
    slo_ratio: Option<f64>,
    /// Oldest-intent warning age for ferry_alert_level [default: 5m] (alerts.oldest_warning).
    #[arg(long, env = "FERRY_OLDEST_WARNING")]
    oldest_warning: Option<String>,
    /// Oldest-intent critical age [default: 1h] (alerts.oldest_critical).
    #[arg(long, env = "FERRY_OLDEST_CRITICAL")]
    oldest_critical: Option<String>,
}

fn alert_settings(
    slo_target: &Option<String>,
    slo_ratio: &Option<f64>,
    warning: &Option<String>,
    critical: &Option<String>,
    f: &FileConfig,
) -> Result<ferry_relay::metrics::AlertThresholds, Failure> {
    let d = ferry_relay::metrics::AlertThresholds::default();
    let a = ferry_relay::metrics::AlertThresholds {
        slo_target: duration(
            "alerts.slo_target (--slo-target)",
            slo_target,
            &f.alerts.slo_target,
            d.slo_target,
        )?,
        slo_ratio: pick(slo_ratio, &f.alerts.slo_ratio).unwrap_or(d.slo_ratio),
        oldest_warning: duration(
            "alerts.oldest_warning (--oldest-warning)",
            warning,
            &f.alerts.oldest_warning,
            d.oldest_warning,
        )?,
        oldest_critical: duration(
            "alerts.oldest_critical (--oldest-critical)",
            critical,
            &f.alerts.oldest_critical,
            d.oldest_critical,
        )?,
    };
    if !(a.slo_ratio > 0.0 && a.slo_ratio <= 1.0) {
        return Err(fail(
            2,
            "invalid alerts.slo_ratio (--slo-ratio): must be in (0, 1], e.g. 0.999",
        ));
    }
    if a.oldest_critical < a.oldest_warning {
        return Err(fail(
            2,
            "invalid alerts.oldest_critical: must not be shorter than alerts.oldest_warning",
        ));
    }
    Ok(a)
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Warning when the oldest unsent intent is older [default: 5m] (alerts.oldest_warning).
    #[arg(long, env = "FERRY_OLDEST_WARNING")]
    oldest_warning: Option<String>,
    /// Critical when older [default: 1h] (alerts.oldest_critical).
    #[arg(long, env = "FERRY_OLDEST_CRITICAL")]
    oldest_critical: Option<String>,
}

#[derive(Subcommand, Debug)]
enum QuarantineCmd {
    /// List quarantined events, oldest first.
    List {
        /// Max rows.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a quarantined event back to PENDING, keeping its id and payload.
    Requeue {
        /// Event id.
        event_id: String,
        /// Who is acting (recorded) [default: $USER].
        #[arg(long)]
        operator: Option<String>,
    },
    /// Never deliver a quarantined event; releases its aggregate's successors. Recorded.
    Skip {
        /// Event id.
        event_id: String,
        /// Who is acting (recorded) [default: $USER].
        #[arg(long)]
        operator: Option<String>,
    },
}

#[derive(Args, Debug)]
struct EnqueueArgs {
    /// One event as JSON: {"aggregate_id":…, "aggregate_version":…, "topic":…, "event_type":…,
    /// "payload":"<json text>", optional "event_id", "key", "headers"}.
    #[arg(long, conflicts_with = "file")]
    event: Option<String>,
    /// A file (or - for stdin) holding an object, an array, or JSON lines of events.
    #[arg(long)]
    file: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum SinkKind {
    Kafka,
    Stdout,
    Null,
}

/// A failure with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Self {
            code: 2,
            message: e.0,
        }
    }
}

impl From<ferry_core::StoreError> for Failure {
    fn from(e: ferry_core::StoreError) -> Self {
        let code = if e.kind() == ferry_core::StoreErrorKind::InvalidInput {
            2
        } else {
            1
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Migrations log PostgreSQL NOTICEs ("trigger … does not exist, skipping") at info: quiet
    // them unless the filter asks for them.
    let directives = if cli.log.contains("sqlx") {
        cli.log.clone()
    } else {
        format!("{},sqlx::postgres::notice=warn", cli.log)
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&directives) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: invalid --log (FERRY_LOG) {:?}: {e}; use a tracing filter such as info or ferry_relay=debug",
                cli.log
            );
            return ExitCode::from(2);
        }
    };
    {
        use std::io::IsTerminal;
        let fmt = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match cli.log_format {
            LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
            LogFormat::Json => fmt.json().with_ansi(false).init(),
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    if let Cmd::Lab(a) = &cli.cmd {
        return run_lab(a, pick(&cli.database_url, &file.database_url)).await;
    }
    let url = pick(&cli.database_url, &file.database_url).ok_or_else(|| {
        fail(2, "no database URL: pass --database-url, set FERRY_DATABASE_URL, or database_url in the config file")
    })?;
    ferry_store::Backend::from_url(&url)?;
    let limits = Limits {
        max_payload_bytes: file
            .limits
            .max_payload_bytes
            .unwrap_or(Limits::default().max_payload_bytes),
    };
    let open = |migrate: bool, measure_contention: bool| {
        let url = url.clone();
        async move {
            let opts = ConnectOptions {
                migrate,
                limits,
                measure_contention,
                ..Default::default()
            };
            ferry_store::connect(&url, &opts)
                .await
                .map_err(|e| fail(1, format!("{} ({})", e, redact_url(&url))))
        }
    };
    match cli.cmd {
        Cmd::Migrate => {
            let applied = ferry_store::migrate_url(&url)
                .await
                .map_err(|e| fail(1, format!("{e} ({})", redact_url(&url))))?;
            if applied.is_empty() {
                println!("schema up to date ({})", redact_url(&url));
            } else {
                println!("applied migrations {applied:?} to {}", redact_url(&url));
            }
            Ok(0)
        }
        Cmd::Relay(args) => {
            // Validate every setting before touching the database.
            let (mut config, sink) = relay_settings(&args, &file)?;
            // Worker settings left unset take the defaults of the dispatch mode the relay will
            // run in (the store's preferred one unless --dispatch says otherwise).
            let backend = ferry_store::Backend::from_url(&url)?;
            let mode = config
                .dispatch
                .unwrap_or(ferry_relay::preferred_dispatch(match backend {
                    ferry_store::Backend::Mysql => "mysql",
                    ferry_store::Backend::Postgres => "postgres",
                    ferry_store::Backend::Sqlite => "sqlite",
                }));
            let d = ferry_relay::WorkerDefaults::for_mode(
                mode,
                backend == ferry_store::Backend::Sqlite,
            );
            if pick(&args.workers, &file.relay.workers).is_none() {
                config.workers = d.workers;
            }
            if pick(&args.batch_size, &file.relay.batch_size).is_none() {
                config.batch_size = d.batch_size;
            }
            if pick(&args.in_flight, &file.relay.in_flight).is_none() {
                config.max_in_flight = d.max_in_flight;
            }
            let alerts = alert_settings(
                &args.slo_target,
                &args.slo_ratio,
                &args.oldest_warning,
                &args.oldest_critical,
                &file,
            )?;
            let listen = metrics_listen(&args, &file)?;
            let store = open(!args.no_migrate, args.measure_contention).await?;
            run_relay(config, sink, listen, alerts, store).await
        }
        Cmd::Status(args) => status(args, &file, open(false, false).await?).await,
        Cmd::Quarantine { cmd } => quarantine(cmd, open(false, false).await?).await,
        Cmd::Enqueue(args) => enqueue(args, open(true, false).await?).await,
        Cmd::Purge(args) => purge(args, open(false, false).await?).await,
        Cmd::Reconcile(args) => reconcile(args, open(false, false).await?).await,
        Cmd::Lab(_) => unreachable!("handled before the database URL is required"),
    }
}

/// The sink to build.
enum SinkSpec {
    Kafka(KafkaConfig),
    Stdout,
    Null,
}

fn relay_settings(a: &RelayArgs, f: &FileConfig) -> Result<(RelayConfig, SinkSpec), Failure> {
    let r = &f.relay;
    let d = RelayConfig::default();
    let config = RelayConfig {
        owner: pick(&a.owner, &r.owner).unwrap_or(d.owner),
        workers: pick(&a.workers, &r.workers).unwrap_or(d.workers),
        batch_size: pick(&a.batch_size, &r.batch_size).unwrap_or(d.batch_size),
        max_in_flight: pick(&a.in_flight, &r.in_flight).unwrap_or(d.max_in_flight),
        claim_lease: duration(
            "relay.claim_lease (--claim-lease)",
            &a.claim_lease,
            &r.claim_lease,
            d.claim_lease,
        )?,
        slot_ttl: duration(
            "relay.slot_ttl (--slot-ttl)",
            &a.slot_ttl,
            &r.slot_ttl,
            d.slot_ttl,
        )?,
        heartbeat: duration(
            "relay.heartbeat (--heartbeat)",
            &a.heartbeat,
            &r.heartbeat,
            d.heartbeat,
        )?,
        poll_min: duration(
            "relay.poll_min (--poll-min)",
            &a.poll_min,
            &r.poll_min,
            d.poll_min,
        )?,
        poll_idle: duration(
            "relay.poll_idle (--poll-idle)",
            &a.poll_idle,
            &r.poll_idle,
            d.poll_idle,
        )?,
        backoff: Backoff {
            base: duration(
                "relay.backoff_base (--backoff-base)",
                &a.backoff_base,
                &r.backoff_base,
                d.backoff.base,
            )?,
            max: duration(
                "relay.backoff_max (--backoff-max)",
                &a.backoff_max,
                &r.backoff_max,
                d.backoff.max,
            )?,
        },
        max_attempts: pick(&a.max_attempts, &r.max_attempts).unwrap_or(d.max_attempts),
        shutdown_timeout: duration(
            "relay.shutdown_timeout (--shutdown-timeout)",
            &a.shutdown_timeout,
            &r.shutdown_timeout,
            d.shutdown_timeout,
        )?,
        dispatch: pick(&a.dispatch, &r.dispatch)
            .map(|m| {
                m.parse::<ferry_core::DispatchMode>()
                    .map_err(|e| fail(2, format!("invalid relay.dispatch (--dispatch): {e}")))
            })
            .transpose()?,
        ..d
    };
    config.validate().map_err(|e| fail(2, e.to_string()))?;
    let kind = pick(&a.sink, &f.sink.kind).unwrap_or_else(|| "kafka".into());
    let kind = SinkKind::from_str(&kind, true).map_err(|_| {
        fail(
            2,
            format!("invalid sink.kind (--sink) {kind:?}: use kafka, stdout or null"),
        )
    })?;
    let sink = match kind {
        SinkKind::Stdout => SinkSpec::Stdout,
        SinkKind::Null => SinkSpec::Null,
        SinkKind::Kafka => {
            let dk = KafkaConfig::default();
            let mut extra = f.sink.kafka_properties.clone();
            for p in &a.kafka_property {
                let (k, v) = p.split_once('=').ok_or_else(|| {
                    fail(2, format!("invalid --kafka-property {p:?}: use KEY=VALUE"))
                })?;
                extra.insert(k.trim().to_string(), v.trim().to_string());
            }
            let kc = KafkaConfig {
                brokers: pick(&a.kafka_brokers, &f.sink.brokers).unwrap_or(dk.brokers),
                message_timeout: duration(
                    "sink.message_timeout (--kafka-message-timeout)",
                    &a.kafka_message_timeout,
                    &f.sink.message_timeout,
                    dk.message_timeout,
                )?,
                linger: duration(
                    "sink.linger (--kafka-linger)",
                    &a.kafka_linger,
                    &f.sink.linger,
                    dk.linger,
                )?,
                extra,
                // set by run_relay once the dispatch mode is known
                ordered: false,
            };
            if kc.brokers.trim().is_empty() {
                return Err(fail(
                    2,
                    "invalid sink.brokers (--kafka-brokers): must not be empty",
                ));
            }
            // checked in both dispatch modes (cursor dispatch sends without a message timeout,
            // but the same configuration must stay valid in row dispatch)
            if kc.message_timeout >= config.claim_lease {
                return Err(fail(
                    2,
                    "invalid sink.message_timeout: must be shorter than relay.claim_lease, so an unanswered send resolves before another relay may take the event over",
                ));
            }
            SinkSpec::Kafka(kc)
        }
    };
    Ok((config, sink))
}

fn metrics_listen(a: &RelayArgs, f: &FileConfig) -> Result<Option<std::net::SocketAddr>, Failure> {
    let s = pick(&a.metrics_listen, &f.metrics.listen).unwrap_or_else(|| "127.0.0.1:9464".into());
    if s == "off" {
        return Ok(None);
    }
    Ok(Some(config::listen_addr(&s)?))
}

async fn run_relay(
    config: RelayConfig,
    spec: SinkSpec,
    listen: Option<std::net::SocketAddr>,
    alerts: ferry_relay::metrics::AlertThresholds,
    store: Arc<dyn OutboxStore>,
) -> Result<u8, Failure> {
    let mut config = config;
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
    let (workers, batch_size, in_flight) =
        (config.workers, config.batch_size, config.max_in_flight);
    let relay = Relay::new(store, sink, config).map_err(|e| fail(2, e.to_string()))?;
    *relay.metrics().alerts.lock().expect("alerts lock") = alerts;
    let cancel = CancellationToken::new();
    if let Some(addr) = listen {
        let (m, c) = (relay.metrics(), cancel.clone());
        let listener_ok = tokio::net::TcpListener::bind(addr).await;
        match listener_ok {
            Ok(l) => {
                drop(l);
                tokio::spawn(async move {
                    if let Err(e) = ferry_relay::metrics::serve(addr, m, c).await {
                        tracing::error!(error = %e, "metrics endpoint failed");
                    }
                });
            }
            Err(e) => return Err(fail(1, format!("cannot listen on metrics address {addr}: {e} (set --metrics-listen or \"off\")"))),
        }
    }
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested: draining in-flight batches");
            cancel.cancel();
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

fn fmt_age(us: Option<i64>) -> String {
    match us {
        None => "-".into(),
        Some(us) => format!("{:.1}s", us as f64 / 1e6),
    }
}

async fn status(a: StatusArgs, f: &FileConfig, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let thresholds = alert_settings(&None, &None, &a.oldest_warning, &a.oldest_critical, f)?;
    let (warn, crit) = (thresholds.oldest_warning, thresholds.oldest_critical);
    let st = store.status().await?;
    let leases = store.slot_leases().await?;
    let quarantined = store.list_quarantined(20).await?;
    let age = st
        .oldest_unfinished_age_us
        .map(|u| Duration::from_micros(u.max(0) as u64));
    let mut reasons = Vec::new();
    let mut level = 0u8;
    let (mode, horizon) = match store.cursor() {
        Some(cs) => (cs.dispatch_mode().await?, Some(cs.horizon().await?)),
        None => (ferry_core::DispatchMode::Row, None),
    };
    // In cursor dispatch an open write transaction holds back every intent committed after it
    // started (PostgreSQL's snapshot horizon).
    let blocker = horizon
        .as_ref()
        .filter(|_| mode == ferry_core::DispatchMode::Cursor)
        .and_then(|h| {
            h.oldest_xact_age_us
                .map(|a| (a, h.oldest_xact_pid.unwrap_or(-1)))
        });
    if let Some((age_us, pid)) = blocker {
        let age = Duration::from_micros(age_us.max(0) as u64);
        if age >= warn {
            level = level.max(if age >= crit { 3 } else { 2 });
            reasons.push(format!(
                "an open write transaction (pid {pid}) has held the cursor horizon back for {:.0}s: intents committed since it began wait for it",
                age.as_secs_f64()
            ));
        }
    }
    if let Some(age) = age {
        if age >= crit {
            level = 3;
            reasons.push(format!(
                "oldest unsent intent is {:.0}s old (critical at {:.0}s)",
                age.as_secs_f64(),
                crit.as_secs_f64()
            ));
        } else if age >= warn {
            level = 2;
            reasons.push(format!(
                "oldest unsent intent is {:.0}s old (warning at {:.0}s)",
                age.as_secs_f64(),
                warn.as_secs_f64()
            ));
        }
    }
    if st.blocked_aggregates > 0 {
        level = level.max(2);
        reasons.push(format!(
            "{} aggregate(s) blocked behind quarantined events (ferry quarantine list)",
            st.blocked_aggregates
        ));
    }
    let label = match level {
        0 => "OK",
        2 => "WARNING",
        _ => "CRITICAL",
    };
    let mut owners: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in &leases {
        *owners.entry(l.owner.as_str()).or_default() += 1;
    }
    if a.json {
        let v = serde_json::json!({
            "level": label,
            "dispatch": mode,
            "horizon": horizon,
            "reasons": reasons,
            "outbox": st,
            "slot_owners": owners,
            "quarantined": quarantined,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("status:              {label}");
        for r in &reasons {
            println!("  - {r}");
        }
        println!("dispatch:            {mode}");
        if mode == ferry_core::DispatchMode::Cursor && store.backend() == "postgres" {
            match blocker {
                Some((age_us, pid)) => println!(
                    "horizon held by:     pid {pid}, open for {}",
                    fmt_age(Some(age_us))
                ),
                None => println!("horizon held by:     nothing (no open write transaction)"),
            }
        }
        println!("pending:             {}", st.pending);
        println!("claimed (unknown):   {}", st.claimed);
        println!("quarantined:         {}", st.quarantined);
        println!("blocked aggregates:  {}", st.blocked_aggregates);
        println!(
            "oldest unsent age:   {}",
            fmt_age(st.oldest_unfinished_age_us)
        );
        println!(
            "slot owners:         {}",
            if owners.is_empty() {
                "none".to_string()
            } else {
                String::new()
            }
        );
        for (o, n) in &owners {
            println!("  {o}: {n} slots");
        }
    }
    Ok(level)
}

fn operator_name(o: Option<String>) -> String {
    o.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown-operator".into())
}

async fn quarantine(cmd: QuarantineCmd, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    match cmd {
        QuarantineCmd::List { limit, json } => {
            let q = store.list_quarantined(limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&q).unwrap_or_default());
            } else if q.is_empty() {
                println!("no quarantined events");
            } else {
                println!(
                    "{:<40} {:<24} {:>8} {:>8} {:>9}  reason",
                    "event_id", "aggregate", "version", "attempts", "blocking"
                );
                for e in &q {
                    println!(
                        "{:<40} {:<24} {:>8} {:>8} {:>9}  {}",
                        e.event_id,
                        e.aggregate_id,
                        e.aggregate_version,
                        e.attempts,
                        e.blocked_successors,
                        e.last_error.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(0)
        }
        QuarantineCmd::Requeue { event_id, operator } => {
            let op = operator_name(operator);
            store
                .requeue(&ferry_core::OperatorAction::new(&event_id, &op))
                .await?;
            println!("requeued {event_id} (same id and payload), recorded operator {op}");
            Ok(0)
        }
        QuarantineCmd::Skip { event_id, operator } => {
            let op = operator_name(operator);
            store
                .skip(&ferry_core::OperatorAction::new(&event_id, &op))
                .await?;
            println!("skipped {event_id}: it will never be delivered; its aggregate's successors are released; recorded operator {op}");
            Ok(0)
        }
    }
}

fn parse_events(text: &str) -> Result<Vec<NewEvent>, Failure> {
    let t = text.trim();
    let bad = |e: serde_json::Error| fail(2, format!("invalid event JSON: {e}"));
    if t.starts_with('[') {
        return serde_json::from_str(t).map_err(bad);
    }
    if let Ok(one) = serde_json::from_str::<NewEvent>(t) {
        return Ok(vec![one]);
    }
    t.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| fail(2, format!("invalid event JSON on line {}: {e}", i + 1)))
        })
        .collect()
}

async fn enqueue(a: EnqueueArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let text = match (a.event, a.file) {
        (Some(e), _) => e,
        (None, Some(f)) if f == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| fail(1, format!("cannot read stdin: {e}")))?;
            s
        }
        (None, Some(f)) => {
            std::fs::read_to_string(&f).map_err(|e| fail(2, format!("cannot read {f}: {e}")))?
        }
        (None, None) => {
            return Err(fail(
                2,
                "nothing to enqueue: pass --event JSON or --file PATH (- for stdin)",
            ))
        }
    };
    let events = parse_events(&text)?;
    if events.is_empty() {
        return Err(fail(2, "nothing to enqueue: the input holds no events"));
    }
    let ids = store.enqueue(&events).await.map_err(|e| {
        let code = if matches!(e, ferry_core::EnqueueError::Store(_)) {
            1
        } else {
            2
        };
        fail(code, e.to_string())
    })?;
    ferry_core::failpoint::hit("enqueue-after-commit");
    for id in ids {
        println!("{id}");
    }
    Ok(0)
}

async fn purge(a: PurgeArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let older = config::parse_duration(&a.older_than)
        .map_err(|e| fail(2, format!("invalid --older-than: {e}")))?;
    if a.batch == 0 || a.batch > 100_000 {
        return Err(fail(2, "invalid --batch: must be between 1 and 100000"));
    }
    let n = store
        .purge_sent(&ferry_core::PurgeRequest {
            older_than: older,
            batch: a.batch,
            consumer: a.consumer.as_deref(),
            dry_run: a.dry_run,
        })
        .await?;
    let scope = a
        .consumer
        .map(|c| format!(" consumed by {c}"))
        .unwrap_or_default();
    if a.dry_run {
        println!(
            "would delete {n} SENT rows{scope} older than {}",
            a.older_than
        );
    } else {
        println!("deleted {n} SENT rows{scope} older than {}", a.older_than);
    }
    Ok(0)
}

/// Parses a watermark: digits are an outbox seq, otherwise an RFC 3339 UTC time.
fn parse_watermark(s: &str) -> Result<ferry_core::Watermark, Failure> {
    let s = s.trim();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
        return s
            .parse()
            .map(ferry_core::Watermark::Seq)
            .map_err(|_| fail(2, format!("invalid --watermark {s:?}: seq out of range")));
    }
    rfc3339_micros(s)
        .map(ferry_core::Watermark::Time)
        .ok_or_else(|| fail(2, format!("invalid --watermark {s:?}: use an outbox seq (digits) or a UTC time like 2026-11-30T10:00:00Z")))
}

/// `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` → µs since the epoch.
fn rfc3339_micros(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = s.split_once(['T', ' '])?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let us: i64 = if frac.is_empty() {
        0
    } else {
        let f: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        f.parse().ok()?
    };
    // days from civil (Howard Hinnant)
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + us)
}

async fn reconcile(a: ReconcileArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let watermark = parse_watermark(&a.watermark)?;
    let business = a.business_table.map(|t| ferry_core::BusinessTable {
        table: t,
        id_column: a.business_id_column.clone(),
        aggregate_prefix: a.aggregate_prefix.clone(),
        max_id: a.business_max_id,
    });
    let req = ferry_core::ReconcileRequest {
        watermark,
        consumer: a.consumer.clone(),
        business,
        list_limit: a.list_limit,
    };
    let r = store.reconcile(&req).await?;
    if !r.classes_sum_to_total() {
        return Err(fail(
            1,
            format!("internal error: reconciliation classes do not sum to the total: {r:?}"),
        ));
    }
    if a.json {
        let v = serde_json::json!({ "watermark": watermark, "consumer": a.consumer, "report": r });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("watermark:                        {:?}", watermark);
        println!("intents under the watermark:      {}", r.total);
        if a.consumer.is_some() {
            println!("  consumed:                       {}", r.consumed);
        }
        println!(
            "  published, awaiting consumption: {}",
            r.published_awaiting_consumption
        );
        println!(
            "  not yet published (pending):    {}  (oldest {})",
            r.not_yet_published,
            fmt_age(r.oldest_not_published_age_us)
        );
        println!("  outcome unknown (claimed):      {}", r.outcome_unknown);
        for id in &r.unknown_ids {
            println!("    {id}");
        }
        println!("  quarantined (known failure):    {}", r.quarantined);
        for id in &r.quarantined_ids {
            println!("    {id}");
        }
        println!("  skipped by an operator:         {}", r.skipped);
        if let (Some(rows), Some(missing)) = (r.business_rows, r.business_without_intent) {
            println!("business rows checked:            {rows}");
            println!("  with NO intent (anomaly):       {missing}");
            for id in &r.business_without_intent_ids {
                println!("    {id}");
            }
        }
    }
    // Anomalies and unknowns are not success: say so in the exit code.
    let anomalies = r.business_without_intent.unwrap_or(0) > 0;
    Ok(if anomalies {
        3
    } else if r.outcome_unknown > 0 || r.quarantined > 0 {
        2
    } else {
        0
    })
}

async fn run_lab(a: &LabArgs, url: Option<String>) -> Result<u8, Failure> {
    if a.case != "all" && !lab::CASES.contains(&a.case.as_str()) {
        return Err(fail(
            2,
            format!(
                "invalid --case {:?}: use all or one of {}",
                a.case,
                lab::CASES.join(", ")
            ),
        ));
    }
    let results = lab::run(&a.case, url.as_deref()).await.map_err(|e| {
        let e = match &url {
            Some(u) => e.replace(u.as_str(), &redact_url(u)),
            None => e,
        };
        fail(1, e)
    })?;
    let all_held = results.iter().all(|r| r.held);
    if a.json {
        let v = serde_json::json!({ "all_held": all_held, "cases": results });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for r in &results {
            println!(
                "[{}] {} ({}): {}",
                if r.held { "held" } else { "FAILED" },
                r.case,
                r.backend,
                r.expectation
            );
            println!("    {}", r.facts);
        }
        println!(
            "{}",
            if all_held {
                "all expectations held"
            } else {
                "SOME EXPECTATIONS DID NOT HOLD"
            }
        );
    }
    Ok(if all_held { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_micros("2000-03-01T00:00:01.5Z"),
            Some((951_868_800 + 1) * 1_000_000 + 500_000)
        );
        assert_eq!(
            rfc3339_micros("2026-11-30T10:00:00Z"),
            Some(1_796_032_800 * 1_000_000)
        );
        assert_eq!(rfc3339_micros("2026-13-30T10:00:00Z"), None);
        assert_eq!(rfc3339_micros("yesterday"), None);
        assert!(matches!(
            parse_watermark("120"),
            Ok(ferry_core::Watermark::Seq(120))
        ));
    }
}
