//! The help text's `[default: …]`: every `{placeholder}` a flag's help writes is filled in
//! from the defaults the code uses ([`document_defaults`]), so no default is written twice.
use std::time::Duration;

use clap::ValueEnum;
use ferry_core::DispatchMode;
use ferry_relay::metrics::AlertThresholds;
use ferry_relay::{KafkaConfig, RelayConfig, WorkerDefaults};
use ferry_store::Backend;

use crate::config::{default_dispatch, DEFAULT_METRICS_LISTEN, DEFAULT_SINK};

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
pub fn help_defaults() -> Vec<(&'static str, String)> {
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
        (
            "relay.retention_batch",
            ferry_core::PurgeRequest::DEFAULT_BATCH.to_string(),
        ),
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
    use ferry_core::parse_duration;

    use super::*;

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
}
