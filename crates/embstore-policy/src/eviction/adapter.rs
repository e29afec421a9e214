//! [`PolicyEviction`]: an inference-cache policy ([`Evictable`](crate::Evictable)) run as a
//! shard's [`Eviction`], so a store can keep its hot rows by `lru`, `lfu` or `group_lfu`.
//!
//! The one hard part is the concurrency contract: the shard calls `on_access` under its read lock
//! from many threads, while a request-level policy needs `&mut` for a hit. Accesses are therefore
//! buffered in stripes and replayed (see [`PolicyEviction`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use super::Eviction;
use crate::{Error, Result};

/// Slots the cache policies start with room for; they double as the shard's rows grow.
const INITIAL_CAPACITY: usize = 1024;
const _: () = assert!(INITIAL_CAPACITY.is_power_of_two()); // see `slot_bytes`
/// Read buffers: stripes (threads spread over them) and accesses each holds before a drain.
const READ_STRIPES: usize = 8;
const READ_STRIPE_LEN: usize = 256;

/// An inference-cache policy ([`crate::Evictable`]) as a shard's [`Eviction`].
///
/// The policy's keys are the shard's slot numbers. `on_insert` is a one-key request that
/// misses (the policy's capacity doubles first when it is full, so it never evicts on its
/// own); `on_remove`, `on_move` and `victims` map to `remove`, `rename` and `victims`.
///
/// `on_access` runs under the shard's read lock, concurrently, while the policies need
/// `&mut` for a hit. As in Caffeine, accesses go to a striped buffer (a thread's stripe is
/// a short mutex-held `Vec`) and are replayed as one-key hit requests, in stripe order, at the
/// next `on_insert`, `on_move` or `victims`, or by the thread that fills a stripe when it can
/// take the policy's lock without waiting. A full stripe whose thread cannot take the lock
/// drops the access (counted in [`dropped`](Self::dropped)); a replayed slot that left
/// memory meanwhile is ignored. So recency and counts are those of the policy up to the
/// accesses dropped and the order within one drain.
pub struct PolicyEviction {
    name: &'static str,
    inner: Mutex<Inner>,
    reads: Box<[Mutex<Vec<u32>>]>,
    dropped: AtomicU64,
    /// The policy's metadata per slot of its capacity, taken at construction: the capacity
    /// only doubles from a power of two, so its index stays at the same load and this stays
    /// the same (up to the struct's own bytes spread over more slots).
    slot_bytes: usize,
}

struct Inner {
    policy: Box<dyn crate::Evictable>,
    out: crate::RequestOutcome,
    drained: Vec<u32>,
    keys: Vec<u64>,
}

impl fmt::Debug for PolicyEviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEviction")
            .field("policy", &self.name)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl PolicyEviction {
    /// The policy `config` names, for one shard. Errors: it cannot run here
    /// ([`crate::PolicyConfig::build_evictable`]).
    pub fn new(config: &crate::PolicyConfig) -> Result<Self> {
        let policy =
            config.build_evictable(INITIAL_CAPACITY).map_err(|e| Error::invalid(e.to_string()))?;
        Ok(Self {
            name: policy.name(),
            slot_bytes: policy.metadata_bytes().div_ceil(INITIAL_CAPACITY),
            inner: Mutex::new(Inner {
                policy,
                out: Default::default(),
                drained: Vec::new(),
                keys: Vec::new(),
            }),
            reads: (0..READ_STRIPES).map(|_| Mutex::new(Vec::new())).collect(),
            dropped: AtomicU64::new(0),
        })
    }

    /// Accesses dropped because a stripe was full while another thread held the policy.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Rows the policy holds.
    pub fn len(&self) -> usize {
        self.inner.lock().policy.len()
    }

    /// Whether the policy holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replays the buffered accesses into `inner`'s policy.
    fn drain(reads: &[Mutex<Vec<u32>>], inner: &mut Inner) {
        for stripe in reads {
            std::mem::swap(&mut *stripe.lock(), &mut inner.drained);
            for &slot in &inner.drained {
                let key = u64::from(slot);
                if inner.policy.contains(key) {
                    inner.policy.access_into(&[key], &mut inner.out);
                }
            }
            inner.drained.clear();
        }
    }

    /// The policy, with every buffered access replayed.
    fn drained(&mut self) -> &mut Inner {
        let inner = self.inner.get_mut();
        Self::drain(&self.reads, inner);
        inner
    }
}

thread_local! {
    /// This thread's read-buffer stripe.
    static STRIPE: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Relaxed) as usize % READ_STRIPES
    };
}

impl Eviction for PolicyEviction {
    fn on_insert(&mut self, slot: usize) {
        let Ok(key) = u32::try_from(slot) else { return };
        let key = u64::from(key);
        let inner = self.drained();
        let p = &mut inner.policy;
        p.remove(key);
        if p.len() >= p.capacity() && p.grow(p.capacity().saturating_mul(2)).is_err() {
            return; // past MAX_CAPACITY slots: the row stays unlisted (never a victim)
        }
        p.access_into(&[key], &mut inner.out);
        debug_assert!(inner.out.evicted.is_empty(), "{} evicted on its own", self.name);
    }

    fn on_access(&self, slot: usize) {
        let Ok(slot) = u32::try_from(slot) else { return };
        let stripe = &self.reads[STRIPE.with(|s| *s)];
        let full = {
            let mut v = stripe.lock();
            if v.len() < READ_STRIPE_LEN {
                v.push(slot);
                false
            } else {
                true
            }
        };
        if full {
            match self.inner.try_lock() {
                Some(mut inner) => {
                    Self::drain(&self.reads, &mut inner);
                    stripe.lock().push(slot);
                }
                None => {
                    self.dropped.fetch_add(1, Relaxed);
                }
            }
        }
    }

    fn on_remove(&mut self, slot: usize) {
        if let Ok(key) = u32::try_from(slot) {
            self.inner.get_mut().policy.remove(u64::from(key));
        }
    }

    fn on_move(&mut self, from: usize, to: usize) {
        let (Ok(from), Ok(to)) = (u32::try_from(from), u32::try_from(to)) else { return };
        if from == to {
            return;
        }
        let p = &mut self.drained().policy;
        p.remove(u64::from(to));
        p.rename(u64::from(from), u64::from(to));
    }

    fn victims(&mut self, n: usize, pinned: &dyn Fn(usize) -> bool, out: &mut Vec<usize>) {
        if n == 0 {
            return;
        }
        let inner = self.drained();
        inner.keys.clear();
        inner.policy.victims(n, &|k| pinned(k as usize), &mut inner.keys);
        out.extend(inner.keys.iter().map(|&k| k as usize));
    }

    fn bytes_per_slot(&self) -> usize {
        self.slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::testkit::{
        hit_rate, never, test_seed, zipf_trace, ExactLru, PolicyCache, ACCESSES, CAPACITY, KEYS,
    };
    use super::super::EvictionConfig;
    use super::*;

    /// The inference cache's LRU run by a shard (accesses buffered and replayed) is the exact
    /// LRU: a single thread's accesses are replayed in order before every victim choice.
    /// The other cache policies' hit rates are printed next to it.
    #[test]
    fn cache_lru_through_the_adapter_is_exact_lru() {
        let seed = test_seed(0x5eed_ca11);
        for s in [0.9, 1.05] {
            let trace = zipf_trace(s, KEYS, ACCESSES, seed);
            let exact = hit_rate(&mut ExactLru::new(CAPACITY), &trace);
            let mut line =
                format!("zipf({s}), capacity {CAPACITY}: exact LRU {:.2} %", 100.0 * exact);
            for name in ["lru", "lfu", "group_lfu", "lru_lfu"] {
                let policy = EvictionConfig::parse(name).unwrap().build(seed);
                let hit = hit_rate(&mut PolicyCache::new(policy, CAPACITY), &trace);
                line += &format!(", {name} {:.2} %", 100.0 * hit);
                if name == "lru" {
                    assert_eq!(hit, exact, "zipf({s}): cache lru {hit} vs exact LRU {exact}");
                }
            }
            eprintln!("{line}");
        }
    }

    /// Threads hitting under a shared reference (as under the shard's read lock) while the
    /// owner inserts and evicts between rounds: nothing is lost but what `dropped` counts,
    /// and victims stay live and distinct.
    #[test]
    fn concurrent_accesses_are_buffered_and_replayed() {
        let mut p = PolicyEviction::new(&crate::PolicyConfig::Lru).unwrap();
        for slot in 0..2_000 {
            p.on_insert(slot);
        }
        for round in 0..20 {
            std::thread::scope(|scope| {
                for t in 0..4 {
                    let p = &p;
                    scope.spawn(move || {
                        for i in 0..5_000 {
                            p.on_access((i * 7 + t * 13 + round) % 2_000);
                        }
                    });
                }
            });
            let mut out = Vec::new();
            p.victims(100, &|s| s % 2 == 0, &mut out);
            assert_eq!(out.len(), 100);
            let distinct: BTreeSet<usize> = out.iter().copied().collect();
            assert_eq!(distinct.len(), 100);
            for &v in &out {
                assert!(v < 2_000 && v % 2 == 1, "victim {v}");
                p.on_remove(v);
            }
            for &v in &out {
                p.on_insert(v);
            }
            assert_eq!(p.len(), 2_000);
        }
        // One slot hit by every thread far more than the others leaves memory last.
        for _ in 0..3 {
            for slot in 0..2_000 {
                p.on_access(slot);
            }
        }
        p.on_access(1_234);
        let mut out = Vec::new();
        p.victims(2_000, &never, &mut out);
        assert_eq!(out.len(), 2_000);
        assert_eq!(out.last(), Some(&1_234), "dropped {}", p.dropped());
    }
}
