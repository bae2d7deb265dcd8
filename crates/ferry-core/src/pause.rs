//! Pausing delivery per topic, or of everything (`ferry pause` / `ferry resume`).
//!
//! The pauses live in the database (`ferry_pause`), so every relay of the outbox obeys them and
//! they survive restarts. While a topic is paused its intents accumulate: row dispatch does not
//! claim them, cursor dispatch turns them into held exception rows that are not claimed either.
//! Per-aggregate order holds across topics: an aggregate's later versions (on any topic) wait
//! behind its paused version, as they wait behind a quarantined one; other aggregates flow.
use crate::error::StoreError;
use crate::future::BoxFuture;
use crate::time::Micros;

/// The topic name of a pause of every topic (`ferry pause --all`).
pub const ALL_TOPICS: &str = "*";

/// One pause as the database records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PausedTopic {
    /// The topic, or [`ALL_TOPICS`].
    pub topic: String,
    /// Why (the operator's words).
    pub reason: String,
    /// Who paused it.
    pub operator: String,
    /// When, µs since the epoch (the operator's clock).
    pub paused_at: Micros,
}

/// [`PauseControl::pause`]: pause topics.
#[derive(Debug, Clone, Copy)]
pub struct PauseRequest<'a> {
    /// The topics, or `[ALL_TOPICS]`.
    pub topics: &'a [String],
    /// Why (required, recorded).
    pub reason: &'a str,
    /// Who (required, recorded).
    pub operator: &'a str,
    /// Pause a topic with no intent in the outbox too (a typo is refused without it).
    pub force: bool,
}

/// Whether `topic` is paused by one of `paused` (its own pause, or a pause of every topic).
pub fn is_paused(paused: &[PausedTopic], topic: &str) -> bool {
    paused
        .iter()
        .any(|p| p.topic == ALL_TOPICS || p.topic == topic)
}

/// The pause records of a store (a capability: [`crate::OutboxStore::pause_control`]).
pub trait PauseControl: Send + Sync {
    /// Records a pause of each of `req.topics`, all or none: refuses (`InvalidInput`, nothing
    /// written) an empty list or topic, an empty reason or operator, and, without `force`, a
    /// topic with no intent in the outbox. Returns the topics newly paused; one already paused
    /// keeps its record and is not returned.
    fn pause<'a>(
        &'a self,
        req: &'a PauseRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Removes the pauses of `topics` (`[ALL_TOPICS]`: every pause, per topic ones included),
    /// all or none: refuses (`InvalidInput`, nothing removed) a topic that is not paused, and
    /// `ALL_TOPICS` when nothing is. Returns the records removed.
    fn resume<'a>(
        &'a self,
        topics: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<PausedTopic>, StoreError>>;

    /// Every pause, by topic.
    fn paused(&self) -> BoxFuture<'_, Result<Vec<PausedTopic>, StoreError>>;
}
