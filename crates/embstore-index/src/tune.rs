//! How a table's batch pipeline prefetches, and how the table chooses it: [`BatchTuning`], the
//! candidates, and the timings that decide (see [`crate::batch`] for the pipeline itself and why
//! the choice is not a constant).

use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Mutex;

/// Lookups in flight in [`NeighborHash::get_batch`](crate::NeighborHash::get_batch) before a table has chosen its own
/// [`BatchTuning`] (and in small tables): how many keys ahead the pipeline prefetches.
pub const DEFAULT_RING: usize = 64;

/// How [`NeighborHash::get_batch`](crate::NeighborHash::get_batch) runs its pipeline: how many lookups it keeps in flight, and
/// whether its prefetches fill L2 only (`_MM_HINT_T1`) or every level (`_MM_HINT_T0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTuning {
    /// Lookups in flight (keys prefetched ahead of the one examined).
    pub ring: usize,
    /// Prefetch into L2 only (else into L1 too).
    pub prefetch_l2: bool,
}

impl BatchTuning {
    /// What a table times and chooses from.
    pub const CANDIDATES: [BatchTuning; 4] = [
        BatchTuning { ring: 64, prefetch_l2: false },
        BatchTuning { ring: 128, prefetch_l2: false },
        BatchTuning { ring: 64, prefetch_l2: true },
        BatchTuning { ring: 128, prefetch_l2: true },
    ];
    /// The pipeline of small tables and of batches before a table has chosen.
    pub const DEFAULT: BatchTuning = BatchTuning { ring: DEFAULT_RING, prefetch_l2: false };
    pub(crate) const DEFAULT_INDEX: usize = 0;
}

const _: () = assert!(
    BatchTuning::CANDIDATES[BatchTuning::DEFAULT_INDEX].ring == BatchTuning::DEFAULT.ring
        && !BatchTuning::CANDIDATES[BatchTuning::DEFAULT_INDEX].prefetch_l2
);

/// Tables of at least this many slots (1 MiB of buckets) choose their [`BatchTuning`]; smaller
/// ones sit in the caches, where the choice barely matters and the timing would be noise.
pub const TUNE_FROM_SLOTS: usize = 1 << 16;
/// Only batches of at least this many keys are timed (a shorter one is mostly fixed cost).
pub const TUNE_MIN_KEYS: usize = 256;
/// Timed batches per candidate before a table chooses; the first round is discarded (warm-up),
/// the fastest of the rest decides (noise on a shared machine only ever adds time, so the
/// fastest of several short batches is the steadiest estimate of a candidate's speed).
pub const TUNE_ROUNDS: usize = 12;

/// Whether tables choose their [`BatchTuning`]: yes unless `EMBSTORE_BATCH_TUNING=off` (read
/// once per process), which keeps every table on [`BatchTuning::DEFAULT`] (to measure what the
/// choice gains, or to rule it out).
pub(crate) fn tuning_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("EMBSTORE_BATCH_TUNING").is_none_or(|v| v != "off"))
}

/// Once a table has chosen, one batch in this many (of [`TUNE_MIN_KEYS`] keys or more) runs
/// half with the choice and half with another candidate, both timed: at most a few tenths of a
/// per cent of the batches' time, and a choice that follows the machine and the workload (a
/// choice made during a burst of noise, a table whose queries turn from uniform to skewed).
pub const EXPLORE_EVERY: u64 = 64;
/// Paired ratios (other candidate / chosen, time per key) kept per candidate.
pub const EXPLORE_WINDOW: usize = 9;
/// A candidate whose median paired ratio falls below this replaces the choice.
pub const SWITCH_BELOW: f64 = 0.93;

/// A table's choice of [`BatchTuning`], and the timings that lead to it.
#[derive(Debug, Default)]
pub(crate) struct Tuner {
    /// 0 while choosing, else 1 + the index of the chosen candidate.
    pub(crate) chosen: AtomicU8,
    /// Batches since the choice that could be timed (of `TUNE_MIN_KEYS` keys or more).
    pub(crate) batches: AtomicU64,
    pub(crate) tuning: Mutex<Timings>,
}

/// Nanoseconds per key of each candidate's timed batches, taken in turn; after the choice, the
/// paired ratios of the explored candidates.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    pub(crate) taken: usize,
    ns: [[f64; TUNE_ROUNDS]; BatchTuning::CANDIDATES.len()],
    pub(crate) explored: usize,
    ratios: [[f64; EXPLORE_WINDOW]; BatchTuning::CANDIDATES.len()],
    noted: [usize; BatchTuning::CANDIDATES.len()],
}

impl Timings {
    /// Records the batch just timed (candidate `taken % CANDIDATES`); returns the fastest
    /// candidate once every one has [`TUNE_ROUNDS`] timings.
    pub(crate) fn record(&mut self, ns_per_key: f64) -> Option<usize> {
        let n = BatchTuning::CANDIDATES.len();
        self.ns[self.taken % n][self.taken / n] = ns_per_key;
        self.taken += 1;
        if self.taken < n * TUNE_ROUNDS {
            return None;
        }
        // Round 0 warms up.
        let fastest = |xs: &[f64; TUNE_ROUNDS]| xs[1..].iter().copied().fold(f64::MAX, f64::min);
        (0..n).min_by(|&a, &b| fastest(&self.ns[a]).total_cmp(&fastest(&self.ns[b])))
    }

    /// Notes a paired ratio of candidate `c` against the choice; true (and every window
    /// emptied, their ratios being against the old choice) if `c` is to replace it.
    pub(crate) fn note_ratio(&mut self, c: usize, ratio: f64) -> bool {
        self.ratios[c][self.noted[c] % EXPLORE_WINDOW] = ratio;
        self.noted[c] += 1;
        if self.noted[c] < EXPLORE_WINDOW {
            return false;
        }
        let mut w = self.ratios[c];
        w.sort_by(f64::total_cmp);
        if w[EXPLORE_WINDOW / 2] >= SWITCH_BELOW {
            return false;
        }
        self.noted = Default::default();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_choice_is_the_fastest_after_the_warm_up_round() {
        let mut t = Timings::default();
        let n = BatchTuning::CANDIDATES.len();
        let mut chosen = None;
        for i in 0..n * TUNE_ROUNDS {
            let (v, round) = (i % n, i / n);
            // Candidate 2 is fastest except in round 0 (discarded), where it is slowest.
            let ns = match (v, round) {
                (2, 0) => 100.0,
                (2, _) => 5.0,
                _ => 6.0 + v as f64,
            };
            chosen = t.record(ns);
            assert_eq!(chosen.is_some(), i + 1 == n * TUNE_ROUNDS);
        }
        assert_eq!(chosen, Some(2));
    }

    #[test]
    fn a_candidate_replaces_the_choice_only_on_the_median_of_a_full_window() {
        let mut t = Timings::default();
        // A full window, most ratios above the threshold: no switch.
        for i in 0..EXPLORE_WINDOW {
            let r = if i < EXPLORE_WINDOW / 2 { 0.5 } else { 0.99 };
            assert!(!t.note_ratio(1, r));
        }
        // Below the threshold in most of the window: a switch, and every window empties.
        let mut pushed = 0;
        loop {
            assert!(!t.note_ratio(3, 1.2));
            pushed += 1;
            if t.note_ratio(1, SWITCH_BELOW - 0.05) {
                break;
            }
            assert!(pushed < EXPLORE_WINDOW, "no switch after a window of fast pairs");
        }
        // The switch came once the fast pairs were most of the window.
        assert_eq!(pushed, EXPLORE_WINDOW / 2 + 1);
        assert_eq!(t.noted, [0; BatchTuning::CANDIDATES.len()]);
    }
}
