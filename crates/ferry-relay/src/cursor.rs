//! The cursor-dispatch worker.
//!
//! Per worker: read committed intents of its slots past in-memory positions (no write) → send the
//! batch → route each item's outcome → advance the slots' durable cursors with one fenced
//! compare-and-set, writing exception rows for items that were not acked in the same
//! transaction. Up to `max_in_flight` batches are in flight; their advances run strictly in read
//! order, one at a time, while the worker reads and sends on. Ordering rules
//! (docs/architecture.md, "Why several versions per batch cannot reorder"):
//! * an aggregate is busy from the read that takes it until its items in that batch are all
//!   acked, or, if one was not, until the batch's advance committed its exception rows; a read
//!   is cut, per slot, before the first event of a busy aggregate, so a later batch never sends
//!   a version whose predecessor may still fail;
//! * within a batch, the hold rule ([`crate::route`]) stops an aggregate at its first item that
//!   was not acked; the rest become held exceptions, resent after it;
//! * events whose aggregate has an open exception are not sent by the cursor path at all: they
//!   become held exceptions, sent by the exception path in version order.
//!
//! A fenced or failed advance resets the worker: it waits for its other sends, forgets its
//! in-memory positions and reloads the durable cursors. Everything after them is read and sent
//! again (same event ids): duplicates the consumer's Inbox absorbs, never a loss.
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{
    new_event_id, now_micros, slots_for_worker, AdvanceResult, ClaimRequest, CursorAdvance,
    CursorEvent, CursorPos, CursorRead, CursorStore, ExceptionKind, ExceptionOutcomes,
    NewException, Outcome, RetryItem, SlotAdvance, SlotCursor, SlotFence, SlotId, StoreErrorKind,
    SLOT_COUNT,
};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::order_watch::{self, OrderWatch};
use crate::route::{route, Decision, RouteItem};

/// A slot whose durable cursor lags its read position is advanced at least this often, even
/// when none of its events is in a batch (keeps a takeover's re-read short).
const IDLE_ADVANCE: Duration = Duration::from_secs(1);

/// A read must return at least this many events (short of a full batch) before the worker
/// lingers ([`linger`]): below it the database is not busy enough for a read's fixed cost to
/// matter, and latency wins.
const LINGER_MIN_EVENTS: usize = 16;

/// How long a worker that reads `own` of the [`SLOT_COUNT`] slots waits after a partial read
/// before it reads again: `read_linger` for each other reader of the database
/// (`SLOT_COUNT / own − 1`, the other workers and relays that split the slots), at most
/// `poll_idle`. One reader never lingers. Every reader pays a read's fixed cost (its
/// statements, planning, a sink request) on every read, so readers that each woke on every
/// commit notification would multiply that cost by their number; lingering keeps the reads of
/// the whole database about as few, and as large, as one reader's.
fn linger(read_linger: Duration, poll_idle: Duration, own: usize) -> Duration {
    let readers = (SLOT_COUNT as usize + own / 2) / own.max(1);
    read_linger
        .saturating_mul(readers.saturating_sub(1) as u32)
        .min(poll_idle)
}

/// When a worker that reads `own` slots may read again after a partial read (of at least
/// [`LINGER_MIN_EVENTS`]) that started at `started` and returned at `now`: [`linger`] after
/// it returned, and no sooner than `read_interval` after it started (both at most
/// `poll_idle`). `None`: at once.
fn next_read(
    cfg: &crate::config::RelayConfig,
    own: usize,
    started: Instant,
    now: Instant,
) -> Option<Instant> {
    let linger = linger(cfg.read_linger, cfg.poll_idle, own);
    let at = (now + linger).max(started + cfg.read_interval.min(cfg.poll_idle));
    (at > now).then_some(at)
}

struct Batch {
    gen: u64,
    events: Vec<CursorEvent>,
    /// New positions of the slots this batch advances.
    to: Vec<(SlotId, CursorPos)>,
    send: Option<Send>,
    /// Aggregates already freed for later reads because every item of theirs in this batch
    /// was acked ([`release_acked`]); the rest stay busy until the advance commits.
    released: Option<HashSet<String>>,
}

/// A batch's send task. It stores its outcomes *before* it notifies the worker, so a worker
/// woken by the notification always finds them (`JoinHandle::is_finished` may still be false
/// for a moment after the task's last statement: waiting on it lost wake-ups).
struct Send {
    task: JoinHandle<()>,
    outcomes: Arc<std::sync::Mutex<Option<Vec<Outcome>>>>,
}

impl Batch {
    fn is_done(&self) -> bool {
        self.send.as_ref().is_none_or(|s| {
            s.outcomes.lock().map(|o| o.is_some()).unwrap_or(true) || s.task.is_finished()
        })
    }
}

impl Advancing {
    fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire) || self.task.is_finished()
    }
}

impl Send {
    /// The outcomes, waiting for the task if needed (a panicked send yields none: every item
    /// then counts as unknown).
    async fn outcomes(self) -> Vec<Outcome> {
        let _ = self.task.await;
        self.outcomes
            .lock()
            .ok()
            .and_then(|mut o| o.take())
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct State {
    gen: u64,
    slots: Vec<SlotId>,
    cursors: HashMap<SlotId, SlotCursor>,
    read_pos: HashMap<SlotId, CursorPos>,
    last_advance: HashMap<SlotId, Instant>,
    /// Busy aggregates: events in batches not yet advanced, less those freed when their send
    /// finished with every item acked ([`release_acked`]).
    busy: HashMap<String, usize>,
    /// Slots whose last read was cut at a busy aggregate, with that aggregate: left out of
    /// reads while it is still busy (the slot cannot get past it, and its lagging position
    /// would make every read re-walk the rows the other slots have passed).
    stalled: HashMap<SlotId, String>,
    /// No read before this instant ([`linger`]); completions are still handled meanwhile.
    read_not_before: Option<Instant>,
    queue: VecDeque<Batch>,
    /// The advance of the batch before `queue`'s front, running while the worker reads and
    /// sends on. At most one: the next advance is built after this one's result is applied
    /// (it needs the cursor versions this one sets, and must not run if this one fails).
    advancing: Option<Advancing>,
    /// What this worker handed to the sink, per aggregate (the order net, checked in each send
    /// task and on the exception path): cleared by [`reset`], rewound to an aggregate's lowest
    /// exception row when an advance writes them ([`complete_front`]).
    watch: Arc<std::sync::Mutex<OrderWatch>>,
}

/// An advance in flight and what applying its result needs.
struct Advancing {
    gen: u64,
    task: JoinHandle<Option<AdvanceResult>>,
    finished: Arc<AtomicBool>,
    slots: Vec<SlotAdvance>,
    /// The batches it settles (one, or several that were ready at once).
    batches: Vec<Routed>,
}

impl State {
    /// Frees the aggregates of `events`, except those in `released` (freed earlier).
    fn unbusy_except(&mut self, events: &[CursorEvent], released: Option<&HashSet<String>>) {
        for e in events {
            if released.is_some_and(|r| r.contains(&e.event.aggregate_id)) {
                continue;
            }
            if let Some(n) = self.busy.get_mut(&e.event.aggregate_id) {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(&e.event.aggregate_id);
                }
            }
        }
    }
}

pub(crate) async fn worker(
    ctx: Arc<Ctx>,
    w: usize,
    mut slots_rx: watch::Receiver<Vec<SlotId>>,
    cancel: CancellationToken,
) {
    let Some(cs) = ctx.store.cursor() else {
        tracing::error!("cursor dispatch needs a store with cursor support");
        return;
    };
    let cfg = &ctx.config;
    let done = Arc::new(Notify::new());
    let mut st = State::default();
    let mut delay = cfg.poll_min;
    let mut next_exceptions = Instant::now();
    let mut store_backoff = Duration::from_millis(50);
    let mut must_load = true;
    loop {
        release_acked(&mut st);
        // Complete what is ready without waiting: a sent batch once the advance before it is
        // done, and a finished advance.
        loop {
            let advance_done = st.advancing.as_ref().is_none_or(Advancing::is_finished);
            let ok = if advance_done && st.queue.front().is_some_and(Batch::is_done) {
                complete_front(&ctx, &mut st, &done).await
            } else if advance_done && st.advancing.is_some() {
                finish_advance(&ctx, &mut st).await
            } else {
                break;
            };
            if !ok {
                // later batches read past the failed one: none of them may advance
                reset(&mut st).await;
                must_load = true;
                next_exceptions = Instant::now();
            }
        }
        if cancel.is_cancelled() {
            break;
        }
        if must_load || slots_rx.has_changed().unwrap_or(false) {
            // drain what is in flight, then (re)load the durable cursors of the new slot set
            drain(&ctx, &mut st, &done).await;
            reset(&mut st).await;
            let want = slots_for_worker(&slots_rx.borrow_and_update(), w, cfg.workers);
            match cs.load_cursors(&cfg.owner, &want).await {
                Ok(cursors) => {
                    must_load = false;
                    store_backoff = Duration::from_millis(50);
                    st.slots = cursors.iter().map(|c| c.slot).collect();
                    for c in cursors {
                        st.read_pos.insert(c.slot, c.pos);
                        st.last_advance.insert(c.slot, Instant::now());
                        st.cursors.insert(c.slot, c);
                    }
                }
                Err(e) => {
                    ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(worker = w, error = %e, "loading cursors failed");
                    sleep_or_cancel(store_backoff, &cancel).await;
                    store_backoff = (store_backoff * 2).min(Duration::from_secs(5));
                }
            }
            continue;
        }
        if st.slots.is_empty() {
            tokio::select! {
                _ = slots_rx.changed() => { must_load = true; }
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(cfg.poll_idle) => { must_load = true; }
            }
            continue;
        }
        if Instant::now() >= next_exceptions {
            next_exceptions = run_exceptions(&ctx, cs, &st.slots, &st.watch).await;
        }
        if st.queue.len() >= cfg.max_in_flight {
            // the oldest batch must be advanced first anyway: wait for it
            if !complete_front(&ctx, &mut st, &done).await {
                reset(&mut st).await;
                must_load = true;
                next_exceptions = Instant::now();
            }
            continue;
        }
        if let Some(at) = st.read_not_before.filter(|at| *at > Instant::now()) {
            // lingering after a partial read: complete what finishes, read at `at`
            tokio::select! {
                _ = done.notified(), if !st.queue.is_empty() || st.advancing.is_some() => {}
                _ = cancel.cancelled() => {}
                _ = slots_rx.changed() => { must_load = true; }
                _ = tokio::time::sleep_until(at.into()) => { st.read_not_before = None; }
            }
            continue;
        }
        // read past the in-memory positions, leaving out slots still stalled at a busy aggregate
        let busy = &st.busy;
        st.stalled.retain(|_, agg| busy.contains_key(agg));
        let from: Vec<(SlotId, CursorPos)> = st
            .slots
            .iter()
            .filter(|s| !st.stalled.contains_key(s))
            .map(|s| (*s, st.read_pos[s]))
            .collect();
        if from.is_empty() {
            // every slot waits for a batch in flight: wait for a completion
            must_load |=
                wait_for_completion(&st, &done, &cancel, &mut slots_rx, cfg.poll_min).await;
            continue;
        }
        let read: HashSet<SlotId> = from.iter().map(|(s, _)| *s).collect();
        let commits_seen = ctx.commits.load(Ordering::Acquire);
        let t0 = Instant::now();
        let mut batch = match cs
            .read_batch(&CursorRead {
                from,
                limit: cfg.batch_size,
            })
            .await
        {
            Ok(b) => {
                store_backoff = Duration::from_millis(50);
                b
            }
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = w, error = %e, "cursor read failed");
                sleep_or_cancel(store_backoff, &cancel).await;
                store_backoff = (store_backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        ctx.metrics.claim_latency.record(t0.elapsed());
        ctx.metrics.claims.fetch_add(1, Ordering::Relaxed);
        let more = batch.more;
        // more rows now (a full read, or slots far behind whose range has not reached the
        // horizon): no linger, no pause before the next read
        let full = batch.events.len() >= cfg.batch_size || more;
        // Per slot, cut before the first event whose aggregate is still in flight: the rest of
        // that slot's events in this read are dropped (read again from the slot's position);
        // the other slots go on. slot → its last accepted position before the cut, if any.
        let mut accepted = Vec::with_capacity(batch.events.len());
        let mut cut: HashMap<SlotId, Option<CursorPos>> = HashMap::new();
        let mut last: HashMap<SlotId, CursorPos> = HashMap::new();
        let events = std::mem::take(&mut batch.events);
        let upto = |s: &SlotId| batch.upto_of(*s);
        for e in events {
            let slot = e.event.shard_slot;
            if cut.contains_key(&slot) {
                continue;
            }
            if st.busy.contains_key(&e.event.aggregate_id) {
                cut.insert(slot, last.get(&slot).copied());
                st.stalled.insert(slot, e.event.aggregate_id.clone());
                continue;
            }
            last.insert(slot, e.pos);
            accepted.push(e);
        }
        let now = Instant::now();
        let mut to = Vec::new();
        let mut moved = false;
        for s in &st.slots {
            let p = st
                .read_pos
                .get_mut(s)
                .expect("read position of an owned slot");
            let target = match cut.get(s) {
                Some(before_cut) => *before_cut,
                // a slot left out of this read keeps its position
                None if !read.contains(s) => None,
                None => Some(upto(s)),
            };
            if let Some(t) = target.filter(|t| *t > *p) {
                *p = t;
                moved = true;
            }
            let durable = st.cursors[s].pos;
            let stale = now.duration_since(st.last_advance[s]) >= IDLE_ADVANCE;
            if *p > durable && (last.contains_key(s) || stale) {
                to.push((*s, *p));
                st.last_advance.insert(*s, now);
            }
        }
        if accepted.is_empty() && moved && more {
            // nothing to send here but the read moved on (rows of other slots, or rows already
            // sent before a reload): read on at once
            queue_cursor_move(&mut st, to);
            continue;
        }
        if accepted.is_empty() {
            ctx.metrics.empty_claims.fetch_add(1, Ordering::Relaxed);
            queue_cursor_move(&mut st, to);
            if !cut.is_empty() {
                // Not idle: what comes next waits for a batch in flight (its send or its
                // advance frees the aggregate). Wait for a completion, not the idle back-off.
                must_load |=
                    wait_for_completion(&st, &done, &cancel, &mut slots_rx, cfg.poll_min).await;
                continue;
            }
            if ctx.commits.load(Ordering::Acquire) != commits_seen {
                // a commit was notified while this read ran: read again at once
                delay = cfg.poll_min;
                continue;
            }
            tokio::select! {
                _ = ctx.wake.notified() => {}
                _ = done.notified(), if !st.queue.is_empty() || st.advancing.is_some() => {}
                _ = cancel.cancelled() => {}
                _ = slots_rx.changed() => { must_load = true; }
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(cfg.poll_idle);
            continue;
        }
        delay = cfg.poll_min;
        for e in &accepted {
            *st.busy.entry(e.event.aggregate_id.clone()).or_default() += 1;
        }
        let to_send: Vec<_> = accepted
            .iter()
            .filter(|e| !e.held)
            .map(|e| e.event.clone())
            .collect();
        ctx.metrics
            .claimed_items
            .fetch_add(to_send.len() as u64, Ordering::Relaxed);
        ctx.metrics.batch_size.record_us(accepted.len() as u64);
        let send = (!to_send.is_empty()).then(|| {
            let sink = ctx.sink.clone();
            let metrics = ctx.metrics.clone();
            let watch = st.watch.clone();
            let done = done.clone();
            let outcomes = Arc::new(std::sync::Mutex::new(None));
            let slot = outcomes.clone();
            let task = tokio::spawn(async move {
                ferry_core::failpoint::hit("relay-after-claim");
                metrics.note_misrouted(&to_send);
                order_watch::check_send(&watch, &metrics, &to_send);
                let t = Instant::now();
                let out = sink.send_batch(&to_send).await;
                metrics.send_latency.record(t.elapsed());
                if let Ok(mut s) = slot.lock() {
                    *s = Some(out);
                }
                done.notify_one();
            });
            Send { task, outcomes }
        });
        let accepted_len = accepted.len();
        st.queue.push_back(Batch {
            gen: st.gen,
            events: accepted,
            to,
            send,
            released: None,
        });
        let not_before = (!full && cut.is_empty() && accepted_len >= LINGER_MIN_EVENTS)
            .then(|| next_read(cfg, st.slots.len(), t0, Instant::now()))
            .flatten();
        if not_before.is_some() {
            st.read_not_before = not_before;
        } else if !full && cut.is_empty() {
            // drained for now: give producers a moment so the next read is fuller
            tokio::select! {
                _ = ctx.wake.notified() => {}
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(cfg.poll_min) => {}
            }
        }
    }
    // Shutdown: advance what finishes before the deadline; the rest is re-read by the next owner.
    let deadline = Instant::now() + cfg.shutdown_timeout;
    while let Some(front) = st.queue.front() {
        if !front.is_done() {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                tracing::warn!(
                    worker = w,
                    batches = st.queue.len(),
                    "shutdown deadline reached with batches in flight; they will be re-read and resent"
                );
                break;
            }
            tokio::select! {
                _ = done.notified() => {}
                _ = tokio::time::sleep(wait.min(Duration::from_millis(50))) => {}
            }
            continue;
        }
        if !complete_front(&ctx, &mut st, &done).await {
            break;
        }
    }
    // the last advance, if it is still running
    finish_advance(&ctx, &mut st).await;
}

/// Completes every queued batch and the advance in flight (stops at a failed advance: the
/// caller's reset discards the rest).
async fn drain(ctx: &Arc<Ctx>, st: &mut State, done: &Arc<Notify>) {
    while !st.queue.is_empty() {
        if !complete_front(ctx, st, done).await {
            return;
        }
    }
    finish_advance(ctx, st).await;
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = cancel.cancelled() => {}
    }
}

/// Queues an advance with nothing to send (the read moved past rows of no interest), so the
/// cursors follow the read in order behind the batches still in flight.
fn queue_cursor_move(st: &mut State, to: Vec<(SlotId, CursorPos)>) {
    if !to.is_empty() {
        st.queue.push_back(Batch {
            gen: st.gen,
            events: Vec::new(),
            to,
            send: None,
            released: None,
        });
    }
}

/// Waits for a batch in flight to complete (its send or its advance), at most `poll_min`;
/// returns whether the owned slots changed meanwhile.
async fn wait_for_completion(
    st: &State,
    done: &Notify,
    cancel: &CancellationToken,
    slots_rx: &mut watch::Receiver<Vec<SlotId>>,
    poll_min: Duration,
) -> bool {
    tokio::select! {
        _ = done.notified(), if !st.queue.is_empty() || st.advancing.is_some() => false,
        _ = cancel.cancelled() => false,
        _ = slots_rx.changed() => true,
        _ = tokio::time::sleep(poll_min) => false,
    }
}

/// Forgets every in-memory position: waits for the sends still in flight (their results are
/// ignored; the events will be read and sent again) and clears the state, the order net's
/// memory included (everything past the durable cursors is resent: not a regression).
async fn reset(st: &mut State) {
    st.gen += 1;
    if let Some(a) = st.advancing.take() {
        // its result no longer matters: the cursors are reloaded from the store
        let _ = a.task.await;
    }
    for b in st.queue.drain(..) {
        if let Some(send) = b.send {
            let _ = send.task.await;
        }
    }
    st.busy.clear();
    st.stalled.clear();
    st.read_not_before = None;
    st.cursors.clear();
    st.read_pos.clear();
    st.last_advance.clear();
    st.slots.clear();
    // after the sends above: none of them is checked against the cleared memory
    order_watch::lock(&st.watch).clear();
}

/// Frees, for later reads, the aggregates of finished sends whose items were all acked: the
/// broker has them, so a later version may go out before this batch's advance commits. An
/// aggregate with any item not acked (or held) stays busy until the advance has written its
/// exception rows, which later reads see (they flag its successors as held).
fn release_acked(st: &mut State) {
    let mut freed = Vec::new();
    for b in st.queue.iter_mut().filter(|b| b.released.is_none()) {
        let Some(send) = &b.send else { continue };
        let Some(outcomes) = send.outcomes.lock().ok().and_then(|o| o.clone()) else {
            continue;
        };
        let mut acked: HashMap<&str, bool> = HashMap::new();
        let mut sent = b.events.iter().filter(|e| !e.held).zip(&outcomes);
        for e in &b.events {
            let ok = !e.held
                && sent
                    .next()
                    .is_some_and(|(_, o)| matches!(o, Outcome::Acked));
            *acked.entry(e.event.aggregate_id.as_str()).or_insert(true) &= ok;
        }
        let released: HashSet<String> = acked
            .into_iter()
            .filter(|(_, ok)| *ok)
            .map(|(a, _)| a.to_string())
            .collect();
        freed.extend(
            b.events
                .iter()
                .filter(|e| released.contains(&e.event.aggregate_id))
                .map(|e| e.event.aggregate_id.clone()),
        );
        b.released = Some(released);
    }
    for a in freed {
        if let Some(n) = st.busy.get_mut(&a) {
            *n -= 1;
            if *n == 0 {
                st.busy.remove(&a);
            }
        }
    }
}

/// One batch's outcomes, routed: what its advance writes and what applying it records.
struct Routed {
    events: Vec<CursorEvent>,
    released: Option<HashSet<String>>,
    to: Vec<(SlotId, CursorPos)>,
    exceptions: Vec<NewException>,
    acked_created: Vec<i64>,
    retried: u64,
    quarantined: u64,
    unknown: u64,
}

/// Waits for a batch's sends and routes each item's outcome.
async fn route_batch(ctx: &Ctx, b: Batch) -> Routed {
    let outcomes = match b.send {
        Some(send) => send.outcomes().await,
        None => Vec::new(),
    };
    let items: Vec<RouteItem<'_>> = b
        .events
        .iter()
        .map(|e| RouteItem {
            aggregate_id: &e.event.aggregate_id,
            attempts: e.event.attempts,
            held: e.held,
        })
        .collect();
    let sent = b.events.iter().filter(|e| !e.held).count();
    if outcomes.len() != sent {
        tracing::error!(
            items = sent,
            outcomes = outcomes.len(),
            "the sink answered a different number of outcomes than items; missing ones count as unknown"
        );
    }
    let decisions = route(&items, outcomes, &ctx.policy(true));
    let mut r = Routed {
        events: Vec::new(),
        released: b.released,
        to: b.to,
        exceptions: Vec::new(),
        acked_created: Vec::new(),
        retried: 0,
        quarantined: 0,
        unknown: 0,
    };
    for (e, d) in b.events.iter().zip(decisions) {
        let ev = &e.event;
        let (kind, attempts) = match d {
            Decision::Ack => {
                r.acked_created.push(ev.created_at);
                continue;
            }
            Decision::Retry { delay, error } => {
                r.retried += 1;
                (ExceptionKind::Retry { delay, error }, ev.attempts + 1)
            }
            Decision::Quarantine(why) => {
                r.quarantined += 1;
                tracing::warn!(event_id = %ev.token.event_id, reason = %why, "quarantining event; its aggregate's successors are held until an operator acts");
                (ExceptionKind::Quarantine(why), ev.attempts + 1)
            }
            Decision::Unknown(err) => {
                r.unknown += 1;
                (ExceptionKind::Unknown(err), ev.attempts)
            }
            Decision::Held { acked } => {
                if acked {
                    ctx.metrics
                        .acked_after_failed_predecessor
                        .fetch_add(1, Ordering::Relaxed);
                }
                (ExceptionKind::Held, ev.attempts)
            }
        };
        r.exceptions.push(NewException {
            seq: ev.token.seq,
            slot: ev.shard_slot,
            aggregate_id: ev.aggregate_id.clone(),
            aggregate_version: ev.aggregate_version,
            attempts,
            kind,
        });
    }
    r.events = b.events;
    r
}

/// Completes the oldest batch: waits for its sends and routes the outcomes, applies the
/// previous advance, then starts one advance for this batch and every batch behind it whose
/// sends have finished too (group commit: their slots move to the latest position, their
/// exception rows go in the same transaction). The advance runs while the worker reads and
/// sends on; [`finish_advance`] applies it. Returns false when an advance was fenced or failed
/// (the caller resets and reloads the cursors).
async fn complete_front(ctx: &Arc<Ctx>, st: &mut State, done: &Arc<Notify>) -> bool {
    let Some(b) = st.queue.pop_front() else {
        return finish_advance(ctx, st).await;
    };
    let gen = b.gen;
    let first = route_batch(ctx, b).await;
    if gen != st.gen {
        st.unbusy_except(&first.events, first.released.as_ref());
        return true;
    }
    // The previous advance first: this one expects the cursor versions it sets, and must not
    // run at all if it failed.
    if !finish_advance(ctx, st).await {
        st.unbusy_except(&first.events, first.released.as_ref());
        return false;
    }
    let mut batches = vec![first];
    while st
        .queue
        .front()
        .is_some_and(|f| f.gen == st.gen && f.is_done())
    {
        let b = st.queue.pop_front().expect("front exists");
        batches.push(route_batch(ctx, b).await);
    }
    if batches.iter().any(|b| !b.acked_created.is_empty()) {
        ferry_core::failpoint::hit("relay-after-ack");
    }
    // per slot the position of the latest batch (positions only grow in read order)
    let mut to: Vec<(SlotId, CursorPos)> = Vec::new();
    for (slot, pos) in batches.iter().flat_map(|b| b.to.iter().copied()) {
        match to.iter_mut().find(|(s, _)| *s == slot) {
            Some(t) => t.1 = t.1.max(pos),
            None => to.push((slot, pos)),
        }
    }
    let adv = CursorAdvance {
        owner: ctx.config.owner.clone(),
        claim_id: new_event_id(),
        slots: to
            .iter()
            .filter_map(|(s, p)| {
                st.cursors.get(s).map(|c| SlotAdvance {
                    slot: *s,
                    epoch: c.epoch,
                    version: c.version,
                    to: *p,
                })
            })
            .collect(),
        exceptions: batches
            .iter_mut()
            .flat_map(|b| std::mem::take(&mut b.exceptions))
            .collect(),
    };
    // The exception path will resend these aggregates from their lowest exception row on: not
    // a regression. Rewound before the advance can commit (and the exception path claim the
    // rows); if it does not, the reset clears everything anyway.
    {
        let mut watch = order_watch::lock(&st.watch);
        for x in &adv.exceptions {
            watch.rewind(&x.aggregate_id, x.aggregate_version);
        }
    }
    let slots = adv.slots.clone();
    let finished = Arc::new(AtomicBool::new(false));
    let task = {
        let (ctx, finished, done) = (ctx.clone(), finished.clone(), done.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let result = match ctx.store.cursor() {
                Some(cs) => advance(&ctx, cs, &adv).await,
                None => None,
            };
            ctx.metrics.ack_latency.record(t.elapsed());
            finished.store(true, Ordering::Release);
            done.notify_one();
            result
        })
    };
    st.advancing = Some(Advancing {
        gen: st.gen,
        task,
        finished,
        slots,
        batches,
    });
    true
}

/// Waits for the advance in flight, if any, and applies its result: the cursors and metrics on
/// success; false when it was fenced or failed.
async fn finish_advance(ctx: &Ctx, st: &mut State) -> bool {
    let Some(a) = st.advancing.take() else {
        return true;
    };
    // a panicked advance task counts as a failed advance
    let result = a.task.await.ok().flatten();
    for b in &a.batches {
        st.unbusy_except(&b.events, b.released.as_ref());
    }
    if a.gen != st.gen {
        return true;
    }
    let events: usize = a.batches.iter().map(|b| b.events.len()).sum();
    match result {
        Some(AdvanceResult::Applied) => {
            for s in &a.slots {
                if let Some(c) = st.cursors.get_mut(&s.slot) {
                    c.version += 1;
                    c.pos = s.to;
                }
            }
            let m = &ctx.metrics;
            let now = now_micros();
            for b in &a.batches {
                m.record_commit_to_ack(b.acked_created.iter().map(|c| (now - c).max(1) as u64));
                m.sent
                    .fetch_add(b.acked_created.len() as u64, Ordering::Relaxed);
                m.retried.fetch_add(b.retried, Ordering::Relaxed);
                m.quarantined.fetch_add(b.quarantined, Ordering::Relaxed);
                m.unknown.fetch_add(b.unknown, Ordering::Relaxed);
            }
            true
        }
        Some(AdvanceResult::Fenced) => {
            ctx.metrics
                .fenced
                .fetch_add(events.max(1) as u64, Ordering::Relaxed);
            tracing::info!(
                events,
                "cursor advance fenced: a slot changed hands; re-reading from the durable cursors"
            );
            false
        }
        None => false,
    }
}

/// One advance, retried on store errors (except `InvalidInput`, which gives up at once) for up
/// to the claim lease; a lost commit response is resolved with [`CursorStore::lookup_advance`].
async fn advance(ctx: &Ctx, cs: &dyn CursorStore, adv: &CursorAdvance) -> Option<AdvanceResult> {
    let deadline = Instant::now() + ctx.config.claim_lease;
    let mut backoff = Duration::from_millis(20);
    loop {
        match cs.advance(adv).await {
            Ok(r) => return Some(r),
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                // The commit may have happened: the advance's id says.
                if matches!(cs.lookup_advance(&adv.claim_id).await, Ok(true)) {
                    tracing::info!(claim_id = %adv.claim_id, "recovered an advance whose commit response was lost");
                    return Some(AdvanceResult::Applied);
                }
                if Instant::now() > deadline || e.kind() == StoreErrorKind::InvalidInput {
                    tracing::error!(error = %e, "giving up on a cursor advance; the batch will be re-read and resent");
                    return None;
                }
                tracing::warn!(error = %e, "cursor advance failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The exception path: claims due exception rows of `slots` (per-row protocol, predecessor rule),
/// sends them (checked against the worker's order `watch`), settles them. Returns when to look
/// again.
async fn run_exceptions(
    ctx: &Ctx,
    cs: &dyn CursorStore,
    slots: &[SlotId],
    watch: &std::sync::Mutex<OrderWatch>,
) -> Instant {
    let cfg = &ctx.config;
    let idle = Instant::now() + cfg.poll_idle;
    let mut req = ClaimRequest::new(slots.to_vec(), cfg.batch_size, cfg.claim_lease);
    req.fence = Some(SlotFence {
        owner: cfg.owner.clone(),
    });
    let items = match cs.claim_exceptions(&req).await {
        Ok(v) => v,
        Err(e) => {
            ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "claiming exceptions failed");
            return idle;
        }
    };
    if items.is_empty() {
        return idle;
    }
    ctx.metrics
        .claimed_items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    ctx.metrics.note_misrouted(&items);
    order_watch::check_send(watch, &ctx.metrics, &items);
    let outcomes = ctx.sink.send_batch(&items).await;
    let route_items: Vec<RouteItem<'_>> = items
        .iter()
        .map(|e| RouteItem {
            aggregate_id: &e.aggregate_id,
            attempts: e.attempts,
            held: false,
        })
        .collect();
    let mut out = ExceptionOutcomes::default();
    let mut acked_created = Vec::new();
    for (e, d) in items
        .iter()
        .zip(route(&route_items, outcomes, &ctx.policy(false)))
    {
        match d {
            Decision::Ack => {
                out.acked.push(e.token.clone());
                acked_created.push(e.created_at);
            }
            Decision::Retry { delay, error } => out.retry.push(RetryItem {
                token: e.token.clone(),
                delay,
                error,
            }),
            Decision::Quarantine(why) => {
                tracing::warn!(event_id = %e.token.event_id, reason = %why, "quarantining event; its aggregate's successors are held until an operator acts");
                out.quarantine.push((e.token.clone(), why))
            }
            Decision::Unknown(_) | Decision::Held { .. } => out.release.push(e.token.clone()),
        }
    }
    let deadline = Instant::now() + cfg.claim_lease;
    let mut backoff = Duration::from_millis(20);
    let report = loop {
        match cs.settle_exceptions(&out).await {
            Ok(r) => break Some(r),
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                if Instant::now() > deadline {
                    tracing::error!(error = %e, "giving up on exception outcomes; their lease will expire and they be resent");
                    break None;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    };
    if let Some(r) = report {
        let m = &ctx.metrics;
        let applied = |range: std::ops::Range<usize>| {
            r.items[range]
                .iter()
                .filter(|(_, x)| *x == ferry_core::CasResult::Applied)
                .count() as u64
        };
        let (a, rt, q) = (out.acked.len(), out.retry.len(), out.quarantine.len());
        let now = now_micros();
        m.record_commit_to_ack(
            r.items[..a]
                .iter()
                .zip(&acked_created)
                .filter(|((_, x), _)| *x == ferry_core::CasResult::Applied)
                .map(|(_, c)| (now - c).max(1) as u64),
        );
        m.sent.fetch_add(applied(0..a), Ordering::Relaxed);
        m.retried.fetch_add(applied(a..a + rt), Ordering::Relaxed);
        m.quarantined
            .fetch_add(applied(a + rt..a + rt + q), Ordering::Relaxed);
        m.unknown
            .fetch_add(out.release.len() as u64, Ordering::Relaxed);
        m.fenced.fetch_add(r.fenced() as u64, Ordering::Relaxed);
    }
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linger_grows_with_the_other_readers_and_stops_at_poll_idle() {
        let ms = Duration::from_millis;
        let idle = ms(500);
        // one reader (every slot): never waits
        assert_eq!(linger(ms(15), idle, 256), Duration::ZERO);
        // 8 relays of ~32 slots each (rendezvous hashing gives 25–40): 7 others
        assert_eq!(linger(ms(15), idle, 32), ms(105));
        assert_eq!(linger(ms(15), idle, 37), ms(90));
        // two readers
        assert_eq!(linger(ms(15), idle, 128), ms(15));
        // capped at poll_idle; turned off with 0
        assert_eq!(linger(ms(15), idle, 1), idle);
        assert_eq!(linger(Duration::ZERO, idle, 32), Duration::ZERO);
        // a worker without slots (never reads) does not divide by zero
        assert_eq!(linger(ms(15), idle, 0), idle);
    }

    #[test]
    fn next_read_waits_out_the_linger_and_the_interval_since_the_read_began() {
        let ms = Duration::from_millis;
        let cfg = |linger, interval| crate::config::RelayConfig {
            read_linger: ms(linger),
            read_interval: ms(interval),
            poll_idle: ms(500),
            ..crate::config::RelayConfig::default()
        };
        let started = Instant::now();
        let now = started + ms(5);
        // one reader, no interval: at once
        assert_eq!(next_read(&cfg(25, 0), 256, started, now), None);
        // one reader, 25 ms interval, a 5 ms read: 20 ms more
        assert_eq!(
            next_read(&cfg(25, 25), 256, started, now),
            Some(started + ms(25))
        );
        // a read slower than the interval: at once
        assert_eq!(
            next_read(&cfg(25, 25), 256, started, started + ms(30)),
            None
        );
        // two readers: the linger after the read (25 ms) outlasts the interval
        assert_eq!(
            next_read(&cfg(25, 25), 128, started, now),
            Some(now + ms(25))
        );
        // the interval is capped at poll_idle too
        assert_eq!(
            next_read(&cfg(0, 10_000), 256, started, now),
            Some(started + ms(500))
        );
    }
}
