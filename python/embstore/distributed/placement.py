"""Where each row of a distributed store lives: :func:`owner_of` (the process that owns an
id) and :func:`part_dir` (a process's partition directory)."""

from __future__ import annotations

import pathlib

import numpy as np

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
