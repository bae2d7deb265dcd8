//! Stable aggregate → shard-slot hashing.

/// A logical shard slot, `0..SLOT_COUNT`.
pub type SlotId = u16;

/// Number of logical shard slots. Fixed forever for a given outbox table: the slot is stored in
/// each row at enqueue time, and workers/processes own *slots*, so scaling workers only moves slot
/// ownership, never rows. 256 slots allow up to 256 concurrent ordered workers and keep the
/// claim's slot filter short.
pub const SLOT_COUNT: u16 = 256;

/// The slot of an aggregate key: FNV-1a 64-bit over the key's UTF-8 bytes, modulo
/// [`SLOT_COUNT`].
///
/// FNV-1a (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`) is chosen because it is
/// trivially reimplemented by producers in any language, is stable across Rust versions (unlike
/// `std`'s `DefaultHasher`) and spreads short keys well enough for 256 buckets.
pub fn slot_for(aggregate_key: &str) -> SlotId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in aggregate_key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(SLOT_COUNT)) as SlotId
}

/// The slots of `owned` (the slots one process owns) that worker `worker` of `workers` serves:
/// slot `s` goes to worker `s % workers`. Every slot has exactly one worker, and a slot keeps its
/// worker whatever other slots the process gains or loses.
pub fn slots_for_worker(owned: &[SlotId], worker: usize, workers: usize) -> Vec<SlotId> {
    let workers = workers.max(1);
    owned
        .iter()
        .copied()
        .filter(|s| *s as usize % workers == worker)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_hash_is_stable() {
        // Pinned values: changing the hash would move every stored row's aggregate to another
        // slot's worker and break per-aggregate ordering during an upgrade.
        assert_eq!(slot_for(""), (0xcbf2_9ce4_8422_2325u64 % 256) as u16);
        // the test vectors of docs/schema.md §2 (the SQL functions of the plain-INSERT
        // migrations must give the same; conformance test plain_insert_fills_what_the_rust_api_fills)
        assert_eq!(slot_for("order-7"), 59);
        assert_eq!(slot_for("agg-0"), 119);
        assert_eq!(slot_for("ünïcode-42"), 64);
        let a = slot_for("a");
        // FNV-1a("a") = 0xaf63dc4c8601ec8c
        assert_eq!(a, (0xaf63_dc4c_8601_ec8cu64 % 256) as u16);
    }

    #[test]
    fn slots_spread() {
        let mut counts = vec![0u32; SLOT_COUNT as usize];
        for i in 0..100_000 {
            counts[slot_for(&format!("order-{i}")) as usize] += 1;
        }
        let min = *counts.iter().min().unwrap();
        let max = *counts.iter().max().unwrap();
        assert!(min > 250 && max < 550, "min {min} max {max}");
    }

    #[test]
    fn workers_partition_slots() {
        let owned: Vec<SlotId> = (0..SLOT_COUNT).collect();
        let mut seen = vec![0; SLOT_COUNT as usize];
        for w in 0..3 {
            for s in slots_for_worker(&owned, w, 3) {
                seen[s as usize] += 1;
            }
        }
        assert!(seen.iter().all(|c| *c == 1));
        // a slot's worker does not depend on the other slots owned
        assert_eq!(slots_for_worker(&[3, 4, 7], 1, 3), vec![4, 7]);
        assert_eq!(slots_for_worker(&[7], 1, 3), vec![7]);
    }
}
