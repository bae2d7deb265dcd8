//! Replay: re-publishing retained, already-sent events chosen by topic, aggregate and creation
//! time ([`OutboxStore::replay_scan`](crate::OutboxStore::replay_scan) and
//! [`replay_page`](crate::OutboxStore::replay_page)), and the checks that refuse a replay whose
//! range retention has cut ([`check_replay`]).
//!
//! A replay reads; it never changes an outbox row. Each aggregate's events come back in version
//! order (pages are keyset-ordered by `(aggregate_id, aggregate_version)`), so a sender that sends
//! them in that order on one key keeps the aggregate's order.
use crate::claim::ClaimedEvent;
use crate::time::Micros;

/// Message header that marks a replayed message; its value is the replay's id.
pub const HEADER_REPLAY: &str = "ferry-replay";

/// Which events a replay takes: SENT events (in cursor dispatch, derived SENT) of one of
/// `topics`, of one of `aggregates` when any are given, with `from <= created_at <= to`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// The topics (at least one).
    pub topics: Vec<String>,
    /// Only these aggregates (empty: every aggregate of the topics).
    pub aggregates: Vec<String>,
    /// Inclusive lower bound on `created_at`, µs since the epoch.
    pub from: Option<Micros>,
    /// Inclusive upper bound on `created_at`, µs since the epoch.
    pub to: Option<Micros>,
}

/// Where retention has cut a topic: `ferry purge` deleted rows of it created up to
/// `purged_created_at`, last at `purged_at` (both µs since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RetentionMark {
    /// The newest `created_at` of any purged row of the topic.
    pub purged_created_at: Micros,
    /// When the purge that set it ran.
    pub purged_at: Micros,
}

/// What a store knows of one topic of a [`ReplayFilter`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicScan {
    /// The topic.
    pub topic: String,
    /// Whether the topic ever had a row: one is retained, or retention deleted some.
    pub known: bool,
    /// Retained SENT events of the topic that match the filter.
    pub matched: u64,
    /// Retained events that match the filter but are not SENT (pending, claimed, quarantined,
    /// skipped): not replayed.
    pub not_sent: u64,
    /// The topic's retention watermark, if `ferry purge` ever deleted a row of it.
    pub retention: Option<RetentionMark>,
}

/// [`OutboxStore::replay_page`](crate::OutboxStore::replay_page): the next `limit` matching
/// SENT events after `after` in `(aggregate_id, aggregate_version)` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPageRequest<'a> {
    /// The filter.
    pub filter: &'a ReplayFilter,
    /// The last `(aggregate_id, aggregate_version)` of the previous page (`None`: from the start).
    pub after: Option<(String, i64)>,
    /// Events per page (at least 1).
    pub limit: usize,
}

/// Why a replay is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayRefusal {
    /// No `--topic`.
    #[error("no topic given: pass --topic (a replay of every topic is refused)")]
    NoTopic,
    /// `from` after `to`.
    #[error("the range is empty: --from {from} is after --to {to}")]
    FromAfterTo {
        /// `--from`, as given.
        from: String,
        /// `--to`, as given.
        to: String,
    },
    /// A topic with no row ever.
    #[error("unknown topic {0:?}: no event of it was ever written to the outbox")]
    UnknownTopic(String),
    /// Retention deleted events the range may cover.
    #[error("retention removed events of topic {topic} created before {purged_created_at} (purged at {purged_at}); the range starts at {starts}")]
    RetentionCut {
        /// The topic.
        topic: String,
        /// Its watermark, RFC 3339.
        purged_created_at: String,
        /// When it was purged, RFC 3339.
        purged_at: String,
        /// The range's start, RFC 3339 (`the beginning` without `--from`).
        starts: String,
    },
    /// Nothing matched.
    #[error("0 events matched: no retained SENT event of {topics} in the range ({not_sent} matching events are not sent yet or were skipped)")]
    NothingMatched {
        /// The topics, comma-separated.
        topics: String,
        /// Matching events that are not SENT.
        not_sent: u64,
    },
}

/// The refusals that need no store: no topic, `from` after `to`.
pub fn check_filter(filter: &ReplayFilter) -> Result<(), ReplayRefusal> {
    if filter.topics.is_empty() || filter.topics.iter().any(|t| t.trim().is_empty()) {
        return Err(ReplayRefusal::NoTopic);
    }
    if let (Some(from), Some(to)) = (filter.from, filter.to) {
        if from > to {
            return Err(ReplayRefusal::FromAfterTo {
                from: rfc3339(from),
                to: rfc3339(to),
            });
        }
    }
    Ok(())
}

/// Every refusal, given what the store found: an unknown topic, a range that starts at or
/// before a topic's retention watermark (rows it covers may have been deleted: the watermark is
/// the newest purged `created_at`, so a range starting after it cannot miss a purged row), and
/// a range that matched nothing. Returns the number of events to send.
pub fn check_replay(filter: &ReplayFilter, scan: &[TopicScan]) -> Result<u64, ReplayRefusal> {
    check_filter(filter)?;
    for t in scan {
        if !t.known {
            return Err(ReplayRefusal::UnknownTopic(t.topic.clone()));
        }
    }
    for t in scan {
        if let Some(mark) = t.retention {
            if filter
                .from
                .is_none_or(|from| from <= mark.purged_created_at)
            {
                return Err(ReplayRefusal::RetentionCut {
                    topic: t.topic.clone(),
                    purged_created_at: rfc3339(mark.purged_created_at),
                    purged_at: rfc3339(mark.purged_at),
                    starts: filter
                        .from
                        .map_or_else(|| "the beginning".to_string(), rfc3339),
                });
            }
        }
    }
    let total: u64 = scan.iter().map(|t| t.matched).sum();
    if total == 0 {
        return Err(ReplayRefusal::NothingMatched {
            topics: filter.topics.join(", "),
            not_sent: scan.iter().map(|t| t.not_sent).sum(),
        });
    }
    Ok(total)
}

/// µs since the epoch as RFC 3339 UTC with microseconds (`2026-12-06T09:00:00.000001Z`).
pub fn rfc3339(us: Micros) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// One page of [`OutboxStore::replay_page`](crate::OutboxStore::replay_page): events as a sink
/// takes them (the token carries the event id and seq; no claim: `claim_id` empty, version 0).
pub type ReplayPage = Vec<ClaimedEvent>;

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(from: Option<i64>, to: Option<i64>) -> ReplayFilter {
        ReplayFilter {
            topics: vec!["orders".into()],
            aggregates: vec![],
            from,
            to,
        }
    }

    fn scan(known: bool, matched: u64, mark: Option<i64>) -> Vec<TopicScan> {
        vec![TopicScan {
            topic: "orders".into(),
            known,
            matched,
            not_sent: 2,
            retention: mark.map(|m| RetentionMark {
                purged_created_at: m,
                purged_at: m + 1,
            }),
        }]
    }

    #[test]
    fn refusals_name_the_gap() {
        assert_eq!(
            check_replay(&ReplayFilter::default(), &[]),
            Err(ReplayRefusal::NoTopic)
        );
        assert!(matches!(
            check_filter(&filter(Some(2), Some(1))),
            Err(ReplayRefusal::FromAfterTo { .. })
        ));
        assert_eq!(
            check_replay(&filter(None, None), &scan(false, 0, None)),
            Err(ReplayRefusal::UnknownTopic("orders".into()))
        );
        // the watermark is the newest purged created_at: a range starting at it is cut,
        // one starting after it is not
        let cut = check_replay(&filter(Some(100), None), &scan(true, 5, Some(100)));
        let Err(e) = cut else { panic!("{cut:?}") };
        assert_eq!(
            e.to_string(),
            "retention removed events of topic orders created before 1970-01-01T00:00:00.000100Z (purged at 1970-01-01T00:00:00.000101Z); the range starts at 1970-01-01T00:00:00.000100Z"
        );
        assert!(check_replay(&filter(None, None), &scan(true, 5, Some(100))).is_err());
        assert_eq!(
            check_replay(&filter(Some(101), None), &scan(true, 5, Some(100))),
            Ok(5)
        );
        let none = check_replay(&filter(Some(101), None), &scan(true, 0, None));
        assert!(none
            .unwrap_err()
            .to_string()
            .starts_with("0 events matched"));
    }

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_796_547_600_000_001),
            "2026-12-06T09:00:00.000001Z"
        );
    }
}
