//! `ferry pause` and `ferry resume`: stop and restart delivery of chosen topics, or of every
//! topic, recorded in the database (`ferry_pause`) so that every relay obeys within one idle
//! poll and the pause survives restarts. Paused intents accumulate and go out, each aggregate
//! in order, on resume.
use std::sync::Arc;

use clap::Args;
use ferry_core::{OutboxStore, PauseControl, PauseRequest, ALL_TOPICS};

use super::{fail, Failure, OperatorArg};

#[derive(Args, Debug)]
pub struct PauseArgs {
    /// A topic to pause (repeatable).
    #[arg(long = "topic", value_name = "TOPIC", conflicts_with = "all")]
    pub topics: Vec<String>,
    /// Pause every topic.
    #[arg(long)]
    pub all: bool,
    /// Why (required; shown by ferry status).
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub operator: OperatorArg,
    /// Pause a topic that has no intent in the outbox yet (refused without it: a typo would
    /// pause nothing).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// A paused topic to resume (repeatable).
    #[arg(long = "topic", value_name = "TOPIC", conflicts_with = "all")]
    pub topics: Vec<String>,
    /// Remove every pause (the pause of every topic and each topic's own).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub operator: OperatorArg,
}

/// The topics of `--topic`/`--all`, checked: one of them, no empty or reserved name.
fn scope(cmd: &str, topics: Vec<String>, all: bool) -> Result<Vec<String>, Failure> {
    if all {
        return Ok(vec![ALL_TOPICS.to_string()]);
    }
    if topics.is_empty() {
        return Err(fail(
            2,
            format!("ferry {cmd}: name a topic with --topic TOPIC (repeatable), or pass --all"),
        ));
    }
    for t in &topics {
        if t.trim().is_empty() {
            return Err(fail(2, format!("ferry {cmd}: --topic is empty")));
        }
        if t == ALL_TOPICS {
            return Err(fail(
                2,
                format!("ferry {cmd}: topic \"*\" is reserved; use --all"),
            ));
        }
    }
    Ok(topics)
}

fn control(store: &Arc<dyn OutboxStore>) -> Result<&dyn PauseControl, Failure> {
    store
        .pause_control()
        .ok_or_else(|| fail(2, "this store keeps no pauses"))
}

fn label(topic: &str) -> String {
    if topic == ALL_TOPICS {
        "every topic".into()
    } else {
        format!("topic {topic}")
    }
}

pub async fn pause(a: PauseArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let topics = scope("pause", a.topics, a.all)?;
    let reason = a.reason.unwrap_or_default();
    if reason.trim().is_empty() {
        return Err(fail(
            2,
            "ferry pause: --reason is required and must not be empty (ferry status shows it)",
        ));
    }
    let op = a.operator.name();
    let added = control(&store)?
        .pause(&PauseRequest {
            topics: &topics,
            reason: &reason,
            operator: &op,
            force: a.force,
        })
        .await?;
    for t in &topics {
        if added.contains(t) {
            println!("paused {}: {reason} (operator {op})", label(t));
        } else {
            println!("{} was already paused; its record is unchanged", label(t));
        }
    }
    Ok(0)
}

pub async fn resume(a: ResumeArgs, store: Arc<dyn OutboxStore>) -> Result<u8, Failure> {
    let topics = scope("resume", a.topics, a.all)?;
    let op = a.operator.name();
    let removed = control(&store)?.resume(&topics).await?;
    for p in &removed {
        println!(
            "resumed {} (paused by {}: {}); resumed by {op}",
            label(&p.topic),
            p.operator,
            p.reason
        );
    }
    Ok(0)
}
