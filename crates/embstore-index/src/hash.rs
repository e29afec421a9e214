//! The key hash: MurmurHash3's 64-bit finaliser (`fmix64`, from `embstore-common`), scalar
//! and AVX2.
//!
//! Real feature ids are structured: a slot prefix in the high bits and a counter in the low
//! bits (`slot << 40 | n`). A hash that only multiplies (or multiplies by an even constant, as
//! the published NeighborHash does) maps such keys onto few homes. `fmix64` folds the high half
//! into the low half before each odd multiply, so every input bit reaches every output bit; it
//! is a bijection on u64, so distinct keys never collide on the full hash. The table takes its
//! home bucket from the *high* bits of the hash (`hash >> (64 - log2(slots))`).
//!
//! The batch path hashes four keys per instruction with AVX2 when the CPU has it (checked once
//! at run time); the scalar path is the fallback everywhere else, and both are tested against
//! each other.

use embstore_common::hash::{FMIX64_C1 as C1, FMIX64_C2 as C2};

/// Hashes one key (MurmurHash3 `fmix64`): the shared hash of `embstore-common`, which the
/// AVX2 path below must match bit for bit.
pub use embstore_common::fmix64 as hash;

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

/// Whether [`hash_shift`] uses the AVX2 path on this CPU.
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0 = not checked yet, 1 = no AVX2, 2 = AVX2. `EMBSTORE_NO_SIMD=1` forces the scalar path
    /// (to measure it).
    static STATE: AtomicU8 = AtomicU8::new(0);

    #[inline]
    pub(super) fn available() -> bool {
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
    fn mul64(a: __m256i, b_lo: __m256i, b_hi: __m256i) -> __m256i {
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
