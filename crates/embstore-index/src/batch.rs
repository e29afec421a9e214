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
//! How far ahead the pipeline runs and which cache level its prefetches fill are not constants:
//! the best pair depends on the CPU (on a Zen 4 guest, prefetching into L2 only, `_MM_HINT_T1`,
//! made the 16M-slot batch 1.6x faster than prefetching into L1; on others L1 wins). A table of
//! [`TUNE_FROM_SLOTS`] slots or more therefore times its own first batches, each of the
//! [`BatchTuning::CANDIDATES`] in turn, and keeps the fastest (over [`TUNE_ROUNDS`] rounds);
//! see [`NeighborHash::batch_tuning`]. After the choice, one batch in [`EXPLORE_EVERY`] runs half
//! with the choice and half with another candidate, and a candidate faster in most of its last
//! [`EXPLORE_WINDOW`] pairs replaces the choice. Smaller tables, and batches before the choice, use
//! [`BatchTuning::DEFAULT`]; so does every table with `EMBSTORE_BATCH_TUNING=off`.
//!
//! With AVX2, a key's first look at its home cacheline compares the key with all four of the
//! line's keys at once and branches once, on "found in the line" (about 78 % of lookups at load
//! 0.8 with 90 % present keys), instead of branching on each bucket's key along the chain (the
//! home bucket alone holds the key for only ~62 %): fewer mispredicted branches, which are what
//! a lookup in the caches spends most of its time on (a table of 4,096 slots at load 0.05, where
//! every branch goes the same way, answers 3.3x faster than at load 0.8). Measured paired on the
//! Zen 4 guest: 3–11 % more lookups per second in L1-, L3- and memory-sized tables.
//!
//! Keys are hashed as they enter the pipeline (one multiply, see [`crate::hash`]), four at a time
//! with AVX2 where the CPU has it (checked once, at run time; the loop is then compiled for
//! AVX2): no home array, no separate hashing pass.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::bucket::{prefetch_ptr, Bucket, PAYLOAD_MASK, STOP_MASK};
use crate::hash::KeyHash;
use crate::neighbor_hash::NeighborHash;
use crate::tune::{tuning_on, BatchTuning, Timings, EXPLORE_EVERY, TUNE_FROM_SLOTS, TUNE_MIN_KEYS};
use crate::Error;

/// The payload written by [`NeighborHash::get_batch`] for a key that is not stored. Payloads
/// are below 2^52, so it is never a real payload.
pub const MISSING: u64 = u64::MAX;

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
    ///
    /// The first batches of a large table also choose how the pipeline prefetches (see the
    /// module docs and [`batch_tuning`](Self::batch_tuning)); the answers never depend on it.
    pub fn get_batch(&self, keys: &[u64], out: &mut [u64]) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.tuned(keys, out))
    }

    /// How [`get_batch`](Self::get_batch) prefetches on this table: `None` while it is still
    /// timing the candidates (or never will: a table below [`TUNE_FROM_SLOTS`] slots, or one
    /// that has only seen batches below [`TUNE_MIN_KEYS`] keys, uses
    /// [`BatchTuning::DEFAULT`]). The choice can change later, as the table keeps comparing it
    /// with the other candidates on a few of its batches. A table that grows starts over.
    pub fn batch_tuning(&self) -> Option<BatchTuning> {
        match self.tuner.chosen.load(Ordering::Relaxed) {
            0 => None,
            c => Some(BatchTuning::CANDIDATES[usize::from(c) - 1]),
        }
    }

    /// [`get_batch`](Self::get_batch) with the pipeline set as `tuning` says, whatever this
    /// table chose (for benchmarks and tests). Fails if `tuning` is not one of the
    /// [`BatchTuning::CANDIDATES`].
    #[doc(hidden)]
    pub fn get_batch_with(
        &self,
        tuning: BatchTuning,
        keys: &[u64],
        out: &mut [u64],
    ) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        let Some(v) = BatchTuning::CANDIDATES.iter().position(|&c| c == tuning) else {
            return Err(crate::error::invalid_tuning(tuning));
        };
        Ok(self.run_candidate(v, keys, out))
    }

    /// [`get_batch`](Self::get_batch) with `D` keys in flight, prefetching into L2 only if
    /// `L2`, else into every level (for benchmarks and tests).
    #[doc(hidden)]
    pub fn get_batch_ring<const D: usize, const L2: bool>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> Result<usize, Error> {
        check_len(keys.len(), out.len(), "out")?;
        Ok(self.pipeline::<D, L2>(keys, out))
    }

    /// The pipeline as this table chose it, timing a candidate while it is still choosing.
    fn tuned(&self, keys: &[u64], out: &mut [u64]) -> usize {
        let chosen = self.tuner.chosen.load(Ordering::Relaxed);
        let eligible =
            keys.len() >= TUNE_MIN_KEYS && self.buckets.len() >= TUNE_FROM_SLOTS && tuning_on();
        if chosen != 0 {
            let v = usize::from(chosen) - 1;
            if !eligible
                || self.tuner.batches.fetch_add(1, Ordering::Relaxed) % EXPLORE_EVERY
                    != EXPLORE_EVERY - 1
            {
                return self.run_candidate(v, keys, out);
            }
            let Ok(mut tuning) = self.tuner.tuning.try_lock() else {
                return self.run_candidate(v, keys, out);
            };
            return self.explore(&mut tuning, v, keys, out);
        }
        let default = BatchTuning::DEFAULT_INDEX;
        if !eligible {
            return self.run_candidate(default, keys, out);
        }
        // One batch at a time is timed; batches on other threads meanwhile run the default.
        let Ok(mut tuning) = self.tuner.tuning.try_lock() else {
            return self.run_candidate(default, keys, out);
        };
        if self.tuner.chosen.load(Ordering::Relaxed) != 0 {
            drop(tuning);
            return self.tuned(keys, out);
        }
        let v = tuning.taken % BatchTuning::CANDIDATES.len();
        let start = Instant::now();
        let hits = self.run_candidate(v, keys, out);
        let ns_per_key = start.elapsed().as_nanos() as f64 / keys.len() as f64;
        if let Some(best) = tuning.record(ns_per_key) {
            self.tuner.chosen.store(best as u8 + 1, Ordering::Relaxed);
        }
        hits
    }

    /// Runs one half of the batch with the chosen candidate `v` and the other with the next
    /// candidate to explore, timing both (which half goes first alternates); switches to the
    /// explored one once the median of its last [`EXPLORE_WINDOW`] paired ratios says it is
    /// faster by more than [`SWITCH_BELOW`].
    fn explore(&self, tuning: &mut Timings, v: usize, keys: &[u64], out: &mut [u64]) -> usize {
        let n = BatchTuning::CANDIDATES.len();
        tuning.explored += 1;
        let c = (v + 1 + tuning.explored % (n - 1)) % n;
        let half = keys.len() / 2;
        let (k1, k2) = keys.split_at(half);
        let (o1, o2) = out.split_at_mut(half);
        let first_is_c = tuning.explored.is_multiple_of(2);
        let (a, b) = if first_is_c { (c, v) } else { (v, c) };
        let t = Instant::now();
        let mut hits = self.run_candidate(a, k1, o1);
        let t1 = t.elapsed().as_nanos() as f64 / k1.len() as f64;
        let t = Instant::now();
        hits += self.run_candidate(b, k2, o2);
        let t2 = t.elapsed().as_nanos() as f64 / k2.len() as f64;
        let ratio = if first_is_c { t1 / t2 } else { t2 / t1 };
        if tuning.note_ratio(c, ratio) {
            self.tuner.chosen.store(c as u8 + 1, Ordering::Relaxed);
        }
        hits
    }

    /// Runs candidate `v` of [`BatchTuning::CANDIDATES`].
    fn run_candidate(&self, v: usize, keys: &[u64], out: &mut [u64]) -> usize {
        match v {
            0 => self.pipeline::<64, false>(keys, out),
            1 => self.pipeline::<128, false>(keys, out),
            2 => self.pipeline::<64, true>(keys, out),
            _ => self.pipeline::<128, true>(keys, out),
        }
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
            hits += self.tuned(k, p);
            for (f, &x) in o.iter_mut().zip(p.iter()) {
                *f = x != MISSING;
            }
        }
        Ok(hits)
    }

    /// The pipeline (see the module docs); `keys.len() == out.len()`. Returns the hits. With
    /// the default hash and an AVX2 CPU (checked once, at run time), the whole loop is compiled
    /// for AVX2 and hashes four keys per instruction; else it is the same loop, scalar.
    fn pipeline<const D: usize, const L2: bool>(&self, keys: &[u64], out: &mut [u64]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if H::MUL_XOR && crate::hash::avx2::available() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.pipeline_avx2::<D, L2>(keys, out) };
        }
        self.pipeline_in::<D, false, L2>(keys, out)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn pipeline_avx2<const D: usize, const L2: bool>(
        &self,
        keys: &[u64],
        out: &mut [u64],
    ) -> usize {
        self.pipeline_in::<D, true, L2>(keys, out)
    }

    /// The pipeline's body; `SIMD`: hash with [`mul_xor_homes4`](crate::hash::mul_xor_homes4)
    /// (only for [`MulXor`](crate::hash::MulXor), on a CPU with AVX2); `L2`: prefetch into L2
    /// only.
    #[inline(always)]
    fn pipeline_in<const D: usize, const SIMD: bool, const L2: bool>(
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
            prefetch_ptr::<L2>(base.wrapping_add(home));
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
                    prefetch_ptr::<L2>(base.wrapping_add(*out.add(i) as usize));
                }
                while fifo.tail - fifo.head >= LAG {
                    let j = fifo.pop();
                    hits += resume::<L2>(base, keys, out, j, &mut fifo);
                }
                for i in r..r + UNROLL {
                    hits += fresh::<SIMD, L2>(base, keys, out, i, &mut fifo);
                }
            }
        }
        for i in main..n.saturating_sub(D) {
            // SAFETY: as above, `i + D < n`.
            unsafe {
                let home = self.home(*keys.add(i + D));
                prefetch_ptr::<L2>(base.wrapping_add(home));
                *out.add(i + D) = home as u64;
                hits += step::<SIMD, L2>(base, keys, out, i, &mut fifo);
            }
        }
        for i in n.saturating_sub(D)..n {
            // SAFETY: as above, `i < n`, and `out[i]` holds its home (set D steps ago).
            hits += unsafe { step::<SIMD, L2>(base, keys, out, i, &mut fifo) };
        }
        while fifo.head < fifo.tail {
            let j = fifo.pop();
            // SAFETY: as above.
            hits += unsafe { resume::<L2>(base, keys, out, j, &mut fifo) };
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
unsafe fn step<const SIMD: bool, const L2: bool>(
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
        hits += unsafe { resume::<L2>(base, keys, out, j, fifo) };
    }
    // SAFETY: forwarded.
    hits + unsafe { fresh::<SIMD, L2>(base, keys, out, i, fifo) }
}

/// Key `i`, whose home is parked in `out[i]`: with `SIMD`, [`in_home_line`] first; else (and
/// when that does not settle it) the walk.
///
/// # Safety
/// As [`step`], for `i`; with `SIMD`, the CPU must support AVX2.
#[inline(always)]
unsafe fn fresh<const SIMD: bool, const L2: bool>(
    base: *const Bucket,
    keys: *const u64,
    out: *mut u64,
    i: usize,
    fifo: &mut Fifo,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: forwarded (the caller runs with AVX2 when `SIMD`).
        return unsafe { in_home_line::<L2>(base, keys, out, i, fifo) };
    }
    // SAFETY: forwarded.
    unsafe { resume::<L2>(base, keys, out, i, fifo) }
}

/// Walks key `j` from the bucket parked in `out[j]`: writes the answer, or parks the next
/// bucket and queues `j` again. Returns 1 for a hit.
///
/// # Safety
/// As [`step`], for `j`.
#[inline(always)]
unsafe fn resume<const L2: bool>(
    base: *const Bucket,
    keys: *const u64,
    out: *mut u64,
    j: usize,
    fifo: &mut Fifo,
) -> usize {
    // SAFETY: `j` is in bounds and `out[j]` a bucket the walk of `keys[j]` reaches.
    unsafe {
        match walk::<L2>(base, *keys.add(j), *out.add(j) as usize) {
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

/// Key `i` from its home (parked in `out[i]`), the common case without a walk: the key is looked
/// for in all four buckets of the home cacheline at once (an occupied bucket holding it is its
/// only one, wherever it lies in the line), one branch, taken by about 78 % of lookups at load 0.8
/// with 90 % present keys. Where the walk would branch on a key comparison at each bucket (the home
/// bucket holds the key for only ~62 % of lookups, so that branch mispredicts often), this branch
/// is right more often. A key not in the line is absent or further down its chain: the links are
/// followed while they stay in the line (no key comparisons), to the end of the chain (a miss) or
/// to another cacheline (prefetched; `i` joins the FIFO). Key 0, which empty buckets also carry,
/// takes the walk.
///
/// # Safety
/// As [`step`], for `i`; the CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn in_home_line<const L2: bool>(
    base: *const Bucket,
    keys: *const u64,
    out: *mut u64,
    i: usize,
    fifo: &mut Fifo,
) -> usize {
    use crate::bucket::{BUCKETS_PER_LINE, PAYLOAD_BITS};
    use std::arch::x86_64::*;
    // SAFETY: `i` is in bounds and `out[i]` holds its home (the caller's contract); the home's
    // cacheline lies inside the array, which starts on a cacheline boundary, so the two aligned
    // 32-byte loads read that line; every link followed stays inside the array (the chain
    // invariant).
    unsafe {
        let key = *keys.add(i);
        let home = *out.add(i) as usize;
        let line = base.add(home & !(BUCKETS_PER_LINE - 1)).cast::<u64>();
        // The line as 8 words: key, value word, key, value word, ...
        let kk = _mm256_set1_epi64x(key as i64);
        let lo = _mm256_cmpeq_epi64(_mm256_load_si256(line.cast()), kk);
        let hi = _mm256_cmpeq_epi64(_mm256_load_si256(line.cast::<__m256i>().add(1)), kk);
        let lo = _mm256_movemask_pd(_mm256_castsi256_pd(lo)) as u32;
        let hi = _mm256_movemask_pd(_mm256_castsi256_pd(hi)) as u32;
        let keys_equal = (lo | (hi << 4)) & 0b0101_0101;
        // The first equal key's value word (lane 8 when none: the `& 7` reads a harmless word).
        let lane = (keys_equal | 0x100).trailing_zeros() as usize;
        let word = *line.add((lane + 1) & 7);
        if (keys_equal != 0) & (word >> PAYLOAD_BITS != 0) {
            *out.add(i) = word & PAYLOAD_MASK;
            return 1;
        }
        if key == 0 {
            return resume::<L2>(base, keys, out, i, fifo);
        }
        let mut pos = home;
        loop {
            let w = *line.add((pos & (BUCKETS_PER_LINE - 1)) * 2 + 1);
            if w & STOP_MASK == 0 {
                *out.add(i) = MISSING;
                return 0;
            }
            let next = pos.wrapping_add_signed(Bucket { key: 0, word: w }.offset());
            if (next ^ pos) >= BUCKETS_PER_LINE {
                prefetch_ptr::<L2>(base.wrapping_add(next));
                *out.add(i) = next as u64;
                fifo.push(i);
                return 0;
            }
            pos = next;
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
unsafe fn walk<const L2: bool>(base: *const Bucket, key: u64, pos: usize) -> Walk {
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
            prefetch_ptr::<L2>(base.wrapping_add(next));
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
