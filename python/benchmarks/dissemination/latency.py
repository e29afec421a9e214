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

import zlib

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
    return stats(lat, commits[:, 2], missing, wan_bytes)


def stats(lat: np.ndarray, weights: np.ndarray, missing: int, wan_bytes: int) -> dict:
    """The summary of latencies ``lat`` (seconds, NaN = never visible) of batches or updates
    weighted by ``weights`` (rows per entry; ones for single updates)."""
    weights = np.asarray(weights, dtype=np.int64)
    ok = ~np.isnan(lat)
    per_update = np.repeat(lat[ok], weights[ok])
    updates = int(weights.sum())
    out = {
        "updates": updates,
        "batches": len(lat),
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


# embstore's followers: events instead of polls.
#
# A follower started with ``--sync-events FILE`` appends one record per applied reply:
# ``time_us`` (µs since the Unix epoch), the ``table`` (the CRC-32 of its name), the sync
# ``part`` and ``newest_ts``, the largest row
# version timestamp it knows in that part after the reply. A row written at the primary with
# version ``v`` in part ``p`` is visible at a follower from its first event with part ``p`` and
# ``newest_ts >= v``: a reply carries every row of the part newer than what the follower knew,
# and one writer's versions grow in write order, so knowing ``v`` means holding the row (or a
# newer write of it). The time is the apply time of the reply, so there is no poll error; the
# commit is the writer's wall clock right after the write call returned (same clock).

EVENT_DTYPE = np.dtype([("t_us", "<u8"), ("table", "<u4"), ("part", "<u4"), ("newest_ts", "<u8")])
assert EVENT_DTYPE.itemsize == 24


def table_id(name: str) -> int:
    """A table's id in the records: the CRC-32 of its name (as the follower writes it)."""
    return zlib.crc32(name.encode())


def of_table(events: np.ndarray, name: str) -> np.ndarray:
    """The records of table ``name``."""
    return events[events["table"] == table_id(name)]


def read_events(raw: bytes) -> np.ndarray:
    """The whole records of a ``--sync-events`` file's bytes (a partial last one is ignored)."""
    n = len(raw) // EVENT_DTYPE.itemsize
    return np.frombuffer(raw[: n * EVENT_DTYPE.itemsize], dtype=EVENT_DTYPE)


def row_visible_times(part: np.ndarray, ts: np.ndarray, events: np.ndarray) -> np.ndarray:
    """Per row (its ``part`` and version ``ts``), the first event time (int64 µs) at which the
    follower knew ``ts`` in that part, or -1 where it never did."""
    part = np.asarray(part, dtype=np.int64)
    ts = np.asarray(ts, dtype=np.uint64)
    out = np.full(len(part), -1, dtype=np.int64)
    if len(events) == 0 or len(part) == 0:
        return out
    # Events by (part, time); within a part, the running max of newest_ts is non-decreasing,
    # so the first event that reaches ts is a binary search.
    order = np.lexsort((events["t_us"], events["part"]))
    ev_part = events["part"][order].astype(np.int64)
    ev_t = events["t_us"][order].astype(np.int64)
    ev_ts = events["newest_ts"][order]
    bounds = np.searchsorted(ev_part, np.arange(int(max(ev_part.max(), part.max())) + 2))
    rows_by_part = np.argsort(part, kind="stable")
    row_bounds = np.searchsorted(part[rows_by_part], np.arange(int(part.max()) + 2))
    for p in np.unique(part):
        a, b = bounds[p], bounds[p + 1]
        if a == b:
            continue
        known = np.maximum.accumulate(ev_ts[a:b])
        rows = rows_by_part[row_bounds[p] : row_bounds[p + 1]]
        idx = np.searchsorted(known, ts[rows], side="left")
        ok = idx < b - a
        out[rows[ok]] = ev_t[a:b][idx[ok]]
    return out


def row_latencies(
    commit_us: np.ndarray,
    batch: np.ndarray,
    part: np.ndarray,
    ts: np.ndarray,
    replicas: dict[str, np.ndarray],
) -> tuple[np.ndarray, int]:
    """Latency per row update in seconds (max over replicas of visible - commit of its batch;
    NaN where some replica never showed it), and how many updates some replica never showed.
    ``commit_us[batch[i]]`` is update i's commit; ``replicas`` maps a name to its events."""
    commit = np.asarray(commit_us, dtype=np.int64)[np.asarray(batch, dtype=np.int64)]
    worst = np.zeros(len(commit), dtype=np.int64)
    missing = np.zeros(len(commit), dtype=bool)
    for events in replicas.values():
        vis = row_visible_times(part, ts, events)
        missing |= vis < 0
        worst = np.maximum(worst, vis - commit)
    lat = worst.astype(np.float64) / 1e6
    lat[missing] = np.nan
    return lat, int(missing.sum())


def window_means(
    commit_us: np.ndarray, lat: np.ndarray, weights: np.ndarray, window_s: float = 5.0
) -> list[float | None]:
    """Mean latency (weighted, NaN left out) of the entries committed in each ``window_s``
    window from the first commit: shows whether a latency is steady or grows with the run.

    >>> window_means(np.array([0, 1_000_000, 6_000_000]), np.array([1.0, 3.0, 5.0]),
    ...              np.array([1, 1, 2]))
    [2.0, 5.0]
    """
    commit_us = np.asarray(commit_us, dtype=np.int64)
    if len(commit_us) == 0:
        return []
    idx = ((commit_us - commit_us[0]) // int(window_s * 1e6)).astype(np.int64)
    out: list[float | None] = []
    for i in range(int(idx.max()) + 1):
        sel = (idx == i) & ~np.isnan(lat)
        w = np.asarray(weights)[sel]
        out.append(round(float(np.average(lat[sel], weights=w)), 4) if w.sum() else None)
    return out
