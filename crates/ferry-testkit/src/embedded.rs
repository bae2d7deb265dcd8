//! An embedded Kafka-protocol broker: librdkafka's mock cluster, owned by a dedicated thread so
//! that handles to it are `Send` and usable from any task.
//!
//! It speaks the real Kafka protocol over loopback and can inject broker errors. Mind its
//! retention: each partition keeps only the last ~5 MiB or 100,000 messages (librdkafka's
//! `rdkafka_mock.c`), so consumers must read while producers write.
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::RDKafkaApiKey;
use rdkafka::types::RDKafkaRespErr;

/// Held for writing while a broker of any mock cluster in this process goes down or comes back,
/// and for reading while [`crate::RelayProcess::spawn`] starts a child and waits for its `exec`.
///
/// Taking a broker down closes its listening socket and binds a new one to the same port at
/// once (librdkafka's `rd_kafka_mock_broker_cmd`), and librdkafka aborts the whole process when
/// that bind fails. A child that has not finished its `exec` still holds a copy of the listening
/// socket (close-on-exec closes it only then), so the socket is still listening and the bind
/// fails. Measured with `tests/embedded_kafka.rs`: children started in a loop while three brokers
/// went down and up aborted the process in the first cycle, with this lock around `spawn` alone
/// as well (`spawn` returns before the child's descriptors are closed); with the wait for the
/// `exec`, two runs of 2,000 cycles passed; 2,000 cycles without children passed too.
pub(crate) static BROKER_COMMANDS_AND_SPAWNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Cmd {
    CreateTopic(String, i32, mpsc::Sender<Result<(), String>>),
    BrokerDown(i32, mpsc::Sender<Result<(), String>>),
    BrokerUp(i32, mpsc::Sender<Result<(), String>>),
    ProduceErrors(Vec<RDKafkaRespErr>, mpsc::Sender<Result<(), String>>),
    ClearProduceErrors(mpsc::Sender<Result<(), String>>),
    Rtt(i32, Duration, mpsc::Sender<Result<(), String>>),
    Stop,
}

/// A running mock cluster.
pub struct EmbeddedKafka {
    bootstrap: String,
    brokers: i32,
    tx: mpsc::Sender<Cmd>,
    thread: Option<thread::JoinHandle<()>>,
}

/// An embedded-broker failure.
#[derive(Debug, thiserror::Error)]
#[error("embedded Kafka: {0}")]
pub struct EmbeddedKafkaError(String);

impl EmbeddedKafka {
    /// Starts a mock cluster with `brokers` brokers.
    pub fn start(brokers: i32) -> Result<Self, EmbeddedKafkaError> {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let thread = thread::Builder::new()
            .name("ferry-mock-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                let res = |r: rdkafka::error::KafkaResult<()>| r.map_err(|e| e.to_string());
                while let Ok(cmd) = rx.recv() {
                    match cmd {
                        Cmd::CreateTopic(t, p, reply) => {
                            let _ = reply.send(res(cluster.create_topic(&t, p, brokers.min(3))));
                        }
                        Cmd::BrokerDown(b, reply) => {
                            let _ = reply.send(res(cluster.broker_down(b)));
                        }
                        Cmd::BrokerUp(b, reply) => {
                            let _ = reply.send(res(cluster.broker_up(b)));
                        }
                        Cmd::ProduceErrors(errs, reply) => {
                            cluster.request_errors(RDKafkaApiKey::Produce, &errs);
                            let _ = reply.send(Ok(()));
                        }
                        Cmd::ClearProduceErrors(reply) => {
                            cluster.clear_request_errors(RDKafkaApiKey::Produce);
                            let _ = reply.send(Ok(()));
                        }
                        Cmd::Rtt(b, d, reply) => {
                            let _ = reply.send(res(cluster.broker_round_trip_time(b, d)));
                        }
                        Cmd::Stop => break,
                    }
                }
            })
            .map_err(|e| EmbeddedKafkaError(e.to_string()))?;
        let bootstrap = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|e| EmbeddedKafkaError(e.to_string()))?
            .map_err(EmbeddedKafkaError)?;
        Ok(Self {
            bootstrap,
            brokers,
            tx,
            thread: Some(thread),
        })
    }

    /// Starts a mock cluster with `brokers` brokers and `topic` of `partitions` partitions.
    pub fn with_topic(
        brokers: i32,
        topic: &str,
        partitions: i32,
    ) -> Result<Self, EmbeddedKafkaError> {
        let cluster = Self::start(brokers)?;
        cluster.create_topic(topic, partitions)?;
        Ok(cluster)
    }

    /// [`Self::with_topic`] and a [`Verifier`](crate::Verifier) reading the topic back from the
    /// beginning (for tests: panics if either cannot start).
    pub fn verified(brokers: i32, topic: &str, partitions: i32) -> (Self, crate::verify::Verifier) {
        let cluster = Self::with_topic(brokers, topic, partitions).expect("mock Kafka cluster");
        let verifier =
            crate::verify::Verifier::start(cluster.bootstrap_servers(), topic, partitions)
                .expect("verifier");
        (cluster, verifier)
    }

    /// `bootstrap.servers` of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Number of brokers.
    pub fn brokers(&self) -> i32 {
        self.brokers
    }

    fn call(
        &self,
        make: impl FnOnce(mpsc::Sender<Result<(), String>>) -> Cmd,
    ) -> Result<(), EmbeddedKafkaError> {
        let (reply, rx) = mpsc::channel();
        self.tx
            .send(make(reply))
            .map_err(|_| EmbeddedKafkaError("mock cluster thread is gone".into()))?;
        rx.recv_timeout(Duration::from_secs(30))
            .map_err(|e| EmbeddedKafkaError(e.to_string()))?
            .map_err(EmbeddedKafkaError)
    }

    /// Creates a topic (the mock cluster has no admin API).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), EmbeddedKafkaError> {
        self.call(|r| Cmd::CreateTopic(topic.to_string(), partitions, r))
    }

    /// Takes broker `id` (1-based) down.
    pub fn broker_down(&self, id: i32) -> Result<(), EmbeddedKafkaError> {
        let _no_spawns = BROKER_COMMANDS_AND_SPAWNS
            .write()
            .unwrap_or_else(|e| e.into_inner());
        self.call(|r| Cmd::BrokerDown(id, r))
    }

    /// Brings broker `id` back.
    pub fn broker_up(&self, id: i32) -> Result<(), EmbeddedKafkaError> {
        let _no_spawns = BROKER_COMMANDS_AND_SPAWNS
            .write()
            .unwrap_or_else(|e| e.into_inner());
        self.call(|r| Cmd::BrokerUp(id, r))
    }

    /// Makes the next Produce requests fail with `errors`, one per request, in order.
    pub fn produce_errors(&self, errors: &[RDKafkaRespErr]) -> Result<(), EmbeddedKafkaError> {
        self.call(|r| Cmd::ProduceErrors(errors.to_vec(), r))
    }

    /// Delays every response of broker `id` by `rtt` (zero to stop): with a producer
    /// `request.timeout.ms` below it, requests time out mid-batch.
    pub fn broker_rtt(&self, id: i32, rtt: Duration) -> Result<(), EmbeddedKafkaError> {
        self.call(|r| Cmd::Rtt(id, rtt, r))
    }

    /// Clears injected Produce errors.
    pub fn clear_produce_errors(&self) -> Result<(), EmbeddedKafkaError> {
        self.call(Cmd::ClearProduceErrors)
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
