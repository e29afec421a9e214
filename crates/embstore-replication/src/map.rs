//! Where a key's sync part is: the one key → part map of the table and the simulator.
//!
//! A table of `shards` shards (a power of two) splits each into `per_shard` parts (a power of
//! two), so that a part lives inside one shard, under its lock. A key's shard is the table's
//! ([`embstore_common::shard_of_key`]: the low bits of `fmix64(key ^ SHARD_SALT)`), and its
//! part within the shard comes from the upper 32 bits of the same hash, which the shard does
//! not use. Part `p` is sub-part `p % per_shard` of shard `p / per_shard`.
//!
//! The map is persisted: a follower saves each part's knowledge at a flush and takes it back
//! at the next start, so [`PartMap::part_of`] must never change (the known values are tested).

use embstore_common::fmix64;
use embstore_common::shard::SHARD_SALT;
use embstore_common::{Error, Result};

/// The most sync parts a table (or a simulated replica) may have (2^20).
pub const MAX_PARTS: u32 = 1 << 20;

/// The parts of a table: `per_shard` parts in each of `shard_mask + 1` shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartMap {
    per_shard: u32,
    shard_mask: u64,
}

impl PartMap {
    /// The map of `parts` parts over `shards` shards: `parts` is a power of two up to
    /// [`MAX_PARTS`] and is raised to `shards` (a part never spans two shards).
    pub fn new(shards: u32, parts: u32) -> Result<Self> {
        if !parts.is_power_of_two() || parts > MAX_PARTS {
            return Err(Error::invalid(format!(
                "sync parts must be a power of two up to {MAX_PARTS}, got {parts}"
            )));
        }
        if !shards.is_power_of_two() || shards > MAX_PARTS {
            return Err(Error::invalid(format!(
                "shards must be a power of two up to {MAX_PARTS}, got {shards}"
            )));
        }
        let parts = parts.max(shards);
        Ok(Self { per_shard: parts / shards, shard_mask: u64::from(shards - 1) })
    }

    /// Parts in all.
    #[inline]
    pub fn parts(&self) -> u32 {
        self.per_shard * (self.shard_mask as u32 + 1)
    }

    /// Parts in each shard.
    #[inline]
    pub fn per_shard(&self) -> u32 {
        self.per_shard
    }

    /// The part of `key` within its shard.
    #[inline]
    pub fn sub_of(&self, key: u64) -> usize {
        ((fmix64(key ^ SHARD_SALT) >> 32) & u64::from(self.per_shard - 1)) as usize
    }

    /// The part of `key`.
    #[inline]
    pub fn part_of(&self, key: u64) -> u32 {
        let shard = (fmix64(key ^ SHARD_SALT) & self.shard_mask) as u32;
        shard * self.per_shard + self.sub_of(key) as u32
    }

    /// The shard of `part` and its index within the shard.
    #[inline]
    pub fn split(&self, part: u32) -> (usize, usize) {
        ((part / self.per_shard) as usize, (part % self.per_shard) as usize)
    }

    /// Part `sub` of shard `shard`.
    #[inline]
    pub fn join(&self, shard: u32, sub: usize) -> u32 {
        shard * self.per_shard + sub as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embstore_common::shard_of_key;

    /// The placements a follower's saved knowledge depends on: these must never change.
    #[test]
    fn part_of_known_values() {
        let known: [(u64, u32, u32, u32); 8] = [
            (0, 1, 1, KNOWN[0]),
            (1, 8, 1024, KNOWN[1]),
            (42, 16, 1024, KNOWN[2]),
            (12345, 64, 64, KNOWN[3]),
            (7 << 40 | 3, 32, 4096, KNOWN[4]),
            (u64::MAX, 1, 16, KNOWN[5]),
            (1 << 63, 2, 8, KNOWN[6]),
            (99, 4, 4, KNOWN[7]),
        ];
        for (key, shards, parts, want) in known {
            let m = PartMap::new(shards, parts).unwrap();
            assert_eq!(m.part_of(key), want, "key {key}, {shards} shards, {parts} parts");
        }
    }

    /// Computed with the table's map before it moved here (`embstore-table`'s `Layout`).
    const KNOWN: [u32; 8] = [0, 597, 414, 9, 2713, 7, 4, 2];

    #[test]
    fn a_part_lives_in_the_keys_shard() {
        let m = PartMap::new(8, 64).unwrap();
        assert_eq!((m.parts(), m.per_shard()), (64, 8));
        for key in 0..10_000u64 {
            let (shard, sub) = m.split(m.part_of(key));
            assert_eq!(shard, shard_of_key(key, 8));
            assert_eq!(sub, m.sub_of(key));
            assert_eq!(m.join(shard as u32, sub), m.part_of(key));
        }
        // Fewer parts than shards: one part per shard.
        assert_eq!(PartMap::new(8, 2).unwrap().parts(), 8);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let e = PartMap::new(4, 3).unwrap_err();
        assert!(e.to_string().contains("sync parts must be a power of two up to 1048576, got 3"));
        assert!(PartMap::new(3, 4).is_err() && PartMap::new(1, MAX_PARTS * 2).is_err());
    }
}
