//! Batch lookups: a software pipeline of prefetches, with the rare second cacheline deferred.
//!
//! A lookup in a large table is one or two dependent cache misses. The batch runs `D` keys ahead
//! of itself: at step `i` it hashes key `i + D`, prefetches that key's home cacheline and parks
//! the home in `out[i + D]`; then it examines key `i`, whose line was prefetched `D` steps ago
//! and has (usually) arrived. With `D` misses overlapping, throughput approaches the memory
//! system's parallelism rather than its latency — the loop is the random-access-with-prefetch
//! bound's loop plus the key comparisons.
//!
//! Most keys (about 87 % at load 0.8) end in their home cacheline. A key whose chain goes on in
//! another cacheline prefetches that line, parks the bucket index in its `out` entry and joins a
//! small FIFO; the FIFO's head is taken up again once [`LAG`] keys queue behind it (its line has
//! had the time of about `LAG / 0.13` lookups to arrive), and leaves the FIFO or hops again. So
//! the common path is a straight loop with no per-lookup state machine, and the uncommon one
//! waits on nothing. At the end of the batch the FIFO is drained.
//!
//! Keys are hashed as they enter the pipeline (one multiply, see [`crate::hash`]), four at a time
//! with AVX2 where the CPU has it (checked once, at run time; the loop is then compiled for
//! AVX2): no home array, no separate hashing pass.

use crate::bucket::{prefetch_ptr, Bucket, PAYLOAD_MASK, STOP_MASK};
use crate::hash::KeyHash;
use crate::neighbor_hash::NeighborHash;
use crate::Error;

/// The payload written by [`NeighborHash::get_batch`] for a key that is not stored. Payloads
/// are below 2^52, so it is never a real payload.
pub const MISSING: u64 = u64::MAX;

/// Lookups in flight in [`NeighborHash::get_batch`]: how many keys ahead the pipeline
/// prefetches. Chosen by `embstore-bench index --ring-sweep` (see docs/benchmarks.md).
pub const DEFAULT_RING: usize = 64;

/// Deferred lookups that queue behind the FIFO's head before it is taken up again.
const LAG: usize = 16;
/// Keys per round of the pipeline's main loop.
const UNROLL: usize = 4;
/// FIFO capacity (a power of two of at least `LAG + UNROLL`, the most it ever holds: the head is
/// taken up until fewer than `LAG` wait, then at most `UNROLL` keys join).
const FIFO: usize = 32;
const _: () = assert!(FIFO.is_power_of_two() && LAG + UNROLL <= FIFO && UNROLL == 4);

/// Bucket indices (< 2^32) and payloads (< 2^52) share `out` while a batch runs: nothing marks
/// which is which; the pipeline knows each entry's state by its position.
impl<H: KeyHash> NeighborHash<H> {
    /// Looks up every key: `out[i]` is the payload of `keys[i]`, or [`MISSING`]. Returns the
    /// number of keys found. Fails, writing nothing, if the lengths differ.
    pub fn get_batch(&self, keys: &[u64], out: &mut [u64]) -> Result<usize, Error> {
        self.get_batch_ring::<DEFAULT_RING>(keys, out)
    }

    /// [`get_batch`](Self::get_batch) with `D` keys in flight (for benchmarks and tests).
    #[doc(hidden)]
    pub fn get_batch_ring<const D: usize>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.pipeline::<D>(keys, out))
    }

    /// `out[i]` = whether `keys[i]` is stored. Returns the number of keys found. Fails, writing
    /// nothing, if the lengths differ.
    pub fn contains_batch(&self, keys: &[u64], out: &mut [bool]) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        const CHUNK: usize = 1024;
        let mut payloads = [0u64; CHUNK];
        let mut hits = 0;
        for (k, o) in keys.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
            let p = &mut payloads[..k.len()];
            hits += self.pipeline::<DEFAULT_RING>(k, p);
            for (f, &x) in o.iter_mut().zip(p.iter()) {
                *f = x != MISSING;
            }
        }
        Ok(hits)
    }

    /// The pipeline (see the module docs); `keys.len() == out.len()`. Returns the hits. With
    /// the default hash and an AVX2 CPU (checked once, at run time), the whole loop is compiled
    /// for AVX2 and hashes four keys per instruction; else it is the same loop, scalar.
    fn pipeline<const D: usize>(&self, keys: &[u64], out: &mut [u64]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if H::MUL_XOR && crate::hash::avx2::available() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.pipeline_avx2::<D>(keys, out) };
        }
        self.pipeline_in::<D, false>(keys, out)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn pipeline_avx2<const D: usize>(&self, keys: &[u64], out: &mut [u64]) -> usize {
        self.pipeline_in::<D, true>(keys, out)
    }

    /// The pipeline's body; `SIMD`: hash with [`mul_xor_homes4`](crate::hash::mul_xor_homes4)
    /// (only for [`MulXor`](crate::hash::MulXor), on a CPU with AVX2).
    #[inline(always)]
    fn pipeline_in<const D: usize, const SIMD: bool>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> usize {
        const { assert!(D >= 1) };
        let n = keys.len();
        assert_eq!(n, out.len());
        let base = self.buckets.as_ptr();
        let slots = self.buckets.len();
        let mut hits = 0usize;
        let mut fifo = Fifo { idx: [0; FIFO], head: 0, tail: 0 };
        for i in 0..D.min(n) {
            let home = self.home(keys[i]);
            prefetch_ptr(base.wrapping_add(home));
            out[i] = home as u64;
        }
        let keys = keys.as_ptr();
        let out = out.as_mut_ptr();
        // Four keys per round, the FIFO's old heads once per round.
        let main = n.saturating_sub(D) / UNROLL * UNROLL;
        for r in (0..main).step_by(UNROLL) {
            // SAFETY: `r + UNROLL + D <= n` (as `r + UNROLL <= main <= n - D`), the length of
            // both `keys` and `out`, and the FIFO holds indices below `n`; a bucket index parked
            // in `out` is one that the walk of that key reaches (`resume`'s contract). `SIMD` is
            // set only where the CPU has AVX2 (`pipeline`).
            unsafe {
                let ahead = r + D;
                if SIMD {
                    #[cfg(target_arch = "x86_64")]
                    crate::hash::mul_xor_homes4(keys.add(ahead), slots as u64, out.add(ahead));
                } else {
                    for i in ahead..ahead + UNROLL {
                        *out.add(i) = self.home(*keys.add(i)) as u64;
                    }
                }
                for i in ahead..ahead + UNROLL {
                    prefetch_ptr(base.wrapping_add(*out.add(i) as usize));
                }
                while fifo.tail - fifo.head >= LAG {
                    let j = fifo.pop();
                    hits += resume(base, keys, out, j, &mut fifo);
                }
                for i in r..r + UNROLL {
                    hits += resume(base, keys, out, i, &mut fifo);
                }
            }
        }
        for i in main..n.saturating_sub(D) {
            // SAFETY: as above, `i + D < n`.
            unsafe {
                let home = self.home(*keys.add(i + D));
                prefetch_ptr(base.wrapping_add(home));
                *out.add(i + D) = home as u64;
                hits += step(base, keys, out, i, &mut fifo);
            }
        }
        for i in n.saturating_sub(D)..n {
            // SAFETY: as above, `i < n`, and `out[i]` holds its home (set D steps ago).
            hits += unsafe { step(base, keys, out, i, &mut fifo) };
        }
        while fifo.head < fifo.tail {
            let j = fifo.pop();
            // SAFETY: as above.
            hits += unsafe { resume(base, keys, out, j, &mut fifo) };
        }
        hits
    }
}

/// Deferred lookups (indices into the batch), oldest first.
struct Fifo {
    idx: [usize; FIFO],
    head: usize,
    tail: usize,
}

impl Fifo {
    #[inline(always)]
    fn push(&mut self, i: usize) {
        self.idx[self.tail % FIFO] = i;
        self.tail += 1;
    }

    #[inline(always)]
    fn pop(&mut self) -> usize {
        let i = self.idx[self.head % FIFO];
        self.head += 1;
        i
    }
}

/// One pipeline step for key `i`: first the FIFO's old heads, then `i` from its home.
///
/// # Safety
/// `i` and every index in `fifo` below the length of `keys` and `out`; `out[i]` and `out[j]` for
/// `j` in `fifo` hold buckets that those keys' walks reach.
#[inline(always)]
unsafe fn step(
    base: *const Bucket,
    keys: *const u64,
    out: *mut u64,
    i: usize,
    fifo: &mut Fifo,
) -> usize {
    let mut hits = 0;
    while fifo.tail - fifo.head >= LAG {
        let j = fifo.pop();
        // SAFETY: forwarded.
        hits += unsafe { resume(base, keys, out, j, fifo) };
    }
    // SAFETY: forwarded.
    hits + unsafe { resume(base, keys, out, i, fifo) }
}

/// Walks key `j` from the bucket parked in `out[j]`: writes the answer, or parks the next
/// bucket and queues `j` again. Returns 1 for a hit.
///
/// # Safety
/// As [`step`], for `j`.
#[inline(always)]
unsafe fn resume(
    base: *const Bucket,
    keys: *const u64,
    out: *mut u64,
    j: usize,
    fifo: &mut Fifo,
) -> usize {
    // SAFETY: `j` is in bounds and `out[j]` a bucket the walk of `keys[j]` reaches.
    unsafe {
        match walk(base, *keys.add(j), *out.add(j) as usize) {
            Walk::Done(p) => {
                *out.add(j) = p;
                usize::from(p != MISSING)
            }
            Walk::Hop(next) => {
                *out.add(j) = next as u64;
                fifo.push(j);
                0
            }
        }
    }
}

/// Where a walk within one cacheline ended.
enum Walk {
    /// The payload, or [`MISSING`].
    Done(u64),
    /// The chain goes on at this bucket, in another cacheline (now prefetched).
    Hop(usize),
}

/// Follows `key`'s chain from bucket `pos` while it stays in `pos`'s cacheline.
///
/// # Safety
/// `pos` must be a bucket of the table at `base` that a lookup of `key` reaches (its home or a
/// link on the chain from it); the table must not change during the call.
#[inline(always)]
unsafe fn walk(base: *const Bucket, key: u64, pos: usize) -> Walk {
    let mut pos = pos;
    loop {
        // SAFETY: `pos` is in bounds: the caller's contract, then the chain invariant (links
        // stay inside the array).
        let b = unsafe { *base.add(pos) };
        // An empty bucket is all zero: a lookup of key 0 can meet one at its home, and must not
        // take it for a hit; an occupied bucket's word is never 0 (its link field is not).
        if b.key == key {
            if b.word != 0 {
                return Walk::Done(b.word & PAYLOAD_MASK);
            }
            return Walk::Done(MISSING);
        }
        if b.word & STOP_MASK == 0 {
            return Walk::Done(MISSING);
        }
        let next = pos.wrapping_add_signed(b.offset());
        if (next ^ pos) >= crate::bucket::BUCKETS_PER_LINE {
            // Another cacheline (the array starts on a cacheline boundary).
            prefetch_ptr(base.wrapping_add(next));
            return Walk::Hop(next);
        }
        pos = next;
    }
}

#[inline]
fn check_len(keys: usize, got: usize, what: &'static str) -> Result<(), Error> {
    if keys != got {
        return Err(crate::error::length_mismatch(what, keys, got));
    }
    Ok(())
}
