//! SplitMix64 (Steele, Lea and Flood 2014): a tiny, fast, seedable generator whose output is
//! fixed by its seed on every platform and version, so traces, benchmarks and randomised tests
//! print a seed and replay exactly. Not for anything that must be unpredictable.

/// The golden-ratio increment of SplitMix64's state.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A SplitMix64 stream: [`SplitMix64::new`] from a seed, then [`SplitMix64::next_u64`].
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller, one draw of the pair).
    pub fn normal(&mut self) -> f64 {
        let r = (-2.0 * (1.0 - self.next_f64()).ln()).sqrt();
        r * (std::f64::consts::TAU * self.next_f64()).cos()
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-32 for n < 2^32).
    /// Returns 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// 64 bits no one can predict or repeat (identities: a store's, a server instance's): from
/// the OS (`/dev/urandom`), else from the standard library's randomly keyed hasher over the
/// time, the process and a counter.
pub fn unpredictable_u64() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn known_stream_from_seed_zero() {
        // The reference outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn same_seed_same_stream_and_bounded_draws() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let x = a.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert!(a.below(10) < 10);
            assert!(a.normal().is_finite());
            b.next_f64();
            b.below(10);
            b.normal();
        }
        assert_eq!(a.below(0), 0);
    }
}
