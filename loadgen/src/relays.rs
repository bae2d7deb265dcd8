//! The relays of a run: K in-process [`Relay`] instances, or K `ferry relay` child processes.
//!
//! In-process relays each get their own owner id, connection pool, sink and metrics, exactly as
//! separate processes would: they share the slots only through the ownership leases in the
//! database. Every other setting is the relay's default (heartbeat 5 s, slot TTL 15 s, claim
//! lease 60 s): loadgen measures the engine as shipped, and waits for the slots to settle
//! before it starts the load instead of shortening the heartbeat (a 1 s heartbeat was tried:
//! its slot-lease UPDATEs queue behind the claims' `FOR SHARE` on PostgreSQL).
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{BoxFuture, ClaimedEvent, DispatchMode, Outcome, PurgeRequest};
use ferry_relay::{
    KafkaConfig, KafkaSink, Metrics, NullSink, Relay, RelayConfig, RetentionConfig, Sink,
    StdoutSink,
};
use ferry_store::redact_url;
use ferry_testkit::{OrderCheck, RelayProcess, RelayTask, SpawnError, Stdout};
use hdrhistogram::Histogram;

use crate::cli::{FlagValue, RelayMode, SinkKind};
use crate::clock::CommitClock;
use crate::db::{new_histogram, Database, PoolHandle};
use crate::error::{Error, Result};
use crate::report::Claims;
use crate::spec::RunSpec;

/// The per-aggregate order of first sends at the sink of in-process relays whose sink has no
/// consumer to verify it (null, stdout): the order in which `send_batch` is called is the
/// order a Kafka producer would append in. One check over all relays: an aggregate's slot may
/// move between them.
pub type SendOrder = Mutex<OrderCheck>;

/// A sink that records the send order in an [`OrderCheck`], passes the batch on, and notes
/// in a [`CommitClock`] when each item was acked.
struct ObservedSink {
    inner: Arc<dyn Sink>,
    check: Option<Arc<SendOrder>>,
    clock: Option<Arc<CommitClock>>,
}

impl Sink for ObservedSink {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            // recorded when the relay hands the batch over, as a Kafka producer would enqueue it
            if let Some(check) = &self.check {
                let mut c = check.lock().unwrap_or_else(|e| e.into_inner());
                for e in items {
                    c.observe(&e.aggregate_id, e.aggregate_version, "sent");
                }
            }
            let out = self.inner.send_batch(items).await;
            if let Some(clock) = &self.clock {
                clock.acked(
                    items
                        .iter()
                        .zip(&out)
                        .filter(|(_, o)| matches!(o, Outcome::Acked))
                        .map(|(e, _)| e.token.event_id.as_str()),
                    std::time::Instant::now(),
                );
            }
            out
        })
    }
}

/// One in-process relay.
pub struct InProcess {
    pool: PoolHandle,
    task: RelayTask,
    metrics: Arc<Metrics>,
    /// `--retention-in-relays`: its retention runs end with a `VACUUM`.
    vacuum: bool,
}

/// `ferry relay` child processes; chaos kills and restarts them through [`Self::kill_and_restart`].
pub struct Processes {
    bin: PathBuf,
    args: Vec<String>,
    database_url: String,
    log_dir: PathBuf,
    children: Vec<RelayProcess>,
    pub kills: u64,
}

/// The running relays.
pub enum Relays {
    /// In this process (with the send-order check of a sink without consumer).
    InProcess(Vec<InProcess>, Option<Arc<SendOrder>>),
    /// Child processes, shared with the chaos task.
    Processes(Arc<tokio::sync::Mutex<Processes>>),
}

/// Relay-side numbers merged over all relays: counters from each relay's metrics exposition
/// (the in-process relays' rendered, the processes' scraped), histograms from the in-process
/// relays' registries (processes have none to merge).
pub struct RelayMetrics {
    /// The claim counters summed (the run fills in the rates).
    pub claims: Claims,
    pub sent: u64,
    pub per_relay_sent: Vec<u64>,
    pub commit_to_ack: Histogram<u64>,
    pub batch_size: Histogram<u64>,
    pub claim_latency: Histogram<u64>,
    /// Outcome CAS latency per batch, µs.
    pub ack_latency: Histogram<u64>,
    /// Relays that reported cursor dispatch (`ferry_dispatch_cursor` = 1).
    pub dispatch_cursor: u64,
    /// Relays that reported row dispatch.
    pub dispatch_row: u64,
}

impl RelayMetrics {
    fn empty() -> Self {
        Self {
            claims: Claims::default(),
            sent: 0,
            per_relay_sent: Vec::new(),
            commit_to_ack: new_histogram(),
            batch_size: new_histogram(),
            claim_latency: new_histogram(),
            ack_latency: new_histogram(),
            dispatch_cursor: 0,
            dispatch_row: 0,
        }
    }

    /// Adds one relay's exposition to the sums (`None`: it did not answer).
    fn add(&mut self, text: Option<&str>) {
        let Some(text) = text else {
            self.per_relay_sent.push(0);
            return;
        };
        let v = |name: &str| prom_opt(text, name).unwrap_or(0);
        let c = &mut self.claims;
        c.claims += v("ferry_claims_total");
        c.empty_claims += v("ferry_empty_claims_total");
        c.claimed_items += v("ferry_claimed_events_total");
        c.fenced += v("ferry_fenced_total");
        c.retried += v("ferry_retried_total");
        c.unknown += v("ferry_unknown_total");
        c.quarantined += v("ferry_quarantined_total");
        c.store_errors += v("ferry_store_errors_total");
        c.slot_fenced += v("ferry_slot_fenced_total");
        c.acked_after_failed_predecessor += v("ferry_acked_after_failed_predecessor_total");
        if let Some(n) = prom_opt(text, "ferry_claim_rows_skipped_locked_total") {
            *c.rows_skipped_locked.get_or_insert(0) += n;
        }
        self.sent += v("ferry_sent_total");
        self.per_relay_sent.push(v("ferry_sent_total"));
        match prom_opt(text, "ferry_dispatch_cursor") {
            Some(1) => self.dispatch_cursor += 1,
            Some(_) => self.dispatch_row += 1,
            None => {}
        }
    }
}

impl Relays {
    /// Starts the relays against `db`, sending to `kafka_brokers` for the Kafka sink.
    pub async fn start(
        run_spec: &RunSpec,
        db: &Database,
        run: &str,
        kafka_brokers: Option<&str>,
        clock: Arc<CommitClock>,
        log_dir: &Path,
    ) -> Result<Self> {
        let (dispatch, spec) = (db.dispatch, &run_spec.relays);
        match spec.mode {
            RelayMode::InProcess => {
                let mut relays = Vec::with_capacity(spec.relays);
                let check = (spec.sink != SinkKind::Kafka).then(|| Arc::new(SendOrder::default()));
                // claims + outcome CAS + lease renewals + ownership/status, with headroom, but
                // never more than the server has connections for: 8 relays × 12 connections
                // exhausted PostgreSQL's max_connections = 100, pool acquisitions timed out,
                // heartbeats failed and slots moved (a sizing failure, not contention)
                let want = (spec.workers * spec.in_flight * 2 + 4) as u32;
                let pool = match db.free_connections().await {
                    Some(free) if free / (spec.relays as u32) < want => {
                        let share = (free / spec.relays as u32).max(3);
                        tracing::info!(
                            want,
                            share,
                            free,
                            "relay pools capped to the server's free connections"
                        );
                        share
                    }
                    _ => want,
                };
                for k in 0..spec.relays {
                    let (store, pool_handle) = db
                        .open_store(pool, spec.measure_contention, crate::db::RELAY)
                        .await?;
                    let sink = Arc::new(ObservedSink {
                        inner: make_sink(spec.sink, kafka_brokers, dispatch, spec.kafka_linger)?,
                        check: check.clone(),
                        clock: Some(clock.clone()),
                    });
                    let config = RelayConfig {
                        owner: format!("loadgen-{run}-r{k}"),
                        workers: spec.workers,
                        batch_size: spec.batch_size,
                        max_in_flight: spec.in_flight,
                        dispatch: Some(dispatch),
                        poll_min: spec.poll_min.unwrap_or(RelayConfig::default().poll_min),
                        read_linger: run_spec.read_linger(),
                        read_interval: spec.read_interval,
                        ..RelayConfig::default()
                    };
                    let retention = run_spec.retention.filter(|r| r.in_relays);
                    let vacuum = match retention {
                        Some(_) => crate::retention::needs_vacuum(&*store).await,
                        None => false,
                    };
                    let mut relay =
                        Relay::new(store, sink, config).map_err(|e| Error::Relay(e.to_string()))?;
                    if let Some(r) = retention {
                        let purge = PurgeRequest {
                            older_than: r.age,
                            batch: r.batch,
                            consumer: None,
                            dry_run: false,
                            vacuum,
                        };
                        relay = relay
                            .with_retention(RetentionConfig {
                                every: r.every,
                                purge,
                            })
                            .map_err(|e| Error::Relay(e.to_string()))?;
                    }
                    relays.push(InProcess {
                        pool: pool_handle,
                        vacuum,
                        metrics: relay.metrics(),
                        task: RelayTask::spawn(|cancel| relay.run(cancel)),
                    });
                }
                Ok(Relays::InProcess(relays, check))
            }
            RelayMode::Process => {
                let bin = ferry_binary(spec.ferry_bin.as_deref())?;
                // The URL travels in the environment (`ferry` reads FERRY_DATABASE_URL like
                // --database-url): a password on a command line is visible to every local
                // user through `ps`.
                let optional = [
                    spec.measure_contention
                        .then(|| "--measure-contention".to_string()),
                    spec.poll_min
                        .map(|p| format!("--poll-min={}ms", p.as_millis().max(1))),
                    spec.read_linger
                        .map(|l| format!("--read-linger={}ms", l.as_millis())),
                    Some(format!(
                        "--read-interval={}ms",
                        spec.read_interval.as_millis()
                    )),
                    spec.kafka_linger
                        .map(|l| format!("--kafka-linger={}ms", l.as_secs_f64() * 1000.0)),
                    kafka_brokers.map(|b| format!("--kafka-brokers={b}")),
                ];
                let args = [
                    "relay".to_string(),
                    format!("--sink={}", spec.sink.as_str()),
                    format!("--workers={}", spec.workers),
                    format!("--batch-size={}", spec.batch_size),
                    format!("--in-flight={}", spec.in_flight),
                    format!("--dispatch={}", dispatch.as_str()),
                ]
                .into_iter()
                .chain(optional.into_iter().flatten())
                .chain(spec.process_args.iter().cloned())
                .collect();
                let mut procs = Processes {
                    bin,
                    args,
                    database_url: db.url.clone(),
                    log_dir: log_dir.to_path_buf(),
                    children: Vec::with_capacity(spec.relays),
                    kills: 0,
                };
                for k in 0..spec.relays {
                    let child = procs.spawn(k)?;
                    procs.children.push(child);
                }
                Ok(Relays::Processes(Arc::new(tokio::sync::Mutex::new(procs))))
            }
        }
    }

    /// Merged metrics: in-process relays' registries, or the counters scraped from the relay
    /// processes' `/metrics` (no histograms there: latency then comes from the rows).
    pub async fn metrics(&self) -> RelayMetrics {
        let relays = match self {
            Relays::InProcess(relays, _) => relays,
            Relays::Processes(p) => return p.lock().await.scrape().await,
        };
        let mut m = RelayMetrics::empty();
        for r in relays {
            m.add(Some(&r.metrics.render()));
            let _ = m.commit_to_ack.add(r.metrics.commit_to_ack.snapshot());
            let _ = m.batch_size.add(r.metrics.batch_size.snapshot());
            let _ = m.claim_latency.add(r.metrics.claim_latency.snapshot());
            let _ = m.ack_latency.add(r.metrics.ack_latency.snapshot());
        }
        m
    }

    /// `--retention-in-relays`: the in-process relays' registries, whose retention counts are
    /// read once the relays stopped, and whether their runs vacuum; `None` for processes.
    pub fn retention_registries(&self) -> Option<(Vec<Arc<Metrics>>, bool)> {
        let Relays::InProcess(relays, _) = self else {
            return None;
        };
        let metrics = relays.iter().map(|r| r.metrics.clone()).collect();
        Some((metrics, relays.iter().any(|r| r.vacuum)))
    }

    /// The send-order check of in-process relays without a consumer.
    pub fn order_check(&self) -> Option<Arc<SendOrder>> {
        match self {
            Relays::InProcess(_, check) => check.clone(),
            Relays::Processes(_) => None,
        }
    }

    /// Sent so far by in-process relays (cheap: counters only); `None` for processes.
    pub fn sent(&self) -> Option<u64> {
        match self {
            Relays::InProcess(r, _) => Some(
                r.iter()
                    .map(|r| r.metrics.sent.load(Ordering::Relaxed))
                    .sum(),
            ),
            Relays::Processes(_) => None,
        }
    }

    /// Commit→SENT histogram merged over in-process relays (for the live p99).
    pub fn commit_to_ack(&self) -> Option<Histogram<u64>> {
        let Relays::InProcess(relays, _) = self else {
            return None;
        };
        let mut h = new_histogram();
        for r in relays {
            let _ = h.add(r.metrics.commit_to_ack.snapshot());
        }
        Some(h)
    }

    /// Fails if a relay stopped on its own (an in-process relay returned, a process exited
    /// without being killed by chaos).
    pub async fn check_alive(&self) -> Result<()> {
        match self {
            Relays::InProcess(relays, _) => {
                for (k, r) in relays.iter().enumerate() {
                    if r.task.stopped_unasked() {
                        return Err(Error::Relay(format!(
                            "in-process relay {k} stopped unexpectedly (see the log above)"
                        )));
                    }
                }
                Ok(())
            }
            Relays::Processes(p) => p.lock().await.check_alive(),
        }
    }

    /// Stops every relay gracefully (in-flight batches finish, claims are released).
    pub async fn stop(self) -> Result<()> {
        match self {
            Relays::InProcess(relays, _) => {
                for r in &relays {
                    r.task.cancel();
                }
                let mut first_err = None;
                for (k, r) in relays.into_iter().enumerate() {
                    let stopped = r.task.join(Duration::from_secs(30)).await;
                    r.pool.close_idle().await;
                    match stopped {
                        Some(Ok(Ok(()))) => {}
                        Some(Ok(Err(e))) => {
                            first_err.get_or_insert(Error::Relay(format!("relay {k}: {e}")));
                        }
                        Some(Err(e)) => {
                            first_err
                                .get_or_insert(Error::Relay(format!("relay {k} panicked: {e}")));
                        }
                        None => {
                            first_err.get_or_insert(Error::Relay(format!(
                                "relay {k} did not stop within 30s"
                            )));
                        }
                    }
                }
                first_err.map_or(Ok(()), Err)
            }
            Relays::Processes(p) => {
                let mut p = p.lock().await;
                p.stop_all().await;
                Ok(())
            }
        }
    }

    /// The process set, for chaos.
    pub fn processes(&self) -> Option<Arc<tokio::sync::Mutex<Processes>>> {
        match self {
            Relays::Processes(p) => Some(p.clone()),
            Relays::InProcess(..) => None,
        }
    }
}

impl Processes {
    /// Starts relay `k`, with its own metrics port (the default 9464 would collide); its
    /// output goes to `relay-<k>.log` in the log directory.
    fn spawn(&self, k: usize) -> Result<RelayProcess> {
        let mut cmd = std::process::Command::new(&self.bin);
        cmd.args(&self.args)
            .env("FERRY_DATABASE_URL", &self.database_url);
        let log = self.log_dir.join(format!("relay-{k}.log"));
        // Another process could take the free port before the relay binds it: the relay then
        // exits with a clear message and the liveness check reports it.
        let started = RelayProcess::spawn(cmd, &log, Stdout::Log).map_err(|e| match e {
            SpawnError::Port(source) => Error::Io {
                what: "find a free port for relay metrics on",
                path: PathBuf::from("127.0.0.1"),
                source,
            },
            SpawnError::Log(source) => Error::Io {
                what: "open the relay log",
                path: log.clone(),
                source,
            },
            SpawnError::Start(e) => Error::Relay(format!(
                "cannot start `{} relay` on {}: {e}",
                self.bin.display(),
                redact_url(&self.database_url)
            )),
        })?;
        Ok(started.keep_log())
    }

    /// Number of relay processes.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// SIGKILLs relay `k`, waits for it to die, and starts a new one in its place (a new
    /// process, hence a new owner id: its old slots and claims expire and are taken over).
    pub async fn kill_and_restart(&mut self, k: usize) -> Result<()> {
        self.children[k].kill();
        self.kills += 1;
        self.children[k] = self.spawn(k)?;
        Ok(())
    }

    /// Sums the counters of every running relay's `/metrics` (counters of processes killed by
    /// chaos are gone with them).
    async fn scrape(&self) -> RelayMetrics {
        let mut m = RelayMetrics::empty();
        for c in &self.children {
            m.add(get_metrics(c.metrics_port()).await.as_deref());
        }
        m
    }

    fn check_alive(&mut self) -> Result<()> {
        for (k, c) in self.children.iter_mut().enumerate() {
            if let Some(status) = c.try_exited() {
                return Err(Error::Relay(format!(
                    "relay process {k} exited on its own ({status}); last lines of {}:\n{}",
                    c.log().display(),
                    c.tail(15)
                )));
            }
        }
        Ok(())
    }

    /// SIGTERM to all, then up to 20 s for a graceful drain, then SIGKILL.
    async fn stop_all(&mut self) {
        for c in &self.children {
            c.signal(libc::SIGTERM);
        }
        for c in &mut self.children {
            if !c.exited_within(Duration::from_secs(20)).await {
                c.kill();
            }
        }
    }
}

/// `GET /metrics` from a relay on this machine (the relay's own HTTP client, hyper). `None`
/// when it does not answer in 2 s.
async fn get_metrics(port: u16) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match ferry_relay::metrics::scrape(addr, Duration::from_secs(2)).await {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::debug!(error = %e, "relay scrape failed");
            None
        }
    }
}

/// A sample's value as a count, `None` when the exposition does not carry it.
fn prom_opt(text: &str, name: &str) -> Option<u64> {
    ferry_relay::metrics::sample(text, name).map(|v| v.max(0.0) as u64)
}

fn make_sink(
    kind: SinkKind,
    brokers: Option<&str>,
    dispatch: DispatchMode,
    kafka_linger: Option<std::time::Duration>,
) -> Result<Arc<dyn Sink>> {
    Ok(match kind {
        SinkKind::Null => Arc::new(NullSink),
        SinkKind::Stdout => Arc::new(StdoutSink),
        SinkKind::Kafka => {
            let brokers =
                brokers.ok_or_else(|| Error::Kafka("no brokers for the Kafka sink".into()))?;
            let sink = KafkaSink::new(KafkaConfig {
                brokers: brokers.to_string(),
                // cursor mode has several versions of one key in flight: no gaps allowed
                ordered: dispatch == DispatchMode::Cursor,
                linger: kafka_linger.unwrap_or(KafkaConfig::default().linger),
                ..KafkaConfig::default()
            })
            .map_err(|e| Error::Kafka(e.to_string()))?;
            Arc::new(sink)
        }
    })
}

/// `--ferry-bin`, or `ferry` next to the running loadgen (`target/<profile>/ferry`).
fn ferry_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let exe = std::env::current_exe().map_err(|e| {
                Error::Setup(format!("cannot locate the loadgen binary to find `ferry` next to it: {e}; pass --ferry-bin"))
            })?;
            exe.with_file_name(format!("ferry{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if !path.is_file() {
        let profile = if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        };
        return Err(Error::Setup(format!(
            "--relay-mode process needs the `ferry` binary, not found at {}; build it with \
             `cargo build{profile} -p ferry-cli` or pass --ferry-bin PATH",
            path.display()
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn reads_prometheus_counters() {
        let text =
            "# HELP ferry_sent_total x\n# TYPE ferry_sent_total counter\nferry_sent_total 1234\n\
                    ferry_claims_total 7\nferry_batch_size_events{quantile=\"0.5\"} 3\n";
        assert_eq!(prom_opt(text, "ferry_sent_total"), Some(1234));
        assert_eq!(prom_opt(text, "ferry_claims_total"), Some(7));
        assert_eq!(prom_opt(text, "ferry_fenced_total"), None);
    }

    /// loadgen reads a relay's endpoint as it serves it: over HTTP, with the shared client.
    #[tokio::test]
    async fn scrapes_a_relay_endpoint() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let metrics = Arc::new(Metrics::default());
        metrics.sent.store(41, Ordering::Relaxed);
        metrics.dispatch_cursor.store(1, Ordering::Relaxed);
        let cancel = CancellationToken::new();
        let config = ferry_relay::metrics::ServeConfig::default();
        tokio::spawn(ferry_relay::metrics::serve(
            listener,
            metrics,
            config,
            cancel.clone(),
        ));
        let mut m = RelayMetrics::empty();
        m.add(Some(
            &get_metrics(port).await.expect("the endpoint answers"),
        ));
        assert_eq!((m.sent, m.per_relay_sent.clone()), (41, vec![41]));
        assert_eq!((m.dispatch_cursor, m.dispatch_row), (1, 0));
        // no store told these metrics it reports SKIP LOCKED: not exported, not summed
        assert_eq!(m.claims.rows_skipped_locked, None);
        cancel.cancel();
    }
}
