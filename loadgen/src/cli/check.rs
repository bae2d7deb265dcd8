//! What the flags leave open (defaults that depend on other flags) and the combinations a
//! single value parser cannot see.
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use ferry_core::DispatchMode;
use ferry_store::Backend;

use super::parse::fmt_secs;
use super::{Args, Command, FlagValue, RelayMode};
use ferry_testkit::workload::Preload;

impl Args {
    /// Parses the command line and checks flag combinations; exits with status 2 and one clear
    /// line on error.
    pub fn parse_checked() -> Self {
        let args = Self::parse();
        if let Err((kind, msg)) = args.check() {
            Self::command().error(kind, msg).exit();
        }
        if let Err(msg) = args.check_outputs() {
            Self::command().error(ErrorKind::Io, msg).exit();
        }
        args
    }

    /// The files the run writes when it ends (`--json`, `--chart`), checked before it starts:
    /// a report lost to a mistyped directory at the end of an hour's run is refused now.
    fn check_outputs(&self) -> Result<(), String> {
        let outputs = [
            ("--json", self.run.json.as_deref()),
            ("--chart", self.sweep.chart.as_deref()),
        ];
        for (flag, path) in outputs {
            if let Some(path) = path {
                writable(path)
                    .map_err(|e| format!("cannot write {flag} {}: {e}", path.display()))?;
            }
        }
        Ok(())
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

    /// Checks the combinations clap's own `requires`/`conflicts_with` cannot express: those
    /// that depend on a value (`--sink`, `--relay-mode`, the store), on the subcommand, or on
    /// defaults. The first rule broken is the error.
    fn check(&self) -> Result<(), (ErrorKind, String)> {
        use ErrorKind::{ArgumentConflict as Conflict, MissingRequiredArgument as Missing};
        for (flag, url) in [
            ("--database-url", &self.db.database_url),
            ("--inbox-url", &self.inbox.inbox_url),
        ] {
            if let Some(url) = url.as_deref().filter(|u| Backend::from_url(u).is_err()) {
                let url = ferry_store::redact_url(url);
                return Err((
                    ErrorKind::InvalidValue,
                    format!("invalid value '{url}' for '{flag}': use postgres://, mysql:// (MariaDB) or sqlite://"),
                ));
            }
        }
        let (store, sink) = (self.backend().as_str(), self.kafka.sink.as_str());
        let from_url = self
            .db
            .database_url
            .as_deref()
            .and_then(|u| Backend::from_url(u).ok());
        let burn_down = self.preload();
        let (preload, per_aggregate) = burn_down.map_or((0, 0), |p| (p.total, p.per_aggregate));
        let baseline_cmd = matches!(self.command, Some(Command::Baseline));
        let sweep = self.sweep.sweep_batch.is_some() || self.sweep.sweep_relays.is_some();
        let own = self.work.producers_own_aggregates;
        let (producers, aggregates) = (self.producer_tasks() as u64, self.work.aggregates);
        // the table keeps two small histograms per interval: bound their number
        let span = self.drain_timeout() + burn_down.map_or(self.run.duration, |_| Duration::ZERO);
        let interval = self.report_interval();
        let intervals = span.as_secs_f64() / interval.as_secs_f64();
        let max = crate::intervals::MAX_INTERVALS;
        let stall = self.kafka.broker_stall.is_some();
        let rules = [
            (
                self.db.store.is_some() && from_url.is_some_and(|u| u.as_str() != store),
                Conflict,
                format!("'--store {store}' does not match '--database-url' ({} URL)", from_url.map_or("", Backend::as_str)),
            ),
            (
                self.relay.chaos && self.relay.relay_mode != RelayMode::Process,
                Conflict,
                "'--chaos' kills relay processes: add '--relay-mode process'".into(),
            ),
            (
                self.kafka.kafka_brokers.is_some() && sink != "kafka",
                Conflict,
                format!("'--kafka-brokers' only applies to '--sink kafka' (got '--sink {sink}')"),
            ),
            (
                self.retention.retention_in_relays
                    && (self.relay.relay_mode == RelayMode::Process || self.retention.fold_orders),
                Conflict,
                "'--retention-in-relays' counts the rows in-process relays purged, after they stopped: not with '--relay-mode process' (a process's count ends with it) or '--fold-orders' (loadgen's own step after each of its purges)".into(),
            ),
            (
                self.retention.retention_in_relays && sink != "kafka" && self.dispatch() == DispatchMode::Row,
                Conflict,
                format!("'--retention-in-relays' in row dispatch needs a consumer to check the order ('--sink kafka', got '--sink {sink}'): loadgen's own purger checks it before each purge"),
            ),
            (
                self.inbox.inbox && sink != "kafka",
                Conflict,
                format!("'--inbox' consumes from Kafka: it needs '--sink kafka' (got '--sink {sink}')"),
            ),
            (
                sink == "stdout" && self.relay.relay_mode == RelayMode::Process,
                Conflict,
                "'--sink stdout' with '--relay-mode process' would mix the relays' output into the log files; use it in-process".into(),
            ),
            (
                per_aggregate > preload,
                Conflict,
                format!("'--versions-per-aggregate {per_aggregate}' exceeds '--preload {preload}': at most one aggregate with every preloaded version (K = N)"),
            ),
            (
                self.run.baseline_duration.is_some() && !self.run.baseline && !baseline_cmd,
                Missing,
                "'--baseline-duration' is the producer-only phase's length: add '--baseline' or run 'loadgen baseline'".into(),
            ),
            (
                baseline_cmd && (self.run.compare.is_some() || sweep),
                Conflict,
                "'loadgen baseline' measures the producers alone: no '--compare' or sweep".into(),
            ),
            (
                burn_down.is_some() && self.run.compare.is_some(),
                Conflict,
                "'--compare' relates a load phase to a baseline; 'burn-down' has none".into(),
            ),
            (
                burn_down.is_some() && self.run.baseline,
                Conflict,
                "'--baseline' measures producers against a load phase; 'burn-down' has none (its preload line already states the producers' own rate)".into(),
            ),
            (
                own && burn_down.is_some(),
                Conflict,
                "'--producers-own-aggregates' shapes the load phase's picks; 'burn-down' hands out a fixed queue".into(),
            ),
            (
                own && producers > aggregates,
                Conflict,
                format!("'--producers {producers}' exceeds '--aggregates {aggregates}': with '--producers-own-aggregates' every producer owns at least one aggregate"),
            ),
            (
                intervals > max as f64,
                Conflict,
                format!("'--report-interval {}' makes {intervals:.0} intervals of the load and the drain timeout ({:.0}s); at most {max}: choose a longer interval", fmt_secs(interval), span.as_secs_f64()),
            ),
            (
                stall && sink != "kafka",
                Conflict,
                "'--broker-stall' takes the embedded mock cluster's brokers down: it needs '--sink kafka' without '--kafka-brokers'".into(),
            ),
            (
                stall && burn_down.is_some(),
                Conflict,
                "'--broker-stall' starts a third of the way into the load phase; 'burn-down' has none".into(),
            ),
        ];
        match rules.into_iter().find(|(broken, ..)| *broken) {
            Some((_, kind, msg)) => Err((kind, msg)),
            None => Ok(()),
        }
    }
}

/// Whether `path` can be written: opened for appending, created if missing and then removed.
fn writable(path: &std::path::Path) -> std::io::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    if !existed {
        std::fs::remove_file(path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::parse::*;
    use super::*;

    fn try_args(flags: &str) -> Result<Args, clap::Error> {
        let argv = std::iter::once("loadgen").chain(flags.split_whitespace());
        Args::try_parse_from(argv)
    }

    fn args(flags: &str) -> Args {
        try_args(flags).unwrap()
    }

    /// The error the flags make, clap's or [`Args::check`]'s; `None` when they are accepted.
    fn error(flags: &str) -> Option<String> {
        match try_args(flags) {
            Err(e) => Some(e.to_string()),
            Ok(a) => a.check().err().map(|(_, msg)| msg),
        }
    }

    /// `--json` and `--chart` are checked before the run: a missing directory or a directory
    /// in the file's place is refused, naming the flag; a writable path is left as it was.
    #[test]
    fn output_files_are_checked_before_the_run() {
        let dir = ferry_testkit::TempDir::new("loadgen-outputs").unwrap();
        let d = dir.path().display();
        for (flags, want) in [
            (format!("--json {d}/missing/r.json"), "--json"),
            (format!("--json {d}"), "--json"),
            (
                format!("--sweep-batch 1,10 --chart {d}/no/c.svg"),
                "--chart",
            ),
        ] {
            let e = args(&flags).check_outputs().unwrap_err();
            assert!(
                e.contains(want) && e.contains(&*d.to_string()),
                "{flags}: {e}"
            );
        }
        let ok = dir.path().join("r.json");
        args(&format!("--json {}", ok.display()))
            .check_outputs()
            .unwrap();
        assert!(!ok.exists(), "the check left {}", ok.display());
        std::fs::write(&ok, "kept").unwrap();
        args(&format!("--json {}", ok.display()))
            .check_outputs()
            .unwrap();
        assert_eq!(std::fs::read_to_string(&ok).unwrap(), "kept");
    }

    /// The `loadgen …` command lines of README.md and docs/*.md use `loadgen`'s own flags.
    #[test]
    fn documented_command_lines_use_real_flags() {
        ferry_testkit::assert_documented_command_lines!(Args::command(), "loadgen");
    }

    #[test]
    fn durations_and_lists() {
        // the syntax is ferry's (ferry_core::parse_duration); loadgen adds the lower bound
        assert_eq!(
            args("--duration 1.5s").run.duration,
            Duration::from_millis(1500)
        );
        assert!(parse_duration_positive("0").is_err());
        assert!(parse_duration_positive("50ms")
            .unwrap_err()
            .contains("100ms"));
        assert_eq!(
            parse_batch_list("1, 10,100").unwrap(),
            SweepValues(vec![1, 10, 100])
        );
        assert!(parse_batch_list("1").unwrap_err().contains("two values"));
        assert!(parse_relay_list("1,65").unwrap_err().contains("1..=64"));
        assert!(parse_relay_list("2,2").unwrap_err().contains("twice"));
        // 0 and negative ages are refused with a reason
        assert!(parse_retention("0").unwrap_err().contains("longer than 0"));
        assert!(parse_retention("0s").unwrap_err().contains("longer than 0"));
        assert!(parse_retention("-5s").unwrap_err().contains("negative"));
    }

    /// Each rule: the flags that break it and what the error must say (naming the flags, never
    /// a password).
    #[test]
    fn combinations_name_the_flags() {
        for (flags, want) in [
            ("--chart x.svg", "--sweep-batch"),
            ("--chaos", "--relay-mode process"),
            ("--chaos-interval 1s", "--chaos"),
            ("--store postgres", "--database-url"),
            (
                "--store mysql --database-url postgres://u:pw@h/db",
                "does not match",
            ),
            ("--database-url redis://u:pw@h", "postgres://"),
            ("--sink null --kafka-brokers h:9092", "--kafka-brokers"),
            (
                "--producers-own-aggregates --aggregates 3 --producers 4",
                "--producers 4",
            ),
            // the default 8 producers on a server database
            (
                "--producers-own-aggregates --aggregates 7 --database-url postgres://u@h/db",
                "--producers 8",
            ),
            (
                "--producers-own-aggregates burn-down --preload 10",
                "'burn-down'",
            ),
            ("--broker-stall 2s --sink null", "--sink kafka"),
            (
                "--broker-stall 2s --kafka-brokers h:9092",
                "--kafka-brokers",
            ),
            ("--broker-stall 2s burn-down --preload 100", "load phase"),
            ("--broker-stall 2s --sweep-batch 1,10", "--sweep-batch"),
            ("--sweep-batch 1,10 --sweep-relays 1,2", "--sweep-relays"),
            ("--inbox --sink null", "--sink kafka"),
            ("--inbox --inbox-url redis://u:pw@h", "--inbox-url"),
            ("--inbox-url sqlite://x.db", "--inbox"),
            ("--sink stdout --relay-mode process", "in-process"),
            (
                "burn-down --preload 100 --versions-per-aggregate 101",
                "exceeds '--preload 100'",
            ),
            ("burn-down --preload 100 --baseline", "--baseline"),
            ("--baseline-duration 2s", "loadgen baseline"),
            ("baseline --compare b.json", "no '--compare'"),
            (
                "burn-down --preload 10 --compare b.json",
                "'burn-down' has none",
            ),
            ("--compare b.json --baseline", "--baseline"),
            ("--preload 10", "loadgen burn-down --preload 10"),
            ("--fold-orders", "--retention"),
            // at most MAX_INTERVALS over the load and the drain timeout
            (
                "--duration 1h --report-interval 1s",
                "'--report-interval 1s' makes 3660 intervals",
            ),
        ] {
            let e = error(flags).unwrap_or_else(|| panic!("{flags}: accepted"));
            assert!(e.contains(want) && !e.contains("pw"), "{flags}: {e}");
        }
        for ok in [
            "",
            "--relay-mode process --chaos --chaos-interval 1s",
            "--inbox --inbox-url sqlite:///tmp/x.db",
            "burn-down --preload 20000",
            "burn-down --preload 5000 --versions-per-aggregate 5000",
            "burn-down --preload 5000 --versions-per-aggregate 7",
            // producers share aggregates: more producers than aggregates is fine
            "burn-down --preload 100 --aggregates 2 --producers 4",
            "--aggregates 1 --producers 8",
            "--broker-stall 3s",
            "--producers-own-aggregates --aggregates 2",
            "--sweep-relays 1,2 --chart x.svg",
            "burn-down --preload 10 --sweep-batch 1,10 --chart x.svg",
            "baseline --baseline-duration 2s --json b.json",
            "--compare b.json --duration 5s",
            // MariaDB takes either dispatch mode
            "--dispatch cursor --database-url mysql://u:pw@h/db",
            "--dispatch row --store mariadb --database-url mysql://u@h/db",
            "--dispatch cursor --database-url postgres://u@h/db",
            "--store postgres --database-url postgres://u@h/db --retention 2s --fold-orders",
            "--retention 2s --fold-orders",
            "--store mysql --database-url mysql://r@h/db --retention 2s --fold-orders",
            // a burn-down with retention is allowed: purge deletes SENT rows only
            "--retention 30s burn-down --preload 1000",
            "--retention 30s --sink null --dispatch row",
            "--duration 1h --report-interval 2s",
        ] {
            assert_eq!(error(ok), None, "{ok}");
        }
        for bad in [
            "--duration 30",
            "--relays 0",
            "--dispatch claims",
            "burn-down --preload 0",
            "--store oracle",
            "--versions-per-aggregate 0",
            // the queue's shape belongs to `burn-down`
            "--versions-per-aggregate 5",
            "--poll-min 0ms",
            "--poll-min 2s",
            "--read-linger 8d",
            "--read-interval 2m",
            "--kafka-linger 16m",
            "--aggregates 10000001",
            "--broker-stall 50ms",
            "--retention 0",
            "--retention -1s",
            "--retention 30",
            "--purge-batch 10",
            "--retention 1s --purge-batch 0",
            "--report-interval 50ms",
        ] {
            assert!(try_args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults() {
        let a = args("--retention 2s --purge-batch 50");
        assert_eq!(a.retention.retention, Some(Duration::from_secs(2)));
        assert_eq!(a.retention.purge_batch, 50);
        assert_eq!(
            args("").retention.purge_batch,
            crate::cli::DEFAULT_PURGE_BATCH
        );
        // the report interval: 1/4 of the load, at least 1 s; 5 min from 15 min on
        for (flags, secs) in [
            ("--duration 12s", 3.0),
            ("--duration 2s", 1.0),
            ("--duration 2h", 300.0),
            (
                "burn-down --preload 10",
                crate::intervals::PRELOAD_INTERVAL.as_secs_f64(),
            ),
            ("--report-interval 2.5s", 2.5),
        ] {
            assert_eq!(args(flags).report_interval().as_secs_f64(), secs, "{flags}");
        }
        assert_eq!(
            args("--poll-min 10ms").relay.poll_min,
            Some(Duration::from_millis(10))
        );
        assert_eq!(args("").relay.poll_min, None);
        for (flags, mode) in [
            ("", DispatchMode::Cursor),
            ("--database-url postgres://u@h/db", DispatchMode::Cursor),
            ("--database-url mysql://u@h/db", DispatchMode::Cursor),
            ("--dispatch row", DispatchMode::Row),
        ] {
            assert_eq!(args(flags).dispatch(), mode, "{flags}");
        }
    }
}
