//! The shape of the load ([`Workload`], [`Preload`]), aggregate popularity ([`KeyPicker`]),
//! identities ([`Ids`]), orders and their payloads.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use ferry_core::NewEvent;
use rand::Rng;
use serde::Serialize;

/// How aggregates are picked for each new order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Skew {
    /// Every aggregate equally likely.
    Uniform,
    /// Zipf-distributed hot keys.
    Zipf,
}

impl Skew {
    /// The names a flag accepts, in declaration order.
    pub const NAMES: [&'static str; 2] = ["uniform", "zipf"];

    /// The skew named `name` (one of [`Skew::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "uniform" => Some(Skew::Uniform),
            "zipf" => Some(Skew::Zipf),
            _ => None,
        }
    }
}

/// The workload of a run's producers.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// Aggregates the producers share (without a preloaded queue).
    pub aggregates: u64,
    /// Aggregate popularity.
    pub skew: Skew,
    /// Zipf exponent (with zipf skew); not serialized (a report echoes it with zipf only).
    #[serde(skip)]
    pub zipf_s: f64,
    /// Orders (each with its intent) per business transaction.
    pub orders_per_tx: usize,
    /// Events/s over all producers; 0 = flat out.
    pub rate: u64,
    /// Payload size in bytes.
    pub payload_bytes: usize,
    /// Workload seed; producer `p` uses `seed + p`.
    pub seed: u64,
    /// Each producer picks among its own share of the aggregates only (no contention).
    pub producers_own_aggregates: bool,
    /// A fixed queue to commit instead of random picks until stopped; not serialized.
    #[serde(skip)]
    pub preload: Option<Preload>,
}

impl Workload {
    /// Aggregates whose business rows a run creates: every aggregate of the load, or of the
    /// preloaded queue.
    pub fn aggregate_rows(&self) -> u64 {
        self.preload.map_or(self.aggregates, |p| p.aggregates())
    }
}

/// The shape of a preloaded queue: `total` intents over `ceil(total / per_aggregate)`
/// aggregates, each with versions `1..=per_aggregate` (the last aggregate gets the remainder).
/// The queue's orders are numbered `0..total`; order `i` changes aggregate `i / per_aggregate`,
/// and the producers take the orders in blocks of `orders_per_tx` from one shared counter, so
/// an aggregate's versions are committed close together, by whichever producers took its
/// orders (a hot aggregate's versions by all of them, contending for its row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preload {
    /// Intents in the queue.
    pub total: u64,
    /// Versions per aggregate.
    pub per_aggregate: u64,
}

impl Preload {
    /// Number of aggregates.
    pub fn aggregates(&self) -> u64 {
        self.total.div_ceil(self.per_aggregate.max(1))
    }

    /// The aggregate order `i` of the queue changes.
    pub fn aggregate_of(&self, i: u64) -> u64 {
        i / self.per_aggregate.max(1)
    }

    /// Versions of aggregate `a`.
    pub fn versions_of(&self, a: u64) -> u64 {
        let k = self.per_aggregate.max(1);
        if a + 1 == self.aggregates() {
            self.total - a * k
        } else {
            k
        }
    }
}

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
    /// The order's id ([`Ids::order`]).
    pub order_id: i64,
    /// The aggregate this row changes.
    pub aggregate_id: String,
    /// The version its aggregate's business row gave it (0 until the transaction took it; a
    /// retried transaction takes a new one).
    pub version: i64,
    /// The order's amount.
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
    fn skews_are_named_as_the_flag_and_the_report_name_them() {
        for name in Skew::NAMES {
            let skew = Skew::from_name(name).unwrap();
            assert_eq!(serde_json::to_value(skew).unwrap(), name);
        }
        assert_eq!(Skew::from_name("Zipf"), None);
    }

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
