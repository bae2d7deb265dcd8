//! The cursor worker's loop. Each turn takes the first step that applies, in this order:
//! release the aggregates of all-acked sends → complete what is ready (advances, in read order)
//! → stop on cancel → (re)load the durable cursors → wait for slots → run the exception path
//! when due → wait for the oldest batch when `max_in_flight` are queued → linger → read → cut
//! the read at busy aggregates and move the read positions → send → pause. A failed or fenced
//! advance resets the worker to the durable cursors.
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{
    slots_for_worker, CursorBatch, CursorEvent, CursorPos, CursorRead, CursorStore, SlotId,
    StoreError,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::dispatch::cursor::advance::{complete_front, finish_advance};
use crate::dispatch::cursor::exceptions::run_exceptions;
use crate::dispatch::cursor::paused::Paused;
use crate::dispatch::cursor::read::{
    cut_at_busy_aggregates, move_read_positions, next_read, LINGER_MIN_EVENTS,
};
use crate::dispatch::cursor::send::start_send;
use crate::dispatch::cursor::state::{release_acked, reset, Advancing, Batch, State};

/// One cursor-dispatch shard worker: reads, sends and advances its slots until `cancel`, then
/// advances what finishes before `shutdown_timeout`.
pub(crate) async fn worker(
    ctx: Arc<Ctx>,
    w: usize,
    slots_rx: watch::Receiver<Vec<SlotId>>,
    cancel: CancellationToken,
) {
    let Some(cs) = ctx.store.cursor() else {
        tracing::error!("cursor dispatch needs a store with cursor support");
        return;
    };
    let mut wk = Worker {
        ctx: &ctx,
        cs,
        w,
        slots_rx,
        cancel,
        done: Arc::new(Notify::new()),
        st: State::default(),
        delay: ctx.config.poll_min,
        next_exceptions: Instant::now(),
        store_backoff: Duration::from_millis(50),
        must_load: true,
        paused: Paused::default(),
    };
    loop {
        wk.release_acked();
        wk.complete_ready().await;
        if wk.cancel.is_cancelled() {
            break;
        }
        if wk.must_load || wk.slots_changed() {
            wk.load_cursors().await;
            continue;
        }
        if wk.st.slots.is_empty() {
            wk.wait_for_slots().await;
            continue;
        }
        wk.run_exceptions_when_due().await;
        if wk.queue_is_full() {
            wk.complete_oldest().await;
            continue;
        }
        if let Some(at) = wk.lingering() {
            wk.linger_until(at).await;
            continue;
        }
        let Some(read) = wk.read().await else {
            continue;
        };
        let batch = wk.cut_at_busy_aggregates(read);
        if batch.accepted.is_empty() {
            wk.nothing_to_send(batch).await;
            continue;
        }
        let pause = wk.send(batch);
        wk.pause_after_read(pause).await;
    }
    wk.shutdown().await;
}

/// One worker's loop state.
struct Worker<'a> {
    ctx: &'a Arc<Ctx>,
    cs: &'a dyn CursorStore,
    w: usize,
    slots_rx: watch::Receiver<Vec<SlotId>>,
    cancel: CancellationToken,
    /// Notified when a send stores its outcomes or an advance finishes.
    done: Arc<Notify>,
    st: State,
    /// The idle poll delay: `poll_min`, doubling up to `poll_idle` while reads come back empty.
    delay: Duration,
    next_exceptions: Instant,
    store_backoff: Duration,
    /// The durable cursors must be (re)loaded before the next read.
    must_load: bool,
    /// The paused topics, read again every `poll_idle`.
    paused: Paused,
}

/// A read, with what the steps after it need.
struct Read {
    batch: CursorBatch,
    /// The slots it read (the owned ones less the stalled ones).
    slots: HashSet<SlotId>,
    /// Commit notifications seen when it began.
    commits_seen: u64,
    started: Instant,
}

/// A read cut at busy aggregates, its read positions moved.
struct Accepted {
    /// The events to send (or to record as held), in read order.
    accepted: Vec<CursorEvent>,
    /// The slots whose durable cursor the batch advances, and to where.
    to: Vec<(SlotId, CursorPos)>,
    /// Some read position moved.
    moved: bool,
    /// More rows now: the read stopped at its limit.
    more: bool,
    /// A full read, or `more`: no linger, no pause before the next read.
    full: bool,
    /// Some slot was cut at a busy aggregate.
    cut: bool,
    commits_seen: u64,
    started: Instant,
}

/// What [`Worker::pause_after_read`] needs of a batch just sent.
struct Pause {
    full: bool,
    cut: bool,
    events: usize,
    started: Instant,
}

impl Worker<'_> {
    /// Frees the aggregates of finished sends whose items were all acked ([`release_acked`]).
    fn release_acked(&mut self) {
        release_acked(&mut self.st);
    }

    /// Completes what is ready without waiting: a sent batch once the advance before it is
    /// done, and a finished advance.
    async fn complete_ready(&mut self) {
        loop {
            let advance_done = self
                .st
                .advancing
                .as_ref()
                .is_none_or(Advancing::is_finished);
            let ok = if advance_done && self.st.queue.front().is_some_and(Batch::is_done) {
                complete_front(self.ctx, &mut self.st, &self.done).await
            } else if advance_done && self.st.advancing.is_some() {
                finish_advance(self.ctx, &mut self.st).await
            } else {
                break;
            };
            if !ok {
                // later batches read past the failed one: none of them may advance
                self.reset().await;
            }
        }
    }

    /// After a fenced or failed advance: forgets the in-memory positions, reloads the durable
    /// cursors next and runs the exception path at once.
    async fn reset(&mut self) {
        reset(&mut self.st).await;
        self.must_load = true;
        self.next_exceptions = Instant::now();
    }

    fn slots_changed(&self) -> bool {
        self.slots_rx.has_changed().unwrap_or(false)
    }

    /// Drains what is in flight, then (re)loads the durable cursors of the new slot set.
    async fn load_cursors(&mut self) {
        let cfg = &self.ctx.config;
        drain(self.ctx, &mut self.st, &self.done).await;
        reset(&mut self.st).await;
        let want = slots_for_worker(&self.slots_rx.borrow_and_update(), self.w, cfg.workers);
        match self.cs.load_cursors(&cfg.owner, &want).await {
            Ok(cursors) => {
                self.must_load = false;
                self.store_backoff = Duration::from_millis(50);
                self.st.slots = cursors.iter().map(|c| c.slot).collect();
                for c in cursors {
                    self.st.read_pos.insert(c.slot, c.pos);
                    self.st.last_advance.insert(c.slot, Instant::now());
                    self.st.cursors.insert(c.slot, c);
                }
            }
            Err(e) => {
                self.back_off("loading cursors", &e).await;
            }
        }
    }

    /// A failed store call (`what` names it in the log): counted, logged, and the next attempt
    /// waits the store back-off, which doubles from 50 ms to 5 s (reset by a success).
    async fn back_off(&mut self, what: &str, e: &StoreError) {
        self.ctx
            .metrics
            .store_errors
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(worker = self.w, error = %e, "{what} failed");
        sleep_or_cancel(self.store_backoff, &self.cancel).await;
        self.store_backoff = (self.store_backoff * 2).min(Duration::from_secs(5));
    }

    /// No slot owned: waits for the slot set to change (or `poll_idle`), then reloads.
    async fn wait_for_slots(&mut self) {
        tokio::select! {
            _ = self.slots_rx.changed() => { self.must_load = true; }
            _ = self.cancel.cancelled() => {}
            _ = tokio::time::sleep(self.ctx.config.poll_idle) => { self.must_load = true; }
        }
    }

    /// Runs the exception path when it is due (at once after a reset, else when it last found
    /// work or `poll_idle` after it found none).
    async fn run_exceptions_when_due(&mut self) {
        if Instant::now() >= self.next_exceptions {
            self.next_exceptions =
                run_exceptions(self.ctx, self.cs, &self.st.slots, &self.st.watch).await;
        }
    }

    fn queue_is_full(&self) -> bool {
        self.st.queue.len() >= self.ctx.config.max_in_flight
    }

    /// The oldest batch must be advanced first anyway: waits for it.
    async fn complete_oldest(&mut self) {
        if !complete_front(self.ctx, &mut self.st, &self.done).await {
            self.reset().await;
        }
    }

    /// When the worker lingers after a partial read: the instant it may read again.
    fn lingering(&self) -> Option<Instant> {
        self.st.read_not_before.filter(|at| *at > Instant::now())
    }

    /// Lingering after a partial read: completes what finishes, reads at `at`.
    async fn linger_until(&mut self, at: Instant) {
        tokio::select! {
            _ = self.done.notified(), if !self.st.queue.is_empty() || self.st.advancing.is_some() => {}
            _ = self.cancel.cancelled() => {}
            _ = self.slots_rx.changed() => { self.must_load = true; }
            _ = tokio::time::sleep_until(at.into()) => { self.st.read_not_before = None; }
        }
    }

    /// Reads past the in-memory positions, leaving out slots still stalled at a busy
    /// aggregate. `None`: nothing was read (every slot waits for a batch in flight, or the read
    /// failed); the loop starts over.
    async fn read(&mut self) -> Option<Read> {
        let busy = &self.st.busy;
        self.st.stalled.retain(|_, agg| busy.contains_key(agg));
        let from: Vec<(SlotId, CursorPos)> = self
            .st
            .slots
            .iter()
            .filter(|s| !self.st.stalled.contains_key(s))
            .map(|s| (*s, self.st.read_pos[s]))
            .collect();
        if from.is_empty() {
            // every slot waits for a batch in flight: wait for a completion
            self.wait_for_completion().await;
            return None;
        }
        let slots: HashSet<SlotId> = from.iter().map(|(s, _)| *s).collect();
        self.paused
            .refresh(self.ctx.store.as_ref(), self.ctx.config.poll_idle)
            .await;
        let commits_seen = self.ctx.commits.load(Ordering::Acquire);
        let started = Instant::now();
        let batch = match self
            .cs
            .read_batch(&CursorRead {
                from,
                limit: self.ctx.config.batch_size,
            })
            .await
        {
            Ok(mut b) => {
                self.store_backoff = Duration::from_millis(50);
                self.paused.hold(&mut b.events);
                b
            }
            Err(e) => {
                self.back_off("cursor read", &e).await;
                return None;
            }
        };
        self.ctx.metrics.claim_latency.record(started.elapsed());
        self.ctx.metrics.claims.fetch_add(1, Ordering::Relaxed);
        Some(Read {
            batch,
            slots,
            commits_seen,
            started,
        })
    }

    /// The order check: cuts the read per slot before the first event whose aggregate is still
    /// in flight (those slots stall until it is not), then moves the read positions and picks
    /// the cursors the batch advances.
    fn cut_at_busy_aggregates(&mut self, mut read: Read) -> Accepted {
        let more = read.batch.more;
        // more rows now (a full read, or slots far behind whose range has not reached the
        // horizon): no linger, no pause before the next read
        let full = read.batch.events.len() >= self.ctx.config.batch_size || more;
        let events = std::mem::take(&mut read.batch.events);
        let cut = cut_at_busy_aggregates(events, &self.st.busy);
        self.st.stalled.extend(cut.stalled.iter().cloned());
        let (to, moved) =
            move_read_positions(&mut self.st, &read.slots, &read.batch, &cut, Instant::now());
        Accepted {
            accepted: cut.accepted,
            to,
            moved,
            more,
            full,
            cut: !cut.cut.is_empty(),
            commits_seen: read.commits_seen,
            started: read.started,
        }
    }

    /// A read with nothing to send: queues the cursor move behind the batches in flight, then
    /// reads on at once (more rows), waits for a completion (a slot was cut), or polls idly.
    async fn nothing_to_send(&mut self, a: Accepted) {
        if a.moved && a.more {
            // nothing to send here but the read moved on (rows of other slots, or rows already
            // sent before a reload): read on at once
            self.queue_cursor_move(a.to);
            return;
        }
        let cfg = &self.ctx.config;
        self.ctx
            .metrics
            .empty_claims
            .fetch_add(1, Ordering::Relaxed);
        self.queue_cursor_move(a.to);
        if a.cut {
            // Not idle: what comes next waits for a batch in flight (its send or its
            // advance frees the aggregate). Wait for a completion, not the idle back-off.
            self.wait_for_completion().await;
            return;
        }
        if self.ctx.commits.load(Ordering::Acquire) != a.commits_seen {
            // a commit was notified while this read ran: read again at once
            self.delay = cfg.poll_min;
            return;
        }
        tokio::select! {
            _ = self.ctx.wake.notified() => {}
            _ = self.done.notified(), if !self.st.queue.is_empty() || self.st.advancing.is_some() => {}
            _ = self.cancel.cancelled() => {}
            _ = self.slots_rx.changed() => { self.must_load = true; }
            _ = tokio::time::sleep(self.delay) => {}
        }
        self.delay = (self.delay * 2).min(cfg.poll_idle);
    }

    /// Marks the batch's aggregates busy, starts sending its events that are not held and
    /// queues the batch for its advance.
    fn send(&mut self, a: Accepted) -> Pause {
        self.delay = self.ctx.config.poll_min;
        for e in &a.accepted {
            *self
                .st
                .busy
                .entry(e.event.aggregate_id.clone())
                .or_default() += 1;
        }
        let to_send: Vec<_> = a
            .accepted
            .iter()
            .filter(|e| !e.held)
            .map(|e| e.event.clone())
            .collect();
        self.ctx
            .metrics
            .claimed_items
            .fetch_add(to_send.len() as u64, Ordering::Relaxed);
        self.ctx
            .metrics
            .batch_size
            .record_us(a.accepted.len() as u64);
        let send = (!to_send.is_empty())
            .then(|| start_send(self.ctx, &self.st.watch, &self.done, to_send));
        let events = a.accepted.len();
        self.st.queue.push_back(Batch {
            gen: self.st.gen,
            events: a.accepted,
            to: a.to,
            send,
            released: None,
        });
        Pause {
            full: a.full,
            cut: a.cut,
            events,
            started: a.started,
        }
    }

    /// After a partial read: lingers (no read before [`next_read`]) after one of
    /// [`LINGER_MIN_EVENTS`] or more, else gives producers a moment so the next read is fuller.
    async fn pause_after_read(&mut self, p: Pause) {
        let cfg = &self.ctx.config;
        let not_before = (!p.full && !p.cut && p.events >= LINGER_MIN_EVENTS)
            .then(|| next_read(cfg, self.st.slots.len(), p.started, Instant::now()))
            .flatten();
        if not_before.is_some() {
            self.st.read_not_before = not_before;
        } else if !p.full && !p.cut {
            // drained for now: give producers a moment so the next read is fuller
            tokio::select! {
                _ = self.ctx.wake.notified() => {}
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(cfg.poll_min) => {}
            }
        }
    }

    /// Queues an advance with nothing to send (the read moved past rows of no interest), so the
    /// cursors follow the read in order behind the batches still in flight.
    fn queue_cursor_move(&mut self, to: Vec<(SlotId, CursorPos)>) {
        if !to.is_empty() {
            self.st.queue.push_back(Batch {
                gen: self.st.gen,
                events: Vec::new(),
                to,
                send: None,
                released: None,
            });
        }
    }

    /// Waits for a batch in flight to complete (its send or its advance), at most `poll_min`;
    /// the owned slots changing meanwhile makes the worker reload them.
    async fn wait_for_completion(&mut self) {
        tokio::select! {
            _ = self.done.notified(), if !self.st.queue.is_empty() || self.st.advancing.is_some() => {}
            _ = self.cancel.cancelled() => {}
            _ = self.slots_rx.changed() => { self.must_load = true; }
            _ = tokio::time::sleep(self.ctx.config.poll_min) => {}
        }
    }

    /// Shutdown: advances what finishes before the deadline; the rest is re-read by the next
    /// owner.
    async fn shutdown(mut self) {
        let deadline = Instant::now() + self.ctx.config.shutdown_timeout;
        while let Some(front) = self.st.queue.front() {
            if !front.is_done() {
                let wait = deadline.saturating_duration_since(Instant::now());
                if wait.is_zero() {
                    tracing::warn!(
                        worker = self.w,
                        batches = self.st.queue.len(),
                        "shutdown deadline reached with batches in flight; they will be re-read and resent"
                    );
                    break;
                }
                tokio::select! {
                    _ = self.done.notified() => {}
                    _ = tokio::time::sleep(wait.min(Duration::from_millis(50))) => {}
                }
                continue;
            }
            if !complete_front(self.ctx, &mut self.st, &self.done).await {
                break;
            }
        }
        // the last advance, if it is still running
        finish_advance(self.ctx, &mut self.st).await;
    }
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
