"""A table shared by the processes of a job (:class:`DistributedTable`): it wraps this
process's partition, a :class:`~embstore.Table`, and offers only what every process does
together: lookups and gradients that reach every process's rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from embstore._arrays import as_ids, as_rows, check_out, on_device, torch_tensor
from embstore.config import TableSpec
from embstore.errors import InvalidArgumentError
from embstore.session import Session
from embstore.table import Table

if TYPE_CHECKING:
    from embstore.distributed.store import DistributedStore


class DistributedTable:
    """A table of a :class:`~embstore.DistributedStore`: each process holds the rows it owns,
    and :meth:`lookup` and :meth:`apply_gradients` reach every process's partition. Both are
    collective: every process calls them, in the same order (each with its own ids, any
    number, also none). ``local`` is this process's partition, a plain :class:`Table`, where
    the calls on one process's rows are (``export``, ``save``, ``assign``, ``pin``, ...).

    For training, :meth:`DistributedStore.session` is faster: it exchanges the ids ahead,
    while the batch before trains.
    """

    __slots__ = ("_local", "_sess", "_store")

    def __init__(self, local: Table, store: DistributedStore) -> None:
        self._local = local
        self._store = store
        self._sess: Session | None = None

    def __repr__(self) -> str:
        return (
            f"DistributedTable(name={self.name!r}, embedding_dim={self.embedding_dim}, "
            f"process {self._store.rank} of {self._store.world_size})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DistributedTable) and other._local == self._local

    def __hash__(self) -> int:
        return hash(self._local)

    @property
    def local(self) -> Table:
        """This process's partition of the table: the rows this process owns."""
        return self._local

    @property
    def store(self) -> DistributedStore:
        """The :class:`~embstore.DistributedStore` the table belongs to."""
        return self._store

    @property
    def distributed(self) -> bool:
        """True: the table's rows are shared among the processes of a job."""
        return True

    @property
    def per_process(self) -> bool:
        """False: the table is the job's, not one process's."""
        return False

    @property
    def name(self) -> str:
        return self._local.name

    @property
    def embedding_dim(self) -> int:
        return self._local.embedding_dim

    @property
    def state_dim(self) -> int:
        """Optimizer state values per row."""
        return self._local.state_dim

    @property
    def config(self) -> TableSpec:
        """The spec the table was created with (alike on every process)."""
        return self._local.config

    @property
    def step(self) -> int:
        """This process's partition's optimizer step counter (every process steps its
        partition at every collective gradient call, so they agree)."""
        return self._local.step

    def __getattr__(self, name: str) -> Any:
        # Called only for what the class lacks: a call on one process's rows says where it is.
        if not name.startswith("_") and hasattr(Table, name):
            raise AttributeError(
                f"{name}() acts on one process's rows; on a distributed table call "
                f"table.local.{name}() (this process's partition) on every process"
            )
        raise AttributeError(f"'DistributedTable' object has no attribute {name!r}")

    def _session(self) -> Session:
        if self._sess is None:
            self._sess = Session(self._store, [self.name], prefetch=0, grad_average=False)
        return self._sess

    def __len__(self) -> int:
        """Rows in every process's partition together (collective)."""
        return sum(self._store.comm.all_gather(len(self._local), f"len({self.name!r})"))

    def lookup(
        self,
        ids: Any,
        on_miss: str = "init",
        *,
        return_found: bool = False,
        out: np.ndarray | None = None,
    ) -> Any:
        """Rows of ``ids`` (``float32[B, D]``), wherever they are held; collective."""
        if return_found:
            raise InvalidArgumentError("return_found is not available on a distributed table")
        rows = self._session().lookup_together([ids], on_miss, what=f"lookup({self.name!r})")[0]
        t = torch_tensor(ids)
        arr, device = as_ids(t.reshape(-1) if t is not None else ids)
        if out is not None:
            check_out(out, arr, self.embedding_dim)
            out[...] = rows
            rows = out
        return on_device(rows, device)

    def apply_gradients(self, ids: Any, grads: Any, *, lr: float | None = None) -> int:
        """Gradients of ``ids`` (``float32[B, D]``) to the rows' owners, which sum them over
        every process (duplicates included) and step once per id; collective. Returns the
        unique ids this process sent."""
        dim = self.embedding_dim

        def grads_of(_t: int, uniq: np.ndarray, inv: np.ndarray | None) -> np.ndarray:
            g = as_rows(grads, len(uniq) if inv is None else len(inv), self._local, "grads")
            if inv is None:  # one process: the table sums duplicates itself
                return g
            summed = np.zeros((len(uniq), dim), np.float32)
            np.add.at(summed, inv, g)
            return summed

        sent = self._session().apply_gradients_together(
            [ids], grads_of, lr, what=f"apply_gradients({self.name!r})"
        )
        if self._store.world_size == 1:  # the ids as given: count the distinct ones
            t = torch_tensor(ids)
            return len(np.unique(as_ids(t.reshape(-1) if t is not None else ids)[0]))
        return sent
