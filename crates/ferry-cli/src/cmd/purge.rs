//! `ferry purge`: delete SENT rows older than the retention window.
use std::sync::Arc;

use clap::Args;
use ferry_core::{OutboxStore, PurgeRequest};

use super::{fail, Failure};

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Retention window, e.g. 7d or 36h: only SENT rows older than this (row dispatch: by sent_at;
    /// cursor dispatch: by created_at, the derived SENT state having no delivery time).
    #[arg(long, allow_hyphen_values = true)]
    pub older_than: String,
    /// Rows per delete statement, each its own short transaction (cursor dispatch: seq values
    /// per statement).
    #[arg(long, default_value_t = PurgeRequest::DEFAULT_BATCH)]
    pub batch: usize,
    /// Only rows this consumer has consumed: in its Inbox (ferry_inbox, same database), or
    /// covered by its aggregate's contiguous mark (ferry_inbox_aggregate).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Only count what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// PostgreSQL: VACUUM the outbox and the small tables every advance rewrites (slot leases,
    /// ticks, exception rows) after the run, for a server or tables whose autovacuum is off
    /// (`ferry status` warns about it): the space of deleted rows and old row versions is
    /// reused, and later purges, reads and advances stop walking them. Ignored by MariaDB and
    /// SQLite, which reuse the space on their own.
    #[arg(long)]
    pub vacuum: bool,
}

pub async fn run(a: PurgeArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let older = ferry_core::parse_duration(&a.older_than)
        .map_err(|e| fail(2, format!("invalid --older-than: {e}")))?;
    if a.batch == 0 || a.batch > 100_000 {
        return Err(fail(2, "invalid --batch: must be between 1 and 100000"));
    }
    let n = store
        .purge_sent(&PurgeRequest {
            older_than: older,
            batch: a.batch,
            consumer: a.consumer.as_deref(),
            dry_run: a.dry_run,
            vacuum: a.vacuum,
        })
        .await?;
    let scope = a
        .consumer
        .map(|c| format!(" consumed by {c}"))
        .unwrap_or_default();
    if a.dry_run {
        println!(
            "would delete {n} SENT rows{scope} older than {}",
            a.older_than
        );
    } else {
        println!("deleted {n} SENT rows{scope} older than {}", a.older_than);
    }
    Ok(0)
}
