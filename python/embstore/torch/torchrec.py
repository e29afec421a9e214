"""Bringing a TorchRec checkpoint into embstore tables: :func:`from_torchrec`.

A TorchRec ``EmbeddingBagCollection`` keeps each table as a dense ``[num_embeddings, D]``
weight, ``embedding_bags.<table>.weight`` in its ``state_dict()`` (an ``EmbeddingCollection``:
``embeddings.<table>.weight``), under the prefix of the module that holds it. Its fused
optimizer (FBGEMM's, ``model.fused_optimizer`` / ``DistributedModelParallel``'s
``KeyedOptimizer``) has a ``state_dict()`` of ``{"state": {<parameter key>: {<state key>:
tensor}}, "param_groups": [...]}`` keyed by the same parameter keys, with state keys
``<table>.momentum1`` (and ``<table>.momentum2``): Adagrad's per-element sum of squares
``[num_embeddings, D]``, row-wise Adagrad's one float per row ``[num_embeddings]``, Adam's
``exp_avg`` and ``exp_avg_sq``. A non-fused ``torch.optim`` wrapped by TorchRec's
``KeyedOptimizerWrapper`` uses torch's names (``sum``; ``exp_avg``, ``exp_avg_sq``, ``step``),
also read here.

Row ``i`` of a TorchRec table becomes id ``i`` of the embstore table, with its optimizer state;
Adam's iteration count becomes the table's step counter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from embstore.config import SGD, Adagrad, Adam, Optimizer, RowWiseAdagrad, kind_of
from embstore.distributed import owner_of
from embstore.errors import DTypeError, InvalidArgumentError, ShapeError
from embstore.table import Table

__all__ = ["from_torchrec"]

# ``...embedding_bags.<table>.weight`` (EmbeddingBagCollection) or ``...embeddings.<table>.weight``
# (EmbeddingCollection), at any prefix.
_WEIGHT = re.compile(r"(?:^|\.)(?:embedding_bags|embeddings)\.([^.]+)\.weight$")
# State names, after dropping a ``<table>.`` prefix: FBGEMM's fused ones and torch's.
_STEP_KEYS = ("step", "iter")


def from_torchrec(
    store: Any,
    state_dict: Mapping[str, Any],
    optimizer_state: Mapping[str, Any] | None = None,
    *,
    optimizer: Optimizer | Mapping[str, Optimizer] | None = None,
    tables: Mapping[str, str] | None = None,
    step: int | None = None,
) -> dict[str, Table]:
    """Import the tables of a TorchRec checkpoint into ``store``; return them by name.

    Args:
        store: the :class:`~embstore.Store` to import into. In a distributed store every
            process calls this with the same checkpoint and keeps the rows it owns.
        state_dict: the ``state_dict()`` of an ``EmbeddingBagCollection`` or
            ``EmbeddingCollection`` (or of a model holding one): every
            ``...embedding_bags.<table>.weight`` / ``...embeddings.<table>.weight`` tensor is a
            table (unsharded; other keys are ignored).
        optimizer_state: the fused optimizer's ``state_dict()`` (``{"state": ...,
            "param_groups": ...}`` keyed by parameter name), or ``None`` to import the
            weights only (the rows' optimizer state starts fresh).
        optimizer: the embstore optimizer of the tables this creates (one for all, or a dict
            by table name). Default: the one the optimizer state's layout names —
            :class:`~embstore.Adagrad` (``D`` floats a row), :class:`~embstore.RowWiseAdagrad`
            (one), :class:`~embstore.Adam` (two moments) — with the checkpoint's ``lr`` (its
            ``param_groups``) and embstore's defaults for the rest; :class:`~embstore.SGD`
            without optimizer state. A table that exists already keeps its own optimizer,
            which must match the state. A table this creates stores its rows in the
            weights' dtype when they are ``float16`` or ``bfloat16`` (TorchRec's
            ``data_type`` FP16/BF16), else in float32; an existing table keeps its own.
        tables: embstore table names by TorchRec table name (default: the same names); a
            TorchRec table left out of a given mapping is not imported.
        step: the table step counter to set (Adam's ``t``) where the optimizer state holds
            none; TorchRec's fused Adam keeps its iteration count outside its state dict, so
            Adam state without a ``step`` needs this.

    Raises:
        InvalidArgumentError: no table in ``state_dict``; an optimizer state embstore has no
            optimizer for (FBGEMM's partial row-wise Adam, LAMB, ...), or that does not match
            the table's optimizer; Adam state without a step; optimizer state keyed by
            parameter index rather than name.
        ShapeError: a weight that is not ``[num_embeddings, D]``, an existing table of
            another ``embedding_dim``, state of the wrong shape.
        DTypeError: a weight that is not a floating-point tensor.

    Nothing is written until every table is checked.
    """
    found = _weights(state_dict, tables)
    states = _optimizer_states(optimizer_state, set(found)) if optimizer_state is not None else {}
    lrs = _lrs(optimizer_state, set(found)) if optimizer_state is not None else {}
    plans = []
    for tr_name, (es_name, weight) in found.items():
        n, d = weight.shape
        st = states.get(tr_name, {})
        layout, state, st_step = _layout(tr_name, st, n, d)
        if layout == "adam" and step is None and st_step is None:
            raise InvalidArgumentError(
                f"TorchRec table '{tr_name}' has Adam state and no step: pass step= (the "
                "iterations it trained for), which Adam's bias correction goes on from"
            )
        table_step = step if step is not None else st_step
        if es_name in store:
            table = store.table(es_name)
            if table.embedding_dim != d:
                raise ShapeError(
                    f"embedding_dim mismatch for table '{es_name}': it has "
                    f"{table.embedding_dim}, TorchRec table '{tr_name}' has {d}"
                )
            kind = kind_of(table.config.optimizer)
            _check_kind(tr_name, es_name, kind, layout)
            spec = None
        else:
            opt = optimizer.get(tr_name) if isinstance(optimizer, Mapping) else optimizer
            if opt is None:
                opt = _default_optimizer(layout, lrs.get(tr_name))
            kind = kind_of(opt)
            _check_kind(tr_name, es_name, kind, layout)
            # A TorchRec table of FP16/BF16 weights (its config's data_type) is created at
            # that storage dtype, as EmbeddingBagConfig(data_type=...) creates it.
            spec = (es_name, d, opt, _STORAGE_DTYPES.get(weight.dtype, "fp32"))
        plans.append((es_name, weight, state, table_step, kind, spec))
    out: dict[str, Table] = {}
    for es_name, weight, state, table_step, kind, spec in plans:
        if spec is not None:
            store.create_table(spec[0], spec[1], optimizer=spec[2], dtype=spec[3])
        table = store.table(es_name)
        local = table.local  # this process's rows (the table itself in one process)
        ids = np.arange(weight.shape[0], dtype=np.int64)
        values = weight.detach().to("cpu", torch.float32).contiguous().numpy()
        if state is not None:
            state = state.detach().to("cpu", torch.float32).contiguous().numpy()
        world = store.world_size
        if world > 1:
            mine = owner_of(ids.view(np.uint64), world) == store.rank
            ids, values = ids[mine], values[mine]
            state = None if state is None else state[mine]
        if len(ids):
            local.import_(
                ids,
                values,
                state,
                optimizer=kind if state is not None else None,
            )
        if table_step is not None:
            local.step = table_step
        out[es_name] = table
    return out


# A weight's torch dtype -> the storage dtype of the table created for it (else fp32).
_STORAGE_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _weights(
    state_dict: Mapping[str, Any], tables: Mapping[str, str] | None
) -> dict[str, tuple[str, torch.Tensor]]:
    """TorchRec table name -> (embstore table name, weight)."""
    if not isinstance(state_dict, Mapping):
        raise InvalidArgumentError(
            f"state_dict must be a TorchRec module's state_dict(), got {type(state_dict).__name__}"
        )
    found: dict[str, tuple[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        m = _WEIGHT.search(str(key))
        if m is None:
            continue
        name = m.group(1)
        if tables is not None and name not in tables:
            continue
        if not _plain(value):
            raise InvalidArgumentError(
                f"{key} is a {type(value).__name__}, not a plain tensor: import an unsharded "
                "state dict (load the checkpoint onto one process, or gather the shards)"
            )
        if not value.dtype.is_floating_point:
            raise DTypeError(f"{key} must be a floating-point tensor, got {value.dtype}")
        if value.dim() != 2 or value.shape[1] < 1:
            raise ShapeError(f"{key} must be [num_embeddings, D], got {list(value.shape)}")
        if name in found:
            raise InvalidArgumentError(f"table '{name}' appears twice in the state dict")
        found[name] = (name if tables is None else str(tables[name]), value)
    if not found:
        raise InvalidArgumentError(
            "no TorchRec table in the state dict: expected keys '...embedding_bags.<table>.weight'"
            " (EmbeddingBagCollection) or '...embeddings.<table>.weight' (EmbeddingCollection)"
        )
    return found


def _optimizer_states(opt_state: Mapping[str, Any], names: set[str]) -> dict[str, dict[str, Any]]:
    """TorchRec table name -> its state, with state keys stripped of ``<table>.``."""
    state = opt_state.get("state") if isinstance(opt_state, Mapping) else None
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(
            "optimizer_state must be the fused optimizer's state_dict(): {'state': {...}, "
            "'param_groups': [...]}"
        )
    out: dict[str, dict[str, Any]] = {}
    for key, per_param in state.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(
                "optimizer_state is keyed by parameter index: give the state_dict() of TorchRec's "
                "KeyedOptimizer (model.fused_optimizer, keyed by parameter name)"
            )
        m = _WEIGHT.search(key)
        if m is None or m.group(1) not in names:
            continue
        name = m.group(1)
        out[name] = {
            (k[len(name) + 1 :] if str(k).startswith(name + ".") else str(k)): v
            for k, v in dict(per_param).items()
        }
    return out


def _lrs(opt_state: Mapping[str, Any], names: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for group in opt_state.get("param_groups") or []:
        if not isinstance(group, Mapping) or "lr" not in group:
            continue
        for key in group.get("params", []):
            m = _WEIGHT.search(str(key))
            if m is not None and m.group(1) in names:
                out[m.group(1)] = float(group["lr"])
    return out


def _layout(name: str, st: dict[str, Any], n: int, d: int) -> tuple[str, Any, int | None]:
    """The embstore optimizer kind the state's layout is, the state as embstore's ``[n, S]``
    (``None`` without state) and the step it holds."""
    st = dict(st)
    st_step = None
    for k in _STEP_KEYS:
        if k in st:
            v = st.pop(k)
            st_step = int(v.item() if isinstance(v, torch.Tensor) else v)
    names = set(st)
    if not names:
        return "none", None, st_step
    for k, v in st.items():
        if not _plain(v):
            raise InvalidArgumentError(
                f"optimizer state '{k}' of table '{name}' is a {type(v).__name__}, not a plain "
                "tensor: import an unsharded optimizer state dict"
            )
    m1 = st.get("momentum1", st.get("sum", st.get("exp_avg")))
    m2 = st.get("momentum2", st.get("exp_avg_sq"))
    known = {"momentum1", "momentum2", "sum", "exp_avg", "exp_avg_sq"}
    if names - known or m1 is None:
        raise InvalidArgumentError(
            f"the optimizer state of TorchRec table '{name}' ({sorted(names)}) is of an optimizer "
            "embstore has no equivalent for; embstore has SGD, Adagrad, row-wise Adagrad, Adam "
            "and FTRL. Import the weights alone (optimizer_state=None)"
        )

    def shaped(t: Any, want: tuple[int, ...], what: str) -> torch.Tensor:
        if tuple(t.shape) != want:
            raise ShapeError(
                f"{what} of TorchRec table '{name}' must be {list(want)}, got {list(t.shape)}"
            )
        return t.detach().to("cpu", torch.float32)

    if m2 is None:
        if m1.dim() == 1 or tuple(m1.shape) == (n, 1):
            return "rowwise_adagrad", shaped(m1.reshape(-1), (n,), "momentum1").reshape(n, 1), None
        return "adagrad", shaped(m1, (n, d), "momentum1 (sum of squares)"), None
    if m1.dim() != 2 or m2.dim() != 2:
        raise InvalidArgumentError(
            f"the optimizer state of TorchRec table '{name}' has a per-row second moment "
            f"({list(m2.shape)}: FBGEMM's partial row-wise Adam), which embstore has no "
            "optimizer for; import the weights alone (optimizer_state=None)"
        )
    m = shaped(m1, (n, d), "exp_avg (momentum1)")
    v = shaped(m2, (n, d), "exp_avg_sq (momentum2)")
    return "adam", torch.cat([m, v], dim=1), st_step


def _default_optimizer(layout: str, lr: float | None) -> Optimizer:
    cls = {"none": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad, "adam": Adam}[layout]
    return cls() if lr is None else cls(lr=lr)


def _plain(t: Any) -> bool:
    """A dense tensor (not a ShardedTensor, DTensor or other wrapper)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter)


def _check_kind(tr_name: str, es_name: str, kind: str, layout: str) -> None:
    """The table's optimizer ``kind`` can take state of ``layout`` (``"none"``: no state,
    which every optimizer takes: its rows start with fresh state)."""
    if layout == "none":
        return
    if kind != layout:
        raise InvalidArgumentError(
            f"optimizer mismatch for table '{es_name}': it uses {kind}, the optimizer state of "
            f"TorchRec table '{tr_name}' is {layout}'s"
        )
