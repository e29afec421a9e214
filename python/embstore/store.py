"""The embedded store: named embedding tables in this process (:class:`Store`), its
checkpoints, and :func:`inspect` / :func:`verify` of a store's directory.

The tables themselves are :mod:`embstore.table`; ids and rows are normalised by
:mod:`embstore._arrays` (see there for the shapes and dtypes accepted).
"""

from __future__ import annotations

import datetime as _dt
import os
import pathlib
import sys
from collections.abc import Callable
from inspect import signature as _signature
from typing import Any

import numpy as np

from embstore import _native
from embstore import sync as _sync
from embstore.checkpoints import Checkpoint
from embstore.config import Initializer, Optimizer, TableSpec, spec_of, to_native_spec
from embstore.distributed.comm import Comm
from embstore.distributed.files import read_manifest, repartition
from embstore.errors import InvalidArgumentError, StoreClosedError
from embstore.priority import Priority
from embstore.session import Session
from embstore.sync import SyncPort
from embstore.table import ExportChunk, Table


class Store:
    """Named embedding tables: held in memory (the default), or kept in a directory.

    Args:
        path: a directory to keep the store in, opened if it holds one and created otherwise.
            Writes live in memory until :meth:`flush` makes them durable; after a crash,
            reopening gives every row its value at the last flush (or a later one). One
            process opens a directory at a time (:class:`StoreLockedError`). ``None``: a store
            held only in memory, exactly as fast as ever.
        replica_id: written into every row version; 0..=2**31 - 1. Replicas that sync with
            each other need distinct ids (:meth:`follow` draws a random one).
        memory_budget_bytes: with ``path``, the bytes of memory the tables may hold (indexes,
            rows, metadata, all counted); rows beyond it live on disk only and are read back
            when a call uses them, so tables may be many times larger than memory. Lookups of
            rows in memory are as fast as ever; a row on disk costs one read. ``None`` (the
            default): every row in memory.
        background_eviction: with a memory budget, ``True`` has a thread of the store evict
            rows once the tables pass 95 % of the budget, so that calls rarely wait for an
            eviction: use it when training calls the store directly (1.2 times the disk
            bound at 50M rows vs 1.36 without, docs/benchmarks.md). ``False`` (the default;
            faster with :func:`embstore.prefetch`, whose thread then does the evictions): a
            call that brought rows in and left the store over its budget evicts on its own
            thread; calls that brought none never wait for an eviction. Indexes and pinned
            rows are never evicted: when they alone pass the budget, other rows may take 5 %
            of it (``docs/storage.md``).
        eviction: with a memory budget, which rows leave memory first: ``"lru_lfu"`` (the
            default: a CLOCK recency segment in front of a sampled LFU, 15 B per hot row),
            ``"none"`` (never evict), or one of the inference cache's policies run on the
            store's rows: ``"lru"`` (exact LRU), ``"lfu"`` (LFU with aging) or
            ``"group_lfu"`` (each access a one-key request; ~26-31 B per hot row). The store
            replays concurrent hits into these in batches (docs/cache.md).

        distributed: not here: a store shared by the processes of a ``torchrun`` job is a
            :class:`~embstore.DistributedStore`, which wraps one of these per process
            (docs/training.md "Many processes").
        per_process: this store is one process's own in a multi-process ``torch.distributed``
            job, on purpose. Without it, training a table of
            the store — a module's training forward pass, a session's ``push_grads()`` —
            raises :class:`DistributedError` when ``torch.distributed`` runs more than one
            process: each process would silently train its own copy of the table.

    Example::

        >>> import embstore
        >>> store = embstore.Store()
        >>> user = store.create_table(
        ...     "user", embedding_dim=64,
        ...     optimizer=embstore.Adagrad(lr=0.05), initializer=embstore.Normal(std=0.01))
        >>> store.tables()
        ['user']
        >>> store["user"].lookup([1, 2**40]).shape
        (2, 64)

    A durable store, a checkpoint and a restore onto another shard count::

        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> store = embstore.Store(root / "ctr")
        >>> item = store.create_table("item", embedding_dim=8)
        >>> _ = item.lookup([1, 2, 3])
        >>> _ = store.flush()                       # every write so far is durable
        >>> ckpt = store.checkpoint(root / "ckpt-1")
        >>> _ = item.lookup([4])
        >>> inc = store.checkpoint(root / "ckpt-2", since=ckpt)   # only what changed
        >>> copy = embstore.Store.restore(inc, root / "copy", num_shards=2)
        >>> len(copy["item"]), copy["item"].config["num_shards"]
        (4, 2)
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        replica_id: int = 0,
        memory_budget_bytes: int | None = None,
        background_eviction: bool = False,
        eviction: str = "lru_lfu",
        distributed: bool = False,
        per_process: bool = False,
    ) -> None:
        if not isinstance(distributed, bool):
            raise InvalidArgumentError(f"distributed must be a bool, got {distributed!r}")
        if not isinstance(per_process, bool):
            raise InvalidArgumentError(f"per_process must be a bool, got {per_process!r}")
        if distributed:
            raise InvalidArgumentError(
                "a store shared by the processes of a job is embstore.DistributedStore(path, "
                "...): the same arguments, without distributed=True (it wraps this process's "
                "partition, a Store, as store.local)"
            )
        self._per_process = per_process
        if isinstance(replica_id, bool) or not isinstance(replica_id, int | np.integer):
            raise InvalidArgumentError(f"replica_id must be an int, got {replica_id!r}")
        if not 0 <= replica_id <= _native.MAX_REPLICA:
            raise InvalidArgumentError(
                f"replica_id must be in 0..={_native.MAX_REPLICA}, got {replica_id}"
            )
        if path is not None and not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(
                f"path must be a directory (str or os.PathLike), got {path!r}"
                " (replica_id is keyword-only)"
            )
        if memory_budget_bytes is not None:
            if path is None:
                raise InvalidArgumentError(
                    "memory_budget_bytes needs a path: rows beyond the budget live on disk"
                )
            if isinstance(memory_budget_bytes, bool) or not isinstance(
                memory_budget_bytes, int | np.integer
            ):
                raise InvalidArgumentError(
                    f"memory_budget_bytes must be an int, got {memory_budget_bytes!r}"
                )
            if not 1 <= memory_budget_bytes < 2**64:
                raise InvalidArgumentError(
                    f"memory_budget_bytes must be in 1..2**64, got {memory_budget_bytes}"
                )
            memory_budget_bytes = int(memory_budget_bytes)
        if not isinstance(background_eviction, bool):
            raise InvalidArgumentError(
                f"background_eviction must be a bool, got {background_eviction!r}"
            )
        if not isinstance(eviction, str):
            raise InvalidArgumentError(f"eviction must be a policy name (str), got {eviction!r}")
        self._store: Any = _native.Store(
            int(replica_id),
            None if path is None else os.fspath(path),
            memory_budget_bytes,
            background_eviction,
            eviction,
        )
        self._follower: Any = None

    @classmethod
    def _wrap(cls, inner: Any) -> Store:
        store = cls.__new__(cls)
        store._store = inner
        store._follower = None
        store._per_process = False
        return store

    def serve_sync(
        self,
        listen: str = "127.0.0.1:0",
        *,
        token: str | None = None,
        parts: int | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_client_ca: str | os.PathLike[str] | None = None,
        use_cache: bool | None = None,
        tombstone_horizon_s: float | None = None,
        etcd: str | list[str] | None = None,
        dc: str | None = None,
        advertise: str | None = None,
    ) -> SyncPort:
        """Exposes this store's tables for pulling on ``listen`` (``host:port``; port 0 picks
        one: see :attr:`SyncPort.address`). From now on every table keeps sync state: each
        write is versioned and remembered for followers, each removal leaves a tombstone.
        ``token``: a replication token followers must present. ``parts``: sync parts per
        table (a power of two, at least the shard count; default 1024); followers take the
        source's. ``tls_cert``/``tls_key`` (PEM files): serve TLS; with ``tls_client_ca``,
        followers need a certificate from that CA (mutual TLS). ``use_cache=False`` answers
        every pull by a scan (only for measuring what the update cache gains).
        ``tombstone_horizon_s``: how long a removal's tombstone is kept (default 3600); a
        follower away for longer gets the parts with collected removals whole and drops the
        rows they lack.

        A store that syncs already (a follower, also after :meth:`stop_following`, to become
        a source for others) serves with its own sync options: leave ``parts``, ``use_cache``
        and ``tombstone_horizon_s`` out (asking for others is an error).

        With ``etcd`` (a URL or a list) and ``dc``, the port is registered there as a primary
        of data centre ``dc`` (under a lease, until :meth:`SyncPort.stop`), so that replicas
        that follow through etcd find it: a trainer registers its own sync port this way.
        ``advertise``: the ``host:port`` replicas dial (default: the address it listens on,
        which must then not be ``0.0.0.0``).

        Start it before other threads write. A table that syncs cannot be replaced by
        :meth:`Table.load` (import its rows instead: they sync as writes)."""
        tls = (tls_cert, tls_key, tls_client_ca)
        return _sync.serve(
            self._inner,
            listen,
            token,
            parts,
            tls,
            use_cache,
            tombstone_horizon_s,
            etcd=etcd,
            dc=dc,
            advertise=advertise,
        )

    @classmethod
    def follow(
        cls,
        source: str | None = None,
        *,
        etcd: str | list[str] | None = None,
        dc: str | None = None,
        path: str | os.PathLike[str] | None = None,
        token: str | None = None,
        tables: list[str] | None = None,
        with_state: bool = False,
        replica_id: int | None = None,
        memory_budget_bytes: int | None = None,
        wait_ms: int = 1000,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_domain: str | None = None,
        priority: bool = True,
        witness_dir: str | os.PathLike[str] | None = None,
        witness_bucket_s: float = 1.0,
    ) -> Store:
        """A store that follows the sync port at ``source`` (``host:port``), or, with ``etcd``
        (a URL or a list) and ``dc``, the source etcd names for each table: this data
        centre's leader, or a primary while there is none (it registers there as a follower
        without a sync port, so it is never a leader itself): it gets the
        source's tables (all, or ``tables``), pulls their rows, then keeps pulling what
        changes, one thread per table, while you read from it. It joins empty (or from the
        rows already in ``path``, which it keeps and pulls over). ``with_state`` also takes
        optimizer state (a replica that may take over training; inference replicas need
        values only). Rows that were created by lookups and never written hold their initial
        values, which the follower's lookups compute alike: they are not shipped.
        ``replica_id``: this replica's id (default: a random one; it must
        differ from the source's). ``tls_ca``: talk TLS, trusting sources whose certificate
        chains to this CA (PEM; a source it does not trust is refused with
        :class:`PermissionDeniedError`), with ``tls_cert``/``tls_key`` for mutual TLS and
        ``tls_domain`` the name on the source's certificate (default: its host).
        ``priority=False``: no prioritised pulls while the link is congested (normal sync
        only). ``witness_dir``: the followed tables become witnesses keeping their healthy
        store there, logging in buckets of ``witness_bucket_s`` (use :class:`embstore.Witness`,
        which drives them).
        :meth:`sync_status` says how fresh it is;
        :meth:`wait_caught_up` waits for it to catch up; :meth:`close` stops following.

        >>> import embstore
        >>> primary = embstore.Store(replica_id=1)
        >>> t = primary.create_table("item", embedding_dim=4)
        >>> port = primary.serve_sync()
        >>> t.assign([1, 2, 3], [[0.5] * 4] * 3)
        >>> replica = embstore.Store.follow(port.address)
        >>> replica.wait_caught_up(timeout=30)
        True
        >>> len(replica["item"])
        3
        >>> replica.close(); port.stop()
        """
        store = cls(
            path,
            replica_id=_sync.new_replica_id() if replica_id is None else replica_id,
            memory_budget_bytes=memory_budget_bytes,
        )
        try:
            if witness_dir is not None:
                store._inner.witness_tables(
                    max(1, round(witness_bucket_s * 1000)), os.fspath(witness_dir)
                )
            store._follower = _sync.start_follower(
                store._inner,
                source,
                etcd=etcd,
                dc=dc,
                token=token,
                tables=tables,
                with_state=with_state,
                wait_ms=wait_ms,
                tls=(tls_ca, tls_cert, tls_key, tls_domain),
                priority=priority,
            )
        except BaseException:
            store.close()
            raise
        return store

    def sync_status(self) -> list[dict[str, Any]]:
        """For a following store, per table: whether it is connected and caught up, the
        parts still to pull, the freshness lag (``lag_ms_p50``/``lag_ms_p99``: now minus the
        newest row's write time, over recent replies), rows applied, bytes in and out, the
        share of pulls the source answered from its update cache (``cache_hit_rate``), and
        errors with the last one. An empty list when the store follows nothing."""
        if self._follower is None:
            return []
        out = []
        for s in self._follower.status():
            s = dict(s)
            s["cache_hit_rate"] = s["parts_from_cache"] / s["parts"] if s["parts"] else None
            out.append(s)
        return out

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """Waits until every followed table has pulled all changes the source had when this
        was called (or ``timeout`` seconds); whether it has. ``False`` when not following."""
        if self._follower is None:
            return False
        return bool(self._follower.wait_caught_up(float(timeout)))

    def stop_following(self) -> None:
        """Stops pulling (the rows stay, and the store keeps serving them)."""
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    @property
    def _inner(self) -> Any:
        if self._store is None:
            raise StoreClosedError("the store is closed")
        return self._store

    def close(self) -> None:
        """Flush (for a store in a directory), then close the store: its directory is
        unlocked at once (another ``Store`` may open it), and every later call on this object
        or on a handle of its tables raises :class:`StoreClosedError` (a
        :class:`StorageError`), so no write can go unflushed. ``with embstore.Store(path) as
        store:`` closes at the end of the block. Closing twice is a no-op.

        If the flush fails (a full disk: :class:`NoSpaceError`) nothing is closed and nothing
        is lost: the store stays open with its rows in memory, so free space and call
        ``close()`` (or ``flush()``) again. Stop other threads' calls on the store first: a
        call still running may finish after the flush."""
        if self._store is None:
            return
        self.stop_following()
        self._store.close()
        self._store = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._store is None:
            return "Store(closed)"
        where = f"path={str(self.path)!r}, " if self.path is not None else ""
        return f"Store({where}tables={self.tables()})"

    @property
    def memory_budget(self) -> tuple[int, int] | None:
        """``(limit, in use)`` in bytes for a store with a memory budget, else ``None``."""
        return self._inner.memory_budget

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the rows pinned in memory (:meth:`Table.pin`), all tables together."""
        return int(self._inner.pinned_bytes)

    @property
    def path(self) -> pathlib.Path | None:
        """The store's directory, or ``None`` for a store held in memory."""
        p = self._inner.path
        return None if p is None else pathlib.Path(p)

    def recovery(self) -> dict[str, Any] | None:
        """What opening the directory found: ``created`` (no store was there), ``tables``,
        ``segments`` and ``records`` replayed, ``torn_manifest_bytes`` (a manifest append a
        crash cut short, dropped) and ``orphan_segments`` (files of a flush a crash cut
        short, or spills of evictions no flush adopted, deleted). ``None`` for a store in
        memory."""
        return self._inner.recovery()

    def flush(self) -> dict[str, int]:
        """Make every write acknowledged before this call durable; return what was written
        (``segments``, ``records``, ``bytes``, ``compactions`` — tables rewritten whole — and
        ``compacted_segments`` — stale files whose live rows the flush's compaction step moved
        out and deleted — and ``spills_adopted`` — segments evictions wrote under a memory
        budget since the last flush, made durable by this one). A no-op in memory. On a full
        disk it raises :class:`NoSpaceError` and loses nothing: the rows stay in memory and
        the next flush writes them."""
        return self._inner.flush()

    def compact(self, *, progress: bool | Callable[[int, int], None] = False) -> dict[str, int]:
        """Rewrite every table's rows (from memory and from disk) into one fresh segment each
        and delete the older segments, so disk use drops to the live rows; return what was
        written. ``progress=True`` prints tables done to stderr. Flushes compact by themselves,
        a bounded step after each (the stalest files' live rows moved out, the files deleted),
        so disk use stays within about twice the live rows and no flush rewrites a whole
        table; call this by hand before archiving a directory, say. A no-op in memory."""
        return self._inner.compact(_progress(progress, "compact", "tables"))

    def checkpoint(
        self,
        path: str | os.PathLike[str],
        since: Checkpoint | str | os.PathLike[str] | None = None,
        *,
        progress: bool | Callable[[int, int], None] = False,
    ) -> Checkpoint:
        """Write a self-contained snapshot of every table (rows, optimizer state, metadata,
        steps, configs) into ``path``, a new or empty directory. :meth:`restore`,
        :func:`embstore.inspect`, :func:`embstore.verify` and serving read it the same way
        whether the store is kept in a directory or held in memory.

        A store in a directory flushes first; its segments are immutable, so they are
        hard-linked (copied across file systems): a checkpoint costs little. With ``since``
        (an earlier checkpoint of this store) only what was written after it is linked;
        restoring then needs the chain.

        A store held in memory writes every row into the checkpoint, streamed a chunk at a
        time (no copy of a whole table), so it costs a write of the table's bytes. Its
        checkpoints are always full: ``since`` raises :class:`InvalidArgumentError`. Rows
        written by other threads while it runs may be in it or not, each row whole; take it
        between training steps for one point in time. On an error (a full disk:
        :class:`NoSpaceError`) what was written is removed; a directory without a manifest is
        never taken for a checkpoint.

        ``progress=True`` prints rows done to stderr; a callable gets ``(done, total)``.
        (A distributed store's checkpoint: :meth:`embstore.DistributedStore.checkpoint`.)"""
        since_path = None if since is None else os.fspath(since)
        native = self._inner.checkpoint(
            os.fspath(path), since_path, _progress(progress, "checkpoint", "rows")
        )
        return Checkpoint(**native)

    @classmethod
    def restore(
        cls,
        checkpoint: Checkpoint | str | os.PathLike[str],
        path: str | os.PathLike[str],
        *,
        num_shards: int | None = None,
        progress: bool | Callable[[int, int], None] = False,
        memory_budget_bytes: int | None = None,
        distributed: bool = False,
    ) -> Store:
        """Create a store in ``path`` (a new or empty directory) from ``checkpoint`` and the
        checkpoints it builds on, each table on ``num_shards`` shards (default: as saved), and
        open it (with ``memory_budget_bytes``, if given). ``progress=True`` prints segments
        read to stderr; a callable gets ``(done, total)``.

        A distributed checkpoint (:meth:`embstore.DistributedStore.checkpoint`) is restored
        whole into one store of this process: every partition's rows (nothing collective: how
        one process of a job evaluates or serves the model alone). To restore one onto the
        processes of a job, each its partition: :meth:`embstore.DistributedStore.restore`."""
        if distributed:
            raise InvalidArgumentError(
                "a distributed restore is embstore.DistributedStore.restore(checkpoint, path, "
                "...): the same arguments, without distributed=True"
            )
        if num_shards is not None and (
            isinstance(num_shards, bool) or not isinstance(num_shards, int | np.integer)
        ):
            raise InvalidArgumentError(f"num_shards must be an int, got {num_shards!r}")
        if num_shards is not None and not 0 <= num_shards < 2**63:
            raise InvalidArgumentError(
                f"num_shards must be a power of two in 1..=1024, got {num_shards}"
            )

        def restore_one(src: Any, dst: Any) -> Store:
            inner = _native.Store.restore(
                os.fspath(src),
                os.fspath(dst),
                None if num_shards is None else int(num_shards),
                _progress(progress, "restore"),
            )
            return cls._wrap(inner)

        manifest = read_manifest(pathlib.Path(checkpoint))
        if manifest is not None and "checkpoint" in manifest:
            # A distributed checkpoint restored by one process alone (evaluation, serving):
            # every partition's rows merged into one store. Nothing collective.
            target = pathlib.Path(path)
            target.mkdir(parents=True, exist_ok=True)
            if any(target.iterdir()):
                raise InvalidArgumentError(f"restore target {target} is not empty")
            repartition(
                Comm.single(),
                pathlib.Path(checkpoint),
                int(manifest["world_size"]),
                target,
                manifest,
                restore_one,
                lambda dst: cls(dst),
            )
            return cls(path, memory_budget_bytes=memory_budget_bytes)
        store = restore_one(checkpoint, path)
        if memory_budget_bytes is None:
            return store
        store.close()
        return cls(path, memory_budget_bytes=memory_budget_bytes)

    def create_table(
        self,
        name: str | TableSpec,
        embedding_dim: int | None = None,
        *,
        optimizer: Optimizer | None = None,
        initializer: Initializer | None = None,
        num_shards: int = 8,
        seed: int = 0,
        admission_min_count: int = 0,
        admission_sketch_width: int = 1 << 20,
        ttl: float | _dt.timedelta | None = None,
        on_non_finite: str = "error",
        huge_pages: bool = True,
        dtype: Any = "fp32",
        priority: Priority | None = None,
    ) -> Table:
        """Create a table from a :class:`TableSpec`, or from the spec's fields given as
        arguments: ``create_table(spec)`` and ``create_table("user", 64, optimizer=...)`` are
        the same call.

        Args:
            name: a :class:`TableSpec` (then no other argument), or the table's name, unique in
                the store.
            embedding_dim: ``D``, 1..4096.
            optimizer: :class:`SGD` (default, lr 0.01), :class:`Adagrad`,
                :class:`RowWiseAdagrad`, :class:`Adam` or :class:`FTRL`.
            initializer: :class:`Normal` (default, std 0.01), :class:`Uniform`,
                :class:`Constant` or :class:`Zeros`.
            num_shards: a power of two; each shard has its own index and lock, and large
                batches run their shards in parallel.
            seed: of the initializer.
            admission_min_count: a new id gets a row only on its n-th ``lookup``; before that
                lookups return its initial value without storing it and its gradients are
                dropped (0 or 1: at once).
            admission_sketch_width: counters per row of the count-min sketch behind admission.
            ttl: seconds (or a timedelta); :meth:`Table.evict_expired` removes rows not
                updated for this long.
            on_non_finite: ``"error"`` rejects a batch with a NaN/Inf gradient; ``"skip"``
                skips those ids and steps the rest.
            huge_pages: back large arenas and indexes with transparent huge pages.
            dtype: how row values are stored: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``
                (2 bytes per value; ``torch.bfloat16``/``torch.float16``/``np.float16`` too).
                Lookups return float32 (the stored, rounded values); gradients are applied
                in float32 and the result rounded to the dtype (to nearest, ties to even);
                optimizer state stays float32.

            priority: a :class:`~embstore.Priority`: the table scores its writes, and while a
                follower's link is congested the significant ones travel ahead of the rest
                (docs/dissemination.md). Not part of the spec: it is set on the running table
                (:meth:`Table.set_priority`), not saved with it.

        Raises:
            TableExistsError: the name is taken.
            InvalidArgumentError: a parameter is out of range.
        """
        if priority is not None and not isinstance(priority, Priority):
            raise InvalidArgumentError(
                f"priority must be an embstore.Priority or None, got {priority!r}"
            )
        given = {
            "optimizer": optimizer,
            "initializer": initializer,
            "num_shards": num_shards,
            "seed": seed,
            "admission_min_count": admission_min_count,
            "admission_sketch_width": admission_sketch_width,
            "ttl": ttl,
            "on_non_finite": on_non_finite,
            "huge_pages": huge_pages,
            "dtype": dtype,
        }
        spec = spec_of(
            name,
            embedding_dim,
            **{k: v for k, v in given.items() if v is not _CREATE_TABLE_DEFAULTS[k]},
        )
        native = self._inner.create_table(to_native_spec(spec))
        if priority is not None:
            priority.apply_to(native)
        return Table(native, self._per_process)

    def table(self, name: str) -> Table:
        """The table called ``name``; :class:`TableNotFoundError` if there is none."""
        return Table(self._inner.table(str(name)), self._per_process)

    # What a session asks of the store it trains, alike for this store and a
    # DistributedStore (which wraps one): this process's place among those sharing the tables.

    @property
    def local(self) -> Store:
        """The rows this process holds: the store itself (a
        :class:`~embstore.DistributedStore`'s is the store of its partition)."""
        return self

    @property
    def rank(self) -> int:
        """0: the store is this process's alone (a :class:`~embstore.DistributedStore` says
        its process's rank)."""
        return 0

    @property
    def world_size(self) -> int:
        """1: the store is this process's alone."""
        return 1

    @property
    def distributed(self) -> bool:
        """False: its tables are this process's (True for a
        :class:`~embstore.DistributedStore`)."""
        return False

    @property
    def comm(self) -> Comm:
        """A group of one process (:class:`~embstore.distributed.Comm`): a session's
        collectives over it are local calls."""
        return Comm.single()

    def ps(
        self,
        tables: list[str] | tuple[str, ...],
        workers: int,
        consistency: Any = None,
        **options: Any,
    ) -> Any:
        """A parameter server over ``tables`` for ``workers`` workers (threads of this
        process) that learns its workload: :class:`embstore.ps.ParameterServer`.

        The tables must add their updates (``optimizer=embstore.Delta()``). ``consistency``:
        :class:`embstore.BSP` (the default) or :class:`embstore.SSP`. Options:
        ``specialise`` (``"all"``, the default; ``"no-opt"``; one of ``"static"``,
        ``"prefetch"``, ``"thread-caches"``, ``"placement"`` alone, or ``"all-but-<one>"``),
        ``early_ratio`` (0.1), ``cpb`` (0.05), ``thread_cache_rows`` (every row a worker
        updates), ``replan`` (``"warn"``, ``"auto"`` or ``"off"``).
        """
        from embstore.ps import ParameterServer

        return ParameterServer(self, list(tables), workers, consistency, **options)

    def session(
        self,
        tables: list[str | Table] | tuple[str | Table, ...] | None = None,
        *,
        prefetch: int | None = None,
        grad_average: bool = True,
        on_miss: str = "init",
        device: Any = None,
        staleness: int = 0,
        features: Any = None,
    ) -> Session:
        """A training session over ``tables``: the five-stage pipeline of the hierarchical
        parameter server (read and partition; prepare: rows brought into memory and pinned at
        their owners; train; write-back to the owners).

        Args:
            tables: the names (or tables) a batch reads.
            prefetch: batches read and prepared ahead of training, by a background thread.
                ``None`` (the default) chooses from the memory budget: as many batches as
                the rows pinned for them hold in a quarter of it (up to 32; 2 without a
                budget), their cold rows read a group at a time, in one pass over the disk;
                ``stats()["lookahead"]`` says how far it looks. An int fixes it (0: every
                stage in your loop's thread, in order). Results are the same, to the bit,
                for every value: rows are read after the batch before is applied.
            grad_average: divide the gradients by the process count before they are summed
                at the owners: the average over processes, as DDP does for the dense model,
                so a loss that is a mean over each process's batch trains as one process
                over the global batch. ``False`` sums them.
            on_miss: what a lookup of a new id does (``"init"``: create its row, training).
            device: a torch device for the batches' rows (``"cuda"``): the working set is
                copied there at the gather and the gradients back at the write-back.
            staleness: 0 (the default): a batch's rows are read after the batch before it
                is applied, exactly as without a pipeline. 1: they are read while the batch
                before trains (after the one before that is applied), so the gather leaves
                your loop; each batch then misses the previous batch's updates to its rows,
                the same way on every run and process count.
            features: lets ``ids(batch)`` return a ``KeyedJaggedTensor`` (TorchRec's or
                :class:`embstore.torch.KeyedJaggedTensor`): an
                :class:`~embstore.torch.EmbeddingBagCollection` (or its list of configs), or
                a mapping of feature name to table name (sum pooling). Each table's features'
                ids are looked up together; ``batch.pooled()`` pools them as the module does,
                bit for bit. ``tables`` may then be left out: the features' tables.

        Example::

            >>> import embstore, numpy as np, tempfile, torch
            >>> store = embstore.Store(tempfile.mkdtemp(), memory_budget_bytes=1 << 20)
            >>> _ = store.create_table("item", embedding_dim=4, optimizer=embstore.SGD(lr=0.1))
            >>> sess = store.session(["item"])
            >>> batches = [np.array([1, 2, 2]), np.array([2, 3, 4])]
            >>> for b in sess.run(batches, ids=lambda b: {"item": b}):
            ...     loss = b.embeddings("item").sum()
            ...     loss.backward()
            ...     b.push_grads()
            >>> sess.stats()["batches"]
            2
        """
        return Session(
            self,
            tables,
            prefetch=prefetch,
            grad_average=grad_average,
            on_miss=on_miss,
            device=device,
            staleness=staleness,
            features=features,
        )

    def __getitem__(self, name: str) -> Table:
        return self.table(name)

    def __contains__(self, name: object) -> bool:
        return name in self._inner.tables()

    def tables(self) -> list[str]:
        """Names of all tables, sorted."""
        return self._inner.tables()

    def drop_table(self, name: str) -> None:
        """Remove the table called ``name`` (its memory is freed when no object holds it)."""
        self._inner.drop_table(str(name))

    def load_table(self, path: str | os.PathLike[str], name: str | None = None) -> Table:
        """Create a table from a file written by :meth:`Table.save`, named as saved or
        ``name``."""
        return Table(self._inner.load_table(os.fspath(path), name), self._per_process)


# The defaults of create_table's keyword arguments: a field left at its default is not given
# (read from the signature, so the two cannot drift apart).
_CREATE_TABLE_DEFAULTS = {
    p.name: p.default for p in list(_signature(Store.create_table).parameters.values())[3:]
}


def _progress(
    progress: bool | Callable[[int, int], None], what: str, unit: str = "segments"
) -> Any:
    """The native progress callback for ``progress``: None, a printer of ``what: done/total
    unit`` on stderr, or the callable itself."""
    if callable(progress):
        return progress
    if not progress:
        return None

    if sys.stderr.isatty():

        def show(done: int, total: int) -> None:
            end = "\n" if done == total else ""
            print(f"\r{what}: {done}/{total} {unit}", end=end, file=sys.stderr, flush=True)

        return show
    # A log or a pipe: whole lines, one per tenth of the work (and the last), never a `\r`.
    shown = [-1]

    def log(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth != shown[0] or done == total:
            shown[0] = tenth
            print(f"{what}: {done}/{total} {unit}", file=sys.stderr, flush=True)

    return log


def inspect(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe the store or checkpoint in ``path`` from its manifest, without opening it
    (works while another process has it open): formats, checkpoint identity, and per table
    its dim, optimizer, step, live ``rows`` (as of the table's last flush), ``memory_bytes``
    (those rows with every row in memory), segments, records and bytes on disk."""
    return _native.inspect_dir(os.fspath(path), False, None)


def verify(
    path: str | os.PathLike[str], *, progress: bool | Callable[[int, int], None] = False
) -> dict[str, Any]:
    """:func:`inspect`, then read every record of every segment, checking each checksum;
    ``damage`` lists what failed (empty: the store is intact): a damaged segment, a manifest
    that fails its checks, or one that cannot account for the segments on disk (the store
    would refuse to open). ``orphan_segments`` lists the files no record names that the
    manifest proves superseded (unadopted spills of evictions included: safe to remove while
    no process has the store open; the next open deletes them), ``unaccounted_segments``
    those it cannot (the store is not opened while they are there; move them aside, and the
    store opens at its manifest's state without their rows). Each table gains its live
    ``rows`` and the ``memory_bytes`` they take once opened (``None`` for a table with a
    damaged segment: its rows cannot be counted). Safe on a store another process has open:
    when a flush or compaction replaces a segment during the walk, the walk starts over on the
    new manifest (``restarts`` counts how often), so the report is of one consistent state."""
    return _native.inspect_dir(os.fspath(path), True, _progress(progress, "verify"))


__all__ = ["Checkpoint", "ExportChunk", "Store", "Table", "inspect", "verify"]
