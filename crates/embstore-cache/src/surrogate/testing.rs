//! Helpers of the surrogate unit tests: random rows, sparse ids and a small build.

use super::*;

pub(super) fn gaussian(seed: u64, n: usize, dim: usize) -> Vec<f32> {
    let mut rng = crate::trace::SplitMix64::new(seed);
    (0..n * dim).map(|_| rng.normal() as f32).collect()
}

/// Descending, non-contiguous ids, so `build` has to sort them.
pub(super) fn ids(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| 3 * (n as u64 - i) + 1).collect()
}

pub(super) fn sample() -> Surrogates {
    let cfg = SurrogateConfig { metric: Metric::L2, max_dist: 1.2, ..Default::default() };
    let counts: Vec<u64> = (0..40).map(|i| i % 7).collect();
    build(&ids(40), &gaussian(5, 40, 6), 6, Some(&counts), &cfg, 42).unwrap()
}
