//! `ferry quarantine`: inspect and resolve quarantined events.
use std::sync::Arc;

use clap::builder::TypedValueParser;
use clap::Subcommand;
use ferry_core::OutboxStore;

use super::Failure;
use crate::config;

#[derive(Subcommand, Debug)]
pub enum QuarantineCmd {
    /// List quarantined events, oldest first.
    List {
        /// Max rows (1 to 100000).
        #[arg(long, default_value_t = config::DEFAULT_QUARANTINE_LIST_LIMIT,
              value_parser = clap::value_parser!(u64).range(1..=100_000).map(|n| n as usize))]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a quarantined event back to PENDING, keeping its id and payload.
    Requeue {
        /// Event id.
        event_id: String,
        /// Who is acting (recorded) [default: $USER].
        #[arg(long)]
        operator: Option<String>,
    },
    /// Never deliver a quarantined event; releases its aggregate's successors. Recorded.
    Skip {
        /// Event id.
        event_id: String,
        /// Who is acting (recorded) [default: $USER].
        #[arg(long)]
        operator: Option<String>,
    },
}

fn operator_name(o: Option<String>) -> String {
    o.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown-operator".into())
}

pub async fn run(cmd: QuarantineCmd, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    match cmd {
        QuarantineCmd::List { limit, json } => {
            let q = store.list_quarantined(limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&q).unwrap_or_default());
            } else if q.is_empty() {
                println!("no quarantined events");
            } else {
                println!(
                    "{:<40} {:<24} {:>8} {:>8} {:>9}  reason",
                    "event_id", "aggregate", "version", "attempts", "blocking"
                );
                for e in &q {
                    println!(
                        "{:<40} {:<24} {:>8} {:>8} {:>9}  {}",
                        e.event_id,
                        e.aggregate_id,
                        e.aggregate_version,
                        e.attempts,
                        e.blocked_successors,
                        e.last_error.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(0)
        }
        QuarantineCmd::Requeue { event_id, operator } => {
            let op = operator_name(operator);
            store
                .requeue(&ferry_core::OperatorAction::new(&event_id, &op))
                .await?;
            println!("requeued {event_id} (same id and payload), recorded operator {op}");
            Ok(0)
        }
        QuarantineCmd::Skip { event_id, operator } => {
            let op = operator_name(operator);
            store
                .skip(&ferry_core::OperatorAction::new(&event_id, &op))
                .await?;
            println!("skipped {event_id}: it will never be delivered; its aggregate's successors are released; recorded operator {op}");
            Ok(0)
        }
    }
}
