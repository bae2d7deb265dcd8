//! Configuration: built-in defaults < TOML file (`--config`) < environment (`FERRY_*`) < flags.
//!
//! The layers merge by one rule, written here (clap reads a flag or else its `FERRY_*`
//! variable; [`pick`] takes that, else the file's key, else the default): the file, the
//! shared settings (`[alerts]`, `[limits]`) and the helpers each command resolves its flags
//! with (`ferry relay`'s in `cmd/relay/settings.rs`). Each default is written once: the
//! relay's come from the `Default` impls of `ferry-relay`/`ferry-core`, the command line's own
//! are the constants below, and the help text's `[default: …]` is filled in from the same
//! values (`help.rs`).
//!
//! Every value is checked; a bad one produces one line naming the key and what is accepted.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::ValueEnum;
use ferry_core::{parse_duration, DispatchMode, Limits};
use ferry_relay::metrics::AlertThresholds;
use ferry_store::Backend;
use serde::Deserialize;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log` (`FERRY_LOG`).
pub const DEFAULT_LOG: &str = "info";
/// `--log-format` (`FERRY_LOG_FORMAT`).
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// `sink.kind` (`--sink`).
pub const DEFAULT_SINK: SinkKind = SinkKind::Kafka;
/// `metrics.listen` (`--metrics-listen`).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
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
    pub retention: Option<String>,
    pub retention_batch: Option<usize>,
    pub retention_vacuum: Option<bool>,
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
/// The dispatch mode a relay on `backend` runs in when not told.
pub fn default_dispatch(backend: Backend) -> DispatchMode {
    ferry_relay::preferred_dispatch(backend.as_str())
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

#[cfg(test)]
mod tests {
    use ferry_relay::{KafkaConfig, RelayConfig};

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

    /// The help shows one default for relay.dispatch: it must hold on every SQL backend.
    #[test]
    fn the_default_dispatch_is_the_same_on_every_backend() {
        for b in [Backend::Mysql, Backend::Sqlite] {
            assert_eq!(default_dispatch(b), default_dispatch(Backend::Postgres));
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
        assert_eq!(
            f.sink.kind.as_deref().map(|k| SinkKind::from_str(k, true)),
            Some(Ok(DEFAULT_SINK))
        );
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
