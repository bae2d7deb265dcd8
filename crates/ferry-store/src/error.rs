//! Error helpers shared by the backends: sqlx errors with context, URL parsing, and the errors
//! operator actions and mode switches give.
use std::str::FromStr;

use ferry_core::{
    DispatchMode, EnqueueError, EventRecord, StoreError, StoreErrorKind, ValidatedEvent,
};

/// `.ctx("what")` on a sqlx result: the error mapped by [`db_err`] with `what` as context.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|e| db_err(what, e))
    }
}

/// Parses a database URL into a backend's connect options; an error names the backend and shows
/// the URL as `shown` (redacted where it may carry a password).
pub(crate) fn url_options<O>(url: &str, backend: &str, shown: &str) -> Result<O, StoreError>
where
    O: FromStr<Err = sqlx::Error>,
{
    O::from_str(url).map_err(|e| {
        StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("invalid {backend} URL {shown}: {e}"),
        )
    })
}

/// The error of a requeue or skip of `event_id` that is not quarantined (`rec`: its record, if
/// it exists); every store, including ones outside this crate, gives this one.
pub fn not_quarantined(event_id: &str, rec: Option<EventRecord>) -> StoreError {
    match rec {
        None => StoreError::new(StoreErrorKind::InvalidInput, format!("no outbox event with id {event_id:?}")),
        Some(r) => StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("event {event_id:?} is {}, not QUARANTINED; only quarantined events can be requeued or skipped", r.state),
        ),
    }
}

/// Why a dispatch-mode switch to `mode` is refused while `others` live relays dispatch in
/// `current` mode.
pub(crate) fn mode_in_use(current: &str, others: i64, mode: DispatchMode) -> StoreError {
    StoreError::new(
        StoreErrorKind::InvalidInput,
        format!(
            "the outbox is dispatched in {current} mode by {others} live relay(s); \
             stop them (or start this relay with --dispatch {current}) before switching to {mode}"
        ),
    )
}

/// Classifies a sqlx error the same way on every backend (shared with ferry-inbox).
pub fn error_kind(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
        sqlx::Error::Database(d) => {
            // sqlx reports the SQLSTATE as `code()`; MySQL's own error number says more.
            let code = match d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                Some(my) => my.number().to_string(),
                None => d.code().map(|c| c.to_string()).unwrap_or_default(),
            };
            let msg = d.message().to_ascii_lowercase();
            match code.as_str() {
                // PostgreSQL serialization failure / deadlock / lock timeout; MySQL deadlock /
                // lock wait timeout / MariaDB "record has changed since last read"; SQLite
                // BUSY / LOCKED / BUSY_SNAPSHOT
                "40001" | "40P01" | "55P03" | "1213" | "1205" | "1020" | "5" | "6" | "517" => {
                    StoreErrorKind::Conflict
                }
                // undefined table/column (PostgreSQL, MySQL)
                "42P01" | "42703" | "1146" | "1054" => StoreErrorKind::Schema,
                // PostgreSQL admin shutdown / idle-in-transaction timeout; MySQL server gone
                "57P01" | "25P03" | "2006" | "2013" | "1927" => StoreErrorKind::Unavailable,
                // conditions that pass: PostgreSQL crash shutdown, starting up or in recovery,
                // too many connections, connection failures; MySQL too many connections;
                // SQLite database or disk full
                "57P02" | "57P03" | "53300" | "08000" | "08001" | "08003" | "08004" | "08006"
                | "1040" | "13" => StoreErrorKind::Unavailable,
                _ if msg.contains("no such table") || msg.contains("no such column") => {
                    StoreErrorKind::Schema
                }
                _ => StoreErrorKind::Other,
            }
        }
        _ => StoreErrorKind::Other,
    }
}

/// Maps a sqlx error to the store's classification, keeping the source.
pub(crate) fn db_err(context: &str, e: sqlx::Error) -> StoreError {
    let kind = error_kind(&e);
    let hint = if kind == StoreErrorKind::Schema {
        " (run `ferry migrate`)"
    } else {
        ""
    };
    StoreError::with_source(kind, format!("{context}: {e}{hint}"), e)
}

/// Classifies a unique violation raised by an enqueue of `events`, naming the duplicate.
pub(crate) fn enqueue_err(events: &[ValidatedEvent], e: sqlx::Error) -> EnqueueError {
    if let sqlx::Error::Database(d) = &e {
        if d.kind() == sqlx::error::ErrorKind::UniqueViolation {
            // The constraint name (PostgreSQL) or message (MySQL, SQLite) says which key.
            let mut text = d.message().to_string();
            if let Some(c) = d.constraint() {
                text.push(' ');
                text.push_str(c);
            }
            if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                if let Some(detail) = pg.detail() {
                    text.push(' ');
                    text.push_str(detail);
                }
            }
            let by_id = text.contains("event_id");
            for ev in events {
                if by_id {
                    if text.contains(&ev.event_id) || events.len() == 1 {
                        return EnqueueError::DuplicateEventId {
                            event_id: ev.event_id.clone(),
                        };
                    }
                } else {
                    let pg = format!("({}, {})", ev.aggregate_id, ev.aggregate_version);
                    let my = format!("'{}-{}'", ev.aggregate_id, ev.aggregate_version);
                    if text.contains(&pg) || text.contains(&my) || events.len() == 1 {
                        return EnqueueError::DuplicateVersion {
                            aggregate_id: ev.aggregate_id.clone(),
                            version: ev.aggregate_version,
                        };
                    }
                }
            }
            return EnqueueError::Store(format!("duplicate key: {text}"));
        }
    }
    EnqueueError::Store(db_err("enqueue failed", e).to_string())
}

/// A heartbeat of `owner` found its membership row held, live, by another instance (every store
/// gives this error, including ones outside this crate).
pub fn owner_in_use(owner: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::OwnerInUse,
        format!("owner id {owner:?} is held by another live relay process (its membership has not expired)"),
    )
}
