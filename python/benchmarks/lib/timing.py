"""Latency and rate summaries, named as each benchmark's JSON names them.

``summarize(values, ("p50", "p99", "max"), suffix="_us")`` gives
``{"p50_us": ..., "p99_us": ..., "max_us": ...}``: each statistic is taken over ``values`` first
and then multiplied by ``scale``, so a figure in other units is the same float as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

STATS: dict[str, Callable[[np.ndarray], float]] = {
    "mean": np.mean,
    "avg": np.mean,
    "median": np.median,
    "p50": lambda a: np.percentile(a, 50),
    "p99": lambda a: np.percentile(a, 99),
    "min": np.min,
    "max": np.max,
}


def summarize(
    values: Iterable[float] | np.ndarray,
    stats: Sequence[str],
    *,
    prefix: str = "",
    suffix: str = "",
    scale: float = 1.0,
) -> dict[str, float]:
    """``{prefix + stat + suffix: STATS[stat](values) * scale}`` for each of ``stats``."""
    a = np.asarray(values if isinstance(values, np.ndarray) else list(values))
    return {f"{prefix}{s}{suffix}": float(STATS[s](a) * scale) for s in stats}
