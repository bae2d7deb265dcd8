//! The immutable publish intent and its validation.
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::EnqueueError;
use crate::payload::Payload;
use crate::shard::{slot_for, SlotId};

/// Delivery state of an outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventState {
    /// Committed, waiting for a relay (or for its retry time).
    Pending,
    /// Taken by a claim; the broker outcome is unknown until acked/released/expired.
    Claimed,
    /// The broker acknowledged it. Says nothing about the consumer.
    Sent,
    /// A permanent error; blocks its aggregate's successors until an operator acts.
    Quarantined,
    /// An operator skipped a quarantined event: never delivered, successors released.
    Skipped,
}

impl EventState {
    /// The value stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Claimed => "CLAIMED",
            Self::Sent => "SENT",
            Self::Quarantined => "QUARANTINED",
            Self::Skipped => "SKIPPED",
        }
    }
}

impl fmt::Display for EventState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "PENDING" => Ok(Self::Pending),
            "CLAIMED" => Ok(Self::Claimed),
            "SENT" => Ok(Self::Sent),
            "QUARANTINED" => Ok(Self::Quarantined),
            "SKIPPED" => Ok(Self::Skipped),
            other => Err(format!("unknown outbox state {other:?}")),
        }
    }
}

/// Limits applied to every enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted payload in bytes (default 960 KiB, 983,040 bytes: with a key and
    /// identifiers of at most [`MAX_IDENT_LEN`] bytes, headers of at most [`MAX_HEADERS_BYTES`]
    /// and the record framing, a message stays under librdkafka's default `message.max.bytes`
    /// of 1,000,000 bytes and Kafka brokers' default of 1,048,588; a larger message would be
    /// accepted here and then refused by the broker, i.e. quarantined).
    pub max_payload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 960 * 1024,
        }
    }
}

/// Largest accepted headers, as their stored JSON object (8 KiB).
pub const MAX_HEADERS_BYTES: usize = 8 * 1024;

/// Longest accepted identifier (event id, aggregate id, topic, key, event type): the column width.
pub const MAX_IDENT_LEN: usize = 255;

/// A publish intent as the producer states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    /// Stable event id; `None` generates a UUIDv7 at validation time. Keep the id you were given
    /// when re-submitting after an unknown commit outcome.
    #[serde(default)]
    pub event_id: Option<String>,
    /// Aggregate identity (e.g. `order-7`); decides the shard slot and the ordering scope.
    pub aggregate_id: String,
    /// Aggregate version, `>= 1`; `(aggregate_id, aggregate_version)` is unique.
    pub aggregate_version: i64,
    /// Destination topic.
    pub topic: String,
    /// Message key; defaults to `aggregate_id` so one aggregate lands in one partition.
    #[serde(default)]
    pub key: Option<String>,
    /// Event type, e.g. `OrderCreated`.
    pub event_type: String,
    /// The payload, stored byte for byte: JSON text (checked to parse) or opaque bytes (never
    /// inspected; a JSON line gives them as an array of numbers).
    pub payload: Payload,
    /// Extra message headers (e.g. a W3C `traceparent`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl NewEvent {
    /// A minimal event: the key defaults to the aggregate id and the id is generated.
    pub fn new(
        aggregate_id: impl Into<String>,
        aggregate_version: i64,
        topic: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Into<Payload>,
    ) -> Self {
        Self {
            event_id: None,
            aggregate_id: aggregate_id.into(),
            aggregate_version,
            topic: topic.into(),
            key: None,
            event_type: event_type.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
        }
    }

    /// Sets a caller-given event id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.event_id = Some(id.into());
        self
    }

    /// Checks every field and returns the row to insert. Nothing is written on error.
    pub fn validate(&self, limits: &Limits) -> Result<ValidatedEvent, EnqueueError> {
        let event_id = match &self.event_id {
            Some(id) => {
                check_ident("event_id", id)?;
                id.clone()
            }
            None => new_event_id(),
        };
        check_ident("aggregate_id", &self.aggregate_id)?;
        if self.aggregate_version < 1 {
            return Err(EnqueueError::BadVersion {
                aggregate_id: self.aggregate_id.clone(),
                version: self.aggregate_version,
            });
        }
        check_topic(&self.topic)?;
        let key = self
            .key
            .clone()
            .unwrap_or_else(|| self.aggregate_id.clone());
        check_ident("key", &key)?;
        check_ident("event_type", &self.event_type)?;
        if self.payload.len() > limits.max_payload_bytes {
            return Err(EnqueueError::PayloadTooLarge {
                event_id,
                size: self.payload.len(),
                limit: limits.max_payload_bytes,
            });
        }
        if let Payload::Text(text) = &self.payload {
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                return Err(EnqueueError::InvalidJson {
                    event_id,
                    reason: e.to_string(),
                });
            }
        }
        let headers = serde_json::to_string(&self.headers).expect("string map serializes");
        if headers.len() > MAX_HEADERS_BYTES {
            return Err(EnqueueError::TooLong {
                field: "headers",
                len: headers.len(),
                limit: MAX_HEADERS_BYTES,
            });
        }
        Ok(ValidatedEvent {
            shard_slot: slot_for(&self.aggregate_id),
            event_id,
            aggregate_id: self.aggregate_id.clone(),
            aggregate_version: self.aggregate_version,
            topic: self.topic.clone(),
            key,
            event_type: self.event_type.clone(),
            headers,
            payload: self.payload.clone(),
        })
    }
}

fn check_ident(field: &'static str, value: &str) -> Result<(), EnqueueError> {
    if value.trim().is_empty() {
        return Err(EnqueueError::Empty { field });
    }
    if value.len() > MAX_IDENT_LEN {
        return Err(EnqueueError::TooLong {
            field,
            len: value.len(),
            limit: MAX_IDENT_LEN,
        });
    }
    if value.contains('\0') {
        return Err(EnqueueError::InvalidText {
            field,
            value: value.to_string(),
            reason: "contains a NUL character, which PostgreSQL cannot store",
        });
    }
    Ok(())
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn is_kafka_topic(topic: &str) -> bool {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    (1..=249).contains(&topic.len()) && topic != "." && topic != ".." && topic.chars().all(legal)
}

/// A topic the Kafka sink can deliver to ([`is_kafka_topic`]); any other would leave the intent
/// quarantined.
fn check_topic(topic: &str) -> Result<(), EnqueueError> {
    check_ident("topic", topic)?;
    if !is_kafka_topic(topic) {
        return Err(EnqueueError::InvalidText {
            field: "topic",
            value: topic.to_string(),
            reason: "a Kafka topic is 1 to 249 characters of letters, digits, '.', '_' and '-', \
                     and not '.' or '..'",
        });
    }
    Ok(())
}

/// A new time-ordered event id (UUIDv7, text form).
pub fn new_event_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// An event that passed [`NewEvent::validate`]: exactly the columns an enqueue writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedEvent {
    /// Stable event id (the given one, or a generated UUIDv7).
    pub event_id: String,
    /// Aggregate identity: non-empty, at most [`MAX_IDENT_LEN`] bytes.
    pub aggregate_id: String,
    /// Aggregate version (>= 1).
    pub aggregate_version: i64,
    /// `slot_for(aggregate_id)`.
    pub shard_slot: SlotId,
    /// Destination topic.
    pub topic: String,
    /// Message key (the aggregate id unless the producer gave one).
    pub key: String,
    /// Event type.
    pub event_type: String,
    /// Headers as a JSON object of strings.
    pub headers: String,
    /// The payload, checked to fit [`Limits::max_payload_bytes`] (and, if text, to parse as JSON).
    pub payload: Payload,
}

/// Validates a batch, also rejecting a duplicate `(aggregate, version)` or event id inside it.
pub fn validate_batch(
    events: &[NewEvent],
    limits: &Limits,
) -> Result<Vec<ValidatedEvent>, EnqueueError> {
    let mut out = Vec::with_capacity(events.len());
    let mut seen_versions = std::collections::HashSet::with_capacity(events.len());
    let mut seen_ids = std::collections::HashSet::with_capacity(events.len());
    for ev in events {
        let v = ev.validate(limits)?;
        if !seen_versions.insert((v.aggregate_id.clone(), v.aggregate_version)) {
            return Err(EnqueueError::DuplicateVersion {
                aggregate_id: v.aggregate_id,
                version: v.aggregate_version,
            });
        }
        if !seen_ids.insert(v.event_id.clone()) {
            return Err(EnqueueError::DuplicateEventId {
                event_id: v.event_id,
            });
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> NewEvent {
        NewEvent::new("order-7", 1, "orders", "OrderCreated", r#"{"orderId":7}"#)
    }

    #[test]
    fn valid_event_gets_id_slot_and_key() {
        let v = ev().validate(&Limits::default()).unwrap();
        assert_eq!(v.key, "order-7");
        assert_eq!(
            v.shard_slot, 59,
            "slot_for(\"order-7\"), pinned in shard.rs"
        );
        assert_eq!(v.event_id.len(), 36);
        assert_eq!(v.headers, "{}");
    }

    #[test]
    fn bad_inputs_are_named() {
        let l = Limits {
            max_payload_bytes: 16,
        };
        let mut e = ev();
        e.aggregate_version = 0;
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::BadVersion { version: 0, .. })
        ));
        let mut e = ev();
        e.topic = " ".into();
        assert_eq!(
            e.validate(&l).unwrap_err(),
            EnqueueError::Empty { field: "topic" }
        );
        let mut e = ev();
        e.key = Some(String::new());
        assert_eq!(
            e.validate(&l).unwrap_err(),
            EnqueueError::Empty { field: "key" }
        );
        let mut e = ev();
        e.payload = "{not json".into();
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::InvalidJson { .. })
        ));
        let mut e = ev();
        e.payload = format!("\"{}\"", "x".repeat(20)).into();
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::PayloadTooLarge {
                size: 22,
                limit: 16,
                ..
            })
        ));
        for topic in ["orders v1", "a/b", ".", "..", &"t".repeat(250)] {
            let mut e = ev();
            e.topic = topic.to_string();
            assert!(
                matches!(
                    e.validate(&l),
                    Err(EnqueueError::InvalidText { field: "topic", .. })
                ),
                "{topic}"
            );
        }
        let mut e = ev();
        e.topic = format!("Orders.v1_{}", "-".repeat(239));
        assert!(e.validate(&Limits::default()).is_ok());
        // bytes are never parsed, only measured
        let mut e = ev();
        e.payload = Payload::Bytes(vec![0x00, 0xff, 0xfe, b'{']);
        assert_eq!(
            e.validate(&l).unwrap().payload.as_bytes(),
            &[0x00, 0xff, 0xfe, b'{']
        );
        e.payload = Payload::Bytes(vec![0; 17]);
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::PayloadTooLarge { size: 17, .. })
        ));
        let mut e = ev();
        e.aggregate_id = "order\0-7".into();
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::InvalidText {
                field: "aggregate_id",
                ..
            })
        ));
        let mut e = ev();
        e.headers.insert("h".into(), "x".repeat(MAX_HEADERS_BYTES));
        assert!(matches!(
            e.validate(&l),
            Err(EnqueueError::TooLong {
                field: "headers",
                limit: MAX_HEADERS_BYTES,
                ..
            })
        ));
        // `{"h":"…"}`: the value and 8 bytes
        e.headers
            .insert("h".into(), "x".repeat(MAX_HEADERS_BYTES - 8));
        assert_eq!(e.validate(&l).unwrap().headers.len(), MAX_HEADERS_BYTES);
    }

    #[test]
    fn batch_rejects_internal_duplicates() {
        let err = validate_batch(&[ev(), ev()], &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            EnqueueError::DuplicateVersion {
                aggregate_id: "order-7".into(),
                version: 1
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("order-7") && msg.contains("version 1"),
            "{msg}"
        );
    }
}
