//! Shard-slot ownership across relay processes.
//!
//! Every process heartbeats a membership row and computes, by rendezvous hashing over the live
//! members, which slots it should own. It takes or renews those slot leases (a CAS that only
//! succeeds on a free, expired or already-owned slot; a change of hands bumps the slot's epoch)
//! and releases the slots it should no longer own. Claims are fenced in the database by the
//! owner's live lease, so a process that lost a slot (partition, pause) claims nothing from it,
//! and its in-flight outcomes are fenced by their claim tokens.
use std::collections::{BTreeMap, BTreeSet};
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
    /// Slot and membership lease (default 15 s: three missed heartbeats at 5 s).
    pub ttl: Duration,
    /// Heartbeat interval (default 5 s).
    pub heartbeat: Duration,
}

/// Runs the ownership loop, publishing the owned slots on `tx`, until `cancel`.
/// Does not release slots on exit: the relay does that after its workers drained.
pub async fn run(
    store: Arc<dyn OutboxStore>,
    cfg: OwnershipConfig,
    metrics: Arc<Metrics>,
    tx: watch::Sender<Vec<SlotId>>,
    cancel: CancellationToken,
) {
    let mut held: BTreeSet<SlotId> = BTreeSet::new();
    loop {
        match tick(&*store, &cfg, &held).await {
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
                tracing::warn!(error = %e, "slot ownership heartbeat failed");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(cfg.heartbeat) => {}
        }
    }
}

/// Refuses to run beside a live process that uses the same owner id. Two such processes would
/// hold every slot lease together, unfenced against each other (each batch sent twice). Leases
/// already held under this id are a crashed previous run's or such a process's; a live process
/// renews its leases every heartbeat, so if any lease moves on within one and a half heartbeats,
/// it is alive and this start is refused. (A clean shutdown releases its leases: a restart after
/// one does not wait. Two processes started at the same instant are not told apart.)
pub(crate) async fn check_owner_unique(
    store: &dyn OutboxStore,
    cfg: &OwnershipConfig,
    cancel: &CancellationToken,
) -> Result<(), ferry_core::StoreError> {
    let held = |leases: Vec<ferry_core::SlotLease>| -> BTreeMap<SlotId, i64> {
        leases
            .into_iter()
            .filter(|l| l.owner == cfg.owner)
            .map(|l| (l.slot, l.lease_until))
            .collect()
    };
    let before = held(store.slot_leases().await?);
    if before.is_empty() {
        return Ok(());
    }
    tracing::info!(
        owner = %cfg.owner,
        slots = before.len(),
        "slot leases under this owner id exist (a previous run's, or another process's with the same id): checking that nobody renews them"
    );
    tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        _ = tokio::time::sleep(cfg.heartbeat * 3 / 2) => {}
    }
    let after = held(store.slot_leases().await?);
    if after
        .iter()
        .any(|(slot, until)| before.get(slot).is_some_and(|b| until > b))
    {
        return Err(ferry_core::StoreError::new(
            ferry_core::StoreErrorKind::InvalidInput,
            format!(
                "another relay process is running with owner id {:?} (it renewed its slot leases); \
                 owner ids must be unique per process: leave `owner` unset for <host>-<pid>-<random>",
                cfg.owner
            ),
        ));
    }
    Ok(())
}

async fn tick(
    store: &dyn OutboxStore,
    cfg: &OwnershipConfig,
    held: &BTreeSet<SlotId>,
) -> Result<(BTreeSet<SlotId>, usize), ferry_core::StoreError> {
    let members = store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new(&cfg.owner, cfg.ttl))
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
