//! The key → slot index of the request-level policies (and of the cache's surrogate map):
//! open addressing over `u32` slot numbers only. Public because the cache's L3 map and its
//! evaluator use it too ([`KeySet`], [`fmix64`]).
//!
//! The index stores no keys: it compares a probed key against the key its caller keeps in
//! the slot (`key_of(slot)`), so it costs 4 bytes per bucket (§2.3 of the design note: "≈ 6 B
//! if the index holds only the slot and compares against `slots[i]`"). A `hashbrown` map of
//! `u64 → u32` costs 16 + 1 bytes per bucket and, after many deletions, may double its
//! buckets to clear tombstones; this table has a fixed size and no tombstones.
//!
//! ```text
//! buckets [ 7 | NIL | 2 | 9 | NIL | … ]   power of two, load ≤ 3/4 at full capacity
//!           ^ home = fmix64(key) & mask; linear probing; removal shifts the run back
//! ```
//!
//! Invariants: every stored slot sits in the run that starts at its key's home bucket with no
//! empty bucket between home and it (linear probing with backward-shift deletion); a key is
//! stored at most once. Costs: expected probes at load 3/4 are 2.5 (hit) and 8.5 (miss),
//! each a read of `key_of`; the size never changes, so the bytes are exact from the start.

use std::hash::BuildHasherDefault;

/// "No slot": marks an empty bucket here and the end of a list in `lists`.
pub const NIL: u32 = u32::MAX;

/// MurmurHash3's 64-bit finaliser and a `Hasher` over it (from `embstore-common`): every input
/// bit flips each output bit with probability about 1/2, so table-qualified keys (table in the
/// top bits, small ids below) spread evenly; deterministic, so sets behave the same on every run.
pub use embstore_common::{fmix64, FmixHasher};

/// A deterministic `HashSet<u64>`.
pub type KeySet = hashbrown::HashSet<u64, BuildHasherDefault<FmixHasher>>;

/// Key → slot, open addressing over slot numbers (see the module docs).
#[derive(Clone, Debug)]
pub struct SlotIndex {
    buckets: Box<[u32]>,
    mask: usize,
    len: usize,
}

impl SlotIndex {
    /// An index for up to `capacity` keys: the smallest power of two ≥ 4/3 × capacity
    /// buckets (load ≤ 3/4), at least 4.
    pub fn with_capacity(capacity: usize) -> Self {
        let want = capacity.saturating_add(capacity / 3).saturating_add(1).max(4);
        let n = want.next_power_of_two();
        Self { buckets: vec![NIL; n].into_boxed_slice(), mask: n - 1, len: 0 }
    }

    /// Keys stored.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes this index owns on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<u32>()
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (fmix64(key) as usize) & self.mask
    }

    /// The bucket holding `key`'s slot, if `key` is stored.
    #[inline]
    fn position(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<usize> {
        let mut pos = self.home(key);
        loop {
            let slot = self.buckets[pos];
            if slot == NIL {
                return None;
            }
            if key_of(slot) == key {
                return Some(pos);
            }
            pos = (pos + 1) & self.mask;
        }
    }

    /// The slot of `key`, if stored.
    #[inline]
    pub fn find(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        self.position(key, key_of).map(|pos| self.buckets[pos])
    }

    /// Stores `key → slot`. The caller guarantees that `key` is not stored and that fewer
    /// than `capacity` keys are (so an empty bucket exists).
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        debug_assert!(self.len < self.buckets.len());
        let mut pos = self.home(key);
        while self.buckets[pos] != NIL {
            pos = (pos + 1) & self.mask;
        }
        self.buckets[pos] = slot;
        self.len += 1;
    }

    /// Removes `key` and returns its slot, if stored. `key_of` must still name the key of
    /// every stored slot, the removed one included.
    pub fn remove(&mut self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let mut hole = self.position(key, &key_of)?;
        let slot = self.buckets[hole];
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let v = self.buckets[j];
            if v == NIL {
                break;
            }
            // `v` may fill the hole iff its home is not inside the cyclic range (hole, j]:
            // then it is at least as far from home as the hole is from j.
            let home = self.home(key_of(v));
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.buckets[hole] = v;
                hole = j;
            }
        }
        self.buckets[hole] = NIL;
        self.len -= 1;
        Some(slot)
    }

    /// Checks that every stored slot is reachable from its key's home (for tests).
    #[cfg(test)]
    pub(crate) fn check(&self, key_of: impl Fn(u32) -> u64) -> Result<(), String> {
        let mut n = 0;
        for (pos, &slot) in self.buckets.iter().enumerate() {
            if slot == NIL {
                continue;
            }
            n += 1;
            let key = key_of(slot);
            if self.position(key, &key_of) != Some(pos) {
                return Err(format!("slot {slot} (key {key}) at bucket {pos} is not reachable"));
            }
        }
        if n != self.len {
            return Err(format!("index len {} but {n} buckets used", self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn sizes_are_powers_of_two_with_load_at_most_three_quarters() {
        for cap in [0, 1, 3, 4, 5, 96, 97, 1000, 14_429] {
            let ix = SlotIndex::with_capacity(cap);
            let n = ix.buckets.len();
            assert!(n.is_power_of_two());
            assert!(cap * 4 <= n * 3, "cap {cap} buckets {n}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
        /// Model-based: the index agrees with a `HashMap` under random inserts and removes
        /// over a small key universe (so runs collide and removal shifts them back).
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((any::<bool>(), 0u64..48), 1..400)) {
            let cap = 32;
            let mut ix = SlotIndex::with_capacity(cap);
            // slot -> key, as the policies keep it; free slots reused.
            let mut keys: Vec<u64> = Vec::new();
            let mut free: Vec<u32> = Vec::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (insert, key) in ops {
                if insert {
                    if model.contains_key(&key) || model.len() == cap {
                        continue;
                    }
                    let slot = free.pop().unwrap_or_else(|| { keys.push(0); (keys.len() - 1) as u32 });
                    keys[slot as usize] = key;
                    ix.insert(key, slot);
                    model.insert(key, slot);
                } else {
                    let got = ix.remove(key, |s| keys[s as usize]);
                    prop_assert_eq!(got, model.remove(&key));
                    if let Some(s) = got { free.push(s); }
                }
                prop_assert_eq!(ix.len(), model.len());
                for k in 0u64..48 {
                    prop_assert_eq!(ix.find(k, |s| keys[s as usize]), model.get(&k).copied());
                }
                ix.check(|s| keys[s as usize]).map_err(TestCaseError::fail)?;
            }
        }
    }
}
