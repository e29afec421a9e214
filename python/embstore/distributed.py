"""A store spread over the processes of a training job (``Store(path, distributed=True)``).

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
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import os
import pathlib
import pickle
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from embstore.checkpoints import Checkpoint
from embstore.errors import (
    DistributedError,
    EmbstoreError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedFormatError,
)

__all__ = ["Comm", "init_distributed", "latest_checkpoint", "owner_of", "training_state"]

#: The file that makes a directory a distributed store (or a complete checkpoint of one).
MANIFEST = "embstore-distributed.json"
#: Process 0's pickled ``state`` argument of a checkpoint (epoch, step, the dense model...).
STATE_FILE = "training-state.pkl"
#: Written first into a checkpoint directory, before any partition: a directory holding it and
#: no :data:`MANIFEST` is a checkpoint whose writing was interrupted (replaced when the job
#: writes that checkpoint again). Removed once the manifest is written.
BEGUN = "embstore-checkpoint-begun.json"
_FORMAT = 1
DEFAULT_TIMEOUT_S = 300.0
#: A collective still waiting after this many seconds says where it is (in the job's
#: rendezvous store) and compares with where the others wait: processes in different calls
#: are out of step, and every one of them raises, naming both calls.
_CHECK_S = 1.0
#: A collective still waiting after this many seconds warns, once, naming the processes it
#: waits for and where they were last seen.
_WARN_S = 15.0
# The user-level call in progress on each thread (``lookup('item')``), see calling().
_CALL = threading.local()

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def owner_of(ids: np.ndarray, world: int) -> np.ndarray:
    """The process (``0..world-1``) that owns each id (``uint64[B]``): SplitMix64's finaliser
    spreads structured ids (sequential, strided, all even), then the top 32 bits are scaled onto
    ``world`` (no modulo bias). Fixed forever: checkpoints depend on it. Its Rust twin is
    ``embstore_common::owner_of``; one table of values pins both."""
    if world == 1:
        return np.zeros(len(ids), np.int64)
    with np.errstate(over="ignore"):
        z = ids + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z ^= z >> np.uint64(31)
        return (((z >> np.uint64(32)) * np.uint64(world)) >> np.uint64(32)).astype(np.int64)


def part_dir(path: pathlib.Path, rank: int) -> pathlib.Path:
    return path / f"rank-{rank:05d}"


def timeout_s() -> float:
    raw = os.environ.get("EMBSTORE_DIST_TIMEOUT_S")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"EMBSTORE_DIST_TIMEOUT_S must be seconds, got {raw!r}"
        ) from None
    if not value > 0:
        raise InvalidArgumentError(f"EMBSTORE_DIST_TIMEOUT_S must be > 0, got {raw!r}")
    return value


def torch_world_size() -> int:
    """Processes of the ``torch.distributed`` job this process is in: the initialised default
    group's size, else ``WORLD_SIZE`` as ``torchrun`` sets it (1 outside a job)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except ImportError:
        pass
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_not_process_local(table: Any, what: str) -> None:
    """Refuse to train ``table`` (``what``: the step, for the message) when it belongs to this
    process alone but the process is one of several of a ``torch.distributed`` job: each
    process would silently train its own copy of the table (DDP averages the dense model, not
    the rows). A distributed store's tables, and a store opened with ``per_process=True``,
    pass."""
    if getattr(table, "per_process", False) or getattr(table, "distributed", False):
        return
    world = torch_world_size()
    if world <= 1:
        return
    raise DistributedError(
        f"{what} of table '{table.name}': this process is one of {world} of a "
        "torch.distributed job, but the table belongs to a store of this process alone, so "
        "each process would train its own copy of it and no process would see the rows the "
        "others trained. Open the store on every process as "
        "embstore.Store(path, distributed=True): each process then holds a share of every "
        'table and every process trains the same rows (docs/training.md, "Many '
        'processes"). To train one table per process on purpose, open it with '
        "embstore.Store(..., per_process=True)"
    )


@contextlib.contextmanager
def calling(label: str) -> Iterator[None]:
    """Name the call in progress on this thread (``lookup('item')``, ``checkpoint()``) for the
    collectives it makes: a process out of step with the others is told which call each is
    in. The outermost name holds."""
    outer = getattr(_CALL, "label", None)
    if outer is None:
        _CALL.label = label
    try:
        yield
    finally:
        if outer is None:
            _CALL.label = None


class _Exit:
    """Tears down, at interpreter exit, the process groups embstore made (and the default
    group when embstore initialised it), while the interpreter is still whole. Left to the
    interpreter's finalisation, gloo's worker threads may still hold a finished collective's
    tensors and the process aborts after its work is done ("terminate called without an
    active exception", SIGABRT: exit status -6 under torchrun). Nothing is torn down when a
    collective is still running or one failed: the process is leaving because of an error,
    and a teardown could wait for a peer that will never answer."""

    lock = threading.Lock()
    in_flight = 0
    failed = False
    own_default = False
    groups: ClassVar[list[Any]] = []
    registered = False

    @classmethod
    def track(cls, groups: Sequence[Any] = (), own_default: bool = False) -> None:
        with cls.lock:
            cls.groups.extend(groups)
            cls.own_default = cls.own_default or own_default
            if not cls.registered:
                atexit.register(cls.teardown)
                cls.registered = True

    @classmethod
    @contextlib.contextmanager
    def collective(cls) -> Iterator[None]:
        with cls.lock:
            cls.in_flight += 1
        ok = False
        try:
            yield
            ok = True
        finally:
            with cls.lock:
                cls.in_flight -= 1
                cls.failed = cls.failed or not ok

    @classmethod
    def teardown(cls) -> None:
        import torch.distributed as dist

        with cls.lock:
            if cls.in_flight or cls.failed or not dist.is_initialized():
                return
            groups, cls.groups = cls.groups, []
            own_default = cls.own_default
        try:
            if own_default:
                dist.destroy_process_group()
            else:
                for g in groups:
                    dist.destroy_process_group(g)
        except Exception:  # at exit: nothing left to tell, and nothing to lose
            pass


def init_distributed(backend: str = "gloo") -> None:
    """``torch.distributed.init_process_group(backend)`` from the launcher's environment,
    safe across ``torchrun`` restarts: the rendezvous keys are kept apart per restart
    (``TORCHELASTIC_RESTART_COUNT``), so a restarted job never reads the address of a process
    of the attempt before (which ``init_process_group`` alone can, under ``--max-restarts``:
    "Gloo connectFullMesh failed ... Connection refused"). A no-op when already initialised.
    ``Store(distributed=True)`` calls it (gloo) when nothing else did."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise InvalidArgumentError(
            "a distributed store needs a launcher's environment (torchrun sets RANK, "
            f"WORLD_SIZE, MASTER_ADDR, MASTER_PORT); {', '.join(missing)} not set. Run under "
            "torchrun, call torch.distributed.init_process_group() first, or leave "
            "distributed off for one process"
        )
    timeout = _dt.timedelta(seconds=timeout_s())
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"embstore/attempt-{attempt}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    _Exit.track(own_default=True)


class Comm:
    """This process's place in the job (``rank`` of ``world``) and the process groups embstore
    exchanges rows on: ``main`` for the training thread, ``prep`` for the pipeline's prepare
    stage (two threads may run collectives at once, each on its own group).

    Made from the environment ``torchrun`` sets; initialises ``torch.distributed`` (gloo) when
    the caller has not (a caller that wants NCCL for its DDP calls ``init_process_group`` first:
    embstore's groups are gloo either way, its rows are in host memory).
    """

    def __init__(self, rank: int, world: int, groups: tuple[Any, Any] | None) -> None:
        self.rank, self.world = rank, world
        self.main, self.prep = groups if groups is not None else (None, None)
        self.bytes_sent = 0
        self.bytes_received = 0
        # Collectives made on each group ("main", "prep"): in step, every process is at the
        # same count on a group when it enters a collective there.
        self._seq = {"main": 0, "prep": 0}

    @classmethod
    def from_env(cls) -> Comm:
        import torch.distributed as dist

        timeout = _dt.timedelta(seconds=timeout_s())
        if not dist.is_available():
            raise InvalidArgumentError("distributed=True needs torch.distributed (not built)")
        init_distributed()
        rank, world = dist.get_rank(), dist.get_world_size()
        if world == 1:
            return cls(0, 1, None)
        groups = (
            dist.new_group(backend="gloo", timeout=timeout),
            dist.new_group(backend="gloo", timeout=timeout),
        )
        _Exit.track(groups)
        return cls(rank, world, groups)

    @classmethod
    def single(cls) -> Comm:
        return cls(0, 1, None)

    # -- agreement ------------------------------------------------------------------------

    def agree(self, what: str, error: BaseException | None, group: Any = None) -> None:
        """Every process says whether ``what`` failed on it; if any did, every process raises:
        the failed ones their own error, the others a :class:`DistributedError` naming the
        first failed process and its error."""
        if self.world == 1:
            if error is not None:
                raise error
            return
        import torch
        import torch.distributed as dist

        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
        self._collective(
            what, lambda: dist.all_reduce(flag, group=group or self.main, async_op=True), group
        )
        if flag.item():
            self.fail(what, error, group)

    def agreed(self, what: str, call: Callable[[], Any], group: Any = None) -> Any:
        """``call()`` on this process, then :meth:`agree` on whether it failed: its result,
        or the error raised on every process."""
        result, error = None, None
        try:
            result = call()
        except BaseException as e:  # shared with every process by agree()
            error = e
        self.agree(what, error, group)
        return result

    def fail(self, what: str, error: BaseException | None, group: Any = None) -> None:
        """Some process failed ``what`` (every process knows it): share the messages, raise."""
        note = None if error is None else f"{type(error).__name__}: {error}"
        notes = self._gather_objects(note, what, group)
        if error is not None:
            error.add_note(f"(on process {self.rank} of {self.world}, during {what})")
            raise error
        first = next(r for r, n in enumerate(notes) if n is not None)
        others = sum(n is not None for n in notes) - 1
        also = f" (and {others} other process{'es' if others > 1 else ''})" if others else ""
        raise DistributedError(f"{what} failed on process {first}{also}: {notes[first]}")

    def _collective(self, what: str, call: Callable[[], Any], group: Any = None) -> None:
        """Run ``call()``, which starts a collective on ``group`` (None: main) with
        ``async_op=True``, and wait for it (see :meth:`_wait`)."""
        key = "prep" if group is not None and group is self.prep else "main"
        self._seq[key] += 1
        try:
            with _Exit.collective():
                self._wait(call(), what, key, self._seq[key])
        except EmbstoreError:
            raise
        except RuntimeError as e:  # gloo: a peer closed its connection, or the timeout passed
            # A peer that found the processes out of step raised and left: say so here too.
            out_of_step = self._out_of_step(key, self._seq[key], _where(what))
            if out_of_step is not None:
                raise out_of_step from e
            raise DistributedError(
                f"{what}: process {self.rank} of {self.world} lost its peers ({e}); another "
                "process has probably died (its own output says why), or is not making this "
                f"call{self._last_seen(key)}"
            ) from e

    def _wait(self, work: Any, what: str, key: str, seq: int) -> None:
        """Wait for ``work``, the ``seq``-th collective on group ``key``. Past
        :data:`_CHECK_S` this process says where it waits (the job's rendezvous store) and
        compares: a process waiting in another call at the same count is out of step, and
        each process raises, naming both calls, within seconds rather than at the timeout."""
        poll = _dt.timedelta(seconds=_CHECK_S)
        began = time.monotonic()
        here = _where(what)
        published = warned = False
        while True:
            try:
                work.wait(timeout=poll)
                return
            except RuntimeError:
                if work.is_completed():  # the collective itself failed
                    raise
            store = _rendezvous_store()
            if store is None:
                work.wait()
                return
            if not published:
                store.set(_call_key(key, self.rank), json.dumps([seq, here]))
                published = True
            peers = _peers_where(store, key, self.world, self.rank)
            out_of_step = self._out_of_step(key, seq, here, peers)
            if out_of_step is not None:
                raise out_of_step
            waited = time.monotonic() - began
            if waited > _WARN_S and not warned:
                warned = True
                late = [
                    p for p in range(self.world) if p != self.rank and peers.get(p, (0,))[0] != seq
                ]
                warnings.warn(
                    f"embstore: process {self.rank} has waited {waited:.0f} s in {here} for "
                    f"process(es) {late}{self._last_seen(key, peers)}; a process that does "
                    "not make this call (evaluation on one process?) leaves the others "
                    "waiting until the timeout (EMBSTORE_DIST_TIMEOUT_S)",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _out_of_step(
        self, key: str, seq: int, here: str, peers: dict[int, tuple[int, str]] | None = None
    ) -> DistributedError | None:
        """The error to raise when another process said it waits in another call at the same
        collective count on group ``key``, else None."""
        if peers is None:
            try:
                store = _rendezvous_store()
                peers = {} if store is None else _peers_where(store, key, self.world, self.rank)
            except Exception:  # the store went with the job: nothing to compare
                return None
        for peer, (their_seq, there) in sorted(peers.items()):
            if their_seq == seq and there != here:
                return DistributedError(
                    f"the processes are out of step: process {self.rank} is in {here} and "
                    f"process {peer} in {there}, both at embstore's collective call {seq} "
                    f"(on its {key} group). Every process must make embstore's collective "
                    "calls (lookups and gradients of a distributed table, a session's "
                    "batches, checkpoint(), flush(), create_table(), len()) in the same "
                    "order. To evaluate on one process alone, restore a checkpoint there "
                    "(embstore.Store.restore(checkpoint, path) in one process merges every "
                    'partition; docs/training.md, "Evaluating on one process")'
                )
        return None

    def _last_seen(self, key: str, peers: dict[int, tuple[int, str]] | None = None) -> str:
        """`` (process 1 last waited in X at call 12, ...)`` from the rendezvous store."""
        if peers is None:
            try:
                store = _rendezvous_store()
                peers = {} if store is None else _peers_where(store, key, self.world, self.rank)
            except Exception:
                peers = {}
        # The other group too: a process waiting on one group (a session's prepare stage)
        # while another waits on the other (checkpoint()) never meets it at a call count.
        other = "main" if key == "prep" else "prep"
        try:
            store = _rendezvous_store()
            elsewhere = {} if store is None else _peers_where(store, other, self.world, self.rank)
        except Exception:
            elsewhere = {}
        if not peers and not elsewhere:
            return ""
        seen = ", ".join(
            [f"process {p} last waited in {w} at call {s}" for p, (s, w) in peers.items()]
            + [
                f"process {p} last waited in {w} at call {s} of its {other} group"
                for p, (s, w) in elsewhere.items()
            ]
        )
        return f" ({seen}; this process is at call {self._seq[key]} of its {key} group)"

    def _gather_objects(self, obj: Any, what: str, group: Any = None) -> list[Any]:
        """Every process's ``obj`` (pickled), in rank order: ``all_gather_object`` made of
        two all_gathers this class can wait for."""
        import torch
        import torch.distributed as dist

        data = pickle.dumps(obj)
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        g = group or self.main
        self._collective(what, lambda: dist.all_gather(sizes, size, group=g, async_op=True), g)
        longest = int(max(int(x.item()) for x in sizes))
        buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        self._collective(what, lambda: dist.all_gather(bufs, buf, group=g, async_op=True), g)
        return [
            pickle.loads(b[: int(n.item())].numpy().tobytes())
            for b, n in zip(bufs, sizes, strict=True)
        ]

    # -- exchanges ------------------------------------------------------------------------

    def exchange_counts(
        self, counts: np.ndarray, error: BaseException | None, what: str, group: Any
    ) -> np.ndarray:
        """``counts``: ``int64[world, k]``, row ``j`` for process ``j``; returns what every
        process sent this one (``int64[world, k]``, row ``i`` from process ``i``). Carries the
        error flags: raises on every process if one failed."""
        import torch
        import torch.distributed as dist

        k = counts.shape[1]
        send = np.zeros((self.world, k + 1), np.int64)
        send[:, :k] = counts
        send[:, k] = 0 if error is None else 1
        recv = np.empty_like(send)
        self._collective(
            what,
            lambda: dist.all_to_all_single(
                torch.from_numpy(recv), torch.from_numpy(send), group=group, async_op=True
            ),
            group,
        )
        if recv[:, k].any():
            self.fail(what, error, group)
        return recv[:, :k]

    def exchange(
        self,
        send: np.ndarray,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        what: str,
        group: Any,
    ) -> np.ndarray:
        """``all_to_all`` of a 1-D buffer (``int64`` or ``float32``) cut into per-process
        pieces."""
        import torch
        import torch.distributed as dist

        recv = np.empty(int(sum(recv_splits)), send.dtype)
        self._collective(
            what,
            lambda: dist.all_to_all_single(
                torch.from_numpy(recv),
                torch.from_numpy(send),
                [int(x) for x in recv_splits],
                [int(x) for x in send_splits],
                group=group,
                async_op=True,
            ),
            group,
        )
        self.bytes_sent += send.nbytes - int(send_splits[self.rank]) * send.itemsize
        self.bytes_received += recv.nbytes - int(recv_splits[self.rank]) * recv.itemsize
        return recv

    def all_gather(self, obj: Any, what: str) -> list[Any]:
        if self.world == 1:
            return [obj]
        return self._gather_objects(obj, what)

    def barrier(self, what: str) -> None:
        self.agree(what, None)


def _where(what: str) -> str:
    """This thread's call and the step of it a collective is for: ``lookup('item')
    (preparing a batch)``."""
    label = getattr(_CALL, "label", None)
    return what if label is None or label == what else f"{label} ({what})"


def _rendezvous_store() -> Any:
    """The job's rendezvous key-value store (torch.distributed's default store), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # not initialised, or a torch without it: no out-of-step check
        return None


def _call_key(key: str, rank: int) -> str:
    return f"embstore/waiting/{key}/{rank}"


def _peers_where(store: Any, key: str, world: int, rank: int) -> dict[int, tuple[int, str]]:
    """Where each other process last said it waited, on group ``key``: ``{rank: (call,
    where)}`` (processes that never waited long are missing)."""
    out: dict[int, tuple[int, str]] = {}
    for peer in range(world):
        k = _call_key(key, peer)
        if peer == rank or not store.check([k]):
            continue
        seq, where = json.loads(store.get(k))
        out[peer] = (int(seq), str(where))
    return out


# -- sessions -----------------------------------------------------------------------------------

#: What a session must be opened with alike on every process (in the order an error checks).
SESSION_FIELDS = ("tables", "grad_average", "staleness", "on_miss")


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


# -- the store's directory and checkpoints ------------------------------------------------------


def read_manifest(path: pathlib.Path) -> dict[str, Any] | None:
    file = path / MANIFEST
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise UnsupportedFormatError(f"{file} is not a distributed store's manifest: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("world_size"), int):
        raise UnsupportedFormatError(f"{file} is not a distributed store's manifest")
    if manifest.get("format", 0) > _FORMAT:
        raise UnsupportedFormatError(
            f"{file} was written by a newer embstore (format {manifest['format']})"
        )
    return manifest


def write_manifest(path: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Atomically: a temporary file, fsync, rename, fsync of the directory."""
    tmp = path / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": _FORMAT, **manifest}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_part(comm: Comm, path: pathlib.Path) -> pathlib.Path:
    """Check (or create) the manifest of a distributed store at ``path`` for this job's process
    count, on every process alike; return this process's partition directory."""
    what = f"opening the distributed store {path}"

    def create() -> None:
        if comm.rank != 0:
            return
        path.mkdir(parents=True, exist_ok=True)
        if read_manifest(path) is None:
            if any((path / n).exists() for n in ("MANIFEST", "LOCK", "seg")):
                raise InvalidArgumentError(
                    f"{path} holds a store that is not a distributed one (or lost its "
                    f"{MANIFEST}); give a new directory"
                )
            write_manifest(path, {"world_size": comm.world})

    def check() -> None:
        manifest = read_manifest(path)
        if manifest is None:
            raise NotFoundError(f"{path / MANIFEST} is missing (not a shared directory?)")
        if manifest["world_size"] != comm.world:
            raise InvalidArgumentError(
                f"the distributed store at {path} was written by {manifest['world_size']} "
                f"processes and this job has {comm.world}: each process owns a hash partition "
                "of the rows, so a store opens only with the process count that wrote it. "
                "Checkpoint it and Store.restore(checkpoint, new_path, distributed=True) "
                "with the new count"
            )

    comm.agreed(what, create)
    comm.agreed(what, check)
    return part_dir(path, comm.rank)


def latest_checkpoint(directory: str | os.PathLike[str]) -> pathlib.Path | None:
    """The newest *complete* checkpoint of a distributed store under ``directory`` (the one
    with the highest ``step`` in its manifest, then the newest), or ``None``. A checkpoint whose
    writing was interrupted has no manifest and is skipped (and kept)."""
    root = pathlib.Path(directory)
    if not root.is_dir():
        return None
    best: tuple[int, float, pathlib.Path] | None = None
    for child in root.iterdir():
        try:
            manifest = read_manifest(child) if child.is_dir() else None
        except UnsupportedFormatError:
            continue
        if manifest is None or "checkpoint" not in manifest:
            continue
        key = (int(manifest["checkpoint"].get("step", -1)), (child / MANIFEST).stat().st_mtime)
        if best is None or key > best[:2]:
            best = (*key, child)
    return None if best is None else best[2]


def training_state(checkpoint: str | os.PathLike[str]) -> Any:
    """The ``state`` a distributed checkpoint was written with (``None`` if none)."""
    path = pathlib.Path(checkpoint)
    manifest = read_manifest(path)
    if manifest is None or "checkpoint" not in manifest:
        raise NotFoundError(f"{path} is not a complete distributed checkpoint (no {MANIFEST})")
    if not manifest["checkpoint"].get("has_state"):
        return None
    with open(path / STATE_FILE, "rb") as f:
        return pickle.load(f)  # a file this job wrote


def checkpoint(
    comm: Comm,
    path: pathlib.Path,
    step: int | None,
    state: Any,
    *,
    write_part: Callable[[pathlib.Path], Checkpoint],
    specs: Callable[[], dict[str, Any]],
) -> Any:
    """Every process writes its partition into ``path/rank-<r>`` (``write_part``: the store's
    checkpoint of its own rows into that directory), process 0 its ``state``, then process 0
    writes the manifest (``specs``: the tables' configs; complete only once every partition
    is)."""

    what = f"checkpoint {path}"

    def make_dir() -> None:
        if comm.rank == 0:
            prepare_checkpoint_dir(path, comm.world, step)

    def write_mine() -> Any:
        result = write_part(part_dir(path, comm.rank))
        if comm.rank == 0 and state is not None:
            with open(path / STATE_FILE, "wb") as f:
                pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
        return result

    comm.agreed(what, make_dir)
    result = comm.agreed(what, write_mine)
    parts = comm.all_gather(
        {k: v for k, v in vars(result).items() if isinstance(v, int | str | float)}, what
    )

    def complete() -> None:
        if comm.rank == 0:
            write_manifest(
                path,
                {
                    "world_size": comm.world,
                    "checkpoint": {
                        "step": -1 if step is None else int(step),
                        "has_state": state is not None,
                        "tables": specs(),
                        "parts": parts,
                    },
                },
            )
            # Complete: the marker has done its work (a crash before this leaves both, and
            # the manifest is what counts).
            (path / BEGUN).unlink(missing_ok=True)

    comm.agreed(what, complete)
    return Checkpoint(
        path=path,
        id=0,
        parent_id=0,
        tables=int(parts[0].get("tables", 0)),
        segments=sum(int(p.get("segments", 0)) for p in parts),
        bytes=sum(int(p.get("bytes", 0)) for p in parts),
    )


def prepare_checkpoint_dir(path: pathlib.Path, world: int, step: int | None) -> None:
    """Process 0, at the start of a distributed checkpoint: make ``path`` ready and write the
    :data:`BEGUN` marker into it before anything else. A new or empty directory is used as
    is; one that holds the marker and no manifest is a checkpoint of this store whose writing
    was interrupted (a process died during it) and is emptied first, so that a job restarted
    from an earlier checkpoint writes it again when it reaches that step. Anything else is
    refused, saying what the directory holds: a complete checkpoint, a checkpoint interrupted
    before markers were written (no manifest: it may be deleted), or other files."""
    path.mkdir(parents=True, exist_ok=True)
    entries = sorted(p.name for p in path.iterdir())
    if entries:
        manifest = None
        try:
            manifest = read_manifest(path)
        except UnsupportedFormatError:
            pass
        if manifest is not None and "checkpoint" in manifest:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds a complete checkpoint (step "
                f"{manifest['checkpoint'].get('step')}); give a new directory (a checkpoint is "
                "never overwritten)"
            )
        if MANIFEST in entries:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds a distributed store or a "
                f"checkpoint ({MANIFEST}); give a new directory"
            )
        if BEGUN in entries:
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif any(n.startswith("rank-") or n == STATE_FILE for n in entries):
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds an interrupted "
                f"checkpoint ({', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''} "
                f"and no {MANIFEST}, so it is incomplete and nothing restores from it) left "
                "by an embstore that did not mark checkpoints it began; it may be deleted. "
                "Delete it, or give another directory"
            )
        else:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty and holds no checkpoint "
                f"({', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''}); give a new "
                "or empty directory"
            )
    marker = path / BEGUN
    with open(marker, "w") as f:
        json.dump({"world_size": world, "step": -1 if step is None else int(step)}, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_part(
    comm: Comm,
    checkpoint: pathlib.Path,
    path: pathlib.Path,
    restore_one: Callable[[pathlib.Path, pathlib.Path], Any],
    create: Callable[[pathlib.Path], Any],
) -> None:
    """Make this process's partition of a store at ``path`` from a distributed ``checkpoint``:
    its own partition when the process count is unchanged, else the rows it owns out of every
    partition. ``restore_one(src, dst)`` restores a one-process checkpoint into a new store and
    returns it (opened); ``create(dst)`` opens an empty one."""
    what = f"restoring {checkpoint}"

    def prepare() -> dict[str, Any]:
        manifest = read_manifest(checkpoint)
        if manifest is None or "checkpoint" not in manifest:
            raise NotFoundError(
                f"{checkpoint} is not a complete distributed checkpoint (no {MANIFEST}: its "
                "writing may have been interrupted)"
            )
        if comm.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            if any(path.iterdir()):
                raise InvalidArgumentError(f"restore target {path} is not empty")
            write_manifest(path, {"world_size": comm.world})
        return manifest

    manifest = comm.agreed(what, prepare)
    old_world = manifest["world_size"]
    target = part_dir(path, comm.rank)

    def restore() -> None:
        if old_world == comm.world:
            restore_one(part_dir(checkpoint, comm.rank), target).close()
        else:
            repartition(comm, checkpoint, old_world, target, manifest, restore_one, create)

    comm.agreed(what, restore)


def repartition(
    comm: Comm,
    checkpoint: pathlib.Path,
    old_world: int,
    target: pathlib.Path,
    manifest: dict[str, Any],
    restore_one: Callable[[pathlib.Path, pathlib.Path], Any],
    create: Callable[[pathlib.Path], Any],
) -> None:
    from embstore.config import from_native_spec

    store = create(target)
    try:
        specs = manifest["checkpoint"]["tables"]
        tables = {name: store.create_table(from_native_spec(spec)) for name, spec in specs.items()}
        steps: dict[str, int] = {}
        scratch = pathlib.Path(tempfile.mkdtemp(prefix=".repartition-", dir=target.parent))
        try:
            for p in range(old_world):
                src = restore_one(part_dir(checkpoint, p), scratch / f"part-{p}")
                try:
                    for name, table in tables.items():
                        old = src.table(name)
                        steps[name] = max(steps.get(name, 0), old.step)
                        for chunk in old.export(chunk_rows=1 << 16):
                            mine = owner_of(chunk.ids.view(np.uint64), comm.world) == comm.rank
                            if mine.any():
                                table.import_(
                                    *(f[mine] for f in chunk[:7]), optimizer=chunk.optimizer
                                )
                finally:
                    src.close()
                shutil.rmtree(scratch / f"part-{p}")  # a copy of the checkpoint's partition
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for name, table in tables.items():
            table.step = steps.get(name, 0)
        store.flush()
    finally:
        store.close()
