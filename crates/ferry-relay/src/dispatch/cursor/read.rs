//! The read step's rules, as pure functions over values: where a read is cut so that no later
//! batch overtakes a version that may still fail ([`cut_at_busy_aggregates`]), how far each
//! slot's read position and durable cursor then move ([`move_read_positions`]), and when the
//! next read may start ([`next_read`]).
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ferry_core::{CursorBatch, CursorEvent, CursorPos, SlotId, SLOT_COUNT};

use crate::config::RelayConfig;
use crate::dispatch::cursor::state::State;

/// A slot whose durable cursor lags its read position is advanced at least this often, even
/// when none of its events is in a batch (keeps a takeover's re-read short).
pub(super) const IDLE_ADVANCE: Duration = Duration::from_secs(1);

/// A read must return at least this many events (short of a full batch) before the worker
/// lingers ([`linger`]): below it the database is not busy enough for a read's fixed cost to
/// matter, and latency wins.
pub(super) const LINGER_MIN_EVENTS: usize = 16;

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
pub(super) fn next_read(
    cfg: &RelayConfig,
    own: usize,
    started: Instant,
    now: Instant,
) -> Option<Instant> {
    let linger = linger(cfg.read_linger, cfg.poll_idle, own);
    let at = (now + linger).max(started + cfg.read_interval.min(cfg.poll_idle));
    (at > now).then_some(at)
}

/// A read cut per slot before the first event whose aggregate is busy (in a batch whose send
/// may still fail or whose exception rows are not written yet).
pub(super) struct Cut {
    /// The events before each slot's cut, in read order.
    pub(super) accepted: Vec<CursorEvent>,
    /// Slots cut at a busy aggregate → the position of their last accepted event before the
    /// cut, if any. The rest of such a slot's events in this read are dropped (read again from
    /// the slot's position); the other slots go on.
    pub(super) cut: HashMap<SlotId, Option<CursorPos>>,
    /// Slot → the position of its last accepted event.
    pub(super) last: HashMap<SlotId, CursorPos>,
    /// Each cut slot with the busy aggregate it stalls at.
    pub(super) stalled: Vec<(SlotId, String)>,
}

/// Cuts `events` (one read, in dispatch order) per slot before the first event whose aggregate
/// is in `busy`.
pub(super) fn cut_at_busy_aggregates(
    events: Vec<CursorEvent>,
    busy: &HashMap<String, usize>,
) -> Cut {
    let mut accepted = Vec::with_capacity(events.len());
    let mut cut: HashMap<SlotId, Option<CursorPos>> = HashMap::new();
    let mut last: HashMap<SlotId, CursorPos> = HashMap::new();
    let mut stalled = Vec::new();
    for e in events {
        let slot = e.event.shard_slot;
        if cut.contains_key(&slot) {
            continue;
        }
        if busy.contains_key(&e.event.aggregate_id) {
            cut.insert(slot, last.get(&slot).copied());
            stalled.push((slot, e.event.aggregate_id.clone()));
            continue;
        }
        last.insert(slot, e.pos);
        accepted.push(e);
    }
    Cut {
        accepted,
        cut,
        last,
        stalled,
    }
}

/// Moves each owned slot's read position past what `batch` read of it (up to its cut, if it was
/// cut; a slot left out of the read, not in `read`, keeps its position), and picks the slots
/// whose durable cursor the batch advances: those with an accepted event, and those whose
/// cursor lags and was last advanced [`IDLE_ADVANCE`] ago or more. Returns those slots' new
/// positions, and whether any read position moved.
pub(super) fn move_read_positions(
    st: &mut State,
    read: &HashSet<SlotId>,
    batch: &CursorBatch,
    cut: &Cut,
    now: Instant,
) -> (Vec<(SlotId, CursorPos)>, bool) {
    let mut to = Vec::new();
    let mut moved = false;
    for s in &st.slots {
        let p = st
            .read_pos
            .get_mut(s)
            .expect("read position of an owned slot");
        let target = match cut.cut.get(s) {
            Some(before_cut) => *before_cut,
            // a slot left out of this read keeps its position
            None if !read.contains(s) => None,
            None => Some(batch.upto_of(*s)),
        };
        if let Some(t) = target.filter(|t| *t > *p) {
            *p = t;
            moved = true;
        }
        let durable = st.cursors[s].pos;
        let stale = now.duration_since(st.last_advance[s]) >= IDLE_ADVANCE;
        if *p > durable && (cut.last.contains_key(s) || stale) {
            to.push((*s, *p));
            st.last_advance.insert(*s, now);
        }
    }
    (to, moved)
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
        let cfg = |linger, interval| RelayConfig {
            read_linger: ms(linger),
            read_interval: ms(interval),
            poll_idle: ms(500),
            ..RelayConfig::default()
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
