//! Slot leases and relay membership: who may claim in a slot, and one instance per owner id.
use std::time::{Duration, Instant};

use ferry_core::{ClaimRequest, SlotFence};

use super::relay::{ev, LONG};
use crate::db::AnyDb;

/// Slot leases fence claims: a relay claims only in the slots it holds, and loses them to a takeover.
pub async fn slot_leases_fence_claims(db: AnyDb) {
    db.store.enqueue(&[ev("S", 1)]).await.unwrap();
    let slot = ferry_core::slot_for("S");
    let a = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new(
            "relay-a",
            &[slot],
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    let epoch_a = a[0].epoch;
    // B cannot take a live slot
    assert!(db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
        .await
        .unwrap()
        .is_empty());
    // B's fenced claim gets nothing; A's gets the event
    let mut rb = ClaimRequest::new(vec![slot], 10, LONG);
    rb.fence = Some(SlotFence {
        owner: "relay-b".into(),
    });
    assert!(db.store.claim(&rb).await.unwrap().is_empty());
    // after A's lease expires B takes the slot over (epoch + 1); A's fenced claims then get
    // nothing, B's get the event
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        let got = db
            .store
            .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
            .await
            .unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(b[0].epoch, epoch_a + 1);
    let mut ra = ClaimRequest::new(vec![slot], 10, LONG);
    ra.fence = Some(SlotFence {
        owner: "relay-a".into(),
    });
    assert!(
        db.store.claim(&ra).await.unwrap().is_empty(),
        "stale owner must not claim"
    );
    assert_eq!(db.store.claim(&rb).await.unwrap().len(), 1);
    // renewal by the owner keeps the epoch; release frees it
    let again = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
        .await
        .unwrap();
    assert_eq!(again[0].epoch, b[0].epoch);
    db.store
        .release_slots(&ferry_core::SlotRelease::new("relay-b", &[slot]))
        .await
        .unwrap();
    let c = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-c", &[slot], LONG))
        .await
        .unwrap();
    assert_eq!(c[0].epoch, b[0].epoch + 1);
    assert_eq!(db.store.slot_leases().await.unwrap().len(), 1);
    // membership
    let m = db
        .store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-c", LONG))
        .await
        .unwrap();
    assert_eq!(m, vec!["relay-c".to_string()]);
    let m = db
        .store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-a", LONG))
        .await
        .unwrap();
    assert_eq!(m, vec!["relay-a".to_string(), "relay-c".to_string()]);
    db.store.leave_member("relay-a").await.unwrap();
    assert_eq!(
        db.store
            .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-c", LONG))
            .await
            .unwrap(),
        vec!["relay-c".to_string()]
    );
}

/// An owner id's membership row is held by one instance at a time: another instance's heartbeat
/// is refused with `OwnerInUse` and changes nothing while the row is live, and takes the row
/// once it has expired; of two instances racing for one row, exactly one gets it.
pub async fn one_instance_holds_an_owner_id(db: AnyDb) {
    use ferry_core::{MemberHeartbeat, StoreErrorKind};
    let store = &db.store;
    let beat = |owner: &str, instance: &str, ttl| {
        let (owner, instance) = (owner.to_string(), instance.to_string());
        async move {
            store
                .heartbeat_member(&MemberHeartbeat::new(&owner, ttl).instance(&instance))
                .await
        }
    };
    let members = beat("relay-o", "i-1", LONG).await.unwrap();
    assert_eq!(members, vec!["relay-o".to_string()]);
    let e = beat("relay-o", "i-2", LONG).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::OwnerInUse, "{e}");
    assert!(e.to_string().contains("\"relay-o\""), "{e}");
    // the refused heartbeat changed nothing: i-1 still holds (and renews) the row
    assert_eq!(beat("relay-o", "i-1", LONG).await.unwrap().len(), 1);
    assert!(beat("relay-o", "i-2", LONG).await.is_err());
    // an expired row is taken over, and its old instance is then refused
    beat("relay-p", "i-1", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let members = beat("relay-p", "i-2", LONG).await.unwrap();
    assert_eq!(members, vec!["relay-o".to_string(), "relay-p".to_string()]);
    let e = beat("relay-p", "i-1", LONG).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::OwnerInUse, "{e}");
    // a race for one free row: one instance wins, the other is refused
    for round in 0..5 {
        let owner = format!("relay-race-{round}");
        let (a, b) = tokio::join!(beat(&owner, "i-a", LONG), beat(&owner, "i-b", LONG));
        assert!(a.is_ok() != b.is_ok(), "round {round}: {a:?} / {b:?}");
        let loser = if a.is_ok() { b } else { a };
        assert_eq!(loser.unwrap_err().kind(), StoreErrorKind::OwnerInUse);
    }
    // a clean shutdown deletes the row: any instance may take it at once
    db.store.leave_member("relay-o").await.unwrap();
    beat("relay-o", "i-3", LONG).await.unwrap();
}
