//! `ferry quarantine`: inspect and resolve quarantined events.
use std::sync::Arc;

use clap::builder::TypedValueParser;
use clap::{Args, Subcommand};
use ferry_core::{BulkRequest, BulkVerb, OperatorRecord, OutboxStore, QuarantineFilter};

use super::{fail, Failure, OperatorArg};
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
    /// Put a quarantined event back to PENDING, keeping its id and payload: EVENT_ID, or every
    /// quarantined event a filter selects (--where-*, --since, --until; a dry run unless --yes).
    Requeue(ActionArgs),
    /// Never deliver a quarantined event; releases its aggregate's successors. Recorded.
    /// EVENT_ID, or every quarantined event a filter selects (a dry run unless --yes).
    Skip(ActionArgs),
}

/// What `requeue` and `skip` act on, and who acts.
#[derive(Args, Debug)]
pub struct ActionArgs {
    /// Event id (omit it to select by filter).
    event_id: Option<String>,
    #[command(flatten)]
    operator: OperatorArg,
    #[command(flatten)]
    bulk: BulkArgs,
}

/// The filter form of `requeue` and `skip`: every flag given narrows the selection (AND).
#[derive(Args, Debug)]
pub struct BulkArgs {
    /// Select quarantined events of this topic.
    #[arg(long, value_name = "TOPIC", conflicts_with = "event_id")]
    where_topic: Option<String>,
    /// Select quarantined events of this aggregate id.
    #[arg(long, value_name = "AGGREGATE_ID", conflicts_with = "event_id")]
    where_aggregate: Option<String>,
    /// Select quarantined events whose last error contains TEXT (case-sensitive).
    #[arg(long, value_name = "TEXT", conflicts_with = "event_id")]
    where_error: Option<String>,
    /// Select intents created at or after TIME (UTC, RFC 3339: 2026-12-06T08:00:00Z).
    #[arg(long, value_name = "TIME", conflicts_with = "event_id")]
    since: Option<String>,
    /// Select intents created before TIME (UTC, RFC 3339).
    #[arg(long, value_name = "TIME", conflicts_with = "event_id")]
    until: Option<String>,
    /// Count and list what the filter selects now; change nothing.
    #[arg(long, conflicts_with_all = ["event_id", "yes"])]
    dry_run: bool,
    /// Act on what the filter selects (without it the command is a dry run).
    #[arg(long, conflicts_with = "event_id")]
    yes: bool,
    /// Why (recorded with the action; required with --yes).
    #[arg(long, value_name = "TEXT", conflicts_with = "event_id")]
    reason: Option<String>,
}

/// Event ids a dry run lists.
const SAMPLE: usize = 10;

impl BulkArgs {
    /// The filter, its times parsed (exit 2 on a bad one).
    fn filter(&self) -> Result<QuarantineFilter, Failure> {
        let time = |flag: &str, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    super::reconcile::rfc3339_micros(s.trim()).ok_or_else(|| {
                        fail(
                            2,
                            format!(
                                "invalid {flag} {s:?}: use a UTC time like 2026-12-06T08:00:00Z"
                            ),
                        )
                    })
                })
                .transpose()
        };
        Ok(QuarantineFilter {
            topic: self.where_topic.clone(),
            aggregate_id: self.where_aggregate.clone(),
            error_contains: self.where_error.clone(),
            created_since: time("--since", &self.since)?,
            created_until: time("--until", &self.until)?,
        })
    }

    /// The filter as given, for messages.
    fn describe(&self) -> String {
        [
            ("--where-topic", &self.where_topic),
            ("--where-aggregate", &self.where_aggregate),
            ("--where-error", &self.where_error),
            ("--since", &self.since),
            ("--until", &self.until),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v:?}")))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

pub async fn run(cmd: QuarantineCmd, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let (verb, a) = match cmd {
        QuarantineCmd::List { limit, json } => return list(limit, json, store).await,
        QuarantineCmd::Requeue(a) => (BulkVerb::Requeue, a),
        QuarantineCmd::Skip(a) => (BulkVerb::Skip, a),
    };
    let op = a.operator.name();
    let Some(event_id) = a.event_id else {
        return bulk(verb, a.bulk, op, store).await;
    };
    let action = ferry_core::OperatorAction::new(&event_id, &op);
    match verb {
        BulkVerb::Requeue => {
            store.requeue(&action).await?;
            println!("requeued {event_id} (same id and payload), recorded operator {op}");
        }
        BulkVerb::Skip => {
            store.skip(&action).await?;
            println!("skipped {event_id}: it will never be delivered; its aggregate's successors are released; recorded operator {op}");
        }
    }
    Ok(0)
}

/// `list`: the quarantined events, oldest first, as a table or JSON.
async fn list(limit: usize, json: bool, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
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

/// The filter form: a dry run (`--dry-run`, or no `--yes`) counts and lists; `--yes` acts and
/// records.
async fn bulk(
    verb: BulkVerb,
    b: BulkArgs,
    operator: String,
    store: Arc<dyn OutboxStore>,
) -> Result<u8, Failure> {
    let filter = b.filter()?;
    let dry_run = b.dry_run || !b.yes;
    let req = BulkRequest {
        verb,
        filter: &filter,
        operator: &operator,
        reason: b.reason.as_deref().unwrap_or(""),
        dry_run,
        sample: SAMPLE,
    };
    let out = store.bulk_quarantine(&req).await?;
    let (what, done) = match verb {
        BulkVerb::Requeue => (
            "requeue",
            "requeued (PENDING, due now, same ids and payloads)",
        ),
        BulkVerb::Skip => (
            "skip",
            "skipped (never delivered; their successors are released)",
        ),
    };
    let filter_text = b.describe();
    if !dry_run {
        println!(
            "{done}: {} quarantined event(s) matching {filter_text}; recorded as operator {operator}'s action",
            out.count
        );
        return Ok(0);
    }
    println!("{} quarantined event(s) match {filter_text} now", out.count);
    if !out.sample.is_empty() {
        let more = out.count.saturating_sub(out.sample.len() as u64);
        let tail = if more > 0 {
            format!(" (and {more} more)")
        } else {
            String::new()
        };
        println!("  {}{tail}", out.sample.join(", "));
    }
    if b.dry_run {
        println!("dry run: nothing changed");
    } else {
        println!("dry run: nothing changed; add --yes (and --reason TEXT) to {what} the events that match when it runs");
    }
    Ok(0)
}

/// `us` since the epoch as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC): replay's formatter.
fn utc(us: i64) -> String {
    ferry_core::replay::rfc3339(us)
}

/// One line per recorded operator action (`ferry status`).
pub fn action_lines(records: &[OperatorRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            let f = &r.filter;
            let mut filter = Vec::new();
            if let Some(t) = &f.topic {
                filter.push(format!("topic {t:?}"));
            }
            if let Some(a) = &f.aggregate_id {
                filter.push(format!("aggregate {a:?}"));
            }
            if let Some(e) = &f.error_contains {
                filter.push(format!("error contains {e:?}"));
            }
            if let Some(t) = f.created_since {
                filter.push(format!("created since {}", utc(t)));
            }
            if let Some(t) = f.created_until {
                filter.push(format!("created until {}", utc(t)));
            }
            format!(
                "#{} {} {} {} {} event(s) ({} dispatch) where {}; reason {:?}",
                r.id,
                utc(r.at_us),
                r.operator,
                r.action,
                r.count,
                r.dispatch,
                filter.join(", "),
                r.reason
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_inverts_rfc3339() {
        for s in [
            "1970-01-01T00:00:00.000000Z",
            "2000-02-29T23:59:59.999999Z",
            "2026-12-06T08:00:00.500000Z",
        ] {
            let us = super::super::reconcile::rfc3339_micros(s).unwrap();
            assert_eq!(utc(us), s);
        }
    }
}
