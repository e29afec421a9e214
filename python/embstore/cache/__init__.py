"""The inference cache (EVStore's three layers, done our way) and its evaluator.

An inference request needs one row from each of its tables and waits for the slowest, so
the cache maximises *perfect hits* — requests whose rows are all in memory — rather than
per-key hits. See ``docs/cache.md``.

Parts:

- :class:`InferenceCache` — L1 (group-aware replacement, ``policy``), L2 (lower-precision
  rows, ``tiers``), L3 (surrogate keys, ``surrogates``) in one byte budget over a store.
- :func:`build_surrogates` / :class:`Surrogates` — the offline same-table kNN build that
  L3 serves from, saved next to a checkpoint.
- :func:`evaluate` — the one evaluator: our policies, the whole cache, or a libCacheSim
  policy by name, on a trace, in ``online``, ``prefix`` (primary) or ``replay`` mode.
- :mod:`embstore.cache.traces` — MovieLens request traces (ML7, ML11) and key qualification;
  :func:`synthetic_trace` — the design note's Criteo-like trace (26 tables, Zipf contexts,
  co-access rho).

Ids are raw 64-bit feature ids, as the store takes them: any int64 (hashed, negative: read as
its two's complement) or uint64. Each table's ids are its own: the same id in two tables is two
rows. (Traces for :func:`evaluate` carry table-qualified keys, ``table_index << 48 | id``, so
their ids are below 2**48; see :mod:`embstore.cache.traces`.)

Example::

    >>> import embstore, numpy as np
    >>> store = embstore.Store()
    >>> for name in ("user", "item"):
    ...     t = store.create_table(name, embedding_dim=8)
    ...     _ = t.lookup(np.arange(1000))                 # rows exist in the store
    >>> cache = embstore.InferenceCache(store, tables=["user", "item"],
    ...                                 memory_budget_bytes=16 << 10,
    ...                                 tiers={"f32": 0.5, "int8": 0.5})
    >>> rows = cache.lookup({"user": np.array([1, 2]), "item": np.array([7, 7])})
    >>> rows["user"].shape
    (2, 8)
    >>> cache.stats()["requests"]
    2
"""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from embstore import _native
from embstore._arrays import python_ints
from embstore._native import synthetic_trace
from embstore.errors import InvalidArgumentError, ShapeError, TableNotFoundError

__all__ = [
    "CODECS",
    "DEFAULT_TIERS",
    "POLICIES",
    "SOURCES",
    "STORE_POLICIES",
    "InferenceCache",
    "Surrogates",
    "build_surrogates",
    "evaluate",
    "requests_from_batch",
    "synthetic_trace",
]

#: Our replacement policies (``policy=``), defined once in the Rust crate.
POLICIES: tuple[str, ...] = tuple(_native.CACHE_POLICIES)
#: The store's own eviction policies that :func:`evaluate` also scores (run as a cache).
STORE_POLICIES: tuple[str, ...] = tuple(_native.STORE_POLICIES)
#: Row codecs a tier can use (``tiers=`` keys).
CODECS: tuple[str, ...] = tuple(_native.CACHE_CODECS)
#: The tiers of an :class:`InferenceCache` given none: exact f32 rows in a quarter of the
#: budget, 4-bit rows in the rest (docs/cache.md, "Default tiers").
DEFAULT_TIERS: Mapping[str, float] = MappingProxyType({"f32": 0.25, "int4": 0.75})
#: ``sources`` values of :meth:`InferenceCache.lookup`: index → where the row came from.
SOURCES: tuple[str, ...] = ("l1", "l2", "surrogate", "store")

#: Policy metadata per entry assumed for byte budgets of policies that are not ours
#: (GroupLfu's measured ~28 B: 20 B slot, index at load ≤ 3/4).
_METADATA_PER_ENTRY = 28


def _ids(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if not isinstance(x, np.ndarray) and a.dtype.kind in "fO" and a.ndim == 1:
        a = python_ints(x, a)  # Python ints numpy could not type (negatives and >= 2**63)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise InvalidArgumentError(f"{what} must be integer ids, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ShapeError(f"{what} must be 1-D, got shape {a.shape}")
    if a.dtype.kind == "i":  # a negative id is its two's complement, as the store reads it
        a = a.astype(np.int64, copy=False).view(np.uint64)
    return a.astype(np.uint64, copy=False)


def requests_from_batch(
    batch: Mapping[str, Any], tables: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray, bool]], int]:
    """Turns ``{table: ids}`` into request-major keys and offsets.

    Each value is either a 1-D array of ``B`` ids (one per request) or a bag
    ``(values, offsets)`` with ``B`` (or ``B + 1``) offsets. Returns ``(tables, ids, offsets,
    where, B)``: key ``j`` is id ``ids[j]`` (``uint64``, any 64-bit id) of table number
    ``tables[j]`` (``uint16``, the index in ``tables``), and ``where[t] = (request index,
    position in the keys, is_bag)`` per element of table ``t``'s ids.
    """
    if not isinstance(batch, Mapping):
        raise InvalidArgumentError(f"a batch is a dict {{table: ids}}, got {type(batch).__name__}")
    unknown = [k for k in batch if k not in tables]
    if unknown:
        raise TableNotFoundError(f"tables {unknown} are not in this cache (it has {list(tables)})")
    missing = [t for t in tables if t not in batch]
    if missing:
        raise InvalidArgumentError(f"a request needs every cached table; missing {missing}")
    counts, values, bags = [], [], []
    b = None
    for name in tables:
        v = batch[name]
        if isinstance(v, tuple):
            vals = _ids(v[0], f"{name} values")
            offs = np.asarray(v[1], dtype=np.int64)
            if offs.ndim != 1:
                raise ShapeError(f"{name} offsets must be 1-D, got shape {offs.shape}")
            ends = (
                offs[1:] if offs.size and offs[-1] == vals.size else np.append(offs[1:], vals.size)
            )
            starts = offs if ends.size == offs.size else offs[:-1]
            if starts.size and (starts[0] != 0 or np.any(ends < starts)):
                raise ShapeError(f"{name} offsets must start at 0 and not decrease")
            c = ends - starts
            bags.append(True)
        else:
            vals = _ids(v, name)
            c = np.ones(vals.size, dtype=np.int64)
            bags.append(False)
        if b is None:
            b = c.size
        elif c.size != b:
            raise ShapeError(
                f"every table needs the same number of requests: {name} has {c.size}, expected {b}"
            )
        counts.append(c)
        values.append(vals)
    assert b is not None
    if b == 0:
        raise ShapeError("a batch needs at least one request, got 0")
    per_req = np.sum(counts, axis=0)
    if np.any(per_req == 0):
        raise ShapeError(f"request {int(np.argmin(per_req))} has no ids in any table")
    offsets = np.zeros(b + 1, dtype=np.uint64)
    np.cumsum(per_req, out=offsets[1:])
    table_of = np.empty(int(offsets[-1]), dtype=np.uint16)
    ids = np.empty(int(offsets[-1]), dtype=np.uint64)
    prefix = np.zeros(b, dtype=np.int64)
    where = []
    for t, (vals, c, bag) in enumerate(zip(values, counts, bags, strict=True)):
        req = np.repeat(np.arange(b), c)
        start = np.cumsum(c) - c
        within = np.arange(vals.size) - start[req]
        pos = offsets[:-1].astype(np.int64)[req] + prefix[req] + within
        table_of[pos] = t
        ids[pos] = vals
        prefix += c
        where.append((req, pos, bag))
    return table_of, ids, offsets, where, b


class InferenceCache:
    """A read-through inference cache over tables of a :class:`~embstore.Store`.

    Args:
        store: the backing store (its tables hold the exact fp32 rows).
        tables: the tables of a request, in order; all must share ``embedding_dim``.
        memory_budget_bytes: everything counted — rows, policy metadata, indexes, L3.
        policy: the replacement policy of every tier (:data:`POLICIES`). ``group_assoc``
            (the default): the group score plus a hit counter, set-associative, 10 B of
            metadata per entry (and 1 B for its key's table in a cache of 2-256 tables);
            ``group_lfu``: the same score fully associative (26-31 B an entry; better at
            equal entries, worse at equal bytes); ``lru``, ``lfu``; ``ev_lfu_paper`` (the
            paper's EV-LFU as its artifact runs it: no pinning, no aging, flush 0.95/0.30; an
            ablation, 28-31 B an entry). ``ev_arc`` is an evaluator-only ablation (its ghost
            entries cannot hold rows): :func:`evaluate` takes it, this class refuses it.
        tiers: ``{codec: share}`` for L1 then L2 (dict order), shares summing to at most 1;
            codecs from :data:`CODECS` (``f32``, ``f16``, ``int8``, ``int4``). Default
            (:data:`DEFAULT_TIERS`): a quarter of the budget for exact f32 rows (L1), three
            quarters for 4-bit rows (L2, ~5x the rows per byte at D 16), measured to cost at
            most 0.013 % relative PR-AUC (bound 0.2 %) while holding 1.9 to 3.9 times the
            perfect hits of f32 rows at a 5 % budget (docs/cache.md, "Default tiers"); rows
            served from L2 are then ``decode(encode(row))``. ``{"f32": 1.0}`` keeps every
            cached row exact.
        surrogates: ``{table: Surrogates}`` from :func:`build_surrogates`, or ``None``. A build
            held in memory costs 18 B a row of the budget (taken first; a budget it does not
            leave room in is an ``InvalidArgumentError``); one opened from disk
            (:meth:`Surrogates.open`, or ``build_surrogates(..., directory=...)``) costs 8 B
            per 227 rows, and L3 reads a 4 KiB block of it for each key it is fed.
        surrogate_share: share of the budget for L3 (its map, and the filler's queues) when
            surrogates are given.
        max_approx_per_request: most surrogate rows served in one request.
        max_surrogate_dist: largest stored surrogate distance served.
        demote: move L1 victims into L2 (a victim cache, no I/O).
        shards: independent shards for concurrent callers; 1 (default) is deterministic.
        policy_params: policy parameters, e.g. ``{"age_alpha": 2.0, "pin_request": True}``;
            ``group_assoc`` adapts its replacement rule by default, ``{"rule": "group"}``
            (or ``"group_admission"``, ``"clock"``) fixes one (docs/cache.md).
        on_miss: what the store returns for an id it lacks (``zeros``, ``init`` or ``error``).
        l3_fill: how L3 reads builds on disk: ``background`` (default; a filler thread reads
            blocks off the request path, and what it finds enters L3 on a later lookup or at
            :meth:`sync_l3`) or ``inline`` (the request that evicts a key reads its block:
            deterministic, results equal those of the build in memory).

    Rows returned from L1/L2 are ``decode(encode(row))`` of the tier's codec; rows from the
    store are exact; surrogate rows are a neighbour's. The cache is for serving a fixed
    checkpoint: after the store's rows change, call :meth:`clear`.
    """

    def __init__(
        self,
        store: Any,
        tables: Sequence[str],
        memory_budget_bytes: int,
        policy: str = "group_assoc",
        tiers: Mapping[str, float] | None = None,
        surrogates: Mapping[str, Surrogates] | None = None,
        *,
        surrogate_share: float = 0.04,
        max_approx_per_request: int = 2,
        max_surrogate_dist: float = float("inf"),
        demote: bool = True,
        shards: int = 1,
        policy_params: Mapping[str, Any] | None = None,
        on_miss: str = "zeros",
        l3_fill: str = "background",
    ):
        if isinstance(tables, str) or not tables:
            raise InvalidArgumentError("tables must be a non-empty list of table names")
        # the configuration, for an empty copy (_fresh; evaluate() scores one)
        self._config: dict[str, Any] = {
            "store": store,
            "tables": list(tables),
            "memory_budget_bytes": memory_budget_bytes,
            "policy": policy,
            "tiers": None if tiers is None else dict(tiers),
            "surrogates": None if surrogates is None else dict(surrogates),
            "surrogate_share": surrogate_share,
            "max_approx_per_request": max_approx_per_request,
            "max_surrogate_dist": max_surrogate_dist,
            "demote": demote,
            "shards": shards,
            "policy_params": None if policy_params is None else dict(policy_params),
            "on_miss": on_miss,
            "l3_fill": l3_fill,
        }
        self.tables = list(tables)
        if len(set(self.tables)) != len(self.tables):
            raise InvalidArgumentError(f"tables must be distinct, got {self.tables}")
        if isinstance(memory_budget_bytes, bool) or not isinstance(
            memory_budget_bytes, int | np.integer
        ):
            raise InvalidArgumentError(
                f"memory_budget_bytes must be an int, got {memory_budget_bytes!r}"
            )
        if memory_budget_bytes <= 0:
            raise InvalidArgumentError(
                f"memory_budget_bytes must be positive, got {memory_budget_bytes}"
            )
        tiers = dict(DEFAULT_TIERS) if tiers is None else dict(tiers)
        native_tables = [store.table(name).native() for name in self.tables]
        sur = None
        if surrogates:
            unknown = [k for k in surrogates if k not in self.tables]
            if unknown:
                raise TableNotFoundError(
                    f"surrogates for tables {unknown} that the cache does not hold"
                )
            sur = [surrogates[t].native() if t in surrogates else None for t in self.tables]
        self._inner = _native.InferenceCache(
            native_tables,
            int(memory_budget_bytes),
            policy,
            [(str(k), float(v)) for k, v in tiers.items()],
            policy_params=dict(policy_params) if policy_params else None,
            surrogates=sur,
            surrogate_share=float(surrogate_share),
            max_approx_per_request=int(max_approx_per_request),
            max_surrogate_dist=float(max_surrogate_dist),
            demote=bool(demote),
            shards=int(shards),
            on_miss=on_miss,
            l3_fill=l3_fill,
        )
        self.embedding_dim: int = self._inner.dim

    def __repr__(self) -> str:
        s = self._inner.stats()
        return (
            f"InferenceCache(tables={self.tables}, budget={s['memory_budget_bytes']} B, "
            f"entries={sum(t['capacity'] for t in s['tiers'])})"
        )

    def lookup(
        self, batch: Mapping[str, Any], *, bag_mode: str = "mean", return_sources: bool = False
    ) -> dict[str, np.ndarray] | tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Serves a batch of requests: ``{table: ids}`` with ``B`` ids per table (or a bag
        ``(values, offsets)`` per table); ids are any int64 or uint64 (the store's raw 64-bit
        ids, a negative int64 as its two's complement). Returns ``{table: float32[B, D]}``
        (bags pooled by ``bag_mode``: ``mean`` or ``sum``) and, with ``return_sources``,
        ``{table: uint8[n]}`` per id (indices into :data:`SOURCES`). Releases the GIL.
        """
        if bag_mode not in ("mean", "sum"):
            raise InvalidArgumentError(f"bag_mode must be 'mean' or 'sum', got {bag_mode!r}")
        fast = self._one_hot(batch, return_sources)
        if fast is not None:
            return fast
        table_of, ids, offsets, where, b = requests_from_batch(batch, self.tables)
        rows = np.empty((ids.size, self.embedding_dim), dtype=np.float32)
        src = np.empty(ids.size, dtype=np.uint8) if return_sources else None
        self._inner.lookup(table_of, ids, offsets, rows, src)
        out: dict[str, np.ndarray] = {}
        sources: dict[str, np.ndarray] = {}
        for name, (req, pos, bag) in zip(self.tables, where, strict=True):
            if not bag:
                out[name] = rows[pos]
            else:
                pooled = np.zeros((b, self.embedding_dim), dtype=np.float32)
                np.add.at(pooled, req, rows[pos])
                if bag_mode == "mean":
                    n = np.bincount(req, minlength=b).astype(np.float32)
                    pooled /= np.maximum(n, 1.0)[:, None]
                out[name] = pooled
            if src is not None:
                sources[name] = src[pos]
        return (out, sources) if return_sources else out

    def _one_hot(self, batch: Mapping[str, Any], return_sources: bool) -> Any:
        """The common case with no numpy work: one id per table per request, given as integer
        numpy arrays (or torch tensors) of one length, passed to the native side as int64 (a
        uint64 id past 2**63 wraps to the same 64 bits). ``None``: take the general path (which
        also produces the errors)."""
        if not isinstance(batch, Mapping) or len(batch) != len(self.tables):
            return None
        cols = []
        for name in self.tables:
            v = batch.get(name)
            if hasattr(v, "detach"):
                v = v.detach().cpu().numpy()
            if not isinstance(v, np.ndarray) or v.ndim != 1:
                return None
            if v.dtype != np.int64:
                if v.dtype.kind not in "iu":
                    return None
                v = v.astype(np.int64)  # uint64 wraps: the same 64 bits
            cols.append(v)
        b = cols[0].size
        if b == 0 or any(c.size != b for c in cols):
            return None
        rows = np.empty((b, len(cols), self.embedding_dim), dtype=np.float32)
        src = np.empty((b, len(cols)), dtype=np.uint8) if return_sources else None
        self._inner.lookup_columns(
            cols, rows.reshape(b * len(cols), -1), None if src is None else src.reshape(-1)
        )
        out = {name: rows[:, i] for i, name in enumerate(self.tables)}
        if src is None:
            return out
        return out, {name: src[:, i] for i, name in enumerate(self.tables)}

    def _fresh(self) -> InferenceCache:
        """A new, empty cache of this one's configuration (same store, tables, budget,
        policy, tiers, surrogate builds and options); this one is left as it is."""
        return InferenceCache(**self._config)

    def native(self) -> Any:
        """The native cache this object wraps, for embstore's own modules (the evaluator
        scores the whole system through it); not for use outside embstore."""
        return self._inner

    def stats(self) -> dict[str, Any]:
        """Counters and memory: ``perfect_hits`` (exact), ``served_perfect_hits`` (with
        surrogates), their rates, per-tier hits, ``misses_per_request`` (a histogram of
        store reads per request), ``bypasses``, the codec and bytes of every tier, and
        ``default_tiers`` (whether the tiers are :data:`DEFAULT_TIERS`, lossy in L2)."""
        out = dict(self._inner.stats())
        out["default_tiers"] = self._config["tiers"] is None
        return out

    def reset_stats(self) -> None:
        """Zero the counters; cached rows stay."""
        self._inner.reset_stats()

    def clear(self) -> None:
        """Drop every cached row (call after the store's rows change)."""
        self._inner.clear()

    def sync_l3(self) -> None:
        """Wait for the L3 filler's reads of surrogate builds on disk and move what it found
        into L3 (a no-op without one). Calling it after every lookup makes a cache fed in the
        background behave exactly as ``l3_fill="inline"``."""
        self._inner.sync_l3()

    @property
    def capacity(self) -> int:
        """Entries L1 and L2 hold together."""
        return int(self._inner.capacity)


class Surrogates:
    """One table's surrogate map (id → nearest popular neighbour and its distance), from
    :func:`build_surrogates`. Save it next to the checkpoint it was built from; serve it
    from disk with :meth:`open` (8 B in memory per 227 rows) or from memory with
    :meth:`load` (18 B a row), both counted in the cache's budget."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any):
        self._inner = inner

    def native(self) -> Any:
        """The native surrogate map this object wraps, which :class:`InferenceCache` hands to
        the native cache; not for use outside embstore."""
        return self._inner

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.on_disk else ""
        return (
            f"Surrogates(rows={len(self)}, coverage={self.coverage:.3f}, "
            f"version={self.version}{where})"
        )

    @property
    def on_disk(self) -> bool:
        """Whether it is read from its file, a block per lookup (:meth:`open`)."""
        return self._inner.path is not None

    @property
    def path(self) -> str | None:
        """The file it reads, when on disk."""
        p = self._inner.path
        return None if p is None else os.fspath(p)

    @property
    def memory_bytes(self) -> int:
        """Bytes it holds in memory (what a cache counts against its budget)."""
        return int(self._inner.heap_bytes())

    @property
    def coverage(self) -> float:
        """Share of rows that have a surrogate within the distance threshold."""
        return float(self._inner.coverage)

    @property
    def version(self) -> int:
        """The table checkpoint version the build came from."""
        return int(self._inner.version)

    def get(self, id: int) -> tuple[int, float] | None:
        """``(surrogate id, distance)`` for ``id``, or ``None`` (on disk: one block read)."""
        return self._inner.get(int(id))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temp file + rename), every 4 KiB block checksummed."""
        self._inner.save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Surrogates:
        """Read a whole file written by :meth:`save` into memory; a damaged file raises
        ``CorruptionError``."""
        return cls(_native.Surrogates.load(os.fspath(path)))

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Surrogates:
        """Open a file written by :meth:`save` to be read a 4 KiB block per lookup (page
        cache bypassed where the file system allows). Only the header and the block index
        are read now; a damaged block raises ``CorruptionError`` when read (in a cache:
        counted in ``stats()["l3_read_errors"]``, and serving goes on)."""
        return cls(_native.Surrogates.open(os.fspath(path)))


def build_surrogates(
    store: Any,
    tables: Sequence[str],
    *,
    counts: Mapping[str, Mapping[int, int] | tuple[np.ndarray, np.ndarray]] | None = None,
    k: int = 10,
    metric: str = "cosine",
    max_dist: float = 0.5,
    version: int = 0,
    directory: str | os.PathLike[str] | None = None,
) -> dict[str, Surrogates]:
    """Builds surrogates for each of ``tables`` from the store's current rows (exact kNN
    within each table). ``counts[table]`` gives access counts ``(ids, counts)`` from a window
    disjoint from the one you will evaluate on: the surrogate is the most-accessed neighbour
    within ``max_dist`` (ties to the nearest); without counts, the nearest. ``version`` names
    the checkpoint the rows came from. With ``directory``, each build is saved to
    ``directory/<table>.surr`` and returned opened from disk (:meth:`Surrogates.open`);
    without, the builds are returned in memory."""
    out = {}
    for name in tables:
        chunks = list(store.table(name).export())
        if chunks:
            ids = np.concatenate([c.ids for c in chunks]).astype(np.uint64)
            rows = np.ascontiguousarray(
                np.concatenate([c.values for c in chunks]), dtype=np.float32
            )
        else:
            d = store.table(name).embedding_dim
            ids, rows = np.zeros(0, np.uint64), np.zeros((0, d), np.float32)
        c = None
        if counts is not None and name in counts:
            spec = counts[name]
            if isinstance(spec, tuple):
                cid, cnt = (np.asarray(x) for x in spec)
            else:
                cid = np.fromiter(spec.keys(), dtype=np.int64, count=len(spec))
                cnt = np.fromiter(spec.values(), dtype=np.int64, count=len(spec))
            order = np.argsort(ids)
            pos = np.searchsorted(ids[order], cid.astype(np.uint64))
            ok = (pos < ids.size) & (ids[order][np.minimum(pos, max(ids.size - 1, 0))] == cid)
            c = np.zeros(ids.size, dtype=np.uint64)
            c[order[pos[ok]]] = cnt[ok]
        out[name] = Surrogates(
            _native.build_surrogates(
                ids, rows, c, k=k, metric=metric, max_dist=max_dist, version=version
            )
        )
        if directory is not None:
            path = pathlib.Path(directory) / f"{name}.surr"
            path.parent.mkdir(parents=True, exist_ok=True)
            out[name].save(path)
            out[name] = Surrogates.open(path)
    return out


def _as_trace(trace: Any) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(trace, "keys") and isinstance(getattr(trace, "keys", None), np.ndarray):
        trace = trace.keys
    if isinstance(trace, np.ndarray):
        if trace.ndim != 2:
            raise ShapeError(f"a dense trace is [N, G], got shape {trace.shape}")
        if trace.dtype != np.uint64:
            raise InvalidArgumentError(f"trace keys must be uint64, got {trace.dtype}")
        n, g = trace.shape
        if g == 0:
            raise ShapeError("requests must not be empty (G = 0)")
        return np.ascontiguousarray(trace).reshape(-1), np.arange(0, n * g + 1, g, dtype=np.uint64)
    if isinstance(trace, Sequence):
        reqs = [np.asarray(r, dtype=np.uint64).reshape(-1) for r in trace]
        if any(r.size == 0 for r in reqs):
            raise ShapeError("requests must not be empty")
        offsets = np.zeros(len(reqs) + 1, dtype=np.uint64)
        np.cumsum([r.size for r in reqs], out=offsets[1:])
        keys = np.concatenate(reqs) if reqs else np.zeros(0, np.uint64)
        return keys, offsets
    raise InvalidArgumentError(
        "trace must be a uint64 [N, G] array or a list of per-request arrays, "
        f"got {type(trace).__name__}"
    )


def _tag_bytes(num_tables: int) -> int:
    """A cache's table tag per slot, counted as metadata (as the native ``Level`` does)."""
    return 0 if num_tables <= 1 else 1 if num_tables <= 256 else 2


def _entries_for_bytes(
    policy: str,
    capacity_bytes: int,
    dim: int,
    keys: np.ndarray,
    policy_params: Mapping[str, Any] | None,
) -> int:
    """Entries of ``policy`` (ours) that fp32 rows of ``dim`` values and the policy's measured
    metadata fit in ``capacity_bytes``, for a cache of the trace's tables.

    Policies an :class:`InferenceCache` holds: the capacity of such a cache of that budget
    (fp32 tier only, no surrogates), over a scratch store of the trace's tables, so the two
    agree by construction. The evaluator-only ones (``ev_arc``, :data:`STORE_POLICIES`): the
    same rule with the metadata measured on the policy filled to capacity, plus the tag.
    """
    num_tables = max(1, int(np.unique(keys >> np.uint64(48)).size))
    params = dict(policy_params) if policy_params else None
    name = policy.replace("-", "_")
    if name in POLICIES and name != "ev_arc":
        from embstore import Store

        store = Store()
        tables = [f"t{i}" for i in range(num_tables)]
        for t in tables:
            store.create_table(t, embedding_dim=int(dim))
        cache = InferenceCache(
            store, tables, int(capacity_bytes), policy=name, policy_params=params
        )
        return cache.capacity
    row, tag = 4 * int(dim), _tag_bytes(num_tables)

    def metadata(cap: int) -> float:  # measured bytes an entry, the policy full
        fill = np.arange(cap, dtype=np.uint64)
        stops = np.arange(cap + 1, dtype=np.uint64)  # one key a request
        r = _native.evaluate(fill, stops, name, cap, mode="online", policy_params=params)
        return float(r["metadata_bytes_per_entry"]) + tag

    cap = max(1, int(capacity_bytes // (row + 32)))
    cap = max(1, int(capacity_bytes // (row + math.ceil(metadata(cap)))))
    while cap > 1 and cap * row + math.ceil(metadata(cap) * cap) > capacity_bytes:
        cap = int(cap * 0.99)
    return cap


def evaluate(
    trace: Any,
    policy: str | InferenceCache | Any = "group_lfu",
    capacity: int | float | None = None,
    mode: str = "prefix",
    *,
    policy_params: Mapping[str, Any] | None = None,
    capacity_bytes: int | None = None,
    dim: int | None = None,
    warm_frac: float = 0.5,
    in_place: bool = False,
) -> dict[str, Any]:
    """The one perfect-hit evaluator.

    Args:
        trace: uint64 ``[N, G]`` table-qualified keys (``table << 48 | id``), a list of
            per-request key arrays, or a :class:`~embstore.cache.traces.Trace`.
        policy: one of :data:`POLICIES` (lowercase); one of :data:`STORE_POLICIES`
            (``"lru_lfu"``: the training store's default eviction, LRU in front of LFU, run
            as a cache of ``capacity`` keys; no ``policy_params``); a libCacheSim policy name
            as libCacheSim spells it (``"LRU"``, ``"S3FIFO"``, ``"ARC"``, … when
            ``libcachesim`` is installed); an object with ``access(keys) -> flags``;
            or an :class:`InferenceCache` (the whole system: an empty copy of it, same
            configuration, is evaluated, so the cache given is not touched and two calls
            agree; ``capacity``, ``capacity_bytes``, ``dim`` and ``policy_params`` are refused,
            the cache's own are used). ``in_place=True`` runs the trace through the cache given
            instead, from the state it is in and leaving it in the state the run ends in (a
            fast native way to warm a cache; its figures then depend on what ran before).
        capacity: entries (int), or a fraction of the trace's unique keys (float in (0, 1)).
        capacity_bytes, dim: alternatively, a byte budget for fp32 rows of ``dim`` values plus
            the policy's own metadata per entry. Ours: measured, the entries an
            :class:`InferenceCache` of that policy and budget over the trace's tables holds
            (``ev_arc`` and :data:`STORE_POLICIES`: their metadata measured full, plus the
            cache's table tag); libCacheSim and other objects: our 28 B, as if the policy ran
            inside our store.
        mode: ``online`` (one cold pass), ``prefix`` (warm on the first ``warm_frac``, count
            the rest; the primary figure) or ``replay`` (warm on all, count a second pass).

    libCacheSim's randomized policies (LeCaR, Cacheus) run in a fresh Python process each, so
    their figures do not depend on what ran before; every libCacheSim result carries
    ``find_get_disagreements`` (keys whose ``get`` contradicted ``find``; their hits follow
    ``get``; 0 for a sound policy).

    Returns a dict with ``perfect_hit``, ``served_perfect_hit``, ``individual_hit``,
    ``compulsory_bound``, ``misses_per_request`` and more.
    """
    keys, offsets = _as_trace(trace)
    if in_place and not isinstance(policy, InferenceCache):
        raise InvalidArgumentError("in_place=True is for an InferenceCache")
    if isinstance(policy, InferenceCache):
        given = {
            "capacity": capacity,
            "capacity_bytes": capacity_bytes,
            "dim": dim,
            "policy_params": policy_params,
        }
        for arg, value in given.items():
            if value is not None:
                raise InvalidArgumentError(
                    f"{arg} cannot be given with an InferenceCache: the cache's own "
                    "configuration is evaluated (build one with the settings you want)"
                )
        cache = policy if in_place else policy._fresh()
        return cache.native().evaluate(keys, offsets, mode=mode, warm_frac=warm_frac)
    # Ours are lowercase (lru, group_lfu); libCacheSim's are capitalised (LRU, S3FIFO): the
    # case decides, so "LRU" is libCacheSim's LRU and "lru" ours.
    ours = (*POLICIES, *STORE_POLICIES)
    is_ours = isinstance(policy, str) and policy.replace("-", "_") in ours
    if capacity_bytes is not None:
        if capacity is not None:
            raise InvalidArgumentError("give capacity or capacity_bytes, not both")
        if not dim or dim < 1:
            raise InvalidArgumentError("capacity_bytes needs dim (the row length)")
        if is_ours:
            capacity = _entries_for_bytes(policy, capacity_bytes, dim, keys, policy_params)
        else:
            capacity = int(capacity_bytes // (4 * dim + _METADATA_PER_ENTRY))
    if capacity is None:
        raise InvalidArgumentError("capacity (entries or a fraction of unique keys) is required")
    if isinstance(capacity, float):
        if not 0.0 < capacity < 1.0:
            raise InvalidArgumentError(f"a fractional capacity must be in (0, 1), got {capacity}")
        capacity = max(1, round(capacity * np.unique(keys).size))
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
        raise InvalidArgumentError(f"capacity must be a positive int, got {capacity!r}")
    if isinstance(policy, str) and not is_ours:
        from embstore.cache import _libcachesim

        peer = _libcachesim.LibCacheSimPolicy(policy, int(capacity))  # checks name and size
        if peer.name in _libcachesim.RANDOMIZED:
            return _libcachesim.evaluate_isolated(
                keys,
                offsets,
                peer.name,
                int(capacity),
                mode=mode,
                warm_frac=warm_frac,
                policy_params=policy_params,
            )
        return _libcachesim.evaluate_policy(
            keys, offsets, peer, mode=mode, warm_frac=warm_frac, policy_params=policy_params
        )
    return _native.evaluate(
        keys,
        offsets,
        policy,
        int(capacity),
        mode=mode,
        policy_params=dict(policy_params) if policy_params else None,
        warm_frac=warm_frac,
    )
