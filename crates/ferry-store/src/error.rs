//! Error helpers shared by the backends: sqlx errors with context, URL parsing, and the errors
//! operator actions and mode switches give.
use std::str::FromStr;

use ferry_core::{DispatchMode, EventRecord, StoreError, StoreErrorKind};

use crate::db_err;

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
