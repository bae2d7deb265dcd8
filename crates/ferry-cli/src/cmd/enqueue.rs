//! `ferry enqueue`: events from JSON for demos and scripts.
use std::io::Read;
use std::sync::Arc;

use clap::Args;
use ferry_core::{NewEvent, OutboxStore, Payload};

use super::{fail, Failure};

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    /// One event as JSON: {"aggregate_id":…, "aggregate_version":…, "topic":…, "event_type":…,
    /// "payload":"<json text>", optional "event_id", "key", "headers"}. A binary payload is
    /// given as an array of byte values ("payload":[0,255]) or with --payload-file.
    #[arg(long, conflicts_with = "file")]
    pub event: Option<String>,
    /// A file (or - for stdin) holding an object, an array, or JSON lines of events.
    #[arg(long)]
    pub file: Option<String>,
    /// The payload of the --event (which then has no "payload") read from this file, byte for
    /// byte: JSON text unless --binary.
    #[arg(long, requires = "event")]
    pub payload_file: Option<String>,
    /// The --payload-file holds bytes (Avro, Protobuf, …): stored and sent unchanged, never
    /// parsed as JSON.
    #[arg(long, requires = "payload_file")]
    pub binary: bool,
}

/// The one event of `--event` whose payload is the content of `path` (bytes if `binary`).
fn event_with_payload_file(event: &str, path: &str, binary: bool) -> Result<NewEvent, Failure> {
    let mut obj: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(event).map_err(|e| {
            fail(
                2,
                format!("invalid event JSON (--event must be one object): {e}"),
            )
        })?;
    if obj.contains_key("payload") {
        return Err(fail(
            2,
            "--event has a \"payload\" and --payload-file gives one too: keep one of them",
        ));
    }
    obj.insert("payload".into(), serde_json::Value::String(String::new()));
    let mut ev: NewEvent = serde_json::from_value(serde_json::Value::Object(obj))
        .map_err(|e| fail(2, format!("invalid event JSON: {e}")))?;
    let bytes = std::fs::read(path).map_err(|e| fail(2, format!("cannot read {path}: {e}")))?;
    ev.payload = if binary {
        Payload::Bytes(bytes)
    } else {
        let text = String::from_utf8(bytes).map_err(|e| {
            fail(
                2,
                format!(
                    "{path} is not UTF-8 text (invalid byte at offset {}); pass --binary to \
                     enqueue it as bytes",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        Payload::Text(text)
    };
    Ok(ev)
}

fn parse_events(text: &str) -> Result<Vec<NewEvent>, Failure> {
    let t = text.trim();
    let bad = |e: serde_json::Error| fail(2, format!("invalid event JSON: {e}"));
    if t.starts_with('[') {
        return serde_json::from_str(t).map_err(bad);
    }
    if let Ok(one) = serde_json::from_str::<NewEvent>(t) {
        return Ok(vec![one]);
    }
    t.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| fail(2, format!("invalid event JSON on line {}: {e}", i + 1)))
        })
        .collect()
}

pub async fn run(a: EnqueueArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let events = match (&a.event, &a.payload_file) {
        (Some(event), Some(path)) => vec![event_with_payload_file(event, path, a.binary)?],
        (None, Some(_)) => {
            return Err(fail(
                2,
                "--payload-file is the payload of one --event: pass that event as --event JSON",
            ))
        }
        (_, None) if a.binary => {
            return Err(fail(
                2,
                "--binary needs --payload-file FILE (the bytes to enqueue)",
            ))
        }
        _ => parse_events(&read_input(a)?)?,
    };
    if events.is_empty() {
        return Err(fail(2, "nothing to enqueue: the input holds no events"));
    }
    let ids = store.enqueue(&events).await.map_err(|e| {
        let code = if matches!(e, ferry_core::EnqueueError::Store(_)) {
            1
        } else {
            2
        };
        fail(code, e.to_string())
    })?;
    ferry_core::failpoint::hit("enqueue-after-commit");
    for id in ids {
        println!("{id}");
    }
    Ok(0)
}

/// The events' JSON text: `--event`, or the `--file` (- for stdin).
fn read_input(a: EnqueueArgs) -> Result<String, Failure> {
    Ok(match (a.event, a.file) {
        (Some(e), _) => e,
        (None, Some(f)) if f == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| fail(1, format!("cannot read stdin: {e}")))?;
            s
        }
        (None, Some(f)) => {
            std::fs::read_to_string(&f).map_err(|e| fail(2, format!("cannot read {f}: {e}")))?
        }
        (None, None) => {
            return Err(fail(
                2,
                "nothing to enqueue: pass --event JSON or --file PATH (- for stdin)",
            ))
        }
    })
}
