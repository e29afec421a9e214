//! The hashes: the index's home hash ([`MulXor`]: one multiply, one shift-xor), the MurmurHash3
//! finaliser `fmix64` (from `embstore-common`) as an alternative home hash ([`Fmix64`]) and for
//! everyone else, and `fmix64` for blocks of keys with AVX2.
//!
//! ## The home hash
//! A lookup waits on its hash before its first load, so the hash is on every lookup's critical
//! path and in every batched lookup's instruction count. [`MulXor`] multiplies the key by an odd
//! constant and xors the low half of the product into the high half: `h = k * MUL; h ^ (h << 32)`
//! (one `imul`, a shift, an xor), where `fmix64` has two multiplies and three shift-xors. The home
//! is then taken from the *high* bits of that hash by a multiply-shift range reduction,
//! `(hash * slots) >> 64`, which maps onto any slot count (not only powers of two: large tables
//! grow in steps of 1.15x, see the crate docs).
//!
//! Real feature ids are structured: a slot prefix in the high bits and a counter in the low bits
//! (`slot << 40 | n`), sequential ids, ids that differ only in high bits. A multiply by a
//! constant alone is not enough: it maps a few arithmetic progressions (one per slot) onto a few
//! lattices, and `slot << 40 | n` over 26 slots then probes 1.40 cachelines per lookup where
//! `fmix64` probes 1.14. The xor of the product's two halves breaks that (1.13), and takes high
//! key bits into account (the product's high half sees every key bit). The published NeighborHash
//! multiplies by an *even* constant and takes the *low* bits, which maps `j << 40` keys onto
//! multiples of 256. `tests/structure.rs` checks APCL and the longest chain under such ids
//! against `fmix64`.
//!
//! The AVX2 `fmix64` below ([`hash_shift`]) serves the benchmark's random-access bound and any
//! caller hashing blocks of keys; both paths are tested against each other.

use embstore_common::hash::{FMIX64_C1 as C1, FMIX64_C2 as C2};

/// Hashes one key (MurmurHash3 `fmix64`): the shared hash of `embstore-common`, which the
/// AVX2 path below must match bit for bit. Not the index's default home hash ([`MulXor`]).
pub use embstore_common::fmix64 as hash;

/// The multiplier of [`MulXor`]: odd (2^64 / golden ratio), so `key * MUL` is a bijection.
pub const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// A key hash for [`NeighborHash`](crate::NeighborHash): the table takes a key's home from the
/// high bits of `hash(key)` (`(hash * slots) >> 64`).
pub trait KeyHash {
    /// Hashes one key.
    fn hash(key: u64) -> u64;
    /// Whether this is [`MulXor`], whose homes the batch path computes four at a time with AVX2.
    /// Leave it `false` in any other implementation (it would send lookups to `MulXor`'s homes:
    /// wrong answers, though never out of bounds).
    #[doc(hidden)]
    const MUL_XOR: bool = false;
}

/// The index's default home hash, [`mul_xor`]: one multiply, one shift, one xor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MulXor;

impl KeyHash for MulXor {
    const MUL_XOR: bool = true;
    #[inline(always)]
    fn hash(key: u64) -> u64 {
        mul_xor(key)
    }
}

/// `fmix64` as a home hash (to compare chain lengths with, and for callers that want it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fmix64;

impl KeyHash for Fmix64 {
    #[inline(always)]
    fn hash(key: u64) -> u64 {
        hash(key)
    }
}

/// [`MulXor`]'s hash: `h = key * MUL` (wrapping), then `h ^ (h << 32)`. A bijection on u64
/// (an odd multiply, then an invertible xor-shift), so distinct keys never share a hash.
///
/// The home comes from the top bits, which this makes `hi32(h) ^ lo32(h)`: `hi32(h)` sees every
/// key bit, high ones included; `lo32(h)` mixes the low 32 key bits by a multiply, and xoring the
/// two (rather than adding) keeps keys that form a few arithmetic progressions (`slot << 40 | n`
/// over a few slots) off the few lattices that any multiply by a constant maps them to.
#[inline(always)]
pub fn mul_xor(key: u64) -> u64 {
    let h = key.wrapping_mul(MUL);
    h ^ (h << 32)
}

/// The largest slot count [`reduce`] maps onto: 2^32 − 4 (a whole number of cachelines below
/// 2^32, so that the slot count fits the 32-bit multiplies of the AVX2 path).
pub const MAX_SLOTS: usize = u32::MAX as usize - 3;

/// Maps a hash onto `0..slots` by its high bits: `(hash * slots) >> 64` (a widening multiply).
/// Monotone in `hash`; `slots` must be at most [`MAX_SLOTS`], which lets the AVX2 path compute
/// the same value from two 32x32-bit multiplies.
#[inline(always)]
pub fn reduce(hash: u64, slots: usize) -> usize {
    debug_assert!(slots <= MAX_SLOTS);
    ((u128::from(hash) * slots as u128) >> 64) as usize
}

/// Writes the homes of `keys[..4]` under [`MulXor`] in a table of `slots` slots to `out[..4]`:
/// `reduce(mul_xor(k), slots)`, with AVX2 where the caller has it enabled.
///
/// # Safety
/// `keys` and `out` must be valid for 4 reads and 4 writes; the CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn mul_xor_homes4(keys: *const u64, slots: u64, out: *mut u64) {
    use std::arch::x86_64::*;
    let m_lo = _mm256_set1_epi64x(MUL as u32 as i64);
    let m_hi = _mm256_set1_epi64x((MUL >> 32) as i64);
    // SAFETY: 4 u64 readable at `keys` (caller); an unaligned load has no alignment need.
    let k = unsafe { _mm256_loadu_si256(keys.cast()) };
    let h = avx2::mul64(k, m_lo, m_hi);
    // x = h ^ (h << 32); (x * slots) >> 64 with slots < 2^32 is
    // (hi32(x) * slots + (lo32(x) * slots >> 32)) >> 32, exactly (no sum overflows 64 bits).
    let x = _mm256_xor_si256(h, _mm256_slli_epi64::<32>(h));
    let s = _mm256_set1_epi64x(slots as i64);
    let lo = _mm256_srli_epi64::<32>(_mm256_mul_epu32(x, s));
    let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), s);
    let homes = _mm256_srli_epi64::<32>(_mm256_add_epi64(hi, lo));
    // SAFETY: 4 u64 writable at `out` (caller).
    unsafe { _mm256_storeu_si256(out.cast(), homes) };
}

/// Writes `hash(keys[i]) >> shift` to `out[i]`, scalar. `shift` must be below 64.
pub fn hash_shift_scalar(keys: &[u64], shift: u32, out: &mut [u64]) {
    assert_eq!(keys.len(), out.len(), "hash_shift_scalar: length mismatch");
    for (o, &k) in out.iter_mut().zip(keys) {
        *o = hash(k) >> shift;
    }
}

/// Writes `hash(keys[i]) >> shift` to `out[i]`, with AVX2 where the CPU has it.
/// `shift` must be below 64.
#[inline]
pub fn hash_shift(keys: &[u64], shift: u32, out: &mut [u64]) {
    assert_eq!(keys.len(), out.len(), "hash_shift: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { avx2::hash_shift(keys, shift, out) };
        return;
    }
    hash_shift_scalar(keys, shift, out);
}

/// Whether [`hash_shift`] uses the AVX2 path on this CPU (the index's lookups do not depend on
/// it: they hash each key as it enters the pipeline, with [`MulXor`]).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0 = not checked yet, 1 = no AVX2, 2 = AVX2. `EMBSTORE_NO_SIMD=1` forces the scalar path
    /// (to measure it).
    static STATE: AtomicU8 = AtomicU8::new(0);

    #[inline]
    pub(crate) fn available() -> bool {
        match STATE.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => {
                let off = std::env::var_os("EMBSTORE_NO_SIMD").is_some_and(|v| v != "0");
                let yes = !off && std::is_x86_feature_detected!("avx2");
                STATE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
        }
    }

    /// Low 64 bits of `a * b` for four lanes. AVX2 has no 64-bit multiply, so it is built from
    /// three 32x32->64 multiplies: lo*lo + ((hi*lo + lo*hi) << 32).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn mul64(a: __m256i, b_lo: __m256i, b_hi: __m256i) -> __m256i {
        let lo = _mm256_mul_epu32(a, b_lo);
        let cross1 = _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), b_lo);
        let cross2 = _mm256_mul_epu32(a, b_hi);
        let cross = _mm256_slli_epi64::<32>(_mm256_add_epi64(cross1, cross2));
        _mm256_add_epi64(lo, cross)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn fmix4(k: __m256i, c1: (__m256i, __m256i), c2: (__m256i, __m256i)) -> __m256i {
        let k = _mm256_xor_si256(k, _mm256_srli_epi64::<33>(k));
        let k = mul64(k, c1.0, c1.1);
        let k = _mm256_xor_si256(k, _mm256_srli_epi64::<33>(k));
        let k = mul64(k, c2.0, c2.1);
        _mm256_xor_si256(k, _mm256_srli_epi64::<33>(k))
    }

    /// # Safety
    /// The CPU must support AVX2; `keys` and `out` must have equal lengths.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn hash_shift(keys: &[u64], shift: u32, out: &mut [u64]) {
        let split = |c: u64| (_mm256_set1_epi64x(c as i64), _mm256_set1_epi64x((c >> 32) as i64));
        let (c1, c2) = (split(super::C1), split(super::C2));
        let count = _mm_cvtsi32_si128(shift as i32);
        let chunks = keys.len() / 4;
        for c in 0..chunks {
            // SAFETY: lanes 4c..4c+4 are in bounds of both slices (equal lengths, c < len/4);
            // unaligned loads and stores have no alignment requirement.
            unsafe {
                let k = _mm256_loadu_si256(keys.as_ptr().add(4 * c).cast());
                let h = _mm256_srl_epi64(fmix4(k, c1, c2), count);
                _mm256_storeu_si256(out.as_mut_ptr().add(4 * c).cast(), h);
            }
        }
        let done = chunks * 4;
        super::hash_shift_scalar(&keys[done..], shift, &mut out[done..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_bijection_on_structured_keys() {
        assert_eq!(hash(0), 0);
        assert_ne!(hash(1), 1);
        // Structured keys: their homes in a 2^20-slot table are spread, not clumped.
        let mut homes: Vec<u64> = (0..4096u64).map(|j| hash(j << 40) >> 44).collect();
        homes.sort_unstable();
        homes.dedup();
        assert!(homes.len() > 4000, "only {} distinct homes", homes.len());
    }

    #[test]
    fn mul_fold_spreads_structured_keys_and_reduce_is_in_range() {
        assert_eq!(mul_xor(0), 0);
        assert_eq!(mul_xor(1), MUL ^ (MUL << 32));
        for shift in [40, 44, 52] {
            let mut homes: Vec<usize> =
                (0..4096u64).map(|j| reduce(mul_xor(j << shift), 1 << 20)).collect();
            homes.sort_unstable();
            homes.dedup();
            assert!(homes.len() > 4000, "j << {shift}: only {} distinct homes", homes.len());
        }
        for slots in [1usize, 8, 1000, 1 << 20, 3 << 30, MAX_SLOTS] {
            for k in [0, 1, u64::MAX, 1 << 63, MUL] {
                assert!(reduce(mul_xor(k), slots) < slots);
            }
            assert_eq!(reduce(u64::MAX, slots), slots - 1);
            assert_eq!(reduce(0, slots), 0);
        }
    }

    #[test]
    fn avx2_homes_match_scalar() {
        #[cfg(target_arch = "x86_64")]
        {
            if !avx2::available() {
                eprintln!("skipped: no AVX2 on this CPU");
                return;
            }
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let keys: Vec<u64> = (0..4000u64)
                .map(|i| {
                    x = x.rotate_left(23).wrapping_mul(MUL) ^ i;
                    if i % 3 == 0 {
                        (i % 26) << 40 | i
                    } else {
                        x
                    }
                })
                .chain([0, u64::MAX, 1 << 63, 1])
                .collect();
            for slots in [8usize, 1004, 1 << 24, 150_736, MAX_SLOTS] {
                for c in keys.chunks_exact(4) {
                    let mut out = [0u64; 4];
                    // SAFETY: AVX2 is available (checked above); 4 keys and 4 outputs.
                    unsafe { mul_xor_homes4(c.as_ptr(), slots as u64, out.as_mut_ptr()) };
                    let want: Vec<u64> =
                        c.iter().map(|&k| reduce(mul_xor(k), slots) as u64).collect();
                    assert_eq!(&out[..], &want[..], "slots {slots}, keys {c:?}");
                }
            }
        }
    }

    #[test]
    fn simd_matches_scalar() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let keys: Vec<u64> = (0..1027)
            .map(|i| {
                x = x.rotate_left(17).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ i;
                x
            })
            .chain([0, u64::MAX, 1 << 63])
            .collect();
        for shift in [0, 1, 33, 40, 63] {
            let mut a = vec![0; keys.len()];
            let mut b = vec![0; keys.len()];
            hash_shift(&keys, shift, &mut a);
            hash_shift_scalar(&keys, shift, &mut b);
            assert_eq!(a, b, "shift {shift} (simd available: {})", simd_available());
        }
    }
}
