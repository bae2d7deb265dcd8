//! The store's operations on its shards, each under the locks it needs; the trait methods
//! ([`super::traits`]) call them.
use super::*;

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
    pub(super) fn shard(&self, slot: usize) -> MutexGuard<'_, Shard> {
        self.shards[slot].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn slots_read(&self) -> RwLockReadGuard<'_, SlotTable> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn slots_write(&self) -> RwLockWriteGuard<'_, SlotTable> {
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

    pub(super) fn enqueue_now(&self, events: &[NewEvent]) -> Result<Vec<String>, EnqueueError> {
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

    pub(super) fn claim_now(&self, req: &ClaimRequest) -> Vec<ClaimedEvent> {
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
    pub(super) fn cas<T>(
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
    pub(super) fn with_row<R>(
        &self,
        event_id: &str,
        f: impl FnOnce(&mut Shard, usize) -> R,
    ) -> Option<R> {
        let seq = *self.ids.get(event_id)?;
        let mut g = self.shard(slot_of(seq));
        let p = g.pos(seq)?;
        Some(f(&mut g, p))
    }

    /// Resolves the quarantined event `action` names to `target`, recording who acted.
    pub(super) fn operator(
        &self,
        action: &ferry_core::OperatorAction<'_>,
        target: EventState,
    ) -> Result<(), StoreError> {
        let (event_id, operator) = (action.event_id, action.operator);
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
    pub(super) fn purge_now(&self, cutoff: Micros, dry_run: bool) -> u64 {
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

    pub(super) fn reconcile_now(&self, req: &ReconcileRequest) -> ReconcileReport {
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

    pub(super) fn status_now(&self) -> OutboxStatus {
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
    pub(super) fn lookup_now(&self, claim_id: &str) -> Vec<ClaimedEvent> {
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

    pub(super) fn quarantined_now(&self, limit: usize) -> Vec<QuarantinedEvent> {
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
