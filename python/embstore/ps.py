"""A parameter server that learns its workload (after IterStore, SoCC '14).

Iterative training touches the same rows in the same order every iteration. Each worker runs
its iteration once in a *virtual* pass that reads and writes nothing (or its first real
iteration is watched), and from that log the server builds, before the real run: a static
arena of the rows in first-read order found through an immutable index, bulk prefetches of
the rows a clock needs, and static per-worker update buffers (the "thread caches")::

    >>> import numpy as np, embstore
    >>> store = embstore.Store()
    >>> for name in ("L", "R"):
    ...     _ = store.create_table(name, embedding_dim=4, optimizer=embstore.Delta(),
    ...                            initializer=embstore.Zeros())
    >>> ps = store.ps(["L", "R"], workers=2, consistency=embstore.BSP())
    >>> def run_iteration(w):
    ...     rows = w.read("L", [w.id, 9])             # [2, 4]: as of the last clock
    ...     w.update("L", [w.id, 9], np.ones((2, 4), np.float32))
    ...     w.update("R", [7], rows[:1] + 1)
    ...     w.clock()
    >>> with ps.gather(virtual=True) as g:             # logged only: nothing read or written
    ...     for w in range(2):
    ...         run_iteration(g.worker(w))
    >>> plan = ps.finish_gather()
    >>> plan.stats()["rows"]                             # L: 0, 1, 9; R: 7
    4
    >>> ps.run(run_iteration, clocks=3)                   # each worker in its own thread
    >>> float(store["L"].lookup([9])[0, 0])              # 2 workers x 3 clocks
    6.0
    >>> ps.stats()["fetches"]                            # no row read one at a time
    0

Tables take deltas: create them with ``optimizer=embstore.Delta()`` (``w += g``), so that
updates from many workers commute. Reads return the rows as of the last clock the consistency
model requires (BSP: every earlier clock; ``SSP(slack)``: all but the last ``slack``) plus the
worker's own updates since; updates reach the tables in (clock, worker) order, so a run
computes the same values whatever the specialisations, the thread timing or the access
information given (missing or false information costs time only).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embstore import _native
from embstore.errors import InvalidArgumentError, ShapeError, TableNotFoundError

__all__ = ["BSP", "SSP", "OverflowWarning", "ParameterServer", "Plan", "Worker"]


@dataclass(frozen=True)
class BSP:
    """Bulk synchronous: a read in clock ``c`` reflects every update of clocks before ``c``;
    ``clock()`` waits for every worker to finish its clock."""


@dataclass(frozen=True)
class SSP:
    """Stale synchronous: a read in clock ``c`` reflects every update of clocks before
    ``c - slack``; a worker runs at most ``slack`` clocks ahead of the slowest."""

    slack: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.slack, bool) or not isinstance(self.slack, int) or self.slack < 0:
            raise InvalidArgumentError(f"SSP: slack must be an int >= 0, got {self.slack!r}")


class OverflowWarning(RuntimeWarning):
    """More than 10 % of a clock's accesses fell outside the plan, two clocks running."""


class Worker:
    """One worker's handle: ``read``, ``update``, ``clock``. Use it from one thread at a time."""

    __slots__ = ("_inner", "_ps")

    def __init__(self, ps: ParameterServer, inner: Any):
        self._ps = ps
        self._inner = inner

    @property
    def id(self) -> int:
        """The worker's number, ``0 .. workers - 1``."""
        return int(self._inner.id)

    @property
    def clock_now(self) -> int:
        """The clock the worker is in (the first is 1)."""
        return int(self._inner.clock_now)

    @property
    def in_virtual_gather(self) -> bool:
        """Whether a virtual gather is running (reads return zeros, nothing is written): an
        iteration that keeps state of its own (sampled assignments, a random generator) leaves
        it alone then."""
        return bool(self._inner.in_virtual_gather)

    @property
    def global_id(self) -> int:
        """The worker's number among every process's workers: ``rank * workers + id`` (the
        same as ``id`` in one process)."""
        return self._ps.rank * self._ps.workers + self.id

    def read(self, table: str | int, keys: Any) -> np.ndarray:
        """The rows of ``keys`` (``[len(keys), D]`` float32), as the consistency model allows,
        plus this worker's own updates since. In a virtual gather: zeros, and nothing read."""
        t = self._ps._table_index(table)
        ids = _keys(keys)
        out = np.empty((len(ids), self._ps._dims[t]), dtype=np.float32)
        self._inner.read(t, ids, out)
        return out

    def update(self, table: str | int, keys: Any, deltas: Any) -> None:
        """Adds ``deltas`` (``[len(keys), D]``) to the rows of ``keys``. This worker's reads see
        them at once; the others' once the clock is pushed. Non-finite deltas are refused."""
        t = self._ps._table_index(table)
        ids = _keys(keys)
        d = np.ascontiguousarray(deltas, dtype=np.float32)
        if d.ndim == 1 and len(ids) == 1:
            d = d.reshape(1, -1)
        if d.ndim != 2:
            raise _shape_error(f"deltas must be [{len(ids)}, {self._ps._dims[t]}], got {d.shape}")
        self._inner.update(t, ids, d)

    def clock(self) -> None:
        """Ends the worker's clock: its updates are pushed once every worker has finished the
        clock; it waits as the consistency model requires."""
        self._inner.clock()
        self._ps._check_overflow()

    def __repr__(self) -> str:
        return f"Worker(id={self.id}, clock={self.clock_now})"


def _keys(keys: Any) -> np.ndarray:
    a = np.asarray(keys)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1:
        raise _shape_error(f"keys must be 1-D, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise InvalidArgumentError(f"keys must be integers, got dtype {a.dtype}")
    if a.size and a.dtype.kind == "i" and int(a.min()) < 0:
        raise InvalidArgumentError("keys must be >= 0")
    return np.ascontiguousarray(a, dtype=np.uint64)


def _shape_error(message: str) -> Exception:
    return ShapeError(message)


class Plan:
    """What a gather found and what building the specialised structures cost."""

    def __init__(self, stats: dict[str, Any]):
        self._stats = dict(stats)

    def stats(self) -> dict[str, Any]:
        """``rows`` and ``bytes`` of the arena, ``early_rows``, ``prefetch_rows``,
        ``prefetch_frames`` (bulk requests per clock), ``thread_cache_rows`` and
        ``contention_rows`` (all workers), ``placement_moves`` (one process: 0), ``accesses``
        and ``clocks`` gathered, and the seconds of each part (``merge_s``,
        ``thread_cache_s``, ``static_s``)."""
        return dict(self._stats)

    def __repr__(self) -> str:
        s = self._stats
        return (
            f"Plan(rows={s['rows']}, bytes={s['bytes']}, prefetch_frames={s['prefetch_frames']},"
            f" thread_cache_rows={s['thread_cache_rows']})"
        )


class _Gather:
    def __init__(self, ps: ParameterServer, virtual: bool):
        self._ps = ps
        self.virtual = virtual

    def worker(self, w: int) -> Worker:
        """Worker ``w``'s handle (the same handle the real run uses)."""
        return self._ps.worker(w)

    def __enter__(self) -> _Gather:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class ParameterServer:
    """A parameter server over tables of one store: see the module docs and
    :meth:`embstore.Store.ps`."""

    def __init__(
        self,
        store: Any,
        tables: Sequence[str],
        workers: int,
        consistency: BSP | SSP | None = None,
        *,
        specialise: str = "all",
        early_ratio: float = 0.1,
        cpb: float = 0.05,
        thread_cache_rows: int | None = None,
        replan: str = "warn",
        _cluster: tuple[int, list[str]] | None = None,
    ):
        if isinstance(tables, str):
            tables = [tables]
        names = [str(getattr(t, "name", t)) for t in tables]
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise InvalidArgumentError(f"workers must be an int, got {workers!r}")
        consistency = BSP() if consistency is None else consistency
        if not isinstance(consistency, BSP | SSP):
            raise InvalidArgumentError(
                f"consistency must be embstore.BSP() or embstore.SSP(slack), got {consistency!r}"
            )
        native_tables = [store[n]._inner for n in names]
        self._inner = _native.Ps(
            native_tables,
            workers,
            slack=consistency.slack if isinstance(consistency, SSP) else None,
            variant=specialise,
            early_ratio=float(early_ratio),
            cpb=float(cpb),
            thread_cache_rows=thread_cache_rows,
            replan=replan,
            rank=None if _cluster is None else _cluster[0],
            addrs=None if _cluster is None else list(_cluster[1]),
        )
        self.rank = 0 if _cluster is None else int(_cluster[0])
        self.processes = 1 if _cluster is None else len(_cluster[1])
        self._closed = False
        self._names = names
        self._dims = list(self._inner.dims())
        self._workers = [Worker(self, self._inner.worker(w)) for w in range(workers)]
        self.consistency = consistency
        self._warned = 0
        self._warn_lock = threading.Lock()

    @property
    def workers(self) -> int:
        """The number of workers."""
        return len(self._workers)

    @property
    def tables(self) -> list[str]:
        """The tables' names, in order (a table's number is its position)."""
        return list(self._names)

    def _table_index(self, table: str | int) -> int:
        if isinstance(table, int) and not isinstance(table, bool):
            if 0 <= table < len(self._names):
                return table
        elif table in self._names:
            return self._names.index(table)
        raise TableNotFoundError(
            f"table {table!r} is not one of this parameter server's tables {self._names}"
        )

    def worker(self, w: int) -> Worker:
        """Worker ``w``'s handle."""
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < len(self._workers):
            raise InvalidArgumentError(f"worker must be in 0..{len(self._workers) - 1}, got {w!r}")
        return self._workers[w]

    def gather(self, virtual: bool = True) -> _Gather:
        """Starts gathering the workers' accesses. ``virtual=True``: run each worker's
        iteration through ``g.worker(w)``; nothing is read or written (reads return zeros,
        ``clock()`` returns at once), so the iteration must not depend on the values it reads.
        ``virtual=False``: the iterations run for real while they are logged (from the first
        real iteration, with nothing to write). Then :meth:`finish_gather`."""
        self._inner.start_gather(bool(virtual))
        return _Gather(self, bool(virtual))

    def finish_gather(self) -> Plan:
        """Builds the plan and every specialised structure from the gathered accesses."""
        return Plan(self._inner.finish_gather())

    @property
    def plan(self) -> Plan | None:
        """The current plan (``None`` before the first gather)."""
        s = self._inner.plan_stats()
        return None if s is None else Plan(s)

    def gathered(self, w: int) -> list[tuple[int, int, str]]:
        """Worker ``w``'s accesses in the last gather: ``(table, key, "read" | "update")``."""
        return [(t, k, "update" if op else "read") for t, k, op in self._inner.gathered(w)]

    def clocks(self) -> list[int]:
        """Each worker's clock."""
        return list(self._inner.clocks())

    def stats(self) -> dict[str, Any]:
        """Counts since the start: ``clocks`` every worker finished, ``reads``, ``updates``,
        ``overflow`` (accesses outside the plan), ``fetches`` (rows read one at a time),
        ``prefetch_rows`` and ``prefetch_requests``, ``pushed_rows`` and ``push_requests``,
        ``bytes_read`` and ``bytes_pushed``, ``wait_s`` at clock boundaries (all workers),
        ``overflow_warnings``, ``replans``. Counts of rows are as of each worker's last clock."""
        return dict(self._inner.stats())

    def run(self, iteration: Callable[[Worker], None], clocks: int = 1) -> None:
        """Runs ``iteration(worker)`` ``clocks`` times on every worker, each in its own thread
        (the iteration calls ``worker.clock()``). The first exception is raised here once every
        thread has stopped: a worker that fails stops the parameter server (the others' calls
        fail with :class:`embstore.StoreClosedError` from then on; build a new one to go on,
        the tables keep every clock pushed before)."""
        errors: list[BaseException] = []

        def body(w: Worker) -> None:
            try:
                for _ in range(clocks):
                    if errors:
                        return
                    iteration(w)
            except BaseException as e:
                if not errors:
                    errors.append(e)
                    # The others would wait for this worker's clock for ever.
                    self._inner.abort(f"worker {w.id} failed: {e!r}")

        threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in self._workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Across processes (every process together): rows that placement moved go back to
        the process the distributed store keeps them on, and this process stops serving its
        rows. In one process: nothing to do. Idempotent."""
        if not self._closed:
            self._closed = True
            self._inner.close()

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_overflow(self) -> None:
        n = int(self._inner.stats()["overflow_warnings"])
        with self._warn_lock:
            if n <= self._warned:
                return
            self._warned = n
        warnings.warn(
            "more than 10 % of the accesses of the last two clocks fell outside the plan: "
            "gather again (ps.gather(...); ps.finish_gather()) or pass replan='auto'",
            OverflowWarning,
            stacklevel=3,
        )

    def __repr__(self) -> str:
        where = f", processes={self.processes}, rank={self.rank}" if self.processes > 1 else ""
        return (
            f"ParameterServer(tables={self._names}, workers={self.workers}, "
            f"consistency={self.consistency}{where})"
        )
