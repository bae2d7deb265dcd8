//! Errors of the store contract.
use std::fmt;

/// Why an enqueue was refused. Nothing was written when this is returned (the caller's
/// transaction should be rolled back if the error came from the database).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// `(aggregate_id, aggregate_version)` already exists: one event per aggregate version.
    #[error("aggregate {aggregate_id:?} already has an event at version {version}; versions are unique per aggregate")]
    DuplicateVersion {
        /// The aggregate.
        aggregate_id: String,
        /// The duplicated version.
        version: i64,
    },
    /// The event id already exists.
    #[error("event id {event_id:?} already exists; event ids are unique")]
    DuplicateEventId {
        /// The duplicated id.
        event_id: String,
    },
    /// The payload is not a JSON document.
    #[error("payload of event {event_id:?} is not valid JSON: {reason}")]
    InvalidJson {
        /// The event.
        event_id: String,
        /// The parser's message.
        reason: String,
    },
    /// The payload exceeds [`crate::Limits::max_payload_bytes`].
    #[error("payload of event {event_id:?} is {size} bytes, over the {limit}-byte limit (max_payload_bytes)")]
    PayloadTooLarge {
        /// The event.
        event_id: String,
        /// Payload size.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// A required text field is empty or blank.
    #[error("{field} must not be empty")]
    Empty {
        /// The field.
        field: &'static str,
    },
    /// A text field exceeds its column width.
    #[error("{field} is {len} bytes, over the {limit}-byte limit")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A text field holds what its column or the broker cannot take (a NUL character, which
    /// PostgreSQL cannot store; a topic name Kafka refuses).
    #[error("{field} {value:?} is invalid: {reason}")]
    InvalidText {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// Aggregate versions start at 1.
    #[error("aggregate {aggregate_id:?} version {version} is invalid: versions start at 1")]
    BadVersion {
        /// The aggregate.
        aggregate_id: String,
        /// The bad version.
        version: i64,
    },
    /// The database failed (connection, I/O, ...); not the caller's input.
    #[error("database error during enqueue: {0}")]
    Store(String),
}

/// Classification of a [`StoreError`], so callers need not know the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// Could not connect / connection lost / pool timed out: retry later.
    Unavailable,
    /// Serialization failure or deadlock: the transaction may simply be retried.
    Conflict,
    /// The schema is missing or too old (run `ferry migrate`), or newer than this build knows.
    Schema,
    /// A bad argument (unknown event id, wrong state for the operation, ...).
    InvalidInput,
    /// The relay owner id is held by another live relay process (its membership row has not
    /// expired): owner ids must be unique per process.
    OwnerInUse,
    /// Anything else.
    Other,
}

/// A storage failure. The message never contains credentials.
#[derive(Debug, thiserror::Error)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StoreError {
    /// A new error of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A new error keeping its source.
    pub fn with_source(
        kind: StoreErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The classification.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::Conflict
        )
    }
}
