//! Initial row values: a pure function of (table seed, key, column).
//!
//! A row first touched on any machine gets the same value with no coordination: every column is
//! drawn from a counter-based generator (`fmix64` of the seed, key and column) rather than from a
//! stateful RNG, so the order in which rows are created does not matter.

use embstore_index::hash::hash as fmix64;

/// How a new row's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Initializer {
    /// All zeros.
    Zeros,
    /// Every value is `value`.
    Constant {
        /// The value.
        value: f32,
    },
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound (inclusive).
        low: f32,
        /// Upper bound (exclusive).
        high: f32,
    },
    /// Normal with `mean` and `std` (Box–Muller on two counter-based uniforms).
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation (≥ 0).
        std: f32,
    },
}

impl Default for Initializer {
    /// `Normal { mean: 0, std: 0.01 }`: small values, the usual start for recommender embeddings.
    fn default() -> Self {
        Self::Normal { mean: 0.0, std: 0.01 }
    }
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A uniform in `[0, 1)` with 53 random bits.
#[inline]
fn unit(base: u64, col: u64) -> f64 {
    let x = fmix64(base ^ col.wrapping_add(1).wrapping_mul(GOLDEN));
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl Initializer {
    /// Checks the parameters: finite, `low < high`, `std ≥ 0`.
    pub fn validate(&self) -> crate::Result<()> {
        let ok = match *self {
            Self::Zeros => true,
            Self::Constant { value } => value.is_finite(),
            Self::Uniform { low, high } => low.is_finite() && high.is_finite() && low < high,
            Self::Normal { mean, std } => mean.is_finite() && std.is_finite() && std >= 0.0,
        };
        if ok {
            Ok(())
        } else {
            Err(crate::Error::invalid(format!("invalid initializer: {self:?}")))
        }
    }

    /// Writes the initial values of `key`'s row into `out` (one value per column).
    pub fn fill(&self, seed: u64, key: u64, out: &mut [f32]) {
        let base = fmix64(key ^ fmix64(seed.wrapping_add(GOLDEN)));
        match *self {
            Self::Zeros => out.fill(0.0),
            Self::Constant { value } => out.fill(value),
            Self::Uniform { low, high } => {
                let (low, span) = (low as f64, high as f64 - low as f64);
                for (c, v) in out.iter_mut().enumerate() {
                    // Rounding to f32 can reach `high` when the span is tiny; clamp below it.
                    let x = (low + span * unit(base, c as u64)) as f32;
                    *v = if x >= high { low as f32 } else { x };
                }
            }
            Self::Normal { mean, std } => {
                let (mean, std) = (mean as f64, std as f64);
                for (pair, chunk) in out.chunks_mut(2).enumerate() {
                    let u1 = 1.0 - unit(base, 2 * pair as u64); // (0, 1]: ln is finite
                    let u2 = unit(base, 2 * pair as u64 + 1);
                    let r = (-2.0 * u1.ln()).sqrt();
                    let theta = std::f64::consts::TAU * u2;
                    chunk[0] = (mean + std * r * theta.cos()) as f32;
                    if let Some(v) = chunk.get_mut(1) {
                        *v = (mean + std * r * theta.sin()) as f32;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed_and_key() {
        let init = Initializer::Normal { mean: 0.0, std: 1.0 };
        let (mut a, mut b, mut c) = ([0f32; 7], [0f32; 7], [0f32; 7]);
        init.fill(1, 42, &mut a);
        init.fill(1, 42, &mut b);
        init.fill(2, 42, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn moments_are_right() {
        let n = 20_000;
        let mut row = [0f32; 8];
        let (mut sum, mut sq, mut lo, mut hi) = (0f64, 0f64, f32::MAX, f32::MIN);
        let normal = Initializer::Normal { mean: 1.0, std: 2.0 };
        let uniform = Initializer::Uniform { low: -0.5, high: 0.25 };
        for key in 0..n {
            normal.fill(7, key, &mut row);
            for &v in &row {
                sum += v as f64;
                sq += (v as f64 - 1.0).powi(2);
            }
            uniform.fill(7, key, &mut row);
            for &v in &row {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        let m = (n * 8) as f64;
        assert!((sum / m - 1.0).abs() < 0.03, "mean {}", sum / m);
        assert!(((sq / m).sqrt() - 2.0).abs() < 0.03, "std {}", (sq / m).sqrt());
        assert!((-0.5..-0.49).contains(&lo) && (0.24..0.25).contains(&hi), "{lo} {hi}");
    }

    #[test]
    fn validate_rejects_bad_parameters() {
        assert!(Initializer::Uniform { low: 1.0, high: 1.0 }.validate().is_err());
        assert!(Initializer::Normal { mean: 0.0, std: -1.0 }.validate().is_err());
        assert!(Initializer::Constant { value: f32::NAN }.validate().is_err());
        assert!(Initializer::default().validate().is_ok());
    }
}
