//! [`EvictionPolicy`]: a store [`Eviction`] (the store's default [`LruLfu`](super::LruLfu), or
//! any other) run as a request-level [`Policy`], so the cache's perfect-hit evaluator can score
//! the policy the store itself runs, on the same traces as the cache's policies.
//!
//! It plays the shard's part: keys get slots `0..capacity` (a key → slot index and the slot's
//! key), and a request is served the way a shard serves a batch:
//!
//! ```text
//! probe   hit[j] = key j resident                       (before anything changes)
//! pin     the slots of the request's resident keys      (a batch's working set is pinned)
//! commit  for each key in order:
//!           resident → on_access(slot)
//!           missing  → if full: victims(1, pinned) → on_remove(victim), its slot is reused
//!                      (no unpinned victim: the request is bypassed, the key not admitted)
//!                      on_insert(slot), on_access(slot)   (the access that brought it in)
//! ```
//!
//! Keys admitted by the request are pinned too, so a request never evicts its own keys
//! (`self_evicted` stays 0). The eviction is driven from one thread (the evaluator's), so
//! `on_access` never races here; what this measures is the policy's choice of victims, not the
//! striped buffers of a concurrent shard.

use std::fmt;

use super::{Eviction, EvictionConfig};
use crate::index::SlotIndex;
use crate::request::{check_capacity, overflowed, Policy, RequestOutcome};
use crate::Result;

/// A store [`Eviction`] as a request-level [`Policy`] over `capacity` keys; see the module
/// docs.
pub struct EvictionPolicy {
    name: &'static str,
    eviction: Box<dyn Eviction>,
    capacity: usize,
    /// Key → slot, comparing against `keys`.
    index: SlotIndex,
    /// The key each slot holds; slots `0..keys.len()` are all in use (a victim's slot is
    /// reused at once, so no slot is ever free below `keys.len()`).
    keys: Vec<u64>,
    /// `pin[slot] == request` marks the slots of the request being committed.
    pin: Vec<u32>,
    request: u32,
    victims: Vec<usize>,
}

impl fmt::Debug for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EvictionPolicy")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("len", &self.keys.len())
            .field("eviction", &self.eviction)
            .finish()
    }
}

impl EvictionPolicy {
    /// The eviction `config` builds (with `seed`, as a shard would) over `capacity` keys.
    /// Errors: capacity 0 or above [`MAX_CAPACITY`](crate::request::MAX_CAPACITY); a config
    /// that does not validate.
    pub fn new(config: &EvictionConfig, capacity: usize, seed: u64) -> Result<Self> {
        config.validate()?;
        Self::from_eviction(config.name(), config.build(seed), capacity)
    }

    /// `eviction` (empty: it has been told of no slot) over `capacity` keys, reported as
    /// `name`. Errors: capacity 0 or above [`MAX_CAPACITY`](crate::request::MAX_CAPACITY).
    pub fn from_eviction(
        name: &'static str,
        eviction: Box<dyn Eviction>,
        capacity: usize,
    ) -> Result<Self> {
        check_capacity(capacity)?;
        Ok(Self {
            name,
            eviction,
            capacity,
            index: SlotIndex::with_capacity(capacity),
            keys: Vec::with_capacity(capacity),
            pin: vec![0; capacity],
            request: 0,
            victims: Vec::with_capacity(1),
        })
    }

    fn slot(&self, key: u64) -> Option<u32> {
        let keys = &self.keys;
        self.index.find(key, |s| keys[s as usize])
    }

    /// Makes room for one key: the slot of the victim the eviction names (its key evicted
    /// and reported in `out`), a fresh slot while not full, or `None` when every resident key
    /// is pinned.
    fn free_slot(&mut self, out: &mut RequestOutcome) -> Option<u32> {
        if self.keys.len() < self.capacity {
            self.keys.push(NIL_KEY);
            return Some((self.keys.len() - 1) as u32);
        }
        let (pin, request) = (&self.pin, self.request);
        self.victims.clear();
        // A slot the eviction names that this adapter never gave out counts as pinned.
        self.eviction.victims(1, &|s| pin.get(s).is_none_or(|&m| m == request), &mut self.victims);
        let v = *self.victims.first()?;
        let keys = &self.keys;
        let victim = keys[v];
        self.index.remove(victim, |s| keys[s as usize]);
        self.eviction.on_remove(v);
        out.evicted.push(victim);
        out.evicted_slots.push(v as u32);
        Some(v as u32)
    }
}

/// The key of a slot between `free_slot` and the insertion that fills it; never looked up.
const NIL_KEY: u64 = u64::MAX;

impl Policy for EvictionPolicy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn contains(&self, key: u64) -> bool {
        self.slot(key).is_some()
    }

    fn slot_of(&self, key: u64) -> Option<u32> {
        self.slot(key)
    }

    fn has_slots(&self) -> bool {
        true
    }

    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        // A new mark per request; on wrap-around, clear the marks so an old one cannot match.
        self.request = self.request.wrapping_add(1);
        if self.request == 0 {
            self.pin.fill(0);
            self.request = 1;
        }
        for &k in keys {
            let slot = self.slot(k);
            out.hit.push(slot.is_some());
            if let Some(s) = slot {
                out.hits += 1;
                self.pin[s as usize] = self.request;
            }
        }
        for &k in keys {
            if let Some(s) = self.slot(k) {
                self.eviction.on_access(s as usize);
                continue;
            }
            let Some(s) = self.free_slot(out) else {
                out.bypassed = true;
                continue;
            };
            self.keys[s as usize] = k;
            let keys = &self.keys;
            self.index.insert(k, s);
            debug_assert_eq!(self.index.find(k, |x| keys[x as usize]), Some(s));
            self.pin[s as usize] = self.request;
            self.eviction.on_insert(s as usize);
            self.eviction.on_access(s as usize);
            out.admitted += 1;
        }
        out.bypassed |= overflowed(&*self, keys);
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.eviction.bytes_per_slot() * self.capacity
            + self.index.heap_bytes()
            + self.keys.capacity() * std::mem::size_of::<u64>()
            + self.pin.len() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Random requests against a model (the set of resident keys): flags are the probe's,
    /// at most `capacity` keys stay, evictions name keys that were resident and not in the
    /// request, every key the request kept is resident afterwards, and two policies built
    /// alike answer alike. Seeds printed; replay one with `EMBSTORE_CACHE_SEED=<seed>`.
    #[test]
    fn store_evictions_keep_the_request_contract() {
        let seeds: Vec<u64> = match std::env::var("EMBSTORE_CACHE_SEED") {
            Ok(s) => vec![s.parse().expect("EMBSTORE_CACHE_SEED must be a u64")],
            Err(_) => (0..40).collect(),
        };
        for seed in seeds {
            for name in EvictionConfig::NAMES {
                let config = EvictionConfig::parse(name).unwrap();
                let mut rng = SplitMix64::new(seed);
                let cap = 1 + rng.below(10) as usize;
                let mut p = EvictionPolicy::new(&config, cap, seed).unwrap();
                let mut twin = EvictionPolicy::new(&config, cap, seed).unwrap();
                let mut resident = std::collections::BTreeSet::new();
                for step in 0..300 {
                    let ctx = format!("seed {seed} (EMBSTORE_CACHE_SEED={seed}), {name}, {step}");
                    let g = 1 + rng.below(cap as u64 + 2) as usize;
                    let keys: Vec<u64> = (0..g).map(|_| rng.below(3 * cap as u64)).collect();
                    let o = p.access_request(&keys);
                    assert_eq!(o, twin.access_request(&keys), "{ctx}");
                    let want: Vec<bool> = keys.iter().map(|k| resident.contains(k)).collect();
                    assert_eq!(o.hit, want, "{ctx}");
                    for (&k, &slot) in o.evicted.iter().zip(&o.evicted_slots) {
                        assert!(resident.remove(&k), "evicted {k} was not resident; {ctx}");
                        assert!(!keys.contains(&k), "evicted {k} of the request; {ctx}");
                        assert!((slot as usize) < cap, "{ctx}");
                    }
                    resident.extend(keys.iter().copied().filter(|&k| p.contains(k)));
                    assert_eq!(p.len(), resident.len(), "{ctx}");
                    assert!(p.len() <= cap, "{ctx}");
                    assert!(resident.iter().all(|&k| p.slot_of(k).is_some()), "{ctx}");
                    assert_eq!(o.self_evicted, 0, "{ctx}");
                    if name != "none" && keys.len() <= cap {
                        // Room for the whole request always exists: nothing of it is evicted.
                        assert!(!o.bypassed, "{ctx}");
                        assert!(keys.iter().all(|&k| p.contains(k)), "{ctx}");
                    }
                }
            }
        }
    }

    #[test]
    fn noop_admits_until_full_then_bypasses() {
        let mut p = EvictionPolicy::new(&EvictionConfig::Noop, 2, 0).unwrap();
        assert_eq!(p.name(), "none");
        assert!(!p.access_request(&[1, 2]).bypassed);
        let o = p.access_request(&[3]);
        assert!(o.bypassed && o.evicted.is_empty());
        assert_eq!(p.access_request(&[1, 2]).hits, 2);
        assert!(EvictionPolicy::new(&EvictionConfig::default(), 0, 0).is_err());
        let bad = EvictionConfig::LruLfu { recency_fraction: 2.0, sample: 1, age_every: 0 };
        assert_eq!(
            EvictionPolicy::new(&bad, 4, 0).unwrap_err().message(),
            "recency_fraction must be in [0, 1], got 2"
        );
    }
}
