"""TorchRec's jagged input and its plan over tables, below the modules and the sessions that
take it: the configs (:class:`EmbeddingBagConfig`, :class:`EmbeddingConfig`,
:class:`PoolingType`), the input and output types (:class:`KeyedJaggedTensor`,
:class:`JaggedTensor`, :class:`KeyedTensor`), and the plan that splits a jagged input into one
id list per table and pools the rows back per feature (shared by
:mod:`embstore.torch.collection`'s modules and by ``store.session(features=...)``).
:mod:`embstore.torch.collection` documents them for users and re-exports the public ones."""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from embstore._arrays import describe
from embstore.config import Normal, Uniform
from embstore.errors import DTypeError, InvalidArgumentError, ShapeError
from embstore.table import Table


class PoolingType(enum.Enum):
    """How a bag's rows are pooled (TorchRec's ``PoolingType``)."""

    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@dataclass
class EmbeddingBagConfig:
    """A table and the features it embeds, as TorchRec's ``EmbeddingBagConfig``.

    TorchRec's fields keep their order and meaning: ``num_embeddings`` (optional here: a table
    holds any 64-bit id; with no ``initializer``, it sets TorchRec's default initial values,
    uniform on ``±sqrt(1 / num_embeddings)``), ``embedding_dim`` (required), ``name`` (the
    store's table), ``data_type`` (FP32, FP16 or BF16: the table's storage dtype),
    ``feature_names`` (default ``[name]``),
    ``weight_init_min``/``weight_init_max`` (uniform initial values), ``need_pos`` (ignored),
    ``init_fn`` (``functools.partial(torch.nn.init.uniform_, a=, b=)`` or ``normal_`` only) and
    ``pooling`` (:class:`PoolingType` or ``"sum"``/``"mean"``; TorchRec's enum works too).

    embstore's own, used when the table is created: ``optimizer`` (default ``SGD``),
    ``initializer`` (wins over the fields above) and ``table_args`` (other
    :meth:`~embstore.Store.create_table` arguments: ``seed``, ``num_shards``, ...).
    """

    num_embeddings: int | None = None
    embedding_dim: int | None = None
    name: str = ""
    data_type: Any = "FP32"
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    need_pos: bool = False
    init_fn: Any = None
    pooling: Any = PoolingType.SUM
    optimizer: Any = None
    initializer: Any = None
    table_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class EmbeddingConfig(EmbeddingBagConfig):
    """A table and its features for :class:`EmbeddingCollection` (unpooled), as TorchRec's
    ``EmbeddingConfig``; the fields of :class:`EmbeddingBagConfig`, ``pooling`` unused."""

    pooling: Any = PoolingType.NONE


def _pooling(value: Any, table: str, bags: bool) -> str:
    """``"sum"``/``"mean"`` (bags) or ``"none"``, from our enum, TorchRec's or a string."""
    raw = getattr(value, "value", value)
    mode = raw.lower() if isinstance(raw, str) else None
    allowed = ("sum", "mean") if bags else ("none", "sum", "mean")
    if mode not in allowed:
        what = "PoolingType.SUM or MEAN" if bags else "a PoolingType"
        hint = " (unpooled lookups: EmbeddingCollection)" if mode == "none" else ""
        raise InvalidArgumentError(
            f"pooling of table {table!r} must be {what}, got {value!r}{hint}"
        )
    return mode


def initializer_of(config: Any, name: str) -> Any:
    """The initializer a config asks for: ``initializer``, else ``init_fn``,
    ``weight_init_min``/``max`` or ``num_embeddings`` as TorchRec reads them, else None."""
    init = getattr(config, "initializer", None)
    if init is not None:
        return init
    fn = getattr(config, "init_fn", None)
    if fn is not None:
        if isinstance(fn, functools.partial) and not fn.args:
            kw = fn.keywords
            if fn.func is torch.nn.init.uniform_ and set(kw) <= {"a", "b"}:
                return Uniform(float(kw.get("a", 0.0)), float(kw.get("b", 1.0)))
            if fn.func is torch.nn.init.normal_ and set(kw) <= {"mean", "std"}:
                return Normal(float(kw.get("mean", 0.0)), float(kw.get("std", 1.0)))
        raise InvalidArgumentError(
            f"init_fn of table {name!r} cannot be applied to a store's rows: only "
            "functools.partial(torch.nn.init.uniform_, a=, b=) or normal_(mean=, std=) map to "
            f"an embstore initializer; give initializer=embstore.Uniform(...) (got {fn!r})"
        )
    lo, hi = getattr(config, "weight_init_min", None), getattr(config, "weight_init_max", None)
    n = getattr(config, "num_embeddings", None)
    if lo is None and hi is None and n is None:
        return None
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidArgumentError(
            f"num_embeddings of table {name!r} must be an int >= 1 or None, got {n!r}"
        )
    if (lo is None or hi is None) and n is None:
        raise InvalidArgumentError(
            f"table {name!r}: weight_init_min and weight_init_max go together "
            "(or give num_embeddings, as TorchRec derives them from it)"
        )
    bound = math.sqrt(1 / n) if n is not None else 0.0
    return Uniform(float(-bound if lo is None else lo), float(bound if hi is None else hi))


@dataclass
class TablePlan:
    """One table of a collection: its features, their output names and the pooling."""

    name: str
    dim: int
    features: list[str]
    names: list[str]  # output names: the feature, or "feature@table" if two tables embed it
    mode: str  # "sum", "mean" or "none"
    config: Any = None


class FeaturePlan:
    """Which table each feature is looked up in, shared by the modules and sessions: splits a
    jagged input into one id list per table and pools the rows back per feature."""

    def __init__(self, tables: list[TablePlan], is_weighted: bool | None) -> None:
        self.tables = tables
        self.is_weighted = is_weighted  # None: use the input's weights when it has them

    @classmethod
    def from_configs(cls, configs: Any, bags: bool, is_weighted: bool | None) -> FeaturePlan:
        if isinstance(configs, Mapping | str | bytes) or not isinstance(configs, Iterable):
            raise InvalidArgumentError(
                f"tables must be a list of EmbeddingBagConfig, got {type(configs).__name__}"
            )
        configs = list(configs)
        if not configs:
            raise InvalidArgumentError("a collection needs at least one table config")
        seen: dict[str, int] = {}
        plans = []
        for c in configs:
            name = getattr(c, "name", None)
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"every table config needs a name, got {name!r}")
            if name in [p.name for p in plans]:
                raise InvalidArgumentError(f"table {name!r} is configured twice")
            dim = getattr(c, "embedding_dim", None)
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
                raise InvalidArgumentError(
                    f"embedding_dim of table {name!r} must be an int >= 1, got {dim!r}"
                )
            storage_dtype(c, name)  # checked here, used when the table is created
            feats = list(getattr(c, "feature_names", None) or [name])
            if not getattr(c, "feature_names", None):
                try:  # as TorchRec does: models read config.feature_names (DLRM's SparseArch)
                    c.feature_names = list(feats)
                except AttributeError:
                    pass
            if not all(isinstance(f, str) and f for f in feats) or len(set(feats)) != len(feats):
                raise InvalidArgumentError(
                    f"feature_names of table {name!r} must be distinct names, got {feats}"
                )
            for f in feats:
                seen[f] = seen.get(f, 0) + 1
            mode = _pooling(getattr(c, "pooling", PoolingType.SUM), name, bags)
            plans.append(TablePlan(name, dim, feats, [], mode, c))
        for p in plans:
            p.names = [f if seen[f] == 1 else f"{f}@{p.name}" for f in p.features]
        if is_weighted:
            mean = [p.name for p in plans if p.mode == "mean"]
            if mean:
                raise InvalidArgumentError(
                    f"weighted features need pooling SUM, but table(s) {mean} pool with MEAN "
                    "(as nn.EmbeddingBag: per_sample_weights only with mode='sum')"
                )
        return cls(plans, is_weighted)

    @classmethod
    def of(cls, features: Any) -> FeaturePlan:
        """A session's ``features=``: a collection module, a list of configs, or a mapping of
        feature name to table name (sum pooling; the input's weights used when it has them)."""
        plan_of = getattr(features, "feature_plan", None)  # a collection module
        plan = plan_of() if callable(plan_of) else None
        if isinstance(plan, FeaturePlan):
            return plan
        if isinstance(features, Mapping):
            by_table: dict[str, list[str]] = {}
            for f, t in features.items():
                # A table, or a distributed table (which wraps one): its name.
                t = t if isinstance(t, str) or not hasattr(t, "local") else t.local
                if not isinstance(f, str) or not isinstance(t, str | Table):
                    raise InvalidArgumentError(
                        f"features must map feature names to table names, got {f!r}: {t!r}"
                    )
                by_table.setdefault(t.name if isinstance(t, Table) else t, []).append(f)
            plans = [TablePlan(t, 0, fs, list(fs), "sum") for t, fs in by_table.items()]
            if not plans:
                raise InvalidArgumentError("features must name at least one feature")
            return cls(plans, None)
        return cls.from_configs(features, False, None)

    def split(self, jag: _Jagged) -> list[TableInput]:
        """Each table's input: its features' ids one after the other, the bags' offsets
        (``include_last_offset``) and weights. Checks the features first."""
        missing = [f for p in self.tables for f in p.features if f not in jag.index]
        if missing:
            raise InvalidArgumentError(
                f"the input has no feature(s) {missing} (its keys: {jag.keys}); "
                "every feature of the tables' feature_names must be a key"
            )
        weighted = jag.weights is not None if self.is_weighted is None else self.is_weighted
        if weighted and jag.weights is None:
            raise InvalidArgumentError(
                "the collection is weighted (is_weighted=True) but the input has no weights"
            )
        b = jag.stride
        out = []
        for p in self.tables:
            ks = [jag.index[f] for f in p.features]
            contiguous = ks == list(range(ks[0], ks[0] + len(ks)))
            if contiguous:  # a view of the input, in the usual case
                lo, hi = jag.value_offsets[ks[0]], jag.value_offsets[ks[-1] + 1]
                ids = jag.values[lo:hi]
                w = jag.weights[lo:hi] if weighted else None
                lens = jag.lengths[ks[0] * b : (ks[-1] + 1) * b]
            else:
                spans = [(jag.value_offsets[k], jag.value_offsets[k + 1]) for k in ks]
                ids = torch.cat([jag.values[lo:hi] for lo, hi in spans])
                w = torch.cat([jag.weights[lo:hi] for lo, hi in spans]) if weighted else None
                lens = np.concatenate([jag.lengths[k * b : (k + 1) * b] for k in ks])
            offsets = np.zeros(len(lens) + 1, np.int64)
            np.cumsum(lens, out=offsets[1:])
            out.append(TableInput(ids, torch.from_numpy(offsets), w, lens, b))
        return out

    def session_ids(self, kjt: Any) -> tuple[dict[str, torch.Tensor], list[TableInput]]:
        """A session's ids per table for a jagged input, and the inputs to pool with."""
        inputs = self.split(read_jagged(kjt))
        return {p.name: i.ids for p, i in zip(self.tables, inputs, strict=True)}, inputs

    def keyed(self, pooled: list[torch.Tensor], stride: int) -> KeyedTensor:
        """The :class:`KeyedTensor` of each table's pooled ``[F_t * B, D]`` bags."""
        keys: list[str] = []
        lengths: list[int] = []
        blocks: list[torch.Tensor] = []
        for p, bags in zip(self.tables, pooled, strict=True):
            d = bags.shape[1]
            blocks += list(bags.view(len(p.features), stride, d).unbind(0))
            keys += p.names
            lengths += [d] * len(p.features)
        return KeyedTensor(keys, lengths, torch.cat(blocks, dim=1))

    def jagged(
        self, rows: list[torch.Tensor], inputs: list[TableInput], indices: bool = False
    ) -> dict[str, Any]:
        """Each feature's rows, unpooled: ``{name: JaggedTensor([N_f, D], lengths)}``; with
        ``indices``, each one's ``weights()`` are the feature's ids (TorchRec's
        ``need_indices``)."""
        out: dict[str, JaggedTensor] = {}
        for p, r, inp in zip(self.tables, rows, inputs, strict=True):
            b = inp.stride
            for i, name in enumerate(p.names):
                lo, hi = int(inp.offsets[i * b]), int(inp.offsets[(i + 1) * b])
                lens = torch.from_numpy(np.ascontiguousarray(inp.lengths[i * b : (i + 1) * b]))
                ids = inp.ids[lo:hi] if indices else None
                out[name] = JaggedTensor(r[lo:hi], weights=ids, lengths=lens)
        return out

    def pooled_rows(
        self, rows: list[torch.Tensor], inputs: list[TableInput], modes: list[str] | None = None
    ) -> KeyedTensor:
        """Pool each table's ``rows`` (a row per id of its input) as the module does."""
        modes = modes or [p.mode for p in self.tables]
        unpooled = [p.name for p, m in zip(self.tables, modes, strict=True) if m == "none"]
        if unpooled:
            raise InvalidArgumentError(
                f"table(s) {unpooled} have pooling NONE: read their rows with jagged()"
            )
        pooled = [
            pool(r, i.offsets, m, i.weights) for r, i, m in zip(rows, inputs, modes, strict=True)
        ]
        return self.keyed(pooled, inputs[0].stride)


@dataclass
class TableInput:
    ids: torch.Tensor  # the table's features' ids, feature after feature
    offsets: torch.Tensor  # int64 [F_t * B + 1], CPU
    weights: torch.Tensor | None
    lengths: np.ndarray  # int64 [F_t * B]
    stride: int


def pool(
    rows: torch.Tensor, offsets: torch.Tensor, mode: str, weights: torch.Tensor | None
) -> torch.Tensor:
    """``[F_t * B, D]``: the rows (row ``i`` is id ``i``) pooled per bag with torch's own kernel,
    so empty bags, means and weights are exactly ``nn.EmbeddingBag``'s. The one pooling of
    the modules and of ``SessionBatch.pooled``: the two agree to the bit."""
    if weights is not None:
        if mode != "sum":
            raise InvalidArgumentError(
                f"weighted features need pooling SUM, got {mode.upper()} "
                "(as nn.EmbeddingBag: per_sample_weights only with mode='sum')"
            )
        weights = weights.to(device=rows.device, dtype=rows.dtype)
    n = rows.shape[0]
    one_each = offsets.numel() == n + 1 and not torch.compiler.is_compiling()
    if one_each and bool((offsets[1:] - offsets[:-1] == 1).all()):
        # A bag of one id each (one-hot features): the bag is its row (times its weight),
        # the same values embedding_bag gives, without its backward's sort and scatter.
        return rows if weights is None else rows * weights.unsqueeze(1)
    return F.embedding_bag(
        torch.arange(rows.shape[0], device=rows.device),
        rows,
        offsets.to(rows.device),
        mode=mode,
        per_sample_weights=weights,
        include_last_offset=True,
    )


# -- jagged input -------------------------------------------------------------------------------


@dataclass
class _Jagged:
    """A checked jagged input: keys, values, lengths (CPU int64 numpy, ``[F * B]``), weights."""

    keys: list[str]
    index: dict[str, int]
    values: torch.Tensor
    lengths: np.ndarray
    value_offsets: list[int]  # F + 1: where each key's values start
    weights: torch.Tensor | None
    stride: int


def _int_tensor(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise DTypeError(f"{what} must be an integer tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise DTypeError(f"{what} must be an integer tensor (int64 or int32), got {describe(x)}")
    if x.dim() != 1:
        raise ShapeError(f"{what} must be 1-D, got {describe(x)}")
    return x


def _check_jagged(
    keys: Any,
    values: Any,
    lengths: Any,
    weights: Any,
    stride: int | None,
) -> _Jagged:
    """Check a jagged input as the modules need it, before any lookup; typed errors."""
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise InvalidArgumentError(f"keys must be a list of feature names, got {keys!r}")
    keys = list(keys)
    if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise InvalidArgumentError(f"keys must be distinct feature names (str), got {keys}")
    values = _int_tensor(values, "values")
    lengths = _int_tensor(lengths, "lengths")
    n_keys = len(keys)
    if stride is None:
        stride = lengths.numel() // n_keys if n_keys else 0
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 0:
        raise InvalidArgumentError(f"stride must be an int >= 0, got {stride!r}")
    if lengths.numel() != n_keys * stride:
        raise ShapeError(
            f"lengths must have one entry per key and sample, {n_keys} keys x {stride} = "
            f"{n_keys * stride}, got {lengths.numel()}"
        )
    lens = lengths.detach().to(device="cpu", dtype=torch.int64).numpy()
    if len(lens) and (neg := lens < 0).any():
        i = int(neg.argmax())
        raise InvalidArgumentError(f"lengths must be >= 0, got lengths[{i}] = {int(lens[i])}")
    per_key = lens.reshape(n_keys, stride).sum(axis=1) if n_keys else np.zeros(0, np.int64)
    total = int(per_key.sum())
    if total != values.numel():
        raise ShapeError(
            f"lengths sum to {total} but values has {values.numel()} entries: a jagged "
            "input's lengths must cover its values exactly"
        )
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or not weights.dtype.is_floating_point:
            raise DTypeError(f"weights must be a float tensor, got {describe(weights)}")
        if weights.shape != values.shape:
            raise ShapeError(
                f"weights must match values {list(values.shape)}, got {list(weights.shape)}"
            )
    value_offsets = [0, *np.cumsum(per_key).tolist()]
    return _Jagged(
        keys, {k: i for i, k in enumerate(keys)}, values, lens, value_offsets, weights, stride
    )


def read_jagged(kjt: Any) -> _Jagged:
    """A ``KeyedJaggedTensor`` (ours, TorchRec's, or anything with ``keys()``, ``values()``,
    ``lengths()`` and optionally ``weights_or_none()``/``stride()``), checked."""
    if isinstance(kjt, KeyedJaggedTensor):
        return kjt._jag
    if not all(callable(getattr(kjt, m, None)) for m in ("keys", "values", "lengths")):
        raise DTypeError(
            "input must be a KeyedJaggedTensor (torchrec's, embstore.torch.KeyedJaggedTensor, "
            f"or an object with keys(), values() and lengths()), got {type(kjt).__name__}"
        )
    variable = getattr(kjt, "variable_stride_per_key", None)
    if callable(variable) and variable():
        raise InvalidArgumentError(
            "a KeyedJaggedTensor with a batch size per feature (stride_per_key_per_rank) is "
            "not supported: give every feature the same batch size"
        )
    weights_of = getattr(kjt, "weights_or_none", None)
    weights = weights_of() if callable(weights_of) else None
    stride_of = getattr(kjt, "stride", None)
    stride = stride_of() if callable(stride_of) else None
    return _check_jagged(kjt.keys(), kjt.values(), kjt.lengths(), weights, stride)


class JaggedTensor:
    """One feature's jagged values (TorchRec's ``JaggedTensor``): ``values()`` (``[N]`` ids,
    or ``[N, D]`` rows from :class:`EmbeddingCollection`), ``lengths()`` per sample,
    ``offsets()`` and ``weights()``/``weights_or_none()``."""

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise InvalidArgumentError("a JaggedTensor needs lengths or offsets")
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise InvalidArgumentError("this JaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            lengths = self.lengths()
            self._offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(
                lengths.dtype
            )
        return self._offsets

    def to_dense(self) -> list[torch.Tensor]:
        """One tensor per sample."""
        return list(torch.split(self._values, self.lengths().tolist()))

    def __repr__(self) -> str:
        return f"JaggedTensor(values={self._values!r}, lengths={self.lengths()!r})"


class KeyedJaggedTensor:
    """TorchRec's ``KeyedJaggedTensor``, minimal: features (``keys``), each with a jagged list
    of ids per sample, all in one ``values`` tensor, key after key.

    ``lengths`` is ``[F * B]`` (key-major: key ``f``'s sample ``b`` at ``f * B + b``) or
    ``offsets`` ``[F * B + 1]``; ``weights`` (optional) one float per value. Unlike TorchRec's,
    the constructor checks its input (integer ``values`` and ``lengths``, lengths summing to
    the values, weights matching them) and raises :class:`~embstore.DTypeError`,
    :class:`~embstore.ShapeError` or :class:`~embstore.InvalidArgumentError`.

    Example::

        >>> import torch, embstore.torch as et
        >>> kjt = et.KeyedJaggedTensor.from_lengths_sync(
        ...     keys=["item", "user"], values=torch.tensor([1, 2, 3, 7, 8]),
        ...     lengths=torch.tensor([2, 1, 1, 1]))
        >>> kjt.stride(), kjt.length_per_key(), kjt["item"].values().tolist()
        (2, [3, 2], [1, 2, 3])
    """

    def __init__(
        self,
        keys: list[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Any = None,
        length_per_key: Any = None,
        offset_per_key: Any = None,
        index_per_key: Any = None,
        jt_dict: Any = None,
        inverse_indices: Any = None,
    ) -> None:
        if stride_per_key_per_rank is not None or inverse_indices is not None:
            raise InvalidArgumentError(
                "stride_per_key_per_rank and inverse_indices (a batch size per feature) are "
                "not supported: give every feature the same batch size"
            )
        if lengths is None:
            if offsets is None:
                raise InvalidArgumentError("a KeyedJaggedTensor needs lengths or offsets")
            offsets = _int_tensor(offsets, "offsets")
            if offsets.numel() == 0:
                lengths = offsets
            else:
                off = offsets.detach().cpu()
                if int(off[0]) != 0:
                    raise InvalidArgumentError(f"offsets[0] must be 0, got {int(off[0])}")
                lengths = offsets[1:] - offsets[:-1]
        self._jag = _check_jagged(keys, values, lengths, weights, stride)
        self._lengths = lengths
        self._offsets = offsets

    @staticmethod
    def from_lengths_sync(
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Any = None,
        inverse_indices: Any = None,
    ) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys,
            values,
            weights,
            lengths=lengths,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
        )

    @staticmethod
    def from_offsets_sync(
        keys: list[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Any = None,
        inverse_indices: Any = None,
    ) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys,
            values,
            weights,
            offsets=offsets,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
        )

    @staticmethod
    def from_jt_dict(jt_dict: Mapping[str, JaggedTensor]) -> KeyedJaggedTensor:
        """Features of the same batch size, one :class:`JaggedTensor` each."""
        keys = list(jt_dict)
        jts = list(jt_dict.values())
        weighted = [jt.weights_or_none() is not None for jt in jts]
        if any(weighted) and not all(weighted):
            raise InvalidArgumentError("either every JaggedTensor has weights or none does")
        return KeyedJaggedTensor(
            keys,
            torch.cat([jt.values() for jt in jts]) if jts else torch.empty(0, dtype=torch.int64),
            torch.cat([jt.weights() for jt in jts]) if jts and all(weighted) else None,
            lengths=torch.cat([jt.lengths() for jt in jts])
            if jts
            else torch.empty(0, dtype=torch.int64),
        )

    def sync(self) -> KeyedJaggedTensor:
        return self

    def keys(self) -> list[str]:
        return list(self._jag.keys)

    def values(self) -> torch.Tensor:
        return self._jag.values

    def weights(self) -> torch.Tensor:
        if self._jag.weights is None:
            raise InvalidArgumentError("this KeyedJaggedTensor has no weights")
        return self._jag.weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._jag.weights

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def lengths_or_none(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            lengths = self._lengths
            self._offsets = torch.cat(
                [lengths.new_zeros(1), torch.cumsum(lengths, 0).to(lengths.dtype)]
            )
        return self._offsets

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def stride(self) -> int:
        """Samples in the batch (``B``)."""
        return self._jag.stride

    def variable_stride_per_key(self) -> bool:
        return False

    def length_per_key(self) -> list[int]:
        """Values of each key."""
        o = self._jag.value_offsets
        return [o[i + 1] - o[i] for i in range(len(self._jag.keys))]

    def offset_per_key(self) -> list[int]:
        """Where each key's values start, and the end."""
        return list(self._jag.value_offsets)

    def device(self) -> torch.device:
        return self._jag.values.device

    def __len__(self) -> int:
        return len(self._jag.keys)

    def __getitem__(self, key: str) -> JaggedTensor:
        jag = self._jag
        if key not in jag.index:
            raise KeyError(f"no feature {key!r} (keys: {jag.keys})")
        k, b = jag.index[key], jag.stride
        lo, hi = jag.value_offsets[k], jag.value_offsets[k + 1]
        return JaggedTensor(
            jag.values[lo:hi],
            None if jag.weights is None else jag.weights[lo:hi],
            lengths=self._lengths[k * b : (k + 1) * b],
        )

    def to_dict(self) -> dict[str, JaggedTensor]:
        """``{feature: JaggedTensor}``, in key order."""
        return {k: self[k] for k in self._jag.keys}

    def to(self, device: Any, non_blocking: bool = False) -> KeyedJaggedTensor:
        w = self._jag.weights
        return KeyedJaggedTensor(
            self.keys(),
            self.values().to(device, non_blocking=non_blocking),
            None if w is None else w.to(device, non_blocking=non_blocking),
            lengths=self._lengths.to(device, non_blocking=non_blocking),
            stride=self.stride(),
        )

    def __repr__(self) -> str:
        return (
            f"KeyedJaggedTensor(keys={self._jag.keys}, stride={self.stride()}, "
            f"length_per_key={self.length_per_key()}, weighted={self._jag.weights is not None})"
        )


class KeyedTensor:
    """Pooled embeddings of several features side by side (TorchRec's ``KeyedTensor``):
    ``values()`` is ``[B, sum(D)]``, feature after feature in the collection's order;
    ``kt["item"]`` (or ``to_dict()["item"]``) is that feature's ``[B, D]``."""

    def __init__(
        self, keys: list[str], length_per_key: list[int], values: torch.Tensor, key_dim: int = 1
    ) -> None:
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._values = values
        self._key_dim = key_dim
        self._offsets = [0, *np.cumsum(self._length_per_key).tolist()]
        self._index = {k: i for i, k in enumerate(self._keys)}

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> list[int]:
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        return list(self._offsets)

    def device(self) -> torch.device:
        return self._values.device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._index:
            raise KeyError(f"no feature {key!r} (keys: {self._keys})")
        i = self._index[key]
        return self._values.narrow(self._key_dim, self._offsets[i], self._length_per_key[i])

    def to_dict(self) -> dict[str, torch.Tensor]:
        """``{feature: [B, D]}``, views of ``values()`` cut by one ``torch.split`` (as
        TorchRec's): their backward is one concatenation, where a narrow per key would add a
        gradient of the whole ``values()`` per key."""
        parts = torch.split(self._values, self._length_per_key, dim=self._key_dim)
        return dict(zip(self._keys, parts, strict=True))

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, values={list(self._values.shape)})"


# -- modules ------------------------------------------------------------------------------------


_DATA_TYPES = {"FP32": None, "FLOAT32": None, "FP16": "fp16", "FLOAT16": "fp16", "BF16": "bf16"}


def storage_dtype(c: Any, name: str) -> str | None:
    """The storage dtype a config's ``data_type`` asks for: None (FP32), ``"fp16"`` or
    ``"bf16"``; other TorchRec types (INT8, INT4, ...) are refused."""
    raw = getattr(c, "data_type", "FP32")
    label = str(getattr(raw, "value", None) or raw).upper().removeprefix("DATATYPE.")
    if label not in _DATA_TYPES:
        raise InvalidArgumentError(
            f"data_type of table {name!r} must be FP32, FP16 or BF16 (rows stored at 4 or 2 "
            f"bytes a value), got {label}"
        )
    return _DATA_TYPES[label]
