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

LeCaR and Cacheus (:data:`RANDOMIZED`) draw from libCacheSim's one process-wide random
generator, which libcachesim 0.3.5 does not let Python seed: in one process a run depends on
the runs made before it. :func:`embstore.cache.evaluate` therefore runs each of them in a fresh
Python process (:func:`evaluate_isolated`), so its figures do not depend on what ran before; a
:class:`LibCacheSimPolicy` driven directly shares the generator of its process.

``access`` guards against peers whose ``find`` and ``get`` disagree (libCacheSim's ThreeLCache
``find`` reports keys its ``get`` then misses): see :meth:`LibCacheSimPolicy.access` and
:attr:`LibCacheSimPolicy.find_get_disagreements`.

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
import os
import pathlib
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from embstore.errors import DTypeError, InvalidArgumentError, ShapeError

__all__ = ["RANDOMIZED", "LibCacheSimPolicy", "available", "evaluate_isolated"]

# the offered policies, in report order; each is the libcachesim class of that name
_NAMES = (
    "LRU", "LFU", "Clock", "ARC", "LIRS", "TwoQ", "S3FIFO", "Sieve", "WTinyLFU", "LeCaR", "Cacheus",
)  # fmt: skip
_ALIASES = {"2q": "TwoQ", "tinylfu": "WTinyLFU"}
#: Policies that draw from libCacheSim's process-wide, unseedable random generator.
RANDOMIZED: frozenset[str] = frozenset({"LeCaR", "Cacheus"})
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
        #: keys whose ``get`` disagreed with a ``find`` made just before it (see :meth:`access`)
        self.find_get_disagreements: int = 0

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

        Guard: right before each ``get`` the key is probed again, and where that ``find`` and
        the ``get`` disagree (a peer whose ``find`` reports keys its ``get`` misses, as
        libCacheSim's ThreeLCache does) the key's flag is what ``get`` did and
        :attr:`find_get_disagreements` counts it. A sound policy never disagrees; a key evicted
        by an earlier key of the same request is not a disagreement (the second probe misses
        it too) and keeps its flag.
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
        fixed = None
        for key in ids:
            request.obj_id = key
            before = find(request, False) is not None
            if get(request) != before:  # find and get disagree on this key, now
                self.find_get_disagreements += 1
                if fixed is None:
                    fixed = {}
                fixed.setdefault(key, not before)  # what get() did decides
        if fixed is not None:
            flags = [fixed.get(key, flag) for key, flag in zip(ids, flags, strict=True)]
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


def evaluate_policy(
    keys: np.ndarray,
    offsets: np.ndarray,
    policy: LibCacheSimPolicy,
    *,
    mode: str,
    warm_frac: float,
    policy_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The native evaluator on ``policy`` in this process, with its
    ``find_get_disagreements`` (over the whole run, warm-up included) in the result."""
    from embstore import _native

    result = _native.evaluate(
        keys,
        offsets,
        policy,
        policy.capacity,
        mode=mode,
        policy_params=dict(policy_params) if policy_params else None,
        warm_frac=warm_frac,
    )
    result["find_get_disagreements"] = policy.find_get_disagreements
    return result


def evaluate_isolated(
    keys: np.ndarray,
    offsets: np.ndarray,
    name: str,
    capacity: int,
    *,
    mode: str,
    warm_frac: float,
    policy_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`evaluate_policy` of ``LibCacheSimPolicy(name, capacity)`` in a fresh Python
    process (``sys.executable``, this ``embstore`` first on its path), so libCacheSim's random
    generator starts from the same state whatever ran before in this one. The trace travels
    through a temporary directory; the child's errors are raised here."""
    root = str(pathlib.Path(__file__).resolve().parents[2])  # the folder holding embstore/
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    args = {
        "name": name,
        "capacity": int(capacity),
        "mode": mode,
        "warm_frac": float(warm_frac),
        "policy_params": dict(policy_params) if policy_params else None,
    }
    with tempfile.TemporaryDirectory(prefix="embstore-libcachesim-") as tmp:
        np.savez(os.path.join(tmp, "trace.npz"), keys=keys, offsets=offsets)
        with open(os.path.join(tmp, "args.pkl"), "wb") as f:
            pickle.dump(args, f)
        code = "from embstore.cache._libcachesim import _isolated_main; _isolated_main()"
        proc = subprocess.run(
            [sys.executable, "-c", code, tmp], env=env, capture_output=True, text=True
        )
        out = os.path.join(tmp, "result.pkl")
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                f"the isolated libCacheSim {name} evaluation ended with status "
                f"{proc.returncode}: {proc.stderr[-2000:]}"
            )
        with open(out, "rb") as f:
            result = pickle.load(f)
    if isinstance(result, BaseException):
        raise result
    return result


def _isolated_main() -> None:
    """The child of :func:`evaluate_isolated`: ``sys.argv[1]`` is its directory."""
    tmp = sys.argv[1]
    with open(os.path.join(tmp, "args.pkl"), "rb") as f:
        args = pickle.load(f)
    try:
        with np.load(os.path.join(tmp, "trace.npz")) as z:
            keys, offsets = z["keys"], z["offsets"]
        policy = LibCacheSimPolicy(args["name"], args["capacity"])
        result: Any = evaluate_policy(
            keys,
            offsets,
            policy,
            mode=args["mode"],
            warm_frac=args["warm_frac"],
            policy_params=args["policy_params"],
        )
    except Exception as e:  # handed to the parent, which raises it
        result = e
    with open(os.path.join(tmp, "result.pkl"), "wb") as f:
        pickle.dump(result, f)
