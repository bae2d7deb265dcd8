//! A Kafka consumer that applies every message of a topic through an [`Inbox`]: the loop a
//! consumer of ferry's topic would otherwise write by hand (feature `kafka`, on by default).
//!
//! # How it consumes
//!
//! [`ConsumerRunner::start`] assigns every partition of the topic from its beginning (no
//! consumer group, no offset commits: the Inbox's dedupe makes reading again from the start
//! safe, each event already applied comes back as [`Verdict::Duplicate`]) and polls it on a
//! thread of its own. Each message becomes a [`Delivery`] from its ferry headers and goes to
//! one of [`RunnerConfig::workers`] async tasks, chosen by the aggregate's slot
//! ([`ferry_core::slot_for`], the relay's own stable hash): one aggregate is always applied by
//! the same task, in partition order, so the Inbox's per-aggregate gap tracking sees the
//! relay's order and a gap is a real ordering fault. A full task queue
//! ([`RunnerConfig::queue`] messages) blocks the polling thread: back-pressure, not loss.
//!
//! Each message is one [`Inbox::apply_once`] transaction with the caller's effect. A retryable
//! error ([`InboxError::is_transient`]: deadlock, `SQLITE_BUSY`, connection lost, the database
//! down or restarting) is retried with [`RunnerConfig::retry`] waits until it passes (by
//! default; [`RunnerConfig::max_attempts`] can bound it): the aggregate's task waits, and once
//! its queue is full the polling thread with it, so a database outage delays deliveries and
//! skips none. A delivery failing for [`RETRY_WARN_AFTER`] is logged at WARN, again every
//! minute while it lasts, and at INFO when it passes. An error of the effect itself is never
//! retried (counted in [`RunnerStats::effect_failures`]), nor is any other error
//! ([`RunnerStats::errors`]).
//!
//! Messages without ferry headers, or that the caller's `accept` filter refuses, are counted
//! as [`RunnerStats::foreign`] and not applied.
//!
//! # Knowing it caught up
//!
//! [`ConsumerRunner::caught_up`] takes each partition's high watermark (read after the
//! producers stopped) and holds once every message below it was polled and has gone through
//! `apply_once` (applied, skipped or failed for good): nothing is in flight.
//! [`ConsumerRunner::settle`] is the wait around it once the producers have stopped: it reads
//! the watermarks itself ([`ConsumerRunner::high_watermarks`]) and waits until the runner has
//! caught up with them, or gives up when no message was processed for a while.
//! [`ConsumerRunner::stop`] ends polling and the tasks (one still retrying gives up) and
//! returns the final counters.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferry_core::{Backoff, BoxFuture};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::delivery::Delivery;
use crate::error::{BoxError, InboxError};
use crate::inbox::Inbox;
use crate::pool::Conn;
use crate::verdict::Verdict;

/// Failure examples kept in [`RunnerStats::examples`].
const MAX_EXAMPLES: usize = 10;

/// How long a delivery may fail with retryable errors before a WARN says so (a deadlock retried
/// at once is routine; a database down for this long is not).
pub const RETRY_WARN_AFTER: Duration = Duration::from_secs(10);

/// The effect a [`ConsumerRunner`] applies in each delivery's transaction (as for
/// [`Inbox::apply_once`]), shared by its tasks.
pub type Effect = Arc<
    dyn for<'c> Fn(Conn<'c>, &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>> + Send + Sync,
>;

/// An [`Effect`] from a closure (the call fixes the closure's signature, which a plain
/// `Arc::new` of a closure would not).
pub fn effect<F>(f: F) -> Effect
where
    F: for<'c> Fn(Conn<'c>, &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>>
        + Send
        + Sync
        + 'static,
{
    Arc::new(f)
}

/// Which deliveries a [`ConsumerRunner`] applies (the others count as foreign), e.g. by event
/// id prefix on a topic shared by several producers.
pub type Accept = Box<dyn Fn(&Delivery) -> bool + Send>;

/// Where and how a [`ConsumerRunner`] consumes.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// The topic ferry relays to.
    pub topic: String,
    /// The topic's partitions (each is read from its beginning).
    pub partitions: i32,
    /// The Inbox consumer name every delivery is recorded under.
    pub consumer: String,
    /// Apply tasks (at least 1). Default 4; with SQLite they queue on its one writer.
    pub workers: usize,
    /// Messages buffered per task between the polling thread and the task. Default 2048.
    pub queue: usize,
    /// Attempts of one delivery's transaction on retryable errors. Default `u32::MAX`: retried
    /// until it passes, however long the database is down. A bound makes a delivery that
    /// exhausts it count in [`RunnerStats::errors`] and its effect wait for the next start
    /// (which reads the topic from the beginning again): for tests, not for a consumer that
    /// must apply every event.
    pub max_attempts: u32,
    /// Waits between attempts. Default 10 ms doubling to 500 ms.
    pub retry: Backoff,
    /// Extra librdkafka properties (security settings, ...).
    pub properties: Vec<(String, String)>,
}

impl RunnerConfig {
    /// Every partition of `topic` on `brokers`, recorded as `consumer`, the rest at defaults.
    pub fn new(brokers: &str, topic: &str, partitions: i32, consumer: &str) -> Self {
        Self {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            partitions,
            consumer: consumer.to_string(),
            workers: 4,
            queue: 2048,
            max_attempts: u32::MAX,
            retry: Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(500),
            },
            properties: Vec::new(),
        }
    }
}

/// What a [`ConsumerRunner`] did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunnerStats {
    /// Messages polled from the topic (duplicates included).
    pub consumed: u64,
    /// Messages without ferry headers or refused by the `accept` filter (not applied).
    pub foreign: u64,
    /// [`Verdict::New`]: effect applied.
    pub new: u64,
    /// [`Verdict::Duplicate`]: a redelivery, effect skipped.
    pub duplicates: u64,
    /// [`Verdict::Gap`]: applied past a missing version.
    pub gaps: u64,
    /// [`Verdict::Early`]: held back, not applied.
    pub early: u64,
    /// [`Verdict::Stale`]: a version already covered, not applied.
    pub stale: u64,
    /// Deliveries whose effect returned an error (rolled back, not retried).
    pub effect_failures: u64,
    /// Deliveries that failed for good otherwise (not retryable, or attempts exhausted).
    pub errors: u64,
    /// Attempts retried after a retryable error.
    pub retries: u64,
    /// Up to ten examples of gaps, early or stale versions and failures.
    pub examples: Vec<String>,
}

/// Counters shared by the polling thread and the tasks.
#[derive(Default)]
struct Shared {
    stats: Mutex<RunnerStats>,
    /// Messages handed to a task, and those done with (`apply_once` returned for good).
    dispatched: AtomicU64,
    done: AtomicU64,
}

impl Shared {
    /// Adds one to the counter `field` picks, and keeps `example` if there is room.
    fn count(&self, field: fn(&mut RunnerStats) -> &mut u64, example: Option<String>) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        *field(&mut s) += 1;
        if let Some(e) = example.filter(|_| s.examples.len() < MAX_EXAMPLES) {
            s.examples.push(e);
        }
    }

    fn snapshot(&self) -> RunnerStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A running consumer: a polling thread and its apply tasks (see the module doc).
pub struct ConsumerRunner {
    shared: Arc<Shared>,
    /// Next offset to poll, per partition (`-1`: nothing polled yet).
    polled: Arc<Vec<AtomicI64>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    config: Arc<RunnerConfig>,
}

impl ConsumerRunner {
    /// Starts consuming `config.topic` into `inbox` with `effect`; `accept` (if any) picks the
    /// deliveries to apply. Must be called inside a tokio runtime (the tasks are spawned on
    /// it). Fails when the Kafka client cannot be created or the partitions assigned.
    pub fn start(
        inbox: Inbox,
        config: RunnerConfig,
        effect: Effect,
        accept: Option<Accept>,
    ) -> Result<Self, InboxError> {
        let reader: BaseConsumer = client(&config)
            // required by librdkafka; assign() joins no group and nothing is committed
            .set("group.id", format!("ferry-inbox-{}", config.consumer))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()
            .map_err(kafka)?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..config.partitions {
            tpl.add_partition_offset(&config.topic, p, Offset::Beginning)
                .map_err(kafka)?;
        }
        reader.assign(&tpl).map_err(kafka)?;

        let shared = Arc::new(Shared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let polled: Arc<Vec<AtomicI64>> =
            Arc::new((0..config.partitions).map(|_| AtomicI64::new(-1)).collect());
        let config = Arc::new(config);
        let (mut senders, mut tasks) = (Vec::new(), Vec::new());
        for _ in 0..config.workers.max(1) {
            let (tx, rx) = mpsc::channel::<Delivery>(config.queue.max(1));
            senders.push(tx);
            let task = Task {
                inbox: inbox.clone(),
                effect: effect.clone(),
                config: config.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
            };
            tasks.push(tokio::spawn(task.run(rx)));
        }
        let mut dispatch = Dispatch {
            senders,
            consumer: config.consumer.clone(),
            accept,
            shared: shared.clone(),
            polled: polled.clone(),
            closed: false,
        };
        let thread = {
            let stop = stop.clone();
            thread::Builder::new()
                .name("ferry-inbox-consumer".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match reader.poll(Duration::from_millis(50)) {
                            Some(Ok(m)) => dispatch.message(&m),
                            Some(Err(e)) => tracing::warn!("inbox consumer: kafka: {e}"),
                            None => {}
                        }
                    }
                })
                .map_err(|e| InboxError::Consumer(format!("cannot start its thread: {e}")))?
        };
        Ok(Self {
            shared,
            polled,
            stop,
            thread: Some(thread),
            tasks,
            config,
        })
    }

    /// Each partition's high watermark (the next offset to be written), read now on a client
    /// of its own (on a blocking thread: each read is a broker round trip, 5 s at most).
    pub async fn high_watermarks(&self) -> Result<Vec<i64>, InboxError> {
        let config = self.config.clone();
        let read = move || -> Result<Vec<i64>, InboxError> {
            let client: BaseConsumer = client(&config).create().map_err(kafka)?;
            (0..config.partitions)
                .map(|p| {
                    client
                        .fetch_watermarks(&config.topic, p, Duration::from_secs(5))
                        .map(|(_, high)| high)
                        .map_err(kafka)
                })
                .collect()
        };
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| InboxError::Consumer(format!("watermark task: {e}")))?
    }

    /// Once the producers have stopped: reads the topic's high watermarks and waits until the
    /// runner [caught up](Self::caught_up) with them (`Ok(true)`), or until no message was
    /// processed for `stall` (`Ok(false)`). `progress(processed, total)` is called once a
    /// second meanwhile (`total`: the messages below the watermarks). Fails when the
    /// watermarks cannot be read.
    pub async fn settle(
        &self,
        stall: Duration,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<bool, InboxError> {
        let high = self.high_watermarks().await?;
        let total: u64 = high.iter().map(|h| (*h).max(0) as u64).sum();
        let start = Instant::now();
        let mut next_line = start + Duration::from_secs(1);
        let (mut last, mut last_at) = (self.processed(), start);
        while !self.caught_up(&high) {
            let (now, n) = (Instant::now(), self.processed());
            if n != last {
                (last, last_at) = (n, now);
            } else if now.duration_since(last_at) >= stall {
                return Ok(false);
            }
            if now >= next_line {
                next_line += Duration::from_secs(1);
                progress(n, total);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(true)
    }

    /// Messages done with so far: through `apply_once` for good, or skipped as foreign.
    pub fn processed(&self) -> u64 {
        self.shared.done.load(Ordering::Relaxed) + self.stats().foreign
    }

    /// The counters so far.
    pub fn stats(&self) -> RunnerStats {
        self.shared.snapshot()
    }

    /// Whether every message below `high` (each partition's high watermark) was polled and
    /// none is still being applied.
    pub fn caught_up(&self, high: &[i64]) -> bool {
        let all_polled = high.iter().enumerate().all(|(p, h)| {
            *h <= 0
                || self
                    .polled
                    .get(p)
                    .is_some_and(|o| o.load(Ordering::Acquire) >= *h)
        });
        all_polled
            && self.shared.done.load(Ordering::Acquire)
                == self.shared.dispatched.load(Ordering::Acquire)
    }

    /// Stops polling and the tasks (one still retrying gives up) and returns the counters.
    pub async fn stop(mut self) -> RunnerStats {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // the thread ends within one 50 ms poll; joining it blocks
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.stats()
    }
}

impl Drop for ConsumerRunner {
    fn drop(&mut self) {
        // not stopped (an error path): the thread ends on its own, the tasks once its
        // senders are dropped
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The polling thread's side: hands each accepted message to the task of its aggregate
/// (blocking while that task's queue is full).
struct Dispatch {
    senders: Vec<mpsc::Sender<Delivery>>,
    consumer: String,
    accept: Option<Accept>,
    shared: Arc<Shared>,
    polled: Arc<Vec<AtomicI64>>,
    /// A task is gone (shutdown): ignore the rest.
    closed: bool,
}

impl Dispatch {
    fn message<M: Message>(&mut self, m: &M) {
        if self.closed {
            return;
        }
        self.shared.count(|s| &mut s.consumed, None);
        let headers: Vec<(&str, Option<&[u8]>)> = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key, h.value)).collect())
            .unwrap_or_default();
        match Delivery::from_headers(self.consumer.as_str(), headers) {
            Ok(d) if self.accept.as_ref().is_none_or(|accept| accept(&d)) => {
                let task = shard(&d.aggregate_id, self.senders.len());
                self.shared.dispatched.fetch_add(1, Ordering::AcqRel);
                if self.senders[task].blocking_send(d).is_err() {
                    // counted as done so nothing waits on it
                    self.shared.done.fetch_add(1, Ordering::AcqRel);
                    self.closed = true;
                    return;
                }
            }
            _ => self.shared.count(|s| &mut s.foreign, None),
        }
        if let Some(o) = usize::try_from(m.partition())
            .ok()
            .and_then(|p| self.polled.get(p))
        {
            o.fetch_max(m.offset() + 1, Ordering::AcqRel);
        }
    }
}

/// A Kafka client of `config`'s brokers and extra properties.
fn client(config: &RunnerConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    client.set("bootstrap.servers", &config.brokers);
    client
}

fn kafka(e: rdkafka::error::KafkaError) -> InboxError {
    InboxError::Consumer(e.to_string())
}

/// The task of an aggregate: by its slot, so the choice is stable across Rust versions and
/// processes (a `DefaultHasher` is neither).
fn shard(aggregate_id: &str, n: usize) -> usize {
    usize::from(ferry_core::slot_for(aggregate_id)) % n.max(1)
}

/// One apply task.
struct Task {
    inbox: Inbox,
    effect: Effect,
    config: Arc<RunnerConfig>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
}

impl Task {
    /// Every delivery of its aggregates, in the order the polling thread saw them.
    async fn run(self, mut rx: mpsc::Receiver<Delivery>) {
        while let Some(d) = rx.recv().await {
            self.apply(&d).await;
            self.shared.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// One delivery through `apply_once`, retried on retryable errors.
    async fn apply(&self, d: &Delivery) {
        let mut attempt = 1;
        let first_failure = Instant::now();
        let mut warned: Option<Instant> = None;
        loop {
            let effect = &*self.effect;
            let err = match self.inbox.apply_once(d, |c, d| effect(c, d)).await {
                Ok(v) => {
                    if warned.is_some() {
                        tracing::info!(event_id = %d.event_id, attempts = attempt, failing_secs = first_failure.elapsed().as_secs(), "inbox consumer: applied after retryable errors");
                    }
                    return self.verdict(d, v);
                }
                Err(e) => e,
            };
            if err.is_transient()
                && attempt < self.config.max_attempts
                && !self.stop.load(Ordering::Relaxed)
            {
                let failing = first_failure.elapsed();
                let due = match warned {
                    None => failing >= RETRY_WARN_AFTER,
                    Some(at) => at.elapsed() >= Duration::from_secs(60),
                };
                if due {
                    warned = Some(Instant::now());
                    tracing::warn!(event_id = %d.event_id, aggregate_id = %d.aggregate_id, attempts = attempt, failing_secs = failing.as_secs(), error = %err, "inbox consumer: a delivery keeps failing with a retryable error; retrying until it passes (its aggregate's later deliveries wait)");
                }
                self.shared.count(|s| &mut s.retries, None);
                tokio::time::sleep(self.config.retry.delay(attempt)).await;
                attempt += 1;
                continue;
            }
            tracing::error!(event_id = %d.event_id, attempts = attempt, "inbox consumer: {err}");
            if matches!(err, InboxError::Effect(_)) {
                self.shared
                    .count(|s| &mut s.effect_failures, Some(err.to_string()));
            } else {
                let example = format!("{} (after {attempt} attempts): {err}", d.event_id);
                self.shared.count(|s| &mut s.errors, Some(example));
            }
            return;
        }
    }

    /// Counts a verdict, with an example of anything but `New` and `Duplicate`.
    fn verdict(&self, d: &Delivery, v: Verdict) {
        let (id, agg) = (&d.event_id, &d.aggregate_id);
        let (field, example): (fn(&mut RunnerStats) -> &mut u64, _) = match v {
            Verdict::New => (|s| &mut s.new, None),
            Verdict::Duplicate => (|s| &mut s.duplicates, None),
            Verdict::Gap { expected, got } => (
                |s| &mut s.gaps,
                Some(format!("gap: {agg} v{got} before v{expected} ({id})")),
            ),
            Verdict::Early { expected, got } => (
                |s| &mut s.early,
                Some(format!("early: {agg} v{got} before v{expected} ({id})")),
            ),
            Verdict::Stale { applied_through } => (
                |s| &mut s.stale,
                Some(format!(
                    "stale: {agg} v{} already covered through v{applied_through} ({id})",
                    d.aggregate_version
                )),
            ),
        };
        self.shared.count(field, example);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_spread_over_every_task() {
        for n in [1, 3, 8] {
            let used: std::collections::BTreeSet<usize> = (0..200)
                .map(|i| shard(&format!("lg-abc123-a{i}"), n))
                .collect();
            assert_eq!(used, (0..n).collect(), "{n} tasks");
        }
    }
}
