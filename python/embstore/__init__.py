"""embstore: an embedding store for deep-learning recommender systems.

The index that finds every row is available now::

    >>> import embstore
    >>> index = embstore.NeighborHash()
    >>> index.insert(2**64 - 1, 42)
    >>> index.get_batch([2**64 - 1, 7])
    [42, None]
"""

from embstore import errors
from embstore._native import MAX_PAYLOAD, __version__, simd_available
from embstore.errors import CapacityError, EmbstoreError, InvalidArgumentError, ShapeError
from embstore.index import NeighborHash

__all__ = [
    "MAX_PAYLOAD",
    "CapacityError",
    "EmbstoreError",
    "InvalidArgumentError",
    "NeighborHash",
    "ShapeError",
    "__version__",
    "errors",
    "simd_available",
]
