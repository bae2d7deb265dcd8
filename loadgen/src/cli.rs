//! Command-line flags. Every value is checked by a clap value parser, so a bad value prints one
//! line naming the flag and what it accepts; combinations are checked in [`Args::check`].
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{value_parser, CommandFactory, Parser, ValueEnum};
use ferry_core::{parse_duration, DispatchMode};
use ferry_store::Backend;
use serde::Serialize;

/// The flag spelling of a value (clap's name for it, as `ferry relay` takes it too).
pub trait FlagValue: ValueEnum {
    /// E.g. `postgres`, `kafka`, `cursor`.
    fn as_str(&self) -> String {
        let v = self.to_possible_value().expect("no value is skipped");
        v.get_name().to_string()
    }
}

impl<T: ValueEnum> FlagValue for T {}

/// Where relays send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Kafka: the in-process mock cluster, or `--kafka-brokers`. Verified by a consumer.
    Kafka,
    /// Acknowledge without sending: the engine and the database alone.
    Null,
    /// One JSON line per event on stdout (debugging; interleaves with the report).
    Stdout,
}

/// How aggregates are picked for each new order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Skew {
    /// Every aggregate equally likely.
    Uniform,
    /// Zipf-distributed hot keys (`--zipf-s`).
    Zipf,
}

/// Where relays run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RelayMode {
    /// `Relay` instances inside loadgen, each with its own owner id and connection pool.
    InProcess,
    /// `ferry relay` child processes (needed for `--chaos`).
    Process,
}

/// SQLite `synchronous` setting for every connection loadgen opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSync {
    /// fsync the WAL on every commit: a committed intent survives power loss (ferry's default).
    Full,
    /// Survives process crashes only; faster. Benchmarks only.
    Normal,
}

/// Values of a sweep, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepValues(pub Vec<u32>);

/// ferry load generator: commits orders and their outbox intents, relays them, reads them back
/// from Kafka and reports throughput, latency, loss and ordering.
///
/// With no arguments it runs for 30 s on a SQLite file in a temporary directory and the
/// in-process Kafka mock cluster. Exit code: 0 when nothing was lost and no aggregate was
/// reordered, 1 when the verification failed, 2 for bad flags, 3 when the run could not be
/// carried out (database unreachable, relay binary missing, ...).
#[derive(Debug, Clone, Parser)]
#[command(name = "loadgen", version, max_term_width = 100)]
pub struct Args {
    /// Length of the load phase (per point when sweeping): 30s, 500ms, 2m.
    /// Ignored with --preload (no load phase).
    #[arg(long, default_value = "30s", value_parser = parse_duration_positive)]
    pub duration: Duration,

    /// How long to wait after the load phase for every committed intent to be sent and
    /// consumed; with --inbox, also how long the Inbox consumer may go without applying a
    /// message while it catches up [default: 60s, 120s with --chaos, 300s with --preload (the
    /// whole burn-down must finish within it)].
    #[arg(long, value_parser = parse_duration_positive)]
    pub drain_timeout: Option<Duration>,

    /// Outbox database: sqlite (a fresh file in a temporary directory unless --database-url
    /// names one), postgres (a fresh schema per run) or mysql, alias mariadb (MariaDB 10.6+, a
    /// fresh database per run; MySQL is not supported) [default: from --database-url, else
    /// sqlite].
    #[arg(long, value_parser = PossibleValuesParser::new(["sqlite", "postgres", "mysql", "mariadb"])
        .map(|s| s.parse::<Backend>().expect("a listed database")))]
    pub store: Option<Backend>,

    /// Database URL (postgres://, mysql://, sqlite://). PostgreSQL gets a fresh schema and
    /// MariaDB a fresh database per run, dropped afterwards; an explicit SQLite file is emptied
    /// first, but only if it holds loadgen's own table or no outbox rows.
    #[arg(long, env = "LOADGEN_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Keep the run's schema/database/file afterwards (its URL is printed).
    #[arg(long)]
    pub keep_db: bool,

    /// SQLite durability: `full` (fsync per commit, ferry's default) or `normal`.
    #[arg(long, value_enum, default_value_t = SqliteSync::Full)]
    pub sqlite_synchronous: SqliteSync,

    /// PostgreSQL: run ANALYZE on the outbox 1 s into the load and then at this interval; 0
    /// disables it. A stand-in for autovacuum's analyze, whose one-minute naptime never comes
    /// round in a short run on a fresh schema: statistics keep the planner's estimates for the
    /// outbox realistic.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub pg_analyze_every: Duration,

    /// Producer tasks. They share the aggregates: any producer may pick any aggregate, and its
    /// transaction then holds that aggregate's row lock until it ends, so producers wait for
    /// (and deadlock with) each other; more producers than aggregates is fine [default: 2 on
    /// SQLite (one writer at a time), 8 on PostgreSQL/MySQL].
    #[arg(long, value_parser = value_parser!(u32).range(1..=256))]
    pub producers: Option<u32>,

    /// Orders (each with its outbox intent) per business transaction. The transaction takes
    /// each order's version from its aggregate's row (`UPDATE … SET ver = ver + 1`), aggregate
    /// after aggregate in random order, and keeps those rows locked until it ends: two
    /// transactions may lock the same aggregates in opposite orders and deadlock; the database
    /// rolls one back and it is retried with new versions (counted in the report's contention
    /// line).
    #[arg(long, default_value_t = 50, value_parser = value_parser!(u32).range(1..=10_000))]
    pub orders_per_tx: u32,

    /// Target enqueue rate in events/s over all producers; 0 = as fast as possible (always with
    /// --preload).
    #[arg(long, default_value_t = 0, value_parser = value_parser!(u64).range(0..=10_000_000))]
    pub rate: u64,

    /// Number of aggregates (orders) whose versions are produced, shared by every producer. Their
    /// business rows (`loadgen_aggregates`, one per aggregate) are created before the run:
    /// about 0.4 s per 100,000 on PostgreSQL and MariaDB.
    #[arg(long, default_value_t = 100_000, value_parser = value_parser!(u64).range(1..=10_000_000))]
    pub aggregates: u64,

    /// The uncontended shape: each producer picks among its own share of the aggregates
    /// (index modulo --producers), so no two producers touch the same aggregate and none ever
    /// waits for another's row lock (versions still come from the aggregates' rows). For
    /// measuring relay throughput on a few hot aggregates (--aggregates 10, --skew zipf), where
    /// shared aggregates make the producers themselves the bottleneck (PostgreSQL, 10
    /// aggregates, flat out, debug build: 2.5k ev/s committed shared, 19.6k with this flag).
    /// Needs --producers ≤ --aggregates; not with --preload.
    #[arg(long)]
    pub producers_own_aggregates: bool,

    /// Aggregate popularity: uniform, or zipf hot keys.
    #[arg(long, value_enum, default_value_t = Skew::Uniform)]
    pub skew: Skew,

    /// Zipf exponent s (with --skew zipf). Every producer draws over all N aggregates, so the
    /// hottest one is hot for all of them at once; with 1.0 it takes ~1/ln(N) of the traffic.
    /// With --producers-own-aggregates each of the P producers draws over its own N/P, so there
    /// are P equally hot keys, each taking ~1/(P·ln(N/P)).
    #[arg(long, default_value_t = 1.0, value_parser = parse_zipf_s, allow_negative_numbers = true)]
    pub zipf_s: f64,

    /// Payload size in bytes (valid JSON, padded to exactly this size; at most ferry's default
    /// payload limit, 983040).
    #[arg(long, default_value_t = 200, value_parser = value_parser!(u32).range(128..=983_040))]
    pub payload_bytes: u32,

    /// Where relays send: kafka (verified by a consumer), null or stdout.
    #[arg(long, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,

    /// An external Kafka bootstrap list instead of the in-process mock cluster. The topic is
    /// created through the admin API (--partitions) unless it exists; if that is refused, it
    /// must exist already or the broker must auto-create topics.
    #[arg(long, value_parser = parse_nonempty)]
    pub kafka_brokers: Option<String>,

    /// Topic to produce to [default: a fresh `loadgen-<run id>` per run]. With an external
    /// broker, an existing topic should be empty: old loadgen messages count as deliveries of
    /// events this run did not commit, messages without ferry headers as foreign.
    #[arg(long, value_parser = parse_topic)]
    pub topic: Option<String>,

    /// Partitions of the topic created on the mock cluster. More partitions keep more of the
    /// mock's ~5 MiB-per-partition retention between producer and verifier, but cost the mock
    /// CPU: it finds a fetch offset by walking the partition's message sets one by one.
    #[arg(long, default_value_t = 8, value_parser = value_parser!(u32).range(1..=1024))]
    pub partitions: u32,

    /// Competing relays over the same slots (each its own owner id).
    #[arg(long, default_value_t = 1, value_parser = value_parser!(u32).range(1..=64))]
    pub relays: u32,

    /// Dispatch mode of the relays: `cursor` (a durable cursor per slot; outbox rows are only
    /// INSERTed) or `row` (per-row claims: INSERT, claim UPDATE, SENT UPDATE). Passed to
    /// in-process relays and to `ferry relay --dispatch`; the outbox is put in this mode before
    /// anything is produced [default: cursor].
    #[arg(long, value_parser = PossibleValuesParser::new(["cursor", "row"])
        .map(|s| s.parse::<DispatchMode>().expect("a listed mode")))]
    pub dispatch: Option<DispatchMode>,

    /// Queue burn-down instead of a load phase: commit this many intents first, as fast as the
    /// producers can, with no relay running; then start the relays and time how long they take
    /// to drain the queue, from starting them (slot acquisition included) until every intent is
    /// SENT and, with a consumer, delivered. --duration, --rate, --aggregates and --skew do not
    /// apply (there is no load phase after the preload) and --baseline is refused;
    /// --drain-timeout bounds the burn-down [default then: 300s]. The producers take the
    /// queue's orders in blocks of --orders-per-tx from one counter and their versions from the
    /// aggregates' rows, as in a load phase: producers whose blocks hold versions of one
    /// aggregate contend for its row (all of them at once when --versions-per-aggregate exceeds
    /// --orders-per-tx).
    #[arg(long, value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub preload: Option<u64>,

    /// With --preload: versions per aggregate. The preload is --preload/K aggregates (the last
    /// one gets the remainder), each with versions 1..=K, committed close together in the
    /// queue; K = --preload makes one hot aggregate with every version, all producers
    /// contending for its row [default: 1].
    #[arg(long, value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub versions_per_aggregate: Option<u64>,

    /// Retention while the run goes on: delete delivered intents older than this age (e.g.
    /// 30s) the way production does, through ferry's own purge (the store's `purge_sent`,
    /// what `ferry purge --older-than <age>` runs: only SENT rows, by `sent_at` in row
    /// dispatch and by `created_at` in cursor dispatch, in DELETE statements of --purge-batch
    /// rows), every age/4 (at least 1s, at most 1m), on a connection pool of its own,
    /// concurrently with the producers and relays, until the drain ends. The verification
    /// stays exact: the rows each purge reports deleted are counted, and the store's checks
    /// compare rows + purged and SENT + purged with what the producers committed; in row
    /// dispatch without a consumer, the order of SENT marks is also checked before every
    /// purge. The report states rows purged, purge runs and statements, the time spent purging
    /// (total and µs per purged row), and the outbox's rows and size at the end against
    /// without retention. With --preload it purges during the burn-down: allowed because
    /// purge never deletes an undelivered row (PENDING, CLAIMED, QUARANTINED and SKIPPED are
    /// never touched), so the drain measures the relays with a purge competing, as an hourly
    /// `ferry purge` during a backlog would.
    #[arg(long, value_parser = parse_retention, allow_hyphen_values = true)]
    pub retention: Option<Duration>,

    /// Rows per DELETE statement of a --retention purge (`ferry purge --batch`).
    #[arg(long, default_value_t = crate::retention::DEFAULT_BATCH, requires = "retention",
        value_parser = value_parser!(u32).range(1..=100_000))]
    pub purge_batch: u32,

    /// Interval of the report's per-interval latency table (COMMIT → broker ack, tx start →
    /// consumed: count, p50, p99; the backlog at each interval's end; the first against the
    /// last interval's p99) [default: 5m when --duration is 15m or more, else --duration/4,
    /// at least 1s; with --preload 5s].
    #[arg(long, value_parser = parse_duration_positive)]
    pub report_interval: Option<Duration>,

    /// Run relays in this process or as `ferry relay` child processes.
    #[arg(long, value_enum, default_value_t = RelayMode::InProcess)]
    pub relay_mode: RelayMode,

    /// The `ferry` binary for --relay-mode process [default: `ferry` next to loadgen].
    #[arg(long)]
    pub ferry_bin: Option<PathBuf>,

    /// Extra argument passed to every `ferry relay` process (repeatable), e.g.
    /// --relay-arg=--claim-lease=10s --relay-arg=--kafka-message-timeout=5s (the Kafka message
    /// timeout must stay below the claim lease).
    #[arg(long = "relay-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub relay_args: Vec<String>,

    /// Shard workers per relay [default: the relay's for the dispatch mode: 1 in cursor
    /// dispatch; in row dispatch 1 on SQLite (one writer: more workers make more, smaller
    /// claim and ack transactions queue for it), 4 on PostgreSQL/MySQL].
    #[arg(long, value_parser = value_parser!(u32).range(1..=256))]
    pub workers: Option<u32>,

    /// Count the due rows claims skip as locked (`ferry relay --measure-contention`; on
    /// PostgreSQL a recount of every short claim, +40–90 % claim latency measured) [default: true
    /// with --relays > 1 or --sweep-relays, false otherwise: one relay owns every slot].
    #[arg(long)]
    pub measure_contention: Option<bool>,

    /// Maximum events per claim or cursor read [default: the relay's for the dispatch mode:
    /// 2000 in cursor dispatch, 500 in row dispatch].
    #[arg(long, value_parser = value_parser!(u32).range(1..=10_000))]
    pub batch_size: Option<u32>,

    /// Batches in flight per worker [default: the relay's for the dispatch mode: 4 in cursor
    /// dispatch, 2 in row dispatch].
    #[arg(long, value_parser = value_parser!(u32).range(1..=64))]
    pub in_flight: Option<u32>,

    /// Shortest wait of a relay worker after a partial read or claim, before it reads again
    /// (`ferry relay --poll-min`): longer waits make fuller batches and fewer cursor advances,
    /// at the cost of latency [default: the relay's, 2ms].
    #[arg(long, value_parser = parse_poll_min)]
    pub poll_min: Option<Duration>,

    /// Cursor dispatch: a relay worker's wait after a partial read of 16+ events, per other
    /// reader of the database (`ferry relay --read-linger`; 0ms turns it off) [default: the
    /// relay's, 25ms].
    #[arg(long, value_parser = parse_relay_wait)]
    pub read_linger: Option<Duration>,

    /// Cursor dispatch: after a partial read of 16+ events, a relay worker's next read starts
    /// no sooner than this after that read started (`ferry relay --read-interval`) [default:
    /// the relay's, 25ms on SQLite, 0ms on PostgreSQL and MariaDB].
    #[arg(long, value_parser = parse_relay_wait)]
    pub read_interval: Option<Duration>,

    /// The Kafka sink's `linger.ms` (`ferry relay --kafka-linger`; fractions such as 0.2ms are
    /// kept) [default: the relay's].
    #[arg(long, value_parser = parse_kafka_linger)]
    pub kafka_linger: Option<Duration>,

    /// First run the same producers flat out (ignoring --rate) with no relay, and state relay
    /// throughput as a ratio of that producer-only ceiling.
    #[arg(long)]
    pub baseline: bool,

    /// Length of the producer-only phase [default: --duration, at most 10s].
    #[arg(long, value_parser = parse_duration_positive, requires = "baseline")]
    pub baseline_duration: Option<Duration>,

    /// Run once per batch size (e.g. 1,10,100,500,1000), print a table, write a chart.
    #[arg(long, value_parser = parse_batch_list, conflicts_with = "sweep_relays")]
    pub sweep_batch: Option<SweepValues>,

    /// Run once per number of competing relays (e.g. 1,2,4,8): claim contention.
    #[arg(long, value_parser = parse_relay_list)]
    pub sweep_relays: Option<SweepValues>,

    /// SVG chart of a sweep [default: loadgen-sweep-<batch|relays>.svg].
    #[arg(long)]
    pub chart: Option<PathBuf>,

    /// SIGKILL a random relay process every --chaos-interval and restart it (needs
    /// --relay-mode process); loss and reordering must still be zero.
    #[arg(long)]
    pub chaos: bool,

    /// Also apply every consumed message through ferry's consumer Inbox (`apply_once`) with a
    /// real effect in the same transaction (tables loadgen_effects and loadgen_projection);
    /// the run fails unless every committed event's effect was applied exactly once.
    #[arg(long)]
    pub inbox: bool,

    /// The Inbox database (postgres://, mysql:// or sqlite://) [default: a fresh SQLite file
    /// in a temporary directory; its `synchronous` follows --sqlite-synchronous].
    #[arg(long, requires = "inbox", value_parser = parse_nonempty)]
    pub inbox_url: Option<String>,

    /// Inbox apply tasks; each aggregate always goes to the same task, so its versions are
    /// applied in delivery order. A SQLite Inbox has one connection that the tasks share.
    #[arg(long, default_value_t = 4, requires = "inbox", value_parser = value_parser!(u32).range(1..=64))]
    pub inbox_workers: u32,

    /// Time between chaos kills.
    #[arg(long, default_value = "3s", value_parser = parse_duration_positive, requires = "chaos")]
    pub chaos_interval: Duration,

    /// Take every broker of the embedded mock cluster down for this long, starting a third of
    /// the way into the load phase (e.g. 4s): relays, the verifier and the Inbox consumer lose
    /// their connections and reconnect once the brokers are back. A stall longer than the
    /// relays' Kafka message timeout (30s by default) makes sends time out, which the relays must
    /// resend in order. Needs the embedded cluster (no --kafka-brokers) and a load phase (no
    /// --preload).
    #[arg(long, value_parser = parse_duration_positive)]
    pub broker_stall: Option<Duration>,

    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// No live progress line on stderr.
    #[arg(long)]
    pub no_progress: bool,

    /// Seed of the workload's random choices (aggregates, amounts) [default: random].
    #[arg(long)]
    pub seed: Option<u64>,
}

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

    /// The dispatch mode: `--dispatch`, else the store's preferred one.
    pub fn dispatch(&self) -> DispatchMode {
        let preferred = || ferry_relay::preferred_dispatch(self.backend().as_str());
        self.dispatch.unwrap_or_else(preferred)
    }

    /// Producer tasks: `--producers`, else the store's default.
    pub fn producer_tasks(&self) -> usize {
        self.producers.map_or(
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
        self.drain_timeout.unwrap_or(if self.preload.is_some() {
            Duration::from_secs(300)
        } else if self.chaos {
            Duration::from_secs(120)
        } else {
            Duration::from_secs(60)
        })
    }

    /// The per-interval table's interval: `--report-interval`, else the default for the load.
    pub fn report_interval(&self) -> Duration {
        self.report_interval.unwrap_or_else(|| {
            crate::intervals::default_interval(self.preload.is_none().then_some(self.duration))
        })
    }

    /// The store, from `--store` or the URL's scheme.
    pub fn backend(&self) -> Backend {
        self.store
            .or_else(|| {
                self.database_url
                    .as_deref()
                    .and_then(|u| Backend::from_url(u).ok())
            })
            .unwrap_or(Backend::Sqlite)
    }

    /// Checks combinations a single value parser cannot see.
    fn check(&self) -> Result<(), (ErrorKind, String)> {
        let conflict = |m: String| Err((ErrorKind::ArgumentConflict, m));
        if let Some(url) = &self.database_url {
            let Ok(from_url) = Backend::from_url(url) else {
                return Err((
                    ErrorKind::InvalidValue,
                    format!(
                        "invalid value '{}' for '--database-url': use postgres://, mysql:// (MariaDB) or sqlite://",
                        ferry_store::redact_url(url)
                    ),
                ));
            };
            if let Some(store) = self.store {
                if store != from_url {
                    return conflict(format!(
                        "'--store {}' does not match '--database-url' ({} URL)",
                        store.as_str(),
                        from_url.as_str()
                    ));
                }
            }
        } else if matches!(self.store, Some(Backend::Postgres | Backend::Mysql)) {
            return Err((
                ErrorKind::MissingRequiredArgument,
                format!(
                    "'--store {}' needs '--database-url', e.g. {}",
                    self.backend().as_str(),
                    if self.store == Some(Backend::Postgres) {
                        "postgres://postgres@127.0.0.1:5432/test"
                    } else {
                        "mysql://root@127.0.0.1:3306/test"
                    }
                ),
            ));
        }
        if self.chart.is_some() && self.sweep_batch.is_none() && self.sweep_relays.is_none() {
            return conflict(
                "'--chart' draws a sweep: add '--sweep-batch' or '--sweep-relays'".to_string(),
            );
        }
        if self.chaos && self.relay_mode != RelayMode::Process {
            return conflict(
                "'--chaos' kills relay processes: add '--relay-mode process'".to_string(),
            );
        }
        if self.kafka_brokers.is_some() && self.sink != SinkKind::Kafka {
            return conflict(format!(
                "'--kafka-brokers' only applies to '--sink kafka' (got '--sink {}')",
                self.sink.as_str()
            ));
        }
        if self.inbox && self.sink != SinkKind::Kafka {
            return conflict(format!(
                "'--inbox' consumes from Kafka: it needs '--sink kafka' (got '--sink {}')",
                self.sink.as_str()
            ));
        }
        if let Some(url) = &self.inbox_url {
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
        if self.sink == SinkKind::Stdout && self.relay_mode == RelayMode::Process {
            return conflict(
                "'--sink stdout' with '--relay-mode process' would mix the relays' output into the log files; use it in-process".to_string(),
            );
        }
        match (self.preload, self.versions_per_aggregate) {
            (None, Some(_)) => {
                return Err((
                    ErrorKind::MissingRequiredArgument,
                    "'--versions-per-aggregate' shapes the preloaded queue: it needs '--preload N'"
                        .to_string(),
                ))
            }
            (Some(n), Some(k)) if k > n => {
                return conflict(format!(
                    "'--versions-per-aggregate {k}' exceeds '--preload {n}': at most one aggregate with every preloaded version (K = N)"
                ));
            }
            _ => {}
        }
        if self.preload.is_some() && self.baseline {
            return conflict(
                "'--baseline' measures producers against a load phase; '--preload' has none (its preload line already states the producers' own rate)".to_string(),
            );
        }
        if self.producers_own_aggregates {
            if self.preload.is_some() {
                return conflict(
                    "'--producers-own-aggregates' shapes the load phase's picks; '--preload' hands out a fixed queue".to_string(),
                );
            }
            let producers = self.producer_tasks() as u64;
            if producers > self.aggregates {
                return conflict(format!(
                    "'--producers {producers}' exceeds '--aggregates {}': with '--producers-own-aggregates' every producer owns at least one aggregate",
                    self.aggregates
                ));
            }
        }
        // the table keeps two small histograms per interval: bound their number
        let span = match self.preload {
            Some(_) => self.drain_timeout(),
            None => self.duration + self.drain_timeout(),
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
        if self.broker_stall.is_some() {
            if self.sink != SinkKind::Kafka || self.kafka_brokers.is_some() {
                return conflict(
                    "'--broker-stall' takes the embedded mock cluster's brokers down: it needs '--sink kafka' without '--kafka-brokers'".to_string(),
                );
            }
            if self.preload.is_some() {
                return conflict(
                    "'--broker-stall' starts a third of the way into the load phase; '--preload' has none".to_string(),
                );
            }
            if self.sweep_batch.is_some() || self.sweep_relays.is_some() {
                return conflict("'--broker-stall' applies to one run, not to a sweep".to_string());
            }
        }
        Ok(())
    }
}

/// `1.5s`, `300s`.
fn fmt_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// `--retention`: a positive age.
fn parse_retention(s: &str) -> Result<Duration, String> {
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

fn parse_duration_positive(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("duration '{s}' is too short: at least 100ms"));
    }
    Ok(d)
}

/// A relay wait (`--read-linger`, `--read-interval`): 0 up to 1m, so a typo is refused here (exit
/// 2) and not by the relay at start.
fn parse_relay_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(60) {
        return Err(format!("'{s}' is out of range: at most 1m"));
    }
    Ok(d)
}

/// librdkafka's range for `linger.ms`: 0 to 15m.
fn parse_kafka_linger(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > ferry_relay::MAX_KAFKA_LINGER {
        return Err(format!(
            "'{s}' is out of range: at most 15m (librdkafka's linger.ms)"
        ));
    }
    Ok(d)
}

/// 1ms up to the relay's idle poll delay (500ms), which `poll_min` may not exceed.
fn parse_poll_min(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_millis(500) {
        return Err(format!(
            "'{s}' is out of range: between 1ms and 500ms (the relay's idle poll delay)"
        ));
    }
    Ok(d)
}

fn parse_zipf_s(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 5.0 => Ok(v),
        _ => Err(format!(
            "expected a number greater than 0 and at most 5 (e.g. 0.8, 1.0, 1.2), got '{s}'"
        )),
    }
}

fn parse_nonempty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.trim().to_string())
}

/// Kafka's topic rule ([`ferry_core::is_kafka_topic`], as every enqueue checks it).
fn parse_topic(s: &str) -> Result<String, String> {
    if ferry_core::is_kafka_topic(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "a Kafka topic is 1 to 249 characters of letters, digits, '.', '_' and '-', got '{s}'"
        ))
    }
}

fn parse_list(s: &str, lo: u32, hi: u32, example: &str) -> Result<SweepValues, String> {
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

fn parse_batch_list(s: &str) -> Result<SweepValues, String> {
    parse_list(s, 1, 10_000, "1,10,100,500,1000")
}

fn parse_relay_list(s: &str) -> Result<SweepValues, String> {
    parse_list(s, 1, 64, "1,2,4,8")
}

#[cfg(test)]
mod tests {
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
            args(&["--duration", "1.5s"]).duration,
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
        let cases: [(&[&str], &str); 17] = [
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
                &["--producers-own-aggregates", "--preload", "10"],
                "--preload",
            ),
            (&["--broker-stall", "2s", "--sink", "null"], "--sink kafka"),
            (&["--broker-stall", "2s", "--preload", "100"], "load phase"),
            (&["--broker-stall", "2s", "--sweep-batch", "1,10"], "sweep"),
            (&["--inbox", "--sink", "null"], "--sink kafka"),
            (&bad_inbox, "--inbox-url"),
            (&["--versions-per-aggregate", "5"], "--preload"),
            (
                &["--preload", "100", "--versions-per-aggregate", "101"],
                "exceeds '--preload 100'",
            ),
            (&["--preload", "100", "--baseline"], "--baseline"),
        ];
        for (flags, want) in cases {
            let e = parse(flags).unwrap_err().1;
            assert!(e.contains(want) && !e.contains("pw"), "{flags:?}: {e}");
        }
        let (kind, _) = parse(&["--versions-per-aggregate", "5"]).unwrap_err();
        assert_eq!(kind, ErrorKind::MissingRequiredArgument);
        for ok in [
            &[][..],
            &["--inbox", "--inbox-url", "sqlite:///tmp/x.db"],
            &["--preload", "20000"],
            &["--preload", "5000", "--versions-per-aggregate", "5000"],
            &["--preload", "5000", "--versions-per-aggregate", "7"],
            // producers share aggregates: more producers than aggregates is fine
            &["--preload", "100", "--aggregates", "2", "--producers", "4"],
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
            &["--preload", "0"],
            &["--store", "oracle"],
            &["--versions-per-aggregate", "0"],
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
        assert_eq!(a.retention, Some(Duration::from_secs(2)));
        assert_eq!(a.purge_batch, 50);
        assert_eq!(args(&[]).purge_batch, crate::retention::DEFAULT_BATCH);
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
        ] {
            assert!(rejected(bad), "{bad:?}");
        }
        // a burn-down with retention is allowed: purge deletes SENT rows only
        assert!(parse(&["--retention", "30s", "--preload", "1000"]).is_ok());
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
            args(&["--preload", "10"]).report_interval(),
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
            args(&["--poll-min", "10ms"]).poll_min,
            Some(Duration::from_millis(10))
        );
        assert_eq!(args(&[]).poll_min, None);
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
