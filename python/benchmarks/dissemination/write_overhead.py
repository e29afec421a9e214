"""What keeping sync state costs a training write: ``apply_gradients`` on a table that syncs
(its store serves a sync port) against one that does not, in alternating rounds of the same
process; medians and the paired ratio.

    python python/benchmarks/dissemination/write_overhead.py [--rounds 5] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import embstore


def one(sync: bool, rows: int, batches: int, seed: int) -> float:
    """Seconds per ``apply_gradients`` of 4,096 ids x 64 (after 10 warm-up batches)."""
    rng = np.random.default_rng(seed)
    store = embstore.Store(replica_id=1)
    t = store.create_table("t", embedding_dim=64, optimizer=embstore.Adagrad(lr=0.01))
    port = store.serve_sync() if sync else None
    ids = rng.integers(0, rows, size=(batches + 10, 4096))
    g = rng.standard_normal((4096, 64)).astype(np.float32)
    for b in ids[:10]:
        t.apply_gradients(b, g)
    start = time.perf_counter()
    for b in ids[10:]:
        t.apply_gradients(b, g)
    seconds = (time.perf_counter() - start) / batches
    if port is not None:
        port.stop()
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="id space (default 1M)")
    ap.add_argument("--batches", type=int, default=50, help="timed batches a round (default 50)")
    args = ap.parse_args(argv)
    off, on = [], []
    for r in range(args.rounds):
        off.append(one(False, args.rows, args.batches, r))
        on.append(one(True, args.rows, args.batches, r))
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    print(
        json.dumps(
            {
                "ms_off": round(float(np.median(off)) * 1e3, 3),
                "ms_on": round(float(np.median(on)) * 1e3, 3),
                "ratio_median": round(float(np.median(ratios)), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
