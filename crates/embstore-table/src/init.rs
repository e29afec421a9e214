//! Initial row values: a pure function of (table seed, key, column).
//!
//! A row first touched on any machine gets the same value with no coordination: every column is
//! drawn from a counter-based generator (`fmix64` of the seed, key and column) rather than from a
//! stateful RNG, so the order in which rows are created does not matter.

use embstore_common::fmix64;

use crate::params::{self, Kinds};

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

/// Each initializer's parameters, in order, with their defaults: the one definition of their
/// names (bindings, table file, messages).
const PARAMS: &Kinds = &[
    ("zeros", &[]),
    ("constant", &[("value", 0.0)]),
    ("uniform", &[("low", -0.01), ("high", 0.01)]),
    ("normal", &[("mean", 0.0), ("std", 0.01)]),
];

/// How far from the mean a normal draw can land, in standard deviations: Box–Muller's radius
/// with the smallest uniform (2^-53) is √(2·53·ln 2) ≈ 8.58.
const NORMAL_MAX_SIGMAS: f64 = 8.6;

impl Initializer {
    /// Every initializer name, as the Python API spells it.
    pub const NAMES: [&'static str; 4] = [PARAMS[0].0, PARAMS[1].0, PARAMS[2].0, PARAMS[3].0];

    /// The initializer's name as the Python API spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Zeros => "zeros",
            Self::Constant { .. } => "constant",
            Self::Uniform { .. } => "uniform",
            Self::Normal { .. } => "normal",
        }
    }

    /// The parameters by name, in a fixed order.
    pub fn params(&self) -> Vec<(&'static str, f32)> {
        let values = match *self {
            Self::Zeros => vec![],
            Self::Constant { value } => vec![value],
            Self::Uniform { low, high } => vec![low, high],
            Self::Normal { mean, std } => vec![mean, std],
        };
        params::named(PARAMS, self.name(), values)
    }

    /// The initializer called `name` with the parameters `get` gives (`None`: the default);
    /// `given` names the parameters the caller passed, each of which must exist.
    pub fn from_params(
        name: &str,
        given: &[&str],
        get: impl Fn(&str) -> Option<f32>,
    ) -> crate::Result<Self> {
        let v = params::resolve("initializer", PARAMS, name, given, get)?;
        Ok(match name {
            "zeros" => Self::Zeros,
            "constant" => Self::Constant { value: v[0] },
            "uniform" => Self::Uniform { low: v[0], high: v[1] },
            _ => Self::Normal { mean: v[0], std: v[1] },
        })
    }

    /// Checks the parameters: finite, `low < high`, `std ≥ 0`, and every value it can draw
    /// finite in float32 (a normal's `|mean| + 8.6·std` within float32's range).
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |msg: String| Err(crate::Error::invalid(format!("{}: {msg}", self.name())));
        match *self {
            Self::Zeros => Ok(()),
            Self::Constant { value } if !value.is_finite() => {
                bad(format!("value must be finite, got {value}"))
            }
            Self::Uniform { low, high } if !(low.is_finite() && high.is_finite() && low < high) => {
                bad(format!("low and high must be finite with low < high, got {low} and {high}"))
            }
            Self::Normal { mean, std } if !(mean.is_finite() && std.is_finite() && std >= 0.0) => {
                bad(format!("mean must be finite and std finite and >= 0, got {mean} and {std}"))
            }
            Self::Normal { mean, std }
                if (mean as f64).abs() + NORMAL_MAX_SIGMAS * std as f64 > f32::MAX as f64 =>
            {
                bad(format!(
                    "|mean| + 8.6 * std must fit in float32 (draws would be infinite), got mean \
                     {mean} and std {std}"
                ))
            }
            _ => Ok(()),
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
        assert!(Initializer::Normal { mean: 0.0, std: 3e38 }.validate().is_err());
        assert!(Initializer::Normal { mean: 0.0, std: 3e37 }.validate().is_ok());
    }

    #[test]
    fn normal_at_the_largest_std_stays_finite() {
        let init = Initializer::Normal { mean: 0.0, std: 3.9e37 };
        assert!(init.validate().is_ok());
        let mut row = [0f32; 64];
        for key in 0..10_000 {
            init.fill(1, key, &mut row);
            assert!(row.iter().all(|v| v.is_finite()));
        }
    }
}
