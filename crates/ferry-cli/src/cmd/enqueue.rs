//! `ferry enqueue`: events from JSON for demos and scripts.
use std::io::Read;
use std::sync::Arc;

use clap::Args;
use ferry_core::{NewEvent, OutboxStore};

use super::{fail, Failure};

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    /// One event as JSON: {"aggregate_id":…, "aggregate_version":…, "topic":…, "event_type":…,
    /// "payload":"<json text>", optional "event_id", "key", "headers"}.
    #[arg(long, conflicts_with = "file")]
    pub event: Option<String>,
    /// A file (or - for stdin) holding an object, an array, or JSON lines of events.
    #[arg(long)]
    pub file: Option<String>,
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
    let text = match (a.event, a.file) {
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
    };
    let events = parse_events(&text)?;
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
