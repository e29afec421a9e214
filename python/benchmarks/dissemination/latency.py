"""Per-update dissemination latency, as the spec's section 8.3 defines it.

An update's latency is the maximum over replicas of (time it became visible there - time it
committed). Inputs are integer microseconds of CLOCK_MONOTONIC (every process shares the host
clock, so there is no skew):

- commits: one per batch, ``(t_commit_us, offset, rows)``: the writer's ack time, the position
  in the replication stream after the batch, and how many updates it holds;
- visibility: per replica, the polls ``(t_us, offset)``: the replica had applied the stream up to
  ``offset`` when the poll's reply arrived at ``t_us``.

A batch is visible at a replica at the first poll whose offset reaches the batch's. That time is
an upper bound (the replica got there between the previous poll and this one), so latencies are
overstated by up to one poll period, half of it on average.
"""

from __future__ import annotations

import numpy as np


def visible_times(
    commit_offsets: np.ndarray, poll_t: np.ndarray, poll_off: np.ndarray
) -> np.ndarray:
    """Per batch, the first poll time whose offset reaches the batch's offset (int64 µs), or -1
    where the replica never got there."""
    off = np.maximum.accumulate(np.asarray(poll_off, dtype=np.int64))
    idx = np.searchsorted(off, np.asarray(commit_offsets, dtype=np.int64), side="left")
    out = np.full(len(commit_offsets), -1, dtype=np.int64)
    ok = idx < len(off)
    out[ok] = np.asarray(poll_t, dtype=np.int64)[idx[ok]]
    return out


def update_latencies(
    commits: np.ndarray, replicas: dict[str, np.ndarray]
) -> tuple[np.ndarray, int]:
    """Latency per batch in seconds (max over replicas), and how many batches some replica
    never showed. ``commits`` is ``int64[n, 3]`` (t_commit_us, offset, rows); each replica is
    ``int64[m, 2]`` (t_us, offset)."""
    commits = np.asarray(commits, dtype=np.int64).reshape(-1, 3)
    worst = np.zeros(len(commits), dtype=np.int64)
    missing = np.zeros(len(commits), dtype=bool)
    for polls in replicas.values():
        polls = np.asarray(polls, dtype=np.int64).reshape(-1, 2)
        vis = visible_times(commits[:, 1], polls[:, 0], polls[:, 1])
        missing |= vis < 0
        worst = np.maximum(worst, vis - commits[:, 0])
    lat = worst.astype(np.float64) / 1e6
    lat[missing] = np.nan
    return lat, int(missing.sum())


def summary(commits: np.ndarray, replicas: dict[str, np.ndarray], wan_bytes: int) -> dict:
    """Mean, p50, p99 and max latency over updates (each batch weighted by its rows), and WAN
    bytes per update.

    >>> c = np.array([[0, 100, 2], [10_000, 200, 1]])
    >>> r = {"a": np.array([[50_000, 100], [60_000, 200]]), "b": np.array([[20_000, 200]])}
    >>> s = summary(c, r, wan_bytes=300)
    >>> s["mean_s"], s["max_s"], s["wan_bytes_per_update"]
    (0.05, 0.05, 100.0)
    """
    commits = np.asarray(commits, dtype=np.int64).reshape(-1, 3)
    lat, missing = update_latencies(commits, replicas)
    rows = commits[:, 2]
    ok = ~np.isnan(lat)
    per_update = np.repeat(lat[ok], rows[ok])
    updates = int(rows.sum())
    out = {
        "updates": updates,
        "batches": len(commits),
        "batches_never_visible": missing,
        "wan_bytes": int(wan_bytes),
        "wan_bytes_per_update": round(wan_bytes / updates, 1) if updates else None,
    }
    if per_update.size:
        out.update(
            mean_s=round(float(per_update.mean()), 4),
            p50_s=round(float(np.percentile(per_update, 50)), 4),
            p99_s=round(float(np.percentile(per_update, 99)), 4),
            max_s=round(float(per_update.max()), 4),
        )
    return out
