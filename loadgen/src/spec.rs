//! The plan of a run: [`RunSpec::from_args`] decides every default a flag leaves open (store,
//! dispatch, producers, relay worker settings, drain timeout, seed, ...) and takes the settings
//! used as given; the run reads this plan, never the flags. The report's `config` section is
//! this spec serialized ([`ConfigEcho`]).
use std::path::PathBuf;
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::RelayConfig;
use rand::Rng;
use serde::{Serialize, Serializer};

use crate::cli::{Args, Command, RelayMode, SinkKind, SqliteSync};
use ferry_store::{redact_url, Backend};
pub use ferry_testkit::workload::{Preload, Skew, Workload};

/// Everything one run needs; sweeps clone it and change one field. Serialized (flattened into
/// [`ConfigEcho`]) under the report's field names.
#[derive(Debug, Clone, Serialize)]
pub struct RunSpec {
    /// Label in reports (`run`, `batch_size=100`).
    #[serde(skip)]
    pub label: String,
    #[serde(rename = "duration_secs", serialize_with = "secs")]
    pub duration: Duration,
    #[serde(rename = "drain_timeout_secs", serialize_with = "secs")]
    pub drain_timeout: Duration,
    /// Database (and the dispatch mode of the outbox and the relays).
    #[serde(flatten)]
    pub db: DbSpec,
    #[serde(flatten)]
    pub relays: RelaySpec,
    /// Chaos interval (process relays only).
    #[serde(rename = "chaos_interval_secs", serialize_with = "opt_secs")]
    pub chaos: Option<Duration>,
    /// How long every broker of the embedded cluster is down, a third into the load phase.
    #[serde(rename = "broker_stall_secs", serialize_with = "opt_secs")]
    pub broker_stall: Option<Duration>,
    /// `--retention`: purge delivered intents older than its age while the run goes on.
    pub retention: Option<Retention>,
    /// The per-interval latency table's interval.
    #[serde(rename = "report_interval_secs", serialize_with = "secs")]
    pub report_interval: Duration,
    /// Producer tasks (echoed by [`ConfigEcho`]).
    #[serde(skip)]
    pub producers: usize,
    #[serde(flatten)]
    pub work: Workload,
    #[serde(skip)]
    pub baseline: Option<Duration>,
    #[serde(skip)]
    pub progress: bool,
    #[serde(skip)]
    pub kafka: KafkaSpec,
    /// `--inbox`: the consumer Inbox check.
    #[serde(skip)]
    pub inbox: Option<InboxSpec>,
}

/// Where a Kafka sink sends (`--kafka-brokers`, `--topic`, `--partitions`).
#[derive(Debug, Clone)]
pub struct KafkaSpec {
    /// An external bootstrap list; `None`: the in-process mock cluster.
    pub brokers: Option<String>,
    /// `None`: a fresh `loadgen-<run>` per run.
    pub topic: Option<String>,
    pub partitions: u32,
}

/// The Inbox consumer of `--inbox`.
#[derive(Debug, Clone)]
pub struct InboxSpec {
    /// `--inbox-url`; `None`: a fresh SQLite file in a temporary directory.
    pub url: Option<String>,
    pub workers: usize,
}

/// How to get the run's database.
#[derive(Debug, Clone, Serialize)]
pub struct DbSpec {
    #[serde(serialize_with = "backend")]
    pub store: Backend,
    /// The dispatch mode the outbox is put in before anything is produced, and the relays'.
    pub dispatch: DispatchMode,
    /// `--database-url` (the run gets a fresh namespace in it); `None`: a temporary SQLite file.
    #[serde(skip)]
    pub url: Option<String>,
    /// `--keep-db`: leave the run's database (and the Inbox's) in place afterwards.
    #[serde(skip)]
    pub keep: bool,
    /// SQLite `synchronous`, for the outbox and a SQLite Inbox.
    #[serde(skip)]
    pub sqlite_sync: SqliteSync,
    /// PostgreSQL: ANALYZE the outbox at this interval (zero: never).
    #[serde(skip)]
    pub analyze_every: Duration,
}

/// How the relays of a run are set up (their dispatch mode is the outbox's, [`DbSpec`]).
#[derive(Debug, Clone, Serialize)]
pub struct RelaySpec {
    pub relays: usize,
    #[serde(rename = "relay_mode")]
    pub mode: RelayMode,
    pub workers: usize,
    pub batch_size: usize,
    /// Batches in flight per worker.
    pub in_flight: usize,
    /// The relay's `read_interval` (the store's default unless set).
    #[serde(rename = "read_interval_ms", serialize_with = "ms")]
    pub read_interval: Duration,
    pub sink: SinkKind,
    /// Count rows claims skip as locked (costly on PostgreSQL: `ferry relay --measure-contention`).
    #[serde(skip)]
    pub measure_contention: bool,
    /// The relay settings used as given when set (`--poll-min`, `--read-linger`,
    /// `--kafka-linger`); unset, each relay keeps its own default.
    #[serde(skip)]
    pub poll_min: Option<Duration>,
    #[serde(skip)]
    pub read_linger: Option<Duration>,
    #[serde(skip)]
    pub kafka_linger: Option<Duration>,
    /// `--ferry-bin` and `--relay-arg`s (process relays).
    #[serde(skip)]
    pub ferry_bin: Option<PathBuf>,
    #[serde(skip)]
    pub process_args: Vec<String>,
}

impl RunSpec {
    /// The run the flags describe.
    pub fn from_args(a: &Args) -> Self {
        let store = a.backend();
        let producers = a.producer_tasks();
        let drain_timeout = a.drain_timeout();
        let dispatch = a.dispatch();
        // the relay's worker settings for this dispatch mode, where the flags leave them unset
        let defaults = ferry_relay::WorkerDefaults::for_mode(dispatch, store);
        Self {
            label: "run".to_string(),
            duration: a.run.duration,
            drain_timeout,
            db: DbSpec {
                store,
                dispatch,
                url: a.db.database_url.clone(),
                keep: a.db.keep_db,
                sqlite_sync: a.db.sqlite_synchronous,
                analyze_every: a.db.pg_analyze_every,
            },
            relays: RelaySpec {
                relays: a.relay.relays as usize,
                mode: a.relay.relay_mode,
                workers: a.relay.workers.map_or(defaults.workers, |w| w as usize),
                batch_size: a
                    .relay
                    .batch_size
                    .map_or(defaults.batch_size, |b| b as usize),
                in_flight: a
                    .relay
                    .in_flight
                    .map_or(defaults.max_in_flight, |n| n as usize),
                read_interval: a.relay.read_interval.unwrap_or(defaults.read_interval),
                sink: a.kafka.sink,
                // contention exists only between relays; a relays sweep measures every point
                // (the 1-relay point too) so the points pay the same cost
                measure_contention: a
                    .relay
                    .measure_contention
                    .unwrap_or(a.relay.relays > 1 || a.sweep.sweep_relays.is_some()),
                poll_min: a.relay.poll_min,
                read_linger: a.relay.read_linger,
                kafka_linger: a.relay.kafka_linger,
                ferry_bin: a.relay.ferry_bin.clone(),
                process_args: a.relay.relay_args.clone(),
            },
            chaos: a.relay.chaos.then_some(a.relay.chaos_interval),
            broker_stall: a.kafka.broker_stall,
            retention: a.retention.retention.map(|age| Retention {
                fold_orders: a.retention.fold_orders,
                in_relays: a.retention.retention_in_relays,
                ..Retention::new(age, a.retention.purge_batch as usize)
            }),
            report_interval: a.report_interval(),
            producers,
            work: Workload {
                aggregates: a.work.aggregates,
                skew: a.work.skew,
                zipf_s: a.work.zipf_s,
                orders_per_tx: a.work.orders_per_tx as usize,
                rate: a.work.rate,
                payload_bytes: a.work.payload_bytes as usize,
                seed: a.run.seed.unwrap_or_else(|| rand::thread_rng().gen()),
                producers_own_aggregates: a.work.producers_own_aggregates,
                preload: a.preload(),
            },
            baseline: (a.run.baseline || matches!(a.command, Some(Command::Baseline))).then(|| {
                a.run
                    .baseline_duration
                    .unwrap_or(a.run.duration.min(Duration::from_secs(10)))
            }),
            progress: !a.run.no_progress,
            kafka: KafkaSpec {
                brokers: a.kafka.kafka_brokers.clone(),
                topic: a.kafka.topic.clone(),
                partitions: a.kafka.partitions,
            },
            inbox: a.inbox.inbox.then(|| InboxSpec {
                url: a.inbox.inbox_url.clone(),
                workers: a.inbox.inbox_workers as usize,
            }),
        }
    }

    /// The read linger in-process relays run with: `--read-linger`, else the relay's default.
    pub fn read_linger(&self) -> Duration {
        self.relays
            .read_linger
            .unwrap_or(RelayConfig::default().read_linger)
    }

    /// The report's `config`: this spec with what the run `run_id` chose.
    pub fn echo(
        &self,
        run_id: &str,
        topic: &str,
        server: &[(String, String)],
        partitions: Option<i32>,
    ) -> ConfigEcho {
        let (kafka, w) = (self.relays.sink == SinkKind::Kafka, &self.work);
        ConfigEcho {
            run_id: run_id.to_string(),
            server: server.to_vec(),
            database_url: self.db.url.as_deref().map(redact_url),
            kafka: kafka.then(|| {
                self.kafka
                    .brokers
                    .clone()
                    .unwrap_or_else(|| "embedded mock cluster".to_string())
            }),
            topic: kafka.then(|| topic.to_string()),
            partitions,
            producers: self.producers,
            read_linger_ms: self.read_linger().as_millis() as u64,
            zipf_s: (w.skew == Skew::Zipf).then_some(w.zipf_s),
            preload: w.preload.map(|p| p.total),
            versions_per_aggregate: w.preload.map(|p| p.per_aggregate),
            spec: self.clone(),
        }
    }
}

/// The effective configuration (no secrets): the run's [`RunSpec`], flattened, and what the
/// run itself chose.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigEcho {
    /// Run id (part of every event id, schema and topic name).
    pub run_id: String,
    /// Server version and durability settings.
    pub server: Vec<(String, String)>,
    /// Database URL with the password redacted (`None`: temporary SQLite file).
    pub database_url: Option<String>,
    /// `embedded mock cluster` or the external bootstrap list (Kafka sink only).
    pub kafka: Option<String>,
    pub topic: Option<String>,
    /// The topic's own partition count (an external broker's existing topic keeps its own).
    pub partitions: Option<i32>,
    /// Producer tasks.
    pub producers: usize,
    /// The relays' read linger per other reader in ms (cursor dispatch).
    pub read_linger_ms: u64,
    /// Zipf exponent (with zipf skew).
    pub zipf_s: Option<f64>,
    /// `--preload` (queue burn-down), when given.
    pub preload: Option<u64>,
    /// `--versions-per-aggregate` of the preload.
    pub versions_per_aggregate: Option<u64>,
    #[serde(flatten)]
    pub spec: RunSpec,
}

/// What `--retention` asks for (echoed in the report's `config.retention`; run by [`crate::retention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Retention {
    /// Only SENT intents older than this are deleted (row dispatch: by `sent_at`; cursor
    /// dispatch: by `created_at`, as `ferry purge` counts).
    #[serde(rename = "age_secs", serialize_with = "secs")]
    pub age: Duration,
    /// Time between purge runs: [`purge_every`] of the age.
    #[serde(rename = "every_secs", serialize_with = "secs")]
    pub every: Duration,
    /// Rows per DELETE statement (`--purge-batch`).
    pub batch: usize,
    /// `--fold-orders`: each run also folds the business orders older than `age`.
    pub fold_orders: bool,
    /// `--retention-in-relays`: the relays purge, not loadgen's purger.
    pub in_relays: bool,
}

impl Retention {
    pub fn new(age: Duration, batch: usize) -> Self {
        Self {
            age,
            every: purge_every(age),
            batch,
            fold_orders: false,
            in_relays: false,
        }
    }
}

/// The time between purge runs for a retention of `age`: the relay's own rule
/// ([`ferry_relay::RetentionConfig::default_every`]: a quarter of it, between 1 s and 1 min),
/// so loadgen's purger and `--retention-in-relays` run on the same period. A row is then
/// deleted between `age` and `age + every` after it became old enough.
pub fn purge_every(age: Duration) -> Duration {
    ferry_relay::RetentionConfig::default_every(age)
}

fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    d.map(|d| d.as_secs_f64()).serialize(s)
}

fn ms<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

fn backend<S: Serializer>(b: &Backend, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(b.as_str())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    #[test]
    fn echo_states_the_resolved_settings() {
        let flags = "loadgen --database-url postgres://u:pw@h/db --chaos --relay-mode process \
                     --skew zipf --sink null --seed 9 burn-down --preload 10 --versions-per-aggregate 3";
        let a = Args::try_parse_from(flags.split_whitespace()).unwrap();
        let echo = RunSpec::from_args(&a).echo("abc", "t", &[], None);
        let v = serde_json::to_value(echo).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 33, "{v}");
        assert!(!v["database_url"].as_str().unwrap().contains("pw"), "{v}");
        for (key, want) in [
            ("run_id", json!("abc")),
            ("store", json!("postgres")),
            ("kafka", json!(null)),
            ("topic", json!(null)),
            ("relay_mode", json!("process")),
            ("dispatch", json!("cursor")),
            ("read_linger_ms", json!(25)),
            ("producers", json!(8)),
            ("zipf_s", json!(1.0)),
            ("preload", json!(10)),
            ("versions_per_aggregate", json!(3)),
            ("duration_secs", json!(30.0)),
            ("drain_timeout_secs", json!(300.0)),
            ("chaos_interval_secs", json!(3.0)),
            ("broker_stall_secs", json!(null)),
            ("retention", json!(null)),
            ("report_interval_secs", json!(5.0)),
            ("producers_own_aggregates", json!(false)),
            ("seed", json!(9)),
        ] {
            assert_eq!(v[key], want, "{key}: {v}");
        }
        let a = Args::try_parse_from(
            "loadgen --retention 30s --purge-batch 200 --duration 2m".split_whitespace(),
        )
        .unwrap();
        let v = serde_json::to_value(RunSpec::from_args(&a).echo("abc", "t", &[], None)).unwrap();
        assert_eq!(
            v["retention"],
            json!({"age_secs": 30.0, "every_secs": 7.5, "batch": 200, "fold_orders": false, "in_relays": false}),
            "{v}"
        );
        assert_eq!(v["report_interval_secs"], json!(30.0), "{v}");
    }
}
