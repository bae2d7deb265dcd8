//! In-memory outbox store — **NOT DURABLE. Everything is lost when the process exits.**
//!
//! [`MemoryStore`] keeps the whole [`OutboxStore`] contract except durability: there is no
//! business transaction to enqueue into, no file, no recovery after a crash. It exists to
//! measure the engine alone (shard routing, batching, outcome tracking with the null sink), to
//! unit-test relay logic without a database, and as the reference model of the claim protocol.
//! **Never use it where an intent must survive a restart** — that is the outbox's whole point.
//!
//! What it keeps, exactly as the SQL backends do (the shared conformance suite runs against it):
//! * the predecessor rule: an event is claimable only while no lower version of its aggregate is
//!   `PENDING`, `CLAIMED` or `QUARANTINED`;
//! * due rows only: `PENDING` with `available_at <= now` (retry backoff), or `CLAIMED` with an
//!   expired lease (takeover), oldest `seq` first across the requested slots;
//! * claim terms: every claim bumps `claim_version` and sets the pre-generated `claim_id`; every
//!   later transition is a compare-and-set on `(seq, state = CLAIMED, claim_version, claim_id)`,
//!   and a stale token is reported [`CasResult::Fenced`];
//! * quarantine / requeue / skip with `resolved_by`, `lookup_claim`, `status`;
//! * slot leases with epochs and fenced claims, relay membership;
//! * commit wake-ups ([`OutboxStore::listen_commits`]): an enqueue wakes idle relays at once;
//! * retention ([`OutboxStore::purge_sent`]) and [`OutboxStore::reconcile`]; there is no Inbox
//!   or business table in memory, so a request naming a consumer or a business table is refused.
//!
//! # Design (for speed: the relay with the null sink must not wait on its store)
//! There is no global scan per claim and no lock shared by all workers. Rows live in
//! [`SLOT_COUNT`] shards, one per slot, each behind its own `Mutex`; an aggregate maps to
//! exactly one slot, so its whole predecessor chain lives in one shard. Per shard:
//! * `rows`: every row in `seq` order (a `Vec`; `keys` beside it is binary-searched to address a
//!   row). Claims take rows in `seq` order, so a backlog drains as a sequential memory walk;
//! * `aggs`: one entry per aggregate (a slab the row points into) with its unfinished versions
//!   in order; the first is the aggregate's *head*, the only row of it that can be claimable;
//! * `ready`: heads claimable now, by `seq`; `timed`: heads claimable later — `PENDING` rows
//!   waiting for `available_at`, `CLAIMED` rows until `lease_until` — moved to `ready` when due.
//!
//! The indexes are maintained eagerly on every transition, so a claim pops `ready` (merging the
//! requested slots by `seq`) and an ack removes one entry and promotes the next version:
//! O(log n) per event. Status counters are kept per shard, so `status` costs O(slots), not
//! O(backlog). A claim holds the locks of the slots it reads plus a read lock on the slot-lease
//! table (the slot fence, as the SQL backends check the lease in the claim), so it is atomic like a
//! database claim. Relay workers own disjoint slots and never contend.
//!
//! Measured on a 2-core machine (bench `engine`): the first version
//! (hash maps keyed by seq and aggregate id, seven string allocations per row) spent ~75 % of a
//! backlog drain in cache misses inside the store; this layout removes most of them.
//!
//! `seq` values increase in insertion order but are not dense: the low 8 bits hold the slot
//! (`seq = counter · 256 + slot`), so a token addresses its shard without a global index.
//!
//! Memory grows with every row ever enqueued (`SENT` rows stay readable through
//! [`OutboxStore::record`], as in a table) until [`OutboxStore::purge_sent`] drops old ones.
//!
//! [`OutboxStore`]: ferry_core::OutboxStore
//! [`OutboxStore::listen_commits`]: ferry_core::OutboxStore::listen_commits
//! [`OutboxStore::purge_sent`]: ferry_core::OutboxStore::purge_sent
//! [`OutboxStore::reconcile`]: ferry_core::OutboxStore::reconcile
//! [`OutboxStore::record`]: ferry_core::OperatorActions::record
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use ferry_core::{
    now_micros, BoxFuture, CasReport, CasResult, ClaimRequest, ClaimToken, ClaimedEvent,
    EnqueueError, EventRecord, EventState, Limits, Micros, NewEvent, OutboxStatus, Payload,
    QuarantinedEvent, ReconcileReport, ReconcileRequest, RetryItem, SlotId, SlotLease, StoreError,
    StoreErrorKind, ValidatedEvent, Watermark, SLOT_COUNT,
};

use ferry_store::{not_quarantined, owner_in_use};

mod operations;
#[cfg(test)]
mod tests;
mod traits;

/// A duration in whole microseconds, saturating.
fn micros(d: std::time::Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// Bits of `seq` that hold the slot (`SLOT_COUNT` = 256).
const SLOT_BITS: u32 = 8;

type Waker = Arc<dyn Fn() + Send + Sync>;

/// The in-memory, **non-durable** outbox store. See the module docs.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Next insertion counter (`seq >> 8`); starts at 1 so every `seq` is positive.
    next: AtomicI64,
    /// event_id → seq: unique event ids across slots, and `record`/`requeue`/`skip` by id.
    ids: DashMap<Box<str>, i64>,
    slots: RwLock<SlotTable>,
    wakers: RwLock<Vec<Waker>>,
    limits: Limits,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("rows", &self.ids.len())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// The intent's text columns, in this order, in one allocation (one cache-friendly block
/// instead of seven scattered strings).
const EVENT_ID: usize = 0;
const AGGREGATE_ID: usize = 1;
const TOPIC: usize = 2;
const KEY: usize = 3;
const EVENT_TYPE: usize = 4;
const HEADERS: usize = 5;
const PAYLOAD: usize = 6;

/// One outbox row: the immutable intent plus its delivery state.
struct Row {
    seq: i64,
    /// Index of the aggregate in the shard's `aggs`.
    agg: u32,
    /// End offset of each text column in `text`.
    ends: [u32; 7],
    text: Box<str>,
    aggregate_version: i64,
    created_at: Micros,
    available_at: Micros,
    claim_version: i64,
    /// Shared by every row of one claim (one allocation per claim, not per row).
    claim_id: Option<Arc<str>>,
    /// Meaningful while `CLAIMED`.
    lease_until: Micros,
    /// When it became `SENT` (retention).
    sent_at: Micros,
    state: EventState,
    attempts: i32,
    /// Which claim index holds the row.
    idx: Idx,
    /// `last_error`, `resolved_by`, a binary payload: rare, kept out of line.
    notes: Option<Box<Notes>>,
}

#[derive(Default)]
struct Notes {
    last_error: Option<String>,
    resolved_by: Option<String>,
    /// A binary payload (the text column is then empty): rare, so kept out of the row.
    payload_bytes: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idx {
    /// Not claimable: not its aggregate's head, or `SENT`/`SKIPPED`/`QUARANTINED`.
    None,
    /// In `ready`.
    Ready,
    /// In `timed` under this time.
    Timed(Micros),
}

/// An aggregate's unfinished versions as `(version, seq)`, sorted; the first one (the head) is
/// kept inline because most aggregates have a single unfinished event.
#[derive(Default)]
struct Chain {
    head: Option<(i64, i64)>,
    rest: VecDeque<(i64, i64)>,
}

impl Chain {
    fn head_seq(&self) -> Option<i64> {
        self.head.map(|(_, s)| s)
    }

    /// Inserts; true when the new entry is the head.
    fn insert(&mut self, version: i64, seq: i64) -> bool {
        match self.head {
            None => {
                self.head = Some((version, seq));
                true
            }
            Some(h) if version < h.0 => {
                self.rest.push_front(h);
                self.head = Some((version, seq));
                true
            }
            Some(_) => {
                match self.rest.back() {
                    Some(last) if last.0 > version => {
                        let i = self
                            .rest
                            .binary_search_by_key(&version, |(v, _)| *v)
                            .unwrap_or_else(|i| i);
                        self.rest.insert(i, (version, seq));
                    }
                    _ => self.rest.push_back((version, seq)),
                }
                false
            }
        }
    }

    /// Removes; true when it was the head (the next one, if any, is the head now).
    fn remove(&mut self, version: i64, seq: i64) -> bool {
        if self.head == Some((version, seq)) {
            self.head = self.rest.pop_front();
            return true;
        }
        if let Ok(i) = self.rest.binary_search_by_key(&version, |(v, _)| *v) {
            self.rest.remove(i);
        }
        false
    }

    fn iter(&self) -> impl Iterator<Item = &(i64, i64)> {
        self.head.iter().chain(self.rest.iter())
    }
}

#[derive(Default)]
struct Agg {
    open: Chain,
    /// Unfinished rows of this aggregate that are `QUARANTINED` (it is blocked while > 0).
    quarantined: u32,
}

/// Fibonacci hashing with a folded high half, for keys the store generates itself (seq
/// counters, aggregate indexes): ~1 ns instead of SipHash's ~20 ns. Never used for
/// user-supplied strings, so HashDoS resistance is not needed.
#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }
}

type Fast = BuildHasherDefault<FastHasher>;

#[derive(Default, Clone, Copy)]
struct Counts {
    pending: i64,
    claimed: i64,
    quarantined: i64,
    /// Aggregates with a quarantined row.
    blocked: i64,
}

#[derive(Default)]
struct Shard {
    /// `seq >> 8` of each row, ascending (rows are appended in seq order under the lock).
    keys: Vec<u64>,
    /// The rows, parallel to `keys`.
    rows: Vec<Row>,
    /// Aggregate id → index in `aggs` (enqueue only).
    agg_index: HashMap<Arc<str>, u32>,
    aggs: Vec<Agg>,
    /// `(aggregate index, version)` of every row: the unique key.
    versions: HashSet<(u32, i64), Fast>,
    /// Claimable heads by seq.
    ready: BTreeSet<i64>,
    /// Heads claimable later, by (time, seq).
    timed: BTreeSet<(Micros, i64)>,
    /// No row before this key is unfinished (advanced lazily by `status`).
    oldest_open: u64,
    counts: Counts,
}

struct LeaseRow {
    owner: Option<String>,
    epoch: i64,
    lease_until: Micros,
}

struct SlotTable {
    leases: Vec<LeaseRow>,
    /// owner id → (instance holding it, membership lease)
    members: BTreeMap<String, (String, Micros)>,
}

fn key_of(seq: i64) -> u64 {
    (seq >> SLOT_BITS) as u64
}

fn slot_of(seq: i64) -> usize {
    (seq & ((1 << SLOT_BITS) - 1)) as usize
}

/// The error for operations that need the SQL backends' tables (Inbox, business tables).
fn no_sql_tables(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::InvalidInput,
        format!("{what} needs the ferry_inbox/business tables of a SQL database; the in-memory store has none — use sqlite://, postgres:// or mysql://"),
    )
}

fn is_open(state: EventState) -> bool {
    matches!(
        state,
        EventState::Pending | EventState::Claimed | EventState::Quarantined
    )
}

/// Puts `row` into the claim index it belongs to (`head`: it is its aggregate's lowest
/// unfinished version), taking it out of the one it was in.
fn place(
    row: &mut Row,
    head: bool,
    now: Micros,
    ready: &mut BTreeSet<i64>,
    timed: &mut BTreeSet<(Micros, i64)>,
) {
    let want = if !head {
        Idx::None
    } else {
        match row.state {
            EventState::Pending if row.available_at <= now => Idx::Ready,
            EventState::Pending => Idx::Timed(row.available_at),
            EventState::Claimed if row.lease_until <= now => Idx::Ready,
            EventState::Claimed => Idx::Timed(row.lease_until),
            _ => Idx::None,
        }
    };
    if want == row.idx {
        return;
    }
    match row.idx {
        Idx::Ready => {
            ready.remove(&row.seq);
        }
        Idx::Timed(t) => {
            timed.remove(&(t, row.seq));
        }
        Idx::None => {}
    }
    match want {
        Idx::Ready => {
            ready.insert(row.seq);
        }
        Idx::Timed(t) => {
            timed.insert((t, row.seq));
        }
        Idx::None => {}
    }
    row.idx = want;
}

impl Row {
    fn text(&self, column: usize) -> &str {
        let start = if column == 0 {
            0
        } else {
            self.ends[column - 1] as usize
        };
        &self.text[start..self.ends[column] as usize]
    }

    fn claimed_event(&self) -> ClaimedEvent {
        ClaimedEvent {
            token: ClaimToken {
                seq: self.seq,
                event_id: self.text(EVENT_ID).to_string(),
                claim_id: self.claim_id.as_deref().unwrap_or_default().to_string(),
                claim_version: self.claim_version,
            },
            aggregate_id: self.text(AGGREGATE_ID).to_string(),
            aggregate_version: self.aggregate_version,
            shard_slot: slot_of(self.seq) as SlotId,
            topic: self.text(TOPIC).to_string(),
            key: self.text(KEY).to_string(),
            event_type: self.text(EVENT_TYPE).to_string(),
            headers: self.text(HEADERS).to_string(),
            payload: self.payload(),
            attempts: self.attempts,
            created_at: self.created_at,
        }
    }

    fn record(&self) -> EventRecord {
        let notes = self.notes.as_deref();
        EventRecord {
            event_id: self.text(EVENT_ID).to_string(),
            state: self.state,
            claim_version: self.claim_version,
            claim_id: self.claim_id.as_deref().map(str::to_string),
            attempts: self.attempts,
            last_error: notes.and_then(|n| n.last_error.clone()),
            resolved_by: notes.and_then(|n| n.resolved_by.clone()),
            payload: self.payload(),
        }
    }

    fn payload(&self) -> Payload {
        match self.notes.as_deref().and_then(|n| n.payload_bytes.as_ref()) {
            Some(bytes) => Payload::Bytes(bytes.clone()),
            None => Payload::Text(self.text(PAYLOAD).to_string()),
        }
    }

    fn notes(&mut self) -> &mut Notes {
        self.notes.get_or_insert_with(Box::default)
    }

    fn token_matches(&self, t: &ClaimToken) -> bool {
        self.state == EventState::Claimed
            && self.claim_version == t.claim_version
            && self.claim_id.as_deref() == Some(t.claim_id.as_str())
    }
}

impl Shard {
    fn pos(&self, seq: i64) -> Option<usize> {
        self.keys.binary_search(&key_of(seq)).ok()
    }

    fn has_version(&self, aggregate_id: &str, version: i64) -> bool {
        self.agg_index
            .get(aggregate_id)
            .is_some_and(|a| self.versions.contains(&(*a, version)))
    }

    /// Moves `rows[pos]` to `to`, keeping the counters (and blocked aggregates) right.
    fn set_state(&mut self, pos: usize, to: EventState) {
        let row = &mut self.rows[pos];
        let from = row.state;
        if from == to {
            return;
        }
        row.state = to;
        let c = &mut self.counts;
        for (s, d) in [(from, -1), (to, 1)] {
            match s {
                EventState::Pending => c.pending += d,
                EventState::Claimed => c.claimed += d,
                EventState::Quarantined => {
                    c.quarantined += d;
                    let a = &mut self.aggs[row.agg as usize];
                    if d > 0 {
                        a.quarantined += 1;
                        c.blocked += i64::from(a.quarantined == 1);
                    } else {
                        a.quarantined -= 1;
                        c.blocked -= i64::from(a.quarantined == 0);
                    }
                }
                EventState::Sent | EventState::Skipped => {}
            }
        }
    }

    fn insert(&mut self, v: ValidatedEvent, seq: i64, now: Micros) {
        let agg = match self.agg_index.get(v.aggregate_id.as_str()) {
            Some(a) => *a,
            None => {
                let a = self.aggs.len() as u32;
                self.aggs.push(Agg::default());
                self.agg_index.insert(Arc::from(v.aggregate_id.as_str()), a);
                a
            }
        };
        self.versions.insert((agg, v.aggregate_version));
        let old_head = self.aggs[agg as usize].open.head_seq();
        let head = self.aggs[agg as usize]
            .open
            .insert(v.aggregate_version, seq);
        // A version below the current head (enqueued out of order) becomes the head and blocks
        // the old one, exactly like the database's NOT EXISTS (lower unfinished version).
        if head {
            if let Some(old) = old_head.and_then(|s| self.pos(s)) {
                place(
                    &mut self.rows[old],
                    false,
                    now,
                    &mut self.ready,
                    &mut self.timed,
                );
            }
        }
        let mut text = String::with_capacity(
            v.event_id.len()
                + v.aggregate_id.len()
                + v.topic.len()
                + v.key.len()
                + v.event_type.len()
                + v.headers.len()
                + v.payload.len(),
        );
        let mut ends = [0u32; 7];
        for (i, s) in [
            v.event_id.as_str(),
            &v.aggregate_id,
            &v.topic,
            &v.key,
            &v.event_type,
            &v.headers,
            v.payload.as_text().unwrap_or_default(),
        ]
        .into_iter()
        .enumerate()
        {
            text.push_str(s);
            ends[i] = text.len() as u32;
        }
        let mut row = Row {
            seq,
            agg,
            ends,
            text: text.into_boxed_str(),
            aggregate_version: v.aggregate_version,
            created_at: now,
            available_at: now,
            claim_version: 0,
            claim_id: None,
            lease_until: 0,
            sent_at: 0,
            state: EventState::Pending,
            attempts: 0,
            idx: Idx::None,
            notes: v.payload.as_binary().map(|b| {
                Box::new(Notes {
                    payload_bytes: Some(b.to_vec()),
                    ..Notes::default()
                })
            }),
        };
        place(&mut row, head, now, &mut self.ready, &mut self.timed);
        self.counts.pending += 1;
        self.keys.push(key_of(seq));
        self.rows.push(row);
    }

    /// Moves heads whose time has come from `timed` to `ready`.
    fn promote_due(&mut self, now: Micros) {
        while let Some(&(t, seq)) = self.timed.first() {
            if t > now {
                break;
            }
            self.timed.pop_first();
            self.ready.insert(seq);
            if let Some(p) = self.pos(seq) {
                self.rows[p].idx = Idx::Ready;
            }
        }
    }

    /// Claims ready row `seq` (popped from `ready` by the caller).
    fn take(&mut self, seq: i64, claim_id: &Arc<str>, lease_until: Micros) -> Option<ClaimedEvent> {
        let p = self.pos(seq)?;
        self.set_state(p, EventState::Claimed);
        let row = &mut self.rows[p];
        row.claim_version += 1;
        row.claim_id = Some(claim_id.clone());
        row.lease_until = lease_until;
        row.idx = Idx::Timed(lease_until);
        self.timed.insert((lease_until, seq));
        Some(row.claimed_event())
    }

    /// Re-places `rows[pos]` after a change of its state or times (same chain position).
    fn replace(&mut self, pos: usize, now: Micros) {
        let row = &mut self.rows[pos];
        let head = self.aggs[row.agg as usize].open.head_seq() == Some(row.seq);
        place(row, head, now, &mut self.ready, &mut self.timed);
    }

    /// Moves `rows[pos]` to a finished state (`SENT`/`SKIPPED`), takes it out of its
    /// aggregate's chain and promotes the next version if it was the head.
    fn finish(&mut self, pos: usize, to: EventState, now: Micros) {
        self.set_state(pos, to);
        let row = &mut self.rows[pos];
        place(row, false, now, &mut self.ready, &mut self.timed);
        let chain = &mut self.aggs[row.agg as usize].open;
        if chain.remove(row.aggregate_version, row.seq) {
            if let Some(next) = chain.head_seq().and_then(|s| self.pos(s)) {
                place(
                    &mut self.rows[next],
                    true,
                    now,
                    &mut self.ready,
                    &mut self.timed,
                );
            }
        }
    }

    /// Unfinished rows from the oldest one on (the backlog), advancing the cursor past
    /// finished rows.
    fn open_rows(&mut self) -> impl Iterator<Item = &Row> + '_ {
        let mut p = self.keys.partition_point(|k| *k < self.oldest_open);
        while p < self.rows.len() && !is_open(self.rows[p].state) {
            p += 1;
        }
        // past the end: rows appended later have larger keys than every current one
        self.oldest_open = match self.keys.get(p) {
            Some(k) => *k,
            None => self.keys.last().map_or(0, |k| k + 1),
        };
        self.rows[p..].iter().filter(|r| is_open(r.state))
    }
}
