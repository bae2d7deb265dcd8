//! The shape of the simulated business: aggregates, their popularity, identities and payloads.
//!
//! Every producer may pick any aggregate of the run, so producers contend for aggregates as an
//! application's request handlers do. An aggregate's version is never chosen in-process: the
//! producer's transaction takes it from the aggregate's business row (`loadgen_aggregates`,
//! `ver = ver + 1`, see [`crate::db`]), whose row lock it then holds until COMMIT; a rolled-back
//! transaction's versions roll back with it, so every aggregate's committed versions are exactly
//! `1..=n`. Event ids are `lg-<run>-p<producer>-<n>`: deterministic (a retried transaction
//! reuses the very same event ids, with the versions its new attempt got) and contiguous per
//! producer, so "what was committed" is one counter per producer rather than millions of stored
//! ids.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use ferry_core::NewEvent;
use rand::Rng;

use crate::cli::Skew;

/// The event type of every generated intent.
pub const EVENT_TYPE: &str = "OrderChanged";

/// Largest key space for which the exact Zipf CDF is tabulated (8 MB of f64, once per run: every
/// producer shares the picker); above it a continuous approximation is sampled in O(1) memory.
const EXACT_ZIPF_MAX: usize = 1 << 20;

/// Picks an aggregate index (the same picker for every producer of a run).
#[derive(Debug, Clone)]
pub struct KeyPicker {
    n: usize,
    kind: Picker,
}

#[derive(Debug, Clone)]
enum Picker {
    Uniform,
    /// Cumulative probabilities of ranks 1..=n.
    ZipfExact(Vec<f64>),
    /// Inverse CDF of the density x^-s on [1, n+1).
    ZipfApprox(f64),
}

impl KeyPicker {
    /// A picker over `n >= 1` aggregates. Rank 0 (the hottest) is index 0.
    pub fn new(n: usize, skew: Skew, s: f64) -> Self {
        let n = n.max(1);
        let kind = match skew {
            Skew::Uniform => Picker::Uniform,
            Skew::Zipf if n <= EXACT_ZIPF_MAX => {
                let mut cdf = Vec::with_capacity(n);
                let mut acc = 0.0;
                for r in 1..=n {
                    acc += 1.0 / (r as f64).powf(s);
                    cdf.push(acc);
                }
                for c in &mut cdf {
                    *c /= acc;
                }
                Picker::ZipfExact(cdf)
            }
            Skew::Zipf => Picker::ZipfApprox(s),
        };
        Self { n, kind }
    }

    /// One index in `0..n`.
    pub fn pick(&self, rng: &mut impl Rng) -> usize {
        match &self.kind {
            Picker::Uniform => rng.gen_range(0..self.n),
            Picker::ZipfExact(cdf) => {
                let u: f64 = rng.gen();
                cdf.partition_point(|c| *c < u).min(self.n - 1)
            }
            Picker::ZipfApprox(s) => {
                let u: f64 = rng.gen();
                let top = (self.n + 1) as f64;
                let x = if (s - 1.0).abs() < 1e-9 {
                    top.powf(u)
                } else {
                    let a = 1.0 - s;
                    ((top.powf(a) - 1.0) * u + 1.0).powf(1.0 / a)
                };
                (x.floor() as usize).saturating_sub(1).min(self.n - 1)
            }
        }
    }
}

/// Identity helpers of one run.
#[derive(Debug, Clone)]
pub struct Ids {
    /// Short random id of the run, part of every identity so runs never collide on a reused
    /// broker topic or database.
    pub run: String,
}

impl Ids {
    /// The aggregate id of global index `idx`.
    pub fn aggregate(&self, idx: usize) -> String {
        format!("lg-{}-a{idx}", self.run)
    }

    /// The id of producer `p`'s `n`-th event (zero-padded so ids sort in commit order).
    pub fn event(&self, p: usize, n: u64) -> String {
        format!("lg-{}-p{p:03}-{n:012}", self.run)
    }

    /// `(producer, n)` of an event id of this run ([`Ids::event`]'s inverse).
    pub fn parse(&self, id: &str) -> Option<(usize, u64)> {
        let rest = id.strip_prefix("lg-")?.strip_prefix(self.run.as_str())?;
        let (p, n) = rest.strip_prefix("-p")?.split_once('-')?;
        Some((p.parse().ok()?, n.parse().ok()?))
    }

    /// The business order id of producer `p`'s `n`-th order.
    pub fn order(p: usize, n: u64) -> i64 {
        ((p as i64) << 40) | (n as i64 & ((1 << 40) - 1))
    }
}

/// One business order row.
#[derive(Debug, Clone)]
pub struct Order {
    pub order_id: i64,
    /// The aggregate this row changes.
    pub aggregate_id: String,
    /// The version its aggregate's business row gave it (0 until the transaction took it; a
    /// retried transaction takes a new one).
    pub version: i64,
    pub amount_cents: i64,
}

impl Order {
    /// `CREATED` for the first version, `UPDATED` after.
    pub fn status(&self) -> &'static str {
        if self.version == 1 {
            "CREATED"
        } else {
            "UPDATED"
        }
    }
}

/// A JSON payload of exactly `size` bytes (sizes from 128 bytes up hold the skeleton).
pub fn payload(order: &Order, size: usize) -> String {
    let mut s = String::with_capacity(size.max(128));
    let _ = write!(
        s,
        r#"{{"order_id":{},"aggregate":"{}","version":{},"amount_cents":{},"pad":""#,
        order.order_id, order.aggregate_id, order.version, order.amount_cents
    );
    let tail = "\"}";
    let pad = size.saturating_sub(s.len() + tail.len());
    s.extend((0..pad).map(|_| 'x'));
    s.push_str(tail);
    s
}

/// The outbox intent of `order`, keyed by its aggregate (one aggregate → one partition).
pub fn event(ids: &Ids, p: usize, n: u64, order: &Order, topic: &str, size: usize) -> NewEvent {
    NewEvent {
        event_id: Some(ids.event(p, n)),
        aggregate_id: order.aggregate_id.clone(),
        aggregate_version: order.version,
        topic: topic.to_string(),
        key: None,
        event_type: EVENT_TYPE.to_string(),
        payload: payload(order, size).into(),
        headers: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn payload_has_the_exact_size_and_is_json() {
        let o = Order {
            order_id: Ids::order(3, 17),
            aggregate_id: "lg-abc123-a42".into(),
            version: 7,
            amount_cents: 1999,
        };
        for size in [128, 200, 10_240] {
            let p = payload(&o, size);
            assert_eq!(p.len(), size);
            let v: serde_json::Value = serde_json::from_str(&p).unwrap();
            assert_eq!(v["version"], 7);
        }
    }

    #[test]
    fn zipf_prefers_low_ranks_and_stays_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for n in [1, 10, 1000] {
            let k = KeyPicker::new(n, Skew::Zipf, 1.0);
            let mut hits = vec![0u32; n];
            for _ in 0..20_000 {
                hits[k.pick(&mut rng)] += 1;
            }
            assert!(hits[0] >= *hits.iter().max().unwrap() / 2);
        }
        let approx = KeyPicker {
            n: 1000,
            kind: Picker::ZipfApprox(1.2),
        };
        let mut first = 0;
        for _ in 0..20_000 {
            let i = approx.pick(&mut rng);
            assert!(i < 1000);
            first += u32::from(i == 0);
        }
        assert!(first > 2_000, "rank 0 drawn {first} times");
    }

    #[test]
    fn ids_sort_in_commit_order() {
        let ids = Ids {
            run: "abc123".into(),
        };
        assert!(ids.event(1, 9) < ids.event(1, 10));
        assert_ne!(Ids::order(1, 5), Ids::order(2, 5));
    }
}
