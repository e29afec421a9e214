"""Benchmark: how much one caller's work slows another's small calls (issue 7, defects 7 and 8).

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_interference.py            # 3M rows, ~1 minute
    .venv/bin/python python/benchmarks/bench_interference.py --json

Two scenarios, each measured alone (idle) and under interference, on tables of ``--rows`` rows
(dim 16, SGD, 8 shards; ids uniform over the stored rows):

1. ``stats``: a thread calls ``table.stats()`` in a loop while the main thread times 64-id
   ``apply_gradients`` calls on the same table. ``stats()`` used to scan every shard's index
   under its read lock (milliseconds at 3M rows), stalling every writer behind it.
2. ``pool``: a thread runs 4M-id lookups on another table (they fill the shared helper pool)
   while the main thread times 4,096-id lookups. A call used to wait for its helper jobs to
   *start*, i.e. behind the other table's work.

Reported: median, p99 and max latency of the timed calls, in microseconds. The scenarios are
latency under contention on a 2-core machine: expect noise, compare medians and maxima.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np
from lib.timing import summarize
from lib.workloads import fill

import embstore


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def summary(us: list[float]) -> dict[str, float]:
    return summarize(us, ("p50", "p99", "max"), suffix="_us")


def background(work, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            work()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def run(rows: int, calls: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    store = embstore.Store()
    a = store.create_table("a", embedding_dim=16)
    b = store.create_table("b", embedding_dim=16)
    print(f"filling 2 tables of {rows:,} rows", file=sys.stderr)
    fill(a, rows, 1 << 20)
    fill(b, rows, 1 << 20)
    small = rng.integers(0, rows, 64)
    grads = np.ones((64, 16), np.float32)
    batch = rng.integers(0, rows, 4096)
    big = rng.integers(0, rows, 4 << 20)
    res: dict[str, object] = {"rows": rows, "calls": calls}
    scenarios = {
        "stats": (lambda: a.apply_gradients(small, grads), lambda: a.stats()),
        "pool": (lambda: a.lookup(batch, on_miss="zeros"), lambda: b.lookup(big, on_miss="zeros")),
    }
    for name, (call, noise) in scenarios.items():
        print(f"{name}: idle", file=sys.stderr)
        idle = summary(timed(call, calls))
        stop = threading.Event()
        t = background(noise, stop)
        time.sleep(0.2)
        print(f"{name}: under interference", file=sys.stderr)
        busy = summary(timed(call, calls))
        stop.set()
        t.join()
        res[name] = {"idle": idle, "busy": busy}
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=3_000_000, help="rows per table")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per measurement")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    res = run(args.rows, args.calls)
    if args.json:
        print(json.dumps(res))
        return
    print(f"rows {res['rows']:,} per table, {res['calls']} timed calls each\n")
    print("| scenario | timed call | p50 idle | p50 busy | p99 busy | max busy |")
    print("|---|---|---:|---:|---:|---:|")
    what = {
        "stats": "64-id apply_gradients, stats() polled",
        "pool": "4,096-id lookup, other table 4M-id lookups",
    }
    for name in ("stats", "pool"):
        r = res[name]
        print(
            f"| {name} | {what[name]} | {r['idle']['p50_us']:.0f} | {r['busy']['p50_us']:.0f} | "
            f"{r['busy']['p99_us']:.0f} | {r['busy']['max_us']:.0f} |"
        )


if __name__ == "__main__":
    main()
