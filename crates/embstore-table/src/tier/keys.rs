//! The pin counts' map, keyed by id and hashed with the index's mixer: below both the pins
//! that fill it and the eviction that reads it.

use std::collections::HashMap;

/// Pin counts by key. Ids are hashed with the index's mixer, not SipHash: a training step pins
/// and unpins every id of its batch, and ids come from the trainer, not from an adversary
/// (a caller that could choose colliding ids could as well pin the whole budget).
pub(crate) type Pins = HashMap<u64, u32, KeyHash>;
pub(crate) type KeyHash = std::hash::BuildHasherDefault<Fmix>;

/// A `Hasher` for `u64` keys: the index's 64-bit finaliser (murmur3's fmix64).
#[derive(Default)]
pub(crate) struct Fmix(u64);

impl std::hash::Hasher for Fmix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = embstore_index::hash::hash(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = embstore_index::hash::hash(self.0 ^ key);
    }
}
