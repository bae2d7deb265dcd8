//! Outcome routing: what a batch's per-item sink outcomes mean for each item's delivery state.
//!
//! A pure function, shared by both dispatch modes and unit-tested here:
//! * `Acked` → acknowledge (row: SENT CAS; cursor: behind the advanced cursor);
//! * `Retry` → retry with backoff, or quarantine once `max_attempts` is reached;
//! * `Permanent` → quarantine;
//! * `Unknown` → release for resend with the same event id and payload;
//! * a missing outcome (a sink that answered fewer items than it was given) → `Unknown`: never
//!   dropped, never counted as success;
//! * **the hold rule** (cursor mode, several versions of one aggregate per batch): once an item of
//!   an aggregate is not acked, every later item of the same aggregate in the batch is `Held`,
//!   whatever its own outcome, and is resent only after its predecessor.
use std::collections::HashSet;
use std::time::Duration;

use ferry_core::{Backoff, ClaimedEvent, Outcome};

/// What to do with one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The broker has it.
    Ack,
    /// Due again after `delay`.
    Retry {
        /// Backoff.
        delay: Duration,
        /// The error.
        error: String,
    },
    /// Parked for an operator.
    Quarantine(String),
    /// Outcome unknown: resend (same id and payload).
    Unknown(String),
    /// A predecessor of the same aggregate in this batch was not acked. `acked` tells whether
    /// the sink nevertheless reported this item acked (counted: the sink's ordering guarantee
    /// should make that impossible).
    Held {
        /// The sink reported it acked.
        acked: bool,
    },
}

/// What the router needs to know about one item.
#[derive(Debug, Clone, Copy)]
pub struct RouteItem<'a> {
    /// Aggregate id.
    pub aggregate_id: &'a str,
    /// Failed attempts before this send.
    pub attempts: i32,
    /// Not sent: the read found its aggregate behind an open exception (no outcome consumed).
    pub held: bool,
}

impl<'a> RouteItem<'a> {
    /// A claimed item that was sent (never held: a claim returns one version of an aggregate
    /// whose predecessors are finished).
    pub fn claimed(e: &'a ClaimedEvent) -> Self {
        Self {
            aggregate_id: &e.aggregate_id,
            attempts: e.attempts,
            held: false,
        }
    }
}

/// Routing settings.
#[derive(Debug, Clone, Copy)]
pub struct RoutePolicy {
    /// Attempts before a retried item is quarantined.
    pub max_attempts: u32,
    /// Retry backoff.
    pub backoff: Backoff,
    /// Apply the hold rule (several versions of one aggregate per batch).
    pub hold_successors: bool,
}

/// Routes `outcomes` (one per item that is not `held`, in item order; missing ones are
/// `Unknown`, extra ones ignored).
pub fn route(
    items: &[RouteItem<'_>],
    outcomes: Vec<Outcome>,
    policy: &RoutePolicy,
) -> Vec<Decision> {
    let mut outcomes = outcomes.into_iter();
    let mut stopped: HashSet<&str> = HashSet::new();
    items
        .iter()
        .map(|item| {
            if item.held {
                stopped.insert(item.aggregate_id);
                return Decision::Held { acked: false };
            }
            let outcome = outcomes.next().unwrap_or_else(|| {
                Outcome::Unknown("the sink returned no outcome for this item".into())
            });
            if policy.hold_successors && stopped.contains(item.aggregate_id) {
                return Decision::Held {
                    acked: outcome == Outcome::Acked,
                };
            }
            let d = match outcome {
                Outcome::Acked => Decision::Ack,
                Outcome::Retry(error) => {
                    let attempt = item.attempts.max(0) as u32 + 1;
                    if attempt >= policy.max_attempts {
                        Decision::Quarantine(format!("gave up after {attempt} attempts: {error}"))
                    } else {
                        Decision::Retry {
                            delay: policy.backoff.delay(attempt),
                            error,
                        }
                    }
                }
                Outcome::Permanent(e) => Decision::Quarantine(e),
                Outcome::Unknown(e) => Decision::Unknown(e),
            };
            if policy.hold_successors && d != Decision::Ack {
                stopped.insert(item.aggregate_id);
            }
            d
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hold: bool) -> RoutePolicy {
        RoutePolicy {
            max_attempts: 3,
            backoff: Backoff::default(),
            hold_successors: hold,
        }
    }

    fn it(a: &str, attempts: i32) -> RouteItem<'_> {
        RouteItem {
            aggregate_id: a,
            attempts,
            held: false,
        }
    }

    #[test]
    fn each_outcome_maps_to_its_decision() {
        let items = [it("a", 0), it("b", 0), it("c", 0), it("d", 0)];
        let d = route(
            &items,
            vec![
                Outcome::Acked,
                Outcome::Retry("x".into()),
                Outcome::Permanent("p".into()),
                Outcome::Unknown("u".into()),
            ],
            &policy(false),
        );
        assert_eq!(d[0], Decision::Ack);
        assert!(matches!(&d[1], Decision::Retry { error, .. } if error == "x"));
        assert_eq!(d[2], Decision::Quarantine("p".into()));
        assert_eq!(d[3], Decision::Unknown("u".into()));
    }

    #[test]
    fn retries_past_max_attempts_are_quarantined() {
        let d = route(
            &[it("a", 2)],
            vec![Outcome::Retry("boom".into())],
            &policy(false),
        );
        assert!(
            matches!(&d[0], Decision::Quarantine(why) if why.contains("gave up after 3 attempts"))
        );
    }

    #[test]
    fn missing_outcomes_become_unknown_and_extra_ones_are_ignored() {
        let items = [it("a", 0), it("b", 0), it("c", 0)];
        let d = route(&items, vec![Outcome::Acked], &policy(false));
        assert_eq!(d.len(), 3);
        assert_eq!(d[0], Decision::Ack);
        assert!(matches!(d[1], Decision::Unknown(_)));
        assert!(matches!(d[2], Decision::Unknown(_)));
        let d = route(
            &items[..1],
            vec![Outcome::Acked, Outcome::Acked],
            &policy(false),
        );
        assert_eq!(d, vec![Decision::Ack]);
    }

    #[test]
    fn the_hold_rule_stops_an_aggregate_at_its_first_failure() {
        // a1 ok, a2 fails, a3 acked anyway (must not count), b1 ok after a's failure
        let items = [it("a", 0), it("a", 0), it("b", 0), it("a", 0), it("b", 0)];
        let d = route(
            &items,
            vec![
                Outcome::Acked,
                Outcome::Retry("x".into()),
                Outcome::Acked,
                Outcome::Acked,
                Outcome::Unknown("u".into()),
            ],
            &policy(true),
        );
        assert_eq!(d[0], Decision::Ack);
        assert!(matches!(d[1], Decision::Retry { .. }));
        assert_eq!(d[2], Decision::Ack);
        assert_eq!(d[3], Decision::Held { acked: true });
        assert!(matches!(d[4], Decision::Unknown(_)));
    }

    #[test]
    fn a_held_item_consumes_no_outcome_and_stops_its_aggregate() {
        let mut items = vec![it("a", 0), it("a", 0), it("b", 0)];
        items[0].held = true;
        let d = route(&items, vec![Outcome::Acked, Outcome::Acked], &policy(true));
        assert_eq!(d[0], Decision::Held { acked: false });
        assert_eq!(d[1], Decision::Held { acked: true });
        assert_eq!(d[2], Decision::Ack);
    }

    #[test]
    fn without_the_hold_rule_items_are_independent() {
        let items = [it("a", 0), it("a", 0)];
        let d = route(
            &items,
            vec![Outcome::Unknown("u".into()), Outcome::Acked],
            &policy(false),
        );
        assert_eq!(d[1], Decision::Ack);
    }
}
