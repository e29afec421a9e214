"""Workloads the benchmarks share: Zipf-distributed ids and filling a table.

Zipf ids are drawn by an inverse CDF over ``rows`` ranks, ``P(rank = k) ∝ (k + 1) ** -a`` (any
``a > 0``, unlike ``numpy``'s ``zipf``, which needs ``a > 1`` and is unbounded), then mapped to
ids by a permutation so that hot ids are spread over the key space.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

_CDF: dict[tuple[float, int], np.ndarray] = {}


def zipf_cdf(a: float, rows: int) -> np.ndarray:
    """The CDF of Zipf(``a``) over ``rows`` ranks (``float64[rows]``, last entry 1), cached:
    a benchmark draws many batches from one distribution."""
    cdf = _CDF.get((a, rows))
    if cdf is None:
        cdf = np.arange(1, rows + 1, dtype=np.float64)
        np.power(cdf, -a, out=cdf)
        np.cumsum(cdf, out=cdf)
        cdf /= cdf[-1]
        _CDF[(a, rows)] = cdf
    return cdf


def zipf_ranks(rng: np.random.Generator, n: int, rows: int, a: float) -> np.ndarray:
    """``n`` 0-based ranks below ``rows``, ``P(rank = k) ∝ (k + 1) ** -a`` (inverse CDF)."""
    ranks = np.searchsorted(zipf_cdf(a, rows), rng.random(n), side="right")
    return np.minimum(ranks, rows - 1).astype(np.int64)


def zipf_ids(rng: np.random.Generator, a: float, rows: int, n: int, perm: np.ndarray) -> np.ndarray:
    """``n`` ids whose ranks follow Zipf(``a``) over ``rows``, ranks mapped to ids by ``perm``."""
    return perm[zipf_ranks(rng, n, rows, a)]


def fill(table: Any, rows: int, chunk: int = 1 << 16) -> float:
    """Give ids ``0..rows-1`` their initial rows (``lookup``, ``chunk`` ids a call); return the
    seconds it took."""
    t0 = time.perf_counter()
    for start in range(0, rows, chunk):
        table.lookup(np.arange(start, min(rows, start + chunk), dtype=np.int64))
    return time.perf_counter() - t0
