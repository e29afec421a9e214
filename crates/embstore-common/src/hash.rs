//! The key hash: MurmurHash3's 64-bit finaliser (`fmix64`).
//!
//! Feature ids are structured (a slot prefix in the high bits, a counter in the low bits), so
//! a hash that only multiplies maps them onto few homes. `fmix64` folds the high half into the
//! low half before each odd multiply, so every input bit reaches every output bit (each output
//! bit flips with probability about 1/2); it is a bijection on u64, so distinct keys never
//! collide on the full hash. The index's home buckets, the table's shards, the cache's sets and
//! the admission sketch all hash through it; its outputs are a contract (see the tests).

use std::hash::Hasher;

/// The first multiplier of `fmix64`.
pub const FMIX64_C1: u64 = 0xff51_afd7_ed55_8ccd;
/// The second multiplier of `fmix64`.
pub const FMIX64_C2: u64 = 0xc4ce_b9fe_1a85_ec53;

/// Hashes one key (MurmurHash3 `fmix64`).
#[inline(always)]
pub fn fmix64(key: u64) -> u64 {
    let mut k = key;
    k ^= k >> 33;
    k = k.wrapping_mul(FMIX64_C1);
    k ^= k >> 33;
    k = k.wrapping_mul(FMIX64_C2);
    k ^= k >> 33;
    k
}

/// A `Hasher` for `u64` keys through [`fmix64`]: deterministic (no random state), so maps and
/// sets built with it behave the same on every run.
#[derive(Clone, Copy, Debug, Default)]
pub struct FmixHasher(u64);

impl Hasher for FmixHasher {
    fn finish(&self) -> u64 {
        fmix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 ^= i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(fmix64(42), 0x8108_7960_8e42_59cc);
    }

    #[test]
    fn hasher_of_a_u64_is_fmix64_of_it() {
        for k in [0u64, 1, 42, u64::MAX, 7 << 40 | 3] {
            let mut h = FmixHasher::default();
            h.write_u64(k);
            assert_eq!(h.finish(), fmix64(k));
        }
    }

    #[test]
    fn distinct_structured_keys_do_not_collide() {
        let mut seen = std::collections::HashSet::new();
        for slot in 0..16u64 {
            for n in 0..1024u64 {
                assert!(seen.insert(fmix64(slot << 40 | n)));
            }
        }
    }
}
