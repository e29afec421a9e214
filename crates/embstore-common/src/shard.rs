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

#[cfg(test)]
mod tests {
    use super::shard_of_key;

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
