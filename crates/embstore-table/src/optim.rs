//! Server-side sparse optimizers: one step per unique id, on that row only.
//!
//! Each optimizer keeps its state in the row (`state_dim` floats next to the values) and follows
//! the PyTorch formula it names, in f32, so that a row trained here matches the same row trained
//! with `nn.Embedding(sparse=True)` and the torch optimizer. Rows that a batch does not touch are
//! not stepped ("lazy" updates, as torch's sparse Adagrad and `SparseAdam` do).
//!
//! | optimizer | state per row | formula |
//! |---|---|---|
//! | SGD | none | `w -= lr·g` |
//! | Adagrad | `D` (sum of g²) | `s += g²; w -= lr·g/(√s + eps)` |
//! | row-wise Adagrad | 1 (mean of g²) | `s += mean(g²); w -= lr·g/(√s + eps)` |
//! | Adam | `2D` (m, v) | torch `Adam`; `t` is the table's step counter |
//! | FTRL-proximal | `2D` (z, n) | McMahan et al. 2013, per coordinate |
//! | Delta | none | `w += g`: the pushed values are added as they are (a parameter server's
//! associative updates: deltas from many workers commute) |

use crate::params::{self, Kinds};

/// An optimizer and its hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Plain SGD: `w -= lr·g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Adagrad as `torch.optim.Adagrad` (no lr decay, no weight decay).
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Added to `√s` in the denominator.
        eps: f32,
        /// Initial value of the accumulator `s`.
        initial_accumulator_value: f32,
    },
    /// Row-wise Adagrad (FBGEMM/TorchRec): one accumulator per row, the mean of `g²`.
    RowWiseAdagrad {
        /// Learning rate.
        lr: f32,
        /// Added to `√s` in the denominator.
        eps: f32,
        /// Initial value of the accumulator.
        initial_accumulator_value: f32,
    },
    /// Adam as `torch.optim.Adam` (no weight decay, no amsgrad), applied lazily to the rows in
    /// the batch. The bias correction uses the table's step counter, one per
    /// `apply_gradients` call, as `torch.optim.SparseAdam` does.
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to the denominator.
        eps: f32,
    },
    /// FTRL-proximal (McMahan et al., "Ad click prediction: a view from the trenches", 2013).
    Ftrl {
        /// Learning rate `alpha`.
        lr: f32,
        /// Smoothing `beta` of the per-coordinate rate.
        beta: f32,
        /// L1 strength (sparsity).
        l1: f32,
        /// L2 strength.
        l2: f32,
        /// Initial value of `n`, the sum of `g²`.
        initial_accumulator_value: f32,
    },
    /// Additive updates: `w += g`, no learning rate and no state. The "gradient" a caller
    /// pushes is the change to make; pushes from many workers commute (up to float rounding),
    /// as a parameter server's associative updates must (`Ps`).
    Delta,
}

impl Default for Optimizer {
    /// `Sgd { lr: 0.01 }`.
    fn default() -> Self {
        Self::Sgd { lr: 0.01 }
    }
}

/// The hyper-parameters of each optimizer, in order, with their defaults (the Python classes'
/// defaults). The one definition of their names: the bindings, the table file and error
/// messages all go through [`Optimizer::params`] and [`Optimizer::from_params`].
const PARAMS: &Kinds = &[
    ("sgd", &[("lr", 0.01)]),
    ("adagrad", &[("lr", 0.01), ("eps", 1e-10), ("initial_accumulator_value", 0.0)]),
    ("rowwise_adagrad", &[("lr", 0.01), ("eps", 1e-8), ("initial_accumulator_value", 0.0)]),
    ("adam", &[("lr", 0.001), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8)]),
    (
        "ftrl",
        &[
            ("lr", 0.05),
            ("beta", 1.0),
            ("l1", 0.0),
            ("l2", 0.0),
            ("initial_accumulator_value", 0.0),
        ],
    ),
    ("delta", &[]),
];

/// The smallest learning rate FTRL accepts: it divides by `lr`, and `1 / lr` must be a normal
/// float32.
const FTRL_MIN_LR: f32 = 1.0 / (f32::MAX / 2.0);

impl Optimizer {
    /// Every optimizer name, as the Python API spells it.
    pub const NAMES: [&'static str; 6] =
        [PARAMS[0].0, PARAMS[1].0, PARAMS[2].0, PARAMS[3].0, PARAMS[4].0, PARAMS[5].0];

    /// The optimizer's name as the Python API spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::Adagrad { .. } => "adagrad",
            Self::RowWiseAdagrad { .. } => "rowwise_adagrad",
            Self::Adam { .. } => "adam",
            Self::Ftrl { .. } => "ftrl",
            Self::Delta => "delta",
        }
    }

    /// The hyper-parameters by name, in a fixed order (`lr` first).
    pub fn params(&self) -> Vec<(&'static str, f32)> {
        let values: Vec<f32> = match *self {
            Self::Sgd { lr } => vec![lr],
            Self::Adagrad { lr, eps, initial_accumulator_value: a }
            | Self::RowWiseAdagrad { lr, eps, initial_accumulator_value: a } => vec![lr, eps, a],
            Self::Adam { lr, beta1, beta2, eps } => vec![lr, beta1, beta2, eps],
            Self::Ftrl { lr, beta, l1, l2, initial_accumulator_value: a } => {
                vec![lr, beta, l1, l2, a]
            }
            Self::Delta => vec![],
        };
        params::named(PARAMS, self.name(), values)
    }

    /// The optimizer called `name` with the hyper-parameters `get` gives (by name; `None`: the
    /// default). Fails on an unknown name, an unknown parameter in `given` (the names the caller
    /// passed, checked when not empty) or a bad value; does not validate the values otherwise
    /// (see [`Optimizer::validate`]).
    pub fn from_params(
        name: &str,
        given: &[&str],
        get: impl Fn(&str) -> Option<f32>,
    ) -> crate::Result<Self> {
        let v = params::resolve("optimizer", PARAMS, name, given, get)?;
        Ok(match name {
            "sgd" => Self::Sgd { lr: v[0] },
            "adagrad" => Self::Adagrad { lr: v[0], eps: v[1], initial_accumulator_value: v[2] },
            "rowwise_adagrad" => {
                Self::RowWiseAdagrad { lr: v[0], eps: v[1], initial_accumulator_value: v[2] }
            }
            "adam" => Self::Adam { lr: v[0], beta1: v[1], beta2: v[2], eps: v[3] },
            "delta" => Self::Delta,
            _ => Self::Ftrl {
                lr: v[0],
                beta: v[1],
                l1: v[2],
                l2: v[3],
                initial_accumulator_value: v[4],
            },
        })
    }

    /// The configured learning rate (1 for [`Optimizer::Delta`], which has none: it adds what
    /// it is given).
    pub fn lr(&self) -> f32 {
        match *self {
            Self::Delta => 1.0,
            Self::Sgd { lr }
            | Self::Adagrad { lr, .. }
            | Self::RowWiseAdagrad { lr, .. }
            | Self::Adam { lr, .. }
            | Self::Ftrl { lr, .. } => lr,
        }
    }

    /// Floats of optimizer state per row for rows of `dim` values.
    pub fn state_dim(&self, dim: usize) -> usize {
        match self {
            Self::Sgd { .. } | Self::Delta => 0,
            Self::Adagrad { .. } => dim,
            Self::RowWiseAdagrad { .. } => 1,
            Self::Adam { .. } | Self::Ftrl { .. } => 2 * dim,
        }
    }

    /// Checks a learning rate for this optimizer (the configured one or a per-call one):
    /// finite and `≥ 0`; FTRL divides by it, so there it must be at least `2 / f32::MAX`.
    pub fn validate_lr(&self, lr: f32) -> crate::Result<()> {
        let ok = match self {
            Self::Ftrl { .. } => lr.is_finite() && lr >= FTRL_MIN_LR,
            Self::Delta => lr == 1.0,
            _ => lr.is_finite() && lr >= 0.0,
        };
        if ok {
            return Ok(());
        }
        let need = match self {
            Self::Ftrl { .. } => "finite and > 0 (ftrl divides by it)",
            Self::Delta => "1 (delta adds the values it is given; it has no learning rate)",
            _ => "finite and >= 0",
        };
        Err(crate::Error::invalid(format!("{}: lr must be {need}, got {lr}", self.name())))
    }

    /// Checks the hyper-parameters; the message names the optimizer, the field and the value.
    pub fn validate(&self) -> crate::Result<()> {
        self.validate_lr(self.lr())?;
        let bad = |field: &str, need: &str, value: f32| {
            Err(crate::Error::invalid(format!(
                "{}: {field} must be {need}, got {value}",
                self.name()
            )))
        };
        for (field, value) in self.params().into_iter().skip(1) {
            let ok = match field {
                "eps" => value.is_finite() && value > 0.0,
                "beta1" | "beta2" => (0.0..1.0).contains(&value),
                _ => value.is_finite() && value >= 0.0,
            };
            if !ok {
                let need = match field {
                    "eps" => "finite and > 0",
                    "beta1" | "beta2" => "in [0, 1)",
                    _ => "finite and >= 0",
                };
                return bad(field, need, value);
            }
        }
        Ok(())
    }

    /// Writes the state of a new row.
    pub fn init_state(&self, state: &mut [f32]) {
        match *self {
            Self::Sgd { .. } | Self::Adam { .. } | Self::Delta => state.fill(0.0),
            Self::Adagrad { initial_accumulator_value: a, .. }
            | Self::RowWiseAdagrad { initial_accumulator_value: a, .. } => state.fill(a),
            Self::Ftrl { initial_accumulator_value: a, .. } => {
                let (z, n) = state.split_at_mut(state.len() / 2);
                z.fill(0.0);
                n.fill(a);
            }
        }
    }

    /// The per-call part of a step: the learning rate and `t` (the table's step, 1-based;
    /// Adam's bias correction, computed here once per call rather than once per row).
    pub fn prepare(&self, lr: f32, t: u64) -> Step {
        let (mut bc1, mut bc2_sqrt) = (1.0, 1.0);
        if let Self::Adam { beta1, beta2, .. } = *self {
            // powf, not powi: the step counter may pass 2^31 (i32) on a long-lived table.
            let t = t.max(1) as f64;
            bc1 = 1.0 - (beta1 as f64).powf(t);
            bc2_sqrt = (1.0 - (beta2 as f64).powf(t)).sqrt();
        }
        Step {
            opt: *self,
            lr,
            adam_step_size: (lr as f64 / bc1) as f32,
            adam_bc2_sqrt: bc2_sqrt as f32,
        }
    }

    /// One step on one row (see [`Step::apply`]); `lr` is this call's learning rate and `t`
    /// the table's step (1-based). Returns false, leaving the row as it was, when the step
    /// would make a value or the state non-finite.
    pub fn step(&self, w: &mut [f32], s: &mut [f32], g: &[f32], lr: f32, t: u64) -> bool {
        self.prepare(lr, t).apply(w, s, g, &mut Vec::new())
    }
}

/// One call's step of an [`Optimizer`] (see [`Optimizer::prepare`]).
#[derive(Clone, Copy, Debug)]
pub struct Step {
    opt: Optimizer,
    lr: f32,
    adam_step_size: f32,
    adam_bc2_sqrt: f32,
}

/// The largest absolute bit pattern in `xs` (NaN and infinity sort above every finite value).
/// An integer max vectorises; `f32::max` does not.
#[inline]
pub(crate) fn max_abs_bits(xs: &[f32]) -> u32 {
    xs.iter().map(|x| x.to_bits() & 0x7fff_ffff).max().unwrap_or(0)
}

impl Step {
    /// Steps one row in place: `w` its values, `s` its state, `g` its (summed) gradient.
    /// Nothing non-finite is ever written: the row is saved to `scratch` first and restored,
    /// and false returned, when the step would leave a NaN or infinity in `w` or `s` (a
    /// gradient whose square overflows, an accumulator at the edge of float32's range).
    #[inline]
    pub fn apply(&self, w: &mut [f32], s: &mut [f32], g: &[f32], scratch: &mut Vec<f32>) -> bool {
        scratch.clear();
        scratch.extend_from_slice(w);
        scratch.extend_from_slice(s);
        self.apply_unchecked(w, s, g);
        if max_abs_bits(w).max(max_abs_bits(s)) < f32::INFINITY.to_bits() {
            return true;
        }
        let (old_w, old_s) = scratch.split_at(w.len());
        w.copy_from_slice(old_w);
        s.copy_from_slice(old_s);
        false
    }

    #[inline]
    fn apply_unchecked(&self, w: &mut [f32], s: &mut [f32], g: &[f32]) {
        debug_assert_eq!(w.len(), g.len());
        let lr = self.lr;
        match self.opt {
            Optimizer::Sgd { .. } => {
                for (w, &g) in w.iter_mut().zip(g) {
                    *w += -lr * g;
                }
            }
            Optimizer::Delta => {
                for (w, &g) in w.iter_mut().zip(g) {
                    *w += g;
                }
            }
            Optimizer::Adagrad { eps, .. } => {
                for ((w, s), &g) in w.iter_mut().zip(s.iter_mut()).zip(g) {
                    *s += g * g;
                    *w += -lr * (g / (s.sqrt() + eps));
                }
            }
            Optimizer::RowWiseAdagrad { eps, .. } => {
                let mean_sq = g.iter().map(|g| g * g).sum::<f32>() / g.len() as f32;
                s[0] += mean_sq;
                let rate = lr / (s[0].sqrt() + eps);
                for (w, &g) in w.iter_mut().zip(g) {
                    *w += -rate * g;
                }
            }
            Optimizer::Adam { beta1, beta2, eps, .. } => {
                let (step_size, bc2_sqrt) = (self.adam_step_size, self.adam_bc2_sqrt);
                let (m, v) = s.split_at_mut(w.len());
                for (((w, m), v), &g) in w.iter_mut().zip(m).zip(v).zip(g) {
                    *m += (1.0 - beta1) * (g - *m);
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    let denom = v.sqrt() / bc2_sqrt + eps;
                    *w += -step_size * (*m / denom);
                }
            }
            Optimizer::Ftrl { beta, l1, l2, .. } => {
                let (z, n) = s.split_at_mut(w.len());
                for (((w, z), n), &g) in w.iter_mut().zip(z).zip(n).zip(g) {
                    let n_new = *n + g * g;
                    let sigma = (n_new.sqrt() - n.sqrt()) / lr;
                    *z += g - sigma * *w;
                    *n = n_new;
                    *w = if z.abs() <= l1 {
                        0.0
                    } else {
                        -(*z - z.signum() * l1) / ((beta + n_new.sqrt()) / lr + l2)
                    };
                }
            }
        }
    }
}

impl std::fmt::Display for Optimizer {
    /// `adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let params: Vec<String> = self.params().iter().map(|(n, v)| format!("{n}={v:?}")).collect();
        write!(f, "{}({})", self.name(), params.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_adds_what_it_is_given_and_has_no_learning_rate() {
        let opt = Optimizer::Delta;
        let (mut w, mut s) = ([1.0f32, -1.0], [0.0f32; 0]);
        assert!(opt.step(&mut w, &mut s, &[0.25, 3.0], 1.0, 1));
        assert_eq!(w, [1.25, 2.0]);
        assert_eq!(opt.state_dim(8), 0);
        assert!(opt.validate_lr(0.5).is_err());
        assert_eq!(Optimizer::from_params("delta", &[], |_| None).unwrap(), Optimizer::Delta);
        assert!(Optimizer::from_params("delta", &["lr"], |_| Some(1.0)).is_err());
        assert_eq!(opt.to_string(), "delta()");
    }

    #[test]
    fn adagrad_by_hand() {
        let opt = Optimizer::Adagrad { lr: 0.5, eps: 1e-10, initial_accumulator_value: 0.0 };
        let (mut w, mut s) = ([1.0f32, -1.0], [0.0f32; 2]);
        opt.step(&mut w, &mut s, &[2.0, 0.0], 0.5, 1);
        assert_eq!(s, [4.0, 0.0]);
        assert!((w[0] - 0.5).abs() < 1e-6 && w[1] == -1.0, "{w:?}");
    }

    #[test]
    fn rowwise_adagrad_by_hand() {
        let opt = Optimizer::RowWiseAdagrad { lr: 1.0, eps: 0.0, initial_accumulator_value: 0.0 };
        let (mut w, mut s) = ([0.0f32, 0.0], [0.0f32]);
        opt.step(&mut w, &mut s, &[3.0, 1.0], 1.0, 1);
        assert_eq!(s[0], 5.0);
        let r = 1.0 / 5f32.sqrt();
        assert!((w[0] + 3.0 * r).abs() < 1e-6 && (w[1] + r).abs() < 1e-6);
    }

    #[test]
    fn adam_first_step_moves_by_lr() {
        // With bias correction the first step is lr·g/|g| (up to eps), whatever |g| is.
        let opt = Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let (mut w, mut s) = ([0.0f32, 0.0], [0.0f32; 4]);
        opt.step(&mut w, &mut s, &[3.0, -0.01], 0.1, 1);
        assert!((w[0] + 0.1).abs() < 1e-5 && (w[1] - 0.1).abs() < 1e-4, "{w:?}");
    }

    #[test]
    fn ftrl_l1_gives_exact_zeros() {
        let opt = Optimizer::Ftrl {
            lr: 0.1,
            beta: 1.0,
            l1: 10.0,
            l2: 0.0,
            initial_accumulator_value: 0.0,
        };
        let (mut w, mut s) = ([0.3f32], [0.0f32; 2]);
        opt.step(&mut w, &mut s, &[0.5], 0.1, 1);
        assert_eq!(w[0], 0.0);
    }

    #[test]
    fn validate_rejects_bad_hyper_parameters() {
        assert!(Optimizer::Sgd { lr: f32::NAN }.validate().is_err());
        assert!(Optimizer::Adam { lr: 0.1, beta1: 1.0, beta2: 0.9, eps: 1e-8 }.validate().is_err());
        assert!(Optimizer::Adagrad { lr: 0.1, eps: 0.0, initial_accumulator_value: 0.0 }
            .validate()
            .is_err());
        assert!(Optimizer::default().validate().is_ok());
    }

    #[test]
    fn adam_step_counter_past_i32_stays_finite() {
        let opt = Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let (mut w, mut s) = ([0.5f32], [0.0f32; 2]);
        assert!(opt.step(&mut w, &mut s, &[1.0], 0.1, (1u64 << 31) + 5));
        // Bias corrections are 1 by then: m = 0.1, v = 0.001, w -= 0.1 · m / √v.
        let want = 0.5 - 0.1 * 0.1 / 0.001f32.sqrt();
        assert!((w[0] - want).abs() < 1e-4, "{w:?} vs {want}");
    }

    #[test]
    fn ftrl_zero_lr_is_refused() {
        let opt = Optimizer::Ftrl {
            lr: 0.1,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
            initial_accumulator_value: 0.0,
        };
        assert!(opt.validate_lr(0.0).is_err());
        assert!(opt.validate_lr(1e-39).is_err());
        assert!(opt.validate_lr(1e-3).is_ok());
        assert!(Optimizer::Sgd { lr: 0.1 }.validate_lr(0.0).is_ok());
    }

    #[test]
    fn overflowing_square_leaves_row_unchanged() {
        for opt in [
            Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 },
            Optimizer::RowWiseAdagrad { lr: 0.1, eps: 1e-8, initial_accumulator_value: 0.0 },
            Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            Optimizer::Ftrl {
                lr: 0.1,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
                initial_accumulator_value: 0.0,
            },
        ] {
            let mut w = [0.25f32, -0.5];
            let mut s = vec![0.5f32; opt.state_dim(2)];
            let (w0, s0) = (w, s.clone());
            assert!(!opt.step(&mut w, &mut s, &[1e30, 1.0], 0.1, 1), "{opt}");
            assert_eq!((w, s), (w0, s0), "{opt}");
        }
    }

    #[test]
    fn params_round_trip_and_name_bad_fields() {
        for name in Optimizer::NAMES {
            let opt = Optimizer::from_params(name, &[], |_| None).unwrap();
            let params = opt.params();
            let names: Vec<&str> = params.iter().map(|p| p.0).collect();
            let back = Optimizer::from_params(name, &names, |p| {
                params.iter().find(|(n, _)| *n == p).map(|(_, v)| *v)
            })
            .unwrap();
            assert_eq!(back, opt);
            assert!(opt.validate().is_ok(), "{opt}");
        }
        let err = Optimizer::from_params("adam", &["betas"], |_| None).unwrap_err();
        assert!(err.message().contains("\"betas\""), "{err}");
        let err =
            Optimizer::Adam { lr: 0.1, beta1: 1.0, beta2: 0.9, eps: 1e-8 }.validate().unwrap_err();
        assert_eq!(err.message(), "adam: beta1 must be in [0, 1), got 1");
        assert!(Optimizer::from_params("adamw", &[], |_| None).is_err());
    }
}
