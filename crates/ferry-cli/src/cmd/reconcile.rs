//! `ferry reconcile`: classify every intent under a fixed watermark.
use std::sync::Arc;

use clap::builder::TypedValueParser;
use clap::Args;
use ferry_core::OutboxStore;

use super::{fail, fmt_age, Failure};
use crate::config;

#[derive(Args, Debug)]
pub struct ReconcileArgs {
    /// Fixed watermark: an outbox seq (e.g. 120000) or an RFC 3339 UTC time
    /// (e.g. 2026-11-30T10:00:00Z). Pick one older than your longest producer transaction.
    #[arg(long)]
    pub watermark: String,
    /// Consumer whose Inbox proves consumption: its row in ferry_inbox (same database), or its
    /// aggregate's contiguous mark in ferry_inbox_aggregate.
    #[arg(long)]
    pub consumer: Option<String>,
    /// Business table to check for rows with no intent (e.g. orders).
    #[arg(long)]
    pub business_table: Option<String>,
    /// Its id column.
    #[arg(long, default_value = config::DEFAULT_BUSINESS_ID_COLUMN)]
    pub business_id_column: String,
    /// aggregate_id = prefix || id.
    #[arg(long, default_value = config::DEFAULT_AGGREGATE_PREFIX)]
    pub aggregate_prefix: String,
    /// Only business rows with id <= this.
    #[arg(long)]
    pub business_max_id: Option<i64>,
    /// Ids listed per class that must be listed (0 to 100000).
    #[arg(long, default_value_t = config::DEFAULT_LIST_LIMIT,
          value_parser = clap::value_parser!(u64).range(0..=100_000).map(|n| n as usize))]
    pub list_limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses a watermark: digits are an outbox seq, otherwise an RFC 3339 UTC time.
fn parse_watermark(s: &str) -> Result<ferry_core::Watermark, Failure> {
    let s = s.trim();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
        return s
            .parse()
            .map(ferry_core::Watermark::Seq)
            .map_err(|_| fail(2, format!("invalid --watermark {s:?}: seq out of range")));
    }
    rfc3339_micros(s)
        .map(ferry_core::Watermark::Time)
        .ok_or_else(|| fail(2, format!("invalid --watermark {s:?}: use an outbox seq (digits) or a UTC time like 2026-11-30T10:00:00Z")))
}

/// `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` → µs since the epoch.
pub(crate) fn rfc3339_micros(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = s.split_once(['T', ' '])?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let us: i64 = if frac.is_empty() {
        0
    } else {
        let f: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        f.parse().ok()?
    };
    // days from civil (Howard Hinnant)
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + us)
}

pub async fn run(a: ReconcileArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let watermark = parse_watermark(&a.watermark)?;
    let business = a.business_table.map(|t| ferry_core::BusinessTable {
        table: t,
        id_column: a.business_id_column.clone(),
        aggregate_prefix: a.aggregate_prefix.clone(),
        max_id: a.business_max_id,
    });
    let req = ferry_core::ReconcileRequest {
        watermark,
        consumer: a.consumer.clone(),
        business,
        list_limit: a.list_limit,
    };
    let r = store.reconcile(&req).await?;
    if !r.classes_sum_to_total() {
        return Err(fail(
            1,
            format!("internal error: reconciliation classes do not sum to the total: {r:?}"),
        ));
    }
    if a.json {
        let v = serde_json::json!({ "watermark": watermark, "consumer": a.consumer, "report": r });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("watermark:                        {:?}", watermark);
        println!("intents under the watermark:      {}", r.total);
        if a.consumer.is_some() {
            println!("  consumed:                       {}", r.consumed);
        }
        println!(
            "  published, awaiting consumption: {}",
            r.published_awaiting_consumption
        );
        println!(
            "  not yet published (pending):    {}  (oldest {})",
            r.not_yet_published,
            fmt_age(r.oldest_not_published_age_us)
        );
        println!("  outcome unknown (claimed):      {}", r.outcome_unknown);
        for id in &r.unknown_ids {
            println!("    {id}");
        }
        println!("  quarantined (known failure):    {}", r.quarantined);
        for id in &r.quarantined_ids {
            println!("    {id}");
        }
        println!("  skipped by an operator:         {}", r.skipped);
        if let (Some(rows), Some(missing)) = (r.business_rows, r.business_without_intent) {
            println!("business rows checked:            {rows}");
            println!("  with NO intent (anomaly):       {missing}");
            for id in &r.business_without_intent_ids {
                println!("    {id}");
            }
        }
    }
    // Anomalies and unknowns are not success: say so in the exit code.
    let anomalies = r.business_without_intent.unwrap_or(0) > 0;
    Ok(if anomalies {
        super::EXIT_CRITICAL
    } else if r.outcome_unknown > 0 || r.quarantined > 0 {
        super::EXIT_WARNING
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_micros("2000-03-01T00:00:01.5Z"),
            Some((951_868_800 + 1) * 1_000_000 + 500_000)
        );
        assert_eq!(
            rfc3339_micros("2026-11-30T10:00:00Z"),
            Some(1_796_032_800 * 1_000_000)
        );
        assert_eq!(rfc3339_micros("2026-13-30T10:00:00Z"), None);
        assert_eq!(rfc3339_micros("yesterday"), None);
        assert!(matches!(
            parse_watermark("120"),
            Ok(ferry_core::Watermark::Seq(120))
        ));
    }
}
