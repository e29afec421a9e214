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
}

impl Default for Optimizer {
    /// `Sgd { lr: 0.01 }`.
    fn default() -> Self {
        Self::Sgd { lr: 0.01 }
    }
}

impl Optimizer {
    /// The optimizer's name as the Python API spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::Adagrad { .. } => "adagrad",
            Self::RowWiseAdagrad { .. } => "rowwise_adagrad",
            Self::Adam { .. } => "adam",
            Self::Ftrl { .. } => "ftrl",
        }
    }

    /// The configured learning rate.
    pub fn lr(&self) -> f32 {
        match *self {
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
            Self::Sgd { .. } => 0,
            Self::Adagrad { .. } => dim,
            Self::RowWiseAdagrad { .. } => 1,
            Self::Adam { .. } | Self::Ftrl { .. } => 2 * dim,
        }
    }

    /// Checks the hyper-parameters: finite, `lr ≥ 0`, `eps > 0`, betas in `[0, 1)`, …
    pub fn validate(&self) -> crate::Result<()> {
        let ok = match *self {
            Self::Sgd { lr } => lr.is_finite() && lr >= 0.0,
            Self::Adagrad { lr, eps, initial_accumulator_value: a }
            | Self::RowWiseAdagrad { lr, eps, initial_accumulator_value: a } => {
                lr.is_finite()
                    && lr >= 0.0
                    && eps.is_finite()
                    && eps > 0.0
                    && a.is_finite()
                    && a >= 0.0
            }
            Self::Adam { lr, beta1, beta2, eps } => {
                lr.is_finite()
                    && lr >= 0.0
                    && (0.0..1.0).contains(&beta1)
                    && (0.0..1.0).contains(&beta2)
                    && eps.is_finite()
                    && eps > 0.0
            }
            Self::Ftrl { lr, beta, l1, l2, initial_accumulator_value: a } => {
                lr.is_finite()
                    && lr > 0.0
                    && [beta, l1, l2, a].iter().all(|x| x.is_finite() && *x >= 0.0)
            }
        };
        if ok {
            Ok(())
        } else {
            Err(crate::Error::invalid(format!("invalid optimizer hyper-parameters: {self:?}")))
        }
    }

    /// Writes the state of a new row.
    pub fn init_state(&self, state: &mut [f32]) {
        match *self {
            Self::Sgd { .. } | Self::Adam { .. } => state.fill(0.0),
            Self::Adagrad { initial_accumulator_value: a, .. }
            | Self::RowWiseAdagrad { initial_accumulator_value: a, .. } => state.fill(a),
            Self::Ftrl { initial_accumulator_value: a, .. } => {
                let (z, n) = state.split_at_mut(state.len() / 2);
                z.fill(0.0);
                n.fill(a);
            }
        }
    }

    /// One step on one row: `w` its values, `s` its state, `g` its (summed) gradient, `lr` the
    /// learning rate of this call and `t` the table's step (1-based; Adam's bias correction).
    #[inline]
    pub fn step(&self, w: &mut [f32], s: &mut [f32], g: &[f32], lr: f32, t: u64) {
        debug_assert_eq!(w.len(), g.len());
        match *self {
            Self::Sgd { .. } => {
                for (w, &g) in w.iter_mut().zip(g) {
                    *w += -lr * g;
                }
            }
            Self::Adagrad { eps, .. } => {
                for ((w, s), &g) in w.iter_mut().zip(s.iter_mut()).zip(g) {
                    *s += g * g;
                    *w += -lr * (g / (s.sqrt() + eps));
                }
            }
            Self::RowWiseAdagrad { eps, .. } => {
                let mean_sq = g.iter().map(|g| g * g).sum::<f32>() / g.len() as f32;
                s[0] += mean_sq;
                let rate = lr / (s[0].sqrt() + eps);
                for (w, &g) in w.iter_mut().zip(g) {
                    *w += -rate * g;
                }
            }
            Self::Adam { beta1, beta2, eps, .. } => {
                let t = t.max(1) as i32;
                let bc1 = 1.0 - (beta1 as f64).powi(t);
                let bc2_sqrt = (1.0 - (beta2 as f64).powi(t)).sqrt() as f32;
                let step_size = (lr as f64 / bc1) as f32;
                let (m, v) = s.split_at_mut(w.len());
                for (((w, m), v), &g) in w.iter_mut().zip(m).zip(v).zip(g) {
                    *m += (1.0 - beta1) * (g - *m);
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    let denom = v.sqrt() / bc2_sqrt + eps;
                    *w += -step_size * (*m / denom);
                }
            }
            Self::Ftrl { beta, l1, l2, .. } => {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
