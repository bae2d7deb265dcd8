//! The inbox's error type and the mapping of sqlx errors onto ferry's classification.
use ferry_core::{StoreError, StoreErrorKind};

/// A boxed error, as returned by an [`Inbox::apply_once`](crate::Inbox::apply_once) effect.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a delivery could not be recorded. After any error inside the consumer's transaction,
/// roll it back: nothing of the delivery is committed, and the redelivery starts afresh.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// A required field is empty or blank.
    #[error("{field} must not be empty")]
    Empty {
        /// The field.
        field: &'static str,
    },
    /// A field exceeds its column width.
    #[error("{field} is {len} bytes, over the {limit}-byte limit")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A field holds a NUL character, which PostgreSQL cannot store (refused on every backend).
    #[error("{field} {value:?} contains a NUL character")]
    Nul {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// Gap tracking needs versions from 1.
    #[error("aggregate {aggregate_id:?} version {version} is invalid: gap detection needs versions starting at 1 (use GapPolicy::Off for unversioned messages)")]
    BadVersion {
        /// The aggregate.
        aggregate_id: String,
        /// The bad version.
        version: i64,
    },
    /// A received message lacks a ferry header.
    #[error("the message has no {header} header; messages relayed by ferry carry ferry-event-id, ferry-aggregate-id and ferry-aggregate-version")]
    MissingHeader {
        /// The header.
        header: &'static str,
    },
    /// A ferry header has an unusable value.
    #[error("header {header} has an invalid value {value:?}")]
    BadHeader {
        /// The header.
        header: &'static str,
        /// Its value (lossy).
        value: String,
    },
    /// The database failed; [`StoreError::kind`] classifies it (`Conflict` and `Unavailable`
    /// are retryable, `Schema` means the inbox migrations were not applied, or were applied by
    /// a newer ferry).
    #[error(transparent)]
    Database(#[from] StoreError),
    /// The caller's effect failed; its transaction was rolled back.
    #[error("the effect failed: {0}")]
    Effect(#[source] BoxError),
    /// The [`ConsumerRunner`](crate::runner::ConsumerRunner)'s Kafka client could not be set up
    /// (bad broker list or properties, unknown topic partitions).
    #[error("the inbox consumer cannot read from Kafka: {0}")]
    Consumer(String),
}

impl InboxError {
    /// True when retrying the whole transaction later may succeed (deadlock, serialization
    /// failure, lock timeout, `SQLITE_BUSY`, connection lost).
    pub fn is_transient(&self) -> bool {
        matches!(self, InboxError::Database(e) if e.is_transient())
    }

    /// The database error's classification, if this is one.
    pub fn store_kind(&self) -> Option<StoreErrorKind> {
        match self {
            InboxError::Database(e) => Some(e.kind()),
            _ => None,
        }
    }
}

/// Maps a sqlx error to ferry's classification, keeping the source (mirrors `ferry_store`).
pub(crate) fn db_err(context: &str, e: sqlx::Error) -> InboxError {
    let kind = ferry_store::error_kind(&e);
    let hint = if kind == StoreErrorKind::Schema {
        " (apply the inbox migrations: Inbox::migrate or ferry_inbox::<backend>::migrate)"
    } else {
        ""
    };
    InboxError::Database(StoreError::with_source(
        kind,
        format!("inbox {context}: {e}{hint}"),
        e,
    ))
}

/// Classifies an effect's error: a sqlx error keeps its database classification.
pub(crate) fn effect_err(e: BoxError) -> InboxError {
    match e.downcast::<sqlx::Error>() {
        Ok(e) => db_err("effect", *e),
        Err(e) => InboxError::Effect(e),
    }
}

/// True for a unique-key violation.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}
