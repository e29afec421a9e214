"""Benchmark: a checkpoint of a store held in memory beside one of a store in a directory.

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_checkpoint_memory.py              # 1M rows x 64
    .venv/bin/python python/benchmarks/bench_checkpoint_memory.py --rows 100000 --json

One table of ``--rows`` rows of ``--dim`` floats with Adagrad (its state as wide as the row),
filled by ``assign`` and one ``apply_gradients`` over every row, twice: in
``embstore.Store()`` and in ``embstore.Store(dir)``. Reported, each the best of ``--repeat``:
the in-memory store's ``checkpoint`` (every row written into new segments, fsynced), the
directory store's first ``flush`` of the filled table and its ``checkpoint`` after that flush
(hard links), and each checkpoint's bytes as the checkpoint reports them (and ``du`` of the
new files: links add none). ``restore`` of the in-memory store's checkpoint is timed too.
The directories live under ``--dir`` (default: a temporary folder on the repository's disk).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import tempfile
import time

import numpy as np

import embstore


def fill(store: embstore.Store, rows: int, dim: int) -> None:
    t = store.create_table("t", dim, optimizer=embstore.Adagrad(lr=0.05), num_shards=8)
    rng = np.random.default_rng(0)
    for lo in range(0, rows, 1 << 16):
        ids = np.arange(lo, min(rows, lo + (1 << 16)), dtype=np.uint64)
        t.assign(ids, rng.standard_normal((len(ids), dim), dtype=np.float32))
        t.apply_gradients(ids, rng.standard_normal((len(ids), dim), dtype=np.float32))


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def new_bytes(path: pathlib.Path) -> int:
    """Bytes of the files under ``path`` with one link (a hard link shares its blocks)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.stat().st_nlink == 1)


def best_checkpoint(store: embstore.Store, root: pathlib.Path, kind: str, repeat: int):
    """The best time of ``repeat`` checkpoints of ``store`` and the last one's report."""
    best, report = None, None
    for i in range(repeat):
        path = root / f"{kind}-{i}"
        secs, report = timed(lambda path=path: store.checkpoint(path))
        best = secs if best is None else min(best, secs)
    return best, report


def run_memory(root: pathlib.Path, args: argparse.Namespace) -> dict[str, object]:
    mem = embstore.Store()
    fill(mem, args.rows, args.dim)
    best, report = best_checkpoint(mem, root, "mem", args.repeat)
    out: dict[str, object] = {
        "memory_checkpoint_s": round(best, 3),
        "memory_checkpoint_bytes": report.bytes,
        "memory_checkpoint_new_bytes": new_bytes(report.path),
        "memory_checkpoint_mb_s": round(report.bytes / best / 1e6, 1),
    }
    secs, restored = timed(lambda: embstore.Store.restore(report.path, root / "restored"))
    out["restore_s"] = round(secs, 3)
    assert len(restored["t"]) == args.rows
    restored.close()
    return out


def run_durable(root: pathlib.Path, args: argparse.Namespace) -> dict[str, object]:
    durable = embstore.Store(root / "durable")
    fill(durable, args.rows, args.dim)
    secs, _ = timed(durable.flush)
    out: dict[str, object] = {"durable_first_flush_s": round(secs, 3)}
    best, report = best_checkpoint(durable, root, "dur", args.repeat)
    out["durable_checkpoint_s"] = round(best, 4)
    out["durable_checkpoint_bytes"] = report.bytes
    out["durable_checkpoint_new_bytes"] = new_bytes(report.path)
    durable.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir or "."))
    out: dict[str, object] = {"rows": args.rows, "dim": args.dim, "optimizer": "adagrad"}
    try:
        out.update(run_memory(root, args))
        out.update(run_durable(root, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open("/proc/cpuinfo") as f:
        out["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), "?")
    out["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
