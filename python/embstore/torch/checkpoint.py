"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): :class:`StoreState`.

An embstore table is not a tensor of a fixed shape: its rows are as many as the ids it has
seen, and in a distributed store (:class:`~embstore.DistributedStore`) each process holds the
rows it owns. DCP plans a load from the shapes of the tensors it is given *before* it reads
anything, so a state dict that carries a table's rows as tensors (``model.state_dict()``:
``<module>._extra_state.ids`` …) saves but does not load ("Size mismatch … for
``…_extra_state.ids``"), and under ``torchrun`` ``model.state_dict()`` refuses a distributed
table outright.

:class:`StoreState` is a ``torch.distributed.checkpoint.stateful.Stateful`` that carries tables
the way DCP can load them: every table's rows cut into a fixed number of ``parts`` (objects DCP
saves as bytes, each written by the process holding its rows), plus each table's dims,
optimizer and step. Loading reads each part on one process of the loading job and sends every
row to the process that owns it there, so a checkpoint written by 2 processes loads onto 1, 2
or 4 (and one written by one process onto many)::

    import torch.distributed.checkpoint as dcp
    from embstore.torch.checkpoint import StoreState

    state = {"model": StoreState(model), "dense_optim": dense_opt.state_dict()}
    dcp.save(state, checkpoint_id="ckpt/step-1000")
    ...                                       # any process count, the same model code
    state = {"model": StoreState(model), "dense_optim": dense_opt.state_dict()}
    dcp.load(state, checkpoint_id="ckpt/step-1000")
    dense_opt.load_state_dict(state["dense_optim"])

``StoreState(model)`` carries the model's own state (``model.state_dict()``: its dense
parameters and buffers, as DCP always does, and each embstore module's header — its table's
name, dims and optimizer, without rows) and the rows of every table its embstore modules use;
``StoreState(store)`` carries every table of a store (training with sessions), and
``StoreState([table, ...])`` the tables given. Each table's rows keep their optimizer state and
metadata, and the table its step counter (Adam's ``t``).

Loading replaces the rows of the tables (rows the checkpoint does not hold are removed, as
``load_state_dict`` does), after checking that the checkpoint holds exactly these tables with
the same ``embedding_dim`` and optimizer (:class:`~embstore.InvalidArgumentError`,
:class:`~embstore.ShapeError`, raised on every process before any row is written). Save and
load at a batch boundary, on every process (both are collective, as DCP is).

Limits: a checkpoint is written by at most ``parts`` processes (default 256; pass a larger
``parts`` to save from more, and the same value to load it); saving copies each process's rows
once (``(D + S) * 4 + 40`` bytes a row, ``S`` optimizer state floats), part by part as DCP
writes them; a loading process holds the rows of its parts and then those it owns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from embstore.config import kind_of
from embstore.distributed import Comm, owner_of
from embstore.distributed.store import DistributedStore
from embstore.distributed.table import DistributedTable
from embstore.errors import InvalidArgumentError, ShapeError
from embstore.store import Store
from embstore.table import Table

__all__ = ["DEFAULT_PARTS", "StoreState"]

#: The ``parts`` of a :class:`StoreState` unless given: the most processes that may save.
DEFAULT_PARTS = 256
# Version of the layout StoreState writes.
_FORMAT = 1
# The row fields of a part, in ExportChunk (and Table.import_) order, with their dtypes.
_SALT = np.uint64(0x5851F42D4C957F2D)
_INTS = ("versions", "replicas", "update_counts", "last_update_ms")


def _store_modules(model: nn.Module) -> list[Any]:
    from embstore.torch.sparse import StoreModule

    return [m for m in model.modules() if isinstance(m, StoreModule)]


def _is_distributed(table: Table) -> bool:
    return bool(table.distributed)


def _local(table: Table) -> Table:
    """This process's partition of ``table`` (the table itself outside a distributed store)."""
    return table.local if _is_distributed(table) else table  # type: ignore[attr-defined]


class _Part:
    """One part of one table's rows on this process, exported only when DCP writes it (when it
    pickles the object): building the state dict for a load, which DCP also does, copies no
    row. It pickles as a plain ``dict`` of CPU tensors; a load gives that dict back."""

    __slots__ = ("_index", "_owner", "_table")

    def __init__(self, owner: StoreState, table: str, index: int) -> None:
        self._owner, self._table, self._index = owner, table, index

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (self._owner._take_part(self._table, self._index),))

    def __repr__(self) -> str:
        return f"<rows of table {self._table!r}, part {self._index}>"


class StoreState:
    """A ``Stateful`` for ``torch.distributed.checkpoint``: the rows of embstore tables (and,
    for a model, the model's own state) in a form DCP saves and loads onto any process count.

    Args:
        source: an ``nn.Module`` (its state and the tables of its embstore modules), a
            :class:`~embstore.Store` (all its tables) or a :class:`~embstore.Table` or a list
            of tables (those tables), of one store.
        parts: the rows of each table are saved in this many parts, each written by one
            process, so at most ``parts`` processes may save; a checkpoint loads only with the
            ``parts`` it was saved with (an :class:`~embstore.InvalidArgumentError` says which).

    Example (one process; under ``torchrun`` the same code saves and loads every process's
    rows)::

        >>> import tempfile, torch.distributed.checkpoint as dcp, embstore, embstore.torch
        >>> from embstore.torch.checkpoint import StoreState
        >>> store = embstore.Store()
        >>> emb = embstore.torch.Embedding(store.create_table("item", 4))
        >>> _ = emb(torch.tensor([1, 2, 3]))
        >>> path = tempfile.mkdtemp()
        >>> _ = dcp.save({"model": StoreState(emb)}, checkpoint_id=path)
        >>> fresh = embstore.torch.Embedding(embstore.Store().create_table("item", 4))
        >>> dcp.load({"model": StoreState(fresh)}, checkpoint_id=path)
        >>> len(fresh.table)
        3
    """

    def __init__(self, source: Any, *, parts: int = DEFAULT_PARTS) -> None:
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= 1 << 16:
            raise InvalidArgumentError(f"parts must be an int in 1..=65536, got {parts!r}")
        self.parts = parts
        self.model: nn.Module | None = None
        tables: list[Table]
        if isinstance(source, nn.Module):
            self.model = source
            tables = [m.table for m in _store_modules(source)]
        elif isinstance(source, Table | DistributedTable):
            tables = [source]
        elif isinstance(source, Store | DistributedStore):
            tables = [source.table(name) for name in source.tables()]
        elif isinstance(source, Iterable) and not isinstance(source, str | bytes):
            tables = list(source)
            bad = [t for t in tables if not isinstance(t, Table | DistributedTable)]
            if bad:
                raise InvalidArgumentError(
                    f"StoreState takes a model, a store, a table or a list of tables; the list "
                    f"holds a {type(bad[0]).__name__}"
                )
        else:
            raise InvalidArgumentError(
                "StoreState takes a model (nn.Module), an embstore.Store, a Table or a list of "
                f"tables, got {type(source).__name__}"
            )
        # One entry per table (a table used by two modules is carried once).
        self.tables: dict[str, Table] = {}
        for t in tables:
            other = self.tables.get(t.name)
            if other is not None and other != t:
                raise InvalidArgumentError(
                    f"two different tables are named {t.name!r}: StoreState carries the tables "
                    "of one store"
                )
            self.tables[t.name] = t
        comms = {id(t.store.comm): t.store.comm for t in tables if _is_distributed(t)}  # type: ignore[attr-defined]
        if len(comms) > 1:
            raise InvalidArgumentError("StoreState carries the tables of one distributed store")
        if comms and any(not _is_distributed(t) for t in tables):
            raise InvalidArgumentError(
                "StoreState cannot mix tables of a distributed store with tables of a store "
                "of this process only"
            )
        self.comm: Comm = next(iter(comms.values())) if comms else Comm.single()
        # Rows exported for saving and not yet handed to DCP: table -> part -> fields.
        self._pending: dict[str, dict[int, dict[str, Any]]] = {}

    # -- saving ---------------------------------------------------------------------------

    def _my_parts(self, world: int, rank: int) -> list[int]:
        return list(range(rank, self.parts, world))

    def state_dict(self) -> dict[str, Any]:
        """What DCP saves (and, before a load, the keys it reads): ``format``, ``parts``, each
        table's header and this process's parts of its rows (exported when written), and for a
        model its ``state_dict()`` with each embstore module's header in place of its rows."""
        comm = self.comm
        if comm.world > self.parts:
            raise InvalidArgumentError(
                f"StoreState(parts={self.parts}) is saved by at most {self.parts} processes and "
                f"this job has {comm.world}: pass parts >= {comm.world} (and the same parts= "
                "when loading)"
            )
        self._pending.clear()
        out: dict[str, Any] = {
            "format": _FORMAT,
            "parts": self.parts,
            # One string (DCP saves it whole, whichever tables the loader has): the tables'
            # headers, so a load sees tables it lacks.
            "tables": json.dumps(
                {
                    name: {
                        "embedding_dim": t.embedding_dim,
                        "state_dim": t.state_dim,
                        "optimizer": kind_of(t.config.optimizer),
                    }
                    for name, t in self.tables.items()
                },
                sort_keys=True,
            ),
            "rows": {
                name: {
                    f"{p:05d}": _Part(self, name, p) for p in self._my_parts(comm.world, comm.rank)
                }
                for name in self.tables
            },
        }
        if self.model is not None:
            out["model"] = _model_state_without_rows(self.model)
        return out

    def _take_part(self, name: str, index: int) -> dict[str, Any]:
        """Part ``index`` of table ``name`` on this process (its rows exported on first use)."""
        pending = self._pending.get(name)
        if pending is None or index not in pending:
            pending = self._pending[name] = self._export(name)
        part = pending.pop(index)
        if not pending:
            del self._pending[name]
        return part

    def _export(self, name: str) -> dict[int, dict[str, Any]]:
        """This process's rows of ``name``, split into its parts by a hash of the id."""
        comm = self.comm
        table = _local(self.tables[name])
        mine = self._my_parts(comm.world, comm.rank)
        step = table.step
        d, s = table.embedding_dim, table.state_dim
        chunks = list(table.export())
        fields: list[np.ndarray] = []
        for i, (shape, dtype) in enumerate(
            [((0,), np.int64), ((0, d), np.float32), ((0, s), np.float32)] + [((0,), np.uint64)] * 4
        ):
            parts = [c[i] for c in chunks]
            fields.append(np.concatenate(parts) if parts else np.empty(shape, dtype))
        del chunks
        ids = fields[0]
        # A hash of its own (salted): the owner hash leaves a process only a narrow band of it.
        where = owner_of(ids.view(np.uint64) ^ _SALT, len(mine)) if len(mine) > 1 else None
        out: dict[int, dict[str, Any]] = {}
        for k, p in enumerate(mine):
            sel = slice(None) if where is None else where == k
            ints = np.stack(
                [f[sel].astype(np.uint64).view(np.int64) for f in fields[3:]], axis=1
            ).reshape(-1, len(_INTS))
            out[p] = {
                "step": int(step),
                "ids": torch.from_numpy(np.ascontiguousarray(ids[sel])),
                "values": torch.from_numpy(np.ascontiguousarray(fields[1][sel])),
                "state": torch.from_numpy(np.ascontiguousarray(fields[2][sel])),
                # versions, replicas, update_counts, last_update_ms (uint64 bits as int64)
                "meta": torch.from_numpy(np.ascontiguousarray(ints)),
            }
        return out

    # -- loading --------------------------------------------------------------------------

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (collective; DCP calls it after reading):
        check everything, then send each row read here to its owner, import the rows each
        process owns, remove the rows the checkpoint does not hold and set each table's step.
        For a model, then ``model.load_state_dict`` (strict)."""
        comm = self.comm
        what = "loading a StoreState checkpoint"
        comm.agreed(what, lambda: self._check(state))
        for name, table in self.tables.items():
            self._load_table(name, table, state["rows"][name], what)
        if self.model is not None:
            comm.agreed(what, lambda: self.model.load_state_dict(state["model"]))  # type: ignore[union-attr]

    def _check(self, state: Any) -> None:
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise InvalidArgumentError(
                f"the checkpoint was not written by embstore's StoreState (format {_FORMAT})"
            )
        if state.get("parts") != self.parts:
            raise InvalidArgumentError(
                f"the checkpoint was saved with StoreState(parts={state.get('parts')}) and is "
                f"loaded with parts={self.parts}: pass parts={state.get('parts')}"
            )
        try:
            saved = json.loads(state.get("tables"))
        except (TypeError, ValueError):
            saved = None
        if not isinstance(saved, dict):
            raise InvalidArgumentError("the checkpoint's StoreState has no table headers")
        extra = sorted(set(saved) - set(self.tables))
        if extra:
            raise InvalidArgumentError(
                f"the checkpoint holds table(s) {extra} that this StoreState does not: create "
                "them (alike) before loading, or load into a StoreState over them"
            )
        for name, table in self.tables.items():
            head = saved[name]
            d, s = table.embedding_dim, table.state_dim
            optimizer = kind_of(table.config.optimizer)
            if head.get("embedding_dim") != d:
                raise ShapeError(
                    f"embedding_dim mismatch for table '{name}': expected {d}, got "
                    f"{head.get('embedding_dim')!r}"
                )
            if head.get("optimizer") != optimizer or head.get("state_dim") != s:
                raise InvalidArgumentError(
                    f"optimizer mismatch for table '{name}': expected {optimizer}, the "
                    f"checkpoint has {head.get('optimizer')!r}"
                )

    def _load_table(self, name: str, table: Table, parts: dict[str, Any], what: str) -> None:
        comm = self.comm
        local = _local(table)
        d, s = table.embedding_dim, table.state_dim
        error: BaseException | None = None
        step = 0
        try:
            got = [parts[k] for k in sorted(parts)]
            for p in got:
                if not isinstance(p, dict) or not {"ids", "values", "state", "meta"} <= set(p):
                    raise InvalidArgumentError(
                        f"a part of table '{name}' was not read (its placeholder is left): "
                        "load with torch.distributed.checkpoint.load"
                    )
            step = max([int(p["step"]) for p in got], default=0)
            ids = _cat([p["ids"] for p in got], (0,), torch.int64).numpy()
            floats = np.concatenate(
                [
                    _cat([p["values"] for p in got], (0, d), torch.float32).numpy(),
                    _cat([p["state"] for p in got], (0, s), torch.float32).numpy(),
                ],
                axis=1,
            )
            ints = _cat([p["meta"] for p in got], (0, len(_INTS)), torch.int64).numpy()
        except Exception as e:  # shared with every process below
            error = e
            ids = np.empty(0, np.int64)
            floats = np.empty((0, d + s), np.float32)
            ints = np.empty((0, len(_INTS)), np.int64)
        if comm.world > 1:
            # Every row to its owner in this job.
            owner = owner_of(ids.view(np.uint64), comm.world)
            order = np.argsort(owner, kind="stable")
            ids, floats, ints = ids[order], floats[order], ints[order]
            counts = np.bincount(owner, minlength=comm.world).astype(np.int64)
            recv = comm.exchange_counts(counts.reshape(-1, 1), error, what, comm.main)[:, 0]
            g = comm.main
            ids = comm.exchange(ids, counts, recv, what, g)
            floats = comm.exchange(
                np.ascontiguousarray(floats).reshape(-1), counts * (d + s), recv * (d + s), what, g
            ).reshape(-1, d + s)
            ints = comm.exchange(
                np.ascontiguousarray(ints).reshape(-1),
                counts * len(_INTS),
                recv * len(_INTS),
                what,
                g,
            ).reshape(-1, len(_INTS))
            step = max(comm.all_gather(step, what))
        elif error is not None:
            raise error

        def write() -> None:
            meta = ints.view(np.uint64)
            stale = [c.ids[~np.isin(c.ids, ids)] for c in local.export()] if len(local) else []
            if len(ids):
                local.import_(
                    ids,
                    np.ascontiguousarray(floats[:, :d]),
                    np.ascontiguousarray(floats[:, d:]),
                    *(np.ascontiguousarray(meta[:, i]) for i in range(len(_INTS))),
                    optimizer=kind_of(table.config.optimizer),
                )
            if stale:
                local.remove(np.concatenate(stale))
            local.step = step

        comm.agreed(what, write)


def _cat(parts: list[Any], empty: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    for p in parts:
        if not isinstance(p, torch.Tensor) or p.dtype != dtype or p.shape[1:] != empty[1:]:
            raise ShapeError(f"a part's rows must be {dtype} [n, ...{list(empty[1:])}]")
    return torch.cat(parts) if parts else torch.empty(empty, dtype=dtype)


def _model_state_without_rows(model: nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with each embstore module's header (its table's name, dims and
    optimizer) in place of its rows."""
    modules = _store_modules(model)
    saved = [m.rows_in_state_dict for m in modules]
    try:
        for m in modules:
            m.rows_in_state_dict = False
        return model.state_dict()
    finally:
        for m, keep in zip(modules, saved, strict=True):
            m.rows_in_state_dict = keep
