//! [`Lru`]: least recently used, key by key (libCacheSim's LRU driven probe-first).
//!
//! One list, oldest at the head: a hit moves the key to the tail, a miss evicts the head when
//! full and appends the key. Keys of a request are processed in order, so with `G ≤ C` the
//! whole request is resident afterwards (its keys are the `G` most recent).

use crate::request::lists::{Lists, CURRENT};
use crate::request::{check_capacity, overflowed, Evictable, Policy, RequestOutcome};
use crate::Result;

/// Least recently used over u64 keys; see the module docs.
#[derive(Clone, Debug)]
pub struct Lru {
    lists: Lists,
    cap: usize,
}

impl Lru {
    /// An empty LRU for `capacity` keys (1 ..= [`MAX_CAPACITY`](crate::request::MAX_CAPACITY)).
    pub fn new(capacity: usize) -> Result<Self> {
        check_capacity(capacity)?;
        Ok(Self { lists: Lists::new(capacity, 1, 0), cap: capacity })
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn len(&self) -> usize {
        self.lists.len()
    }

    fn contains(&self, key: u64) -> bool {
        self.lists.find(key).is_some()
    }

    fn slot_of(&self, key: u64) -> Option<u32> {
        self.lists.find(key)
    }

    fn has_slots(&self) -> bool {
        true
    }

    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        self.lists.probe(keys, CURRENT, out, |_, _| true);
        for &k in keys {
            if let Some(i) = self.lists.find(k) {
                self.lists.move_to_back(i, 0);
                continue;
            }
            if self.lists.is_full() {
                if let Some(v) = self.lists.head(0) {
                    self.lists.evict(v, out);
                }
            }
            if let Some(i) = self.lists.insert(k, 0) {
                self.lists.mark(i, CURRENT);
                out.admitted += 1;
            }
        }
        self.lists.clear_marks();
        out.bypassed = overflowed(self, keys);
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.lists.heap_bytes()
    }
}

impl Evictable for Lru {
    fn remove(&mut self, key: u64) -> bool {
        self.lists.remove_key(key)
    }

    fn rename(&mut self, from: u64, to: u64) -> bool {
        self.lists.rename_key(from, to)
    }

    fn victims(&self, n: usize, skip: &dyn Fn(u64) -> bool, out: &mut Vec<u64>) {
        self.lists.victims_in_order(0..1, n, skip, out)
    }

    fn grow(&mut self, capacity: usize) -> Result<()> {
        check_capacity(capacity)?;
        self.lists.grow(capacity);
        self.cap = self.cap.max(capacity);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
        /// Model-based: agrees with a `Vec` kept in recency order (oldest first).
        #[test]
        fn matches_vec_model(
            cap in 1usize..8,
            trace in prop::collection::vec(prop::collection::vec(0u64..16, 1..5), 1..80),
        ) {
            let mut p = Lru::new(cap).unwrap();
            let mut model: Vec<u64> = Vec::new();
            for r in &trace {
                let hit: Vec<bool> = r.iter().map(|k| model.contains(k)).collect();
                let mut evicted = Vec::new();
                for &k in r {
                    if let Some(i) = model.iter().position(|&x| x == k) {
                        model.remove(i);
                    } else if model.len() == cap {
                        evicted.push(model.remove(0));
                    }
                    model.push(k);
                }
                let o = p.access_request(r);
                prop_assert_eq!(&o.hit, &hit);
                prop_assert_eq!(&o.evicted, &evicted);
                let order: Vec<u64> = p.lists.iter_list(0).map(|i| p.lists.key(i)).collect();
                prop_assert_eq!(&order, &model);
                p.lists.check().map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut p = Lru::new(3).unwrap();
        p.access_request(&[1, 2, 3]);
        p.access_request(&[1]);
        let o = p.access_request(&[4]);
        assert_eq!(o.evicted, vec![2]);
        let o = p.access_request(&[1, 3, 4]);
        assert!(o.is_perfect());
        p.lists.check().unwrap();
    }
}
