"""libCacheSim's replacement policies as baselines for the perfect-hit evaluator.

:class:`LibCacheSimPolicy` wraps one libCacheSim cache (``pip install libcachesim``; built
against 0.3.5) behind the evaluator's interface: ``access(keys) -> flags`` once per request.
Objects have size 1, so ``capacity`` counts keys. Each call is *probe-first*:

1. ``find(key, update_cache=False)`` for every key: the flags say which keys were resident
   before this request changed anything (a key repeated in a request gets the same flag);
2. ``get(key)`` for every key in order: hits update the policy, misses are admitted.

Every request gets the next ``clock_time`` (1, 2, …); libCacheSim counts its own ``n_req``
per ``get``.

Policies (:func:`available`) and what this module sets for them:

=========  =================================================================================
LRU, LFU,  no parameters (Clock: libCacheSim's default 1-bit counter, ``init_freq=0``).
Clock,
ARC, Sieve
LIRS       none; needs ``capacity >= 2`` (at 1 it admits nothing). libCacheSim's LIRS can
           hold a key or two beyond ``capacity`` for a while (``find`` sees them, ``len()``
           does not): up to 2 on uniform random traces, rarely 1 on MovieLens.
TwoQ       ``a_in_size_ratio=0.25``, ``a_out_size_ratio=0.5``; where ``capacity / 4 < 1``
           the Ain queue is raised to one key (at 0 keys 2Q admits nothing);
           ``capacity >= 2``.
S3FIFO     ``small_size_ratio=0.1``, ``ghost_size_ratio=0.9``, ``move_to_main_threshold=2``;
           the small FIFO must hold 2 keys (below that libCacheSim admits nothing, and at 0
           it ends the process), so it is raised to 2 where ``capacity / 10 < 2``;
           ``capacity >= 3``.
WTinyLFU   ``main_cache="SLRU"``, ``window_size=0.01``; the window is raised to one key
           where ``capacity / 100 < 1`` (as Caffeine sizes it; at 0 libCacheSim admits nothing);
           ``capacity >= 6`` (the main SLRU's 1:4 segments need 5 keys).
LeCaR      ``update_weight=True``, ``lru_weight=0.5`` (libCacheSim's defaults).
Cacheus    no parameters; needs ``capacity >= 2``.
=========  =================================================================================

LeCaR and Cacheus draw from libCacheSim's one process-wide random generator, which cannot
be seeded from Python: a run is reproducible, but depends on the LeCaR or Cacheus runs made
before it in the same process. Run them in a fixed order, or one per process.

``params`` holds what was passed for each instance. Any other keyword argument of the
libCacheSim class (e.g. ``window_size=0.05``) can be passed through; libCacheSim ends the
process on some invalid values, so the sizes above are checked first.

Not offered (asking for them raises ``InvalidArgumentError`` with the reason):

- ``ClockPro``: libCacheSim 0.3.5's never admits a key once its cold set is full (its
  ``can_insert`` refuses before ``evict`` can run), so it freezes on the first
  ``init_ratio_cold * capacity`` keys it sees.
- ``CAR``: in the native module (``CAR_init``) but without a Python class, and its
  ``find(update_cache=False)`` crashes the process (segmentation fault) on the ML traces.
- ``Belady``: it needs each request's next access time, which ``access`` does not carry.

Example::

    >>> p = LibCacheSimPolicy("LRU", capacity=2)
    >>> [p.access(np.array(r, dtype=np.uint64)).tolist() for r in ([1, 2], [1, 3], [2, 1])]
    [[False, False], [True, False], [False, True]]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from embstore.errors import DTypeError, InvalidArgumentError, ShapeError

__all__ = ["LibCacheSimPolicy", "available"]

# the offered policies, in report order; each is the libcachesim class of that name
_NAMES = (
    "LRU", "LFU", "Clock", "ARC", "LIRS", "TwoQ", "S3FIFO", "Sieve", "WTinyLFU", "LeCaR", "Cacheus",
)  # fmt: skip
_ALIASES = {"2q": "TwoQ", "tinylfu": "WTinyLFU"}
_MIN_CAPACITY = {"LIRS": 2, "TwoQ": 2, "Cacheus": 2, "S3FIFO": 3, "WTinyLFU": 6}
_NOT_OFFERED = {
    "clockpro": "libCacheSim 0.3.5's ClockPro stops admitting keys once its cold set is full "
    "(can_insert refuses before evict runs), so it freezes on the first keys it sees",
    "car": "libCacheSim 0.3.5's CAR crashes the process in find(update_cache=False)",
    "belady": "Belady needs each request's next access time, which access() does not carry",
}


def _libcachesim() -> Any:
    try:
        import libcachesim
    except ImportError as e:
        raise ImportError(
            "libCacheSim baselines need the libcachesim package: pip install libcachesim"
        ) from e
    return libcachesim


def available() -> list[str]:
    """The policy names :class:`LibCacheSimPolicy` accepts (case and ``-``/``_`` do not matter).

    Raises ImportError when libcachesim is not installed.
    """
    lcs = _libcachesim()
    return [name for name in _NAMES if hasattr(lcs, name)]


def _canonical(name: str, names: list[str]) -> str:
    key = name.lower().replace("-", "").replace("_", "")
    if key in _NOT_OFFERED:
        raise InvalidArgumentError(f"{name!r} is not offered: {_NOT_OFFERED[key]}")
    for n in names:
        if n.lower() == key:
            return n
    if key in _ALIASES and _ALIASES[key] in names:
        return _ALIASES[key]
    raise InvalidArgumentError(f"unknown libCacheSim policy {name!r}; available: {names}")


def _sized_params(name: str, capacity: int, params: dict[str, Any]) -> dict[str, Any]:
    """Fill in the size parameters that libCacheSim's defaults leave at zero keys, and refuse
    sizes it cannot run (some end the process). libCacheSim truncates ``capacity * ratio``."""
    out = dict(params)
    if name == "TwoQ":
        out.setdefault("a_in_size_ratio", 0.25 if capacity >= 4 else 1.5 / capacity)
        if int(capacity * out["a_in_size_ratio"]) < 1:
            raise InvalidArgumentError(
                f"TwoQ's Ain queue must hold a key: capacity {capacity} x "
                f"a_in_size_ratio {out['a_in_size_ratio']} < 1"
            )
    elif name == "S3FIFO":
        out.setdefault("small_size_ratio", 0.1 if capacity >= 20 else 2.5 / capacity)
        small = int(capacity * out["small_size_ratio"])
        if small < 2 or small >= capacity:
            raise InvalidArgumentError(
                f"S3FIFO's small FIFO must hold 2 to {capacity - 1} keys, got {small} "
                f"(capacity {capacity} x small_size_ratio {out['small_size_ratio']})"
            )
    elif name == "WTinyLFU":
        out.setdefault("window_size", 0.01 if capacity >= 100 else 1.5 / capacity)
        window = int(capacity * out["window_size"])
        if window < 1 or capacity - window < 5:
            raise InvalidArgumentError(
                f"WTinyLFU's window must hold a key and its main SLRU 5, got {window} and "
                f"{capacity - window} (capacity {capacity} x window_size {out['window_size']})"
            )
    return out


class LibCacheSimPolicy:
    """One libCacheSim cache of ``capacity`` keys, driven probe-first per request.

    Args:
        name: a policy from :func:`available` (``"LRU"``, ``"s3fifo"``, ``"W-TinyLFU"``, …).
        capacity: keys the cache holds (every object has size 1).
        hashpower: log2 of the hash table's initial buckets; default
            ``ceil(log2(2 * capacity)) + 1`` (at least 4), room for ghost entries too.
        **params: keyword arguments of the libCacheSim class (see the module's table).

    Not thread-safe; one evaluator drives one instance.
    """

    def __init__(
        self, name: str, capacity: int, *, hashpower: int | None = None, **params: Any
    ) -> None:
        if not isinstance(name, str):
            raise DTypeError(f"name must be a str, got {type(name).__name__}")
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer):
            raise DTypeError(f"capacity must be an int, got {type(capacity).__name__}")
        lcs = _libcachesim()
        self.name: str = _canonical(name, available())
        self.capacity: int = int(capacity)
        least = _MIN_CAPACITY.get(self.name, 1)
        if self.capacity < least:
            raise InvalidArgumentError(
                f"{self.name} needs capacity >= {least} keys, got {self.capacity}"
            )
        if hashpower is None:
            hashpower = max(4, math.ceil(math.log2(2 * self.capacity)) + 1)
        if isinstance(hashpower, bool) or not isinstance(hashpower, int | np.integer):
            raise DTypeError(f"hashpower must be an int, got {type(hashpower).__name__}")
        if not 1 <= hashpower <= 30:
            raise InvalidArgumentError(f"hashpower must be in 1..30, got {hashpower}")
        self.hashpower: int = int(hashpower)
        self.params: dict[str, Any] = _sized_params(self.name, self.capacity, params)

        wrapper = getattr(lcs, self.name)(self.capacity, hashpower=self.hashpower, **self.params)
        # the wrapper's methods only forward to its native cache: call that directly
        self._cache = getattr(wrapper, "_cache", wrapper)
        self._find = self._cache.find
        self._get = self._cache.get
        # one reusable request: a Python attribute write is cheaper than a new object
        self._request = lcs.Request()
        self._request.obj_size = 1
        self._request.op = lcs.ReqOp.OP_GET
        self.requests: int = 0  #: ``access`` calls so far (the last request's ``clock_time``)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"LibCacheSimPolicy({self.name!r}, capacity={self.capacity}{extra})"

    def __len__(self) -> int:
        """Keys resident now, as libCacheSim counts them."""
        return int(self._cache.get_n_obj())

    def access(self, keys: np.ndarray) -> np.ndarray:
        """Serve one request: ``keys`` is ``uint64[G]`` (``int64`` is taken bit for bit).

        Returns ``bool[G]``: which keys were resident before this request changed anything.
        Then every key is accessed in order (hits promoted, misses admitted or not, as the
        policy decides).
        """
        if type(keys) is not np.ndarray or keys.dtype != np.uint64 or keys.ndim != 1:
            keys = _as_keys(keys)
        ids = keys.tolist()
        self.requests += 1
        request = self._request
        request.clock_time = self.requests
        find = self._find
        flags = []
        for key in ids:
            request.obj_id = key
            flags.append(find(request, False) is not None)
        get = self._get
        for key in ids:
            request.obj_id = key
            get(request)
        return np.array(flags, dtype=bool)


def _as_keys(keys: Any) -> np.ndarray:
    """``keys`` as ``uint64[G]``; signed ids are taken bit for bit (-1 is 2**64 - 1)."""
    arr = np.asarray(keys)
    if arr.size == 0 and arr.dtype.kind == "f":  # [] is float64 to numpy
        arr = arr.astype(np.uint64)
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"keys must be 1-D uint64, got {arr.ndim}-D {arr.dtype}")
    if arr.ndim != 1:
        raise ShapeError(f"keys must be 1-D uint64, got {arr.ndim}-D {arr.dtype}")
    if arr.dtype.kind == "i":
        return arr.astype(np.int64).view(np.uint64)
    return arr.astype(np.uint64)
