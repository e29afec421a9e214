//! Test helpers shared by the store policies' tests: replayable seeds, a Zipf trace, a cache
//! driven through [`Eviction`] as a shard drives it, and an exact LRU to compare against.

use std::collections::{BTreeMap, HashMap};

use super::Eviction;
use crate::index::fmix64;

/// The Zipf trace's generator step (2^64 / golden ratio), as `LruLfu` spreads access numbers.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The seed for a deterministic test: `EMBSTORE_TEST_SEED=<n>` replays a run.
pub(super) fn test_seed(default: u64) -> u64 {
    let seed =
        std::env::var("EMBSTORE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("seed {seed} (EMBSTORE_TEST_SEED={seed} replays)");
    seed
}

pub(super) fn never(_: usize) -> bool {
    false
}

pub(super) const KEYS: usize = 100_000;
pub(super) const ACCESSES: usize = 200_000;
pub(super) const CAPACITY: usize = 10_000;

/// `len` keys drawn from Zipf(`s`) over `keys` ranks by inverse CDF, from splitmix64.
pub(super) fn zipf_trace(s: f64, keys: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(keys);
    let mut total = 0.0;
    for rank in 1..=keys {
        total += (rank as f64).powf(-s);
        cdf.push(total);
    }
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x.wrapping_add(GOLDEN);
            let u = (fmix64(x) >> 11) as f64 / (1u64 << 53) as f64 * total;
            cdf.partition_point(|&c| c <= u).min(keys - 1) as u32
        })
        .collect()
}

pub(super) trait Cache {
    /// Whether `key` was held; afterwards it is.
    fn access(&mut self, key: u32) -> bool;
}

/// A cache whose replacement is an [`Eviction`], driven as a shard would drive it.
pub(super) struct PolicyCache {
    policy: Box<dyn Eviction>,
    capacity: usize,
    slot_of: HashMap<u32, usize>,
    key_of: Vec<u32>,
    free: Vec<usize>,
    out: Vec<usize>,
}

impl PolicyCache {
    pub(super) fn new(policy: Box<dyn Eviction>, capacity: usize) -> Self {
        let (slot_of, key_of, free, out) = Default::default();
        Self { policy, capacity, slot_of, key_of, free, out }
    }
}

impl Cache for PolicyCache {
    fn access(&mut self, key: u32) -> bool {
        if let Some(&slot) = self.slot_of.get(&key) {
            self.policy.on_access(slot);
            return true;
        }
        if self.slot_of.len() == self.capacity {
            self.out.clear();
            self.policy.victims(1, &never, &mut self.out);
            let v = self.out[0];
            self.slot_of.remove(&self.key_of[v]);
            self.policy.on_remove(v);
            self.free.push(v);
        }
        let slot = self.free.pop().unwrap_or(self.key_of.len());
        if slot == self.key_of.len() {
            self.key_of.push(key);
        }
        self.key_of[slot] = key;
        self.slot_of.insert(key, slot);
        self.policy.on_insert(slot);
        self.policy.on_access(slot);
        false
    }
}

/// Exact LRU: keys by last-access tick.
pub(super) struct ExactLru {
    capacity: usize,
    tick: u64,
    by_tick: BTreeMap<u64, u32>,
    tick_of: HashMap<u32, u64>,
}

impl ExactLru {
    pub(super) fn new(capacity: usize) -> Self {
        Self { capacity, tick: 0, by_tick: BTreeMap::new(), tick_of: HashMap::new() }
    }
}

impl Cache for ExactLru {
    fn access(&mut self, key: u32) -> bool {
        self.tick += 1;
        let hit = match self.tick_of.insert(key, self.tick) {
            Some(old) => {
                self.by_tick.remove(&old);
                true
            }
            None => false,
        };
        self.by_tick.insert(self.tick, key);
        if self.tick_of.len() > self.capacity {
            let (_, k) = self.by_tick.pop_first().unwrap();
            self.tick_of.remove(&k);
        }
        hit
    }
}

pub(super) fn hit_rate(cache: &mut dyn Cache, trace: &[u32]) -> f64 {
    let hits = trace.iter().filter(|&&k| cache.access(k)).count();
    hits as f64 / trace.len() as f64
}
