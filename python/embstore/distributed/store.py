"""A store shared by the processes of a job (:class:`DistributedStore`): it wraps this
process's partition, a :class:`~embstore.Store`, and offers what every process does together
(creating tables, sessions, flushes, checkpoints, restores), each a collective that raises on
every process when it fails on one."""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Callable
from typing import Any

from embstore.checkpoints import Checkpoint
from embstore.config import TableSpec, spec_of, to_native_spec
from embstore.distributed.comm import Comm, calling
from embstore.distributed.files import checkpoint, open_part, restore_part
from embstore.distributed.table import DistributedTable
from embstore.errors import InvalidArgumentError
from embstore.session import Session, table_names
from embstore.store import Store
from embstore.table import Table

#: What a session must be opened with alike on every process (in the order an error checks).
SESSION_FIELDS = ("tables", "grad_average", "staleness", "on_miss")


class DistributedStore:
    """Every table shared among the processes of a ``torchrun`` job: each process holds the
    rows whose id hashes to its rank (:func:`~embstore.distributed.owner_of`) in its own
    partition, a :class:`~embstore.Store` in ``<path>/rank-<r>`` with its own memory budget,
    disk tier and flushes (``store.local``); lookups and gradients reach the owners
    (docs/training.md "Many processes").

    Args:
        path: a directory every process reaches (or the same path on every machine), opened
            if it holds a distributed store of this job's process count, created otherwise.
        replica_id, memory_budget_bytes, background_eviction, eviction: each process's
            partition's, as for :class:`~embstore.Store` (the budget is each process's).

    Made collectively: every process of the job constructs it, and every call below that
    says "collective" is made by every process, in the same order. ``torch.distributed`` is
    initialised (gloo) when the caller has not (:func:`~embstore.init_distributed`).

    Example (run by every process of ``torchrun --nproc-per-node 2 train.py``)::

        store = embstore.DistributedStore("/data/ctr")
        item = store.create_table("item", embedding_dim=64, optimizer=embstore.Adam())
        for b in store.session(["item"]).run(loader, ids=lambda b: {"item": b["item"]}):
            ...
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        replica_id: int = 0,
        memory_budget_bytes: int | None = None,
        background_eviction: bool = False,
        eviction: str = "lru_lfu",
    ) -> None:
        if path is None:
            raise InvalidArgumentError(
                "a distributed store needs a path: each process keeps its partition in "
                "<path>/rank-<r> (a directory every process can reach, or the same path on "
                "every machine)"
            )
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(f"path must be a directory, got {path!r}")
        self._path = pathlib.Path(path)
        self._comm = Comm.from_env()
        part = open_part(self._comm, self._path)
        self._local = self._comm.agreed(
            f"opening the distributed store {path}",
            lambda: Store(
                part,
                replica_id=replica_id,
                memory_budget_bytes=memory_budget_bytes,
                background_eviction=background_eviction,
                eviction=eviction,
            ),
        )

    # -- what the job is ------------------------------------------------------------------

    @property
    def local(self) -> Store:
        """This process's partition: a plain :class:`~embstore.Store` of the rows it owns."""
        return self._local

    @property
    def comm(self) -> Comm:
        """The processes sharing the store (:class:`~embstore.distributed.Comm`: ``rank``,
        ``world`` and the collectives the store's calls use)."""
        return self._comm

    @property
    def rank(self) -> int:
        """This process's rank in the job."""
        return self._comm.rank

    @property
    def world_size(self) -> int:
        """Processes sharing the store."""
        return self._comm.world

    @property
    def distributed(self) -> bool:
        """True: the tables are shared among the processes of a job."""
        return True

    @property
    def path(self) -> pathlib.Path:
        """The store's directory (each process's partition is under it)."""
        return self._path

    @property
    def memory_budget(self) -> tuple[int, int] | None:
        """This process's partition's ``(limit, in use)`` in bytes, or ``None``."""
        return self._local.memory_budget

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the rows this process's partition holds pinned."""
        return self._local.pinned_bytes

    def __repr__(self) -> str:
        return (
            f"DistributedStore(path={str(self._path)!r}, process {self.rank} of "
            f"{self.world_size}, tables={self.tables()})"
        )

    # -- tables ---------------------------------------------------------------------------

    def create_table(
        self, name: str | TableSpec, embedding_dim: int | None = None, **fields: Any
    ) -> DistributedTable:
        """Create a table on every process (collective): the arguments of
        :meth:`Store.create_table`. Every process must create it alike: a difference raises
        :class:`InvalidArgumentError` on every process, naming the process and the fields."""
        what = f"create_table({getattr(name, 'name', name)!r})"

        def made() -> tuple[TableSpec, dict[str, Any]]:
            spec = spec_of(name, embedding_dim, **fields)
            return spec, to_native_spec(spec)

        spec, native = self._comm.agreed(what, made)
        specs = self._comm.all_gather(native, what)

        def create() -> None:
            differ = [r for r, other in enumerate(specs) if other != native]
            if differ:
                fields_ = sorted(k for k in native if specs[differ[0]].get(k) != native.get(k))
                raise InvalidArgumentError(
                    f"table {native['name']!r} is configured differently on process "
                    f"{differ[0]} than on process {self.rank} ({', '.join(fields_)}): every "
                    "process of a distributed store must create its tables alike"
                )
            self._local.create_table(spec)

        self._comm.agreed(what, create)
        return self.table(native["name"])

    def table(self, name: str) -> DistributedTable:
        """The table called ``name`` (:class:`TableNotFoundError` if there is none)."""
        return DistributedTable(self._local.table(name), self)

    def __getitem__(self, name: str) -> DistributedTable:
        return self.table(name)

    def __contains__(self, name: object) -> bool:
        return name in self._local

    def tables(self) -> list[str]:
        """Names of all tables, sorted."""
        return self._local.tables()

    def drop_table(self, name: str) -> None:
        """Remove the table called ``name`` on every process (collective)."""
        with calling(f"drop_table({name!r})"):
            self._comm.agreed(f"drop_table({name!r})", lambda: self._local.drop_table(name))

    # -- training -------------------------------------------------------------------------

    def session(
        self,
        tables: list[str | Table | DistributedTable]
        | tuple[str | Table | DistributedTable, ...]
        | None = None,
        *,
        prefetch: int | None = None,
        grad_average: bool = True,
        on_miss: str = "init",
        device: Any = None,
        staleness: int = 0,
        features: Any = None,
    ) -> Session:
        """A training session over ``tables`` (the arguments of :meth:`Store.session`), whose
        batches exchange each process's ids with their owners; collective: every process
        opens its sessions in the same order, with the same ``tables`` (in the same order),
        ``grad_average``, ``staleness`` and ``on_miss``; a difference raises
        :class:`InvalidArgumentError` on every process, naming the field and both values.
        ``prefetch`` and ``device`` may differ."""
        try:
            names: Any = table_names(tables, features)
        except TypeError:
            names = repr(tables)  # not a list: Session says so, on every process
        mine = {
            "tables": names,
            "grad_average": grad_average,
            "staleness": staleness,
            "on_miss": on_miss,
        }

        def open_() -> Session:
            return Session(
                self,
                names if isinstance(names, list) else tables,
                prefetch=prefetch,
                grad_average=grad_average,
                on_miss=on_miss,
                device=device,
                staleness=staleness,
                features=features,
            )

        return agree_session(self._comm, mine, open_)

    # -- durability -----------------------------------------------------------------------

    def ps(
        self,
        tables: list[str] | tuple[str, ...],
        workers: int,
        consistency: Any = None,
        **options: Any,
    ) -> Any:
        """A parameter server over ``tables`` across this job's processes (every process calls
        it together): ``workers`` threads per process, each process serving the rows this store
        keeps on it (and, after ``finish_gather``, the rows placed on it) to the others over TCP;
        see :meth:`embstore.Store.ps` and ``docs/iterstore.md``. Each process listens on
        ``$EMBSTORE_PS_HOST`` (default: 127.0.0.1 when ``MASTER_ADDR`` is a loopback address,
        else this host's address) at a free port. Call ``close()`` (every process) before
        using the tables through the store again: it moves placed rows back.
        """
        from embstore.ps import ParameterServer

        if not self.distributed:
            return ParameterServer(self._local, list(tables), workers, consistency, **options)
        host = os.environ.get("EMBSTORE_PS_HOST")
        if not host:
            master = os.environ.get("MASTER_ADDR", "127.0.0.1")
            host = (
                "127.0.0.1"
                if master in ("127.0.0.1", "localhost", "::1")
                else (socket.gethostbyname(socket.gethostname()))
            )
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        addrs = self._comm.all_gather(f"{host}:{port}", "ps addresses")
        return ParameterServer(
            self._local,
            list(tables),
            workers,
            consistency,
            _cluster=(self.rank, [str(a) for a in addrs]),
            **options,
        )

    def flush(self) -> dict[str, int]:
        """Every process flushes its partition (collective); returns this process's
        :meth:`Store.flush`."""
        with calling("flush()"):
            return self._comm.agreed("flush", self._local.flush)

    def compact(self) -> dict[str, int]:
        """Every process compacts its partition (collective; :meth:`Store.compact`)."""
        with calling("compact()"):
            return self._comm.agreed("compact", self._local.compact)

    def checkpoint(
        self,
        path: str | os.PathLike[str],
        *,
        step: int | None = None,
        state: Any = None,
        progress: bool | Callable[[int, int], None] = False,
    ) -> Checkpoint:
        """Collective, at a batch boundary: every process writes its partition into
        ``path/rank-<r>`` (:meth:`Store.checkpoint`), process 0 also ``state`` (anything
        picklable: the epoch, the dense model's ``state_dict()``; read back with
        :func:`embstore.training_state`), and the manifest last, which makes the checkpoint
        complete (:func:`embstore.latest_checkpoint` finds the newest complete one by
        ``step``). Process 0 first writes a marker (``embstore-checkpoint-begun.json``): a
        directory holding it and no manifest is a checkpoint a dead process interrupted, and
        is replaced when the job checkpoints into it again (after a restart); any other
        directory that is not empty is refused. Checkpoints of a distributed store are full
        (no ``since``)."""
        local = self._local
        with calling("checkpoint()"):
            return checkpoint(
                self._comm,
                pathlib.Path(path),
                step,
                state,
                write_part=lambda part: local.checkpoint(part, progress=progress),
                specs=lambda: {n: local.table(n).native().config() for n in local.tables()},
            )

    @classmethod
    def restore(
        cls,
        checkpoint: Checkpoint | str | os.PathLike[str],
        path: str | os.PathLike[str],
        *,
        num_shards: int | None = None,
        memory_budget_bytes: int | None = None,
        progress: bool | Callable[[int, int], None] = False,
    ) -> DistributedStore:
        """Collective: restore a distributed checkpoint into ``path`` (a new or empty
        directory) and open it. With the process count that wrote it each process restores
        its own partition; with another count each process takes the rows it owns from every
        partition (slower: every process reads every partition). ``num_shards`` and
        ``progress`` as for :meth:`Store.restore`. To restore one into one process alone
        (evaluation, serving): :meth:`Store.restore`."""
        comm = Comm.from_env()
        restore_part(
            comm,
            pathlib.Path(checkpoint),
            pathlib.Path(path),
            lambda src, dst: Store.restore(src, dst, num_shards=num_shards, progress=progress),
            Store,
        )
        return cls(path, memory_budget_bytes=memory_budget_bytes)

    def close(self) -> None:
        """Close this process's partition (:meth:`Store.close`: flushed first)."""
        self._local.close()

    def __enter__(self) -> DistributedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def agree_session(comm: Comm, mine: dict[str, Any], open_: Callable[[], Any]) -> Any:
    """Collective: every process says how it opens a session (``mine``: the values of
    :data:`SESSION_FIELDS`); if they differ anywhere, every process raises an
    :class:`InvalidArgumentError` naming the field and both values, else ``open_()`` runs on
    every process (its error, if any, raised on every one). A session's batches are exchanged
    table by table, in the session's order, and its gradients scaled and staged by these
    values: two processes that disagree train ids into the wrong tables, apply a row that is
    neither an average nor a sum, or wait on each other until the timeout."""
    what = "opening a session (store.session())"
    if comm.world == 1:
        return open_()
    everyone = comm.all_gather(mine, what)

    def check_and_open() -> Any:
        for rank, other in enumerate(everyone):
            for field in SESSION_FIELDS:
                if other.get(field) != mine.get(field):
                    hint = (
                        " (the same tables in the same order: a list built from a set or a "
                        "dict of another process may be ordered differently)"
                        if field == "tables"
                        else ""
                    )
                    raise InvalidArgumentError(
                        f"store.session() was opened with {field}={other.get(field)!r} on "
                        f"process {rank} and {field}={mine.get(field)!r} on process "
                        f"{comm.rank}: every process of a distributed store must open its "
                        f"sessions alike{hint}"
                    )
        return open_()

    return comm.agreed(what, check_and_open)
