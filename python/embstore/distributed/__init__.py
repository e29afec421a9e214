"""A store spread over the processes of a training job (:class:`DistributedStore`).

Each process of a job launched by ``torchrun`` (or any launcher that sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``) opens its own partition of every table:
the rows whose id hashes to its rank, in its own directory ``<path>/rank-<r>`` with its own
memory budget, disk tier and checkpoints (the hierarchical parameter server's layout,
hierarchical-gpu-ps §3, §5). A batch's rows owned by other processes are pulled from their
owners, and gradients go to the owners, which sum the gradients of every process and apply the
table's optimizer once per id: optimizer state lives in one place.

The exchanges are ``torch.distributed`` collectives (``all_to_all`` over gloo, on process groups
of their own, so they never interleave with the model's DDP all-reduce); every one of them
carries each process's error flag, so a bad batch on one process (wrong dtype, NaN gradients, a
corrupt file) raises on every process, naming the process and its error, instead of leaving the
others waiting. A process that dies is noticed within the timeout (``EMBSTORE_DIST_TIMEOUT_S``,
default 300 s), as a :class:`~embstore.DistributedError`.

Checkpoints are a consistent cut: every process writes its partition at the same batch boundary
and process 0 writes the manifest that makes the checkpoint complete, last. A checkpoint restores
onto the process count that wrote it (each process restores its own partition) or onto another
one (each process takes the rows it owns from every partition).

The package's layers, each a module: :mod:`~embstore.distributed.placement` (which process owns
an id), :mod:`~embstore.distributed.comm` (the job and its collectives),
:mod:`~embstore.distributed.files` (manifests, checkpoints, restores), and above them
:mod:`~embstore.distributed.store` and :mod:`~embstore.distributed.table`, which wrap a
:class:`~embstore.Store` and a :class:`~embstore.Table` (TorchRec's sharded-from-unsharded
shape): the plain store knows nothing of processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embstore.distributed.comm import Comm, init_distributed
from embstore.distributed.files import (
    BEGUN,
    MANIFEST,
    STATE_FILE,
    latest_checkpoint,
    training_state,
    write_manifest,
)
from embstore.distributed.placement import owner_of

if TYPE_CHECKING:
    from embstore.distributed.store import DistributedStore
    from embstore.distributed.table import DistributedTable

__all__ = [
    "BEGUN",
    "MANIFEST",
    "STATE_FILE",
    "Comm",
    "DistributedStore",
    "DistributedTable",
    "init_distributed",
    "latest_checkpoint",
    "owner_of",
    "training_state",
    "write_manifest",
]


def __getattr__(name: str) -> Any:
    # The store and the table sit above embstore.store, which imports this package's lower
    # modules: importing them here, at the package's import, would close a circle.
    if name == "DistributedStore":
        from embstore.distributed.store import DistributedStore

        return DistributedStore
    if name == "DistributedTable":
        from embstore.distributed.table import DistributedTable

        return DistributedTable
    raise AttributeError(f"module 'embstore.distributed' has no attribute {name!r}")
