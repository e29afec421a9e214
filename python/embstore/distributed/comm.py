"""The processes of a distributed store and the collectives between them: :class:`Comm`
(this process's place in the job, its process groups, exchanges that carry every process's
error flag and say which process is out of step), :func:`init_distributed`, and the
refusal to train a table of one process inside a multi-process job."""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime as _dt
import json
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from embstore.errors import DistributedError, EmbstoreError, InvalidArgumentError

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
        "embstore.DistributedStore(path): each process then holds a share of every "
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
    and a teardown could wait for a peer that will never answer.

    The tensors of the last collectives are kept here (:meth:`keep`): a gloo worker thread
    drops its reference to a finished collective's tensors right after running it, and if
    that is the last one (the caller's temporaries already gone), the drop needs the GIL —
    which a thread asking for it while the interpreter finalises never gets: it is ended, and
    the process aborts the same way (seen when a collective finished just before exit). Kept
    here, the last reference is this class's, dropped on the main thread: at teardown, or when
    newer collectives push it out. Only the last 4 are kept (at most two run at once, on the
    main and the prepare groups; an older one's worker let go of it long before), since they
    hold a batch's exchange buffers alive."""

    lock = threading.Lock()
    in_flight = 0
    failed = False
    own_default = False
    groups: ClassVar[list[Any]] = []
    registered = False
    kept: ClassVar[collections.deque[Any]] = collections.deque(maxlen=4)
    #: How long teardown lets the workers finish with the last collectives before it drops
    #: their tensors (a worker needs only to be scheduled, not the GIL).
    settle_s = 0.05

    @classmethod
    def track(cls, groups: Sequence[Any] = (), own_default: bool = False) -> None:
        with cls.lock:
            cls.groups.extend(groups)
            cls.own_default = cls.own_default or own_default
            if not cls.registered:
                atexit.register(cls.teardown)
                cls.registered = True

    @classmethod
    def keep(cls, tensors: Any) -> None:
        """Holds ``tensors`` (a collective's) until a later collective or the teardown."""
        with cls.lock:
            cls.kept.append(tensors)

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
        time.sleep(cls.settle_s)
        with cls.lock:
            cls.kept.clear()
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
    :class:`~embstore.DistributedStore` calls it (gloo) when nothing else did."""
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
            "torchrun, call torch.distributed.init_process_group() first, or open a plain "
            "embstore.Store for one process"
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
            raise InvalidArgumentError(
                "a distributed store needs torch.distributed (this torch was built without it)"
            )
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
            what,
            lambda: dist.all_reduce(flag, group=group or self.main, async_op=True),
            group,
            keep=flag,
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

    def _collective(
        self, what: str, call: Callable[[], Any], group: Any = None, keep: Any = None
    ) -> None:
        """Run ``call()``, which starts a collective on ``group`` (None: main) with
        ``async_op=True`` over the tensors ``keep``, and wait for it (see :meth:`_wait`).
        The tensors are held past the call (:meth:`_Exit.keep`)."""
        key = "prep" if group is not None and group is self.prep else "main"
        self._seq[key] += 1
        _Exit.keep(keep)
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
        self._collective(
            what, lambda: dist.all_gather(sizes, size, group=g, async_op=True), g, (sizes, size)
        )
        longest = int(max(int(x.item()) for x in sizes))
        buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        self._collective(
            what, lambda: dist.all_gather(bufs, buf, group=g, async_op=True), g, (bufs, buf)
        )
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
        tensors = (torch.from_numpy(recv), torch.from_numpy(send))
        self._collective(
            what,
            lambda: dist.all_to_all_single(*tensors, group=group, async_op=True),
            group,
            tensors,
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
        tensors = (torch.from_numpy(recv), torch.from_numpy(send))
        self._collective(
            what,
            lambda: dist.all_to_all_single(
                *tensors,
                [int(x) for x in recv_splits],
                [int(x) for x in send_splits],
                group=group,
                async_op=True,
            ),
            group,
            tensors,
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
