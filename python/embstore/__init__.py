"""embstore: an embedding store for deep-learning recommender systems.

Embedding tables keyed by raw 64-bit feature ids, trained in place by server-side sparse
optimizers, from numpy or PyTorch (``embstore.torch``)::

    >>> import embstore, numpy as np
    >>> store = embstore.Store()
    >>> user = store.create_table("user", embedding_dim=8, optimizer=embstore.Adagrad(lr=0.05))
    >>> rows = user.lookup(np.array([3, 2**62, 3]))      # float32[B, D]
    >>> rows.shape
    (3, 8)
    >>> user.apply_gradients([3, 2**62, 3], np.ones((3, 8), np.float32))
    2

The index every row is found through is available on its own::

    >>> index = embstore.NeighborHash()
    >>> index.insert(2**64 - 1, 42)
    >>> index.get_batch([2**64 - 1, 7])
    [42, None]
"""

from embstore import errors
from embstore._native import MAX_PAYLOAD, __version__, simd_available
from embstore.cache import InferenceCache
from embstore.config import (
    FTRL,
    SGD,
    Adagrad,
    Adam,
    Constant,
    Delta,
    Normal,
    RowWiseAdagrad,
    TableSpec,
    Uniform,
    Zeros,
)
from embstore.distributed import init_distributed, latest_checkpoint, training_state
from embstore.distributed.store import DistributedStore
from embstore.distributed.table import DistributedTable
from embstore.errors import (
    CapacityError,
    CorruptionError,
    DistributedError,
    DTypeError,
    EmbstoreError,
    InvalidArgumentError,
    KeyNotFoundError,
    NonFiniteError,
    NoSpaceError,
    NotCopyableError,
    NotFoundError,
    PermissionDeniedError,
    RollingBackError,
    ShapeError,
    StorageError,
    StoreClosedError,
    StoreLockedError,
    TableExistsError,
    TableNotFoundError,
    UnavailableError,
    UnsupportedFormatError,
)
from embstore.index import NeighborHash
from embstore.model import ModelClient, ModelMonitor
from embstore.prefetch import prefetch
from embstore.priority import Priority
from embstore.ps import BSP, SSP, OverflowWarning, ParameterServer
from embstore.serving import RemoteClient, Server, connect
from embstore.session import Session, SessionBatch
from embstore.store import Checkpoint, ExportChunk, Store, Table, inspect, verify
from embstore.sync import SyncPort
from embstore.witness import Witness

__all__ = [
    "BSP",
    "FTRL",
    "MAX_PAYLOAD",
    "SGD",
    "SSP",
    "Adagrad",
    "Adam",
    "CapacityError",
    "Checkpoint",
    "Constant",
    "CorruptionError",
    "DTypeError",
    "Delta",
    "DistributedError",
    "DistributedStore",
    "DistributedTable",
    "EmbstoreError",
    "ExportChunk",
    "InferenceCache",
    "InvalidArgumentError",
    "KeyNotFoundError",
    "ModelClient",
    "ModelMonitor",
    "NeighborHash",
    "NoSpaceError",
    "NonFiniteError",
    "Normal",
    "NotCopyableError",
    "NotFoundError",
    "OverflowWarning",
    "ParameterServer",
    "PermissionDeniedError",
    "Priority",
    "RemoteClient",
    "RollingBackError",
    "RowWiseAdagrad",
    "Server",
    "Session",
    "SessionBatch",
    "ShapeError",
    "StorageError",
    "Store",
    "StoreClosedError",
    "StoreLockedError",
    "SyncPort",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TableSpec",
    "UnavailableError",
    "Uniform",
    "UnsupportedFormatError",
    "Witness",
    "Zeros",
    "__version__",
    "connect",
    "errors",
    "init_distributed",
    "inspect",
    "latest_checkpoint",
    "prefetch",
    "simd_available",
    "training_state",
    "verify",
]
