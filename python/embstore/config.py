"""Optimizers and initializers of embedding tables.

Optimizers run inside the store ("server-side"): ``apply_gradients`` sums the gradients of
duplicate ids and then takes one step per unique id, on that row only, following the torch
formula the class names (so rows match ``nn.Embedding(sparse=True)`` trained with the torch
optimizer). Initializers draw a new row's values as a pure function of the table's seed and the
id, so a row first touched on any machine starts the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from embstore.errors import InvalidArgumentError


def _check_floats(obj: Any) -> None:
    """Every field a real number (bool excluded): a clear error at construction."""
    for name, value in asdict(obj).items():
        if name == "betas":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgumentError(
                f"{type(obj).__name__}: {name} must be a number, got {value!r}"
            )


@dataclass(frozen=True)
class SGD:
    """``w -= lr * g``."""

    lr: float = 0.01

    _kind = "sgd"

    def __post_init__(self) -> None:
        _check_floats(self)


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

    def __post_init__(self) -> None:
        _check_floats(self)


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

    def __post_init__(self) -> None:
        _check_floats(self)


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

    def __post_init__(self) -> None:
        _check_floats(self)
        b = self.betas
        if (
            not isinstance(b, tuple | list)
            or len(b) != 2
            or any(isinstance(x, bool) or not isinstance(x, int | float) for x in b)
        ):
            raise InvalidArgumentError(f"Adam: betas must be a pair of numbers, got {b!r}")


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

    def __post_init__(self) -> None:
        _check_floats(self)


Optimizer = SGD | Adagrad | RowWiseAdagrad | Adam | FTRL


@dataclass(frozen=True)
class Zeros:
    """Every value 0."""

    _kind = "zeros"


@dataclass(frozen=True)
class Constant:
    """Every value ``value``."""

    value: float = 0.0
    _kind = "constant"

    def __post_init__(self) -> None:
        _check_floats(self)


@dataclass(frozen=True)
class Uniform:
    """Uniform on ``[low, high)``."""

    low: float = -0.01
    high: float = 0.01
    _kind = "uniform"

    def __post_init__(self) -> None:
        _check_floats(self)


@dataclass(frozen=True)
class Normal:
    """Normal with ``mean`` and ``std`` (the default initializer is ``Normal(std=0.01)``)."""

    mean: float = 0.0
    std: float = 0.01
    _kind = "normal"

    def __post_init__(self) -> None:
        _check_floats(self)


Initializer = Zeros | Constant | Uniform | Normal


_OPTIMIZERS = {c._kind: c for c in (SGD, Adagrad, RowWiseAdagrad, Adam, FTRL)}
_INITIALIZERS = {c._kind: c for c in (Zeros, Constant, Uniform, Normal)}


def to_params(obj: Optimizer | Initializer) -> tuple[str, dict[str, float]]:
    """The native spelling of an optimizer or initializer: its kind and named parameters (the
    names are defined once, in the Rust core; Adam's ``betas`` are ``beta1`` and ``beta2``)."""
    params = asdict(obj)
    if isinstance(obj, Adam):
        params["beta1"], params["beta2"] = params.pop("betas")
    return obj._kind, {k: float(v) for k, v in params.items()}


def from_params(params: dict[str, Any]) -> Optimizer | Initializer:
    """The object for a native ``{"name": kind, param: value, ...}`` dict."""
    params = dict(params)
    kind = params.pop("name")
    if kind in _OPTIMIZERS:
        if kind == "adam":
            params["betas"] = (params.pop("beta1"), params.pop("beta2"))
        return _OPTIMIZERS[kind](**params)
    return _INITIALIZERS[kind](**params)


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
