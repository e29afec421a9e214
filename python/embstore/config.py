"""A table's configuration (:class:`TableSpec`) and its optimizers and initializers.

Optimizers run inside the store ("server-side"): ``apply_gradients`` sums the gradients of
duplicate ids and then takes one step per unique id, on that row only, following the torch
formula the class names (so rows match ``nn.Embedding(sparse=True)`` trained with the torch
optimizer). Initializers draw a new row's values as a pure function of the table's seed and the
id, so a row first touched on any machine starts the same.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from embstore import _native
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


@dataclass(frozen=True)
class Delta:
    """``w += g``: the values pushed are added as they are, with no learning rate and no state.

    The tables of a parameter server (:meth:`Store.ps`) use it: updates from many workers are
    deltas that commute (up to float rounding), so they can be summed anywhere on their way to
    the row. A ``lr`` passed to ``apply_gradients`` is refused.
    """

    _kind = "delta"


Optimizer = SGD | Adagrad | RowWiseAdagrad | Adam | FTRL | Delta


def refuse_delta(tables: Any, what: str) -> None:
    """Raises unless every table (anything with ``.name`` and ``.config.optimizer``) steps an
    optimizer: gradients handed to a :class:`Delta` table would be added to its rows (ascent),
    silently. ``what`` names the caller in the message."""
    adders = [t.name for t in tables if isinstance(t.config.optimizer, Delta)]
    if adders:
        raise InvalidArgumentError(
            f"{what}: table(s) {adders} use embstore.Delta(), which adds what it is given (a "
            "parameter server's tables, store.ps); training steps an optimizer: create them with "
            "SGD, Adagrad, Adam, ..."
        )


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


_OPTIMIZERS = {c._kind: c for c in (SGD, Adagrad, RowWiseAdagrad, Adam, FTRL, Delta)}
_INITIALIZERS = {c._kind: c for c in (Zeros, Constant, Uniform, Normal)}


def kind_of(obj: Optimizer | Initializer) -> str:
    """The name an optimizer or initializer goes by in checkpoints, table configs and the
    native core: ``kind_of(Adam()) == "adam"``, ``kind_of(Normal()) == "normal"``."""
    return obj._kind


def to_params(obj: Optimizer | Initializer) -> tuple[str, dict[str, float]]:
    """The native spelling of an optimizer or initializer: its kind and named parameters (the
    names are defined once, in the Rust core; Adam's ``betas`` are ``beta1`` and ``beta2``)."""
    params = asdict(obj)
    if isinstance(obj, Adam):
        params["beta1"], params["beta2"] = params.pop("betas")
    return kind_of(obj), {k: float(v) for k, v in params.items()}


def from_params(params: dict[str, Any]) -> Optimizer | Initializer:
    """The object for a native ``{"name": kind, param: value, ...}`` dict."""
    params = dict(params)
    kind = params.pop("name")
    if kind in _OPTIMIZERS:
        if kind == "adam":
            params["betas"] = (params.pop("beta1"), params.pop("beta2"))
        return _OPTIMIZERS[kind](**params)
    return _INITIALIZERS[kind](**params)


@dataclass(frozen=True, eq=False)
class TableSpec:
    """Everything a table is created with, as one value (as TorchRec's ``EmbeddingBagConfig``).

    :meth:`Store.create_table` takes one (``store.create_table(spec)``) or builds one from its
    keyword arguments, and :attr:`Table.config` returns the spec of an existing table. The
    fields are checked here, at construction, with the errors ``create_table`` raises; the
    values' meaning (dims, powers of two, optimizer parameters) is checked once, in the core.
    Tables have no ``num_embeddings``: rows are keyed by raw 64-bit ids, as many as are used.

    A spec also reads as the keyword arguments of ``create_table``: ``spec["num_shards"]``,
    ``store.create_table(**spec)``, ``{**spec, "name": "copy"}``, and it equals the dict of its
    fields. ``dataclasses.replace(spec, name="copy")`` makes a renamed copy.

    Example::

        >>> import dataclasses, embstore
        >>> spec = embstore.TableSpec("user", embedding_dim=16, optimizer=embstore.Adagrad())
        >>> store = embstore.Store()
        >>> user = store.create_table(spec)
        >>> user.config == spec
        True
        >>> store.create_table(dataclasses.replace(spec, name="user2")).config.num_shards
        8

    Args:
        name: unique in the store.
        embedding_dim: ``D``, 1..4096.
        optimizer: :class:`SGD` (default, lr 0.01), :class:`Adagrad`, :class:`RowWiseAdagrad`,
            :class:`Adam`, :class:`FTRL` or :class:`Delta` (``w += g``, for a parameter
            server's tables).
        initializer: :class:`Normal` (default, std 0.01), :class:`Uniform`, :class:`Constant`
            or :class:`Zeros`.
        num_shards: a power of two; each shard has its own index and lock, and large batches
            run their shards in parallel.
        seed: of the initializer.
        admission_min_count: a new id gets a row only on its n-th ``lookup``; before that
            lookups return its initial value without storing it and its gradients are dropped
            (0 or 1: at once).
        admission_sketch_width: counters per row of the count-min sketch behind admission.
        ttl: seconds (a timedelta is converted); :meth:`Table.evict_expired` removes rows not
            updated for this long. ``None``: rows never expire.
        on_non_finite: ``"error"`` rejects a batch with a NaN/Inf gradient; ``"skip"`` skips
            those ids and steps the rest.
        huge_pages: back large arenas and indexes with transparent huge pages.
        dtype: how row values are stored in memory: ``"fp32"`` (default), ``"bf16"`` or
            ``"fp16"`` (2 bytes per value; ``torch.bfloat16``, ``torch.float16``,
            ``np.float16`` and ``np.float32`` are accepted too, and read back as the name).
            Lookups and exports are float32 whatever the dtype; optimizer state stays
            float32; each written value (initial, stepped, imported) is rounded to the
            nearest value of the dtype, ties to even. See ``docs/table.md``.

    Raises:
        InvalidArgumentError: a field has the wrong type or is out of its native range.
    """

    name: str
    embedding_dim: int
    optimizer: Optimizer = field(default_factory=SGD)
    initializer: Initializer = field(default_factory=Normal)
    num_shards: int = 8
    seed: int = 0
    admission_min_count: int = 0
    admission_sketch_width: int = 1 << 20
    ttl: float | None = None
    on_non_finite: str = "error"
    huge_pages: bool = True
    dtype: Any = "fp32"

    def __post_init__(self) -> None:
        # Frozen: the normalised values (defaults for None, a timedelta as seconds, numpy
        # integers as int) are written through object.__setattr__, once, here.
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.optimizer is None:
            put("optimizer", SGD())
        if self.initializer is None:
            put("initializer", Normal())
        if not isinstance(self.name, str):
            raise InvalidArgumentError(f"name must be a str, got {self.name!r}")
        if type(self.optimizer) not in _OPTIMIZERS.values():
            raise InvalidArgumentError(
                f"optimizer must be an embstore optimizer, got {self.optimizer!r}"
            )
        if type(self.initializer) not in _INITIALIZERS.values():
            raise InvalidArgumentError(
                f"initializer must be an embstore initializer, got {self.initializer!r}"
            )
        if self.on_non_finite not in ("error", "skip"):
            raise InvalidArgumentError(
                f"on_non_finite must be 'error' or 'skip', got {self.on_non_finite!r}"
            )
        ttl = self.ttl
        if isinstance(ttl, _dt.timedelta):
            ttl = ttl.total_seconds()
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise InvalidArgumentError(f"ttl must be seconds or a timedelta, got {ttl!r}")
        put("ttl", None if ttl is None else float(ttl))
        # Python checks types and the native integer ranges only; the values' meaning (dims,
        # powers of two, ...) is checked once, in the Rust core, whose message names the field.
        # Out of the native type's range, the core's own bound is quoted.
        ints = (
            ("embedding_dim", f"1..={_native.MAX_EMBEDDING_DIM}", 2**63),
            ("num_shards", "a power of two in 1..=1024", 2**63),
            ("seed", "0..2**64", 2**64),
            ("admission_min_count", "0..2**32", 2**32),
            ("admission_sketch_width", "0..=2**28", 2**63),
        )
        for arg, bounds, high in ints:
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidArgumentError(f"{arg} must be an int, got {value!r}")
            if not 0 <= value < high:
                raise InvalidArgumentError(f"{arg} must be in {bounds}, got {value}")
            put(arg, int(value))
        put("huge_pages", bool(self.huge_pages))
        put("dtype", dtype_name(self.dtype))

    # The mapping face: the keyword arguments of Store.create_table.
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self))

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TableSpec | dict):
            return {k: self[k] for k in self.keys()} == {k: other[k] for k in other.keys()}
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self[k] for k in self.keys()))


# Storage dtypes by every name accepted for them (str names, and the names of torch and numpy
# dtypes, which are matched by name so that torch need not be imported here).
_DTYPE_NAMES = {
    "fp32": "fp32",
    "float32": "fp32",
    "f32": "fp32",
    "float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "f16": "fp16",
    "half": "fp16",
}


def dtype_name(value: Any) -> str:
    """The storage dtype ``value`` names — ``"fp32"``, ``"bf16"`` or ``"fp16"`` — from a name
    (``"bfloat16"``, ``"float16"``, ...), a ``torch.dtype`` or a numpy dtype; ``None`` is
    ``"fp32"``. :class:`InvalidArgumentError` for anything else."""
    name: str | None
    if value is None:
        name = "fp32"
    elif isinstance(value, str):
        name = value.lower()
    elif type(value).__module__ == "torch":  # a torch.dtype: "torch.bfloat16"
        name = str(value).removeprefix("torch.")
    elif isinstance(value, bool | int | float):
        name = None
    else:
        try:
            name = np.dtype(value).name
        except TypeError:
            name = None
    if name not in _DTYPE_NAMES:
        raise InvalidArgumentError(
            f"dtype must be 'fp32', 'bf16' or 'fp16' (or torch.float32, torch.bfloat16, "
            f"torch.float16, np.float32, np.float16), got {value!r}"
        )
    return _DTYPE_NAMES[name]


def to_native_spec(spec: TableSpec) -> dict[str, Any]:
    """The one value a table's configuration crosses to native code as (``TableSpecArg`` in
    ``crates/embstore-python/src/table.rs``)."""
    opt_kind, opt_params = to_params(spec.optimizer)
    init_kind, init_params = to_params(spec.initializer)
    return {
        "name": spec.name,
        "embedding_dim": spec.embedding_dim,
        "init_kind": init_kind,
        "init_params": init_params,
        "opt_kind": opt_kind,
        "opt_params": opt_params,
        "num_shards": spec.num_shards,
        "seed": spec.seed,
        "admission_min_count": spec.admission_min_count,
        "admission_sketch_width": spec.admission_sketch_width,
        "ttl_seconds": spec.ttl,
        "skip_non_finite": spec.on_non_finite == "skip",
        "huge_pages": spec.huge_pages,
        "dtype": spec.dtype,
    }


def from_native_spec(c: dict[str, Any]) -> TableSpec:
    """The :class:`TableSpec` of a native ``Table.config()`` dict."""
    return TableSpec(
        name=c["name"],
        embedding_dim=c["embedding_dim"],
        optimizer=from_params(c["optimizer"]),
        initializer=from_params(c["initializer"]),
        num_shards=c["num_shards"],
        seed=c["seed"],
        admission_min_count=c["admission_min_count"],
        admission_sketch_width=c["admission_sketch_width"],
        ttl=c["ttl_seconds"],
        on_non_finite="skip" if c["skip_non_finite"] else "error",
        huge_pages=c["huge_pages"],
        dtype=c.get("dtype", "fp32"),  # absent in manifests written before dtypes
    )


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
    "TableSpec",
    "Uniform",
    "Zeros",
]


def spec_of(name: str | TableSpec, embedding_dim: int | None = None, **fields: Any) -> TableSpec:
    """The spec ``create_table`` is given: a :class:`TableSpec` as is (then nothing else), or
    one made of the name, ``embedding_dim`` and the spec's other ``fields`` (those given)."""
    if isinstance(name, TableSpec):
        if embedding_dim is not None or fields:
            raise InvalidArgumentError(
                "create_table takes a TableSpec or the spec's fields as arguments, not both"
            )
        return name
    if embedding_dim is None:
        raise TypeError("create_table() missing required argument: 'embedding_dim'")
    return TableSpec(name, embedding_dim, **fields)
