//! A count-min sketch of id frequencies, for admission: a new id gets a row only once it has
//! been seen `min_count` times. Counters are atomics, so lookups from many threads count
//! without a lock; the estimate never undercounts, and overcounts by at most `2N/width` with
//! probability `1 − 2^-depth` (Cormode & Muthukrishnan).

use std::sync::atomic::{AtomicU32, Ordering};

use embstore_common::fmix64;

const DEPTH: usize = 4;

/// A 4-row count-min sketch with a power-of-two width.
#[derive(Debug)]
pub(crate) struct CountMin {
    mask: u64,
    counters: Box<[AtomicU32]>,
}

impl CountMin {
    /// A sketch with `width` counters per row (rounded up to a power of two, at least 1024).
    pub(crate) fn new(width: usize) -> Self {
        let width = width.max(1024).next_power_of_two();
        let counters = (0..width * DEPTH).map(|_| AtomicU32::new(0)).collect();
        Self { mask: width as u64 - 1, counters }
    }

    #[inline]
    fn cells(&self, key: u64) -> [usize; DEPTH] {
        let h = fmix64(key ^ 0x5bd1_e995_2545_f491);
        let (a, b) = (h, (h >> 32) | 1);
        std::array::from_fn(|i| {
            let col = a.wrapping_add((i as u64).wrapping_mul(b)) & self.mask;
            i * (self.mask as usize + 1) + col as usize
        })
    }

    /// Counts one sighting of `key` and returns its estimated count, this one included.
    pub(crate) fn increment(&self, key: u64) -> u32 {
        self.cells(key)
            .iter()
            .map(|&c| self.counters[c].fetch_add(1, Ordering::Relaxed).saturating_add(1))
            .min()
            .unwrap_or(0)
    }

    /// The estimated count of `key`.
    pub(crate) fn estimate(&self, key: u64) -> u32 {
        self.cells(key).iter().map(|&c| self.counters[c].load(Ordering::Relaxed)).min().unwrap_or(0)
    }

    pub(crate) fn clear(&self) {
        self.counters.iter().for_each(|c| c.store(0, Ordering::Relaxed));
    }

    pub(crate) fn bytes(&self) -> usize {
        self.counters.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_undercounts_and_rarely_overcounts() {
        let s = CountMin::new(1 << 12);
        for k in 0..1000u64 {
            for _ in 0..(k % 5) {
                s.increment(k);
            }
        }
        let mut over = 0;
        for k in 0..1000u64 {
            let e = s.estimate(k);
            assert!(e >= (k % 5) as u32);
            over += (e > (k % 5) as u32) as u32;
        }
        assert!(over < 20, "{over} overcounts");
        assert_eq!(s.increment(5000), s.estimate(5000));
    }
}
