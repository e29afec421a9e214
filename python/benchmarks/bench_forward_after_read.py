"""Benchmark: how much slower the model's dense part runs right after a disk read (issue 10,
benchmark 4's "a miss costs a read and a slower model").

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_forward_after_read.py

One thread, the demo's CTR model of ``bench_cache_accuracy.py`` (D = 16, 7 fields), one request
at a time. Each step does one of the following, then times one forward pass of the dense part:

- ``none``: nothing;
- ``read``: a random 4 KiB ``O_DIRECT`` read of a scratch file (``--file-mb`` MiB under
  ``--dir``, removed afterwards);
- ``spin``: a busy-wait of ``--spin-us``;
- ``sleep``: ``time.sleep`` of ``--spin-us``.

Each mode runs ``--steps`` steps, and the sequence of modes runs ``--repeats`` times. It prints
the median over repeats of each mode's mean step time (the read, wait or sleep) and mean forward
time, in microseconds.
"""

from __future__ import annotations

import argparse
import mmap
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
from bench_cache_accuracy import CTR

MODES = ("none", "read", "spin", "sleep")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4000, help="steps per mode and repeat (4000)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of the modes (3)")
    p.add_argument("--spin-us", type=int, default=100, help="busy-wait / sleep length (100)")
    p.add_argument("--file-mb", type=int, default=64, help="scratch file size in MiB (64)")
    p.add_argument(
        "--dir",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parents[2] / ".data",
        help="where the scratch file goes (a real disk: O_DIRECT)",
    )
    args = p.parse_args()
    if args.steps < 1 or args.repeats < 1 or args.file_mb < 1:
        p.error("--steps, --repeats and --file-mb must be positive")
    torch.set_num_threads(1)
    model = CTR([1] * 7).eval()  # 7 fields; only the dense part runs, so the tables are unused
    e = torch.randn(1, 7, 16)
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"forward-after-read-{os.getpid()}.bin"
    blocks = (args.file_mb << 20) // 4096
    with open(path, "wb") as f:
        for _ in range(args.file_mb):
            f.write(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    rng = np.random.default_rng(0)
    clock = time.perf_counter_ns
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    try:
        with torch.no_grad():
            for _ in range(args.repeats):
                for mode in MODES:
                    step = forward = 0
                    offsets = rng.integers(0, blocks, args.steps) * 4096
                    for i in range(args.steps):
                        t0 = clock()
                        if mode == "read":
                            os.preadv(fd, [buf], int(offsets[i]))
                        elif mode == "spin":
                            end = t0 + args.spin_us * 1000
                            while clock() < end:
                                pass
                        elif mode == "sleep":
                            time.sleep(args.spin_us * 1e-6)
                        t1 = clock()
                        model.dense(e)
                        t2 = clock()
                        step += t1 - t0
                        forward += t2 - t1
                    results[mode].append((step / args.steps / 1e3, forward / args.steps / 1e3))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    print("| before each forward | step µs | forward µs |")
    print("|---|---:|---:|")
    for mode, runs in results.items():
        s = statistics.median(r[0] for r in runs)
        f = statistics.median(r[1] for r in runs)
        print(f"| {mode} | {s:.1f} | {f:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
