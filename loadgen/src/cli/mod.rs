//! Command-line flags. Every value is checked by a clap value parser, so a bad value prints one
//! line naming the flag and what it accepts; combinations are checked in [`Args::check`]. The
//! flags come in groups by concern (`#[command(flatten)]`), each under its own `--help` heading.
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{value_parser, Parser, ValueEnum};
use ferry_core::{parse_duration, DispatchMode};
use ferry_store::Backend;
use ferry_testkit::workload::Skew;
use serde::Serialize;

pub use self::parse::SweepValues;
use self::parse::*;

mod check;
mod parse;

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

/// ferry load generator: commits orders and their outbox intents, relays them, reads them back
/// from Kafka and reports throughput, latency, loss and ordering.
///
/// With no arguments it runs for 30 s on a SQLite file in a temporary directory and the
/// in-process Kafka mock cluster. Exit code: 0 when nothing was lost and no aggregate was
/// reordered, 1 when the verification failed, 2 for bad flags, 3 when the run could not be
/// carried out (database unreachable, relay binary missing, ...).
///
/// `loadgen burn-down --preload N` drains a preloaded queue instead of running a load phase;
/// every flag below applies to it too, after the subcommand's name.
#[derive(Debug, Clone, Parser)]
#[command(name = "loadgen", version, max_term_width = 100)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `--preload` before `burn-down`: refused with the new spelling.
    #[arg(long = "preload", hide = true, value_parser = preload_moved)]
    pub preload_moved: Option<String>,
    #[command(flatten)]
    pub run: RunFlags,
    #[command(flatten)]
    pub db: DbFlags,
    #[command(flatten)]
    pub work: WorkloadFlags,
    #[command(flatten)]
    pub kafka: KafkaFlags,
    #[command(flatten)]
    pub relay: RelayFlags,
    #[command(flatten)]
    pub retention: RetentionFlags,
    #[command(flatten)]
    pub inbox: InboxFlags,
    #[command(flatten)]
    pub sweep: SweepFlags,
}

/// The run as a whole: its length, the baseline, the output.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Run")]
pub struct RunFlags {
    /// Length of the load phase (per point when sweeping): 30s, 500ms, 2m.
    /// Ignored by burn-down (no load phase).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration_positive)]
    pub duration: Duration,

    /// How long to wait after the load phase for every committed intent to be sent and
    /// consumed; with --inbox, also how long the Inbox consumer may go without applying a
    /// message while it catches up [default: 60s, 120s with --chaos, 300s for burn-down (the
    /// whole burn-down must finish within it)].
    #[arg(long, global = true, value_parser = parse_duration_positive)]
    pub drain_timeout: Option<Duration>,

    /// Interval of the report's per-interval latency table (COMMIT → broker ack, tx start →
    /// consumed: count, p50, p99; the backlog at each interval's end; the first against the
    /// last interval's p99) [default: 5m when --duration is 15m or more, else --duration/4,
    /// at least 1s; 5s for burn-down].
    #[arg(long, global = true, value_parser = parse_duration_positive)]
    pub report_interval: Option<Duration>,

    /// First run the same producers flat out (ignoring --rate) with no relay, and state relay
    /// throughput as a ratio of that producer-only ceiling.
    #[arg(long, global = true)]
    pub baseline: bool,

    /// Length of the producer-only phase (--baseline, `loadgen baseline`) [default: --duration,
    /// at most 10s].
    #[arg(long, global = true, value_parser = parse_duration_positive)]
    pub baseline_duration: Option<Duration>,

    /// State relay throughput as a ratio of a producer-only baseline saved earlier by
    /// `loadgen baseline --json FILE` (instead of measuring one first, as --baseline does).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "baseline")]
    pub compare: Option<PathBuf>,

    /// Seed of the workload's random choices (aggregates, amounts) [default: random].
    #[arg(long, global = true)]
    pub seed: Option<u64>,

    /// Also write the report as JSON to this file.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,

    /// No live progress line on stderr.
    #[arg(long, global = true)]
    pub no_progress: bool,
}

/// The outbox database.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Database")]
pub struct DbFlags {
    /// Outbox database: sqlite (a fresh file in a temporary directory unless --database-url
    /// names one), postgres (a fresh schema per run) or mysql, alias mariadb (MariaDB 10.6+, a
    /// fresh database per run; MySQL is not supported) [default: from --database-url, else
    /// sqlite].
    #[arg(long, global = true, value_parser = PossibleValuesParser::new(["sqlite", "postgres", "mysql", "mariadb"])
        .map(|s| s.parse::<Backend>().expect("a listed database")))]
    pub store: Option<Backend>,

    /// Database URL (postgres://, mysql://, sqlite://). PostgreSQL gets a fresh schema and
    /// MariaDB a fresh database per run, dropped afterwards; an explicit SQLite file is emptied
    /// first, but only if it holds loadgen's own table or no outbox rows.
    #[arg(long, global = true, env = "LOADGEN_DATABASE_URL", hide_env_values = true,
        required_if_eq_any = [("store", "postgres"), ("store", "mysql"), ("store", "mariadb")])]
    pub database_url: Option<String>,

    /// Keep the run's schema/database/file afterwards (its URL is printed).
    #[arg(long, global = true)]
    pub keep_db: bool,

    /// SQLite durability: `full` (fsync per commit, ferry's default) or `normal`.
    #[arg(long, global = true, value_enum, default_value_t = SqliteSync::Full)]
    pub sqlite_synchronous: SqliteSync,

    /// PostgreSQL: run ANALYZE on the outbox 1 s into the load and then at this interval; 0
    /// disables it. A stand-in for autovacuum's analyze, whose one-minute naptime never comes
    /// round in a short run on a fresh schema: statistics keep the planner's estimates for the
    /// outbox realistic.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub pg_analyze_every: Duration,
}

/// What the producers commit.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Workload")]
pub struct WorkloadFlags {
    /// Producer tasks. They share the aggregates: any producer may pick any aggregate, and its
    /// transaction then holds that aggregate's row lock until it ends, so producers wait for
    /// (and deadlock with) each other; more producers than aggregates is fine [default: 2 on
    /// SQLite (one writer at a time), 8 on PostgreSQL/MySQL].
    #[arg(long, global = true, value_parser = value_parser!(u32).range(1..=256))]
    pub producers: Option<u32>,

    /// Orders (each with its outbox intent) per business transaction. The transaction takes
    /// each order's version from its aggregate's row (`UPDATE … SET ver = ver + 1`), aggregate
    /// after aggregate in random order, and keeps those rows locked until it ends: two
    /// transactions may lock the same aggregates in opposite orders and deadlock; the database
    /// rolls one back and it is retried with new versions (counted in the report's contention
    /// line).
    #[arg(long, global = true, default_value_t = 50, value_parser = value_parser!(u32).range(1..=10_000))]
    pub orders_per_tx: u32,

    /// Target enqueue rate in events/s over all producers; 0 = as fast as possible (always in a
    /// burn-down).
    #[arg(long, global = true, default_value_t = 0, value_parser = value_parser!(u64).range(0..=10_000_000))]
    pub rate: u64,

    /// Number of aggregates (orders) whose versions are produced, shared by every producer. Their
    /// business rows (`loadgen_aggregates`, one per aggregate) are created before the run:
    /// about 0.4 s per 100,000 on PostgreSQL and MariaDB.
    #[arg(long, global = true, default_value_t = 100_000, value_parser = value_parser!(u64).range(1..=10_000_000))]
    pub aggregates: u64,

    /// The uncontended shape: each producer picks among its own share of the aggregates
    /// (index modulo --producers), so no two producers touch the same aggregate and none ever
    /// waits for another's row lock (versions still come from the aggregates' rows). For
    /// measuring relay throughput on a few hot aggregates (--aggregates 10, --skew zipf), where
    /// shared aggregates make the producers themselves the bottleneck (PostgreSQL, 10
    /// aggregates, flat out, debug build: 2.5k ev/s committed shared, 19.6k with this flag).
    /// Needs --producers ≤ --aggregates; not with burn-down.
    #[arg(long, global = true)]
    pub producers_own_aggregates: bool,

    /// Aggregate popularity: uniform (every aggregate equally likely), or zipf hot keys
    /// (--zipf-s).
    #[arg(long, global = true, default_value = "uniform", value_parser = parse_skew())]
    pub skew: Skew,

    /// Zipf exponent s (with --skew zipf). Every producer draws over all N aggregates, so the
    /// hottest one is hot for all of them at once; with 1.0 it takes ~1/ln(N) of the traffic.
    /// With --producers-own-aggregates each of the P producers draws over its own N/P, so there
    /// are P equally hot keys, each taking ~1/(P·ln(N/P)).
    #[arg(long, global = true, default_value_t = 1.0, value_parser = parse_zipf_s, allow_negative_numbers = true)]
    pub zipf_s: f64,

    /// Payload size in bytes (valid JSON, padded to exactly this size; at most ferry's default
    /// payload limit, 983040).
    #[arg(long, global = true, default_value_t = 200, value_parser = value_parser!(u32).range(128..=983_040))]
    pub payload_bytes: u32,
}

/// Where the relays send.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Sink and Kafka")]
pub struct KafkaFlags {
    /// Where relays send: kafka (verified by a consumer), null or stdout.
    #[arg(long, global = true, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,

    /// An external Kafka bootstrap list instead of the in-process mock cluster. The topic is
    /// created through the admin API (--partitions) unless it exists; if that is refused, it
    /// must exist already or the broker must auto-create topics.
    #[arg(long, global = true, value_parser = parse_nonempty)]
    pub kafka_brokers: Option<String>,

    /// Topic to produce to [default: a fresh `loadgen-<run id>` per run]. With an external
    /// broker, an existing topic should be empty: old loadgen messages count as deliveries of
    /// events this run did not commit, messages without ferry headers as foreign.
    #[arg(long, global = true, value_parser = parse_topic)]
    pub topic: Option<String>,

    /// Partitions of the topic created on the mock cluster. More partitions keep more of the
    /// mock's ~5 MiB-per-partition retention between producer and verifier, but cost the mock
    /// CPU: it finds a fetch offset by walking the partition's message sets one by one.
    #[arg(long, global = true, default_value_t = 8, value_parser = value_parser!(u32).range(1..=1024))]
    pub partitions: u32,

    /// Take every broker of the embedded mock cluster down for this long, starting a third of
    /// the way into the load phase (e.g. 4s): relays, the verifier and the Inbox consumer lose
    /// their connections and reconnect once the brokers are back. A stall longer than the
    /// relays' Kafka message timeout (30s by default) makes sends time out, which the relays must
    /// resend in order. Needs the embedded cluster (no --kafka-brokers) and a load phase (not
    /// burn-down).
    #[arg(long, global = true, value_parser = parse_duration_positive,
        conflicts_with_all = ["kafka_brokers", "sweep_batch", "sweep_relays"])]
    pub broker_stall: Option<Duration>,
}

/// How the relays run.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Relays")]
pub struct RelayFlags {
    /// Competing relays over the same slots (each its own owner id).
    #[arg(long, global = true, default_value_t = 1, value_parser = value_parser!(u32).range(1..=64))]
    pub relays: u32,

    /// Dispatch mode of the relays: `cursor` (a durable cursor per slot; outbox rows are only
    /// INSERTed) or `row` (per-row claims: INSERT, claim UPDATE, SENT UPDATE). Passed to
    /// in-process relays and to `ferry relay --dispatch`; the outbox is put in this mode before
    /// anything is produced [default: cursor].
    #[arg(long, global = true, value_parser = PossibleValuesParser::new(["cursor", "row"])
        .map(|s| s.parse::<DispatchMode>().expect("a listed mode")))]
    pub dispatch: Option<DispatchMode>,

    /// Run relays in this process or as `ferry relay` child processes.
    #[arg(long, global = true, value_enum, default_value_t = RelayMode::InProcess)]
    pub relay_mode: RelayMode,

    /// The `ferry` binary for --relay-mode process [default: `ferry` next to loadgen].
    #[arg(long, global = true)]
    pub ferry_bin: Option<PathBuf>,

    /// Extra argument passed to every `ferry relay` process (repeatable), e.g.
    /// --relay-arg=--claim-lease=10s --relay-arg=--kafka-message-timeout=5s (the Kafka message
    /// timeout must stay below the claim lease).
    #[arg(
        long = "relay-arg",
        global = true,
        allow_hyphen_values = true,
        value_name = "ARG"
    )]
    pub relay_args: Vec<String>,

    /// Shard workers per relay [default: the relay's for the dispatch mode: 1 in cursor
    /// dispatch; in row dispatch 1 on SQLite (one writer: more workers make more, smaller
    /// claim and ack transactions queue for it), 4 on PostgreSQL/MySQL].
    #[arg(long, global = true, value_parser = value_parser!(u32).range(1..=256))]
    pub workers: Option<u32>,

    /// Count the due rows claims skip as locked (`ferry relay --measure-contention`; on
    /// PostgreSQL a recount of every short claim, +40–90 % claim latency measured) [default: true
    /// with --relays > 1 or --sweep-relays, false otherwise: one relay owns every slot].
    #[arg(long, global = true)]
    pub measure_contention: Option<bool>,

    /// Maximum events per claim or cursor read [default: the relay's for the dispatch mode:
    /// 2000 in cursor dispatch, 500 in row dispatch].
    #[arg(long, global = true, value_parser = value_parser!(u32).range(1..=10_000))]
    pub batch_size: Option<u32>,

    /// Batches in flight per worker [default: the relay's for the dispatch mode: 4 in cursor
    /// dispatch, 2 in row dispatch].
    #[arg(long, global = true, value_parser = value_parser!(u32).range(1..=64))]
    pub in_flight: Option<u32>,

    /// Shortest wait of a relay worker after a partial read or claim, before it reads again
    /// (`ferry relay --poll-min`): longer waits make fuller batches and fewer cursor advances,
    /// at the cost of latency [default: the relay's, 2ms].
    #[arg(long, global = true, value_parser = parse_poll_min)]
    pub poll_min: Option<Duration>,

    /// Cursor dispatch: a relay worker's wait after a partial read of 16+ events, per other
    /// reader of the database (`ferry relay --read-linger`; 0ms turns it off) [default: the
    /// relay's, 25ms].
    #[arg(long, global = true, value_parser = parse_relay_wait)]
    pub read_linger: Option<Duration>,

    /// Cursor dispatch: after a partial read of 16+ events, a relay worker's next read starts
    /// no sooner than this after that read started (`ferry relay --read-interval`) [default:
    /// the relay's, 25ms on SQLite, 0ms on PostgreSQL and MariaDB].
    #[arg(long, global = true, value_parser = parse_relay_wait)]
    pub read_interval: Option<Duration>,

    /// The Kafka sink's `linger.ms` (`ferry relay --kafka-linger`; fractions such as 0.2ms are
    /// kept) [default: the relay's].
    #[arg(long, global = true, value_parser = parse_kafka_linger)]
    pub kafka_linger: Option<Duration>,

    /// SIGKILL a random relay process every --chaos-interval and restart it (needs
    /// --relay-mode process); loss and reordering must still be zero.
    #[arg(long, global = true)]
    pub chaos: bool,

    /// Time between chaos kills.
    #[arg(long, global = true, default_value = "3s", value_parser = parse_duration_positive, requires = "chaos")]
    pub chaos_interval: Duration,
}

/// `--purge-batch`'s default: `ferry purge --batch`'s.
pub const DEFAULT_PURGE_BATCH: u32 = ferry_core::PurgeRequest::DEFAULT_BATCH as u32;

/// Retention (purge) during the run.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Retention")]
pub struct RetentionFlags {
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
    /// without retention. With burn-down it purges during the burn-down: allowed because
    /// purge never deletes an undelivered row (PENDING, CLAIMED, QUARANTINED and SKIPPED are
    /// never touched), so the drain measures the relays with a purge competing, as an hourly
    /// `ferry purge` during a backlog would.
    #[arg(long, global = true, value_parser = parse_retention, allow_hyphen_values = true)]
    pub retention: Option<Duration>,

    /// Keep loadgen's own business table bounded too, as an application that archives old
    /// orders would. After each purge run, the orders older than the --retention age are
    /// deleted from loadgen_orders and their count, version range and version sums are added
    /// per aggregate to loadgen_orders_folded (PostgreSQL: in one statement, and loadgen_orders
    /// is vacuumed when the purge vacuums; SQLite and MariaDB: 1,000 orders per write
    /// transaction, through an index on their creation time that only this flag adds). The
    /// version check reads the live and folded orders together and stays exact. Without it
    /// loadgen_orders grows for the whole run (about 200 B per event) and shares the server's
    /// cache (SQLite: the database file) with the outbox. On MariaDB, measured at half
    /// capacity, folding took more of the server than that growth did (docs/performance.md).
    #[arg(long, global = true, requires = "retention")]
    pub fold_orders: bool,

    /// Run --retention in the relays instead of loadgen's purger, as `ferry relay --retention`
    /// does (the relay that owns slot 0 purges, on its own store); in-process relays only,
    /// whose counts of purged rows loadgen reads exactly once they stopped. The purge figures
    /// are then the relays' (`ferry_retention_*`). No order check runs before each purge, so
    /// row dispatch needs a consumer (`--sink kafka`).
    #[arg(long, global = true, requires = "retention")]
    pub retention_in_relays: bool,

    /// Rows per DELETE statement of a --retention purge (`ferry purge --batch`).
    #[arg(long, global = true, default_value_t = DEFAULT_PURGE_BATCH, requires = "retention",
        value_parser = value_parser!(u32).range(1..=100_000))]
    pub purge_batch: u32,
}

/// The consumer Inbox check.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Inbox")]
pub struct InboxFlags {
    /// Also apply every consumed message through ferry's consumer Inbox (`apply_once`) with a
    /// real effect in the same transaction (tables loadgen_effects and loadgen_projection);
    /// the run fails unless every committed event's effect was applied exactly once.
    #[arg(long, global = true)]
    pub inbox: bool,

    /// The Inbox database (postgres://, mysql:// or sqlite://) [default: a fresh SQLite file
    /// in a temporary directory; its `synchronous` follows --sqlite-synchronous].
    #[arg(long, global = true, requires = "inbox", value_parser = parse_nonempty)]
    pub inbox_url: Option<String>,

    /// Inbox apply tasks; each aggregate always goes to the same task, so its versions are
    /// applied in delivery order. A SQLite Inbox has one connection that the tasks share.
    #[arg(long, global = true, default_value_t = 4, requires = "inbox", value_parser = value_parser!(u32).range(1..=64))]
    pub inbox_workers: u32,
}

/// Sweeps: one run per value.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Sweeps", group = clap::ArgGroup::new("sweep").multiple(false))]
pub struct SweepFlags {
    /// Run once per batch size (e.g. 1,10,100,500,1000), print a table, write a chart.
    #[arg(long, global = true, value_parser = parse_batch_list, group = "sweep")]
    pub sweep_batch: Option<SweepValues>,

    /// Run once per number of competing relays (e.g. 1,2,4,8): claim contention.
    #[arg(long, global = true, value_parser = parse_relay_list, group = "sweep")]
    pub sweep_relays: Option<SweepValues>,

    /// SVG chart of a sweep [default: loadgen-sweep-<batch|relays>.svg].
    #[arg(long, global = true, requires = "sweep")]
    pub chart: Option<PathBuf>,
}

/// What to run instead of the default load phase.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Drain a preloaded queue (a burn-down) instead of running a load phase.
    ///
    /// Commits --preload intents first, as fast as the producers can, with no relay running;
    /// then starts the relays and times how long they take to drain the queue, from starting them (slot acquisition included) until every intent is
    /// SENT and, with a consumer, delivered. --duration, --rate, --aggregates and --skew do not
    /// apply (there is no load phase after the preload) and --baseline is refused;
    /// --drain-timeout bounds the burn-down [default then: 300s]. The producers take the
    /// queue's orders in blocks of --orders-per-tx from one counter and their versions from the
    /// aggregates' rows, as in a load phase: producers whose blocks hold versions of one
    /// aggregate contend for its row (all of them at once when --versions-per-aggregate exceeds
    /// --orders-per-tx).
    BurnDown(BurnDownFlags),
    /// Measure the producer-only baseline alone and save it (--json FILE) for `--compare FILE`.
    ///
    /// The same producers as a run with these flags, flat out (whatever --rate says), no
    /// relay, for --baseline-duration, in a namespace of their own: the database's own insert
    /// ceiling. A later run with `--compare FILE` states its relay throughput against it.
    Baseline,
}

/// The preloaded queue of `loadgen burn-down`.
#[derive(Debug, Clone, clap::Args)]
pub struct BurnDownFlags {
    /// Intents in the queue, committed before the relays start.
    #[arg(long, value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub preload: u64,

    /// Versions per aggregate. The queue is --preload/K aggregates (the last one gets the
    /// remainder), each with versions 1..=K, committed close together in the queue; K =
    /// --preload makes one hot aggregate with every version, all producers contending for its
    /// row [default: 1].
    #[arg(long, value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub versions_per_aggregate: Option<u64>,
}
