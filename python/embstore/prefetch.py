"""A training pipeline for tables larger than memory: while the caller trains on batch n, a
background thread brings the rows of the next batches into memory and pins them
(Baidu's MEM-PS prepares the next batches' working sets the same way, hierarchical-gpu-ps §3,
App. B and D).

    >>> import tempfile, numpy as np, embstore
    >>> store = embstore.Store(tempfile.mkdtemp(), memory_budget_bytes=64 << 10)
    >>> user = store.create_table("user", embedding_dim=8)
    >>> batches = [np.arange(i * 100, i * 100 + 100) for i in range(20)]
    >>> _ = [user.lookup(ids) for ids in batches]           # 2,000 rows, most now on disk
    >>> for ids in embstore.prefetch(batches, lambda ids: {user: ids}):
    ...     rows = user.lookup(ids)                             # found in memory
    ...     _ = user.apply_gradients(ids, np.ones_like(rows))
    >>> user.stats()["rows"]
    2000

Values never change by prefetching: a prefetched row is the row a lookup would have read, and
a batch's updates land before the batch after it is handed out, so training is the same, to
the bit, with or without the pipeline.
"""

from __future__ import annotations

import collections
import concurrent.futures
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from embstore._arrays import as_ids
from embstore.distributed.table import DistributedTable
from embstore.errors import InvalidArgumentError
from embstore.pins import Pins
from embstore.table import Table

B = TypeVar("B")

__all__ = ["prefetch"]


def prefetch(
    batches: Iterable[B],
    ids: Callable[[B], Mapping[Table, Any]],
    *,
    depth: int = 1,
) -> Iterator[B]:
    """Yield the batches of ``batches`` in order; while the caller works on one, a background
    thread brings into memory the rows that the next ``depth`` batches use.

    Args:
        batches: any iterable (a ``DataLoader``, a generator).
        ids: maps a batch to ``{table: ids}``, the ids (numpy, torch or a sequence of
            ints) each table will be looked up with. Tables without a memory budget are
            skipped.
        depth: batches read ahead (1 or more).

    A batch is handed out once its rows are in memory. Its rows stay pinned until the caller
    asks for the next batch (so no eviction drops them between its lookups and
    ``apply_gradients``); where pinning the rows of the batches in flight would pass 60 % of
    the memory budget, a table's rows of that batch are not read ahead (the store has no room
    to keep them: its own lookups read them) and a ``RuntimeWarning`` says so once. When a
    batch is handed out it takes the pins it was refused first, before the next batch's. So
    the store stays within its budget, and is back under it when the generator is done. An
    error of the background thread is raised where the batch is handed out; closing the
    generator early (``break``) releases every pin.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise InvalidArgumentError(f"depth must be an int >= 1, got {depth!r}")
    return _pipeline(iter(batches), ids, depth)


def _pipeline(
    it: Iterator[B], ids_of: Callable[[B], Mapping[Table, Any]], depth: int
) -> Iterator[B]:
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embstore-prefetch")
    # Per batch ahead: the batch, and its fetch: the pins it took (and those refused).
    ahead: collections.deque[tuple[B, concurrent.futures.Future[Pins]]] = collections.deque()
    warned = False
    held = Pins()

    def fetch(work: list[tuple[Table, Any]]) -> Pins:
        pins = Pins()
        try:
            for table, arr in work:
                if pins.take(table, arr):
                    table.prefetch(arr)
        except BaseException:
            pins.release()
            raise
        return pins

    def fill() -> None:
        while len(ahead) <= depth:
            try:
                batch = next(it)
            except StopIteration:
                return
            work = []
            for table, raw in ids_of(batch).items():
                if not isinstance(table, Table | DistributedTable):
                    raise InvalidArgumentError(
                        f"ids() must map embstore.Table to ids, got a key {type(table).__name__}"
                    )
                if Pins.needed(table):
                    work.append((table, as_ids(raw)[0]))
            ahead.append((batch, pool.submit(fetch, work)))

    try:
        fill()
        while ahead:
            batch, done = ahead.popleft()
            held = done.result()
            # The pins of the batch before are gone: the batch handed out now comes first for
            # the pins it was refused while that one held them (before the next fetch pins).
            refused = held.retry()
            fill()
            if refused and not warned:
                warned = True
                warnings.warn(
                    "embstore.prefetch: the rows of the batches in flight pass 60 % of the "
                    "memory budget; some are left to their batch's own lookups, without a pin",
                    RuntimeWarning,
                    stacklevel=2,
                )
            yield batch
            held.release()
    finally:
        held.release()
        for _, done in ahead:
            done.cancel()
        for _, done in ahead:
            if not done.cancelled():
                try:
                    done.result().release()
                except BaseException:  # its pins were released by fetch()
                    pass
        pool.shutdown(wait=True)
