//! Why a run could not be carried out. Verification failures (loss, reordering) are not errors:
//! they are results, reported and turned into exit code 1 by `main`.
use std::path::PathBuf;

/// A failure that stops the run (exit code 3). Every message says what failed and, where the
/// user can fix it, how. Database URLs in messages are always redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The outbox store reported an error (connect, migrate, status).
    #[error("database: {0}")]
    Store(#[from] ferry_core::StoreError),
    /// A statement of loadgen's own (setup, business table, checks) failed.
    #[error("database: {context}: {source}")]
    Sql {
        context: String,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },
    /// The database server could not be reached.
    #[error("cannot connect to {url}: {source} (is the server running and the URL right?)")]
    Connect {
        url: String,
        /// The cause.
        #[source]
        source: ferry_core::StoreError,
    },
    /// The run cannot be set up as asked (what and how to fix it).
    #[error("{0}")]
    Setup(String),
    /// A producer gave up (repeated failures, or a commit outcome it could not determine).
    #[error(transparent)]
    Producer(#[from] ferry_testkit::workload::ProducerError),
    /// A producer of the producer-only baseline phase gave up (the producer's own error).
    #[error("baseline phase: {0}")]
    Baseline(String),
    /// Relays could not be started or died.
    #[error("relay: {0}")]
    Relay(String),
    /// The broker or the verifier could not be set up.
    #[error("kafka: {0}")]
    Kafka(String),
    /// A file could not be written or read.
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps a driver error with what loadgen was doing.
    pub fn sql(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let context = context.into();
        move |source| Error::Sql { context, source }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
