//! Shard-slot ownership across relay processes.
//!
//! Every process heartbeats a membership row and computes, by rendezvous hashing over the live
//! members, which slots it should own. It takes or renews those slot leases (a CAS that only
//! succeeds on a free, expired or already-owned slot; a change of hands bumps the slot's epoch)
//! and releases the slots it should no longer own. Claims are fenced in the database by the
//! owner's live lease, so a process that lost a slot (partition, pause) claims nothing from it,
//! and its in-flight outcomes are fenced by their claim tokens.
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{OutboxStore, SlotId, SLOT_COUNT};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Rendezvous (highest-random-weight) score of `owner` for `slot`: FNV-1a over "owner/slot".
fn score(owner: &str, slot: SlotId) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in owner
        .as_bytes()
        .iter()
        .chain(b"/")
        .chain(slot.to_string().as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // final avalanche so near-identical owner ids spread evenly
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The slots `owner` should hold given the live `members` (which include `owner`).
pub fn desired_slots(owner: &str, members: &[String]) -> Vec<SlotId> {
    (0..SLOT_COUNT)
        .filter(|s| {
            members
                .iter()
                .max_by_key(|m| (score(m, *s), m.as_str()))
                .map(|m| m == owner)
                .unwrap_or(true)
        })
        .collect()
}

/// Ownership timing.
#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    /// Owner id of this process (unique per process start).
    pub owner: String,
    /// This start of the process (random): the owner id's membership row is held by one
    /// instance at a time.
    pub instance: String,
    /// Slot and membership lease (default 15 s: three missed heartbeats at 5 s).
    pub ttl: Duration,
    /// Heartbeat interval (default 5 s).
    pub heartbeat: Duration,
}

/// Runs the ownership loop, publishing the owned slots on `tx`, until `cancel`.
/// Does not release slots on exit: the relay does that after its workers drained.
///
/// If another process with this owner id took the membership row (possible only after this
/// process failed to renew it for a whole `ttl`: a pause, a partition), this process is no
/// longer the owner id's holder: it publishes no slots, cancels `displaced` and returns the
/// error; the relay then stops without releasing the other process's slots.
pub(crate) async fn run(
    store: Arc<dyn OutboxStore>,
    cfg: OwnershipConfig,
    metrics: Arc<Metrics>,
    tx: watch::Sender<Vec<SlotId>>,
    cancel: CancellationToken,
    displaced: CancellationToken,
) -> Option<ferry_core::StoreError> {
    let mut held: BTreeSet<SlotId> = BTreeSet::new();
    // a failing database is logged once per episode (then every minute), and its end
    let mut failing = crate::episode::Episode::new("slot ownership heartbeat");
    loop {
        let result = tick(&*store, &cfg, &metrics, &held).await;
        if result.is_ok() {
            metrics
                .db_ok_us
                .store(ferry_core::now_micros(), Ordering::Relaxed);
            failing.ended();
        }
        match result {
            Err(e) if e.kind() == ferry_core::StoreErrorKind::OwnerInUse => {
                tracing::error!(owner = %cfg.owner, error = %e, "another relay process took this owner id: stopping");
                metrics.slots_owned.store(0, Ordering::Relaxed);
                let _ = tx.send(Vec::new());
                displaced.cancel();
                return Some(e);
            }
            Ok((now_held, lost)) => {
                if lost > 0 {
                    metrics
                        .slot_fenced
                        .fetch_add(lost as u64, Ordering::Relaxed);
                    tracing::warn!(lost, "slot leases were taken over by another relay");
                }
                if now_held != held {
                    tracing::info!(owner = %cfg.owner, slots = now_held.len(), "slot ownership changed");
                }
                held = now_held;
                metrics
                    .slots_owned
                    .store(held.len() as i64, Ordering::Relaxed);
                // notify only on a change: a cursor worker reloads its cursors on every one
                let now: Vec<SlotId> = held.iter().copied().collect();
                tx.send_if_modified(|cur| {
                    if *cur == now {
                        false
                    } else {
                        *cur = now;
                        true
                    }
                });
            }
            Err(e) => {
                // Keep going: leases we cannot renew expire and the database fences our claims.
                metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                // the next attempt is the next heartbeat
                let _ = failing.failed(&e);
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(cfg.heartbeat) => {}
        }
    }
}

/// Takes the owner id's membership row for this instance, or refuses to run beside a live
/// process that holds it. Two processes with one owner id would hold every slot lease together,
/// unfenced against each other (each batch sent twice). The row is taken with a compare-and-set
/// (absent, already this instance's, or expired), so of two processes started at the same
/// instant one holds it. A row held by another instance is a live process's or a crashed run's;
/// a crashed run's expires within `ttl`, so this start retries for `ttl` plus one heartbeat and
/// is refused only if the row was renewed all that time. (A clean shutdown deletes the row: a
/// restart after one does not wait.) `Ok(false)`: `cancel` came first, nothing is held.
pub(crate) async fn claim_owner(
    store: &dyn OutboxStore,
    cfg: &OwnershipConfig,
    cancel: &CancellationToken,
) -> Result<bool, ferry_core::StoreError> {
    let beat = ferry_core::MemberHeartbeat::new(&cfg.owner, cfg.ttl).instance(&cfg.instance);
    let deadline = tokio::time::Instant::now() + cfg.ttl + cfg.heartbeat;
    let mut waiting = false;
    let mut transient = crate::episode::Episode::new("membership heartbeat at start");
    loop {
        let e = match store.heartbeat_member(&beat).await {
            Ok(_) => {
                transient.ended();
                return Ok(true);
            }
            Err(e) if e.kind() == ferry_core::StoreErrorKind::OwnerInUse => e,
            Err(e) if crate::episode::is_transient(&e) => {
                // a full disk, a lost connection, a failover: wait for it to pass
                let wait = transient.failed(&e);
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(false),
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ferry_core::StoreError::new(
                ferry_core::StoreErrorKind::InvalidInput,
                format!(
                    "another relay process is running with owner id {:?} (it kept its membership \
                     alive for {:?}); owner ids must be unique per process: leave `owner` unset \
                     for <host>-<pid>-<random>",
                    cfg.owner,
                    cfg.ttl + cfg.heartbeat
                ),
            ));
        }
        if !waiting {
            waiting = true;
            tracing::info!(
                owner = %cfg.owner,
                error = %e,
                "waiting for the owner id's membership to expire (a crashed run's), or refusing if another process renews it"
            );
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(false),
            _ = tokio::time::sleep((cfg.heartbeat / 2).min(Duration::from_millis(500))) => {}
        }
    }
}

async fn tick(
    store: &dyn OutboxStore,
    cfg: &OwnershipConfig,
    metrics: &Metrics,
    held: &BTreeSet<SlotId>,
) -> Result<(BTreeSet<SlotId>, usize), ferry_core::StoreError> {
    let members = store
        .heartbeat_member(
            &ferry_core::MemberHeartbeat::new(&cfg.owner, cfg.ttl)
                .instance(&cfg.instance)
                .sink_stalled(metrics.sink_stalled(ferry_core::now_micros())),
        )
        .await?;
    let desired = desired_slots(&cfg.owner, &members);
    let got: BTreeSet<SlotId> = store
        .acquire_slots(&ferry_core::SlotRequest::new(&cfg.owner, &desired, cfg.ttl))
        .await?
        .into_iter()
        .map(|l| l.slot)
        .collect();
    let surplus: Vec<SlotId> = held
        .iter()
        .copied()
        .filter(|s| !desired.contains(s))
        .collect();
    if !surplus.is_empty() {
        store
            .release_slots(&ferry_core::SlotRelease::new(&cfg.owner, &surplus))
            .await?;
    }
    let lost = held
        .iter()
        .filter(|s| desired.contains(s) && !got.contains(s))
        .count();
    Ok((got, lost))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_partitions_every_slot_once() {
        let members: Vec<String> = (0..3).map(|i| format!("relay-{i}")).collect();
        let mut seen = vec![0; SLOT_COUNT as usize];
        for m in &members {
            let d = desired_slots(m, &members);
            assert!(d.len() > 40, "{m} got {}", d.len());
            for s in d {
                seen[s as usize] += 1;
            }
        }
        assert!(seen.iter().all(|c| *c == 1));
        // a lone member owns everything
        assert_eq!(
            desired_slots("a", &["a".to_string()]).len(),
            SLOT_COUNT as usize
        );
        // adding a member only moves slots to the newcomer
        let four: Vec<String> = (0..4).map(|i| format!("relay-{i}")).collect();
        for m in &members {
            let before: BTreeSet<_> = desired_slots(m, &members).into_iter().collect();
            let after: BTreeSet<_> = desired_slots(m, &four).into_iter().collect();
            assert!(after.is_subset(&before));
        }
    }
}
