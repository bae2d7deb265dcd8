//! Paused topics on the cursor path: an event of a paused topic (`ferry pause`) is not sent;
//! it is marked held, so the advance records it as a held exception row, like an event behind
//! an open exception. The hold rule ([`crate::route`]) then holds its aggregate's later events
//! of the same batch, later reads flag the aggregate's successors held (it has an open exception
//! row), and the exception path claims none of a paused topic's rows (the store's claim
//! filter), nor, by its predecessor rule, any later version of their aggregates. Other
//! aggregates of the slot keep flowing: the cursor moves past the held event.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use ferry_core::{is_paused, CursorEvent, OutboxStore, PausedTopic};

/// The pauses as a worker last read them.
#[derive(Default)]
pub(super) struct Paused {
    topics: Vec<PausedTopic>,
    read_at: Option<Instant>,
}

impl Paused {
    /// Reads the pauses again when they were read `every` ago or more (`poll_idle`: a pause
    /// takes effect within one idle poll). A failed read keeps the pauses last read.
    pub(super) async fn refresh(&mut self, store: &dyn OutboxStore, every: Duration) {
        let Some(pc) = store.pause_control() else {
            return;
        };
        if self.read_at.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        match pc.paused().await {
            Ok(p) => {
                if p != self.topics {
                    tracing::info!(paused = ?p.iter().map(|p| &p.topic).collect::<Vec<_>>(), "paused topics changed");
                }
                self.topics = p;
                self.read_at = Some(Instant::now());
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the paused topics failed; keeping the last ones read")
            }
        }
    }

    /// Marks every event of a paused topic held, and every later event of its aggregate in
    /// `events` (read order), whatever its topic: the sink must not get a version whose
    /// predecessor is held. Returns how many were marked.
    pub(super) fn hold(&self, events: &mut [CursorEvent]) -> usize {
        if self.topics.is_empty() {
            return 0;
        }
        let mut stopped: HashSet<String> = HashSet::new();
        let mut n = 0;
        for e in events.iter_mut() {
            let agg = &e.event.aggregate_id;
            if !e.held && (stopped.contains(agg) || is_paused(&self.topics, &e.event.topic)) {
                e.held = true;
                n += 1;
            }
            if e.held {
                stopped.insert(agg.clone());
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{ClaimToken, ClaimedEvent, CursorPos};

    fn ev(topic: &str) -> CursorEvent {
        ev_of("a", topic)
    }

    fn ev_of(agg: &str, topic: &str) -> CursorEvent {
        CursorEvent {
            pos: CursorPos::default(),
            held: false,
            event: ClaimedEvent {
                token: ClaimToken {
                    seq: 1,
                    event_id: "e".into(),
                    claim_id: String::new(),
                    claim_version: 0,
                },
                aggregate_id: agg.into(),
                aggregate_version: 1,
                shard_slot: 0,
                topic: topic.into(),
                key: "a".into(),
                event_type: "T".into(),
                headers: "{}".into(),
                payload: "{}".into(),
                attempts: 0,
                created_at: 0,
            },
        }
    }

    fn pause(topic: &str) -> PausedTopic {
        PausedTopic {
            topic: topic.into(),
            reason: "r".into(),
            operator: "o".into(),
            paused_at: 0,
        }
    }

    #[test]
    fn events_of_paused_topics_and_their_aggregates_later_events_are_held() {
        let mut events = vec![
            ev_of("x", "b"),
            ev_of("y", "b"),
            ev_of("x", "a"),
            ev_of("y", "b"),
            ev_of("x", "b"),
        ];
        let p = Paused {
            topics: vec![pause("a")],
            read_at: None,
        };
        assert_eq!(p.hold(&mut events), 2);
        let held: Vec<bool> = events.iter().map(|e| e.held).collect();
        assert_eq!(held, [false, false, true, false, true]);
        let all = Paused {
            topics: vec![pause(ferry_core::ALL_TOPICS)],
            read_at: None,
        };
        let mut events = vec![ev("a"), ev("b")];
        assert_eq!(all.hold(&mut events), 2);
        assert_eq!(Paused::default().hold(&mut [ev("a")]), 0);
    }
}
