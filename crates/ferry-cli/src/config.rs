//! Configuration: built-in defaults < TOML file (`--config`) < environment (`FERRY_*`) < flags.
//!
//! This is the one place the layers merge (clap reads a flag or else its `FERRY_*` variable;
//! [`pick`] takes that, else the file's key, else the default). Each default is written once:
//! the relay's come from the `Default` impls of `ferry-relay`/`ferry-core` (read here), the
//! command line's own are the constants below, and the help text's `[default: …]` is filled in
//! from the same values ([`document_defaults`]).
//!
//! Every value is checked; a bad one produces one line naming the key and what is accepted.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::ValueEnum;
use ferry_core::{parse_duration, Backoff, DispatchMode, Limits};
use ferry_relay::metrics::AlertThresholds;
use ferry_relay::{KafkaConfig, RelayConfig, WorkerDefaults};
use ferry_store::Backend;
use serde::Deserialize;

use crate::cmd::relay::RelayArgs;
use crate::LogFormat;

/// `--log` (`FERRY_LOG`).
pub const DEFAULT_LOG: &str = "info";
/// `--log-format` (`FERRY_LOG_FORMAT`).
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// `sink.kind` (`--sink`).
pub const DEFAULT_SINK: SinkKind = SinkKind::Kafka;
/// `metrics.listen` (`--metrics-listen`).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// `ferry purge --batch`.
pub const DEFAULT_PURGE_BATCH: usize = 1000;
/// `ferry reconcile --business-id-column`.
pub const DEFAULT_BUSINESS_ID_COLUMN: &str = "id";
/// `ferry reconcile --aggregate-prefix`.
pub const DEFAULT_AGGREGATE_PREFIX: &str = "";
/// `ferry reconcile --list-limit`.
pub const DEFAULT_LIST_LIMIT: usize = 50;
/// `ferry quarantine list --limit`.
pub const DEFAULT_QUARANTINE_LIST_LIMIT: usize = 100;
/// `ferry lab --case`.
pub const DEFAULT_LAB_CASE: &str = "all";

/// A configuration error: the key and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The TOML file. Unknown keys are refused so that typos do not silently fall back to defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Database URL.
    pub database_url: Option<String>,
    /// `[relay]`
    #[serde(default)]
    pub relay: RelaySection,
    /// `[sink]`
    #[serde(default)]
    pub sink: SinkSection,
    /// `[metrics]`
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[alerts]`
    #[serde(default)]
    pub alerts: AlertsSection,
    /// `[limits]`
    #[serde(default)]
    pub limits: LimitsSection,
}

/// `[relay]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    pub workers: Option<usize>,
    pub batch_size: Option<usize>,
    pub in_flight: Option<usize>,
    pub claim_lease: Option<String>,
    pub slot_ttl: Option<String>,
    pub heartbeat: Option<String>,
    pub poll_min: Option<String>,
    pub poll_idle: Option<String>,
    pub read_linger: Option<String>,
    pub read_interval: Option<String>,
    pub backoff_base: Option<String>,
    pub backoff_max: Option<String>,
    pub max_attempts: Option<u32>,
    pub shutdown_timeout: Option<String>,
    pub owner: Option<String>,
    pub dispatch: Option<String>,
}

/// `[sink]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSection {
    pub kind: Option<String>,
    pub brokers: Option<String>,
    pub message_timeout: Option<String>,
    pub linger: Option<String>,
    #[serde(default)]
    pub kafka_properties: BTreeMap<String, String>,
    /// Keys of `kafka_properties` that weaken delivery or order and are run with anyway.
    #[serde(default)]
    pub allow_unsafe_properties: Vec<String>,
}

/// `[metrics]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    pub listen: Option<String>,
}

/// `[alerts]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsSection {
    pub oldest_warning: Option<String>,
    pub oldest_critical: Option<String>,
    pub slo_target: Option<String>,
    pub slo_ratio: Option<f64>,
    pub sink_stall: Option<String>,
}

/// `[limits]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_payload_bytes: Option<usize>,
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            // Name the offending line (and so the key), not just the type mismatch.
            let at = match e.span() {
                Some(span) => {
                    let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
                    format!(" (line {line_no}: `{line}`)")
                }
                None => String::new(),
            };
            ConfigError(format!(
                "config file {}: {}{at}",
                path.display(),
                e.message()
            ))
        })
    }
}

/// Picks the first present value: flag/env, then file.
pub fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>) -> Option<T> {
    flag.clone().or_else(|| file.clone())
}

/// Resolves a duration setting named `key` from flag/env or file, else `default`.
pub fn duration(
    key: &str,
    flag: &Option<String>,
    file: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match pick(flag, file) {
        None => Ok(default),
        Some(s) => parse_duration(&s).map_err(|e| ConfigError(format!("invalid {key}: {e}"))),
    }
}

/// Parses a listen address, refusing to guess.
pub fn listen_addr(s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        ConfigError(format!(
            "invalid metrics.listen {s:?}: use host:port, e.g. {DEFAULT_METRICS_LISTEN}"
        ))
    })
}

/// `--database-url`/`FERRY_DATABASE_URL`, else the file's `database_url`.
pub fn database_url(flag: &Option<String>, f: &FileConfig) -> Option<String> {
    pick(flag, &f.database_url)
}

/// `[limits]` (file only).
pub fn limits(f: &FileConfig) -> Limits {
    let d = Limits::default();
    Limits {
        max_payload_bytes: f.limits.max_payload_bytes.unwrap_or(d.max_payload_bytes),
    }
}

/// `sink.kind`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum SinkKind {
    Kafka,
    Stdout,
    Null,
}

/// The sink to build.
pub enum SinkSpec {
    Kafka(KafkaConfig),
    Stdout,
    Null,
}

/// Everything `ferry relay` runs with.
pub struct RelaySettings {
    pub config: RelayConfig,
    pub sink: SinkSpec,
    pub alerts: AlertThresholds,
    /// `None`: the metrics endpoint is off.
    pub listen: Option<SocketAddr>,
    /// Kafka properties that weaken delivery or order, allowed by name: (key, value, why),
    /// logged at WARN on every start.
    pub unsafe_allowed: Vec<(String, String, String)>,
}

/// Resolves and checks every `ferry relay` setting for a relay on `backend`.
pub fn relay(
    a: &RelayArgs,
    f: &FileConfig,
    backend: Backend,
) -> Result<RelaySettings, ConfigError> {
    let (mut config, sink) = relay_and_sink(a, f)?;
    // Worker settings left unset take the defaults of the dispatch mode the relay will run in
    // (the store's preferred one unless --dispatch says otherwise).
    let d = worker_defaults(config.dispatch, backend);
    if pick(&a.workers, &f.relay.workers).is_none() {
        config.workers = d.workers;
    }
    if pick(&a.batch_size, &f.relay.batch_size).is_none() {
        config.batch_size = d.batch_size;
    }
    if pick(&a.in_flight, &f.relay.in_flight).is_none() {
        config.max_in_flight = d.max_in_flight;
    }
    config.read_interval = duration(
        "relay.read_interval (--read-interval)",
        &a.read_interval,
        &f.relay.read_interval,
        d.read_interval,
    )?;
    let mut alerts = alerts(
        &a.slo_target,
        &a.slo_ratio,
        &a.oldest_warning,
        &a.oldest_critical,
        f,
    )?;
    alerts.sink_stall = duration(
        "alerts.sink_stall (--sink-stall)",
        &a.sink_stall,
        &f.alerts.sink_stall,
        alerts.sink_stall,
    )?;
    if alerts.sink_stall.is_zero() {
        return Err(ConfigError(
            "invalid alerts.sink_stall (--sink-stall): must be longer than 0, e.g. 30s".into(),
        ));
    }
    let mut unsafe_allowed = Vec::new();
    if let SinkSpec::Kafka(kc) = &sink {
        let allowed: std::collections::BTreeSet<&str> = a
            .allow_unsafe_kafka_property
            .iter()
            .chain(&f.sink.allow_unsafe_properties)
            .map(|k| k.trim())
            .collect();
        for k in &allowed {
            if !kc.extra.contains_key(*k) {
                return Err(ConfigError(format!(
                    "invalid --allow-unsafe-kafka-property {k:?} (sink.allow_unsafe_properties): no such Kafka property is set"
                )));
            }
        }
        for (k, why) in
            ferry_relay::sink::kafka::weakening_properties(&kc.extra, config.claim_lease)
        {
            let v = kc.extra.get(&k).cloned().unwrap_or_default();
            if allowed.contains(k.as_str()) {
                unsafe_allowed.push((k, v, why));
            } else {
                return Err(ConfigError(format!(
                    "refusing Kafka property {k}={v}: {why}; to run with it anyway, pass --allow-unsafe-kafka-property {k} (sink.allow_unsafe_properties)"
                )));
            }
        }
    }
    let listen = metrics_listen(a, f)?;
    Ok(RelaySettings {
        config,
        sink,
        alerts,
        listen,
        unsafe_allowed,
    })
}

/// The dispatch mode a relay on `backend` runs in when not told.
fn default_dispatch(backend: Backend) -> DispatchMode {
    ferry_relay::preferred_dispatch(backend.as_str())
}

/// The worker settings of `dispatch` (else the default mode) on `backend`.
fn worker_defaults(dispatch: Option<DispatchMode>, backend: Backend) -> WorkerDefaults {
    let mode = dispatch.unwrap_or(default_dispatch(backend));
    WorkerDefaults::for_mode(mode, backend)
}

fn relay_and_sink(a: &RelayArgs, f: &FileConfig) -> Result<(RelayConfig, SinkSpec), ConfigError> {
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
        read_linger: duration(
            "relay.read_linger (--read-linger)",
            &a.read_linger,
            &r.read_linger,
            d.read_linger,
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
                m.parse::<DispatchMode>()
                    .map_err(|e| ConfigError(format!("invalid relay.dispatch (--dispatch): {e}")))
            })
            .transpose()?,
        ..d
    };
    config.validate().map_err(|e| ConfigError(e.to_string()))?;
    let kind = match pick(&a.sink, &f.sink.kind) {
        None => DEFAULT_SINK,
        Some(kind) => SinkKind::from_str(&kind, true).map_err(|_| {
            ConfigError(format!(
                "invalid sink.kind (--sink) {kind:?}: use kafka, stdout or null"
            ))
        })?,
    };
    let sink = match kind {
        SinkKind::Stdout => SinkSpec::Stdout,
        SinkKind::Null => SinkSpec::Null,
        SinkKind::Kafka => {
            let dk = KafkaConfig::default();
            let mut extra = f.sink.kafka_properties.clone();
            for p in &a.kafka_property {
                let (k, v) = p.split_once('=').ok_or_else(|| {
                    ConfigError(format!("invalid --kafka-property {p:?}: use KEY=VALUE"))
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
                // set by the relay command once the dispatch mode is known
                ordered: false,
            };
            if kc.brokers.trim().is_empty() {
                return Err(ConfigError(
                    "invalid sink.brokers (--kafka-brokers): must not be empty".into(),
                ));
            }
            // checked in both dispatch modes (cursor dispatch sends without a message timeout,
            // but the same configuration must stay valid in row dispatch)
            if kc.message_timeout >= config.claim_lease {
                return Err(ConfigError(
                    "invalid sink.message_timeout: must be shorter than relay.claim_lease, so an unanswered send resolves before another relay may take the event over".into(),
                ));
            }
            // librdkafka's own range for linger.ms, named here rather than in its words
            if kc.linger > ferry_relay::MAX_KAFKA_LINGER {
                return Err(ConfigError(
                    "invalid sink.linger (--kafka-linger): must be at most 15m (librdkafka's linger.ms range)".into(),
                ));
            }
            SinkSpec::Kafka(kc)
        }
    };
    Ok((config, sink))
}

/// `[alerts]`, for `ferry relay` (every key) and `ferry status` (no SLO flags).
pub fn alerts(
    slo_target: &Option<String>,
    slo_ratio: &Option<f64>,
    warning: &Option<String>,
    critical: &Option<String>,
    f: &FileConfig,
) -> Result<AlertThresholds, ConfigError> {
    let d = AlertThresholds::default();
    let a = AlertThresholds {
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
        sink_stall: d.sink_stall,
    };
    if !(a.slo_ratio > 0.0 && a.slo_ratio <= 1.0) {
        return Err(ConfigError(
            "invalid alerts.slo_ratio (--slo-ratio): must be in (0, 1], e.g. 0.999".into(),
        ));
    }
    if a.oldest_critical < a.oldest_warning {
        return Err(ConfigError(
            "invalid alerts.oldest_critical: must not be shorter than alerts.oldest_warning".into(),
        ));
    }
    Ok(a)
}

fn metrics_listen(a: &RelayArgs, f: &FileConfig) -> Result<Option<SocketAddr>, ConfigError> {
    let s =
        pick(&a.metrics_listen, &f.metrics.listen).unwrap_or_else(|| DEFAULT_METRICS_LISTEN.into());
    if s == "off" {
        return Ok(None);
    }
    Ok(Some(listen_addr(&s)?))
}

/// A duration as the help text writes it: `500ms`, `15s`, `60s`, `5m`, `1h` (whole minutes
/// from 2 on, whole hours as hours).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// The defaults the help text shows, by the `{placeholder}` its flags write for them.
fn help_defaults() -> Vec<(&'static str, String)> {
    let r = RelayConfig::default();
    let k = KafkaConfig::default();
    let a = AlertThresholds::default();
    let cursor = WorkerDefaults::for_mode(DispatchMode::Cursor, Backend::Postgres);
    let cursor_sqlite = WorkerDefaults::for_mode(DispatchMode::Cursor, Backend::Sqlite);
    let row = WorkerDefaults::for_mode(DispatchMode::Row, Backend::Postgres);
    let row_sqlite = WorkerDefaults::for_mode(DispatchMode::Row, Backend::Sqlite);
    let d = format_duration;
    vec![
        ("relay.workers.cursor", cursor.workers.to_string()),
        ("relay.workers.row", row.workers.to_string()),
        ("relay.workers.sqlite", row_sqlite.workers.to_string()),
        ("relay.batch_size.cursor", cursor.batch_size.to_string()),
        ("relay.batch_size.row", row.batch_size.to_string()),
        ("relay.in_flight.cursor", cursor.max_in_flight.to_string()),
        ("relay.in_flight.row", row.max_in_flight.to_string()),
        ("relay.claim_lease", d(r.claim_lease)),
        ("relay.slot_ttl", d(r.slot_ttl)),
        ("relay.heartbeat", d(r.heartbeat)),
        ("relay.poll_min", d(r.poll_min)),
        ("relay.poll_idle", d(r.poll_idle)),
        ("relay.read_linger", d(r.read_linger)),
        ("relay.read_interval.sqlite", d(cursor_sqlite.read_interval)),
        ("relay.read_interval.postgres", d(cursor.read_interval)),
        ("relay.backoff_base", d(r.backoff.base)),
        ("relay.backoff_max", d(r.backoff.max)),
        ("relay.max_attempts", r.max_attempts.to_string()),
        ("relay.shutdown_timeout", d(r.shutdown_timeout)),
        // the same on every SQL backend (a test checks)
        (
            "relay.dispatch",
            default_dispatch(Backend::Postgres).to_string(),
        ),
        ("sink.kind", value_name(DEFAULT_SINK)),
        ("sink.brokers", k.brokers),
        ("sink.message_timeout", d(k.message_timeout)),
        ("sink.linger", d(k.linger)),
        ("metrics.listen", DEFAULT_METRICS_LISTEN.to_string()),
        ("alerts.slo_target", d(a.slo_target)),
        ("alerts.slo_ratio", a.slo_ratio.to_string()),
        ("alerts.oldest_warning", d(a.oldest_warning)),
        ("alerts.oldest_critical", d(a.oldest_critical)),
        ("alerts.sink_stall", d(a.sink_stall)),
    ]
}

fn value_name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// Fills every `{placeholder}` in the help of `cmd` and its subcommands with its default.
pub fn document_defaults(cmd: clap::Command) -> clap::Command {
    fill_help(cmd, &help_defaults())
}

fn fill_help(cmd: clap::Command, defaults: &[(&'static str, String)]) -> clap::Command {
    let fill = |text: &clap::builder::StyledStr| {
        let mut s = text.to_string();
        for (key, value) in defaults {
            s = s.replace(&format!("{{{key}}}"), value);
        }
        s
    };
    cmd.mut_args(|arg| {
        let help = arg.get_help().map(fill);
        let long_help = arg.get_long_help().map(fill);
        let arg = match help {
            Some(h) => arg.help(h),
            None => arg,
        };
        match long_help {
            Some(h) => arg.long_help(h),
            None => arg,
        }
    })
    .mut_subcommands(|c| fill_help(c, defaults))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's `ferry.example.toml` (also shown in docs/operations.md) parses with
    /// unknown keys refused, and every value in it is valid.
    #[test]
    fn the_example_config_parses_and_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ferry.example.toml");
        let f = FileConfig::load(&path).unwrap_or_else(|e| panic!("{}", e.0));
        let r = &f.relay;
        for d in [
            &r.claim_lease,
            &r.slot_ttl,
            &r.heartbeat,
            &r.poll_min,
            &r.poll_idle,
            &r.read_linger,
            &r.backoff_base,
            &r.backoff_max,
            &r.shutdown_timeout,
            &f.sink.message_timeout,
            &f.sink.linger,
            &f.alerts.oldest_warning,
            &f.alerts.oldest_critical,
            &f.alerts.slo_target,
            &f.alerts.sink_stall,
        ] {
            let d = d.as_deref().expect("the example sets every duration");
            parse_duration(d).unwrap_or_else(|e| panic!("{d}: {e}"));
        }
        assert_eq!(f.sink.kind.as_deref(), Some("kafka"));
        assert_eq!(f.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
        assert!(f.alerts.slo_ratio.is_some_and(|r| r > 0.0 && r <= 1.0));
        // the docs show the same file
        let docs = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
        )
        .unwrap();
        let example = std::fs::read_to_string(&path).unwrap();
        assert!(
            docs.contains(&format!("```toml\n{example}```")),
            "docs/operations.md no longer shows ferry.example.toml as it is"
        );
    }

    #[test]
    fn help_durations() {
        let f = |ms| format_duration(Duration::from_millis(ms));
        assert_eq!(f(2), "2ms");
        assert_eq!(f(500), "500ms");
        assert_eq!(f(1500), "1500ms");
        assert_eq!(f(0), "0s");
        assert_eq!(f(15_000), "15s");
        assert_eq!(f(60_000), "60s");
        assert_eq!(f(300_000), "5m");
        assert_eq!(f(3_600_000), "1h");
        // what the help writes parses back to the same value
        for ms in [
            2, 500, 1500, 15_000, 60_000, 90_000, 300_000, 3_600_000, 7_200_000,
        ] {
            assert_eq!(
                parse_duration(&f(ms)).unwrap(),
                Duration::from_millis(ms),
                "{ms}"
            );
        }
    }

    /// The help shows one default for relay.dispatch: it must hold on every SQL backend.
    #[test]
    fn the_default_dispatch_is_the_same_on_every_backend() {
        for b in [Backend::Mysql, Backend::Sqlite] {
            assert_eq!(default_dispatch(b), default_dispatch(Backend::Postgres));
        }
    }

    /// Every `{placeholder}` in the help is filled, and every default is shown somewhere.
    #[test]
    fn the_help_shows_every_default_and_no_placeholder() {
        fn walk(c: &clap::Command, out: &mut Vec<String>) {
            for a in c.get_arguments() {
                out.extend(a.get_help().map(|h| h.to_string()));
                out.extend(a.get_long_help().map(|h| h.to_string()));
            }
            for s in c.get_subcommands() {
                walk(s, out);
            }
        }
        use clap::CommandFactory;
        let (mut raw, mut filled) = (Vec::new(), Vec::new());
        walk(&crate::Cli::command(), &mut raw);
        walk(&crate::command(), &mut filled);
        for key in help_defaults().iter().map(|(k, _)| k) {
            let p = format!("{{{key}}}");
            assert!(raw.iter().any(|h| h.contains(&p)), "no flag shows {key}");
        }
        // a placeholder: `{` then lowercase letters, `_` and `.`, then `}`
        let placeholder = |h: &str| {
            h.split('{').skip(1).any(|rest| {
                rest.split_once('}').is_some_and(|(name, _)| {
                    !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
                })
            })
        };
        assert!(placeholder("x [default: {relay.slot_ttl}]"));
        for h in &filled {
            assert!(!placeholder(h), "unfilled placeholder in {h:?}");
        }
        let relay = crate::command()
            .find_subcommand_mut("relay")
            .unwrap()
            .render_help()
            .to_string();
        for shown in [
            "[default: 1 in cursor dispatch; in row dispatch 4, and 1 on SQLite,",
            "Claim lease, e.g. 60s [default: 60s] (relay.claim_lease)",
            "[default: 5m] (alerts.oldest_warning)",
            "[default: 127.0.0.1:9464] (metrics.listen)",
            "[default: kafka] (sink.kind)",
            "[default: cursor] (relay.dispatch)",
        ] {
            assert!(relay.contains(shown), "{shown:?} not in:\n{relay}");
        }
    }

    /// `ferry.example.toml` ("every key, with its default", also shown in docs/operations.md)
    /// writes the defaults the code uses.
    #[test]
    fn the_example_config_writes_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ferry.example.toml");
        let f = FileConfig::load(&path).unwrap_or_else(|e| panic!("{}", e.0));
        let (r, k, a) = (
            RelayConfig::default(),
            KafkaConfig::default(),
            AlertThresholds::default(),
        );
        let dur = |v: &Option<String>| parse_duration(v.as_deref().unwrap()).unwrap();
        assert_eq!(dur(&f.relay.claim_lease), r.claim_lease);
        assert_eq!(dur(&f.relay.slot_ttl), r.slot_ttl);
        assert_eq!(dur(&f.relay.heartbeat), r.heartbeat);
        assert_eq!(dur(&f.relay.poll_min), r.poll_min);
        assert_eq!(dur(&f.relay.poll_idle), r.poll_idle);
        assert_eq!(dur(&f.relay.backoff_base), r.backoff.base);
        assert_eq!(dur(&f.relay.backoff_max), r.backoff.max);
        assert_eq!(f.relay.max_attempts, Some(r.max_attempts));
        assert_eq!(dur(&f.relay.shutdown_timeout), r.shutdown_timeout);
        assert_eq!(f.sink.kind, Some(value_name(DEFAULT_SINK)));
        assert_eq!(f.sink.brokers, Some(k.brokers));
        assert_eq!(dur(&f.sink.message_timeout), k.message_timeout);
        assert_eq!(dur(&f.sink.linger), k.linger);
        assert_eq!(f.metrics.listen.as_deref(), Some(DEFAULT_METRICS_LISTEN));
        assert_eq!(dur(&f.alerts.slo_target), a.slo_target);
        assert_eq!(f.alerts.slo_ratio, Some(a.slo_ratio));
        assert_eq!(dur(&f.alerts.oldest_warning), a.oldest_warning);
        assert_eq!(dur(&f.alerts.oldest_critical), a.oldest_critical);
        assert_eq!(dur(&f.alerts.sink_stall), a.sink_stall);
        assert!(f.sink.allow_unsafe_properties.is_empty());
        assert_eq!(
            f.limits.max_payload_bytes,
            Some(Limits::default().max_payload_bytes)
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<FileConfig>("[relay]\nbatchsize = 5\n").unwrap_err();
        assert!(e.message().contains("batchsize"), "{}", e.message());
    }
}
