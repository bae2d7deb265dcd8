//! Paused topics (`ferry_pause`, [`ferry_core::PauseControl`]), written once for the three
//! dialects, and the claim filters that keep a paused topic's intents where they are.
//!
//! The pause is enforced in the claim statements themselves ([`not_paused`],
//! [`not_paused_exception`]): a row or exception row of a paused topic is never claimed, and the
//! claims' predecessor rule (an aggregate's lowest unfinished version only) then holds its
//! aggregate's later versions, on every topic. Cursor dispatch's read path turns the intents of
//! a paused topic into held exception rows (`crates/ferry-relay/src/dispatch/cursor/paused.rs`).
use ferry_core::{now_micros, PauseRequest, PausedTopic, StoreError, StoreErrorKind, ALL_TOPICS};

use crate::dialect::Dialect;
use crate::operator::{Bind, Pools};

/// Longest topic name (the outbox's `topic` column, VARCHAR(255) on PostgreSQL and MariaDB).
const TOPIC_MAX: usize = 255;

/// The claim filter for outbox rows aliased `a`: not of a paused topic, nothing paused at all.
/// Both subqueries are uncorrelated, read once per statement (PostgreSQL: an InitPlan and a
/// hashed SubPlan), so the claim keeps its plan: a filter on the candidates it walks, not a join
/// (a correlated `NOT EXISTS` was planned as an anti join under the row locks).
pub(crate) fn not_paused(a: &str) -> String {
    not_paused_topic(&format!("{a}.topic"))
}

/// The claim filter for exception rows aliased `a` (their topic is their intent's).
pub(crate) fn not_paused_exception(a: &str) -> String {
    not_paused_topic(&format!(
        "(SELECT t.topic FROM ferry_outbox t WHERE t.seq = {a}.seq)"
    ))
}

fn not_paused_topic(topic: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM ferry_pause WHERE topic = '*') \
         AND {topic} NOT IN (SELECT topic FROM ferry_pause)"
    )
}

fn invalid(msg: String) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidInput, msg)
}

/// Every pause, by topic.
pub(crate) async fn paused(pools: Pools<'_>) -> Result<Vec<PausedTopic>, StoreError> {
    let rows = pools
        .rows(
            "SELECT topic, reason, operator, paused_at FROM ferry_pause ORDER BY topic",
            &[],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let text = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
            PausedTopic {
                topic: text(0),
                reason: text(1),
                operator: text(2),
                paused_at: text(3).parse().unwrap_or(0),
            }
        })
        .collect())
}

/// [`ferry_core::PauseControl::pause`]: every check before the first write.
pub(crate) async fn pause(
    pools: Pools<'_>,
    req: &PauseRequest<'_>,
) -> Result<Vec<String>, StoreError> {
    if req.topics.is_empty() {
        return Err(invalid(
            "pause: name at least one topic, or pause every topic".into(),
        ));
    }
    if req.reason.trim().is_empty() {
        return Err(invalid(
            "pause: the reason is empty; say why (it is shown by ferry status)".into(),
        ));
    }
    if req.operator.trim().is_empty() {
        return Err(invalid("pause: the operator is empty".into()));
    }
    for t in req.topics {
        if t.trim().is_empty() || t.len() > TOPIC_MAX {
            return Err(invalid(format!(
                "pause: invalid topic {t:?} (1 to {TOPIC_MAX} bytes)"
            )));
        }
    }
    if !req.force {
        let mut unknown = Vec::new();
        for t in req.topics.iter().filter(|t| *t != ALL_TOPICS) {
            let found = pools
                .rows(
                    "SELECT 1 FROM ferry_outbox WHERE topic = ? LIMIT 1",
                    &[Bind::Str(t.clone())],
                )
                .await?;
            if found.is_empty() {
                unknown.push(t.as_str());
            }
        }
        if !unknown.is_empty() {
            return Err(invalid(format!(
                "pause: no intent in the outbox has topic {}: a typo? (--force pauses it anyway)",
                unknown.join(", ")
            )));
        }
    }
    let insert = match pools.dialect() {
        Dialect::My => "INSERT IGNORE INTO ferry_pause (topic, reason, operator, paused_at) VALUES (?, ?, ?, ?)",
        Dialect::Pg | Dialect::Lite => "INSERT INTO ferry_pause (topic, reason, operator, paused_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
    };
    let now = now_micros();
    let mut added = Vec::new();
    for t in req.topics {
        let binds = [
            Bind::Str(t.clone()),
            Bind::Str(req.reason.trim().to_string()),
            Bind::Str(req.operator.to_string()),
            Bind::I64(now),
        ];
        if pools.exec_as(insert, &binds, "pause").await? == 1 {
            added.push(t.clone());
        }
    }
    Ok(added)
}

/// [`ferry_core::PauseControl::resume`]: every check before the first delete.
pub(crate) async fn resume(
    pools: Pools<'_>,
    topics: &[String],
) -> Result<Vec<PausedTopic>, StoreError> {
    if topics.is_empty() {
        return Err(invalid(
            "resume: name at least one topic, or resume every topic".into(),
        ));
    }
    let now = paused(pools).await?;
    if topics.iter().any(|t| t == ALL_TOPICS) {
        if now.is_empty() {
            return Err(invalid("resume: nothing is paused".into()));
        }
        pools
            .exec_as("DELETE FROM ferry_pause", &[], "resume")
            .await?;
        return Ok(now);
    }
    let missing: Vec<&str> = topics
        .iter()
        .filter(|t| !now.iter().any(|p| &p.topic == *t))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        let all = if now.iter().any(|p| p.topic == ALL_TOPICS) {
            " (every topic is paused as a whole: resume it with --all)"
        } else {
            ""
        };
        return Err(invalid(format!(
            "resume: topic {} is not paused{all}; nothing was resumed",
            missing.join(", ")
        )));
    }
    let mut removed = Vec::new();
    for t in topics {
        pools
            .exec_as(
                "DELETE FROM ferry_pause WHERE topic = ?",
                &[Bind::Str(t.clone())],
                "resume",
            )
            .await?;
        removed.extend(now.iter().filter(|p| &p.topic == t).cloned());
    }
    Ok(removed)
}
