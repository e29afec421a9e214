//! Batch lookups: many lookups in flight, with software prefetch.
//!
//! A lookup in a large table is one or two dependent cache misses. Instead of waiting for each,
//! many lookups are kept in flight, each a small state machine: hash the key, prefetch the home
//! cacheline, and come back when it has (usually) arrived; then compare keys along the chain for
//! as long as the chain stays inside that cacheline; a hop to another cacheline prefetches it and
//! yields again. Throughput then approaches the memory system's parallelism, not its latency.
//! Homes are hashed a block at a time (AVX2 where available).
//!
//! Two schedulers run that state machine:
//! - the default ([`NeighborHash::get_batch`], `pipelined`): a sliding prefetch window over the
//!   keys in order, plus a FIFO ring of lookups parked after a cacheline hop;
//! - AMAC (`get_batch_ring::<W>`): a ring of `W` lookups visited round-robin, a finished slot
//!   taking the next key (Kocberber et al., VLDB '15), kept as the measured peer.
//!
//! Both give identical answers (tested); the default measured 8–10% faster (docs/benchmarks.md).

use crate::bucket::Bucket;
use crate::table::{NeighborHash, Step};
use crate::Error;

/// The payload written by [`NeighborHash::get_batch`] for a key that is not stored. Payloads
/// are below 2^52, so it is never a real payload.
pub const MISSING: u64 = u64::MAX;

/// Look-ahead distance of [`NeighborHash::get_batch`]: lookups in flight. Chosen by
/// `embstore-bench index --ring-sweep` (see docs/benchmarks.md).
pub const DEFAULT_AHEAD: usize = 32;

/// Keys hashed per block ahead of the ring.
const HASH_BLOCK: usize = 256;

/// Issues a prefetch of the cacheline holding `b` into all cache levels. A hint only: it never
/// faults and changes no state that the program can observe.
#[inline(always)]
pub(crate) fn prefetch(b: &Bucket) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `b` is a valid reference; prefetching an address never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((b as *const Bucket).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

#[derive(Clone, Copy)]
struct Slot {
    /// The key being looked up.
    key: u64,
    /// Index of the key being looked up; `usize::MAX` when the slot is idle.
    query: usize,
    /// Bucket to examine next (its cacheline has been prefetched).
    pos: usize,
    at_head: bool,
}

impl NeighborHash {
    /// Looks up every key: `out[i]` is the payload of `keys[i]`, or [`MISSING`]. Returns the
    /// number of keys found. Fails, writing nothing, if the lengths differ.
    pub fn get_batch(&self, keys: &[u64], out: &mut [u64]) -> Result<usize, Error> {
        self.get_batch_ahead::<DEFAULT_AHEAD>(keys, out)
    }

    /// [`get_batch`](Self::get_batch) with look-ahead distance `AHEAD` (1..=64; benchmarks).
    #[doc(hidden)]
    pub fn get_batch_ahead<const AHEAD: usize>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.pipelined::<AHEAD>(keys, |i, payload| out[i] = payload))
    }

    /// Batch lookup with the classic AMAC ring of `W` lookups in flight (benchmarks and tests:
    /// the peer of the default engine).
    #[doc(hidden)]
    pub fn get_batch_ring<const W: usize>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.amac::<W>(keys, |i, payload| out[i] = payload))
    }

    /// `out[i]` = whether `keys[i]` is stored. Returns the number of keys found. Fails, writing
    /// nothing, if the lengths differ.
    pub fn contains_batch(&self, keys: &[u64], out: &mut [bool]) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.pipelined::<DEFAULT_AHEAD>(keys, |i, payload| out[i] = payload != MISSING))
    }

    /// The AMAC engine: calls `sink(i, payload_or_MISSING)` once for every key, in no
    /// particular order, and returns the number of hits.
    ///
    /// Steady state: every ring slot holds a lookup; the ring is visited round-robin and a slot
    /// that finishes takes the next key at once, so the loop has no idle-slot checks. Once the
    /// keys run out, a drain phase finishes the lookups still in flight.
    fn amac<const W: usize>(&self, keys: &[u64], mut sink: impl FnMut(usize, u64)) -> usize {
        let buckets = self.buckets.as_slice();
        let shift = self.shift;
        let mut homes = [0u64; HASH_BLOCK];
        let mut block_start = 0usize;
        let mut next = 0usize; // next key to start
        let mut hits = 0usize;

        // Starts key `next` in `slot`: hash (a block at a time), prefetch the home, yield.
        let mut start = |slot: &mut Slot, next: usize| {
            if next == 0 || next == block_start + HASH_BLOCK {
                block_start = next;
                let end = (block_start + HASH_BLOCK).min(keys.len());
                let n = end - block_start;
                crate::hash::hash_shift(&keys[block_start..end], shift, &mut homes[..n]);
            }
            let pos = homes[next - block_start] as usize;
            prefetch(&buckets[pos]);
            *slot = Slot { key: keys[next], query: next, pos, at_head: true };
        };
        // Advances `slot` by one cacheline; true when its lookup is finished (and sunk).
        let mut advance = |slot: &mut Slot| -> bool {
            match NeighborHash::step(buckets, shift, slot.key, slot.pos, slot.at_head) {
                Step::Hit(payload) => {
                    hits += 1;
                    sink(slot.query, payload);
                    true
                }
                Step::Miss => {
                    sink(slot.query, MISSING);
                    true
                }
                Step::Next(pos) => {
                    prefetch(&buckets[pos]);
                    slot.pos = pos;
                    slot.at_head = false;
                    false
                }
            }
        };

        let width = W.min(keys.len());
        let mut ring = [Slot { key: 0, query: usize::MAX, pos: 0, at_head: true }; W];
        for slot in ring.iter_mut().take(width) {
            start(slot, next);
            next += 1;
        }
        let ring = &mut ring[..width];
        'steady: while next < keys.len() {
            for slot in ring.iter_mut() {
                if advance(slot) {
                    start(slot, next);
                    next += 1;
                    if next == keys.len() {
                        break 'steady;
                    }
                }
            }
        }
        // Drain: finish what is in flight.
        let mut active = width;
        while active > 0 {
            for slot in ring.iter_mut() {
                if slot.query != usize::MAX && advance(slot) {
                    slot.query = usize::MAX;
                    active -= 1;
                }
            }
        }
        hits
    }

    /// The default engine: a sliding prefetch window plus a ring of parked lookups. Calls
    /// `sink(i, payload_or_MISSING)` once for every key, in no particular order; returns hits.
    ///
    /// Each lookup is the same state machine as in [`amac`](Self::amac), scheduled differently:
    /// the home cacheline of the key `AHEAD` positions on is prefetched while the current key's
    /// home (prefetched `AHEAD` keys ago) is examined. The ~15% of lookups whose chain hops to
    /// another cacheline prefetch it and park in a FIFO ring, resumed `AHEAD` keys later. Keys
    /// and homes are read in order, so the loop keeps far less state than a round-robin ring
    /// (measured 8–10% faster than AMAC at 64M slots; docs/benchmarks.md).
    fn pipelined<const AHEAD: usize>(
        &self,
        keys: &[u64],
        mut sink: impl FnMut(usize, u64),
    ) -> usize {
        const { assert!(AHEAD >= 1 && AHEAD <= MAX_AHEAD) };
        let buckets = self.buckets.as_slice();
        let shift = self.shift;
        // Homes of this block and of the first AHEAD keys of the next (hashed twice, cheaply),
        // so the look-ahead never has to hash one key at a time.
        let mut homes = [0u64; HASH_BLOCK + MAX_AHEAD];
        let mut parked = Parked { ring: [(0, 0, 0); PARKED], head: 0, tail: 0, hits: 0 };
        for (b, block) in keys.chunks(HASH_BLOCK).enumerate() {
            let base = b * HASH_BLOCK;
            let end = (base + HASH_BLOCK + AHEAD).min(keys.len());
            let homes = &mut homes[..end - base];
            crate::hash::hash_shift(&keys[base..end], shift, homes);
            for (j, &key) in block.iter().enumerate() {
                if let Some(&ahead) = homes.get(j + AHEAD) {
                    prefetch(&buckets[ahead as usize]);
                }
                let now = base + j;
                let step = NeighborHash::step(buckets, shift, key, homes[j] as usize, true);
                parked.finish(buckets, &mut sink, now, step, now + AHEAD);
                if parked.due(now) {
                    parked.resume(buckets, shift, keys, &mut sink, now + AHEAD);
                }
            }
        }
        while parked.head < parked.tail {
            parked.resume(buckets, shift, keys, &mut sink, 0);
        }
        parked.hits
    }
}

/// Largest look-ahead distance of the pipelined engine.
const MAX_AHEAD: usize = 64;
/// Capacity of the parked-lookup ring (a power of two, > MAX_AHEAD).
const PARKED: usize = 128;

/// Lookups parked by the pipelined engine: (key index, bucket to resume at, due iteration).
struct Parked {
    ring: [(usize, usize, usize); PARKED],
    head: usize,
    tail: usize,
    hits: usize,
}

impl Parked {
    /// Whether the oldest parked lookup is due at iteration `now` (or the ring is full).
    #[inline(always)]
    fn due(&self, now: usize) -> bool {
        self.head < self.tail
            && (self.ring[self.head % PARKED].2 <= now || self.tail - self.head == PARKED)
    }

    #[inline(always)]
    fn finish(
        &mut self,
        buckets: &[Bucket],
        sink: &mut impl FnMut(usize, u64),
        i: usize,
        step: Step,
        due: usize,
    ) {
        match step {
            Step::Hit(p) => {
                self.hits += 1;
                sink(i, p);
            }
            Step::Miss => sink(i, MISSING),
            Step::Next(pos) => {
                prefetch(&buckets[pos]);
                self.ring[self.tail % PARKED] = (i, pos, due);
                self.tail += 1;
            }
        }
    }

    #[inline(always)]
    fn resume(
        &mut self,
        buckets: &[Bucket],
        shift: u32,
        keys: &[u64],
        sink: &mut impl FnMut(usize, u64),
        due: usize,
    ) {
        let (i, pos, _) = self.ring[self.head % PARKED];
        self.head += 1;
        let step = NeighborHash::step(buckets, shift, keys[i], pos, false);
        self.finish(buckets, sink, i, step, due);
    }
}

#[inline]
fn check_len(keys: usize, got: usize, what: &'static str) -> Result<(), Error> {
    if keys != got {
        return Err(Error::LengthMismatch { what, keys, got });
    }
    Ok(())
}
