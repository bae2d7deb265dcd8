//! The flags' value parsers: each refuses a bad value with one line saying what it accepts.
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use ferry_core::parse_duration;
use ferry_testkit::workload::Skew;
use serde::Serialize;

/// Values of a sweep, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepValues(pub Vec<u32>);

/// `1.5s`, `300s`.
pub(super) fn fmt_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// `--skew`: one of [`Skew::NAMES`].
pub(super) fn parse_skew() -> impl TypedValueParser<Value = Skew> {
    PossibleValuesParser::new(Skew::NAMES)
        .map(|s| Skew::from_name(&s).expect("one of the possible values"))
}

/// `--preload` before the subcommand: refused with the new spelling.
pub(super) fn preload_moved(n: &str) -> Result<String, String> {
    Err(format!("the burn-down is a subcommand now: 'loadgen burn-down --preload {n}' (the other flags as before)"))
}

/// `--retention`: a positive age.
pub(super) fn parse_retention(s: &str) -> Result<Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "'{s}' is negative: the retention is the age past which delivered intents are deleted, e.g. 30s"
        ));
    }
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "'{s}' would delete every delivered intent at once: the retention must be longer than 0, e.g. 30s"
        ));
    }
    Ok(d)
}

pub(super) fn parse_duration_positive(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("duration '{s}' is too short: at least 100ms"));
    }
    Ok(d)
}

/// A relay wait (`--read-linger`, `--read-interval`): 0 up to 1m, so a typo is refused here (exit
/// 2) and not by the relay at start.
pub(super) fn parse_relay_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(60) {
        return Err(format!("'{s}' is out of range: at most 1m"));
    }
    Ok(d)
}

/// librdkafka's range for `linger.ms`: 0 to 15m.
pub(super) fn parse_kafka_linger(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > ferry_relay::MAX_KAFKA_LINGER {
        return Err(format!(
            "'{s}' is out of range: at most 15m (librdkafka's linger.ms)"
        ));
    }
    Ok(d)
}

/// 1ms up to the relay's idle poll delay (500ms), which `poll_min` may not exceed.
pub(super) fn parse_poll_min(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_millis(500) {
        return Err(format!(
            "'{s}' is out of range: between 1ms and 500ms (the relay's idle poll delay)"
        ));
    }
    Ok(d)
}

pub(super) fn parse_zipf_s(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 5.0 => Ok(v),
        _ => Err(format!(
            "expected a number greater than 0 and at most 5 (e.g. 0.8, 1.0, 1.2), got '{s}'"
        )),
    }
}

pub(super) fn parse_nonempty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.trim().to_string())
}

/// Kafka's topic rule ([`ferry_core::is_kafka_topic`], as every enqueue checks it).
pub(super) fn parse_topic(s: &str) -> Result<String, String> {
    if ferry_core::is_kafka_topic(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "a Kafka topic is 1 to 249 characters of letters, digits, '.', '_' and '-', got '{s}'"
        ))
    }
}

pub(super) fn parse_list(s: &str, lo: u32, hi: u32, example: &str) -> Result<SweepValues, String> {
    let bad = || {
        format!(
            "expected a comma-separated list of integers in {lo}..={hi}, e.g. {example}; got '{s}'"
        )
    };
    let mut out = Vec::new();
    for part in s.split(',') {
        let v: u32 = part.trim().parse().map_err(|_| bad())?;
        if !(lo..=hi).contains(&v) {
            return Err(bad());
        }
        if out.contains(&v) {
            return Err(format!("value {v} appears twice in '{s}'"));
        }
        out.push(v);
    }
    if out.len() < 2 {
        return Err(format!(
            "a sweep needs at least two values, e.g. {example}; got '{s}'"
        ));
    }
    Ok(SweepValues(out))
}

pub(super) fn parse_batch_list(s: &str) -> Result<SweepValues, String> {
    parse_list(s, 1, 10_000, "1,10,100,500,1000")
}

pub(super) fn parse_relay_list(s: &str) -> Result<SweepValues, String> {
    parse_list(s, 1, 64, "1,2,4,8")
}
