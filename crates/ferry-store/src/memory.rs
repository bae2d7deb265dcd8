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
//! Measured on a 2-core machine (bench `engine`, `docs/notes/2026-12-02-performance-log.md`): the first version
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
    EnqueueError, EventRecord, EventState, Limits, Micros, NewEvent, OutboxStatus,
    QuarantinedEvent, ReconcileReport, ReconcileRequest, RetryItem, SlotId, SlotLease, StoreError,
    StoreErrorKind, ValidatedEvent, Watermark, SLOT_COUNT,
};

use crate::error::not_quarantined;
use crate::micros;

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
    /// `last_error`, `resolved_by`: rare, kept out of line.
    notes: Option<Box<Notes>>,
}

#[derive(Default)]
struct Notes {
    last_error: Option<String>,
    resolved_by: Option<String>,
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
            payload: self.text(PAYLOAD).to_string(),
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
            payload: self.text(PAYLOAD).to_string(),
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
            &v.event_id,
            &v.aggregate_id,
            &v.topic,
            &v.key,
            &v.event_type,
            &v.headers,
            &v.payload,
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
            notes: None,
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

impl MemoryStore {
    /// An empty store with default [`Limits`].
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    /// An empty store with the given enqueue limits.
    pub fn with_limits(limits: Limits) -> Self {
        Self {
            shards: (0..SLOT_COUNT).map(|_| Mutex::default()).collect(),
            next: AtomicI64::new(1),
            ids: DashMap::new(),
            slots: RwLock::new(SlotTable {
                leases: (0..SLOT_COUNT)
                    .map(|_| LeaseRow {
                        owner: None,
                        epoch: 0,
                        lease_until: 0,
                    })
                    .collect(),
                members: BTreeMap::new(),
            }),
            wakers: RwLock::new(Vec::new()),
            limits,
        }
    }

    // Locks are never held across a panic in this module (every mutation runs after its
    // checks), so a poisoned lock would still guard consistent data: keep going.
    fn shard(&self, slot: usize) -> MutexGuard<'_, Shard> {
        self.shards[slot].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slots_read(&self) -> RwLockReadGuard<'_, SlotTable> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    fn slots_write(&self) -> RwLockWriteGuard<'_, SlotTable> {
        self.slots.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of rows held (every state).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every row's delivery state, in insertion (`seq`) order: what `SELECT … FROM ferry_outbox`
    /// shows on a SQL backend (tests, debugging).
    pub fn records(&self) -> Vec<EventRecord> {
        let mut all: Vec<(i64, EventRecord)> = Vec::with_capacity(self.len());
        for slot in 0..SLOT_COUNT as usize {
            let g = self.shard(slot);
            all.extend(g.rows.iter().map(|r| (r.seq, r.record())));
        }
        all.sort_unstable_by_key(|(s, _)| *s);
        all.into_iter().map(|(_, r)| r).collect()
    }

    fn enqueue_now(&self, events: &[NewEvent]) -> Result<Vec<String>, EnqueueError> {
        let rows = ferry_core::validate_batch(events, &self.limits)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        // Lock every slot the batch touches, in ascending order (the order every multi-slot
        // operation uses), so the batch becomes visible at once: one "transaction". Seqs are
        // allocated under these locks, so each shard's rows are appended in seq order.
        let mut slots: Vec<usize> = rows.iter().map(|r| r.shard_slot as usize).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = slots.iter().map(|s| self.shard(*s)).collect();
        let guard_of = |slot: usize| {
            slots
                .binary_search(&slot)
                .expect("every row's slot is locked")
        };
        for r in &rows {
            if guards[guard_of(r.shard_slot as usize)]
                .has_version(&r.aggregate_id, r.aggregate_version)
            {
                return Err(EnqueueError::DuplicateVersion {
                    aggregate_id: r.aggregate_id.clone(),
                    version: r.aggregate_version,
                });
            }
        }
        let base = self.next.fetch_add(rows.len() as i64, Ordering::Relaxed);
        let seqs: Vec<i64> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((base + i as i64) << SLOT_BITS) | i64::from(r.shard_slot))
            .collect();
        for (i, r) in rows.iter().enumerate() {
            // The entry holds its DashMap shard's write lock: let it go before undoing the
            // reservations made so far (they may live in the same DashMap shard).
            let taken = match self.ids.entry(r.event_id.as_str().into()) {
                Entry::Vacant(v) => {
                    v.insert(seqs[i]);
                    false
                }
                Entry::Occupied(_) => true,
            };
            if taken {
                for done in &rows[..i] {
                    self.ids.remove(done.event_id.as_str());
                }
                return Err(EnqueueError::DuplicateEventId {
                    event_id: r.event_id.clone(),
                });
            }
        }
        let now = now_micros();
        let ids: Vec<String> = rows.iter().map(|r| r.event_id.clone()).collect();
        for (r, seq) in rows.into_iter().zip(seqs) {
            let g = guard_of(r.shard_slot as usize);
            guards[g].insert(r, seq, now);
        }
        drop(guards);
        for wake in self.wakers.read().unwrap_or_else(|e| e.into_inner()).iter() {
            wake();
        }
        Ok(ids)
    }

    fn claim_now(&self, req: &ClaimRequest) -> Vec<ClaimedEvent> {
        if req.slots.is_empty() || req.limit == 0 {
            return Vec::new();
        }
        // Held for the whole claim: a takeover of a slot (acquire_slots, write lock) waits until
        // this claim is done, and an owner whose lease ended finds no slot.
        let table = self.slots_read();
        let now = now_micros();
        let mut slots: Vec<usize> = req
            .slots
            .iter()
            .filter(|s| **s < SLOT_COUNT)
            .filter(|s| match &req.fence {
                None => true,
                Some(f) => {
                    let l = &table.leases[**s as usize];
                    l.owner.as_deref() == Some(f.owner.as_str()) && l.lease_until > now
                }
            })
            .map(|s| *s as usize)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = Vec::with_capacity(slots.len());
        let mut heads = BinaryHeap::with_capacity(slots.len());
        for s in slots {
            let mut g = self.shard(s);
            g.promote_due(now);
            if let Some(&first) = g.ready.first() {
                heads.push(std::cmp::Reverse((first, guards.len())));
            }
            guards.push(g);
        }
        let claim_id: Arc<str> = Arc::from(req.claim_id.as_str());
        let lease_until = now.saturating_add(micros(req.lease));
        // k-way merge by seq: ORDER BY seq LIMIT n over the requested slots. Keep taking from
        // one shard while it holds the smallest seq (no heap traffic for runs). Only the seqs
        // are picked here; rows are then touched shard by shard (each shard's rows are
        // contiguous: sequential memory instead of one jump per event) and sorted back.
        let mut picked: Vec<Vec<i64>> = vec![Vec::new(); guards.len()];
        let mut n = 0;
        while n < req.limit {
            let Some(std::cmp::Reverse((_, i))) = heads.pop() else {
                break;
            };
            let bound = heads.peek().map(|h| h.0 .0);
            let g = &mut guards[i];
            while n < req.limit {
                let Some(seq) = g.ready.pop_first() else {
                    break;
                };
                picked[i].push(seq);
                n += 1;
                match (g.ready.first(), bound) {
                    (Some(&next), Some(b)) if next > b => {
                        heads.push(std::cmp::Reverse((next, i)));
                        break;
                    }
                    (Some(_), _) => {}
                    (None, _) => break,
                }
            }
        }
        let mut out = Vec::with_capacity(n);
        for (g, seqs) in guards.iter_mut().zip(&picked) {
            out.extend(
                seqs.iter()
                    .filter_map(|s| g.take(*s, &claim_id, lease_until)),
            );
        }
        out.sort_unstable_by_key(|e| e.token.seq);
        out
    }

    /// The batched compare-and-set shared by ack/retry/quarantine/release/extend_lease: applies
    /// `apply` to every item whose token still matches, reports the others as fenced.
    fn cas<T>(
        &self,
        items: &[T],
        token: impl Fn(&T) -> &ClaimToken,
        mut apply: impl FnMut(&mut Shard, usize, &T, Micros),
    ) -> CasReport {
        let now = now_micros();
        let mut report = Vec::with_capacity(items.len());
        let mut current: Option<(usize, MutexGuard<'_, Shard>)> = None;
        for (i, item) in items.iter().enumerate() {
            let t = token(item);
            let applied = if t.seq <= 0 {
                false
            } else {
                let slot = slot_of(t.seq);
                if current.as_ref().map(|(s, _)| *s) != Some(slot) {
                    drop(current.take()); // unlock before locking the next shard
                    current = Some((slot, self.shard(slot)));
                }
                let Some((_, g)) = current.as_mut() else {
                    unreachable!("the shard was just locked")
                };
                match g.pos(t.seq) {
                    Some(p) if g.rows[p].token_matches(t) => {
                        apply(g, p, item, now);
                        true
                    }
                    // As on the SQL backends (`CasReport::from_applied`): the same token twice in
                    // one batch is applied twice, and a stale token is fenced even next to the
                    // live one for the same row.
                    _ => items[..i]
                        .iter()
                        .zip(&report)
                        .any(|(prev, (_, r))| *r == CasResult::Applied && token(prev) == t),
                }
            };
            let r = if applied {
                CasResult::Applied
            } else {
                CasResult::Fenced
            };
            report.push((t.seq, r));
        }
        CasReport { items: report }
    }

    /// Runs `f` on the row of `event_id` under its shard's lock.
    fn with_row<R>(&self, event_id: &str, f: impl FnOnce(&mut Shard, usize) -> R) -> Option<R> {
        let seq = *self.ids.get(event_id)?;
        let mut g = self.shard(slot_of(seq));
        let p = g.pos(seq)?;
        Some(f(&mut g, p))
    }

    fn operator(
        &self,
        event_id: &str,
        operator: &str,
        target: EventState,
    ) -> Result<(), StoreError> {
        self.with_row(event_id, |g, p| {
            let now = now_micros();
            if g.rows[p].state != EventState::Quarantined {
                return Err(not_quarantined(event_id, Some(g.rows[p].record())));
            }
            g.rows[p].notes().resolved_by = Some(operator.to_string());
            if target == EventState::Pending {
                g.set_state(p, target);
                let row = &mut g.rows[p];
                row.available_at = now;
                row.attempts = 0;
                g.replace(p, now);
            } else {
                g.finish(p, target, now);
            }
            Ok(())
        })
        .unwrap_or_else(|| Err(not_quarantined(event_id, None)))
    }

    /// Deletes (or counts) `SENT` rows with `sent_at < cutoff`, one shard at a time, forgetting
    /// their event ids and aggregate versions as a `DELETE` would.
    fn purge_now(&self, cutoff: Micros, dry_run: bool) -> u64 {
        let old = |r: &Row| r.state == EventState::Sent && r.sent_at < cutoff;
        let mut total = 0u64;
        for slot in 0..SLOT_COUNT as usize {
            let mut g = self.shard(slot);
            if dry_run {
                total += g.rows.iter().filter(|r| old(r)).count() as u64;
                continue;
            }
            if !g.rows.iter().any(old) {
                continue;
            }
            let Shard {
                keys,
                rows,
                versions,
                ..
            } = &mut *g;
            let mut kept = Vec::with_capacity(rows.len());
            for r in rows.drain(..) {
                if old(&r) {
                    self.ids.remove(r.text(EVENT_ID));
                    versions.remove(&(r.agg, r.aggregate_version));
                    total += 1;
                } else {
                    kept.push(r);
                }
            }
            *keys = kept.iter().map(|r| key_of(r.seq)).collect();
            *rows = kept;
        }
        total
    }

    fn reconcile_now(&self, req: &ReconcileRequest) -> ReconcileReport {
        let now = now_micros();
        let under = |r: &Row| match req.watermark {
            Watermark::Seq(n) => r.seq <= n,
            Watermark::Time(t) => r.created_at <= t,
        };
        let mut rep = ReconcileReport::default();
        let mut unknown: Vec<(i64, String)> = Vec::new();
        let mut quarantined: Vec<(i64, String)> = Vec::new();
        for slot in 0..SLOT_COUNT as usize {
            let g = self.shard(slot);
            for r in g.rows.iter().filter(|r| under(r)) {
                rep.total += 1;
                match r.state {
                    EventState::Quarantined => {
                        rep.quarantined += 1;
                        quarantined.push((r.seq, r.text(EVENT_ID).to_string()));
                    }
                    EventState::Skipped => rep.skipped += 1,
                    EventState::Sent => rep.published_awaiting_consumption += 1,
                    EventState::Claimed => {
                        rep.outcome_unknown += 1;
                        unknown.push((r.seq, r.text(EVENT_ID).to_string()));
                    }
                    EventState::Pending => {
                        rep.not_yet_published += 1;
                        let age = now - r.created_at;
                        rep.oldest_not_published_age_us =
                            Some(rep.oldest_not_published_age_us.map_or(age, |a| a.max(age)));
                    }
                }
            }
        }
        let listed = |mut v: Vec<(i64, String)>| {
            v.sort_unstable();
            v.into_iter()
                .take(req.list_limit)
                .map(|(_, id)| id)
                .collect()
        };
        rep.unknown_ids = listed(unknown);
        rep.quarantined_ids = listed(quarantined);
        rep
    }

    fn status_now(&self) -> OutboxStatus {
        let now = now_micros();
        let mut st = OutboxStatus::default();
        let mut oldest: Option<Micros> = None;
        for slot in 0..SLOT_COUNT as usize {
            let mut g = self.shard(slot);
            let c = g.counts;
            st.pending += c.pending;
            st.claimed += c.claimed;
            st.quarantined += c.quarantined;
            st.blocked_aggregates += c.blocked;
            // rows are in seq (= creation) order: the first open one is the shard's oldest
            let first = g.open_rows().next().map(|r| r.created_at);
            if let Some(t) = first {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        st.oldest_unfinished_age_us = oldest.map(|o| now - o);
        st
    }

    /// Claimed rows of `claim_id`, by seq: a recovery path (a lost claim response), not a hot
    /// one, so it scans the backlog.
    fn lookup_now(&self, claim_id: &str) -> Vec<ClaimedEvent> {
        let mut found = Vec::new();
        for slot in 0..SLOT_COUNT as usize {
            let mut g = self.shard(slot);
            found.extend(
                g.open_rows()
                    .filter(|r| {
                        r.state == EventState::Claimed && r.claim_id.as_deref() == Some(claim_id)
                    })
                    .map(Row::claimed_event),
            );
        }
        found.sort_unstable_by_key(|e| e.token.seq);
        found
    }

    fn quarantined_now(&self, limit: usize) -> Vec<QuarantinedEvent> {
        let mut found: Vec<(i64, QuarantinedEvent)> = Vec::new();
        for slot in 0..SLOT_COUNT as usize {
            let mut g = self.shard(slot);
            let picked: Vec<(i64, QuarantinedEvent, u32)> = g
                .open_rows()
                .filter(|r| r.state == EventState::Quarantined)
                .map(|r| {
                    let q = QuarantinedEvent {
                        event_id: r.text(EVENT_ID).to_string(),
                        aggregate_id: r.text(AGGREGATE_ID).to_string(),
                        aggregate_version: r.aggregate_version,
                        last_error: r.notes.as_ref().and_then(|n| n.last_error.clone()),
                        attempts: r.attempts,
                        blocked_successors: 0,
                    };
                    (r.seq, q, r.agg)
                })
                .collect();
            for (seq, mut q, agg) in picked {
                q.blocked_successors = g.aggs[agg as usize]
                    .open
                    .iter()
                    .filter(|(v, _)| *v > q.aggregate_version)
                    .count() as i64;
                found.push((seq, q));
            }
        }
        found.sort_unstable_by_key(|(s, _)| *s);
        found.into_iter().take(limit).map(|(_, q)| q).collect()
    }
}

impl ferry_core::RowDispatch for MemoryStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(async move { Ok(self.claim_now(req)) })
    }

    /// Never skips: a claim waits for the shard mutexes of its slots instead of passing rows over.
    fn rows_skipped_locked(&self) -> Option<u64> {
        Some(0)
    }

    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(async move { Ok(self.lookup_now(claim_id)) })
    }

    fn ack<'a>(&'a self, tokens: &'a [ClaimToken]) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            Ok(self.cas(
                tokens,
                |t| t,
                |g, p, _, now| {
                    g.rows[p].sent_at = now;
                    g.finish(p, EventState::Sent, now);
                },
            ))
        })
    }

    fn retry<'a>(&'a self, items: &'a [RetryItem]) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            Ok(self.cas(
                items,
                |i| &i.token,
                |g, p, item, now| {
                    g.set_state(p, EventState::Pending);
                    let r = &mut g.rows[p];
                    r.attempts += 1;
                    r.notes().last_error = Some(item.error.clone());
                    r.available_at = now.saturating_add(micros(item.delay));
                    g.replace(p, now);
                },
            ))
        })
    }

    fn quarantine<'a>(
        &'a self,
        items: &'a [(ClaimToken, String)],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            Ok(self.cas(
                items,
                |i| &i.0,
                |g, p, item, now| {
                    g.set_state(p, EventState::Quarantined);
                    let r = &mut g.rows[p];
                    r.attempts += 1;
                    r.notes().last_error = Some(item.1.clone());
                    g.replace(p, now);
                },
            ))
        })
    }

    fn release<'a>(
        &'a self,
        tokens: &'a [ClaimToken],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            Ok(self.cas(
                tokens,
                |t| t,
                |g, p, _, now| {
                    g.set_state(p, EventState::Pending);
                    g.rows[p].available_at = now;
                    g.replace(p, now);
                },
            ))
        })
    }

    fn extend_lease<'a>(
        &'a self,
        req: &'a ferry_core::LeaseExtension<'a>,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        let (tokens, lease) = (req.tokens, req.lease);
        Box::pin(async move {
            Ok(self.cas(
                tokens,
                |t| t,
                |g, p, _, now| {
                    g.rows[p].lease_until = now.saturating_add(micros(lease));
                    g.replace(p, now);
                },
            ))
        })
    }
}

impl ferry_core::SlotOwnership for MemoryStore {
    fn acquire_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<SlotLease>, StoreError>> {
        let (owner, slots, ttl) = (req.owner, req.slots, req.ttl);
        Box::pin(async move {
            let now = now_micros();
            let mut wanted: Vec<SlotId> =
                slots.iter().copied().filter(|s| *s < SLOT_COUNT).collect();
            wanted.sort_unstable();
            wanted.dedup();
            let mut table = self.slots_write();
            let mut granted = Vec::new();
            for s in wanted {
                let l = &mut table.leases[s as usize];
                let mine = l.owner.as_deref() == Some(owner);
                if l.owner.is_none() || mine || l.lease_until <= now {
                    if !mine {
                        l.epoch += 1;
                        l.owner = Some(owner.to_string());
                    }
                    l.lease_until = now.saturating_add(micros(ttl));
                    granted.push(SlotLease {
                        slot: s,
                        owner: owner.to_string(),
                        epoch: l.epoch,
                        lease_until: l.lease_until,
                    });
                }
            }
            Ok(granted)
        })
    }

    fn release_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRelease<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (owner, slots) = (req.owner, req.slots);
        Box::pin(async move {
            let mut table = self.slots_write();
            for s in slots.iter().filter(|s| **s < SLOT_COUNT) {
                let l = &mut table.leases[*s as usize];
                if l.owner.as_deref() == Some(owner) {
                    l.owner = None;
                    l.lease_until = 0;
                }
            }
            Ok(())
        })
    }

    fn heartbeat_member<'a>(
        &'a self,
        req: &'a ferry_core::MemberHeartbeat<'a>,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let (owner, ttl) = (req.owner, req.ttl);
        Box::pin(async move {
            let now = now_micros();
            let mut table = self.slots_write();
            let until = now.saturating_add(micros(ttl));
            match table.members.get_mut(owner) {
                Some((instance, held)) if *instance == req.instance || *held <= now => {
                    (*instance, *held) = (req.instance.to_string(), until);
                }
                Some(_) => return Err(crate::owner_in_use(owner)),
                None => {
                    table
                        .members
                        .insert(owner.to_string(), (req.instance.to_string(), until));
                }
            }
            Ok(table
                .members
                .iter()
                .filter(|(_, (_, until))| *until > now)
                .map(|(m, _)| m.clone())
                .collect())
        })
    }

    fn leave_member<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.slots_write().members.remove(owner);
            Ok(())
        })
    }

    fn slot_leases(&self) -> BoxFuture<'_, Result<Vec<SlotLease>, StoreError>> {
        Box::pin(async move {
            let table = self.slots_read();
            Ok(table
                .leases
                .iter()
                .enumerate()
                .filter_map(|(s, l)| {
                    l.owner.as_ref().map(|o| SlotLease {
                        slot: s as SlotId,
                        owner: o.clone(),
                        epoch: l.epoch,
                        lease_until: l.lease_until,
                    })
                })
                .collect())
        })
    }
}

impl ferry_core::OperatorActions for MemoryStore {
    fn enqueue<'a>(
        &'a self,
        events: &'a [NewEvent],
    ) -> BoxFuture<'a, Result<Vec<String>, EnqueueError>> {
        Box::pin(async move { self.enqueue_now(events) })
    }

    fn requeue<'a>(
        &'a self,
        req: &'a ferry_core::OperatorAction<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (event_id, operator) = (req.event_id, req.operator);
        Box::pin(async move { self.operator(event_id, operator, EventState::Pending) })
    }

    fn skip<'a>(
        &'a self,
        req: &'a ferry_core::OperatorAction<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (event_id, operator) = (req.event_id, req.operator);
        Box::pin(async move { self.operator(event_id, operator, EventState::Skipped) })
    }

    fn list_quarantined(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QuarantinedEvent>, StoreError>> {
        Box::pin(async move { Ok(self.quarantined_now(limit)) })
    }

    fn status(&self) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        Box::pin(async move { Ok(self.status_now()) })
    }

    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>> {
        Box::pin(async move { Ok(self.with_row(event_id, |g, p| g.rows[p].record())) })
    }
}

impl ferry_core::OutboxStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn purge_sent<'a>(
        &'a self,
        req: &'a ferry_core::PurgeRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (older_than, batch, consumer, dry_run) =
            (req.older_than, req.batch, req.consumer, req.dry_run);
        Box::pin(async move {
            if batch == 0 {
                return Err(StoreError::new(
                    StoreErrorKind::InvalidInput,
                    "purge batch size must be at least 1",
                ));
            }
            if consumer.is_some() {
                return Err(no_sql_tables("purge by consumer"));
            }
            Ok(self.purge_now(now_micros().saturating_sub(micros(older_than)), dry_run))
        })
    }

    fn reconcile<'a>(
        &'a self,
        req: &'a ReconcileRequest,
    ) -> BoxFuture<'a, Result<ReconcileReport, StoreError>> {
        Box::pin(async move {
            if req.consumer.is_some() || req.business.is_some() {
                return Err(no_sql_tables(
                    "reconcile with a consumer or a business table",
                ));
            }
            Ok(self.reconcile_now(req))
        })
    }

    fn listen_commits(&self, wake: Waker) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            self.wakers
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .push(wake);
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::store::prelude::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    fn ev(agg: &str, v: i64) -> NewEvent {
        NewEvent::new(agg, v, "t", "T", format!(r#"{{"v":{v}}}"#)).with_id(format!("{agg}-{v}"))
    }

    fn all(limit: usize) -> ClaimRequest {
        ClaimRequest::new((0..SLOT_COUNT).collect(), limit, Duration::from_secs(60))
    }

    fn tokens(c: &[ClaimedEvent]) -> Vec<ClaimToken> {
        c.iter().map(|e| e.token.clone()).collect()
    }

    #[tokio::test]
    async fn seq_addresses_the_slot_and_grows_with_insertion() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 1), ev("b", 1), ev("c", 1)])
            .await
            .unwrap();
        let c = s.claim(&all(10)).await.unwrap();
        let seqs: Vec<i64> = c.iter().map(|e| e.token.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        for e in &c {
            assert_eq!(slot_of(e.token.seq), e.shard_slot as usize);
            assert_eq!(e.shard_slot, ferry_core::slot_for(&e.aggregate_id));
        }
    }

    /// A lower version enqueued after a higher one was claimed blocks the higher one's
    /// takeover, as the SQL `NOT EXISTS (lower unfinished version)` does.
    #[tokio::test]
    async fn out_of_order_versions_follow_the_predecessor_rule() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 2)]).await.unwrap();
        let mut r = all(10);
        r.lease = Duration::from_millis(1);
        let v2 = s.claim(&r).await.unwrap();
        assert_eq!(v2.len(), 1);
        s.enqueue(&[ev("a", 1)]).await.unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let c = s.claim(&all(10)).await.unwrap();
        assert_eq!(c.len(), 1, "only v1; v2's expired lease is blocked by v1");
        assert_eq!(c[0].aggregate_version, 1);
        assert_eq!(s.ack(&tokens(&c)).await.unwrap().applied(), 1);
        let c = s.claim(&all(10)).await.unwrap();
        assert_eq!(c[0].aggregate_version, 2);
        assert_eq!(c[0].token.claim_version, 2);
        // the first claimer's token is stale now
        assert_eq!(s.ack(&tokens(&v2)).await.unwrap().fenced(), 1);
    }

    /// The same token twice in one batch is applied for both (as the SQL backends report it);
    /// a stale token for the same row is fenced even when a live one is in the batch.
    #[tokio::test]
    async fn duplicate_tokens_in_one_batch() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 1)]).await.unwrap();
        let c = s.claim(&all(1)).await.unwrap();
        let t = c[0].token.clone();
        let mut stale = t.clone();
        stale.claim_version -= 1;
        let r = s.ack(&[stale, t.clone(), t]).await.unwrap();
        assert_eq!(
            r.items.iter().map(|(_, r)| *r).collect::<Vec<_>>(),
            vec![CasResult::Fenced, CasResult::Applied, CasResult::Applied]
        );
    }

    #[tokio::test]
    async fn a_refused_batch_writes_nothing() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 1)]).await.unwrap();
        // 100 ids reserved before the duplicate: undoing them touches every DashMap shard,
        // including the one whose entry found the duplicate (a deadlock before it was dropped).
        let mut batch: Vec<NewEvent> = (0..100).map(|i| ev(&format!("b{i}"), 1)).collect();
        batch.push(ev("c", 1).with_id("a-1"));
        let e = s.enqueue(&batch).await.unwrap_err();
        assert_eq!(
            e,
            EnqueueError::DuplicateEventId {
                event_id: "a-1".into()
            }
        );
        assert_eq!(s.len(), 1);
        batch.pop();
        s.enqueue(&batch).await.unwrap();
        assert_eq!(s.len(), 101);
        let e = s.enqueue(&[ev("b7", 1).with_id("new")]).await.unwrap_err();
        assert!(matches!(
            e,
            EnqueueError::DuplicateVersion { version: 1, .. }
        ));
        assert_eq!(s.len(), 101);
    }

    #[tokio::test]
    async fn enqueue_wakes_listeners() {
        let s = MemoryStore::new();
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        assert!(s
            .listen_commits(Arc::new(move || {
                n2.fetch_add(1, Ordering::SeqCst);
            }))
            .await
            .unwrap());
        s.enqueue(&[ev("a", 1)]).await.unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn reconcile_classifies_every_intent_under_the_watermark() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 1), ev("a", 2), ev("b", 1), ev("c", 1)])
            .await
            .unwrap();
        let c = s.claim(&all(10)).await.unwrap(); // a-1, b-1, c-1
        let by = |agg: &str| {
            c.iter()
                .find(|e| e.aggregate_id == agg)
                .unwrap()
                .token
                .clone()
        };
        s.ack(&[by("a")]).await.unwrap();
        s.quarantine(&[(by("c"), "schema".into())]).await.unwrap();
        let late = s.enqueue(&[ev("d", 1)]).await.unwrap();
        let d_seq = s.claim(&all(10)).await.unwrap()[1].token.seq; // a-2 then d-1
        let req = |wm| ReconcileRequest {
            watermark: wm,
            consumer: None,
            business: None,
            list_limit: 10,
        };
        let r = s.reconcile(&req(Watermark::Seq(d_seq - 1))).await.unwrap();
        assert_eq!(
            (
                r.total,
                r.published_awaiting_consumption,
                r.outcome_unknown,
                r.quarantined
            ),
            (4, 1, 2, 1),
            "{r:?}"
        );
        assert!(r.classes_sum_to_total());
        assert_eq!(r.quarantined_ids, vec!["c-1".to_string()]);
        assert!(!r.unknown_ids.contains(&late[0]));
        let mut with_inbox = req(Watermark::Seq(i64::MAX));
        with_inbox.consumer = Some("billing".into());
        let e = s.reconcile(&with_inbox).await.unwrap_err().to_string();
        assert!(e.contains("in-memory store has none"), "{e}");
    }

    /// The status counters are kept incrementally; after any mix of transitions they must
    /// equal a recount of the rows, and claims must still honour the predecessor rule.
    #[tokio::test]
    async fn counters_match_a_recount_after_random_transitions() {
        let s = MemoryStore::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut version = [0i64; 12];
        let mut held: Vec<ClaimToken> = Vec::new();
        for _ in 0..3000 {
            match next() % 8 {
                0 | 1 => {
                    let a = (next() % 12) as usize;
                    version[a] += 1;
                    s.enqueue(&[ev(&format!("g{a}"), version[a])])
                        .await
                        .unwrap();
                }
                2 => {
                    for e in s.claim(&all((next() % 4) as usize)).await.unwrap() {
                        // nothing lower of the aggregate is unfinished
                        for v in 1..e.aggregate_version {
                            let id = format!("{}-{v}", e.aggregate_id);
                            let st = s.record(&id).await.unwrap().unwrap().state;
                            assert!(
                                !is_open(st),
                                "{} claimed before {id} ({st})",
                                e.token.event_id
                            );
                        }
                        held.push(e.token);
                    }
                }
                op if !held.is_empty() => {
                    let t = held.swap_remove((next() as usize) % held.len());
                    match op {
                        3 | 4 => drop(s.ack(&[t]).await.unwrap()),
                        5 => drop(
                            s.retry(&[RetryItem {
                                token: t,
                                delay: Duration::ZERO,
                                error: "x".into(),
                            }])
                            .await
                            .unwrap(),
                        ),
                        6 => drop(s.quarantine(&[(t, "bad".into())]).await.unwrap()),
                        _ => drop(s.release(&[t]).await.unwrap()),
                    }
                }
                _ => {
                    if let Some(q) = s.list_quarantined(1).await.unwrap().pop() {
                        if next() % 2 == 0 {
                            s.requeue(&ferry_core::OperatorAction::new(&q.event_id, "op"))
                                .await
                                .unwrap();
                        } else {
                            s.skip(&ferry_core::OperatorAction::new(&q.event_id, "op"))
                                .await
                                .unwrap();
                        }
                    }
                }
            }
            let st = s.status().await.unwrap();
            let recs = s.records();
            let n = |want: EventState| recs.iter().filter(|r| r.state == want).count() as i64;
            assert_eq!(
                (st.pending, st.claimed, st.quarantined),
                (
                    n(EventState::Pending),
                    n(EventState::Claimed),
                    n(EventState::Quarantined)
                )
            );
            let blocked: std::collections::HashSet<&str> = recs
                .iter()
                .filter(|r| r.state == EventState::Quarantined)
                .map(|r| r.event_id.split('-').next().unwrap_or(""))
                .collect();
            assert_eq!(st.blocked_aggregates, blocked.len() as i64);
            assert_eq!(
                st.oldest_unfinished_age_us.is_some(),
                recs.iter().any(|r| is_open(r.state))
            );
        }
    }

    #[tokio::test]
    async fn purge_drops_only_old_sent_rows_and_forgets_their_keys() {
        let s = MemoryStore::new();
        s.enqueue(&[ev("a", 1), ev("a", 2), ev("b", 1)])
            .await
            .unwrap();
        let c = s.claim(&all(10)).await.unwrap();
        assert_eq!(c.len(), 2);
        s.ack(&tokens(&c[..1])).await.unwrap();
        let purge = |dry_run| ferry_core::PurgeRequest {
            older_than: Duration::ZERO,
            batch: 1,
            consumer: None,
            dry_run,
            vacuum: false,
        };
        assert_eq!(s.purge_sent(&purge(true)).await.unwrap(), 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s.purge_sent(&purge(false)).await.unwrap(), 1);
        assert_eq!(s.len(), 2);
        assert!(s
            .purge_sent(&ferry_core::PurgeRequest {
                older_than: Duration::ZERO,
                batch: 1,
                consumer: Some("billing"),
                dry_run: false,
                vacuum: false,
            })
            .await
            .is_err());
        assert!(s.record(&c[0].token.event_id).await.unwrap().is_none());
        let st = s.status().await.unwrap();
        assert_eq!((st.pending, st.claimed), (1, 1));
        let rest = s.claim(&all(10)).await.unwrap();
        assert_eq!(rest.len(), 1);
    }
}
