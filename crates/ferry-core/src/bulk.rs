//! Bulk operator actions on quarantined events ([`OutboxStore::bulk_quarantine`]) and the record
//! each one leaves ([`OutboxStore::operator_actions`]).
//!
//! A bulk action selects the quarantined events that match a [`QuarantineFilter`] at the moment
//! it runs and moves them all in one transaction, with its [`OperatorRecord`] written in the same
//! transaction: the record's count is the number of events the action moved, and either both
//! are committed or neither is. The state transitions are the single-event ones
//! ([`OperatorActions::requeue`], [`OperatorActions::skip`]); only the selection differs.
//!
//! [`OutboxStore::bulk_quarantine`]: crate::OutboxStore::bulk_quarantine
//! [`OutboxStore::operator_actions`]: crate::OutboxStore::operator_actions
//! [`OperatorActions::requeue`]: crate::OperatorActions::requeue
//! [`OperatorActions::skip`]: crate::OperatorActions::skip
use crate::error::{StoreError, StoreErrorKind};
use crate::time::Micros;

/// The longest `reason` a record keeps (bytes).
pub const MAX_REASON_LEN: usize = 4096;

/// Which quarantined events a bulk action selects. Every field that is set narrows the
/// selection (they combine with AND); at least one must be set.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct QuarantineFilter {
    /// The intent's topic, exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The intent's aggregate id, exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_id: Option<String>,
    /// A substring of the event's last error (case-sensitive, byte for byte).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// The intent was created (`created_at`, when it was written) at or after this time (µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_since: Option<Micros>,
    /// The intent was created before this time (µs, exclusive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_until: Option<Micros>,
}

impl QuarantineFilter {
    /// True when no field is set: the filter would select every quarantined event.
    pub fn is_empty(&self) -> bool {
        self.topic.is_none()
            && self.aggregate_id.is_none()
            && self.error_contains.is_none()
            && self.created_since.is_none()
            && self.created_until.is_none()
    }

    /// Refuses an empty filter, an empty or over-long text field and an empty time range, with
    /// an [`StoreErrorKind::InvalidInput`] error naming the field.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.is_empty() {
            return Err(invalid(
                "refusing to act on every quarantined event; give a filter".into(),
            ));
        }
        for (name, v) in [
            ("topic", &self.topic),
            ("aggregate", &self.aggregate_id),
            ("error", &self.error_contains),
        ] {
            match v {
                Some(s) if s.is_empty() => {
                    return Err(invalid(format!("the {name} filter is empty: give a value")))
                }
                Some(s) if s.len() > MAX_REASON_LEN => {
                    return Err(invalid(format!(
                        "the {name} filter is longer than {MAX_REASON_LEN} bytes"
                    )))
                }
                _ => {}
            }
        }
        if let (Some(a), Some(b)) = (self.created_since, self.created_until) {
            if a >= b {
                return Err(invalid(
                    "the time range is empty: --since must be earlier than --until".into(),
                ));
            }
        }
        Ok(())
    }
}

/// What a bulk action does to each event it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkVerb {
    /// `QUARANTINED → PENDING`, due now, attempts reset, same id and payload.
    Requeue,
    /// `QUARANTINED → SKIPPED`: never delivered; the aggregate's successors are released.
    Skip,
}

impl BulkVerb {
    /// `requeue` or `skip`, as records store it.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkVerb::Requeue => "requeue",
            BulkVerb::Skip => "skip",
        }
    }

    /// The state the selected events move to.
    pub fn target_state(self) -> &'static str {
        match self {
            BulkVerb::Requeue => "PENDING",
            BulkVerb::Skip => "SKIPPED",
        }
    }
}

/// [`OutboxStore::bulk_quarantine`](crate::OutboxStore::bulk_quarantine): an operator's decision
/// on every quarantined event a filter selects.
#[derive(Debug, Clone, Copy)]
pub struct BulkRequest<'a> {
    /// Requeue or skip.
    pub verb: BulkVerb,
    /// Which quarantined events.
    pub filter: &'a QuarantineFilter,
    /// Who decided (recorded, and in each event's `resolved_by`).
    pub operator: &'a str,
    /// Why (recorded).
    pub reason: &'a str,
    /// Count (and sample) what matches now; change and record nothing.
    pub dry_run: bool,
    /// How many matching event ids a dry run lists, oldest first.
    pub sample: usize,
}

impl BulkRequest<'_> {
    /// [`QuarantineFilter::validate`], a non-empty operator of at most
    /// [`MAX_IDENT_LEN`](crate::MAX_IDENT_LEN) bytes, and, unless a dry run, a non-empty
    /// reason of at most [`MAX_REASON_LEN`] bytes.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.filter.validate()?;
        if self.operator.is_empty() || self.operator.len() > crate::event::MAX_IDENT_LEN {
            return Err(invalid(format!(
                "the operator name must be 1 to {} bytes",
                crate::event::MAX_IDENT_LEN
            )));
        }
        if !self.dry_run && self.reason.trim().is_empty() {
            return Err(invalid(
                "a bulk action needs a reason: give --reason TEXT (it is recorded)".into(),
            ));
        }
        if self.reason.len() > MAX_REASON_LEN {
            return Err(invalid(format!(
                "the reason is longer than {MAX_REASON_LEN} bytes"
            )));
        }
        Ok(())
    }
}

/// What a bulk action did, or in a dry run would do.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BulkOutcome {
    /// Dry run: the quarantined events that match now. Otherwise: the events the action moved
    /// (and its record's count).
    pub count: u64,
    /// Dry run: up to `sample` of their event ids, oldest first. Empty otherwise.
    pub sample: Vec<String>,
}

/// One recorded operator action ([`OutboxStore::operator_actions`](crate::OutboxStore::operator_actions)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OperatorRecord {
    /// Its id, increasing with every record.
    pub id: i64,
    /// When it committed (µs since the epoch; the database's clock, SQLite: the process's).
    pub at_us: Micros,
    /// Who.
    pub operator: String,
    /// `requeue` or `skip`.
    pub action: String,
    /// Why.
    pub reason: String,
    /// The dispatch mode it ran in (`row` or `cursor`).
    pub dispatch: String,
    /// How many events it moved.
    pub count: i64,
    /// The filter it selected them by.
    pub filter: QuarantineFilter,
}

fn invalid(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(filter: &'a QuarantineFilter, reason: &'a str, dry_run: bool) -> BulkRequest<'a> {
        BulkRequest {
            verb: BulkVerb::Requeue,
            filter,
            operator: "alice",
            reason,
            dry_run,
            sample: 10,
        }
    }

    #[test]
    fn an_empty_filter_is_refused() {
        let e = QuarantineFilter::default().validate().unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
        assert!(e
            .to_string()
            .contains("refusing to act on every quarantined event; give a filter"));
    }

    #[test]
    fn bad_fields_are_refused() {
        let empty_topic = QuarantineFilter {
            topic: Some(String::new()),
            ..Default::default()
        };
        assert!(empty_topic.validate().is_err());
        let backwards = QuarantineFilter {
            created_since: Some(10),
            created_until: Some(10),
            ..Default::default()
        };
        assert!(backwards.validate().is_err());
        let ok = QuarantineFilter {
            created_since: Some(10),
            created_until: Some(11),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn a_reason_is_required_unless_dry_run() {
        let f = QuarantineFilter {
            topic: Some("orders".into()),
            ..Default::default()
        };
        assert!(req(&f, "  ", false).validate().is_err());
        assert!(req(&f, "", true).validate().is_ok());
        assert!(req(&f, "topic created", false).validate().is_ok());
    }
}
