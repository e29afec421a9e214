"""Training sessions: the hierarchical parameter server's pipeline over a store's tables
(``store.session(...)``; hierarchical-gpu-ps §3, App. B).

A batch goes through five stages::

    read       the loader's next batch, and its ids per table          (background thread)
    partition  unique ids, grouped by the process that owns them        (background thread)
    prepare    ids sent to their owners, which bring the rows into      (background thread)
               memory from disk and pin them
    train      the rows gathered (pulled from their owners) into one    (your loop)
               [N, D] tensor per table; your forward and backward
    write-back gradients sent to the owners, which sum them over every  (your loop)
               process and step the optimizer once per id; unpin

While your loop trains on batch t, the background thread reads, partitions and prepares the
batches ahead: ``prefetch`` of them, or by default as many as the memory budget holds pinned (the
lookahead, see ``_Window``), their cold rows read together, a group at a time. Values are read
in the train stage, after batch t-1's write-back, so the pipeline changes when the work is done
and never what is computed: a pipelined session trains bit for bit like ``prefetch=0``
(everything in your loop's thread, in order).

``staleness=1`` moves the gather off your loop too: batch t+1's rows are read while batch t
trains, after batch t-1's write-back and before batch t's, so batch t+1 misses exactly batch t's
updates (its gradients still go to the rows as they are then). Every process and every
``prefetch`` computes the same (a fixed order of reads and writes), so it is as reproducible as
staleness 0, one step staler.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from embstore import metrics
from embstore._arrays import as_ids
from embstore.config import refuse_delta
from embstore.distributed.comm import Comm, calling, check_not_process_local, timeout_s
from embstore.distributed.placement import owner_of
from embstore.errors import (
    DistributedError,
    InvalidArgumentError,
    NonFiniteError,
)
from embstore.pins import Pins
from embstore.table import Table

__all__ = ["Session", "SessionBatch"]

STAGES = ("read", "partition", "prepare", "gather", "train", "write_back")
# Threads that read a batch's cold rows of several tables at once (see Session._read_in).
_READERS = 4
_END = object()
# The lookahead (see _Window): with a memory budget and ``prefetch=None``, batches are prepared
# ahead of training while the rows pinned for them stay within this share of the budget (the
# rest caches rows for the batches beyond), at most _MAX_AHEAD batches, and their cold rows are
# read together, up to _MAX_GROUP batches at once.
_LOOKAHEAD_SHARE = 0.25
_MAX_AHEAD = 32
_MAX_GROUP = 8


# Sessions made in this process, for their ``session`` label on /metrics.
_NUMBERS = itertools.count(1)


def table_names(tables: Iterable[Any] | None, features: Any = None) -> list[Any]:
    """The names of a session's ``tables`` (a table, plain or distributed, stands for its
    name), or, with ``tables`` None, of the tables ``features`` looks features up in."""
    if tables is None and features is not None:
        from embstore.torch.jagged import FeaturePlan

        return [p.name for p in FeaturePlan.of(features).tables]
    if tables is None:
        raise InvalidArgumentError("session() needs tables (or features=)")
    return [t if isinstance(t, str) else getattr(t, "name", t) for t in tables]


class _Plan:
    """One batch's ids, as this process asks for them: per table the unique ids sorted by
    owner (``uniq``), each id's place among them (``inv``) and the ids' shape; ``counts[j, t]``
    unique ids of table ``t`` owned by process ``j``. With one process ``uniq`` holds the ids
    as they are (duplicates too) and ``inv`` is None: the table sums duplicates itself."""

    __slots__ = ("counts", "data", "error", "inv", "jagged", "served", "shapes", "size", "uniq")

    def __init__(self, data: Any, world: int, n_tables: int) -> None:
        self.data = data
        self.shapes: list[tuple[int, ...]] = []
        self.uniq: list[np.ndarray] = []
        self.inv: list[np.ndarray | None] = []
        self.counts = np.zeros((world, n_tables), np.int64)
        self.error: BaseException | None = None
        self.served: _Served | None = None
        self.jagged: Any = None  # features=: each table's jagged input (jagged.TableInput)
        self.size = 0  # the first of a group of batches read together: the group's size


class _Served:
    """What this process serves for one batch, as owner: per table the ids every process asked
    for, source after source (``ids``; ``counts[s, t]`` of them from process ``s``), and the
    pins taken for them."""

    __slots__ = ("counts", "error", "ids", "pins", "reads")

    def __init__(self, ids: list[np.ndarray], counts: np.ndarray) -> None:
        self.ids = ids
        self.counts = counts
        self.pins = Pins()
        self.reads: list[tuple[Table, np.ndarray]] = []  # pinned, not read in yet
        self.error: BaseException | None = None


class SessionBatch:
    """One batch of a :meth:`Session.run`: the loader's batch (``.data``; its attributes also
    read through: ``batch.labels`` is ``batch.data.labels``, or ``batch.data["labels"]`` for a
    dict, and ``batch[k]`` is ``batch.data[k]``) and its tables' rows.

    ``embeddings(name)`` gives the rows of the batch's ids of that table (shape: the ids' shape
    + ``[D]``), ``bags(name, offsets)`` pools them per bag; both are differentiable. After
    ``loss.backward()``, :meth:`push_grads` sends the gradients to the tables (on every process
    of a distributed job, or on none).
    """

    def __init__(self, session: Session, plan: _Plan, leaves: list[Any]) -> None:
        self._session = session
        self._plan = plan
        self._leaves = leaves
        self._pushed = False
        self._train = session._training
        self._push_s = 0.0
        self._before_push: Callable[[], None] | None = None
        self.data = plan.data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if isinstance(self.data, Mapping) and name in self.data:
            return self.data[name]
        return getattr(self.data, name)

    def __getitem__(self, key: Any) -> Any:
        return self.data[key]

    def _index(self, name: str) -> int:
        try:
            return self._session._index[name]
        except KeyError:
            raise InvalidArgumentError(
                f"table {name!r} is not in this session's tables {list(self._session._index)}"
            ) from None

    def unique_ids(self, name: str) -> np.ndarray:
        """The batch's distinct ids of table ``name`` (``uint64``), in the order their
        gradients are sent in."""
        t = self._index(name)
        ids = self._plan.uniq[t]
        return np.unique(ids) if self._plan.inv[t] is None else ids

    def rows(self, name: str) -> Any:
        """The ``[N, D]`` leaf tensor of the rows of the batch's ids of table ``name``, one
        per id (flattened), in order: what :meth:`embeddings` and :meth:`bags` read. Its
        ``.grad`` is what :meth:`push_grads` sends, summed per id in the ids' order (so a
        session trains exactly as the table's own ``apply_gradients`` would)."""
        return self._leaves[self._index(name)]

    def embeddings(self, name: str) -> Any:
        """Rows of the batch's ids of table ``name``: a float32 tensor of the ids' shape +
        ``[D]``, differentiable (its gradient reaches the table at :meth:`push_grads`)."""
        t = self._index(name)
        leaf = self._leaves[t]
        return leaf.view(*self._plan.shapes[t], leaf.shape[1])

    def bags(
        self,
        name: str,
        offsets: Any,
        mode: str = "mean",
        per_sample_weights: Any = None,
    ) -> Any:
        """The rows of table ``name`` pooled per bag, as ``nn.EmbeddingBag`` does: the batch's
        ids of that table (1-D) cut into bags at ``offsets`` (``int64[B]``), ``mode`` ``"sum"``,
        ``"mean"`` or ``"max"``. Returns ``float32[B, D]``."""
        import torch
        import torch.nn.functional as F

        t = self._index(name)
        if len(self._plan.shapes[t]) != 1:
            raise InvalidArgumentError(
                f"bags() needs 1-D ids for table {name!r}, got shape {self._plan.shapes[t]}"
            )
        leaf = self._leaves[t]
        return F.embedding_bag(
            torch.arange(leaf.shape[0], device=leaf.device),
            leaf,
            torch.as_tensor(offsets, dtype=torch.int64, device=leaf.device),
            mode=mode,
            per_sample_weights=per_sample_weights,
        )

    def push_grads(self, lr: float | None = None, *, scaler: Any = None) -> None:
        """Send the gradients of this batch's rows to their tables: each owner sums them over
        every process and steps its optimizer once per id (``lr`` overrides its learning
        rate). Call it once per batch, after ``backward()``, on every process of a
        distributed job.

        A table whose rows have no gradient on any process (not used in the loss) is not
        stepped, as ``torch.optim`` skips a parameter whose ``.grad`` is ``None``; a batch
        with no gradient at all is refused (:class:`InvalidArgumentError`: ``backward()`` was
        not called). A batch of ``run(..., train=False)`` has nothing to push: refused.

        Args:
            lr: the learning rate of this step, in place of each table's own.
            scaler: the ``torch.amp.GradScaler`` that scaled the loss: the gradients are
                unscaled (as ``scaler.unscale_`` does, recorded in the scaler) and, when any is
                inf or NaN on any process, nothing is applied on any process and
                ``scaler.update()`` backs off. Call ``scaler.update()`` once per iteration, as
                usual.
        """
        if not self._train:
            raise InvalidArgumentError(
                "push_grads() on a batch of run(..., train=False): evaluation batches apply "
                "no gradient (their rows do not require grad)"
            )
        if self._pushed:
            raise InvalidArgumentError("push_grads() was called twice for one batch")
        self._pushed = True
        if self._before_push is not None:  # staleness 1: the next batch's rows first
            self._before_push()
        if scaler is not None and scaler.is_enabled() and self._session._unscale(self, scaler):
            return  # overflowed on some process: nothing applied anywhere
        self._session._push(self, lr)

    def pooled(self) -> Any:
        """The batch's features pooled per bag, as the session's ``features=`` pool them: a
        :class:`~embstore.torch.KeyedTensor`, bit for bit what
        :class:`~embstore.torch.EmbeddingBagCollection` returns for the same input and rows.
        Needs ``features=`` and an ``ids(batch)`` that returns a ``KeyedJaggedTensor``."""
        features, inputs = self._jagged_input()
        return features.pooled_rows([self.rows(p.name) for p in features.tables], inputs)

    def jagged(self) -> dict[str, Any]:
        """The batch's features unpooled, as :class:`~embstore.torch.EmbeddingCollection`
        returns them: ``{feature: JaggedTensor}`` of ``[N_f, D]`` rows (differentiable)."""
        features, inputs = self._jagged_input()
        return features.jagged([self.rows(p.name) for p in features.tables], inputs)

    def _jagged_input(self) -> tuple[Any, Any]:
        if self._plan.jagged is None:
            raise InvalidArgumentError(
                "pooled() and jagged() need a session opened with features= whose ids() "
                "returns a KeyedJaggedTensor"
            )
        return self._session._features, self._plan.jagged


class Session:
    """A training session over some of a store's tables; see :meth:`embstore.Store.session`."""

    def __init__(
        self,
        store: Any,
        tables: Iterable[Any] | None,
        *,
        prefetch: int | None = None,
        grad_average: bool = True,
        on_miss: str = "init",
        device: Any = None,
        staleness: int = 0,
        features: Any = None,
    ) -> None:
        if prefetch is not None and (
            isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0
        ):
            raise InvalidArgumentError(
                f"prefetch must be None (chosen from the memory budget) or an int >= 0, "
                f"got {prefetch!r}"
            )
        if isinstance(staleness, bool) or staleness not in (0, 1):
            raise InvalidArgumentError(f"staleness must be 0 or 1, got {staleness!r}")
        names = table_names(tables, features)
        if not names:
            raise InvalidArgumentError("a session needs at least one table")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"a table is named twice in {names}")
        self._features = None
        if features is not None:  # ids() may return a KeyedJaggedTensor (embstore.torch)
            from embstore.torch.jagged import FeaturePlan

            self._features = FeaturePlan.of(features)
            extra = [p.name for p in self._features.tables if p.name not in names]
            if extra:
                raise InvalidArgumentError(
                    f"features= looks features up in table(s) {extra}, not in the session's "
                    f"tables {names}"
                )
        self._store = store
        self._number = next(_NUMBERS)  # the session's label on the process's /metrics
        self._unregister_metrics: Callable[[], None] | None = None
        self._comm: Comm = store.comm
        # The rows this process holds: a distributed store's own partition (store.local).
        self._tables = [store.local.table(n) for n in names]
        self._dims = [t.embedding_dim for t in self._tables]
        self._index = {n: i for i, n in enumerate(names)}
        self._prefetch = prefetch
        self._staleness = staleness
        self._readers: concurrent.futures.ThreadPoolExecutor | None = None
        self._scale = 1.0 / self._comm.world if grad_average else 1.0
        self._on_miss = on_miss
        self._device = device
        self._reject = [t.config.on_non_finite == "error" for t in self._tables]
        self._warned = False
        self._lock = threading.Lock()
        self._busy = dict.fromkeys(STAGES, 0.0)
        self._blocked = {"prepare": 0.0, "train": 0.0}
        self._batches = 0
        self._rows = {"pulled": 0, "pulled_remote": 0, "served": 0, "pinned": 0}
        self._running = False
        self._training = True  # the running loop's: run(..., train=)
        self._scaled = _Scaled()  # what push_grads(scaler=) hands to scaler.unscale_
        self._label = f"a session over {names}"  # for its collectives (distributed.calling)
        self._prepared = 0  # batches prepared by this run (the same on every process)
        self._window: _Window | None = None  # the running loop's lookahead
        self._ahead = {"groups": 0, "batches_read": 0, "max_batches": 0}

    @property
    def tables(self) -> list[str]:
        return list(self._index)

    def stats(self) -> dict[str, Any]:
        """Seconds each stage was busy (``busy_s``) and waited (``blocked_s``: the prepare
        stage waiting for room ahead of training, training waiting for a prepared batch),
        batches, rows (``pulled`` into training, of them ``pulled_remote`` from other
        processes; ``served`` to training as owner), bytes exchanged with other processes, and
        the ``lookahead``: how many batches ahead of training the prepare stage may run now
        (``batches``: chosen from the memory budget with ``prefetch=None``), how it is bounded
        (``bounded_by``: ``"budget"``, ``"max"``, ``"prefetch"`` or ``"no budget"``), the
        batches whose cold rows are read together (``group``), the bytes of rows pinned for
        batches in flight (``pinned_bytes``, all the store's tables) and of one batch
        (``batch_bytes``, the largest of the last 16), ``reads`` (reads of a group so far),
        ``batches_read`` and the most batches it ran ahead (``max_batches``)."""
        window = self._window
        with self._lock:
            ahead = dict(self._ahead)
            out = {
                "batches": self._batches,
                "busy_s": dict(self._busy),
                "blocked_s": dict(self._blocked),
                "rows": dict(self._rows),
                "bytes_sent": self._comm.bytes_sent,
                "bytes_received": self._comm.bytes_received,
                "processes": self._comm.world,
            }
        look = (window or self._new_window()).describe()
        look.update(reads=ahead["groups"], batches_read=ahead["batches_read"])
        look["max_batches"] = ahead["max_batches"]
        out["lookahead"] = look
        return out

    def serve_metrics(
        self,
        listen: str = "127.0.0.1:0",
        *,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_client_ca: str | os.PathLike[str] | None = None,
    ) -> str:
        """Serve this session's metrics as ``GET /metrics`` in Prometheus' text format on the
        process's one metrics endpoint (:func:`embstore.metrics.serve`: started on ``listen``,
        ``host:port``, port 0 picks one, by the first call in the process; the server's own
        endpoint code, over TLS with ``tls_cert``/``tls_key``), until the process ends or the
        session is gone; returns the address. Each session is labelled ``process`` (its rank)
        and ``session`` (its number in the process): per-stage busy and blocked seconds,
        batches, rows, bytes exchanged, the lookahead."""
        address = metrics.serve(
            listen, tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=tls_client_ca
        )
        if self._unregister_metrics is None:
            self._unregister_metrics = metrics.register(self.metrics_text)
        return address

    def metrics_text(self) -> str:
        """:meth:`stats` in Prometheus' text format (what :meth:`serve_metrics` serves)."""
        s = self.stats()
        p = f'process="{self._comm.rank}",session="{self._number}"'
        lines = [
            "# HELP embstore_session_stage_seconds_total Seconds each pipeline stage was busy "
            "or blocked.",
            "# TYPE embstore_session_stage_seconds_total counter",
        ]
        for stage, v in s["busy_s"].items():
            lines.append(
                f'embstore_session_stage_seconds_total{{{p},stage="{stage}",state="busy"}} {v}'
            )
        for stage, v in s["blocked_s"].items():
            lines.append(
                f'embstore_session_stage_seconds_total{{{p},stage="{stage}",state="blocked"}} {v}'
            )
        lines += [
            "# HELP embstore_session_batches_total Batches handed to training.",
            "# TYPE embstore_session_batches_total counter",
            f"embstore_session_batches_total{{{p}}} {s['batches']}",
            "# HELP embstore_session_rows_total Rows pulled into batches (of them from other "
            "processes), served as owner, pinned ahead.",
            "# TYPE embstore_session_rows_total counter",
        ]
        for kind, v in s["rows"].items():
            lines.append(f'embstore_session_rows_total{{{p},kind="{kind}"}} {v}')
        lines += [
            "# HELP embstore_session_bytes_total Bytes exchanged with the other processes.",
            "# TYPE embstore_session_bytes_total counter",
            f'embstore_session_bytes_total{{{p},direction="sent"}} {s["bytes_sent"]}',
            f'embstore_session_bytes_total{{{p},direction="received"}} {s["bytes_received"]}',
        ]
        look = s["lookahead"]
        lines += [
            "# HELP embstore_session_lookahead_batches Batches the prepare stage may run ahead "
            "of training now (chosen from the memory budget unless prefetch is set).",
            "# TYPE embstore_session_lookahead_batches gauge",
            f'embstore_session_lookahead_batches{{{p},bounded_by="{look["bounded_by"]}"}} '
            f"{look['batches']}",
            "# HELP embstore_session_lookahead_group_batches Batches whose cold rows are read "
            "together.",
            "# TYPE embstore_session_lookahead_group_batches gauge",
            f"embstore_session_lookahead_group_batches{{{p}}} {look['group']}",
            "# HELP embstore_session_lookahead_pinned_bytes Bytes of rows pinned in the store "
            "for batches in flight.",
            "# TYPE embstore_session_lookahead_pinned_bytes gauge",
            f"embstore_session_lookahead_pinned_bytes{{{p}}} {look['pinned_bytes']}",
            "# HELP embstore_session_lookahead_reads_total Reads of a group's cold rows.",
            "# TYPE embstore_session_lookahead_reads_total counter",
            f"embstore_session_lookahead_reads_total{{{p}}} {look['reads']}",
        ]
        return "\n".join(lines) + "\n"

    def _add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._busy[stage] += seconds

    # -- the stages -----------------------------------------------------------------------

    def _read(self, it: Iterator[Any], ids: Callable[[Any], Mapping[str, Any]]) -> Any:
        start = time.perf_counter()
        try:
            data = next(it)
        except StopIteration:
            self._add("read", time.perf_counter() - start)
            return _END
        plan = _Plan(data, self._comm.world, len(self._tables))
        try:
            raw = ids(data)
            if self._features is not None and not isinstance(raw, Mapping):
                raw, plan.jagged = self._features.session_ids(raw)
            if not isinstance(raw, Mapping):
                hint = (
                    " (a KeyedJaggedTensor needs store.session(..., features=...))"
                    if callable(getattr(raw, "lengths", None))
                    else ""
                )
                raise InvalidArgumentError(
                    "ids() must return a mapping of table name to ids, got "
                    f"{type(raw).__name__}{hint}"
                )
            unknown = [k for k in raw if k not in self._index]
            missing = [n for n in self._index if n not in raw]
            if unknown or missing:
                raise InvalidArgumentError(
                    f"ids() must map exactly the session's tables {list(self._index)}; "
                    + (f"unknown {unknown}" if unknown else f"missing {missing}")
                )
            flat = [self._flat(raw[n]) for n in self._index]
        except Exception as e:  # agreed with the other processes first
            plan.error = e
            self._add("read", time.perf_counter() - start)
            return plan
        self._add("read", time.perf_counter() - start)
        start = time.perf_counter()
        try:
            self._partition(plan, flat)
        except Exception as e:
            plan.error = e
        self._add("partition", time.perf_counter() - start)
        return plan

    @staticmethod
    def _flat(raw: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        from embstore._arrays import torch_tensor

        t = torch_tensor(raw)
        if t is not None:
            shape = tuple(t.shape)
            raw = t.reshape(-1)
        else:
            arr = np.asarray(raw)
            shape = arr.shape
            if arr.ndim != 1 and arr.dtype.kind in "iu":
                raw = arr.reshape(-1)
        ids, _ = as_ids(raw)
        return ids, shape

    def _partition(self, plan: _Plan, flat: list[tuple[np.ndarray, tuple[int, ...]]]) -> None:
        world = self._comm.world
        for t, (ids, shape) in enumerate(flat):
            plan.shapes.append(shape)
            if world == 1:
                # One process: the ids go to the table as they are (it sums the gradients of
                # duplicates itself, in the ids' order); ``inv`` None means "the identity".
                plan.uniq.append(ids)
                plan.inv.append(None)
                plan.counts[0, t] = len(ids)
                continue
            uniq, inv = np.unique(ids, return_inverse=True)
            inv = inv.reshape(-1).astype(np.int64, copy=False)
            owner = owner_of(uniq, world)
            order = np.argsort(owner, kind="stable")
            uniq = uniq[order]
            place = np.empty_like(order)
            place[order] = np.arange(len(order))
            plan.uniq.append(uniq)
            plan.inv.append(place[inv])
            plan.counts[:, t] = np.bincount(owner, minlength=world)

    def _prepare(
        self, plan: Any, group: Any = None, pin: bool = True, read: bool = True, want: int = 0
    ) -> Any:
        with calling(self._label):
            return self._prepare_here(plan, group, pin, read, want)

    def _prepare_here(
        self, plan: Any, group: Any = None, pin: bool = True, read: bool = True, want: int = 0
    ) -> Any:
        """Send the plan's ids to their owners; as owner, pin and read in what is asked
        (``read=False``: pinned only, the reads left in ``served.reads`` for
        :meth:`_read_group`). ``want`` > 0 starts a group of batches read together: the
        group's size, the least every process wants, lands in ``plan.size`` (every process
        groups the same batches, so that none waits in a prepare exchange for a partner whose
        training waits for a batch still in a group). Returns the plan, or ``_END`` once every
        process's loader has ended."""
        start = time.perf_counter()
        comm = self._comm
        end = plan is _END
        error = None if end else plan.error
        if comm.world == 1:
            if error is not None:
                raise error
            if end:
                return _END
            plan.size = want
            served = _Served(plan.uniq, plan.counts)
        else:
            n_tables = len(self._tables)
            counts = np.zeros((comm.world, n_tables + 2), np.int64)
            if not end and error is None:
                counts[:, :n_tables] = plan.counts
            counts[:, n_tables] = 1 if end else 0
            counts[:, n_tables + 1] = want
            what = "preparing a batch"
            group = group or comm.prep
            recv = comm.exchange_counts(counts, error, what, group)
            ended = recv[:, n_tables]
            if ended.any():
                if ended.all():
                    return _END
                done = [r for r in range(comm.world) if ended[r]]
                more = [r for r in range(comm.world) if not ended[r]]
                raise DistributedError(
                    f"the loaders ended at different batches: process(es) {done} ran out after "
                    f"{self._prepared} batches while {more} had more. Give every process the "
                    "same number of batches (DistributedSampler, drop_last=True)"
                )
            self._prepared += 1
            plan.size = int(recv[:, n_tables + 1].min())
            recv = recv[:, :n_tables]
            send = (
                np.concatenate(
                    [
                        plan.uniq[t][_span(plan.counts[:, t], j)]
                        for j in range(comm.world)
                        for t in range(n_tables)
                    ]
                )
                if plan.counts.sum()
                else np.empty(0, np.uint64)
            )
            got = comm.exchange(
                send.view(np.int64), plan.counts.sum(1), recv.sum(1), what, group
            ).view(np.uint64)
            served = _Served(_by_table(got, recv, [1] * n_tables)[0], recv)
        plan.served = served
        reads = []
        for table, ids in zip(self._tables, served.ids, strict=True):
            if not pin or not Pins.needed(table) or not len(ids):
                continue
            ids = self._pin_set(ids)
            try:
                served.pins.take(table, ids)  # refused: taken again at the gather
            except Exception as e:  # reported at the gather
                served.error = e
                break
            reads.append((table, ids))
        if not read:
            served.reads = reads
        elif served.error is None and reads:
            served.error = self._read_in(reads)
        with self._lock:
            self._rows["pinned"] += served.pins.ids()
        self._add("prepare", time.perf_counter() - start)
        return plan

    def _read_in(self, reads: list[tuple[Table, np.ndarray]]) -> BaseException | None:
        """Brings the rows of every ``(table, ids)`` that are on disk into memory; the first
        error, if any. The tables are read at once (``_READERS`` threads): each table's call
        has its own reads in flight, so a batch's cold rows wait for the disk together rather
        than table after table."""
        if len(reads) == 1:
            try:
                reads[0][0].prefetch(reads[0][1])
            except Exception as e:
                return e
            return None
        if self._readers is None:
            self._readers = concurrent.futures.ThreadPoolExecutor(
                _READERS, thread_name_prefix="embstore-read"
            )
        futures = [self._readers.submit(t.prefetch, ids) for t, ids in reads]
        error = None
        for f in futures:
            try:
                f.result()
            except Exception as e:
                error = error or e
        return error

    def _read_group(self, plans: list[_Plan]) -> None:
        """Reads the cold rows of the prepared ``plans`` together: per table the union of
        their ids, one read of it (a row two batches use is read once, and the disk gets the
        group's reads at once, in the order of the files). An error goes to every plan."""
        if not plans:
            return
        start = time.perf_counter()
        by_table: dict[str, tuple[Table, list[np.ndarray]]] = {}
        for plan in plans:
            served = plan.served
            assert served is not None
            for table, ids in served.reads:
                by_table.setdefault(table.name, (table, []))[1].append(ids)
            served.reads = []
        reads = [
            (table, parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts)))
            for table, parts in by_table.values()
        ]
        error = self._read_in(reads) if reads else None
        for plan in plans:
            assert plan.served is not None
            if plan.served.error is None:
                plan.served.error = error
        with self._lock:
            self._ahead["groups"] += 1
            self._ahead["batches_read"] += len(plans)
        self._add("prepare", time.perf_counter() - start)

    def _new_window(self) -> _Window:
        budget = self._store.memory_budget
        tiered = budget is not None and any(t.tiered for t in self._tables)
        return _Window(self._prefetch, budget[0] if tiered else None, self._pinned_bytes)

    def _pinned_bytes(self) -> int:
        return self._store.pinned_bytes

    def _gather(self, plan: _Plan) -> list[Any]:
        with calling(self._label):
            return self._gather_here(plan)

    def _gather_here(self, plan: _Plan) -> list[Any]:
        """Read the rows the batch's owners serve and build the batch's leaves: ``[N, D]``, a
        row per id of the batch, in order."""
        import torch

        start = time.perf_counter()
        leaves = []
        # Evaluation stores no row: a new id reads zeros, as a module in eval mode does.
        on_miss = self._on_miss if self._training or self._on_miss != "init" else "zeros"
        for r, inv in zip(self._gather_rows(plan, on_miss, self._comm.main), plan.inv, strict=True):
            leaf = torch.from_numpy(r if inv is None else r[inv])
            if self._device is not None:
                leaf = leaf.to(self._device)
            leaves.append(leaf.requires_grad_(self._training))
        self._add("gather", time.perf_counter() - start)
        return leaves

    def _gather_rows(self, plan: _Plan, on_miss: str, group: Any) -> list[np.ndarray]:
        """The rows of the plan's ``uniq`` ids, per table (``float32[U, D]``), from their
        owners; as owner, serve what the others asked for."""
        comm, served = self._comm, plan.served
        assert served is not None
        rows: list[np.ndarray] = []
        error = served.error
        if served.pins.refused:
            self._retry_pins(served)
        if error is None:
            try:
                for table, ids in zip(self._tables, served.ids, strict=True):
                    rows.append(table.lookup(ids, on_miss))
            except Exception as e:
                error = e
        if comm.world == 1:
            if error is not None:
                raise error
            mine = rows
        else:
            # Each process's error flag rides with its rows (one float per destination).
            mine, _ = self._exchange_rows(
                rows,
                served.ids,
                served.counts,
                plan.counts,
                error,
                "gathering a batch's rows",
                group,
            )
        with self._lock:
            self._batches += 1
            self._rows["pulled"] += int(plan.counts.sum())
            self._rows["pulled_remote"] += int(plan.counts.sum() - plan.counts[comm.rank].sum())
            self._rows["served"] += int(served.counts.sum())
        return mine

    def _pin_set(self, ids: np.ndarray) -> np.ndarray:
        """The ids to pin for ``ids`` served: distinct ones (one process serves its batch's ids
        as they are, duplicates too; the pins' share of the budget counts each row once)."""
        return np.unique(ids) if self._comm.world == 1 else ids

    def _retry_pins(self, served: _Served) -> None:
        """Pins refused while earlier batches held theirs: taken now, before the next fetch."""
        served.pins.retry()
        if not self._warned:
            self._warned = True
            warnings.warn(
                "embstore session: the rows of the batches in flight pass 60 % of the memory "
                "budget; some are read by their batch's own lookups, without a pin (a smaller "
                "prefetch, or a larger budget, avoids it)",
                RuntimeWarning,
                stacklevel=4,
            )

    def _unscale(self, batch: SessionBatch, scaler: Any) -> bool:
        """``scaler.unscale_`` the batch's gradients (in place, recorded in the scaler as an
        optimizer's); whether any was inf or NaN on any process (collective then). An overflow
        elsewhere is recorded here too, so every process's scaler backs off alike."""
        import torch

        leaves = [leaf for leaf in batch._leaves if leaf.grad is not None]
        mine = any(not bool(torch.isfinite(leaf.grad).all()) for leaf in leaves)
        bad = mine
        if self._comm.world > 1:
            bad = any(self._comm.all_gather(mine, "checking a batch's scaled gradients"))
        params = list(leaves)
        if bad and not mine:
            flag = torch.zeros(1)
            flag.grad = torch.full((1,), float("inf"))
            params.append(flag)
        self._scaled.param_groups = [{"params": params}]
        try:
            scaler.unscale_(self._scaled)
        finally:
            self._scaled.param_groups = []
        return bad

    def _push(self, batch: SessionBatch, lr: float | None) -> None:
        with calling(self._label):
            return self._push_here(batch, lr)

    def _push_here(self, batch: SessionBatch, lr: float | None) -> None:
        start = time.perf_counter()
        grads: list[np.ndarray] = []
        error: BaseException | None = None
        has_grad = [leaf.grad is not None for leaf in batch._leaves]
        try:
            import torch

            if self._comm.world == 1 and not self._store.distributed:
                for table in self._tables:
                    check_not_process_local(table, "push_grads()")
            if not any(has_grad):
                raise InvalidArgumentError(
                    "push_grads(): no row of this batch has a gradient (call loss.backward() "
                    "first, with a loss that uses the batch's embeddings); to evaluate, "
                    "iterate sess.run(..., train=False), which never applies gradients"
                )
            for leaf, uniq, inv in zip(
                batch._leaves, batch._plan.uniq, batch._plan.inv, strict=True
            ):
                grad = leaf.grad
                if inv is None:  # one process: the table sums duplicates itself
                    g = (
                        np.zeros(tuple(leaf.shape), np.float32)
                        if grad is None
                        else grad.detach().to("cpu", torch.float32).numpy()
                    )
                    grads.append(g)
                    continue
                acc = torch.zeros((len(uniq), leaf.shape[1]), dtype=torch.float32)
                if grad is not None:
                    # Per id, in the ids' order (index_add_ on the CPU adds one row after
                    # another): the sums apply_gradients makes of duplicate ids.
                    acc.index_add_(0, torch.from_numpy(inv), grad.detach().to("cpu", torch.float32))
                g = acc.numpy()
                grads.append(g * np.float32(self._scale) if self._scale != 1.0 else g)
        except Exception as e:  # agreed in _push_rows
            error = e
        self._push_rows(batch._plan, grads, lr, error, self._comm.main, has_grad)
        batch._push_s = time.perf_counter() - start
        self._add("write_back", batch._push_s)

    def _push_rows(
        self,
        plan: _Plan,
        grads: list[np.ndarray],
        lr: float | None,
        error: BaseException | None,
        group: Any,
        has_grad: list[bool] | None = None,
    ) -> None:
        """Send ``grads`` (per table, ``float32[U, D]`` in the order of the plan's ``uniq``) to
        the owners; as owner, sum what every process sent and step the optimizer; unpin.
        ``has_grad[t]`` False: table ``t`` had no gradient here (zeros are sent); a table with
        none on any process is not stepped."""
        if has_grad is None:
            has_grad = [True] * len(self._tables)
        comm, served = self._comm, plan.served
        assert served is not None
        what = "pushing a batch's gradients"
        if comm.world == 1:
            # The table checks the gradients itself (a non-finite one: nothing is applied).
            if error is not None:
                _release(served)
                raise error
            mine = grads
            stepped = has_grad
        else:
            try:
                if error is None:
                    for t, g in enumerate(grads):
                        if self._reject[t] and not np.isfinite(g).all():
                            bad = int(np.flatnonzero(~np.isfinite(g).all(axis=1))[0])
                            raise NonFiniteError(
                                f"the gradient of id {int(plan.uniq[t][bad])} in table "
                                f"'{self._tables[t].name}' is not finite; nothing was applied"
                            )
            except Exception as e:
                error = e
            # Each process's error flag rides with its gradients: no owner applies anything
            # unless every process's gradients are good.
            mine, flags = self._exchange_rows(
                grads, plan.uniq, plan.counts, served.counts, error, what, group, served, has_grad
            )
            stepped = list(flags.any(axis=0))
        error = None
        try:
            for table, ids, g, step in zip(self._tables, served.ids, mine, stepped, strict=True):
                if not step:
                    continue  # no process had a gradient for it: as torch skips grad None
                if len(ids):
                    table.apply_gradients(ids, g, lr=lr)
                else:
                    table.step += 1  # every process steps every table once per batch
        except Exception as e:
            error = e
        finally:
            _release(served)
        comm.agree(what, error, group)

    def _exchange_rows(
        self,
        arrays: list[np.ndarray],
        ids: list[np.ndarray],
        send_counts: np.ndarray,
        recv_counts: np.ndarray,
        error: BaseException | None,
        what: str,
        group: Any,
        release: _Served | None = None,
        has_grad: list[bool] | None = None,
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """All-to-all of per-table rows (``arrays[t]``: a row per id of ``ids[t]``, cut per
        process by ``send_counts``), each process's piece followed by its flags: its error
        (zeros are sent by a process that failed) and, per table, ``has_grad``. Raises on
        every process if any failed (after releasing ``release``'s pins); returns the rows
        per table and ``flags[s, t]``: process ``s`` had a gradient for table ``t``."""
        comm = self._comm
        n_tables = len(self._dims)
        if error is not None:
            arrays = [
                np.zeros((len(i), d), np.float32) for i, d in zip(ids, self._dims, strict=True)
            ]
        status = np.ones(1 + n_tables, np.float32)
        status[0] = 0.0 if error is None else 1.0
        if has_grad is not None:
            status[1:] = has_grad
        send = _flatten(arrays, send_counts, comm.world, status)
        extra = 1 + n_tables
        got = comm.exchange(
            send, send_counts @ self._dims + extra, recv_counts @ self._dims + extra, what, group
        )
        parts, flags = _by_table(got, recv_counts, self._dims, flags=extra)
        if flags[:, 0].any() or error is not None:
            _release(release)
            comm.fail(what, error, group)
        rows = [p.reshape(-1, d) for p, d in zip(parts, self._dims, strict=True)]
        return rows, flags[:, 1:]

    # -- several tables in one exchange, outside the loop ----------------------------------

    def lookup_together(
        self, ids: list[Any], on_miss: str, *, what: str = "a lookup"
    ) -> list[np.ndarray]:
        """The rows of each table's ``ids`` (ids per table of the session, in its order: a
        ``uint64[N_t]`` array, or any ids :meth:`Table.lookup` takes, read flat), as
        ``float32[N_t, D_t]`` in the ids' order, in one exchange of
        ids and one of rows however many tables (``on_miss`` as for :meth:`Table.lookup`).
        Nothing is read ahead and no row stays pinned. In a distributed store it is
        collective: every process calls it, each with its own ids (any number, also none),
        and serves the rows it owns; ``what`` names the call in a distributed error."""
        plan = _Plan(None, self._comm.world, len(ids))
        try:
            self._partition(plan, [self._flat(a) for a in ids])
        except Exception as e:  # agreed in _prepare_here (a bad input raises everywhere)
            plan.error = e
        with calling(what):
            plan = self._prepare_here(plan, self._comm.main, pin=False)
            try:
                rows = self._gather_rows(plan, on_miss, self._comm.main)
            finally:
                _release(plan.served)
        return [r if inv is None else r[inv] for r, inv in zip(rows, plan.inv, strict=True)]

    def apply_gradients_together(
        self,
        ids: list[Any],
        grads_of: Callable[[int, np.ndarray, np.ndarray | None], np.ndarray],
        lr: float | None,
        *,
        what: str = "applying gradients",
    ) -> int:
        """Step each table of the session with gradients for its ``ids`` (ids per table, in
        the session's order, read flat as for :meth:`lookup_together`; None: no gradient
        here), sent to the rows'
        owners in one exchange of ids and one of gradients; each owner sums what every
        process sent for a row and steps it once (with ``lr``, or the table's own). The
        gradients are asked for once the ids are split: ``grads_of(t, uniq, inv)`` returns
        table ``t``'s gradient summed per unique id, ``float32[len(uniq), D_t]``, where the
        ``i``-th id is ``uniq[inv[i]]`` (``inv`` None: ``uniq`` is the ids themselves, the
        table sums duplicates). A table no process has gradients for is not stepped. In a
        distributed store it is collective: every process calls it, with gradients or not;
        ``what`` names the call in a distributed error. Returns the unique ids sent."""
        plan = _Plan(None, self._comm.world, len(ids))
        grads: list[np.ndarray] = []
        has_grad = [i is not None for i in ids]
        error = None
        try:
            self._partition(
                plan,
                [self._flat(i) if i is not None else (np.empty(0, np.uint64), (0,)) for i in ids],
            )
            for t, (uniq, inv) in enumerate(zip(plan.uniq, plan.inv, strict=True)):
                grads.append(grads_of(t, uniq, inv))
        except Exception as e:  # agreed in _prepare_here / _push_rows
            error = e
            plan.error = plan.error or e
        with calling(what):
            plan = self._prepare_here(plan, self._comm.main, pin=False)
            self._push_rows(plan, grads, lr, error, self._comm.main, has_grad)
        return sum(len(u) for u in plan.uniq)

    # -- the loop ---------------------------------------------------------------------------

    def run(
        self,
        batches: Iterable[Any],
        ids: Callable[[Any], Mapping[str, Any]],
        *,
        train: bool = True,
    ) -> Iterator[SessionBatch]:
        """Yield a :class:`SessionBatch` per batch of ``batches`` (any iterable: a
        ``DataLoader``, a generator), in order; ``ids(batch)`` maps each table's name to the
        batch's ids of it (numpy, torch or a sequence of ints, any shape).

        ``train=False`` evaluates: nothing is written — new ids read zeros and store no row
        (with ``on_miss="init"``, the default), the rows do not require grad and
        ``push_grads()`` is refused. In a distributed job every process runs its loop with
        the same ``train``.

        In a distributed job every process runs its own loader over its share of the data;
        every process must have the same number of batches (the session says so if not).
        Closing the loop early (``break``) releases everything; the next ``run`` starts clean.
        """
        if self._running:
            raise InvalidArgumentError("this session is already running a loop")
        if not callable(ids):
            raise InvalidArgumentError("ids must be a callable: batch -> {table name: ids}")
        if not isinstance(train, bool):
            raise InvalidArgumentError(f"train must be a bool, got {train!r}")
        if train:
            refuse_delta(self._tables, "a training session (run(..., train=False) evaluates)")
        return self._run(iter(batches), ids, train)

    def _run(
        self, it: Iterator[Any], ids: Callable[[Any], Mapping[str, Any]], train: bool
    ) -> Iterator[Any]:
        self._running = True
        self._training = train
        self._prepared = 0
        try:
            if self._prefetch == 0:
                yield from self._train(lambda _: self._prepare(self._read(it, ids)), None, _release)
            else:
                yield from self._pipelined(it, ids)
        finally:
            self._running = False

    def _train(
        self,
        next_plan: Callable[[bool], Any],
        pool: concurrent.futures.ThreadPoolExecutor | None,
        release: Callable[[_Served | None], None],
    ) -> Iterator[SessionBatch]:
        """The training loop's side: each prepared batch's rows gathered and handed out, its
        pins released after. At staleness 1 the next batch is gathered before this one's
        write-back: on ``pool``'s thread while this one trains (pipelined), else in
        ``push_grads`` (or after the batch, if it pushes nothing). ``next_plan(in_loop)``
        gives the next prepared batch (``in_loop``: the wait counts as training blocked);
        ``release(served)`` lets a batch's pins go."""
        ahead: Any = None  # staleness 1: the next (plan, leaves), a future of it, or None
        plan: Any = None

        def fetch() -> tuple[Any, Any]:
            nxt = next_plan(pool is None)
            if nxt is _END:
                return nxt, None
            try:
                return nxt, self._gather(nxt)
            except BaseException:
                release(nxt.served)
                raise

        def settle() -> None:
            nonlocal ahead
            if ahead is None:
                ahead = fetch()
            elif isinstance(ahead, concurrent.futures.Future):
                waited = time.perf_counter()
                try:
                    ahead = ahead.result()
                finally:
                    with self._lock:
                        self._blocked["train"] += time.perf_counter() - waited

        try:
            while True:
                if ahead is None:
                    plan = next_plan(True)
                    leaves = None if plan is _END else self._gather(plan)
                else:
                    settle()
                    plan, leaves = ahead
                    ahead = None
                if plan is _END:
                    return
                batch = SessionBatch(self, plan, leaves)
                if self._staleness:
                    if pool is not None:
                        ahead = pool.submit(fetch)
                    batch._before_push = settle
                started = time.perf_counter()
                yield batch
                self._add("train", time.perf_counter() - started - batch._push_s)
                if self._staleness:
                    settle()  # a batch that pushed nothing: the next one is gathered now
                release(plan.served)
                plan = None
        finally:
            if plan is not None and plan is not _END:
                release(plan.served)
            if isinstance(ahead, concurrent.futures.Future):
                try:
                    ahead = ahead.result(timeout=self._join_timeout())
                except BaseException:
                    ahead = None
            if isinstance(ahead, tuple) and ahead[0] is not _END:
                release(ahead[0].served)

    def _pipelined(self, it: Iterator[Any], ids: Any) -> Iterator[SessionBatch]:
        ready: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()
        window = self._window = self._new_window()

        def release(served: _Served | None) -> None:
            if served is not None:
                _release(served)
                window.released()

        def wait_room(n: int) -> None:
            """Until ``n`` more batches fit the lookahead (or the loop is closed)."""
            started = time.perf_counter()
            with window.cond:
                while not stop.is_set() and not window.room(n):
                    window.cond.wait(0.05)
            with self._lock:
                self._blocked["prepare"] += time.perf_counter() - started

        def work() -> None:
            # Every process's thread runs the same sequence of prepare exchanges; once the loop
            # is closed, the next one says so (an "end"), so every process's thread stops after
            # the same exchange and none is left waiting for a partner. The processes agree on
            # each group's size in its first batch's exchange (see _prepare_here), so every
            # process reads its groups' rows after the same batches.
            group: list[_Plan] = []
            try:
                size = want = 0
                while True:
                    if not group:
                        want = window.group()
                        wait_room(want)
                    plan = self._prepare(
                        _END if stop.is_set() else self._read(it, ids),
                        read=False,
                        want=0 if group else want,
                    )
                    if plan is not _END:
                        if not group:
                            size = max(1, plan.size)
                        window.prepared(plan.served)
                        group.append(plan)
                        with self._lock:
                            ahead = window.in_flight - 1
                            self._ahead["max_batches"] = max(self._ahead["max_batches"], ahead)
                        if window.too_small():
                            warnings.warn(
                                "embstore session: the memory budget holds the rows of fewer "
                                "than 2 batches ahead of training; one batch is prepared ahead "
                                "(a larger memory_budget_bytes, or smaller batches, lets the "
                                "session look further ahead)",
                                RuntimeWarning,
                                stacklevel=2,
                            )
                        if len(group) < size:
                            continue
                    self._read_group(group)
                    for p in group:
                        ready.put(p)
                    group = []
                    if plan is _END:
                        ready.put(_END)
                        return
            except BaseException as e:  # raised in the training loop
                for p in group:
                    release(p.served)
                ready.put(_Failed(e))

        def next_plan(in_loop: bool) -> Any:
            waited = time.perf_counter()
            plan = ready.get()
            if in_loop:
                with self._lock:
                    self._blocked["train"] += time.perf_counter() - waited
            if isinstance(plan, _Failed):
                raise plan.error
            return plan

        thread = threading.Thread(target=work, name="embstore-session", daemon=True)
        thread.start()
        pool = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embstore-gather")
            if self._staleness
            else None
        )
        try:
            yield from self._train(next_plan, pool, release)
        finally:
            stop.set()
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            thread.join(timeout=self._join_timeout())
            if self._readers is not None:
                self._readers.shutdown(wait=False, cancel_futures=True)
                self._readers = None
            while True:
                try:
                    left = ready.get_nowait()
                except queue.Empty:
                    break
                if isinstance(left, _Plan):
                    release(left.served)

    def _join_timeout(self) -> float:
        return 5.0 if self._comm.world == 1 else timeout_s()


class _Scaled:
    """The "optimizer" a ``GradScaler`` unscales for ``push_grads(scaler=)``: the batch's
    leaves as its parameters (one object per session, so the scaler keeps one state for it
    per iteration)."""

    def __init__(self) -> None:
        self.param_groups: list[dict[str, Any]] = []


class _Window:
    """How far the prepare stage runs ahead of training, and how many prepared batches have
    their cold rows read together.

    ``prefetch=k``: ``k`` batches ahead, each read on its own (as it always was). ``None``
    (the default): without a memory budget 2 ahead; with one, as many as the rows pinned for
    them allow: another batch is prepared while the store's pinned bytes plus one batch's
    (the largest of the last 16 batches' new pins) stay within ``_LOOKAHEAD_SHARE`` of the
    budget, up to ``_MAX_AHEAD``. Batches are then prepared a group at a time — half the
    batches the budget holds, up to ``_MAX_GROUP`` — and the group's cold rows read at once;
    the prepare stage waits for room for a whole group, so that groups stay large. A budget
    that holds fewer than 2 batches' pins ahead keeps one batch prepared ahead of the one
    training, with a warning (the pins may then be refused: such batches read their rows at
    their own lookups, as before)."""

    def __init__(self, prefetch: int | None, limit: int | None, pinned: Callable[[], int]):
        self.fixed = prefetch
        self.limit = limit
        self._pinned = pinned
        self.cond = threading.Condition()
        self.in_flight = 0  # prepared and not yet released (the batch training included)
        self._sizes: list[int] = []  # the last 16 batches' new pins, bytes
        self.warned = False

    def batch_bytes(self) -> int:
        return max(self._sizes, default=0)

    def holds(self) -> tuple[int, str]:
        """Batches ahead of training the lookahead may run now, and what bounds it."""
        if self.fixed is not None:
            return self.fixed, "prefetch"
        if self.limit is None:
            return 2, "no budget"
        per = self.batch_bytes()
        if per == 0:
            return _MAX_AHEAD, "max"
        n = int(_LOOKAHEAD_SHARE * self.limit // per)
        return (n, "budget") if n < _MAX_AHEAD else (_MAX_AHEAD, "max")

    def group(self) -> int:
        """Prepared batches read together."""
        if self.fixed is not None or self.limit is None:
            return 1
        if not self._sizes:  # the first batch alone: it measures a batch's pins
            return 1
        return max(1, min(_MAX_GROUP, self.holds()[0] // 2))

    def room(self, n: int) -> bool:
        """Whether ``n`` more batches may be prepared now."""
        if self.fixed is not None:
            return self.in_flight + n <= self.fixed + 1
        if self.limit is None:
            return self.in_flight + n <= 3
        if self.in_flight == 0 or self.in_flight + n <= 2:  # one ahead, whatever the budget
            return True
        if self.in_flight + n > _MAX_AHEAD + 1:
            return False
        return self._pinned() + n * self.batch_bytes() <= _LOOKAHEAD_SHARE * self.limit

    def prepared(self, served: _Served | None) -> None:
        with self.cond:
            self.in_flight += 1
            if served is not None and self.limit is not None:
                self._sizes = [*self._sizes[-15:], served.pins.bytes]

    def released(self) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def too_small(self) -> bool:
        """A budget whose lookahead holds fewer than 2 batches (warned once)."""
        if self.fixed is not None or self.limit is None or self.warned or len(self._sizes) < 2:
            return False
        if self.holds()[0] >= 2:
            return False
        self.warned = True
        return True

    def describe(self) -> dict[str, Any]:
        n, bound = self.holds()
        return {
            "batches": n,
            "bounded_by": bound,
            "group": self.group(),
            "pinned_bytes": self._pinned() if self.limit is not None else 0,
            "batch_bytes": self.batch_bytes(),
        }


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _span(counts: np.ndarray, j: int) -> slice:
    start = int(counts[:j].sum())
    return slice(start, start + int(counts[j]))


def _flatten(
    arrays: list[np.ndarray], counts: np.ndarray, world: int, status: np.ndarray
) -> np.ndarray:
    """Rows of every table, cut per process ``j`` (``counts[j, t]`` rows of table ``t``),
    process-major, each process's piece followed by ``status`` (this process's flags), as
    one float32 buffer."""
    flag = np.asarray(status, np.float32).reshape(-1)
    pieces = []
    for j in range(world):
        pieces += [arrays[t][_span(counts[:, t], j)].reshape(-1) for t in range(len(arrays))]
        pieces.append(flag)
    return np.concatenate(pieces)


def _by_table(
    buf: np.ndarray, counts: np.ndarray, widths: list[int], flags: int = 0
) -> tuple[list[np.ndarray], np.ndarray]:
    """The inverse of :func:`_flatten` on the receiving side: a buffer, process-major with
    ``counts[s, t] * widths[t]`` elements of table ``t`` and then ``flags`` floats from process
    ``s``; returns the rows regrouped per table (process after process) and the flags,
    ``bool[world, flags]`` (0: a buffer without them, the ids sent ahead)."""
    world, n_tables = counts.shape
    sizes = counts * np.asarray(widths, np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes.sum(axis=1) + flags)])
    got = np.stack([buf[e - flags : e] for e in starts[1:]]) if flags else np.zeros((world, 0))
    out = []
    for t in range(n_tables):
        parts = []
        for s in range(world):
            at = starts[s] + int(sizes[s, :t].sum())
            parts.append(buf[at : at + int(sizes[s, t])])
        out.append(np.concatenate(parts))
    return out, got != 0


def _release(served: _Served | None) -> None:
    if served is not None:
        served.pins.release()
