//! What a cursor worker keeps in memory: the slots it owns with their durable cursors and read
//! positions, the busy aggregates, the batches in read order and the advance in flight.
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_core::{
    AdvanceResult, CursorEvent, CursorPos, NewException, Outcome, SlotAdvance, SlotCursor, SlotId,
};
use tokio::task::JoinHandle;

use crate::dispatch::cursor::send::Send;
use crate::order_watch::{self, OrderWatch};

/// A batch read and handed to the sink, waiting for its advance.
pub(super) struct Batch {
    pub(super) gen: u64,
    pub(super) events: Vec<CursorEvent>,
    /// New positions of the slots this batch advances.
    pub(super) to: Vec<(SlotId, CursorPos)>,
    pub(super) send: Option<Send>,
    /// Aggregates already freed for later reads because every item of theirs in this batch
    /// was acked ([`release_acked`]); the rest stay busy until the advance commits.
    pub(super) released: Option<HashSet<String>>,
}

impl Batch {
    pub(super) fn is_done(&self) -> bool {
        self.send.as_ref().is_none_or(|s| {
            s.outcomes.lock().map(|o| o.is_some()).unwrap_or(true) || s.task.is_finished()
        })
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) gen: u64,
    pub(super) slots: Vec<SlotId>,
    pub(super) cursors: HashMap<SlotId, SlotCursor>,
    pub(super) read_pos: HashMap<SlotId, CursorPos>,
    pub(super) last_advance: HashMap<SlotId, Instant>,
    /// Busy aggregates: events in batches not yet advanced, less those freed when their send
    /// finished with every item acked ([`release_acked`]).
    pub(super) busy: HashMap<String, usize>,
    /// Slots whose last read was cut at a busy aggregate, with that aggregate: left out of
    /// reads while it is still busy (the slot cannot get past it, and its lagging position
    /// would make every read re-walk the rows the other slots have passed).
    pub(super) stalled: HashMap<SlotId, String>,
    /// No read before this instant (the read linger); completions are still handled meanwhile.
    pub(super) read_not_before: Option<Instant>,
    pub(super) queue: VecDeque<Batch>,
    /// The advance of the batch before `queue`'s front, running while the worker reads and
    /// sends on. At most one: the next advance is built after this one's result is applied
    /// (it needs the cursor versions this one sets, and must not run if this one fails).
    pub(super) advancing: Option<Advancing>,
    /// What this worker handed to the sink, per aggregate (the order net, checked in each send
    /// task and on the exception path): cleared by [`reset`], rewound to an aggregate's lowest
    /// exception row when an advance writes them (`complete_front`).
    pub(super) watch: Arc<Mutex<OrderWatch>>,
}

/// An advance in flight and what applying its result needs.
pub(super) struct Advancing {
    pub(super) gen: u64,
    pub(super) task: JoinHandle<Option<AdvanceResult>>,
    pub(super) finished: Arc<AtomicBool>,
    pub(super) slots: Vec<SlotAdvance>,
    /// The batches it settles (one, or several that were ready at once).
    pub(super) batches: Vec<Routed>,
}

impl Advancing {
    pub(super) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire) || self.task.is_finished()
    }
}

/// One batch's outcomes, routed: what its advance writes and what applying it records.
pub(super) struct Routed {
    pub(super) events: Vec<CursorEvent>,
    pub(super) released: Option<HashSet<String>>,
    pub(super) to: Vec<(SlotId, CursorPos)>,
    pub(super) exceptions: Vec<NewException>,
    pub(super) acked_created: Vec<i64>,
    pub(super) retried: u64,
    pub(super) quarantined: u64,
    pub(super) unknown: u64,
}

impl State {
    /// Frees the aggregates of `events`, except those in `released` (freed earlier).
    pub(super) fn unbusy_except(
        &mut self,
        events: &[CursorEvent],
        released: Option<&HashSet<String>>,
    ) {
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

/// Forgets every in-memory position: waits for the sends still in flight (their results are
/// ignored; the events will be read and sent again) and clears the state, the order net's
/// memory included (everything past the durable cursors is resent: not a regression).
pub(super) async fn reset(st: &mut State) {
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
pub(super) fn release_acked(st: &mut State) {
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
