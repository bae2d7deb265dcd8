//! What the flags leave open (defaults that depend on other flags) and the combinations a
//! single value parser cannot see.
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use ferry_core::DispatchMode;
use ferry_store::Backend;

use super::parse::fmt_secs;
use super::{Args, Command, FlagValue, RelayMode, SinkKind};
use crate::spec::Preload;

impl Args {
    /// Parses the command line and checks flag combinations; exits with status 2 and one clear
    /// line on error.
    pub fn parse_checked() -> Self {
        let args = Self::parse();
        if let Err((kind, msg)) = args.check() {
            Self::command().error(kind, msg).exit();
        }
        args
    }

    /// The preloaded queue's shape with `loadgen burn-down`.
    pub fn preload(&self) -> Option<Preload> {
        match &self.command {
            Some(Command::BurnDown(b)) => Some(Preload {
                total: b.preload,
                per_aggregate: b.versions_per_aggregate.unwrap_or(1),
            }),
            _ => None,
        }
    }

    /// The dispatch mode: `--dispatch`, else the store's preferred one.
    pub fn dispatch(&self) -> DispatchMode {
        let preferred = || ferry_relay::preferred_dispatch(self.backend().as_str());
        self.relay.dispatch.unwrap_or_else(preferred)
    }

    /// Producer tasks: `--producers`, else the store's default.
    pub fn producer_tasks(&self) -> usize {
        self.work.producers.map_or(
            match self.backend() {
                // SQLite has one writer: more producers only queue on its lock.
                Backend::Sqlite => 2,
                // Server databases overlap commits (group commit); 8 keeps 2 cores busy.
                Backend::Postgres | Backend::Mysql => 8,
            },
            |p| p as usize,
        )
    }

    /// The drain timeout: `--drain-timeout`, else 300 s with --preload (the whole burn-down
    /// happens in the drain), 120 s with --chaos (a killed relay's claims wait out their
    /// 60 s lease before takeover), 60 s otherwise.
    pub fn drain_timeout(&self) -> Duration {
        self.run
            .drain_timeout
            .unwrap_or(if self.preload().is_some() {
                Duration::from_secs(300)
            } else if self.relay.chaos {
                Duration::from_secs(120)
            } else {
                Duration::from_secs(60)
            })
    }

    /// The per-interval table's interval: `--report-interval`, else the default for the load.
    pub fn report_interval(&self) -> Duration {
        self.run.report_interval.unwrap_or_else(|| {
            crate::intervals::default_interval(
                self.preload().is_none().then_some(self.run.duration),
            )
        })
    }

    /// The store, from `--store` or the URL's scheme.
    pub fn backend(&self) -> Backend {
        self.db
            .store
            .or_else(|| {
                self.db
                    .database_url
                    .as_deref()
                    .and_then(|u| Backend::from_url(u).ok())
            })
            .unwrap_or(Backend::Sqlite)
    }

    /// Checks combinations a single value parser cannot see.
    fn check(&self) -> Result<(), (ErrorKind, String)> {
        let conflict = |m: String| Err((ErrorKind::ArgumentConflict, m));
        if let Some(n) = &self.preload_moved {
            return conflict(format!(
                "the burn-down is a subcommand now: 'loadgen burn-down --preload {n}' (the other flags as before)"
            ));
        }
        if let Some(url) = &self.db.database_url {
            let Ok(from_url) = Backend::from_url(url) else {
                return Err((
                    ErrorKind::InvalidValue,
                    format!(
                        "invalid value '{}' for '--database-url': use postgres://, mysql:// (MariaDB) or sqlite://",
                        ferry_store::redact_url(url)
                    ),
                ));
            };
            if let Some(store) = self.db.store {
                if store != from_url {
                    return conflict(format!(
                        "'--store {}' does not match '--database-url' ({} URL)",
                        store.as_str(),
                        from_url.as_str()
                    ));
                }
            }
        } else if matches!(self.db.store, Some(Backend::Postgres | Backend::Mysql)) {
            return Err((
                ErrorKind::MissingRequiredArgument,
                format!(
                    "'--store {}' needs '--database-url', e.g. {}",
                    self.backend().as_str(),
                    if self.db.store == Some(Backend::Postgres) {
                        "postgres://postgres@127.0.0.1:5432/test"
                    } else {
                        "mysql://root@127.0.0.1:3306/test"
                    }
                ),
            ));
        }
        if self.retention.fold_orders && self.backend() != Backend::Postgres {
            return conflict(format!(
                "'--fold-orders' folds loadgen's business orders on PostgreSQL only (got '--store {}')",
                self.backend().as_str()
            ));
        }
        if self.sweep.chart.is_some()
            && self.sweep.sweep_batch.is_none()
            && self.sweep.sweep_relays.is_none()
        {
            return conflict(
                "'--chart' draws a sweep: add '--sweep-batch' or '--sweep-relays'".to_string(),
            );
        }
        if self.relay.chaos && self.relay.relay_mode != RelayMode::Process {
            return conflict(
                "'--chaos' kills relay processes: add '--relay-mode process'".to_string(),
            );
        }
        if self.kafka.kafka_brokers.is_some() && self.kafka.sink != SinkKind::Kafka {
            return conflict(format!(
                "'--kafka-brokers' only applies to '--sink kafka' (got '--sink {}')",
                self.kafka.sink.as_str()
            ));
        }
        if self.inbox.inbox && self.kafka.sink != SinkKind::Kafka {
            return conflict(format!(
                "'--inbox' consumes from Kafka: it needs '--sink kafka' (got '--sink {}')",
                self.kafka.sink.as_str()
            ));
        }
        if let Some(url) = &self.inbox.inbox_url {
            if ferry_store::Backend::from_url(url).is_err() {
                return Err((
                    ErrorKind::InvalidValue,
                    format!(
                        "invalid value '{}' for '--inbox-url': use postgres://, mysql:// (MariaDB) or sqlite://",
                        ferry_store::redact_url(url)
                    ),
                ));
            }
        }
        if self.kafka.sink == SinkKind::Stdout && self.relay.relay_mode == RelayMode::Process {
            return conflict(
                "'--sink stdout' with '--relay-mode process' would mix the relays' output into the log files; use it in-process".to_string(),
            );
        }
        if let Some(p) = self.preload() {
            if p.per_aggregate > p.total {
                return conflict(format!(
                    "'--versions-per-aggregate {}' exceeds '--preload {}': at most one aggregate with every preloaded version (K = N)",
                    p.per_aggregate, p.total
                ));
            }
        }
        let baseline_only = matches!(self.command, Some(Command::Baseline));
        if self.run.baseline_duration.is_some() && !self.run.baseline && !baseline_only {
            return Err((
                ErrorKind::MissingRequiredArgument,
                "'--baseline-duration' is the producer-only phase's length: add '--baseline' or run 'loadgen baseline'".to_string(),
            ));
        }
        if baseline_only
            && (self.run.compare.is_some()
                || self.sweep.sweep_batch.is_some()
                || self.sweep.sweep_relays.is_some())
        {
            return conflict(
                "'loadgen baseline' measures the producers alone: no '--compare' or sweep"
                    .to_string(),
            );
        }
        if self.preload().is_some() && self.run.compare.is_some() {
            return conflict(
                "'--compare' relates a load phase to a baseline; 'burn-down' has none".to_string(),
            );
        }
        if self.preload().is_some() && self.run.baseline {
            return conflict(
                "'--baseline' measures producers against a load phase; 'burn-down' has none (its preload line already states the producers' own rate)".to_string(),
            );
        }
        if self.work.producers_own_aggregates {
            if self.preload().is_some() {
                return conflict(
                    "'--producers-own-aggregates' shapes the load phase's picks; 'burn-down' hands out a fixed queue".to_string(),
                );
            }
            let producers = self.producer_tasks() as u64;
            if producers > self.work.aggregates {
                return conflict(format!(
                    "'--producers {producers}' exceeds '--aggregates {}': with '--producers-own-aggregates' every producer owns at least one aggregate",
                    self.work.aggregates
                ));
            }
        }
        // the table keeps two small histograms per interval: bound their number
        let span = match self.preload() {
            Some(_) => self.drain_timeout(),
            None => self.run.duration + self.drain_timeout(),
        };
        let interval = self.report_interval();
        let intervals = span.as_secs_f64() / interval.as_secs_f64();
        if intervals > crate::intervals::MAX_INTERVALS as f64 {
            return conflict(format!(
                "'--report-interval {}' makes {intervals:.0} intervals of the load and the drain timeout ({:.0}s); at most {}: choose a longer interval",
                fmt_secs(interval),
                span.as_secs_f64(),
                crate::intervals::MAX_INTERVALS
            ));
        }
        if self.kafka.broker_stall.is_some() {
            if self.kafka.sink != SinkKind::Kafka || self.kafka.kafka_brokers.is_some() {
                return conflict(
                    "'--broker-stall' takes the embedded mock cluster's brokers down: it needs '--sink kafka' without '--kafka-brokers'".to_string(),
                );
            }
            if self.preload().is_some() {
                return conflict(
                    "'--broker-stall' starts a third of the way into the load phase; 'burn-down' has none".to_string(),
                );
            }
            if self.sweep.sweep_batch.is_some() || self.sweep.sweep_relays.is_some() {
                return conflict("'--broker-stall' applies to one run, not to a sweep".to_string());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::*;
    use super::*;

    fn args(v: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("loadgen").chain(v.iter().copied())).unwrap()
    }

    fn parse(v: &[&str]) -> Result<(), (ErrorKind, String)> {
        args(v).check()
    }

    #[test]
    fn chaos_interval_needs_chaos() {
        assert!(rejected(&["--chaos-interval", "1s"]));
        let ok = [
            "--relay-mode",
            "process",
            "--chaos",
            "--chaos-interval",
            "1s",
        ];
        assert!(!rejected(&ok));
    }

    fn rejected(v: &[&str]) -> bool {
        Args::try_parse_from(std::iter::once("loadgen").chain(v.iter().copied())).is_err()
    }

    #[test]
    fn durations() {
        // the syntax is ferry's (ferry_core::parse_duration); loadgen adds the lower bound
        assert_eq!(
            args(&["--duration", "1.5s"]).run.duration,
            Duration::from_millis(1500)
        );
        assert!(rejected(&["--duration", "30"]));
        assert!(parse_duration_positive("0").is_err());
        assert!(parse_duration_positive("50ms")
            .unwrap_err()
            .contains("100ms"));
    }

    #[test]
    fn lists() {
        assert_eq!(
            parse_batch_list("1, 10,100").unwrap(),
            SweepValues(vec![1, 10, 100])
        );
        assert!(parse_batch_list("1").unwrap_err().contains("two values"));
        assert!(parse_relay_list("1,65").unwrap_err().contains("1..=64"));
        assert!(parse_relay_list("2,2").unwrap_err().contains("twice"));
    }

    #[test]
    fn combinations_name_the_flags() {
        let mysql_pg = ["--store", "mysql", "--database-url", "postgres://u:pw@h/db"];
        let bad_inbox = ["--inbox", "--inbox-url", "redis://u:pw@h"];
        let own = [
            "--producers-own-aggregates",
            "--aggregates",
            "3",
            "--producers",
            "4",
        ];
        let own_pg = [
            "--producers-own-aggregates",
            "--aggregates",
            "7",
            "--database-url",
            "postgres://u@h/db",
        ];
        let cases: [(&[&str], &str); 16] = [
            (&["--chart", "x.svg"], "--sweep-batch"),
            (&["--chaos"], "--relay-mode process"),
            (&["--store", "postgres"], "--database-url"),
            (&mysql_pg, "does not match"),
            (&["--database-url", "redis://u:pw@h"], "postgres://"),
            (
                &["--sink", "null", "--kafka-brokers", "h:9092"],
                "--kafka-brokers",
            ),
            (&own, "--producers 4"),
            // the default 8 producers on a server database
            (&own_pg, "--producers 8"),
            (
                &["--producers-own-aggregates", "burn-down", "--preload", "10"],
                "'burn-down'",
            ),
            (&["--broker-stall", "2s", "--sink", "null"], "--sink kafka"),
            (
                &["--broker-stall", "2s", "burn-down", "--preload", "100"],
                "load phase",
            ),
            (&["--broker-stall", "2s", "--sweep-batch", "1,10"], "sweep"),
            (&["--inbox", "--sink", "null"], "--sink kafka"),
            (&bad_inbox, "--inbox-url"),
            (
                &[
                    "burn-down",
                    "--preload",
                    "100",
                    "--versions-per-aggregate",
                    "101",
                ],
                "exceeds '--preload 100'",
            ),
            (
                &["burn-down", "--preload", "100", "--baseline"],
                "--baseline",
            ),
        ];
        for (flags, want) in [
            (&["--baseline-duration", "2s"][..], "loadgen baseline"),
            (&["baseline", "--compare", "b.json"], "no '--compare'"),
            (
                &["burn-down", "--preload", "10", "--compare", "b.json"],
                "'burn-down' has none",
            ),
        ] {
            let e = parse(flags).unwrap_err().1;
            assert!(e.contains(want), "{flags:?}: {e}");
        }
        assert!(parse(&["baseline", "--baseline-duration", "2s", "--json", "b.json"]).is_ok());
        assert!(parse(&["--compare", "b.json", "--duration", "5s"]).is_ok());
        assert!(rejected(&["--compare", "b.json", "--baseline"]));
        assert!(parse(&["--preload", "10"])
            .unwrap_err()
            .1
            .contains("loadgen burn-down --preload 10"));
        for (flags, want) in cases {
            let e = parse(flags).unwrap_err().1;
            assert!(e.contains(want) && !e.contains("pw"), "{flags:?}: {e}");
        }
        for ok in [
            &[][..],
            &["--inbox", "--inbox-url", "sqlite:///tmp/x.db"],
            &["burn-down", "--preload", "20000"],
            &[
                "burn-down",
                "--preload",
                "5000",
                "--versions-per-aggregate",
                "5000",
            ],
            &[
                "burn-down",
                "--preload",
                "5000",
                "--versions-per-aggregate",
                "7",
            ],
            // producers share aggregates: more producers than aggregates is fine
            &[
                "burn-down",
                "--preload",
                "100",
                "--aggregates",
                "2",
                "--producers",
                "4",
            ],
            &["--aggregates", "1", "--producers", "8"],
            &["--broker-stall", "3s"],
            &["--producers-own-aggregates", "--aggregates", "2"],
            // MariaDB takes either dispatch mode
            &[
                "--dispatch",
                "cursor",
                "--database-url",
                "mysql://u:pw@h/db",
            ],
            &[
                "--dispatch",
                "row",
                "--store",
                "mariadb",
                "--database-url",
                "mysql://u@h/db",
            ],
            &[
                "--dispatch",
                "cursor",
                "--database-url",
                "postgres://u@h/db",
            ],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &["--inbox-url", "sqlite://x.db"][..],
            &["--relays", "0"],
            &["--dispatch", "claims"],
            &["burn-down", "--preload", "0"],
            &["--store", "oracle"],
            &["--versions-per-aggregate", "0"],
            // the queue's shape belongs to `burn-down`
            &["--versions-per-aggregate", "5"],
            &["--poll-min", "0ms"],
            &["--poll-min", "2s"],
            &["--read-linger", "8d"],
            &["--read-interval", "2m"],
            &["--kafka-linger", "16m"],
            &["--aggregates", "10000001"],
            &["--broker-stall", "50ms"],
        ] {
            assert!(rejected(bad), "{bad:?}");
        }
    }

    #[test]
    fn retention_and_report_interval() {
        let a = args(&["--retention", "2s", "--purge-batch", "50"]);
        assert_eq!(a.retention.retention, Some(Duration::from_secs(2)));
        assert_eq!(a.retention.purge_batch, 50);
        assert_eq!(
            args(&[]).retention.purge_batch,
            crate::retention::DEFAULT_BATCH
        );
        // 0 and negative ages are refused with a reason
        assert!(parse_retention("0").unwrap_err().contains("longer than 0"));
        assert!(parse_retention("0s").unwrap_err().contains("longer than 0"));
        assert!(parse_retention("-5s").unwrap_err().contains("negative"));
        for bad in [
            &["--retention", "0"][..],
            &["--retention", "-1s"],
            &["--retention", "30"],
            &["--purge-batch", "10"],
            &["--retention", "1s", "--purge-batch", "0"],
            &["--report-interval", "50ms"],
            // --fold-orders needs --retention
            &["--fold-orders"],
        ] {
            assert!(rejected(bad), "{bad:?}");
        }
        // ... and PostgreSQL
        for store in [
            &[][..],
            &["--store", "mysql", "--database-url", "mysql://r@h/db"],
        ] {
            let e = parse(&[store, &["--retention", "2s", "--fold-orders"]].concat()).unwrap_err();
            assert!(e.1.contains("PostgreSQL only"), "{e:?}");
        }
        let pg = ["--store", "postgres", "--database-url", "postgres://u@h/db"];
        let a = args(&[&pg[..], &["--retention", "2s", "--fold-orders"]].concat());
        assert!(a.retention.fold_orders);
        // a burn-down with retention is allowed: purge deletes SENT rows only
        assert!(parse(&["--retention", "30s", "burn-down", "--preload", "1000"]).is_ok());
        assert!(parse(&["--retention", "30s", "--sink", "null", "--dispatch", "row"]).is_ok());
        // the report interval: 1/4 of the load, at least 1 s; 5 min from 15 min on
        assert_eq!(
            args(&["--duration", "12s"]).report_interval(),
            Duration::from_secs(3)
        );
        assert_eq!(
            args(&["--duration", "2s"]).report_interval(),
            Duration::from_secs(1)
        );
        assert_eq!(
            args(&["--duration", "2h"]).report_interval(),
            Duration::from_secs(300)
        );
        assert_eq!(
            args(&["burn-down", "--preload", "10"]).report_interval(),
            crate::intervals::PRELOAD_INTERVAL
        );
        assert_eq!(
            args(&["--report-interval", "2.5s"]).report_interval(),
            Duration::from_millis(2500)
        );
        // at most MAX_INTERVALS over the load and the drain timeout
        let e = parse(&["--duration", "1h", "--report-interval", "1s"])
            .unwrap_err()
            .1;
        assert!(
            e.contains("--report-interval 1s") && e.contains("3660"),
            "{e}"
        );
        assert!(parse(&["--duration", "1h", "--report-interval", "2s"]).is_ok());
    }

    #[test]
    fn defaults() {
        assert_eq!(
            args(&["--poll-min", "10ms"]).relay.poll_min,
            Some(Duration::from_millis(10))
        );
        assert_eq!(args(&[]).relay.poll_min, None);
        assert_eq!(args(&[]).dispatch(), DispatchMode::Cursor);
        assert_eq!(
            args(&["--database-url", "postgres://u@h/db"]).dispatch(),
            DispatchMode::Cursor
        );
        assert_eq!(
            args(&["--database-url", "mysql://u@h/db"]).dispatch(),
            DispatchMode::Cursor
        );
        assert_eq!(args(&["--dispatch", "row"]).dispatch(), DispatchMode::Row);
    }
}
