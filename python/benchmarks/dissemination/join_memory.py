"""What a joining follower costs a source under a memory budget, and what a clear of a synced
table holds: the source's RSS before and at its peak while a follower (another process) pulls
every row, then its tombstones and RSS around ``clear()``.

    python python/benchmarks/dissemination/join_memory.py [--rows 3000000] [--parts 16]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import embstore

FOLLOWER = (
    "import sys, embstore; r = embstore.Store.follow(sys.argv[1]);"
    "assert r.wait_caught_up(timeout=900); print(len(r['item'])); r.close()"
)


def rss() -> int:
    """This process's resident set (bytes)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_during(fn) -> int:
    """The largest RSS seen (every 5 ms) while ``fn`` runs."""
    peak, done = [rss()], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    th = threading.Thread(target=watch)
    th.start()
    try:
        fn()
    finally:
        done.set()
        th.join()
    return peak[0]


def cpu() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--parts", type=int, default=16, help="sync parts (fewer: larger parts)")
    ap.add_argument("--budget-mib", type=int, default=8)
    args = ap.parse_args()
    mib = 1 << 20
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        store = embstore.Store(d + "/p", replica_id=1, memory_budget_bytes=args.budget_mib * mib)
        t = store.create_table("item", embedding_dim=16)
        port = store.serve_sync(parts=args.parts)
        for c in np.array_split(np.arange(args.rows), 60):
            t.assign(c, np.ones((c.size, 16), np.float32))
        store.flush()
        time.sleep(1)
        base = rss()
        out: list[subprocess.CompletedProcess[str]] = []

        def join() -> None:
            cmd = [sys.executable, "-c", FOLLOWER, port.address]
            out.append(subprocess.run(cmd, capture_output=True, text=True, timeout=1800))

        peak = peak_during(join)
        assert out[0].returncode == 0, out[0].stderr[-2000:]
        print(
            f"{cpu()}; {args.rows:,} rows, {args.parts} parts, {args.budget_mib} MiB budget: "
            f"source RSS {base / mib:.0f} MiB before a follower's join, peak {peak / mib:.0f} "
            f"MiB (+{(peak - base) / mib:.1f} MiB); the follower holds {out[0].stdout.strip()} rows"
        )
        before = rss()
        t.clear()
        tombs = t.sync_stats()["tombstones"]
        time.sleep(0.5)
        print(f"clear: {tombs} tombstones; RSS {before / mib:.0f} -> {rss() / mib:.0f} MiB")
        port.stop()
        store.close()


if __name__ == "__main__":
    main()
