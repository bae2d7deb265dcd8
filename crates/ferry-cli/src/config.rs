//! Configuration: built-in defaults < TOML file (`--config`) < environment (`FERRY_*`) < flags.
//!
//! Every value is checked; a bad one produces one line naming the key and what is accepted.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// A configuration error: the key and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h`, `7d`, `0s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; use e.g. 500ms, 30s, 5m, 1h"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        "" => return Err(format!("{s:?} has no unit; use e.g. 500ms, 30s, 5m, 1h")),
        u => {
            return Err(format!(
                "{s:?} has unknown unit {u:?}; use ms, s, m, h or d"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
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
            "invalid metrics.listen {s:?}: use host:port, e.g. 127.0.0.1:9464"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("abc").is_err());
    }

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
            &r.backoff_base,
            &r.backoff_max,
            &r.shutdown_timeout,
            &f.sink.message_timeout,
            &f.sink.linger,
            &f.alerts.oldest_warning,
            &f.alerts.oldest_critical,
            &f.alerts.slo_target,
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
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<FileConfig>("[relay]\nbatchsize = 5\n").unwrap_err();
        assert!(e.message().contains("batchsize"), "{}", e.message());
    }
}
