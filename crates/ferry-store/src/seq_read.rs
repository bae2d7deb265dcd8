//! The read planner of the seq-ordered cursor backends (SQLite, MariaDB): a cursor read cut into
//! at most two range statements, so that a slot far behind does not hold the others back.
use std::future::Future;

use ferry_core::{SlotId, StoreError};

/// A seq-ordered cursor read (SQLite, MySQL/MariaDB: positions are `seq` alone) cut into at
/// most two statements. Most reads have every slot at one position, and one statement reads
/// them all from it. A slot more than `limit` positions behind the leading one (held back
/// behind an aggregate in flight while the others went on) would make that statement start at
/// its position and fill the limit with rows the others passed, read after read, while the
/// others wait; it is read in a range of its own instead, of at most [`LAG_SPAN`] limits'
/// worth of positions and half the limit, and the others go on from their own positions.
pub(crate) struct SeqRead {
    from: std::collections::HashMap<SlotId, i64>,
    limit: usize,
    lagging: Vec<SlotId>,
    rest: Vec<SlotId>,
}

/// How many limits' worth of positions a lagging slots' range spans at most.
const LAG_SPAN: i64 = 2;

/// One statement of a [`SeqRead`]: the rows of `slots` with `lo < seq <= hi`, in `seq` order,
/// at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqRange {
    pub(crate) slots: Vec<SlotId>,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
    pub(crate) limit: usize,
}

impl SeqRange {
    /// Whether the statement can return anything (else it is not run).
    pub(crate) fn runs(&self) -> bool {
        self.hi > self.lo && self.limit > 0
    }
}

/// What one [`SeqRange`] statement returned: how many rows and the last row's `seq`.
pub(crate) struct RangeRows {
    pub(crate) rows: usize,
    pub(crate) last: Option<i64>,
}

impl RangeRows {
    /// How far the statement read its slots: to its last row when it returned `limit` rows
    /// (more may follow), else to the end of its range.
    fn upto(&self, r: &SeqRange) -> ferry_core::CursorPos {
        let seq = if self.full(r) {
            self.last.unwrap_or(r.lo)
        } else {
            r.hi.max(r.lo)
        };
        ferry_core::CursorPos::new(0, seq)
    }
    fn full(&self, r: &SeqRange) -> bool {
        self.rows >= r.limit
    }
}

/// Where a [`SeqRead`] runs its statements: one backend's read of a [`SeqRange`], returning its
/// rows in `seq` order as events, each with whether an open exception holds its aggregate.
pub(crate) trait SeqRanges {
    fn read_range(
        &mut self,
        r: &SeqRange,
    ) -> impl Future<Output = Result<Vec<(ferry_core::ClaimedEvent, bool)>, StoreError>> + Send;
}

impl SeqRead {
    /// Runs the read on `src` up to `horizon`: the lagging slots' statement first (if any slot
    /// lags), then the others'. Returns the batch, and whether the others' statement came back
    /// short of its limit (it caught up with the horizon).
    pub(crate) async fn run<R: SeqRanges>(
        &self,
        src: &mut R,
        horizon: i64,
    ) -> Result<(ferry_core::CursorBatch, bool), StoreError> {
        let mut events = Vec::new();
        let lagging = match self.lagging(horizon) {
            Some(r) => {
                let rows = self.take(src, &r, &mut events).await?;
                Some((r, rows))
            }
            None => None,
        };
        let rest = self.rest(horizon, events.len());
        let rows = self.take(src, &rest, &mut events).await?;
        let short = rows.rows < rest.limit;
        let batch = self.finish(
            lagging.as_ref().map(|(r, n)| (r, n)),
            (&rest, &rows),
            events,
            horizon,
        );
        Ok((batch, short))
    }

    /// Runs one statement (unless it can return nothing), appending the rows it wants to
    /// `events`.
    async fn take<R: SeqRanges>(
        &self,
        src: &mut R,
        r: &SeqRange,
        events: &mut Vec<ferry_core::CursorEvent>,
    ) -> Result<RangeRows, StoreError> {
        if !r.runs() {
            return Ok(RangeRows {
                rows: 0,
                last: None,
            });
        }
        let rows = src.read_range(r).await?;
        let read = RangeRows {
            rows: rows.len(),
            last: rows.last().map(|(e, _)| e.token.seq),
        };
        events.extend(
            rows.into_iter()
                .filter(|(e, _)| self.wanted(e.shard_slot, e.token.seq))
                .map(|(event, held)| ferry_core::CursorEvent {
                    pos: ferry_core::CursorPos::new(0, event.token.seq),
                    held,
                    event,
                }),
        );
        Ok(read)
    }

    /// `None` for a read of no slot.
    pub(crate) fn new(req: &ferry_core::CursorRead) -> Option<Self> {
        let lead = req.from.iter().map(|(_, p)| p.seq).max()?;
        let from: std::collections::HashMap<SlotId, i64> =
            req.from.iter().map(|(s, p)| (*s, p.seq)).collect();
        let gap = i64::try_from(req.limit).unwrap_or(i64::MAX);
        let (lagging, rest) = from
            .iter()
            .map(|(s, p)| (*s, *p))
            .partition::<Vec<_>, _>(|(_, p)| req.limit >= 2 && p.saturating_add(gap) < lead);
        Some(Self {
            limit: req.limit,
            lagging: lagging.into_iter().map(|(s, _)| s).collect(),
            rest: rest.into_iter().map(|(s, _)| s).collect(),
            from,
        })
    }

    fn low(&self, slots: &[SlotId]) -> i64 {
        slots.iter().map(|s| self.from[s]).min().unwrap_or(0)
    }

    /// The lagging slots' statement, run first, if any slot lags.
    pub(crate) fn lagging(&self, horizon: i64) -> Option<SeqRange> {
        if self.lagging.is_empty() {
            return None;
        }
        let lo = self.low(&self.lagging);
        let span = LAG_SPAN.saturating_mul(i64::try_from(self.limit).unwrap_or(i64::MAX));
        Some(SeqRange {
            slots: self.lagging.clone(),
            lo,
            hi: horizon.min(lo.saturating_add(span)),
            limit: self.limit / 2,
        })
    }

    /// The other slots' statement, after the lagging slots' one returned `taken` rows.
    pub(crate) fn rest(&self, horizon: i64, taken: usize) -> SeqRange {
        SeqRange {
            slots: self.rest.clone(),
            lo: self.low(&self.rest),
            hi: horizon,
            limit: self.limit.saturating_sub(taken),
        }
    }

    /// Whether a row of `slot` at `seq` is past that slot's position (rows of a slot that
    /// another slot's lower position brought into a statement are dropped).
    pub(crate) fn wanted(&self, slot: SlotId, seq: i64) -> bool {
        self.from.get(&slot).is_some_and(|p| seq > *p)
    }

    /// The batch: `events` (wanted rows of both statements) in `seq` order, how far each slot
    /// was read, and whether more rows may follow right now.
    pub(crate) fn finish(
        &self,
        lagging: Option<(&SeqRange, &RangeRows)>,
        rest: (&SeqRange, &RangeRows),
        mut events: Vec<ferry_core::CursorEvent>,
        horizon: i64,
    ) -> ferry_core::CursorBatch {
        events.sort_by_key(|e| e.pos);
        let (r, rows) = rest;
        let mut more = rows.full(r);
        let mut slot_upto = Vec::new();
        if let Some((l, lrows)) = lagging {
            more |= lrows.full(l) || l.hi < horizon;
            let upto = lrows.upto(l);
            slot_upto = l.slots.iter().map(|s| (*s, upto)).collect();
        }
        ferry_core::CursorBatch {
            events,
            upto: rows.upto(r),
            more,
            slot_upto,
        }
    }
}

#[cfg(test)]
mod seq_read_tests {
    use super::*;
    use ferry_core::{CursorPos, CursorRead};

    fn read(from: &[(SlotId, i64)], limit: usize) -> SeqRead {
        SeqRead::new(&CursorRead {
            from: from
                .iter()
                .map(|(s, p)| (*s, CursorPos::new(0, *p)))
                .collect(),
            limit,
        })
        .unwrap()
    }

    #[test]
    fn slots_near_one_position_are_one_statement() {
        let r = read(&[(1, 100), (2, 95), (3, 100)], 10);
        assert_eq!(r.lagging(500), None);
        let rest = r.rest(500, 0);
        assert_eq!((rest.lo, rest.hi, rest.limit), (95, 500, 10));
        let mut slots = rest.slots.clone();
        slots.sort();
        assert_eq!(slots, vec![1, 2, 3]);
        // not full: read to the horizon; full: to the last row
        let b = r.finish(
            None,
            (
                &rest,
                &RangeRows {
                    rows: 3,
                    last: Some(120),
                },
            ),
            vec![],
            500,
        );
        assert_eq!((b.upto.seq, b.more, b.slot_upto.len()), (500, false, 0));
        let b = r.finish(
            None,
            (
                &rest,
                &RangeRows {
                    rows: 10,
                    last: Some(120),
                },
            ),
            vec![],
            500,
        );
        assert_eq!((b.upto.seq, b.more), (120, true));
    }

    #[test]
    fn a_slot_far_behind_gets_a_bounded_range_of_its_own() {
        let r = read(&[(1, 1000), (2, 10), (3, 1000)], 100);
        let lag = r.lagging(5000).unwrap();
        assert_eq!(
            (lag.slots.clone(), lag.lo, lag.hi, lag.limit),
            (vec![2], 10, 210, 50)
        );
        let rest = r.rest(5000, 7);
        assert_eq!((rest.lo, rest.hi, rest.limit), (1000, 5000, 93));
        // the lagging slot moves to the end of its range, the others to the horizon
        let b = r.finish(
            Some((
                &lag,
                &RangeRows {
                    rows: 7,
                    last: Some(150),
                },
            )),
            (
                &rest,
                &RangeRows {
                    rows: 3,
                    last: Some(1200),
                },
            ),
            vec![],
            5000,
        );
        assert_eq!(b.upto.seq, 5000);
        assert_eq!(b.upto_of(2).seq, 210);
        assert_eq!(b.upto_of(1).seq, 5000);
        assert!(b.more, "the lagging slot has more behind the horizon");
        // its range reaching the horizon and not full: nothing more right now
        let lag = r.lagging(200).unwrap();
        assert_eq!(lag.hi, 200);
        let rest = r.rest(200, 0);
        assert!(!rest.runs(), "the others are at or past the horizon");
        let b = r.finish(
            Some((
                &lag,
                &RangeRows {
                    rows: 0,
                    last: None,
                },
            )),
            (
                &rest,
                &RangeRows {
                    rows: 0,
                    last: None,
                },
            ),
            vec![],
            200,
        );
        assert_eq!(
            (b.upto_of(2).seq, b.upto_of(1).seq, b.more),
            (200, 1000, false)
        );
    }

    #[test]
    fn rows_at_or_below_their_slot_position_are_dropped() {
        let r = read(&[(1, 1000), (2, 10)], 100);
        assert!(!r.wanted(1, 1000));
        assert!(r.wanted(1, 1001));
        assert!(r.wanted(2, 11));
        assert!(!r.wanted(3, 5000), "a slot not in the read");
    }
}
