//! Helpers shared by the integration tests that need them.

/// A small deterministic generator (xorshift64*), seeded per test (tests print the seed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` ids uniform in `0..range`.
    #[allow(dead_code)] // each test crate uses one of the two id makers
    pub fn ids(&mut self, n: usize, range: u64) -> Vec<u64> {
        (0..n).map(|_| self.next() % range).collect()
    }

    /// `n` ids skewed towards the low ones: a quarter uniform in `0..range`, the rest in the
    /// first tenth (a hot set and a long tail).
    #[allow(dead_code)]
    pub fn skewed_ids(&mut self, n: usize, range: u64) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let r = self.next();
                if r.is_multiple_of(4) {
                    r % range
                } else {
                    (r >> 8) % (range / 10)
                }
            })
            .collect()
    }
}
