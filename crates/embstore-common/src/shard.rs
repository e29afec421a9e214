//! The sharding contract: which shard of a table (or of a served table version) holds a key.
//! Client and server must agree on it, so it lives here and `embstore-proto` re-exports it
//! beside the wire contract.

use crate::hash::fmix64;

/// Mixed into the key before hashing, so shard placement is independent of the index's home
/// buckets (which take the high bits of the same hash).
pub const SHARD_SALT: u64 = 0x2545_f491_4f6c_dd1d;

/// The shard of `key` among `num_shards` (a power of two), as a table of that many shards
/// places it. Serving splits a table version the same way: with `num_shards` ≤ a table's own
/// shard count, serving shard `s` holds exactly the table's shards `i` with
/// `i & (num_shards - 1) == s`.
#[inline]
pub fn shard_of_key(key: u64, num_shards: usize) -> usize {
    debug_assert!(num_shards.is_power_of_two());
    (fmix64(key ^ SHARD_SALT) & (num_shards as u64).wrapping_sub(1)) as usize
}

/// The process (`0..world`) of a distributed training store that owns `id`: SplitMix64's
/// finaliser spreads structured ids (sequential, strided, all even), then the top 32 bits are
/// scaled onto `world` (no modulo bias). The Python package's `embstore.distributed.owner_of`
/// is its twin; distributed checkpoints place ids by it, so it never changes (pinned on both
/// sides by the same table of values). `world` 0 or 1: every id is process 0's.
#[inline]
pub fn owner_of(id: u64, world: u32) -> u32 {
    if world <= 1 {
        return 0;
    }
    // SplitMix64's first output from the seed `id` is its finaliser of `id + GAMMA`.
    let z = crate::rand::SplitMix64::new(id).next_u64();
    (((z >> 32) * u64::from(world)) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::{owner_of, shard_of_key};

    /// The placement of a distributed store's ids: the same table pins the Python twin
    /// (`python/tests/unit/test_session.py`); a change would strand every distributed
    /// checkpoint's rows on the wrong process.
    #[test]
    fn owner_of_known_values() {
        let ids = [0, 1, 2, 7, 1 << 40, (1 << 63) + 5, u64::MAX, 123_456_789];
        let known: [(u32, [u32; 8]); 5] = [
            (2, [1, 1, 1, 0, 0, 0, 1, 0]),
            (3, [2, 1, 1, 1, 0, 0, 2, 0]),
            (4, [3, 2, 2, 1, 0, 1, 3, 0]),
            (7, [6, 3, 4, 2, 0, 2, 6, 0]),
            (1000, [883, 566, 591, 389, 124, 330, 893, 133]),
        ];
        for (world, want) in known {
            let got: Vec<u32> = ids.iter().map(|&id| owner_of(id, world)).collect();
            assert_eq!(got, want, "world {world}");
        }
        assert_eq!(owner_of(u64::MAX, 1), 0);
        assert_eq!(owner_of(5, 0), 0);
    }

    /// The sharding contract client and server agree on: these placements must never change
    /// (a change would send every request of a running cluster to the wrong shard).
    #[test]
    fn shard_of_key_known_values() {
        let known: [(u64, usize, usize); 8] = [
            (0, 1, 0),
            (0, 8, 7),
            (1, 8, 4),
            (42, 16, 6),
            (12345, 64, 9),
            (7 << 40 | 3, 32, 21),
            (u64::MAX, 1024, 762),
            (1 << 63, 2, 1),
        ];
        for (key, shards, want) in known {
            assert_eq!(shard_of_key(key, shards), want, "key {key} over {shards} shards");
        }
    }

    #[test]
    fn fewer_serving_shards_nest_the_table_shards() {
        for key in 0..10_000u64 {
            let table = shard_of_key(key, 64);
            assert_eq!(shard_of_key(key, 8), table & 7);
        }
    }
}
