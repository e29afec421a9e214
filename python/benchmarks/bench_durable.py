"""Benchmark: what durability costs (issue 8, benchmark 4), with RocksDB beside it.

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_durable.py            # 10M rows (~3 min)
    .venv/bin/python python/benchmarks/bench_durable.py --quick    # 1M rows (~30 s)
    .venv/bin/python python/benchmarks/bench_durable.py --json
    # flush latency under compaction: 1.5M rows (~480 MB of records), 120 flushes
    .venv/bin/python python/benchmarks/bench_durable.py --rows 1500000 --batches 6000 --every 50

Workload (the issue's benchmark 1, scaled to fit in memory twice over on a 24 GiB machine):
a table of ``--rows`` rows (default 10M), ``D`` = 32, Adagrad (``S`` = 32, so 256 raw bytes a
row); ``--batches`` batches (default 600) of 4,096 ids drawn Zipf(1.05) over the rows (ranks
shuffled over the id space by a fixed permutation), each ``lookup`` + ``apply_gradients``;
every ``--every`` batches (default 100) a ``flush()``.

Three runs, each in this process, one after the other:

1. ``memory``: ``embstore.Store()`` (no path): the batches alone. The throughput reference.
2. ``durable``: ``embstore.Store(dir)`` with the same table and the same batches plus the
   flushes. Reported: the first flush of the filled table (its write bandwidth), each periodic
   flush's latency, the rows changed since the previous flush (unique ids of those batches), its
   records and bytes; write amplification = bytes the process wrote to the device
   (``/proc/self/io`` ``write_bytes``, which counts what reaches the block layer, so it includes
   the manifest and compaction) / (rows changed x 256 raw bytes); disk use over time / live
   rows x (record + footer entry) bytes; throughput with the flushes / the memory run's.
   Flush latency is given as median, p90, p99 and max: with enough flushes (``--every 50``
   and a few thousand batches) records on disk pass twice the live rows many times over, so
   the percentiles show what compaction costs the flushes (the goal: p99 within 3x the
   median).
3. ``rocksdb`` (peer, ``rocksdict`` package, when installed): the same durability job done
   with RocksDB — after every interval, the rows changed in it are written as one
   ``WriteBatch`` of 256-byte values with a synced WAL (``sync=True``: durable when it
   returns, like ``flush()``), after the initial load of every row (then flushed and
   compacted, so its background work is not charged to the updates). The latency is that of
   ``db.write`` alone: building the batch in Python is timed apart and left out. Write
   amplification counts the updates' bytes including the background flushes and compactions
   they cause (2 s are allowed after the last one). Disk use is at the end.

The directories live under ``--dir`` (default: a temporary folder on the repository's disk);
both stores are deleted at the end. Progress on stderr; results to stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from lib.records import finish, log, run_record
from lib.workloads import fill

import embstore

DIM = 32


def write_bytes() -> int:
    """Bytes this process has caused to be written to storage so far."""
    with open("/proc/self/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("write_bytes"))


def dir_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def zipf_batches(rows: int, batches: int, batch: int, seed: int) -> list[np.ndarray]:
    """Zipf(1.05) ranks over ``rows`` ids, ranks shuffled by a fixed permutation."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows).astype(np.int64)
    out = []
    for _ in range(batches):
        r = rng.zipf(1.05, batch * 2)
        r = r[r <= rows][:batch]
        while len(r) < batch:
            more = rng.zipf(1.05, batch)
            r = np.concatenate([r, more[more <= rows]])[:batch]
        out.append(perm[r - 1])
    return out


def train(table: Any, batches: list[np.ndarray], grads: np.ndarray) -> None:
    for ids in batches:
        table.lookup(ids)
        table.apply_gradients(ids, grads)


def run_memory(args: argparse.Namespace, batches: list[np.ndarray], grads: np.ndarray) -> dict:
    store = embstore.Store()
    t = store.create_table("t", DIM, optimizer=embstore.Adagrad(lr=0.05))
    fill_s = fill(t, args.rows, 1 << 18)
    log(f"memory: filled {args.rows:,} rows in {fill_s:.1f} s")
    t0 = time.perf_counter()
    train(t, batches, grads)
    train_s = time.perf_counter() - t0
    log(f"memory: {len(batches)} batches in {train_s:.2f} s")
    return {"fill_s": fill_s, "train_s": train_s, "batches_per_s": len(batches) / train_s}


def run_durable(
    args: argparse.Namespace, root: pathlib.Path, batches: list[np.ndarray], grads: np.ndarray
) -> dict:
    path = root / "embstore"
    store = embstore.Store(path)
    t = store.create_table("t", DIM, optimizer=embstore.Adagrad(lr=0.05))
    fill_s = fill(t, args.rows, 1 << 18)
    w0, t0 = write_bytes(), time.perf_counter()
    first = store.flush()
    first_s, first_w = time.perf_counter() - t0, write_bytes() - w0
    log(
        f"durable: first flush of {args.rows:,} rows: {first_s:.2f} s, "
        f"{first['bytes'] / first_s / 1e6:.0f} MB/s"
    )
    # A live row on disk: its record and its 24-byte footer entry.
    record_bytes = -(-(44 + 4 * 2 * DIM) // 64) * 64 + 24
    flushes, train_s, total_w, changed_total = [], 0.0, 0, 0
    disk = []
    for i in range(0, len(batches), args.every):
        part = batches[i : i + args.every]
        t0 = time.perf_counter()
        train(t, part, grads)
        train_s += time.perf_counter() - t0
        changed = len(np.unique(np.concatenate(part)))
        w0, t0 = write_bytes(), time.perf_counter()
        st = store.flush()
        lat, w = time.perf_counter() - t0, write_bytes() - w0
        train_s += lat
        total_w += w
        changed_total += changed
        disk.append(dir_bytes(path / "seg") / (args.rows * record_bytes))
        flushes.append(
            {"latency_s": lat, "changed": changed, "device_bytes": w, "disk": disk[-1], **st}
        )
    lat = np.array([f["latency_s"] for f in flushes])
    log(f"durable: {len(flushes)} flushes, median {np.median(lat) * 1e3:.1f} ms")
    del t, store
    shutil.rmtree(path)
    return {
        "fill_s": fill_s,
        "first_flush_s": first_s,
        "first_flush_bytes": first["bytes"],
        "first_flush_device_bytes": first_w,
        "first_flush_mb_s": first["bytes"] / first_s / 1e6,
        "train_s": train_s,
        "batches_per_s": len(batches) / train_s,
        "flushes": flushes,
        "flush_ms_median": float(np.median(lat) * 1e3),
        "flush_ms_p90": float(np.percentile(lat, 90) * 1e3),
        "flush_ms_p99": float(np.percentile(lat, 99) * 1e3),
        "flush_ms_max": float(lat.max() * 1e3),
        "flush_records_max": max(f["records"] for f in flushes),
        "changed_rows_per_flush": changed_total / len(flushes),
        "write_amplification": total_w / (changed_total * 4 * 2 * DIM),
        "disk_over_live_max": max(disk),
        "disk_over_live_last": disk[-1],
        "compactions": sum(f["compactions"] for f in flushes),
    }


def run_rocksdb(args: argparse.Namespace, root: pathlib.Path, batches: list[np.ndarray]) -> dict:
    try:
        import rocksdict
    except ImportError:
        log("rocksdb: the rocksdict package is not installed; peer skipped")
        return {"skipped": "rocksdict not installed"}
    path = root / "rocksdb"
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    db = rocksdict.Rdict(str(path), opts)
    # Unique random rows: trained rows do not compress, and zeros or a small pool of repeated
    # rows would flatter RocksDB's block compression (a pool of 1,024 rows compressed 5x).
    rng = np.random.default_rng(args.seed)
    rb = 4 * 2 * DIM
    sync = rocksdict.WriteOptions()
    sync.sync = True
    w0, t0 = write_bytes(), time.perf_counter()
    for start in range(0, args.rows, 1 << 16):
        wb = rocksdict.WriteBatch(raw_mode=True)
        n = min(args.rows, start + (1 << 16)) - start
        blob = rng.bytes(n * rb)
        for i in range(n):
            wb.put((start + i).to_bytes(8, "little"), blob[i * rb : (i + 1) * rb])
        db.write(wb, sync)
    # Settle the load (memtables flushed, levels compacted) so that its background work is
    # not charged to the updates.
    db.flush(True)
    db.compact_range(None, None)
    load_s, load_w = time.perf_counter() - t0, write_bytes() - w0
    log(f"rocksdb: loaded {args.rows:,} rows in {load_s:.1f} s")
    flushes, changed_total = [], 0
    w_start = write_bytes()
    for i in range(0, len(batches), args.every):
        ids = np.unique(np.concatenate(batches[i : i + args.every]))
        t0 = time.perf_counter()
        wb = rocksdict.WriteBatch(raw_mode=True)
        blob = rng.bytes(len(ids) * rb)
        for j, k in enumerate(ids.tolist()):
            wb.put(k.to_bytes(8, "little"), blob[j * rb : (j + 1) * rb])
        t1 = time.perf_counter()
        db.write(wb, sync)
        t2 = time.perf_counter()
        changed_total += len(ids)
        flushes.append({"latency_s": t2 - t1, "build_s": t1 - t0, "changed": len(ids)})
    # The background flushes and compactions these writes caused are part of their cost.
    db.flush(True)
    time.sleep(2)
    total_w = write_bytes() - w_start
    lat = np.array([f["latency_s"] for f in flushes])
    disk = dir_bytes(path) / (args.rows * (8 + 4 * 2 * DIM))
    db.close()
    del db
    rocksdict.Rdict.destroy(str(path))
    log(f"rocksdb: {len(flushes)} synced batches, median {np.median(lat) * 1e3:.1f} ms")
    return {
        "version": importlib.metadata.version("rocksdict"),
        "load_s": load_s,
        "load_device_bytes": load_w,
        "flushes": flushes,
        "flush_ms_median": float(np.median(lat) * 1e3),
        "flush_ms_p90": float(np.percentile(lat, 90) * 1e3),
        "flush_ms_max": float(lat.max() * 1e3),
        "write_amplification": total_w / (changed_total * 4 * 2 * DIM),
        "batch_build_ms_median": float(np.median([f["build_s"] for f in flushes]) * 1e3),
        "disk_over_live": disk,
    }


def goals(res: dict) -> list[dict]:
    d = res["durable"]
    return [
        {
            "goal": "disk use <= 2x the live rows' bytes (compaction)",
            "value": d["disk_over_live_max"],
            "met": d["disk_over_live_max"] <= 2.0,
        },
        {
            "goal": "flush latency p99 <= 3x the median (compaction off the flush's path)",
            "value": d["flush_ms_p99"] / d["flush_ms_median"],
            "met": d["flush_ms_p99"] <= 3 * d["flush_ms_median"],
        },
    ]


def report(res: dict) -> None:
    m, d, r = res["memory"], res["durable"], res["rocksdb"]
    print(f"## bench_durable — {res['date']}, {res['machine']}, commit {res['commit']}\n")
    print(
        f"{res['rows']:,} rows x D {DIM} Adagrad; {res['batches']} batches of 4,096 "
        f"Zipf(1.05) ids; flush every {res['every']} batches\n"
    )
    print("| figure | embstore | RocksDB (synced WriteBatch) |")
    print("|---|---:|---:|")
    rk = (lambda k, f="{:.1f}": f.format(r[k])) if "skipped" not in r else (lambda k, f="": "-")
    print(
        f"| initial write of every row (s) | {d['first_flush_s']:.2f} | {rk('load_s', '{:.1f}')} |"
    )
    print(
        f"| flush latency median / p90 / p99 / max (ms) | {d['flush_ms_median']:.1f} / "
        f"{d['flush_ms_p90']:.1f} / {d['flush_ms_p99']:.1f} / {d['flush_ms_max']:.1f} | "
        f"{rk('flush_ms_median')} / {rk('flush_ms_p90')} / - / {rk('flush_ms_max')} |"
    )
    print(
        f"| write amplification (device bytes / changed raw bytes) | "
        f"{d['write_amplification']:.2f} | {rk('write_amplification', '{:.2f}')} |"
    )
    print(
        f"| disk use / live rows, max over the run | {d['disk_over_live_max']:.2f} | "
        f"{rk('disk_over_live', '{:.2f}')} (end) |"
    )
    if "skipped" not in r:
        print(
            f"\nRocksDB {r['version']}: building each WriteBatch in Python took "
            f"{r['batch_build_ms_median']:.0f} ms (median; not in its latency)"
        )
    print(
        f"\nrows changed per interval: {d['changed_rows_per_flush']:,.0f}; most records one "
        f"flush wrote: {d['flush_records_max']:,}; whole rewrites: {d['compactions']}; first "
        f"flush {d['first_flush_mb_s']:.0f} MB/s"
    )
    print(
        f"training throughput: memory {m['batches_per_s']:.1f} batches/s, durable with "
        f"flushes {d['batches_per_s']:.1f} ({d['batches_per_s'] / m['batches_per_s']:.2f}x)"
    )
    for g in res["goals"]:
        print(f"- {g['goal']}: {g['value']:.2f} ({'met' if g['met'] else 'NOT met'})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000, help="rows in the table (10M)")
    p.add_argument("--batches", type=int, default=600, help="training batches (600)")
    p.add_argument("--every", type=int, default=100, help="batches between flushes (100)")
    p.add_argument("--seed", type=int, default=1, help="seed of the ids")
    p.add_argument(
        "--dir",
        type=pathlib.Path,
        default=None,
        help="where the stores go (default: a temporary folder in the repository)",
    )
    p.add_argument("--no-rocksdb", action="store_true", help="skip the RocksDB peer")
    p.add_argument("--quick", action="store_true", help="1M rows, 200 batches")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    if args.quick:
        args.rows, args.batches = 1_000_000, 200
    root_parent = args.dir or pathlib.Path(__file__).resolve().parents[2] / "target"
    root_parent.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-durable-", dir=root_parent))
    try:
        batches = zipf_batches(args.rows, args.batches, 4096, args.seed)
        grads = np.random.default_rng(args.seed).standard_normal((4096, DIM)).astype(np.float32)
        res: dict[str, Any] = {
            **run_record(),
            "rows": args.rows,
            "batches": args.batches,
            "every": args.every,
            "memory": run_memory(args, batches, grads),
            "durable": run_durable(args, root, batches, grads),
            "rocksdb": {"skipped": "--no-rocksdb"}
            if args.no_rocksdb
            else run_rocksdb(args, root, batches),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args, goals, report)


if __name__ == "__main__":
    sys.exit(main())
