"""Rows held in memory for a while (:class:`Pins`): the one pin lifecycle behind
:func:`embstore.prefetch`, a session's batches and a torch module's training step.

Under a memory budget the store may evict any row it holds; a row pinned stays until it is
unpinned, so the rows a batch was read for are still there when its gradients arrive (no
second read from disk). Pins count against the budget: where they would pass 60 % of it the
store refuses them (:class:`~embstore.CapacityError`), and the rows are then read by their
batch's own lookups, unpinned, so the store keeps to its budget.
"""

from __future__ import annotations

from typing import Any

from embstore.errors import CapacityError

__all__ = ["Pins"]


class Pins:
    """The pins taken for one unit of work (a batch, a training step), released together.

    :meth:`take` pins a table's ids where the table needs it (a table with a memory budget;
    a table held whole in memory needs none, and a distributed table's rows are pinned by
    their owners); a pin the budget refuses is remembered, and :meth:`retry` takes it again
    once the pins before are gone. :meth:`release` unpins everything, once; it never raises
    (a closed store holds no pins). ``with Pins() as pins:`` releases at the end of the block.
    """

    __slots__ = ("_held", "_refused", "bytes")

    def __init__(self) -> None:
        self._held: list[tuple[Any, Any]] = []
        self._refused: list[tuple[Any, Any]] = []
        #: What the store's pinned bytes grew by when these pins were taken.
        self.bytes = 0

    def __repr__(self) -> str:
        return f"Pins(held={len(self._held)}, refused={len(self._refused)}, bytes={self.bytes})"

    def __len__(self) -> int:
        """Pins held (one per table and call of :meth:`take`)."""
        return len(self._held)

    @property
    def refused(self) -> bool:
        """Whether a pin was refused and not taken since."""
        return bool(self._refused)

    def tables(self) -> set[str]:
        """Names of the tables with pins held."""
        return {t.name for t, _ in self._held}

    def ids(self) -> int:
        """Ids pinned, every pin together."""
        return sum(len(ids) for _, ids in self._held)

    @staticmethod
    def needed(table: Any) -> bool:
        """Whether ``table``'s rows need pins to stay in memory: a table of this process
        under a memory budget."""
        return not table.distributed and table.tiered

    def take(self, table: Any, ids: Any) -> bool:
        """Pin ``ids`` of ``table`` (any ids :meth:`~embstore.Table.pin` takes). True when
        they are pinned or need no pin; False when the budget refused them (remembered for
        :meth:`retry`). Other errors are raised, nothing taken."""
        if not self.needed(table) or not len(ids):
            return True
        try:
            self.bytes += table.pin(ids)
        except CapacityError:
            self._refused.append((table, ids))
            return False
        self._held.append((table, ids))
        return True

    def retry(self) -> int:
        """Take the refused pins again (the pins before them were released); those refused
        again are dropped, their rows read unpinned. Returns how many were waiting."""
        waiting, self._refused = self._refused, []
        for table, ids in waiting:
            try:
                table.pin(ids)
                self._held.append((table, ids))
            except CapacityError:
                pass
        return len(waiting)

    def release(self) -> None:
        """Unpin everything held and forget what was refused."""
        held, self._held, self._refused = self._held, [], []
        for table, ids in held:
            try:
                table.unpin(ids)
            except Exception:  # a closed store holds no pins
                pass

    def __enter__(self) -> Pins:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
