//! Batch lookups with AMAC (asynchronous memory access chaining, Kocberber et al., VLDB '15).
//!
//! A lookup in a large table is one or two dependent cache misses. Instead of waiting for each,
//! a ring of `W` lookups is kept in flight, each a small state machine: hash the key, prefetch the
//! home cacheline and yield; when the ring comes back to it the line has (usually) arrived, and
//! the slot compares keys along the chain for as long as the chain stays inside that cacheline. A
//! hop to another cacheline prefetches it and yields again. A finished slot takes the next key at
//! once. With W misses overlapping, throughput approaches the memory system's parallelism rather
//! than its latency. Homes are hashed a block at a time (AVX2 where available) ahead of the ring.

use crate::bucket::{prefetch, Bucket};
use crate::neighbor_hash::{NeighborHash, Step};
use crate::Error;

/// The payload written by [`NeighborHash::get_batch`] for a key that is not stored. Payloads
/// are below 2^52, so it is never a real payload.
pub const MISSING: u64 = u64::MAX;

/// AMAC ring width of [`NeighborHash::get_batch`]: lookups in flight. Chosen by
/// `embstore-bench index --ring-sweep` (see docs/benchmarks.md): 32–64 is the plateau.
pub const DEFAULT_RING: usize = 32;

/// Keys hashed per block ahead of the ring.
const HASH_BLOCK: usize = 256;

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
        const { assert!(W >= 1 && W <= HASH_BLOCK) };
        let buckets = self.buckets.as_slice();
        let mut homes = Homes { homes: [0; HASH_BLOCK], start: 0, end: 0, shift: self.shift };
        let mut hits = 0usize;
        let mut next = 0usize; // the next key to launch
        let width = W.min(keys.len());
        let mut ring = [Slot { key: 0, query: usize::MAX, pos: 0 }; W];
        let ring = &mut ring[..width];
        for slot in ring.iter_mut() {
            launch(slot, keys, buckets, &mut homes, next);
            next += 1;
        }
        'steady: while next < keys.len() {
            for slot in ring.iter_mut() {
                if let Some(payload) = advance(slot, buckets) {
                    hits += usize::from(payload != MISSING);
                    sink(slot.query, payload);
                    launch(slot, keys, buckets, &mut homes, next);
                    next += 1;
                    if next == keys.len() {
                        break 'steady;
                    }
                }
            }
        }
        let mut active = width;
        while active > 0 {
            for slot in ring.iter_mut().filter(|s| s.query != usize::MAX) {
                if let Some(payload) = advance(slot, buckets) {
                    hits += usize::from(payload != MISSING);
                    sink(slot.query, payload);
                    slot.query = usize::MAX;
                    active -= 1;
                }
            }
        }
        hits
    }
}

/// Homes of keys `start..end`, hashed a block at a time ahead of the ring.
struct Homes {
    homes: [u64; HASH_BLOCK],
    start: usize,
    end: usize,
    shift: u32,
}

/// Starts the lookup of key `next` in `slot`: take its home (hashing the next block when
/// needed), prefetch the home cacheline.
#[inline(always)]
fn launch(slot: &mut Slot, keys: &[u64], buckets: &[Bucket], homes: &mut Homes, next: usize) {
    if next == homes.end {
        let end = (next + HASH_BLOCK).min(keys.len());
        crate::hash::hash_shift(&keys[next..end], homes.shift, &mut homes.homes[..end - next]);
        (homes.start, homes.end) = (next, end);
    }
    let pos = homes.homes[next - homes.start] as usize;
    prefetch(&buckets[pos]);
    *slot = Slot { key: keys[next], query: next, pos };
}

/// Examines the cacheline `slot` waits on: `Some(payload or MISSING)` when the lookup is done,
/// `None` when it hopped to another cacheline (now prefetched).
#[inline(always)]
fn advance(slot: &mut Slot, buckets: &[Bucket]) -> Option<u64> {
    match NeighborHash::step(buckets, slot.key, slot.pos) {
        Step::Hit(payload) => Some(payload),
        Step::Miss => Some(MISSING),
        Step::Next(pos) => {
            prefetch(&buckets[pos]);
            slot.pos = pos;
            None
        }
    }
}

#[inline]
fn check_len(keys: usize, got: usize, what: &'static str) -> Result<(), Error> {
    if keys != got {
        return Err(crate::error::length_mismatch(what, keys, got));
    }
    Ok(())
}
