"""The NeighborHash index: u64 keys to payloads below 2**52."""

from __future__ import annotations

from collections.abc import Iterable

from embstore import _native


class NeighborHash:
    """A cacheline-aware hash index from u64 keys to payloads below ``2**52``.

    This is the map every embstore table finds its rows through; it is exposed for inspection
    and small tools. Batch calls release the GIL.

    Args:
        slots: initial number of buckets (rounded up to a multiple of 4, at most
            ``2**32 - 4``); the index grows when ``len`` would pass
            ``max_load_factor * slots`` (2x while under 65,536 buckets, then 1.15x).
        max_load_factor: in (0, 1); default 0.8.
        huge_pages: back arrays of 2 MiB and more with transparent huge pages.

    Raises:
        InvalidArgumentError: ``max_load_factor`` outside (0, 1).
        CapacityError: ``slots`` above ``2**32 - 4`` or too large to allocate.

    Example::

        >>> index = NeighborHash(slots=1024)
        >>> index.insert_batch([1, 2, 3], [10, 20, 30])
        >>> index.get_batch([3, 4])
        [30, None]
        >>> index.stats()["len"]
        3
    """

    def __init__(self, slots: int = 8, max_load_factor: float = 0.8, huge_pages: bool = True):
        self._inner = _native.NeighborHash(int(slots), float(max_load_factor), bool(huge_pages))

    def __len__(self) -> int:
        return len(self._inner)

    def __contains__(self, key: int) -> bool:
        return key in self._inner

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def capacity(self) -> int:
        """Number of buckets."""
        return self._inner.capacity

    def insert(self, key: int, payload: int) -> int | None:
        """Store ``payload`` for ``key``; return the payload it replaced, if any.

        Raises:
            InvalidArgumentError: ``payload >= 2**52``.
            OverflowError: ``key`` or ``payload`` outside ``[0, 2**64)``.
        """
        return self._inner.insert(key, payload)

    def get(self, key: int) -> int | None:
        """The payload stored for ``key``, or None."""
        return self._inner.get(key)

    def remove(self, key: int) -> int | None:
        """Remove ``key``; return its payload, or None if it was absent."""
        return self._inner.remove(key)

    def clear(self) -> None:
        """Remove every key (the capacity stays)."""
        self._inner.clear()

    def insert_batch(self, keys: Iterable[int], payloads: Iterable[int]) -> None:
        """Insert ``keys[i] -> payloads[i]`` for every i; nothing is stored if any is invalid.

        Raises:
            ShapeError: the two sequences have different lengths.
            InvalidArgumentError: a payload is ``>= 2**52``.
        """
        self._inner.insert_batch(list(keys), list(payloads))

    def get_batch(self, keys: Iterable[int]) -> list[int | None]:
        """Look up every key (batched, with prefetching); None for absent keys."""
        return self._inner.get_batch(list(keys))

    def stats(self) -> dict[str, float | int | None]:
        """Full-scan figures: len, capacity, load_factor, apcl, longest_chain, displaced, bytes."""
        return self._inner.stats()

    def check_invariants(self) -> None:
        """Raise if any chain is broken (for tests and debugging)."""
        self._inner.check_invariants()
