//! [`MemoryStore`]'s implementations of the store traits of `ferry_core`.
use super::*;

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
                Some(_) => return Err(owner_in_use(owner)),
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
        Box::pin(async move { self.operator(req, EventState::Pending) })
    }

    fn skip<'a>(
        &'a self,
        req: &'a ferry_core::OperatorAction<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.operator(req, EventState::Skipped) })
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
