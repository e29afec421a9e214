"""Optimizers and initializers of embedding tables.

Optimizers run inside the store ("server-side"): ``apply_gradients`` sums the gradients of
duplicate ids and then takes one step per unique id, on that row only, following the torch
formula the class names (so rows match ``nn.Embedding(sparse=True)`` trained with the torch
optimizer). Initializers draw a new row's values as a pure function of the table's seed and the
id, so a row first touched on any machine starts the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SGD:
    """``w -= lr * g``."""

    lr: float = 0.01

    _kind = "sgd"


@dataclass(frozen=True)
class Adagrad:
    """``torch.optim.Adagrad``: ``s += g**2; w -= lr * g / (sqrt(s) + eps)``.

    State: ``D`` floats per row. No ``lr_decay`` or ``weight_decay`` (torch's sparse path has
    no weight decay either).
    """

    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0

    _kind = "adagrad"


@dataclass(frozen=True)
class RowWiseAdagrad:
    """Row-wise Adagrad (FBGEMM/TorchRec): one accumulator per row.

    ``s += mean(g**2); w -= lr * g / (sqrt(s) + eps)``. State: 1 float per row, so a table with
    ``D = 64`` needs 1/64 of Adagrad's optimizer memory.
    """

    lr: float = 0.01
    eps: float = 1e-8
    initial_accumulator_value: float = 0.0

    _kind = "rowwise_adagrad"


@dataclass(frozen=True)
class Adam:
    """``torch.optim.Adam`` applied lazily to the rows in each batch (as ``SparseAdam``).

    The bias correction uses the table's step counter, which counts ``apply_gradients`` calls.
    State: ``2 * D`` floats per row (first and second moments).
    """

    lr: float = 0.001
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    _kind = "adam"


@dataclass(frozen=True)
class FTRL:
    """FTRL-proximal (McMahan et al. 2013), per coordinate, with learning rate ``lr`` (alpha).

    ``n' = n + g**2; z += g - (sqrt(n') - sqrt(n)) / lr * w;``
    ``w = 0 if |z| <= l1 else -(z - sign(z) * l1) / ((beta + sqrt(n')) / lr + l2)``.
    State: ``2 * D`` floats per row (``z`` and ``n``).
    """

    lr: float = 0.05
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    initial_accumulator_value: float = 0.0

    _kind = "ftrl"


Optimizer = SGD | Adagrad | RowWiseAdagrad | Adam | FTRL


@dataclass(frozen=True)
class Zeros:
    """Every value 0."""

    _args = (0.0, 0.0)
    _kind = "zeros"


@dataclass(frozen=True)
class Constant:
    """Every value ``value``."""

    value: float = 0.0
    _kind = "constant"

    @property
    def _args(self) -> tuple[float, float]:
        return (self.value, 0.0)


@dataclass(frozen=True)
class Uniform:
    """Uniform on ``[low, high)``."""

    low: float = -0.01
    high: float = 0.01
    _kind = "uniform"

    @property
    def _args(self) -> tuple[float, float]:
        return (self.low, self.high)


@dataclass(frozen=True)
class Normal:
    """Normal with ``mean`` and ``std`` (the default initializer is ``Normal(std=0.01)``)."""

    mean: float = 0.0
    std: float = 0.01
    _kind = "normal"

    @property
    def _args(self) -> tuple[float, float]:
        return (self.mean, self.std)


Initializer = Zeros | Constant | Uniform | Normal


def optimizer_params(opt: Optimizer) -> tuple[str, dict[str, float]]:
    """The native spelling of ``opt``: its kind and hyper-parameters."""
    params = asdict(opt)
    if isinstance(opt, Adam):
        params["beta1"], params["beta2"] = params.pop("betas")
    return opt._kind, {k: float(v) for k, v in params.items()}


__all__ = [
    "FTRL",
    "SGD",
    "Adagrad",
    "Adam",
    "Constant",
    "Initializer",
    "Normal",
    "Optimizer",
    "RowWiseAdagrad",
    "Uniform",
    "Zeros",
]
