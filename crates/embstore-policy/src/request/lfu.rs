//! [`Lfu`]: least frequently used with aging, key by key (the per-key baseline that EV-LFU
//! replaces the counter of).
//!
//! A key's count starts at 1 on insertion and rises by 1 per hit (saturating at 255); each
//! count is a bucket, and a key that changes bucket goes to its tail, so ties go to the least
//! recently used. Victim: the head of the lowest non-empty bucket. Aging (optional, default
//! on): every `α·C` insertions all counts halve, by the same O(S) bucket splicing as
//! [`GroupLfu`](crate::request::GroupLfu). No request pinning: this is the classical policy.

use crate::request::lists::{Lists, CURRENT};
use crate::request::{
    age_period, check_alpha, check_capacity, overflowed, Evictable, Policy, RequestOutcome,
};
use crate::Result;

/// Parameters of [`Lfu`].
#[derive(Clone, Debug, PartialEq)]
pub struct LfuConfig {
    /// Halve every count every `α·C` insertions; `None` = never (pure LFU). Default 2.
    pub age_alpha: Option<f64>,
}

impl Default for LfuConfig {
    fn default() -> Self {
        Self { age_alpha: Some(2.0) }
    }
}

const MAX_COUNT: usize = 255;

/// Least frequently used with aging; see the module docs.
#[derive(Clone, Debug)]
pub struct Lfu {
    lists: Lists,
    cap: usize,
    age_alpha: Option<f64>,
    age_period: Option<u64>,
    ins_since_age: u64,
}

impl Lfu {
    /// An empty LFU for `capacity` keys. Errors: capacity out of range, α not finite and > 0.
    pub fn new(capacity: usize, config: LfuConfig) -> Result<Self> {
        check_capacity(capacity)?;
        check_alpha("age_alpha", config.age_alpha)?;
        Ok(Self {
            lists: Lists::new(capacity, MAX_COUNT + 1, 0),
            cap: capacity,
            age_alpha: config.age_alpha,
            age_period: age_period(config.age_alpha, capacity),
            ins_since_age: 0,
        })
    }
}

impl Policy for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
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
                let c = (self.lists.list_of(i) + 1).min(MAX_COUNT);
                self.lists.move_to_back(i, c);
                continue;
            }
            if self.lists.is_full() {
                if let Some(v) = self.lists.lowest_unpinned() {
                    self.lists.evict(v, out);
                }
            }
            if let Some(i) = self.lists.insert(k, 1) {
                self.lists.mark(i, CURRENT);
                out.admitted += 1;
                self.ins_since_age += 1;
            }
        }
        self.lists.clear_marks();
        if let Some(p) = self.age_period {
            if self.ins_since_age >= p {
                self.ins_since_age = 0;
                self.lists.age();
            }
        }
        out.bypassed = overflowed(self, keys);
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.lists.heap_bytes()
    }
}

impl Evictable for Lfu {
    fn remove(&mut self, key: u64) -> bool {
        self.lists.remove_key(key)
    }

    fn rename(&mut self, from: u64, to: u64) -> bool {
        self.lists.rename_key(from, to)
    }

    fn victims(&self, n: usize, skip: &dyn Fn(u64) -> bool, out: &mut Vec<u64>) {
        self.lists.victims_in_order(0..=MAX_COUNT, n, skip, out)
    }

    fn grow(&mut self, capacity: usize) -> Result<()> {
        check_capacity(capacity)?;
        if capacity > self.cap {
            self.lists.grow(capacity);
            self.cap = capacity;
            self.age_period = age_period(self.age_alpha, capacity);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
        /// Model-based: agrees with a `Vec<(key, count, seq)>` whose victim is the least
        /// `(count, seq)`; aging halves counts and re-sequences in `(count, seq)` order.
        #[test]
        fn matches_vec_model(
            cap in 1usize..8,
            alpha in prop::option::of(prop::sample::select(vec![0.5, 1.0, 2.0])),
            trace in prop::collection::vec(prop::collection::vec(0u64..16, 1..5), 1..80),
        ) {
            let mut p = Lfu::new(cap, LfuConfig { age_alpha: alpha }).unwrap();
            let period = alpha.map(|a| ((a * cap as f64).round() as u64).max(1));
            let mut model: Vec<(u64, usize, u64)> = Vec::new();
            let (mut seq, mut ins) = (0u64, 0u64);
            for r in &trace {
                let hit: Vec<bool> = r.iter().map(|k| model.iter().any(|e| e.0 == *k)).collect();
                let mut evicted = Vec::new();
                for &k in r {
                    seq += 1;
                    if let Some(e) = model.iter_mut().find(|e| e.0 == k) {
                        e.1 = (e.1 + 1).min(MAX_COUNT);
                        e.2 = seq;
                        continue;
                    }
                    if model.len() == cap {
                        let v = (0..model.len()).min_by_key(|&i| (model[i].1, model[i].2)).unwrap();
                        evicted.push(model.remove(v).0);
                    }
                    model.push((k, 1, seq));
                    ins += 1;
                }
                if period.is_some_and(|p| ins >= p) {
                    ins = 0;
                    model.sort_by_key(|e| (e.1, e.2));
                    for e in &mut model {
                        seq += 1;
                        e.1 >>= 1;
                        e.2 = seq;
                    }
                }
                let o = p.access_request(r);
                prop_assert_eq!(&o.hit, &hit);
                prop_assert_eq!(&o.evicted, &evicted);
                let mut want = model.clone();
                want.sort_by_key(|e| (e.1, e.2));
                let want: Vec<(u64, usize)> = want.iter().map(|e| (e.0, e.1)).collect();
                let got: Vec<(u64, usize)> = (0..=MAX_COUNT)
                    .flat_map(|b| p.lists.iter_list(b).map(move |i| (i, b)))
                    .map(|(i, b)| (p.lists.key(i), b))
                    .collect();
                prop_assert_eq!(got, want);
                p.lists.check().map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn evicts_least_frequent_then_least_recent() {
        let mut p = Lfu::new(3, LfuConfig { age_alpha: None }).unwrap();
        p.access_request(&[1, 2, 3]);
        p.access_request(&[1, 1]); // the repeat counts as a second hit: count 3
        p.access_request(&[3]);
        let o = p.access_request(&[4]);
        assert_eq!(o.evicted, vec![2]);
        let o = p.access_request(&[5]);
        assert_eq!(o.evicted, vec![4]);
        p.lists.check().unwrap();
    }

    #[test]
    fn aging_halves_counts() {
        let mut p = Lfu::new(2, LfuConfig { age_alpha: Some(1.0) }).unwrap();
        p.access_request(&[1]);
        for _ in 0..5 {
            p.access_request(&[1]);
        }
        assert_eq!(p.lists.list_of(p.lists.find(1).unwrap()), 6);
        p.access_request(&[2]); // second insertion: period 2 reached, counts halve
        assert_eq!(p.lists.list_of(p.lists.find(1).unwrap()), 3);
        assert_eq!(p.lists.list_of(p.lists.find(2).unwrap()), 0);
        p.lists.check().unwrap();
    }
}
