"""The embedded store: named embedding tables in this process.

Shape letters: ``B`` ids in a batch, ``D`` the table's ``embedding_dim``, ``S`` optimizer state
floats per row (``Table.state_dim``).

Ids are raw 64-bit feature ids — no vocabulary to build. They may come as numpy arrays, torch
tensors or Python sequences of ``int64`` or ``uint64`` (an ``int64`` id ``-1`` and the ``uint64``
id ``2**64 - 1`` are the same row); contiguous ``int64`` arrays and CPU tensors are used without
a copy. Results are numpy arrays, or torch tensors on the ids' device when the ids are a tensor.
Every batch call releases the GIL, so threads can share a table.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import pathlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from embstore import _native
from embstore.config import (
    _INITIALIZERS,
    _OPTIMIZERS,
    SGD,
    Initializer,
    Normal,
    Optimizer,
    from_params,
    to_params,
)
from embstore.errors import (
    DTypeError,
    InvalidArgumentError,
    ShapeError,
    StoreClosedError,
)


def _torch_tensor(x: Any) -> Any:
    """``x`` if it is a torch tensor (without importing torch), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x
    return None


def _as_ids(ids: Any) -> tuple[np.ndarray, Any]:
    """Normalise ``ids`` to a contiguous ``uint64[B]`` array; also return the torch device of
    tensor input (None for anything else)."""
    device = None
    if type(ids) is np.ndarray:
        arr = ids
        if arr.dtype.kind == "O" and arr.ndim == 1:
            arr = _python_ints(arr.tolist(), arr)
    elif (t := _torch_tensor(ids)) is not None:
        device = t.device
        if t.dtype.is_floating_point or t.dtype.is_complex:  # bfloat16 has no numpy dtype
            raise DTypeError(f"ids must be 1-D int64, got {t.dim()}-D {str(t.dtype)[6:]}")
        arr = _torch_numpy(t)  # a bool tensor is refused by the dtype check below
    else:
        arr = np.asarray(ids)
        if arr.size == 0 and arr.dtype.kind == "f":  # [] is float64 to numpy
            arr = arr.astype(np.int64)
        elif arr.dtype.kind in "fO" and arr.ndim == 1:
            arr = _python_ints(ids, arr)
    if arr.dtype != np.int64 and arr.dtype != np.uint64:
        if arr.dtype.kind not in "iu":
            raise DTypeError(f"ids must be 1-D int64, got {arr.ndim}-D {arr.dtype}")
        arr = arr.astype(np.int64)
    if arr.ndim != 1:
        raise ShapeError(f"ids must be 1-D int64, got {arr.ndim}-D {arr.dtype}")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.require(arr, requirements=("C", "A"))  # a strided or misaligned view: copy
    return arr.view(np.uint64), device


def _python_ints(seq: Any, arr: np.ndarray) -> np.ndarray:
    """A sequence of Python ints that numpy could not type (it mixes ids below 2**63 with ids
    at or above it) as ``uint64``; anything else comes back unchanged for the dtype check."""
    items = list(seq)
    if not all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in items):
        return arr
    if any(not -(2**63) <= int(x) < 2**64 for x in items):
        raise InvalidArgumentError("ids must fit in 64 bits (-2**63 <= id < 2**64)")
    return np.fromiter((int(x) & (2**64 - 1) for x in items), dtype=np.uint64, count=len(items))


def _torch_numpy(t: Any) -> np.ndarray:
    """A CPU tensor's data as numpy (no copy when contiguous); other devices are copied."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().numpy()


def _as_rows(x: Any, n: int, table: Table, what: str) -> np.ndarray:
    """Normalise ``x`` to a C-contiguous ``float32[n, D]`` array."""
    if (t := _torch_tensor(x)) is not None:
        if not t.dtype.is_floating_point:
            raise DTypeError(f"{what} must be float32, got {str(t.dtype)[6:]}")
        # float16/bfloat16 (AMP) become float32 here: numpy has no bfloat16.
        x = _torch_numpy(t.float())  # .float() is a no-op for float32
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        if arr.dtype.kind != "f" and not (arr.size == 0 and arr.dtype.kind in "iuf"):
            raise DTypeError(f"{what} must be float32, got {arr.dtype}")
        arr = arr.astype(np.float32)
    if arr.ndim == 1 and arr.size == 0 and n == 0:
        arr = arr.reshape(0, table.embedding_dim)
    if arr.ndim != 2:
        raise ShapeError(f"{what} must be 2-D [B, D], got {arr.ndim}-D shape {list(arr.shape)}")
    if arr.shape[1] != table.embedding_dim:
        raise ShapeError(
            f"embedding_dim mismatch for table '{table.name}': "
            f"expected {table.embedding_dim}, got {arr.shape[1]}"
        )
    if arr.shape[0] != n:
        raise ShapeError(f"{what} has {arr.shape[0]} rows for {n} ids")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.require(arr, requirements=("C", "A"))
    return arr


def _check_out(out: Any, ids: np.ndarray, dim: int) -> None:
    """``out`` must be a writable, aligned, C-contiguous ``float32[B, D]`` numpy array that
    shares no memory with the ids: anything else would be written wrongly, or not at all."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        kind = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise DTypeError(f"out must be a float32 numpy array, got {kind}")
    if out.shape != (len(ids), dim):
        raise ShapeError(
            f"out must be [{len(ids)}, {dim}] for {len(ids)} ids, got {list(out.shape)}"
        )
    if not (out.flags.c_contiguous and out.flags.aligned):
        raise ShapeError("out must be a C-contiguous, aligned float32 [B, D] array")
    if not out.flags.writeable:
        raise InvalidArgumentError("out is read-only")
    if np.may_share_memory(out, ids):
        raise InvalidArgumentError("out shares memory with the ids")


def _uint_array(x: Any, dtype: Any, what: str, n: int) -> np.ndarray:
    """``x`` as a contiguous ``dtype[n]`` array of non-negative integers that fit ``dtype``."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise DTypeError(f"{what} must be integers, got {arr.dtype}")
    if arr.shape != (n,):
        raise ShapeError(f"{what} must be [{n}], got {list(arr.shape)}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, got {arr.min()}")
    if arr.size and int(arr.max()) > np.iinfo(dtype).max:
        raise InvalidArgumentError(f"{what} must be at most {np.iinfo(dtype).max}, got {arr.max()}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _out(arr: np.ndarray, device: Any) -> Any:
    """``arr`` as a torch tensor on ``device`` when the ids were a tensor, else as is."""
    if device is None:
        return arr
    torch = sys.modules["torch"]
    t = torch.from_numpy(arr)
    return t if device.type == "cpu" else t.to(device)


class ExportChunk(NamedTuple):
    """A chunk of rows from :meth:`Table.export`; ``n`` rows.

    The first four fields are ``(ids, values, state, versions)``; pass the whole chunk to
    :meth:`Table.import_` as ``table.import_(*chunk)``: it checks that the optimizer matches and
    carries the step counter over.
    """

    ids: np.ndarray  #: ``int64[n]``
    values: np.ndarray  #: ``float32[n, D]``
    state: np.ndarray  #: ``float32[n, S]`` optimizer state
    versions: np.ndarray  #: ``uint64[n]`` hybrid timestamps (ms << 16 | counter); 0: never updated
    replicas: np.ndarray  #: ``uint32[n]`` replica that wrote each version
    update_counts: np.ndarray  #: ``uint64[n]`` writes to each row
    last_update_ms: np.ndarray  #: ``uint64[n]`` last write (or creation), ms since the epoch
    optimizer: str | None = None  #: the exporting table's optimizer (its state's meaning)
    step: int | None = None  #: the exporting table's step counter (Adam's ``t``)


class Table:
    """An embedding table: rows of ``embedding_dim`` float32 values keyed by 64-bit ids.

    Get one from :meth:`Store.create_table` or :meth:`Store.table`. Safe to use from many
    threads; every batch call releases the GIL.

    Example::

        >>> import embstore, numpy as np
        >>> store = embstore.Store()
        >>> t = store.create_table("item", embedding_dim=4, optimizer=embstore.SGD(lr=0.5))
        >>> rows = t.lookup([10, 11, 10])          # [B, D]; new ids get their initial row
        >>> rows.shape, len(t)
        ((3, 4), 2)
        >>> t.apply_gradients([10, 10], np.ones((2, 4), np.float32))  # duplicates summed
        1
        >>> bool(np.allclose(t.lookup([10]), rows[0] - 0.5 * 2))
        True
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: _native.Table):
        self._inner = inner

    def __repr__(self) -> str:
        return repr(self._inner)

    def __eq__(self, other: object) -> bool:
        """Two handles are equal when they reach the same table (``store.table(name)`` returns a
        new handle on every call)."""
        return isinstance(other, Table) and other._inner.uid == self._inner.uid

    def __hash__(self) -> int:
        return hash(self._inner.uid)

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def name(self) -> str:
        """The table's name."""
        return self._inner.name

    @property
    def embedding_dim(self) -> int:
        """Values per row (``D``)."""
        return self._inner.embedding_dim

    @property
    def state_dim(self) -> int:
        """Optimizer state floats per row (``S``): 0 for SGD, ``D`` for Adagrad, 1 for row-wise
        Adagrad, ``2 * D`` for Adam and FTRL."""
        return self._inner.state_dim

    @property
    def step(self) -> int:
        """``apply_gradients`` calls so far (Adam's ``t``). Settable, e.g. to restore it with
        rows imported from another table."""
        return self._inner.step

    @step.setter
    def step(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise InvalidArgumentError(f"step must be an int >= 0, got {value!r}")
        self._inner.set_step(int(value))

    @property
    def config(self) -> dict[str, Any]:
        """The table's configuration, as the keyword arguments of :meth:`Store.create_table`:
        ``store.create_table(**table.config)`` makes a table configured alike (rename it by
        passing ``name=`` after the dict, e.g. ``{**table.config, "name": "copy"}``)."""
        c = self._inner.config()
        return {
            "name": c["name"],
            "embedding_dim": c["embedding_dim"],
            "optimizer": from_params(c["optimizer"]),
            "initializer": from_params(c["initializer"]),
            "num_shards": c["num_shards"],
            "seed": c["seed"],
            "admission_min_count": c["admission_min_count"],
            "admission_sketch_width": c["admission_sketch_width"],
            "ttl": c["ttl_seconds"],
            "on_non_finite": "skip" if c["skip_non_finite"] else "error",
            "huge_pages": c["huge_pages"],
        }

    def lookup(
        self,
        ids: Any,
        on_miss: str = "init",
        *,
        return_found: bool = False,
        out: np.ndarray | None = None,
    ) -> Any:
        """Rows of ``ids``: ``float32[B, D]``.

        Args:
            ids: ``int64[B]`` or ``uint64[B]`` (numpy, torch or a sequence).
            on_miss: for an id without a row — ``"init"``: return its initial value and store
                it (training; with admission, only once the id was seen often enough);
                ``"zeros"``: return zeros and store nothing (serving); ``"error"``: raise
                :class:`KeyNotFoundError` naming the first missing id.
            return_found: also return ``bool[B]``, whether each id had a row.
            out: a writable, C-contiguous ``float32[B, D]`` numpy array to write the rows into
                (and return), e.g. one buffer reused by a serving loop. Anything else (another
                dtype or shape, Fortran order, a read-only array, one sharing memory with
                ``ids``) raises before anything is read.

        Returns:
            ``values`` or ``(values, found)``; numpy, or torch on the ids' device.
        """
        arr, device = _as_ids(ids)
        if out is None:
            out = np.empty((len(arr), self._inner.embedding_dim), np.float32)
        else:
            _check_out(out, arr, self._inner.embedding_dim)
        found = np.empty(len(arr), np.bool_) if return_found else None
        self._inner.lookup(arr, out, on_miss, found)
        if return_found:
            return _out(out, device), _out(found, device)
        return _out(out, device)

    def apply_gradients(self, ids: Any, grads: Any, *, lr: float | None = None) -> int:
        """One optimizer step per unique id, with the gradients of duplicate ids summed first
        (as torch coalesces sparse gradients).

        Args:
            ids: ``int64[B]``.
            grads: ``float32[B, D]`` (other float dtypes are converted).
            lr: learning rate for this call instead of the optimizer's.

        Returns:
            Rows stepped (unique ids, less any dropped by admission or skipped as non-finite).

        Raises:
            ShapeError: ``grads`` is not ``[B, D]``.
            NonFiniteError: a gradient is NaN or infinite (unless the table skips them);
                nothing is applied.
        """
        arr, _ = _as_ids(ids)
        rows = _as_rows(grads, len(arr), self, "grads")
        return self._inner.apply_gradients(arr, rows, None if lr is None else float(lr))

    def assign(self, ids: Any, values: Any) -> None:
        """Set rows: ``values`` is ``float32[B, D]``; missing ids get a row; for a repeated id
        the last row wins; optimizer state of existing rows is kept."""
        arr, _ = _as_ids(ids)
        self._inner.assign(arr, _as_rows(values, len(arr), self, "values"))

    @property
    def tiered(self) -> bool:
        """Whether rows may live on disk (the store has a ``memory_budget_bytes``)."""
        return self._inner.tiered

    def pin(self, ids: Any) -> None:
        """Keep the rows of ``ids`` in memory until :meth:`unpin` (counted: pin twice, unpin
        twice). Only matters with a memory budget; a no-op otherwise. The rows pinned in all
        the store's tables together may take at most 60 % of the budget: beyond that
        :class:`CapacityError` says so (a working set too large for the budget), instead of
        thrashing or blocking."""
        self._inner.pin(_as_ids(ids)[0])

    def prefetch(self, ids: Any) -> int:
        """Bring the rows of ``ids`` that are on disk into memory now, as a lookup would,
        without reading or changing any value; return how many rows were read from disk.
        Meant for a thread that reads the next batch's rows while this one trains (see
        :func:`embstore.prefetch`, which also pins them until their batch is done); ids with
        no row are ignored. Without a memory budget it does nothing and returns 0."""
        return self._inner.prefetch(_as_ids(ids)[0])

    def unpin(self, ids: Any) -> None:
        """Release pins taken by :meth:`pin`. Where the released rows leave the store over its
        memory budget, the excess is evicted here, so the store is back under its budget when
        training stops."""
        self._inner.unpin(_as_ids(ids)[0])

    @contextlib.contextmanager
    def pinned(self, ids: Any) -> Iterator[None]:
        """``with table.pinned(ids):`` keeps the rows of ``ids`` in memory for the block —
        between a batch's lookup and its ``apply_gradients``, the working set of a step."""
        arr = _as_ids(ids)[0]
        self._inner.pin(arr)
        try:
            yield
        finally:
            self._inner.unpin(arr)

    def remove(self, ids: Any) -> int:
        """Remove the rows of ``ids``; return how many existed."""
        return self._inner.remove(_as_ids(ids)[0])

    def contains(self, ids: Any) -> Any:
        """``bool[B]``: whether each id has a row."""
        arr, device = _as_ids(ids)
        return _out(self._inner.contains(arr), device)

    def initial_values(self, ids: Any) -> Any:
        """``float32[B, D]``: the initial value each id gets (stores nothing)."""
        arr, device = _as_ids(ids)
        out = np.empty((len(arr), self._inner.embedding_dim), np.float32)
        self._inner.initial_rows(arr, out)
        return _out(out, device)

    def metadata(self, ids: Any) -> dict[str, np.ndarray]:
        """Per-id metadata: ``found``, ``versions``, ``replicas``, ``update_counts``,
        ``last_update_ms`` (zeros where ``found`` is False)."""
        keys = ("found", "versions", "replicas", "update_counts", "last_update_ms")
        return dict(zip(keys, self._inner.meta(_as_ids(ids)[0]), strict=True))

    def clear(self) -> None:
        """Remove every row; reset the step counter and the admission counts."""
        self._inner.clear()

    def export(self, chunk_rows: int = 65536) -> Iterator[ExportChunk]:
        """Iterate over every row, ``chunk_rows`` (>= 1) at a time, as :class:`ExportChunk`.

        Each row is consistent (values, state and metadata of one moment); rows written while
        the export runs may appear old or new.
        """
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int | np.integer):
            raise InvalidArgumentError(f"chunk_rows must be an int, got {chunk_rows!r}")
        if chunk_rows < 1:
            raise InvalidArgumentError(f"chunk_rows must be at least 1, got {chunk_rows}")
        native = self._inner.export(int(chunk_rows))
        return (ExportChunk(*chunk) for chunk in native)

    def import_(
        self,
        ids: Any,
        values: Any,
        state: Any = None,
        versions: Any = None,
        replicas: Any = None,
        update_counts: Any = None,
        last_update_ms: Any = None,
        optimizer: str | None = None,
        step: int | None = None,
    ) -> None:
        """Write exported rows (``table.import_(*chunk)``): values, optionally optimizer state
        ``float32[B, S]`` and metadata (all four arrays or none; without them the rows get a
        fresh version). ``optimizer`` (the exporting table's) must be this table's — state of
        another optimizer is refused even when its width matches; ``step`` raises this table's
        step counter to the exporting table's, so Adam's bias correction goes on from there.
        ``last_update_ms`` is kept only for rows never written (version 0): a written row's
        last update is its version's millisecond."""
        arr, _ = _as_ids(ids)
        rows = _as_rows(values, len(arr), self, "values")
        st = None
        if state is not None:
            st = np.ascontiguousarray(state, dtype=np.float32)
            if st.shape != (len(arr), self.state_dim):
                raise ShapeError(
                    f"state must be [{len(arr)}, {self.state_dim}], got {list(st.shape)}"
                )
        meta = [versions, replicas, update_counts, last_update_ms]
        names = ["versions", "replicas", "update_counts", "last_update_ms"]
        dtypes = [np.uint64, np.uint32, np.uint64, np.uint64]
        meta = [
            None if m is None else _uint_array(m, d, name, len(arr))
            for m, d, name in zip(meta, dtypes, names, strict=True)
        ]
        if step is not None and (
            isinstance(step, bool)
            or not isinstance(step, int | np.integer)
            or not 0 <= step < 2**64
        ):
            raise InvalidArgumentError(f"step must be an int >= 0, got {step!r}")
        self._inner.import_(arr, rows, st, *meta, optimizer, None if step is None else int(step))

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write every row, its optimizer state and metadata, and the config to ``path``
        (replaced atomically); return the row count."""
        return self._inner.save(os.fspath(path))

    def load(self, path: str | os.PathLike[str]) -> int:
        """Replace every row with those saved in ``path``; return the row count. The file is
        checked first: a corrupt file or one of another ``embedding_dim`` or optimizer raises
        (:class:`CorruptionError`, :class:`ShapeError`) and changes nothing."""
        return self._inner.load(os.fspath(path))

    def evict_expired(self) -> int:
        """Remove rows not updated for the table's ``ttl``; return how many."""
        return self._inner.evict_expired()

    def evict_older_than(self, cutoff: float | _dt.datetime) -> int:
        """Remove rows whose last update (or creation, for rows never written) is before
        ``cutoff`` — a timezone-aware datetime or seconds since the Unix epoch; return how
        many."""
        if isinstance(cutoff, _dt.datetime):
            if cutoff.tzinfo is None:
                raise InvalidArgumentError("cutoff must be timezone-aware (e.g. tz=UTC)")
            cutoff = cutoff.timestamp()
        if isinstance(cutoff, bool) or not isinstance(cutoff, int | float | np.number):
            raise InvalidArgumentError(f"cutoff must be a datetime or seconds, got {cutoff!r}")
        if not 0 <= cutoff < 2**53:
            raise InvalidArgumentError(f"cutoff must be >= 0 seconds since the epoch, got {cutoff}")
        return self._inner.evict_older_than(int(cutoff * 1000))

    def stats(self) -> dict[str, Any]:
        """Counters and sizes; cheap (O(shards)), so a monitoring thread may poll it.

        ``rows``; ``bytes_reserved`` (allocated for indexes, arenas, metadata, free lists and
        the admission sketch — an upper bound on resident memory) and ``bytes`` (the same);
        ``bytes_used`` (what live rows occupy: values, state, 16 B of metadata and a 16 B index
        bucket each); ``hits``, ``misses``, ``inserts``, ``updates``, ``removed``,
        ``evicted``, ``dropped_unadmitted``, ``skipped_non_finite``, ``repaired_on_load``
        (rows read from a file whose values or state were not finite, written by an older
        embstore: state reset, non-finite values re-initialised), ``step``, ``rows_per_shard``;
        with a memory budget, ``rows_on_disk`` (of ``rows``), ``cold_reads`` (rows read back
        from disk), ``cold_read_ios`` (the reads that brought them: records that share a page
        or lie within 16 KiB of each other in a file are read together), ``evicted_to_disk``
        (rows moved out of memory) and ``eviction_rounds`` since the store opened, and
        ``eviction_errors`` with ``last_eviction_error`` (the message of the last eviction that
        failed, or ``None``): on a full disk the rows stay in memory and the next call over the
        budget raises :class:`NoSpaceError` until space is freed."""
        return self._inner.stats()

    def index_stats(self) -> dict[str, Any]:
        """A full scan of every shard's index (O(rows); for diagnosis, not for polling):
        ``len``, ``capacity``, ``apcl`` (average probed cachelines per lookup), ``longest_chain``,
        ``displaced``."""
        return self._inner.index_stats()


class Store:
    """Named embedding tables: held in memory (the default), or kept in a directory.

    Args:
        path: a directory to keep the store in, opened if it holds one and created otherwise.
            Writes live in memory until :meth:`flush` makes them durable; after a crash,
            reopening gives every row its value at the last flush (or a later one). One
            process opens a directory at a time (:class:`StoreLockedError`). ``None``: a store
            held only in memory, exactly as fast as ever.
        replica_id: written into every row version (used by replication later); 0..=2**31 - 1.
        memory_budget_bytes: with ``path``, the bytes of memory the tables may hold (indexes,
            rows, metadata, all counted); rows beyond it live on disk only and are read back
            when a call uses them, so tables may be many times larger than memory. Lookups of
            rows in memory are as fast as ever; a row on disk costs one read. ``None`` (the
            default): every row in memory.
        background_eviction: with a memory budget, ``True`` has a thread of the store evict
            rows once the tables pass 95 % of the budget, so that calls rarely wait for an
            eviction: use it when training calls the store directly (1.2 times the disk
            bound at 50M rows vs 1.36 without, docs/benchmarks.md). ``False`` (the default;
            faster with :func:`embstore.prefetch`, whose thread then does the evictions): a
            call that brought rows in and left the store over its budget evicts on its own
            thread; calls that brought none never wait for an eviction. Indexes and pinned
            rows are never evicted: when they alone pass the budget, other rows may take 5 %
            of it (``docs/storage.md``).
        eviction: with a memory budget, which rows leave memory first: ``"lru_lfu"`` (the
            default: a CLOCK recency segment in front of a sampled LFU, 15 B per hot row),
            ``"none"`` (never evict), or one of the inference cache's policies run on the
            store's rows: ``"lru"`` (exact LRU), ``"lfu"`` (LFU with aging) or
            ``"group_lfu"`` (each access a one-key request; ~26-31 B per hot row). The store
            replays concurrent hits into these in batches (docs/cache.md).

    Example::

        >>> import embstore
        >>> store = embstore.Store()
        >>> user = store.create_table(
        ...     "user", embedding_dim=64,
        ...     optimizer=embstore.Adagrad(lr=0.05), initializer=embstore.Normal(std=0.01))
        >>> store.tables()
        ['user']
        >>> store["user"].lookup([1, 2**40]).shape
        (2, 64)

    A durable store, a checkpoint and a restore onto another shard count::

        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> store = embstore.Store(root / "ctr")
        >>> item = store.create_table("item", embedding_dim=8)
        >>> _ = item.lookup([1, 2, 3])
        >>> _ = store.flush()                       # every write so far is durable
        >>> ckpt = store.checkpoint(root / "ckpt-1")
        >>> _ = item.lookup([4])
        >>> inc = store.checkpoint(root / "ckpt-2", since=ckpt)   # only what changed
        >>> copy = embstore.Store.restore(inc, root / "copy", num_shards=2)
        >>> len(copy["item"]), copy["item"].config["num_shards"]
        (4, 2)
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        replica_id: int = 0,
        memory_budget_bytes: int | None = None,
        background_eviction: bool = False,
        eviction: str = "lru_lfu",
    ) -> None:
        if isinstance(replica_id, bool) or not isinstance(replica_id, int | np.integer):
            raise InvalidArgumentError(f"replica_id must be an int, got {replica_id!r}")
        if not 0 <= replica_id <= _native.MAX_REPLICA:
            raise InvalidArgumentError(
                f"replica_id must be in 0..={_native.MAX_REPLICA}, got {replica_id}"
            )
        if path is not None and not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(
                f"path must be a directory (str or os.PathLike), got {path!r}"
                " (replica_id is keyword-only)"
            )
        if memory_budget_bytes is not None:
            if path is None:
                raise InvalidArgumentError(
                    "memory_budget_bytes needs a path: rows beyond the budget live on disk"
                )
            if isinstance(memory_budget_bytes, bool) or not isinstance(
                memory_budget_bytes, int | np.integer
            ):
                raise InvalidArgumentError(
                    f"memory_budget_bytes must be an int, got {memory_budget_bytes!r}"
                )
            if not 1 <= memory_budget_bytes < 2**64:
                raise InvalidArgumentError(
                    f"memory_budget_bytes must be in 1..2**64, got {memory_budget_bytes}"
                )
            memory_budget_bytes = int(memory_budget_bytes)
        if not isinstance(background_eviction, bool):
            raise InvalidArgumentError(
                f"background_eviction must be a bool, got {background_eviction!r}"
            )
        if not isinstance(eviction, str):
            raise InvalidArgumentError(f"eviction must be a policy name (str), got {eviction!r}")
        self._store: Any = _native.Store(
            int(replica_id),
            None if path is None else os.fspath(path),
            memory_budget_bytes,
            background_eviction,
            eviction,
        )

    @classmethod
    def _wrap(cls, inner: Any) -> Store:
        store = cls.__new__(cls)
        store._store = inner
        return store

    @property
    def _inner(self) -> Any:
        if self._store is None:
            raise StoreClosedError("the store is closed")
        return self._store

    def close(self) -> None:
        """Flush (for a store in a directory), then close the store: its directory is
        unlocked at once (another ``Store`` may open it), and every later call on this object
        or on a handle of its tables raises :class:`StoreClosedError` (a
        :class:`StorageError`), so no write can go unflushed. ``with embstore.Store(path) as
        store:`` closes at the end of the block. Closing twice is a no-op.

        If the flush fails (a full disk: :class:`NoSpaceError`) nothing is closed and nothing
        is lost: the store stays open with its rows in memory, so free space and call
        ``close()`` (or ``flush()``) again. Stop other threads' calls on the store first: a
        call still running may finish after the flush."""
        if self._store is None:
            return
        self._store.close()
        self._store = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._store is None:
            return "Store(closed)"
        where = f"path={str(self.path)!r}, " if self.path is not None else ""
        return f"Store({where}tables={self.tables()})"

    @property
    def memory_budget(self) -> tuple[int, int] | None:
        """``(limit, in use)`` in bytes for a store with a memory budget, else ``None``."""
        return self._inner.memory_budget

    @property
    def path(self) -> pathlib.Path | None:
        """The store's directory, or ``None`` for a store held in memory."""
        p = self._inner.path
        return None if p is None else pathlib.Path(p)

    def recovery(self) -> dict[str, Any] | None:
        """What opening the directory found: ``created`` (no store was there), ``tables``,
        ``segments`` and ``records`` replayed, ``torn_manifest_bytes`` (a manifest append a
        crash cut short, dropped) and ``orphan_segments`` (files of a flush a crash cut
        short, deleted). ``None`` for a store in memory."""
        return self._inner.recovery()

    def flush(self) -> dict[str, int]:
        """Make every write acknowledged before this call durable; return what was written
        (``segments``, ``records``, ``bytes``, ``compactions`` — tables rewritten whole — and
        ``compacted_segments`` — stale files whose live rows the flush's compaction step moved
        out and deleted). A no-op in memory. On a full
        disk it raises :class:`NoSpaceError` and loses nothing: the rows stay in memory and
        the next flush writes them."""
        return self._inner.flush()

    def compact(self, *, progress: bool | Callable[[int, int], None] = False) -> dict[str, int]:
        """Rewrite every table's rows (from memory and from disk) into one fresh segment each
        and delete the older segments, so disk use drops to the live rows; return what was
        written. ``progress=True`` prints tables done to stderr. Flushes compact by themselves,
        a bounded step after each (the stalest files' live rows moved out, the files deleted),
        so disk use stays within about twice the live rows and no flush rewrites a whole
        table; call this by hand before archiving a directory, say. A no-op in memory."""
        return self._inner.compact(_progress(progress, "compact", "tables"))

    def checkpoint(
        self,
        path: str | os.PathLike[str],
        since: Checkpoint | str | os.PathLike[str] | None = None,
    ) -> Checkpoint:
        """Flush, then write a self-contained snapshot of every table (rows, optimizer state,
        metadata, steps, configs) into ``path``, a new or empty directory. Segments are
        immutable, so they are hard-linked (copied across file systems): a checkpoint costs
        little. With ``since`` (an earlier checkpoint of this store) only what was written
        after it is linked; restoring then needs the chain."""
        since_path = None if since is None else os.fspath(since)
        return Checkpoint(**self._inner.checkpoint(os.fspath(path), since_path))

    @classmethod
    def restore(
        cls,
        checkpoint: Checkpoint | str | os.PathLike[str],
        path: str | os.PathLike[str],
        *,
        num_shards: int | None = None,
        progress: bool | Callable[[int, int], None] = False,
    ) -> Store:
        """Create a store in ``path`` (a new or empty directory) from ``checkpoint`` and the
        checkpoints it builds on, each table on ``num_shards`` shards (default: as saved), and
        open it. ``progress=True`` prints segments read to stderr; a callable gets
        ``(done, total)``."""
        if num_shards is not None and (
            isinstance(num_shards, bool) or not isinstance(num_shards, int | np.integer)
        ):
            raise InvalidArgumentError(f"num_shards must be an int, got {num_shards!r}")
        if num_shards is not None and not 0 <= num_shards < 2**63:
            raise InvalidArgumentError(
                f"num_shards must be a power of two in 1..=1024, got {num_shards}"
            )
        inner = _native.Store.restore(
            os.fspath(checkpoint),
            os.fspath(path),
            None if num_shards is None else int(num_shards),
            _progress(progress, "restore"),
        )
        return cls._wrap(inner)

    def create_table(
        self,
        name: str,
        embedding_dim: int,
        *,
        optimizer: Optimizer | None = None,
        initializer: Initializer | None = None,
        num_shards: int = 8,
        seed: int = 0,
        admission_min_count: int = 0,
        admission_sketch_width: int = 1 << 20,
        ttl: float | _dt.timedelta | None = None,
        on_non_finite: str = "error",
        huge_pages: bool = True,
    ) -> Table:
        """Create a table.

        Args:
            name: unique in the store.
            embedding_dim: ``D``, 1..4096.
            optimizer: :class:`SGD` (default, lr 0.01), :class:`Adagrad`,
                :class:`RowWiseAdagrad`, :class:`Adam` or :class:`FTRL`.
            initializer: :class:`Normal` (default, std 0.01), :class:`Uniform`,
                :class:`Constant` or :class:`Zeros`.
            num_shards: a power of two; each shard has its own index and lock, and large
                batches run their shards in parallel.
            seed: of the initializer.
            admission_min_count: a new id gets a row only on its n-th ``lookup``; before that
                lookups return its initial value without storing it and its gradients are
                dropped (0 or 1: at once).
            admission_sketch_width: counters per row of the count-min sketch behind admission.
            ttl: seconds (or a timedelta); :meth:`Table.evict_expired` removes rows not
                updated for this long.
            on_non_finite: ``"error"`` rejects a batch with a NaN/Inf gradient; ``"skip"``
                skips those ids and steps the rest.
            huge_pages: back large arenas and indexes with transparent huge pages.

        Raises:
            TableExistsError: the name is taken.
            InvalidArgumentError: a parameter is out of range.
        """
        optimizer = SGD() if optimizer is None else optimizer
        initializer = Normal() if initializer is None else initializer
        if not isinstance(name, str):
            raise InvalidArgumentError(f"name must be a str, got {name!r}")
        if type(optimizer) not in _OPTIMIZERS.values():
            raise InvalidArgumentError(
                f"optimizer must be an embstore optimizer, got {optimizer!r}"
            )
        if type(initializer) not in _INITIALIZERS.values():
            raise InvalidArgumentError(
                f"initializer must be an embstore initializer, got {initializer!r}"
            )
        if on_non_finite not in ("error", "skip"):
            raise InvalidArgumentError(
                f"on_non_finite must be 'error' or 'skip', got {on_non_finite!r}"
            )
        if isinstance(ttl, _dt.timedelta):
            ttl = ttl.total_seconds()
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise InvalidArgumentError(f"ttl must be seconds or a timedelta, got {ttl!r}")
        # Python checks types and the native integer ranges only; the values' meaning (dims,
        # powers of two, ...) is checked once, in the Rust core, whose message names the field.
        # Out of the native type's range, the core's own bound is quoted.
        ints = (
            ("embedding_dim", embedding_dim, f"1..={_native.MAX_EMBEDDING_DIM}", 2**63),
            ("num_shards", num_shards, "a power of two in 1..=1024", 2**63),
            ("seed", seed, "0..2**64", 2**64),
            ("admission_min_count", admission_min_count, "0..2**32", 2**32),
            ("admission_sketch_width", admission_sketch_width, "0..=2**28", 2**63),
        )
        for arg, value, bounds, high in ints:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidArgumentError(f"{arg} must be an int, got {value!r}")
            if not 0 <= value < high:
                raise InvalidArgumentError(f"{arg} must be in {bounds}, got {value}")
        opt_kind, opt_params = to_params(optimizer)
        init_kind, init_params = to_params(initializer)
        inner = self._inner.create_table(
            name,
            int(embedding_dim),
            init_kind,
            init_params,
            opt_kind,
            opt_params,
            int(num_shards),
            int(seed),
            int(admission_min_count),
            int(admission_sketch_width),
            None if ttl is None else float(ttl),
            on_non_finite == "skip",
            bool(huge_pages),
        )
        return Table(inner)

    def table(self, name: str) -> Table:
        """The table called ``name``; :class:`TableNotFoundError` if there is none."""
        return Table(self._inner.table(str(name)))

    def __getitem__(self, name: str) -> Table:
        return self.table(name)

    def __contains__(self, name: object) -> bool:
        return name in self._inner.tables()

    def tables(self) -> list[str]:
        """Names of all tables, sorted."""
        return self._inner.tables()

    def drop_table(self, name: str) -> None:
        """Remove the table called ``name`` (its memory is freed when no object holds it)."""
        self._inner.drop_table(str(name))

    def load_table(self, path: str | os.PathLike[str], name: str | None = None) -> Table:
        """Create a table from a file written by :meth:`Table.save`, named as saved or
        ``name``."""
        return Table(self._inner.load_table(os.fspath(path), name))


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint written by :meth:`Store.checkpoint`; usable wherever a path is
    (``os.fspath(ckpt)``)."""

    path: pathlib.Path
    id: int
    parent_id: int
    tables: int
    segments: int
    bytes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", pathlib.Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)


def _progress(
    progress: bool | Callable[[int, int], None], what: str, unit: str = "segments"
) -> Any:
    """The native progress callback for ``progress``: None, a printer of ``what: done/total
    unit`` on stderr, or the callable itself."""
    if callable(progress):
        return progress
    if not progress:
        return None

    if sys.stderr.isatty():

        def show(done: int, total: int) -> None:
            end = "\n" if done == total else ""
            print(f"\r{what}: {done}/{total} {unit}", end=end, file=sys.stderr, flush=True)

        return show
    # A log or a pipe: whole lines, one per tenth of the work (and the last), never a `\r`.
    shown = [-1]

    def log(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth != shown[0] or done == total:
            shown[0] = tenth
            print(f"{what}: {done}/{total} {unit}", file=sys.stderr, flush=True)

    return log


def inspect(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe the store or checkpoint in ``path`` from its manifest, without opening it
    (works while another process has it open): formats, checkpoint identity, and per table
    its dim, optimizer, step, live ``rows`` (as of the table's last flush), ``memory_bytes``
    (those rows with every row in memory), segments, records and bytes on disk."""
    return _native.inspect_dir(os.fspath(path), False, None)


def verify(
    path: str | os.PathLike[str], *, progress: bool | Callable[[int, int], None] = False
) -> dict[str, Any]:
    """:func:`inspect`, then read every record of every segment, checking each checksum;
    ``damage`` lists what failed (empty: the store is intact): a damaged segment, a manifest
    that fails its checks, or one that cannot account for the segments on disk (the store
    would refuse to open). Each table gains its live ``rows`` and the ``memory_bytes`` they
    take once opened (``None`` for a table with a damaged segment: its rows cannot be
    counted). Safe on a store another process has open: when a flush or compaction replaces
    a segment during the walk, the walk starts over on the new manifest (``restarts`` counts
    how often), so the report is of one consistent state."""
    return _native.inspect_dir(os.fspath(path), True, _progress(progress, "verify"))


__all__ = ["Checkpoint", "ExportChunk", "Store", "Table", "inspect", "verify"]
