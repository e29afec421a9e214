//! Batch lookups with AMAC (asynchronous memory access chaining, Kocberber et al., VLDB '15).
//!
//! A lookup in a large table is one or two dependent cache misses. Instead of waiting for each,
//! a ring of `W` lookups is kept in flight, each a small state machine: hash the key, prefetch the
//! home cacheline and yield; when the ring comes back to it the line has (usually) arrived, and
//! the slot compares keys along the chain for as long as the chain stays inside that cacheline. A
//! hop to another cacheline prefetches it and yields again. A finished slot takes the next key at
//! once. With W misses overlapping, throughput approaches the memory system's parallelism rather
//! than its latency. Homes are hashed a block at a time (AVX2 where available) ahead of the ring.

use crate::bucket::Bucket;
use crate::table::{NeighborHash, Step};
use crate::Error;

/// The payload written by [`NeighborHash::get_batch`] for a key that is not stored. Payloads
/// are below 2^52, so it is never a real payload.
pub const MISSING: u64 = u64::MAX;

/// AMAC ring width of [`NeighborHash::get_batch`]: lookups in flight. Chosen by
/// `embstore-bench index --ring-sweep` (see docs/benchmarks.md): 24–32 is the plateau.
pub const DEFAULT_RING: usize = 32;

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
}

impl NeighborHash {
    /// Looks up every key: `out[i]` is the payload of `keys[i]`, or [`MISSING`]. Returns the
    /// number of keys found. Fails, writing nothing, if the lengths differ.
    pub fn get_batch(&self, keys: &[u64], out: &mut [u64]) -> Result<usize, Error> {
        self.get_batch_ring::<DEFAULT_RING>(keys, out)
    }

    /// [`get_batch`](Self::get_batch) with an explicit ring width `W` (for benchmarks).
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
        Ok(self.amac::<DEFAULT_RING>(keys, |i, payload| out[i] = payload != MISSING))
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
            *slot = Slot { key: keys[next], query: next, pos };
        };
        // Advances `slot` by one cacheline; true when its lookup is finished (and sunk).
        let mut advance = |slot: &mut Slot| -> bool {
            match NeighborHash::step(buckets, slot.key, slot.pos) {
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
                    false
                }
            }
        };

        let width = W.min(keys.len());
        let mut ring = [Slot { key: 0, query: usize::MAX, pos: 0 }; W];
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
}

#[inline]
fn check_len(keys: usize, got: usize, what: &'static str) -> Result<(), Error> {
    if keys != got {
        return Err(Error::LengthMismatch { what, keys, got });
    }
    Ok(())
}
