"""TorchRec's shapes over embstore tables: jagged input and collection modules.

:class:`EmbeddingBagCollection` and :class:`EmbeddingCollection` take TorchRec's configs
(:class:`EmbeddingBagConfig`, :class:`EmbeddingConfig`: a table's ``name``,
``embedding_dim``, ``feature_names`` and ``pooling``) and its jagged input, a
``KeyedJaggedTensor``: TorchRec's own (``torchrec.sparse.jagged_tensor.KeyedJaggedTensor``)
when it is installed, the minimal :class:`KeyedJaggedTensor` here when not, or any object with
``keys()``, ``values()``, ``lengths()`` and (for weighted features) ``weights_or_none()``.
:class:`EmbeddingBagCollection` returns a :class:`KeyedTensor`, as TorchRec's does.

Tables live in the store: a config's table is created there (with ``embedding_dim`` and the
config's ``optimizer``, ``initializer`` and ``table_args``) unless the store already has it,
in which case its ``embedding_dim`` (and any of those arguments given) must be the table's.
Each table is one :class:`~embstore.torch.EmbeddingBag`-like module
(``ebc.embedding_bags[name]``), so :class:`~embstore.torch.EmbeddingOptimizer`,
``state_dict()`` (``embedding_bags.<name>._extra_state``), ``train()``/``eval()`` and dtypes
behave as for :mod:`embstore.torch.sparse`. Two features on one table are one lookup of both
features' ids and one gradient for the table: the optimizer steps each id once per
``step()``, its gradients summed, as for one ``nn.EmbeddingBag``.

Over a distributed store (:class:`~embstore.DistributedStore` under torchrun) a collection's
forward gathers every table's rows from their owners in one exchange of ids and one of rows,
and :class:`~embstore.torch.EmbeddingOptimizer` sends the gradients back in one exchange,
averaged over the processes: a collection wrapped in DDP with the dense model trains as
TorchRec's ``DistributedModelParallel`` does (collective: every process runs every forward).

Sessions take the same input: ``store.session(features=ebc)`` (or a list of configs, or a
mapping of feature name to table name) lets ``ids(batch)`` return a ``KeyedJaggedTensor``, and
``batch.pooled()`` gives the :class:`KeyedTensor` the module would, bit for bit.

Not supported: variable batch sizes per feature (``stride_per_key_per_rank``,
``inverse_indices``), ``data_type`` other than FP32, FP16 and BF16 (the table's storage
dtype), an ``init_fn`` other than ``torch.nn.init.uniform_``/``normal_`` with fixed arguments
(give ``initializer=``), and ``PoolingType.NONE`` in an :class:`EmbeddingBagCollection`
(use :class:`EmbeddingCollection`).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
from torch import nn

from embstore._arrays import as_ids
from embstore.errors import InvalidArgumentError, ShapeError
from embstore.table import Table
from embstore.torch.jagged import (
    EmbeddingBagConfig,
    EmbeddingConfig,
    FeaturePlan,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
    PoolingType,
    TableInput,
    TablePlan,
    initializer_of,
    pool,
    read_jagged,
    storage_dtype,
)
from embstore.torch.sparse import StoreModule

# -- configs ------------------------------------------------------------------------------------


class _TableBags(StoreModule):
    """One table of a collection: a lookup of its features' ids, pooled per bag (or not)."""

    def __init__(
        self,
        table: Table,
        mode: str,
        on_miss: str | None,
        rows_in_state_dict: bool,
        nn_args: dict[str, Any],
    ) -> None:
        super().__init__(table, on_miss, rows_in_state_dict, nn_args)
        self.mode = mode

    def forward(self, inp: TableInput) -> torch.Tensor:
        return self._finish(inp, self._pull(inp.ids))

    def _finish(self, inp: TableInput, rows: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return self._cast(rows)
        return self._cast(pool(rows, inp.offsets, self.mode, inp.weights))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pooling={self.mode!r}"


class _Gathered(torch.autograd.Function):
    """Rows gathered for ``module`` (``float32[N, D]``, one per id); backward stashes their
    gradient on the module, as its own lookup's would."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, module: Any, ids: np.ndarray, rows: Any) -> Any:
        ctx.module, ctx.ids = module, ids
        return torch.from_numpy(rows)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.module.accumulate_grad(ctx.ids, grad)
        return None, None, None, None


_TABLE_ARGS = ("optimizer", "initializer")


# TorchRec's DataType names -> a table's storage dtype (None: float32).
def _open_table(store: Any, plan: TablePlan) -> Table:
    """The store's table for a config: created with the config's arguments if missing, else
    checked against them."""
    c = plan.config
    args = dict(getattr(c, "table_args", None) or {})
    for key in ("name", "embedding_dim"):
        if key in args:
            raise InvalidArgumentError(f"table_args of table {plan.name!r} cannot set {key}")
    optimizer = getattr(c, "optimizer", None)
    init = initializer_of(c, plan.name)
    if optimizer is not None:
        args["optimizer"] = optimizer
    dtype = storage_dtype(c, plan.name)
    if dtype is not None and "dtype" not in args:
        args["dtype"] = dtype
    if plan.name not in store:
        # A seed of the table's own (unless given): TorchRec's ids are row indices 0..N-1, so
        # with one seed for every table, id i would start with the same row in each of them.
        created = {"seed": zlib.crc32(plan.name.encode()), **args}
        return store.create_table(plan.name, plan.dim, initializer=init, **created)
    table = store.table(plan.name)
    if table.embedding_dim != plan.dim:
        raise ShapeError(
            f"embedding_dim mismatch for table {plan.name!r}: the store's table has "
            f"{table.embedding_dim}, the config says {plan.dim}"
        )
    if getattr(c, "initializer", None) is not None:
        args["initializer"] = c.initializer
    spec = table.config
    differ = sorted(k for k, v in args.items() if k not in spec.keys() or spec[k] != v)
    if differ:
        raise InvalidArgumentError(
            f"table {plan.name!r} exists in the store with other {', '.join(differ)} than its "
            "config gives: drop those arguments from the config to use the table as it is"
        )
    return table


class _Collection(nn.Module):
    _attr = ""  # the ModuleDict of per-table modules, under TorchRec's name

    def __init__(
        self,
        store: Any,
        tables: Any,
        bags: bool,
        is_weighted: bool,
        device: Any,
        on_miss: str | None,
        rows_in_state_dict: bool,
        dtype: Any,
    ) -> None:
        super().__init__()
        if not hasattr(store, "create_table") or not hasattr(store, "table"):
            raise InvalidArgumentError(
                f"the first argument must be an embstore.Store, got {type(store).__name__}"
            )
        self._plan = FeaturePlan.from_configs(tables, bags, bool(is_weighted) if bags else False)
        if not bags:  # EmbeddingCollection: unpooled, whatever a config's pooling says
            for p in self._plan.tables:
                p.mode = "none"
        self._configs = list(tables)
        self._is_weighted = bool(is_weighted)
        # A distributed store over several processes: the tables' rows are gathered together
        # (_gather), through a session of the collection's own.
        many = getattr(store, "distributed", False) and store.world_size > 1
        self._store = store if many else None
        self._session: Any = None
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        modules = nn.ModuleDict()
        for p in self._plan.tables:
            if "." in p.name:
                raise InvalidArgumentError(
                    f"table name {p.name!r} cannot name a torch submodule (it has a '.')"
                )
            nn_args = {"dtype": dtype, "device": device}
            modules[p.name] = _TableBags(
                _open_table(store, p), p.mode, on_miss, rows_in_state_dict, nn_args
            )
        setattr(self, self._attr, modules)

    def _lookups(self, features: Any) -> tuple[list[TableInput], list[torch.Tensor]]:
        inputs = self._plan.split(read_jagged(features))  # every check before any lookup
        tables = getattr(self, self._attr)
        modules = [tables[p.name] for p in self._plan.tables]
        if self._store is not None and len({m.lookup_mode() for m in modules}) == 1:
            rows = self._gather(modules, inputs)
            out = [m._finish(i, r) for m, i, r in zip(modules, inputs, rows, strict=True)]
        else:
            out = [m(i) for m, i in zip(modules, inputs, strict=True)]
        return inputs, out

    def _gather(self, modules: list[_TableBags], inputs: list[TableInput]) -> list[torch.Tensor]:
        """A distributed store's tables: every table's rows in one exchange of ids and one of
        rows (each table's own lookup would make its own), wired for backward per module."""
        from embstore.session import Session

        if self._session is None:
            names = [p.name for p in self._plan.tables]
            self._session = Session(self._store, names, prefetch=0, grad_average=False)
        sess = self._session
        arrs = [np.array(as_ids(i.ids.reshape(-1))[0], copy=True) for i in inputs]
        track = torch.is_grad_enabled() and modules[0].training
        rows = sess.lookup_together(
            arrs, modules[0].lookup_mode(), what=f"a collection's lookup of {sess.tables}"
        )
        out = []
        for m, a, r, inp in zip(modules, arrs, rows, inputs, strict=True):
            anchor = torch.empty(0, requires_grad=track)
            t = _Gathered.apply(anchor, m, a, r)
            out.append(t if inp.ids.device.type == "cpu" else t.to(inp.ids.device))
        return out

    @property
    def device(self) -> torch.device:
        return self._device

    def feature_plan(self) -> FeaturePlan:
        """Which table each feature is looked up in, and how its rows are pooled: what
        ``store.session(features=module)`` splits a ``KeyedJaggedTensor`` by."""
        return self._plan


class EmbeddingBagCollection(_Collection):
    """TorchRec's ``EmbeddingBagCollection`` over a store's tables: pooled embeddings of
    jagged features.

    Args:
        store: the :class:`~embstore.Store` holding (or to hold) the tables.
        tables: :class:`EmbeddingBagConfig` (or TorchRec's) per table: its ``name`` is the
            store's table, created if missing (see the module docs).
        is_weighted: pool with the input's ``weights()`` (``pooling`` SUM only), as
            TorchRec's; unweighted collections ignore an input's weights, as TorchRec's do.
        device: accepted for TorchRec's signature; the output is on the input's device.
        on_miss, rows_in_state_dict: as for :class:`~embstore.torch.EmbeddingBag`.
        dtype: the output's dtype (default float32; ``model.half()`` converts it).

    ``forward(features)`` takes a ``KeyedJaggedTensor`` (``[F x B x L]``) and returns a
    :class:`KeyedTensor`: keys the configs' feature names in config order (a feature embedded
    by two tables is ``"feature@table"``, as TorchRec names it), values ``[B, sum(D)]``. A
    feature with no ids in a sample gives zeros. The input's other features are ignored. A bad
    input raises a typed error before any row is looked up.

    Example::

        >>> import embstore, torch, embstore.torch as et
        >>> store = embstore.Store()
        >>> ebc = et.EmbeddingBagCollection(store, [
        ...     et.EmbeddingBagConfig(name="t_item", embedding_dim=4,
        ...                           feature_names=["item", "hist"], pooling="sum"),
        ...     et.EmbeddingBagConfig(name="t_user", embedding_dim=2, feature_names=["user"],
        ...                           pooling="mean")])
        >>> kjt = et.KeyedJaggedTensor.from_lengths_sync(
        ...     keys=["item", "hist", "user"], values=torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        ...     lengths=torch.tensor([1, 1, 2, 0, 1, 2]))
        >>> out = ebc(kjt)
        >>> out.keys(), out.values().shape, out["user"].shape
        (['item', 'hist', 'user'], torch.Size([2, 10]), torch.Size([2, 2]))
    """

    _attr = "embedding_bags"

    def __init__(
        self,
        store: Any,
        tables: list[Any],
        is_weighted: bool = False,
        device: Any = None,
        *,
        on_miss: str | None = None,
        rows_in_state_dict: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            store, tables, True, is_weighted, device, on_miss, rows_in_state_dict, dtype
        )

    def forward(self, features: Any) -> KeyedTensor:
        inputs, pooled = self._lookups(features)
        return self._plan.keyed(pooled, inputs[0].stride)

    def embedding_bag_configs(self) -> list[Any]:
        return list(self._configs)

    def is_weighted(self) -> bool:
        return self._is_weighted


class EmbeddingCollection(_Collection):
    """TorchRec's ``EmbeddingCollection`` over a store's tables: unpooled embeddings.

    Args as for :class:`EmbeddingBagCollection` (configs: :class:`EmbeddingConfig`; tables may
    have different ``embedding_dim``), and ``need_indices``: each result's ``weights()`` are
    the ids, as TorchRec's.

    ``forward(features)`` returns ``{feature: JaggedTensor}``: ``values()`` the ``[N_f, D]``
    rows of the feature's ids, ``lengths()`` its lengths; names as for
    :class:`EmbeddingBagCollection`.
    """

    _attr = "embeddings"

    def __init__(
        self,
        store: Any,
        tables: list[Any],
        device: Any = None,
        need_indices: bool = False,
        *,
        on_miss: str | None = None,
        rows_in_state_dict: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(store, tables, False, False, device, on_miss, rows_in_state_dict, dtype)
        self._need_indices = bool(need_indices)

    def forward(self, features: Any) -> dict[str, JaggedTensor]:
        inputs, rows = self._lookups(features)
        return self._plan.jagged(rows, inputs, indices=self._need_indices)

    def embedding_configs(self) -> list[Any]:
        return list(self._configs)

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_names_by_table(self) -> list[list[str]]:
        return [list(p.names) for p in self._plan.tables]


__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PoolingType",
]
