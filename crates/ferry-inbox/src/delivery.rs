//! One delivery of an event to one consumer, read from the ferry message headers.
use crate::config::{GapPolicy, InboxConfig};
use crate::error::InboxError;

/// The longest consumer name, event id or aggregate id accepted (the columns' width).
pub const MAX_IDENT_LEN: usize = 255;

/// Message header carrying the event id (set by ferry's Kafka sink).
pub const HEADER_EVENT_ID: &str = "ferry-event-id";
/// Message header carrying the aggregate id.
pub const HEADER_AGGREGATE_ID: &str = "ferry-aggregate-id";
/// Message header carrying the aggregate version (decimal text).
pub const HEADER_AGGREGATE_VERSION: &str = "ferry-aggregate-version";
/// Message header marking a replayed message (`ferry replay`); its value is the replay id.
pub const HEADER_REPLAY: &str = "ferry-replay";

/// One delivery of an event to one consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The consumer (one logical subscriber: a service, or a projection within it). Dedupe and
    /// gap tracking are per consumer, so two consumers each apply the event once.
    pub consumer: String,
    /// The event's id (`ferry-event-id`), stable across redeliveries.
    pub event_id: String,
    /// The aggregate (`ferry-aggregate-id`).
    pub aggregate_id: String,
    /// The aggregate version (`ferry-aggregate-version`), from 1.
    pub aggregate_version: i64,
    /// The replay that re-published it (`ferry-replay`), if any. Ignored unless the Inbox
    /// accepts replays ([`InboxConfig::accept_replays`]).
    pub replay_id: Option<String>,
}

impl Delivery {
    /// A delivery of `event_id` (aggregate `aggregate_id` at `aggregate_version`) to `consumer`.
    pub fn new(
        consumer: impl Into<String>,
        event_id: impl Into<String>,
        aggregate_id: impl Into<String>,
        aggregate_version: i64,
    ) -> Self {
        Self {
            consumer: consumer.into(),
            event_id: event_id.into(),
            aggregate_id: aggregate_id.into(),
            aggregate_version,
            replay_id: None,
        }
    }

    /// The same delivery, re-published by replay `replay_id`.
    pub fn replayed(mut self, replay_id: impl Into<String>) -> Self {
        self.replay_id = Some(replay_id.into());
        self
    }

    /// The identity a consumer that accepts replays dedupes a replayed delivery by: the event id
    /// within the replay (`<event id>@replay:<replay id>`), so each replay is applied once.
    pub fn replay_key(&self) -> Option<String> {
        self.replay_id
            .as_ref()
            .map(|r| format!("{}@replay:{r}", self.event_id))
    }

    /// Reads the ferry headers of a received message (`(key, value)` pairs, e.g. from
    /// rdkafka's `Headers::iter()`), naming the header that is missing or malformed.
    pub fn from_headers<'h>(
        consumer: impl Into<String>,
        headers: impl IntoIterator<Item = (&'h str, Option<&'h [u8]>)>,
    ) -> Result<Self, InboxError> {
        // per header: absent (None), present without value (Some(None)), or its bytes
        let (mut id, mut agg, mut ver): (Option<Option<&[u8]>>, _, _) = (None, None, None);
        let mut replay: Option<&[u8]> = None;
        for (k, v) in headers {
            match k {
                HEADER_EVENT_ID => id = Some(v),
                HEADER_AGGREGATE_ID => agg = Some(v),
                HEADER_AGGREGATE_VERSION => ver = Some(v),
                HEADER_REPLAY => replay = v,
                _ => {}
            }
        }
        fn text(header: &'static str, v: Option<Option<&[u8]>>) -> Result<String, InboxError> {
            let bytes = v.flatten().ok_or(InboxError::MissingHeader { header })?;
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| InboxError::BadHeader {
                    header,
                    value: String::from_utf8_lossy(bytes).into_owned(),
                })
        }
        let event_id = text(HEADER_EVENT_ID, id)?;
        let aggregate_id = text(HEADER_AGGREGATE_ID, agg)?;
        let v = text(HEADER_AGGREGATE_VERSION, ver)?;
        let aggregate_version = v.trim().parse::<i64>().map_err(|_| InboxError::BadHeader {
            header: HEADER_AGGREGATE_VERSION,
            value: v.clone(),
        })?;
        let mut d = Self::new(consumer, event_id, aggregate_id, aggregate_version);
        d.replay_id = replay.map(|r| String::from_utf8_lossy(r).into_owned());
        Ok(d)
    }

    /// Checks the fields against the columns (and versions from 1 when gaps are tracked).
    pub fn validate(&self, config: &InboxConfig) -> Result<(), InboxError> {
        let tracked = config.gap_policy != GapPolicy::Off;
        for (field, value, required) in [
            ("consumer", &self.consumer, true),
            ("event_id", &self.event_id, true),
            ("aggregate_id", &self.aggregate_id, tracked),
        ] {
            if required && value.trim().is_empty() {
                return Err(InboxError::Empty { field });
            }
            if value.len() > MAX_IDENT_LEN {
                return Err(InboxError::TooLong {
                    field,
                    len: value.len(),
                    limit: MAX_IDENT_LEN,
                });
            }
            if value.contains('\0') {
                return Err(InboxError::Nul {
                    field,
                    value: value.clone(),
                });
            }
        }
        if tracked && self.aggregate_version < 1 {
            return Err(InboxError::BadVersion {
                aggregate_id: self.aggregate_id.clone(),
                version: self.aggregate_version,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ferry_headers() {
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            ("ferry-event-type", Some(b"OrderCreated")),
            (HEADER_EVENT_ID, Some(b"e-7-1")),
            (HEADER_AGGREGATE_ID, Some(b"order-7")),
            (HEADER_AGGREGATE_VERSION, Some(b"3")),
        ];
        let d = Delivery::from_headers("billing", h).unwrap();
        assert_eq!(d, Delivery::new("billing", "e-7-1", "order-7", 3));
    }

    #[test]
    fn header_errors_name_the_header() {
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            (HEADER_EVENT_ID, Some(b"e")),
            (HEADER_AGGREGATE_ID, Some(b"a")),
        ];
        let e = Delivery::from_headers("c", h).unwrap_err();
        assert!(
            matches!(e, InboxError::MissingHeader { header } if header == HEADER_AGGREGATE_VERSION)
        );
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            (HEADER_EVENT_ID, Some(b"e")),
            (HEADER_AGGREGATE_ID, Some(b"a")),
            (HEADER_AGGREGATE_VERSION, Some(b"v2")),
        ];
        let e = Delivery::from_headers("c", h).unwrap_err().to_string();
        assert!(
            e.contains(HEADER_AGGREGATE_VERSION) && e.contains("v2"),
            "{e}"
        );
    }

    #[test]
    fn validation_follows_the_policy() {
        let off = InboxConfig::new(GapPolicy::Off);
        let report = InboxConfig::default();
        let unversioned = Delivery::new("c", "e", "", 0);
        assert!(unversioned.validate(&off).is_ok());
        assert!(matches!(
            unversioned.validate(&report),
            Err(InboxError::Empty {
                field: "aggregate_id"
            })
        ));
        assert!(matches!(
            Delivery::new("c", "e", "a", 0).validate(&report),
            Err(InboxError::BadVersion { version: 0, .. })
        ));
        assert!(matches!(
            Delivery::new(" ", "e", "a", 1).validate(&off),
            Err(InboxError::Empty { field: "consumer" })
        ));
        let long = "x".repeat(MAX_IDENT_LEN + 1);
        assert!(matches!(
            Delivery::new("c", long, "a", 1).validate(&off),
            Err(InboxError::TooLong {
                field: "event_id",
                len: 256,
                limit: 255
            })
        ));
        assert!(matches!(
            Delivery::new("c", "e\0-1", "a", 1).validate(&off),
            Err(InboxError::Nul {
                field: "event_id",
                ..
            })
        ));
    }
}
