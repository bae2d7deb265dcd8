//! The delivery check: what the producers wrote against what the relay got.
use std::collections::{BTreeMap, BTreeSet};

/// One intent a producer wrote, named by the step that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Intent {
    pub(super) tag: String,
    pub(super) agg: String,
    pub(super) version: i64,
}

/// One event the relay got, in delivery order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Delivered {
    pub(super) tag: String,
    pub(super) agg: String,
    pub(super) version: i64,
    /// Where the read found it (cursor position or `seq`), for messages.
    pub(super) at: String,
}

pub(super) fn payload(tag: &str) -> String {
    format!(r#"{{"tag":"{tag}"}}"#)
}

pub(super) fn tag_of(payload: &str) -> String {
    payload
        .strip_prefix(r#"{"tag":""#)
        .and_then(|r| r.strip_suffix(r#""}"#))
        .unwrap_or(payload)
        .to_string()
}

/// The problems with a delivery: per aggregate, first occurrences must have strictly increasing
/// versions; every committed intent must be delivered, exactly once; no rolled-back intent and
/// nothing no session wrote. Empty when the delivery is right.
pub(super) fn check_delivery(
    delivered: &[Delivered],
    committed: &[Intent],
    discarded: &[Intent],
) -> Vec<String> {
    let mut problems = Vec::new();
    let committed_tags: BTreeSet<&str> = committed.iter().map(|i| i.tag.as_str()).collect();
    let discarded_tags: BTreeSet<&str> = discarded.iter().map(|i| i.tag.as_str()).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut last: BTreeMap<&str, &Delivered> = BTreeMap::new();
    for d in delivered {
        if !seen.insert(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} delivered twice (again at {})",
                d.agg, d.version, d.at
            ));
            continue;
        }
        if discarded_tags.contains(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) was rolled back but delivered at {}",
                d.agg, d.version, d.tag, d.at
            ));
        } else if !committed_tags.contains(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) at {} was written by no session",
                d.agg, d.version, d.tag, d.at
            ));
        }
        if let Some(prev) = last.get(d.agg.as_str()) {
            if d.version <= prev.version {
                problems.push(format!(
                    "{}: v{} (at {}) was delivered before v{} (at {})",
                    d.agg, prev.version, prev.at, d.version, d.at
                ));
            }
        }
        last.insert(d.agg.as_str(), d);
    }
    for i in committed {
        if !seen.contains(i.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) committed but never delivered",
                i.agg, i.version, i.tag
            ));
        }
    }
    problems
}

/// Committed versions of each aggregate must be 1, 2, …, n (the business row's versions).
pub(super) fn check_versions(committed: &[Intent]) -> Vec<String> {
    let mut by_agg: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for i in committed {
        by_agg.entry(i.agg.as_str()).or_default().push(i.version);
    }
    by_agg
        .into_iter()
        .filter_map(|(agg, mut vs)| {
            vs.sort_unstable();
            let want: Vec<i64> = (1..=vs.len() as i64).collect();
            (vs != want).then(|| format!("{agg}: committed versions {vs:?}, want {want:?}"))
        })
        .collect()
}
