//! The relay: reads the outbox (cursor dispatch) or claims and acks (row dispatch).
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ferry_core::{
    AdvanceResult, CasResult, CursorAdvance, CursorPos, CursorRead, CursorStore, DispatchMode,
    SlotAdvance, SlotId,
};

use super::super::slots::all_slots;
use super::check::{tag_of, Delivered};
use super::session::STEP_DEADLINE;
use crate::db::TestDb;

/// Rows per cursor read or row claim: small, so that reads cut windows and claims take a few
/// aggregates at a time.
pub const READ_LIMIT: usize = 3;

/// How long a drain waits for committed intents to become readable (on PostgreSQL other tests'
/// open transactions can delay a tick for a while).
pub(super) const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

pub(super) const LONG: Duration = Duration::from_secs(300);
pub(super) const OWNER: &str = "interleave";

/// Reads the outbox as a relay would, in one dispatch mode, and keeps what it got in order.
pub(super) struct Reader {
    pub(super) mode: DispatchMode,
    /// Cursor dispatch: every slot's in-memory read position.
    pos: BTreeMap<SlotId, CursorPos>,
    pub(super) delivered: Vec<Delivered>,
    pub(super) reads: usize,
}

pub(super) fn cursor_store(db: &TestDb) -> &dyn CursorStore {
    db.store.cursor().expect("cursor dispatch on this store")
}

impl Reader {
    /// Puts the outbox in `mode` (before any intent is written) and, for cursor dispatch,
    /// takes every slot.
    pub(super) async fn start(db: &TestDb, mode: DispatchMode) -> Reader {
        let cs = cursor_store(db);
        let mut pos = BTreeMap::new();
        if mode == DispatchMode::Cursor {
            cs.set_dispatch_mode(DispatchMode::Cursor, OWNER)
                .await
                .expect("cursor dispatch");
            db.store
                .acquire_slots(&ferry_core::SlotRequest::new(OWNER, &all_slots(), LONG))
                .await
                .expect("slots");
            for c in cs.load_cursors(OWNER, &all_slots()).await.expect("cursors") {
                pos.insert(c.slot, c.pos);
            }
            assert_eq!(pos.len(), all_slots().len(), "every slot is ours");
        } else {
            assert_eq!(
                cs.dispatch_mode().await.expect("mode"),
                DispatchMode::Row,
                "a fresh outbox is in row dispatch"
            );
        }
        Reader {
            mode,
            pos,
            delivered: Vec::new(),
            reads: 0,
        }
    }

    /// One read (cursor: from the in-memory positions, no advance) or one claim and its ack
    /// (row). Returns the events read and whether more may follow right now.
    pub(super) async fn read(&mut self, db: &TestDb) -> Result<(usize, bool), String> {
        self.reads += 1;
        match self.mode {
            DispatchMode::Cursor => {
                let req = CursorRead {
                    from: self.pos.iter().map(|(s, p)| (*s, *p)).collect(),
                    limit: READ_LIMIT,
                };
                let b = tokio::time::timeout(STEP_DEADLINE, cursor_store(db).read_batch(&req))
                    .await
                    .map_err(|_| "a cursor read waited for a producer".to_string())?
                    .map_err(|e| format!("cursor read: {e}"))?;
                for e in &b.events {
                    if e.held {
                        return Err(format!("{} came back held", e.event.aggregate_id));
                    }
                    self.delivered.push(Delivered {
                        tag: tag_of(e.event.payload.as_text().unwrap_or_default()),
                        agg: e.event.aggregate_id.clone(),
                        version: e.event.aggregate_version,
                        at: format!(
                            "read {}, window {} xid {} seq {}",
                            self.reads, e.pos.tick, e.pos.xid, e.pos.seq
                        ),
                    });
                }
                for (slot, p) in self.pos.iter_mut() {
                    let upto = b.upto_of(*slot);
                    if upto > *p {
                        *p = upto;
                    }
                }
                Ok((b.events.len(), b.more))
            }
            DispatchMode::Row => {
                let claim = crate::fixtures::claim_all(READ_LIMIT, LONG);
                let got = tokio::time::timeout(STEP_DEADLINE, db.store.claim(&claim))
                    .await
                    .map_err(|_| "a claim waited for a producer".to_string())?
                    .map_err(|e| format!("claim: {e}"))?;
                for e in &got {
                    self.delivered.push(Delivered {
                        tag: tag_of(e.payload.as_text().unwrap_or_default()),
                        agg: e.aggregate_id.clone(),
                        version: e.aggregate_version,
                        at: format!("claim {}, seq {}", self.reads, e.token.seq),
                    });
                }
                if !got.is_empty() {
                    let tokens: Vec<_> = got.iter().map(|e| e.token.clone()).collect();
                    let r = db
                        .store
                        .ack(&tokens)
                        .await
                        .map_err(|e| format!("ack: {e}"))?;
                    if r.items.iter().any(|(_, c)| *c != CasResult::Applied) {
                        return Err(format!("acks fenced: {r:?}"));
                    }
                }
                Ok((got.len(), got.len() == READ_LIMIT))
            }
        }
    }

    /// Cursor dispatch: moves every slot's durable cursor to its read position.
    async fn advance(&mut self, db: &TestDb) -> Result<(), String> {
        let cs = cursor_store(db);
        let cursors = cs
            .load_cursors(OWNER, &all_slots())
            .await
            .map_err(|e| format!("load cursors: {e}"))?;
        let slots: Vec<SlotAdvance> = cursors
            .iter()
            .filter(|c| self.pos[&c.slot] > c.pos)
            .map(|c| SlotAdvance {
                slot: c.slot,
                epoch: c.epoch,
                version: c.version,
                to: self.pos[&c.slot],
            })
            .collect();
        if slots.is_empty() {
            return Ok(());
        }
        let adv = CursorAdvance {
            owner: OWNER.into(),
            claim_id: ferry_core::new_event_id(),
            slots,
            exceptions: Vec::new(),
        };
        match cs.advance(&adv).await {
            Ok(AdvanceResult::Applied) => Ok(()),
            Ok(AdvanceResult::Fenced) => Err("the advance was fenced".into()),
            Err(e) => Err(format!("advance: {e}")),
        }
    }

    /// Reads (advancing after each cursor read) until every intent of `want` came back and a
    /// read finds nothing more.
    pub(super) async fn drain(
        &mut self,
        db: &TestDb,
        want: &BTreeSet<String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + DRAIN_DEADLINE;
        loop {
            let (n, more) = self.read(db).await?;
            if self.mode == DispatchMode::Cursor {
                self.advance(db).await?;
            }
            if n == 0 && !more {
                let got: BTreeSet<&str> = self.delivered.iter().map(|d| d.tag.as_str()).collect();
                let missing = want.iter().filter(|t| !got.contains(t.as_str())).count();
                if missing == 0 {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{missing} committed intents still unread after {DRAIN_DEADLINE:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
