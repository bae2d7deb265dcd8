//! `ferry status`: backlog, oldest intent age, unknown exposure, quarantine, the outbox's size
//! on disk, slot owners, and server settings that are harmful to ferry.
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_core::OutboxStore;

use super::{fmt_age, Failure};
use crate::config::{self, FileConfig};

/// Recorded operator actions `ferry status` shows.
const RECENT_ACTIONS: usize = 5;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Warning when the oldest unsent intent is older [default: {alerts.oldest_warning}] (alerts.oldest_warning).
    #[arg(long, env = "FERRY_OLDEST_WARNING")]
    pub oldest_warning: Option<String>,
    /// Critical when older [default: {alerts.oldest_critical}] (alerts.oldest_critical).
    #[arg(long, env = "FERRY_OLDEST_CRITICAL")]
    pub oldest_critical: Option<String>,
}

pub async fn run(
    a: StatusArgs,
    f: &FileConfig,
    store: Arc<dyn OutboxStore>,
) -> Result<u8, Failure> {
    let thresholds = config::alerts(&None, &None, &a.oldest_warning, &a.oldest_critical, f)?;
    let (warn, crit) = (thresholds.oldest_warning, thresholds.oldest_critical);
    let st = store.status().await?;
    let leases = store.slot_leases().await?;
    let members = store.members().await?;
    let quarantined = store.list_quarantined(20).await?;
    let settings = store.server_warnings().await?;
    // the outbox's size on disk; a failure to read it is shown, not fatal
    let size = store.outbox_size().await;
    // the last bulk quarantine actions; a database not yet migrated to their table reports
    // why instead of failing the whole status
    let actions = store.operator_actions(RECENT_ACTIONS).await;
    let age = st
        .oldest_unfinished_age_us
        .map(|u| Duration::from_micros(u.max(0) as u64));
    let mut reasons = Vec::new();
    let mut level = 0u8;
    let (mode, horizon) = match store.cursor() {
        Some(cs) => (cs.dispatch_mode().await?, Some(cs.horizon().await?)),
        None => (ferry_core::DispatchMode::Row, None),
    };
    // In cursor dispatch an open write transaction delays reads: on PostgreSQL its own intents
    // wait for its commit and every read re-walks what was committed since it began; behind
    // MariaDB's commit gate the intents committed after it began wait for it: in every slot
    // at first, then only in the slots it wrote once it is idle (`held_slots`).
    let held_slots = horizon.as_ref().and_then(|h| h.held_slots);
    let blocker = horizon
        .as_ref()
        .filter(|_| mode == ferry_core::DispatchMode::Cursor)
        .and_then(|h| {
            h.oldest_xact_age_us
                .map(|a| (a, h.oldest_xact_pid.unwrap_or(-1)))
        });
    if let Some((age_us, pid)) = blocker {
        let age = Duration::from_micros(age_us.max(0) as u64);
        if age >= warn {
            level = level.max(if age >= crit { 3 } else { 2 });
            let (id, effect) = if store.backend() == "postgres" {
                ("pid", "its own intents wait for its commit, and every cursor read re-walks what was committed since it began".to_string())
            } else if let Some(n) = held_slots {
                (
                    "connection",
                    format!(
                        "intents committed since it began wait for it in the {n} slot(s) it wrote"
                    ),
                )
            } else {
                (
                    "connection",
                    "intents committed since it began wait for it, in every slot".to_string(),
                )
            };
            reasons.push(format!(
                "an open write transaction ({id} {pid}) has held the cursor horizon back for {:.0}s: {effect}",
                age.as_secs_f64()
            ));
        }
    }
    if let Some(age) = age {
        if age >= crit {
            level = level.max(3);
            reasons.push(format!(
                "oldest unsent intent is {:.0}s old (critical at {:.0}s)",
                age.as_secs_f64(),
                crit.as_secs_f64()
            ));
        } else if age >= warn {
            level = level.max(2);
            reasons.push(format!(
                "oldest unsent intent is {:.0}s old (warning at {:.0}s)",
                age.as_secs_f64(),
                warn.as_secs_f64()
            ));
        }
    }
    if st.blocked_aggregates > 0 {
        level = level.max(2);
        reasons.push(format!(
            "{} aggregate(s) blocked behind quarantined events (ferry quarantine list)",
            st.blocked_aggregates
        ));
    }
    // A relay whose sink has had no ack for longer than its stall threshold, with events in
    // flight (as of its last membership heartbeat): a broker down or unreachable.
    for m in &members {
        if let Some(us) = m.sink_stalled_us {
            level = level.max(2);
            reasons.push(format!(
                "relay {}: its sink has had no ack for {:.0}s with events in flight (a broker down or unreachable; the relay logs the brokers and the last error)",
                m.owner,
                Duration::from_micros(us.max(0) as u64).as_secs_f64()
            ));
        }
    }
    // A harmful server setting is a warning whatever the backlog: it can lose committed intents
    // in a crash, let the outbox go unvacuumed, or reorder an aggregate in cursor dispatch.
    for w in &settings {
        level = level.max(2);
        reasons.push(w.message.clone());
    }
    // A pause holds intents back on purpose (ferry pause): a warning, so that it is not
    // forgotten; the paused intents' age still reaches the age thresholds.
    let paused = match store.pause_control() {
        Some(pc) => pc.paused().await?,
        None => Vec::new(),
    };
    for p in &paused {
        level = level.max(2);
        reasons.push(format!(
            "{} paused by {} (ferry resume)",
            pause_label(&p.topic),
            p.operator
        ));
    }
    let label = match level {
        0 => "OK",
        2 => "WARNING",
        _ => "CRITICAL",
    };
    let mut owners: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in &leases {
        *owners.entry(l.owner.as_str()).or_default() += 1;
    }
    if a.json {
        let v = serde_json::json!({
            "level": label,
            "dispatch": mode,
            "horizon": horizon,
            "reasons": reasons,
            "server_settings": settings,
            "outbox": st,
            "outbox_size": size.as_ref().ok().and_then(Option::as_ref),
            "outbox_size_error": size.as_ref().err().map(|e| e.to_string()),
            "slot_owners": owners,
            "relays": members,
            "quarantined": quarantined,
            "operator_actions": actions.as_ref().ok(),
            "operator_actions_error": actions.as_ref().err().map(|e| e.to_string()),
            "paused": paused,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("status:              {label}");
        for r in &reasons {
            println!("  - {r}");
        }
        println!("dispatch:            {mode}");
        if mode == ferry_core::DispatchMode::Cursor && store.backend() != "sqlite" {
            let id = if store.backend() == "postgres" {
                "pid"
            } else {
                "connection"
            };
            let holds = match held_slots {
                Some(n) => format!(", holding {n} slot(s)"),
                None if store.backend() == "postgres" => String::new(),
                None => ", holding every slot".to_string(),
            };
            match blocker {
                Some((age_us, pid)) => println!(
                    "horizon held by:     {id} {pid}, open for {}{holds}",
                    fmt_age(Some(age_us))
                ),
                None => println!("horizon held by:     nothing (no open write transaction)"),
            }
        }
        println!("pending:             {}", st.pending);
        println!("claimed (unknown):   {}", st.claimed);
        println!("quarantined:         {}", st.quarantined);
        println!("blocked aggregates:  {}", st.blocked_aggregates);
        println!(
            "oldest unsent age:   {}",
            fmt_age(st.oldest_unfinished_age_us)
        );
        match &size {
            Ok(Some(s)) => println!(
                "outbox size:         {} (table {}, indexes {}; {})",
                fmt_bytes(s.table_bytes + s.index_bytes),
                fmt_bytes(s.table_bytes),
                fmt_bytes(s.index_bytes),
                s.source
            ),
            Ok(None) => println!("outbox size:         not reported by this store"),
            Err(e) => println!("outbox size:         unavailable: {e}"),
        }
        println!(
            "paused:              {}",
            if paused.is_empty() { "nothing" } else { "" }
        );
        for p in &paused {
            println!(
                "  {}: since {} ago, by {}: {}",
                pause_label(&p.topic),
                fmt_age(Some(ferry_core::now_micros() - p.paused_at)),
                p.operator,
                p.reason
            );
        }
        println!(
            "slot owners:         {}",
            if owners.is_empty() { "none" } else { "" }
        );
        for (o, n) in &owners {
            println!("  {o}: {n} slots");
        }
        println!(
            "relays:              {}",
            if members.is_empty() { "none" } else { "" }
        );
        for m in &members {
            match m.sink_stalled_us {
                Some(us) => println!("  {}: sink stalled for {}", m.owner, fmt_age(Some(us))),
                None => println!("  {}: sink ok", m.owner),
            }
        }
        match &actions {
            Ok(a) if a.is_empty() => println!("operator actions:    none recorded"),
            Ok(a) => {
                println!("operator actions:    (newest first)");
                for line in super::quarantine::action_lines(a) {
                    println!("  {line}");
                }
            }
            Err(e) => println!("operator actions:    unavailable: {e}"),
        }
    }
    Ok(match level {
        0 => 0,
        2 => super::EXIT_WARNING,
        _ => super::EXIT_CRITICAL,
    })
}

/// `1536` → `1.5 KiB`; bytes below 1 KiB as they are.
fn fmt_bytes(b: i64) -> String {
    let mut v = b as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v.abs() < 1024.0 {
            return if unit == "B" {
                format!("{b} B")
            } else {
                format!("{v:.1} {unit}")
            };
        }
        v /= 1024.0;
    }
    format!("{v:.1} TiB")
}

/// "every topic" for the pause of every topic, else "topic T".
fn pause_label(topic: &str) -> String {
    if topic == ferry_core::ALL_TOPICS {
        "every topic".into()
    } else {
        format!("topic {topic}")
    }
}

#[cfg(test)]
mod tests {
    use super::fmt_bytes;

    #[test]
    fn sizes_read_in_binary_units() {
        for (bytes, shown) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1536, "1.5 KiB"),
            (264_241_152, "252.0 MiB"),
            (3 << 30, "3.0 GiB"),
        ] {
            assert_eq!(fmt_bytes(bytes), shown);
        }
    }
}
