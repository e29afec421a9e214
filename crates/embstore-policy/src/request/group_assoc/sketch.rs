//! The admission sketch of [`super::GroupAssoc`]'s adaptive default: TinyLFU's count-min
//! sketch of 4-bit counters, counting only the keys of sets that have filled.

use crate::index::fmix64;

/// A count-min sketch of 4-bit counters (4 per key, conservative update), halved every
/// `10·C` additions so that it follows recent frequency (TinyLFU's sample and reset).
#[derive(Clone, Debug)]
pub(super) struct FreqSketch {
    words: Vec<u64>,
    /// A bit per set of the cache: its keys are counted (the set has been full, or always).
    filled: Vec<u64>,
    adds: u64,
    period: u64,
}

impl FreqSketch {
    /// About 4 counters per entry: `C/4` words of 16 counters, rounded up to a power of two.
    /// Counts the keys of all `nsets` sets `from_start`, else of each set once it has filled.
    pub(super) fn new(capacity: usize, nsets: usize, from_start: bool) -> Self {
        let n = (capacity / 4).max(8).next_power_of_two();
        let filled = vec![if from_start { u64::MAX } else { 0 }; nsets.div_ceil(64)];
        Self { words: vec![0; n], filled, adds: 0, period: 10 * capacity as u64 }
    }

    /// Whether any key has been counted since the last halving left something.
    #[cfg(test)]
    pub(super) fn counted_any(&self) -> bool {
        self.words.iter().any(|&w| w != 0)
    }

    pub(super) fn bytes(&self) -> usize {
        (self.words.capacity() + self.filled.capacity()) * 8
    }

    /// Whether the keys of set `s` are counted.
    #[inline]
    pub(super) fn counts(&self, s: usize) -> bool {
        self.filled[s / 64] & (1 << (s % 64)) != 0
    }

    /// Set `s` has been full: its keys are counted from now on.
    #[inline]
    pub(super) fn set_filled(&mut self, s: usize) {
        self.filled[s / 64] |= 1 << (s % 64);
    }

    /// The 4 counters of `key`: (word, bit shift).
    #[inline]
    pub(super) fn cells(&self, key: u64) -> [(usize, u32); 4] {
        let h1 = fmix64(key ^ 0x9e37_79b9_7f4a_7c15);
        let h2 = fmix64(h1) | 1;
        let mask = self.words.len() as u64 * 16 - 1; // 16 counters a word, a power of two
        std::array::from_fn(|i| {
            let c = h1.wrapping_add((i as u64).wrapping_mul(h2)) & mask;
            ((c >> 4) as usize, ((c & 15) * 4) as u32)
        })
    }

    #[inline]
    pub(super) fn get(&self, (w, sh): (usize, u32)) -> u8 {
        ((self.words[w] >> sh) & 15) as u8
    }

    pub(super) fn estimate(&self, key: u64) -> u8 {
        self.cells(key).into_iter().map(|c| self.get(c)).min().unwrap_or(0)
    }

    pub(super) fn add(&mut self, key: u64) {
        let cells = self.cells(key);
        let min = cells.iter().map(|&c| self.get(c)).min().unwrap_or(0);
        if min < 15 {
            for (w, sh) in cells {
                if self.get((w, sh)) == min {
                    self.words[w] += 1 << sh;
                }
            }
        }
        self.adds += 1;
        if self.adds >= self.period {
            self.adds = 0;
            for w in &mut self.words {
                *w = (*w >> 1) & 0x7777_7777_7777_7777;
            }
        }
    }
}
