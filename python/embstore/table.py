"""An embedding table (:class:`Table`) and the chunks it exports (:class:`ExportChunk`).

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
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from embstore import _native
from embstore._arrays import as_ids, as_rows, check_out, on_device, uint_array
from embstore.config import TableSpec, from_native_spec
from embstore.errors import InvalidArgumentError, ShapeError
from embstore.priority import Priority


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

    __slots__ = ("_inner", "_per_process")

    def __init__(self, inner: _native.Table, per_process: bool = False):
        self._inner = inner
        # From a store opened with per_process=True: trained by one process of a multi-process
        # job on purpose (embstore.distributed.check_not_process_local lets it pass).
        self._per_process = per_process

    @property
    def distributed(self) -> bool:
        """False: the table's rows are this process's (a
        :class:`~embstore.DistributedTable`, which wraps one, says True)."""
        return False

    @property
    def local(self) -> Table:
        """The rows this process holds: the table itself (a
        :class:`~embstore.DistributedTable`'s is the table of its partition)."""
        return self

    @property
    def per_process(self) -> bool:
        """Whether the table is from a store opened with ``per_process=True``: trained by one
        process of a multi-process job on purpose."""
        return self._per_process

    def native(self) -> _native.Table:
        """The native table this handle wraps: the seam through which embstore's own modules
        hand a table to other native objects (the inference cache holds the native tables, a
        benchmark times the binding alone). It takes arguments exactly as they leave
        :mod:`embstore._arrays` (contiguous ``uint64[B]`` ids, ``float32[B, D]`` rows) and checks
        nothing else, so code outside embstore should call the table's own methods."""
        return self._inner

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

    def set_priority(self, priority: Priority | None) -> None:
        """Score this table's writes for prioritised sync (a :class:`~embstore.Priority`), or
        stop (None). Set it on the trainer's table each time the store opens: it is not saved
        with the table."""
        if priority is None:
            self._inner.set_priority(None)
            return
        if not isinstance(priority, Priority):
            raise InvalidArgumentError(
                f"priority must be an embstore.Priority or None, got {priority!r}"
            )
        priority.apply_to(self._inner)

    def priority_stats(self) -> dict[str, Any] | None:
        """What the table's priority has seen: ``k`` (None on a table that does not score,
        a follower), ``p_k`` (the current threshold), ``scored`` and ``significant`` (row
        writes), ``significant_entries`` (rows taken ahead of normal sync, served until it
        brings them), ``enabled`` (prioritised sync on) and ``young_rows`` (rows created in
        the last ten minutes, whose creation time the table keeps for the freshness of their
        writes' priority); None for a table that neither scores nor syncs."""
        return self._inner.priority_stats()

    def significant_versions(self, ids: Any) -> np.ndarray:
        """Per id, the version timestamp of its newest significant write (0: none), in a
        table that syncs: a write was significant when the row's version (see
        :meth:`metadata`) equals it."""
        return self._inner.significant_versions(as_ids(ids)[0])

    @property
    def config(self) -> TableSpec:
        """The table's :class:`~embstore.TableSpec`: ``store.create_table(table.config)`` makes
        a table configured alike. It also reads as the keyword arguments of
        :meth:`Store.create_table`: ``store.create_table(**{**table.config, "name": "copy"})``
        (or ``dataclasses.replace(table.config, name="copy")``) makes a renamed one."""
        return from_native_spec(self._inner.config())

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
        arr, device = as_ids(ids)
        if out is None:
            out = np.empty((len(arr), self._inner.embedding_dim), np.float32)
        else:
            check_out(out, arr, self._inner.embedding_dim)
        found = np.empty(len(arr), np.bool_) if return_found else None
        self._inner.lookup(arr, out, on_miss, found)
        if return_found:
            return on_device(out, device), on_device(found, device)
        return on_device(out, device)

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
        arr, _ = as_ids(ids)
        rows = as_rows(grads, len(arr), self, "grads")
        return self._inner.apply_gradients(arr, rows, None if lr is None else float(lr))

    def assign(self, ids: Any, values: Any) -> None:
        """Set rows: ``values`` is ``float32[B, D]``; missing ids get a row; for a repeated id
        the last row wins; optimizer state of existing rows is kept."""
        arr, _ = as_ids(ids)
        self._inner.assign(arr, as_rows(values, len(arr), self, "values"))

    @property
    def tiered(self) -> bool:
        """Whether rows may live on disk (the store has a ``memory_budget_bytes``)."""
        return self._inner.tiered

    def pin(self, ids: Any) -> int:
        """Keep the rows of ``ids`` in memory until :meth:`unpin` (counted: pin twice, unpin
        twice). Only matters with a memory budget; a no-op otherwise. The rows pinned in all
        the store's tables together may take at most 60 % of the budget: beyond that
        :class:`CapacityError` says so (a working set too large for the budget), instead of
        thrashing or blocking. Returns the bytes the store's pinned rows grew by (rows no pin
        held before; 0 without a budget)."""
        return int(self._inner.pin(as_ids(ids)[0]))

    def prefetch(self, ids: Any) -> int:
        """Bring the rows of ``ids`` that are on disk into memory now, as a lookup would,
        without reading or changing any value; return how many rows were read from disk.
        Meant for a thread that reads the next batch's rows while this one trains (see
        :func:`embstore.prefetch`, which also pins them until their batch is done); ids with
        no row are ignored. Without a memory budget it does nothing and returns 0."""
        return self._inner.prefetch(as_ids(ids)[0])

    def unpin(self, ids: Any) -> None:
        """Release pins taken by :meth:`pin`. Where the released rows leave the store over its
        memory budget, the excess is evicted here, so the store is back under its budget when
        training stops."""
        self._inner.unpin(as_ids(ids)[0])

    @contextlib.contextmanager
    def pinned(self, ids: Any) -> Iterator[None]:
        """``with table.pinned(ids):`` keeps the rows of ``ids`` in memory for the block —
        between a batch's lookup and its ``apply_gradients``, the working set of a step."""
        arr = as_ids(ids)[0]
        self._inner.pin(arr)
        try:
            yield
        finally:
            self._inner.unpin(arr)

    def remove(self, ids: Any) -> int:
        """Remove the rows of ``ids``; return how many existed."""
        return self._inner.remove(as_ids(ids)[0])

    def contains(self, ids: Any) -> Any:
        """``bool[B]``: whether each id has a row."""
        arr, device = as_ids(ids)
        return on_device(self._inner.contains(arr), device)

    def initial_values(self, ids: Any) -> Any:
        """``float32[B, D]``: the initial value each id gets (stores nothing)."""
        arr, device = as_ids(ids)
        out = np.empty((len(arr), self._inner.embedding_dim), np.float32)
        self._inner.initial_rows(arr, out)
        return on_device(out, device)

    def metadata(self, ids: Any) -> dict[str, np.ndarray]:
        """Per-id metadata: ``found``, ``versions``, ``replicas``, ``update_counts``,
        ``last_update_ms`` (zeros where ``found`` is False)."""
        keys = ("found", "versions", "replicas", "update_counts", "last_update_ms")
        return dict(zip(keys, self._inner.meta(as_ids(ids)[0]), strict=True))

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
        arr, _ = as_ids(ids)
        rows = as_rows(values, len(arr), self, "values")
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
            None if m is None else uint_array(m, d, name, len(arr))
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
        from disk), ``cold_read_ios`` (the reads that brought them: records that share or
        touch a block of the disk, or lie close in a file, are read together),
        ``cold_read_bytes`` (the bytes those reads moved: whole logical blocks of the disk, 512 B
        on most), ``evicted_to_disk``
        (rows moved out of memory) and ``eviction_rounds`` since the store opened, and
        ``eviction_errors`` with ``last_eviction_error`` (the message of the last eviction that
        failed, or ``None``): on a full disk the rows stay in memory and the next call over the
        budget raises :class:`NoSpaceError` until space is freed."""
        return self._inner.stats()

    def sync_parts_of(self, ids: Any) -> np.ndarray:
        """The sync part of each id (``uint32``), for a table that syncs: replicas pull and
        apply whole parts, so an id's part tells which replies carry it."""
        return self._inner.sync_parts_of(as_ids(ids)[0])

    def sync_stats(self) -> dict[str, Any] | None:
        """For a table that syncs (its store serves a sync port or follows one), what sync
        did: ``parts``, ``epoch`` (changes when the process restarts), ``cached_rows`` (rows in
        the update caches), ``tombstones``, pulls answered from the cache (``pulls_cached``)
        or by a scan (``pulls_scanned``), ``rows_sent``, ``replies_applied``,
        ``rows_applied``, ``replies_rejected`` and ``d_prop_ms`` (how long a write stays in
        the update cache). ``None`` for a table that does not sync."""
        return self._inner.sync_stats()

    def index_stats(self) -> dict[str, Any]:
        """A full scan of every shard's index (O(rows); for diagnosis, not for polling):
        ``len``, ``capacity``, ``apcl`` (average probed cachelines per lookup), ``longest_chain``,
        ``displaced``."""
        return self._inner.index_stats()


__all__ = ["ExportChunk", "Table"]
