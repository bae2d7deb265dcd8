//! Sinks: where claimed events go. Every sink returns one [`Outcome`] per item, in order.
use std::io::Write;

use ferry_core::{BoxFuture, ClaimedEvent, Outcome, Payload};

pub mod health;
pub mod kafka;

/// A destination for claimed events.
///
/// `send_batch` must return exactly one outcome per input item, in input order, and must never
/// report `Acked` for an item the destination did not acknowledge.
pub trait Sink: Send + Sync {
    /// Short name for logs and metrics.
    fn name(&self) -> &'static str;
    /// Where it sends, for an operator (the Kafka sink: its bootstrap servers); never a
    /// credential.
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// The last error the sink's client reported on its own (connection failures, which reach
    /// no send's outcome), if any.
    fn last_error(&self) -> Option<String> {
        None
    }
    /// Sends a batch and reports each item's outcome.
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>>;
}

/// Acknowledges everything without sending: measures the engine alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move { vec![Outcome::Acked; items.len()] })
    }
}

/// Writes each event as one JSON line to stdout (debugging); acked once written and flushed.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdoutSink;

/// The JSON line written by [`StdoutSink`].
pub fn event_json(e: &ClaimedEvent) -> serde_json::Value {
    // text: the JSON it holds (else the text); bytes: an array of numbers, like `ferry enqueue`'s
    // JSON lines
    let payload: serde_json::Value = match &e.payload {
        Payload::Text(text) => {
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()))
        }
        Payload::Bytes(bytes) => serde_json::Value::from(bytes.as_slice()),
    };
    let headers: serde_json::Value =
        serde_json::from_str(&e.headers).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "event_id": e.token.event_id,
        "aggregate_id": e.aggregate_id,
        "aggregate_version": e.aggregate_version,
        "topic": e.topic,
        "key": e.key,
        "event_type": e.event_type,
        "headers": headers,
        "payload": payload,
    })
}

impl Sink for StdoutSink {
    fn name(&self) -> &'static str {
        "stdout"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let mut buf = Vec::with_capacity(items.len() * 256);
            for e in items {
                let _ = serde_json::to_writer(&mut buf, &event_json(e));
                buf.push(b'\n');
            }
            let mut out = std::io::stdout().lock();
            match out.write_all(&buf).and_then(|_| out.flush()) {
                Ok(()) => vec![Outcome::Acked; items.len()],
                Err(e) => vec![Outcome::Retry(format!("stdout: {e}")); items.len()],
            }
        })
    }
}
