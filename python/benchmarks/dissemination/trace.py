"""A seeded update trace for the dissemination benchmarks, and the spec's load knob rho.

An update writes one row: a key drawn from Zipf(``zipf_a``) over ``rows`` keys (hot ranks spread
over the key space by a seeded permutation) and ``dim`` float32 values. Updates arrive evenly at
``rate`` rows/s for ``duration`` seconds and are grouped into batches of ``batch_ms`` (the
writer's pipelining window). Everything follows from ``seed``: the same seed gives the same keys,
values and batches in every process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
from lib.workloads import zipf_ids


@dataclass(frozen=True)
class Trace:
    """The parameters of a trace (all of it follows from these)."""

    seed: int = 1
    rows: int = 1 << 20
    dim: int = 16
    rate: float = 10_000.0  # rows/s
    duration: float = 30.0  # seconds of updates
    zipf_a: float = 1.05
    batch_ms: float = 10.0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.dim < 1:
            raise ValueError(f"rows and dim must be >= 1, got rows={self.rows} dim={self.dim}")
        if not self.rate > 0 or not self.duration > 0 or not self.batch_ms > 0:
            raise ValueError(
                f"rate, duration and batch_ms must be > 0, got {self.rate}, {self.duration}, "
                f"{self.batch_ms}"
            )
        if not self.zipf_a > 0:
            raise ValueError(f"zipf_a must be > 0, got {self.zipf_a}")

    @property
    def updates(self) -> int:
        """The number of updates in the trace."""
        return round(self.rate * self.duration)

    @property
    def row_bytes(self) -> int:
        """Raw bytes of one row's values (``dim`` float32)."""
        return 4 * self.dim

    def as_dict(self) -> dict:
        return asdict(self)

    def keys_values(self) -> tuple[np.ndarray, np.ndarray]:
        """All keys (``int64[updates]``) and values (``float32[updates, dim]``), in order."""
        rng = np.random.default_rng(self.seed)
        perm = rng.permutation(self.rows)
        keys = zipf_ids(rng, self.zipf_a, self.rows, self.updates, perm)
        values = rng.standard_normal((self.updates, self.dim), dtype=np.float32)
        return keys, values

    def batches(self) -> Iterator[tuple[float, int, int]]:
        """``(due_s, start, stop)`` per batch: updates ``start:stop`` arrive (evenly, at
        ``rate``) before ``due_s`` seconds after the start, when the batch is sent."""
        per = self.batch_ms / 1000.0
        n = self.updates
        k = 0
        start = 0
        while start < n:
            due = (k + 1) * per
            stop = min(n, round(due * self.rate))
            if stop > start:
                yield due, start, stop
                start = stop
            k += 1


def rho(
    update_bytes_per_s: float, replicas_total: int, train_servers: int, nic_mbit: float
) -> float:
    """The spec's load knob: the NIC load 2PC would need at a training server,
    ``(R_total - 1) * U / n_train_servers / NIC`` with ``U`` the update bytes/s on the wire
    (the spec sizes a row of 16 float32 at 122 B in embstore's layout; a Redis SET is 98 B).

    >>> round(rho(4_800 * 122, 30, 3, 50), 2)  # the spec's example: 10 DCs x 3, 4.8 k rows/s
    0.91
    """
    if replicas_total < 1 or train_servers < 1 or not nic_mbit > 0:
        raise ValueError("replicas_total and train_servers must be >= 1 and nic_mbit > 0")
    return (replicas_total - 1) * update_bytes_per_s * 8 / train_servers / (nic_mbit * 1e6)


def rate_for_rho(
    target: float, row_bytes: int, replicas_total: int, train_servers: int, nic_mbit: float
) -> float:
    """The update rate (rows/s) of rows of ``row_bytes`` wire bytes that gives ``rho = target``."""
    return target * train_servers * nic_mbit * 1e6 / 8 / (replicas_total - 1) / row_bytes


def add_workload_args(ap, default_rates: list[float], rates_help: str) -> None:
    """The trace flags every dissemination benchmark takes (an argparse group)."""
    g = ap.add_argument_group("workload")
    g.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=default_rates,
        help=f"update rates in rows/s, one run each ({rates_help})",
    )
    g.add_argument("--duration", type=float, default=30, help="seconds of updates (default 30)")
    g.add_argument("--rows", type=int, default=1 << 20, help="key space (default 2^20)")
    g.add_argument("--dim", type=int, default=16, help="float32 per row (default 16)")
    g.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent (default 1.05)")
    g.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    g.add_argument("--batch-ms", type=float, default=10, help="write batch window (default 10)")


def check_workload_args(ap, args, min_dcs: int = 2) -> None:
    """``ap.error`` for invalid network or workload flags (both groups' checks); ``min_dcs=1``
    for the peers that keep replicas in DC 1 too."""
    if args.dcs < min_dcs:
        ap.error(f"--dcs must be >= {min_dcs} (DC 1 holds the primary)")
    if args.servers < 1 or args.rows < 1 or args.dim < 1 or args.duration <= 0:
        ap.error("--servers, --rows, --dim and --duration must be positive")
    if any(r <= 0 for r in args.rates) or args.batch_ms <= 0:
        ap.error("--rates and --batch-ms must be > 0")


def trace_for(args, rate: float) -> Trace:
    """The trace of the workload flags at ``rate``."""
    return Trace(
        seed=args.seed,
        rows=args.rows,
        dim=args.dim,
        rate=rate,
        duration=args.duration,
        zipf_a=args.zipf,
        batch_ms=args.batch_ms,
    )


def warm_mask(keys: np.ndarray, share: float) -> np.ndarray:
    """Which of ``keys`` a warm table holds before the run (``--warm-share``): a fixed share of
    the key space by a hash of the key, so the writer and the analysis agree; the rest are
    created during the run (new rows, as in a model that has trained before)."""
    if share <= 0.0:
        return np.zeros(len(keys), dtype=bool)
    h = (np.asarray(keys, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return h % np.uint64(10_000) < np.uint64(round(share * 10_000))
