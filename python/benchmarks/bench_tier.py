"""Benchmark: tables larger than memory (issue 8, benchmarks 1 and 2), with RocksDB beside it.

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_tier.py                     # both, scaled (~10 min)
    .venv/bin/python python/benchmarks/bench_tier.py --quick             # small sizes (~1 min)
    .venv/bin/python python/benchmarks/bench_tier.py --only training --rows 50000000

**1. training** (the issue's benchmark 1): ``--rows`` rows (default 10M; the issue's 50M needs
about 20 GB for the in-memory reference) x D 32, Adagrad; a memory budget of ``--budget-share``
(default 10 %) of the row bytes the same table takes fully in memory (its ``bytes_reserved``
less ~27 B a row of index), plus that index — every key stays in memory, hot or cold, as in
NeighborKV, so the budget must hold the index before any row; batches of
4,096 ids drawn Zipf(1.05) over the rows (ranks shuffled over the ids), each ``lookup`` +
``apply_gradients`` under ``table.pinned(ids)``. The table is filled through the budget (so it
starts mostly on disk), flushed, ``--warm`` batches warm the cache, then ``--batches`` batches
are timed. The same batches run on the same table held fully in memory (``embstore.Store()``)
for the reference time. Reported: time per batch, tiered / in-memory; the memory hit rate (rows
a batch found in memory / unique rows it used) next to two oracles that keep the most frequent
ids of the whole trace in memory — as many rows as the tier held at the end, and 10 % of the
rows (the issue's); rows read back per batch; the disk bound = in-memory time + cold rows /
``--iops`` (the device's 4 KiB random-read IOPS measured by fio, see docs/benchmarks.md); and
time / bound (goal <= 1.25).

**2. lookups vs RocksDB** (the paper's Table 4 setting, scaled): ``--kv-rows`` rows (default
2M; the issue's 8M needs ~20 GB with RocksDB's cache beside it) of 1 KB (D 256, SGD: 1,024 B
of values), written once; random batches of 10, 100 and 500 ids; average and p99 latency per
batch for embstore (``lookup(ids, on_miss="zeros")``) and RocksDB (``rocksdict``: the same
1,024-byte values under 8-byte keys, block cache of the same bytes as embstore's budget, bloom
filters of 10 bits per key, ``get`` of a list of keys = ``MultiGet``, compression off), in three
regimes: (a) everything fits (budget = the data; RocksDB's cache the same); (b) budget 25 % of
the data, Zipf(0.99) ids; (c) the same budget, uniform ids. Both systems get the same batches,
one system at a time (embstore, then RocksDB): at the issue's 8M rows each needs ~10 GB in
regime (a), too much for both at once on a 24 GiB machine.

**The page cache** is kept out of the cold figures: before each timed phase every file of both
stores is written back and dropped from the page cache with ``posix_fadvise(DONTNEED)``.
embstore's cold reads are ``O_DIRECT`` (never cached); RocksDB's are buffered, so pages it reads
back during a phase may be cached again by the kernel, which favours RocksDB. The stores live
under ``--dir`` (default ``target/`` of the repository, on the same disk as fio's measurement)
and are deleted at the end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from lib.records import finish, log, run_record
from lib.timing import summarize
from lib.workloads import fill, zipf_ids

import embstore


def drop_page_cache(root: pathlib.Path) -> None:
    """Write back and drop every file under ``root`` from the page cache."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --- 1. training -----------------------------------------------------------------------------


def bench_training(args: argparse.Namespace, root: pathlib.Path) -> dict:
    rows, dim = args.rows, 32
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(rows).astype(np.int64)
    batches = [zipf_ids(rng, 1.05, rows, 4096, perm) for _ in range(args.warm + args.batches)]
    grads = rng.standard_normal((4096, dim)).astype(np.float32)

    mem = embstore.Store()
    t = mem.create_table("t", dim, optimizer=embstore.Adagrad(lr=0.05))
    fill(t, rows)
    table_bytes = t.stats()["bytes_reserved"]
    for ids in batches[: args.warm]:
        t.lookup(ids)
        t.apply_gradients(ids, grads)
    t0 = time.perf_counter()
    for ids in batches[args.warm :]:
        t.lookup(ids)
        t.apply_gradients(ids, grads)
    mem_s = (time.perf_counter() - t0) / args.batches
    log(f"training: in memory {mem_s * 1e3:.2f} ms/batch ({table_bytes / 2**30:.2f} GiB table)")
    del t, mem

    # The budget holds the index of every row (hot or cold, ~27 B a row: NeighborKV keeps the
    # whole index in memory) plus the share of the table's row bytes.
    index_bytes = rows * 27
    budget = int(index_bytes + (table_bytes - index_bytes) * args.budget_share)
    path = root / "training"
    store = embstore.Store(
        path,
        memory_budget_bytes=budget,
        background_eviction=not args.sync_eviction,
        eviction=args.eviction,
    )
    t = store.create_table("t", dim, optimizer=embstore.Adagrad(lr=0.05))
    fill_s = fill(t, rows)
    store.flush()
    log(
        f"training: filled {rows:,} rows through a {budget / 2**20:.0f} MiB budget in "
        f"{fill_s:.1f} s; {t.stats()['rows_on_disk']:,} on disk"
    )
    for ids in batches[: args.warm]:
        with t.pinned(ids):
            t.lookup(ids)
            t.apply_gradients(ids, grads)
    store.flush()
    drop_page_cache(path)
    s0 = t.stats()
    unique = 0
    t0 = time.perf_counter()
    for ids in batches[args.warm :]:
        with t.pinned(ids):
            t.lookup(ids)
            t.apply_gradients(ids, grads)
        unique += len(np.unique(ids))
    tier_s = (time.perf_counter() - t0) / args.batches
    s1 = t.stats()
    cold = s1["cold_reads"] - s0["cold_reads"]
    ios = s1["cold_read_ios"] - s0["cold_read_ios"]
    hot_rows = s1["rows"] - s1["rows_on_disk"]
    # Oracles: the most frequent ids of the whole trace kept in memory.
    counts = np.bincount(np.concatenate(batches), minlength=rows)
    order = np.argsort(-counts, kind="stable")

    def oracle(k: int, online: bool = False) -> float:
        # The k most frequent ids of the trace held in memory; `online`: an id still misses on
        # its first use in the trace (warm-up included), as it must for any cache that starts
        # cold — the compulsory misses a static oracle does not pay.
        top = np.zeros(rows, bool)
        top[order[:k]] = True
        seen = np.zeros(rows, bool)
        for ids in batches[: args.warm]:
            seen[ids] = True
        hits = 0
        for ids in batches[args.warm :]:
            u = np.unique(ids)
            hits += int((top[u] & seen[u]).sum()) if online else int(top[u].sum())
            seen[u] = True
        return hits / unique

    hit = 1 - cold / unique
    bound = mem_s + (cold / args.batches) / args.iops
    res = {
        "rows": rows,
        "dim": dim,
        "eviction": args.eviction,
        "budget_bytes": budget,
        "table_bytes_in_memory": table_bytes,
        "fill_s": fill_s,
        "memory_ms_per_batch": mem_s * 1e3,
        "tiered_ms_per_batch": tier_s * 1e3,
        "tiered_over_memory": tier_s / mem_s,
        "hit_rate": hit,
        "hot_rows_at_end": hot_rows,
        "oracle_same_rows": oracle(hot_rows),
        "oracle_10pct": oracle(rows // 10),
        "oracle_same_rows_online": oracle(hot_rows, online=True),
        "compulsory_bound": oracle(rows, online=True),
        "cold_rows_per_batch": cold / args.batches,
        "ios_per_cold_row": ios / max(cold, 1),
        "iops_assumed": args.iops,
        "bound_ms_per_batch": bound * 1e3,
        "time_over_bound": tier_s / bound,
        "evicted": s1["evicted_to_disk"] - s0["evicted_to_disk"],
    }
    log(
        f"training: tiered {tier_s * 1e3:.2f} ms/batch, hit rate {hit:.3f}, "
        f"{cold / args.batches:,.0f} cold rows/batch"
    )
    del t, store
    shutil.rmtree(path)
    return res


# --- 2. lookups vs RocksDB ---------------------------------------------------------------------


def kv_keys(ids: np.ndarray) -> list[bytes]:
    """RocksDB keys of ``ids``: 8 bytes little-endian."""
    return [int(k).to_bytes(8, "little") for k in ids]


def latencies(fn: Any, batches: list[np.ndarray]) -> dict:
    lat = []
    for ids in batches:
        t0 = time.perf_counter()
        fn(ids)
        lat.append(time.perf_counter() - t0)
    return summarize(np.array(lat) * 1e3, ("avg", "p99"), suffix="_ms")


def bench_kv(args: argparse.Namespace, root: pathlib.Path) -> dict:
    try:
        import rocksdict
    except ImportError:
        rocksdict = None
        log("kv: rocksdict not installed; RocksDB skipped")
    rows, dim = args.kv_rows, 256
    data_bytes = rows * dim * 4
    rng = np.random.default_rng(args.seed + 1)
    out: dict[str, Any] = {"rows": rows, "value_bytes": dim * 4, "regimes": {}}
    regimes = [
        ("a: fits", 1.25, "uniform"),
        ("b: 25%, Zipf(0.99)", 0.25, "zipf"),
        ("c: 25%, uniform", 0.25, "uniform"),
    ]
    regimes = [r for r in regimes if r[0][0] in args.kv_regimes]
    perm = rng.permutation(rows).astype(np.int64)

    def value_blocks() -> Any:
        """``(first id, float32[n, D])`` blocks of every row's value, the same for both."""
        vals = np.random.default_rng(args.seed + 2)
        for start in range(0, rows, 1 << 15):
            n = min(rows, start + (1 << 15)) - start
            yield start, vals.standard_normal((n, dim)).astype(np.float32)

    for name, share, dist in regimes:
        budget = int(data_bytes * share)
        make = (
            (lambda n: zipf_ids(rng, 0.99, rows, n, perm))
            if dist == "zipf"
            else (lambda n: rng.integers(0, rows, n))
        )
        # The same batches for both systems; one system at a time holds its data and cache
        # (at 8M rows each needs ~10 GB in regime a), embstore first, then RocksDB.
        sizes = {
            bsz: (
                [make(bsz) for _ in range(args.kv_warm)],
                [make(bsz) for _ in range(args.kv_batches)],
            )
            for bsz in (10, 100, 500)
        }
        res: dict[str, Any] = {"budget_bytes": budget} | {f"batch_{b}": {} for b in sizes}
        path = root / "kv-embstore"
        store = embstore.Store(path, memory_budget_bytes=budget)
        t = store.create_table("t", dim, optimizer=embstore.SGD())
        for start, block in value_blocks():
            t.assign(np.arange(start, start + len(block)), block)
        store.flush()
        drop_page_cache(root)
        for bsz, (warm, timed) in sizes.items():
            for ids in warm:
                t.lookup(ids, on_miss="zeros")
            lat = latencies(lambda ids, t=t: t.lookup(ids, on_miss="zeros"), timed)
            res[f"batch_{bsz}"]["embstore"] = lat
            log(f"kv {name} batch {bsz}: embstore {lat['avg_ms']:.3f} ms avg")
        res["rows_on_disk_at_end"] = t.stats()["rows_on_disk"]
        del t, store
        shutil.rmtree(path)
        if rocksdict is not None:
            rpath = root / "kv-rocksdb"
            opts = rocksdict.Options(raw_mode=True)
            opts.create_if_missing(True)
            opts.set_compression_type(rocksdict.DBCompressionType.none())
            table = rocksdict.BlockBasedOptions()
            table.set_block_cache(rocksdict.Cache(budget))
            table.set_bloom_filter(10, False)
            opts.set_block_based_table_factory(table)
            db = rocksdict.Rdict(str(rpath), opts)
            for start, block in value_blocks():
                wb = rocksdict.WriteBatch(raw_mode=True)
                for i, row in enumerate(block):
                    wb.put((start + i).to_bytes(8, "little"), row.tobytes())
                db.write(wb)
            db.flush(True)
            db.compact_range(None, None)
            drop_page_cache(root)
            if share >= 1:
                # Regime (a): everything fits, so RocksDB gets its whole data set in its block
                # cache first (embstore's rows are all in memory since they were written).
                for start in range(0, rows, 1 << 14):
                    db.get(kv_keys(np.arange(start, min(rows, start + (1 << 14)))))
            for bsz, (warm, timed) in sizes.items():
                for ids in warm:
                    db.get(kv_keys(ids))
                r = res[f"batch_{bsz}"]
                r["rocksdb"] = latencies(lambda ids, db=db: db.get(kv_keys(ids)), timed)
                r["rocksdb_over_embstore_avg"] = r["rocksdb"]["avg_ms"] / r["embstore"]["avg_ms"]
                log(
                    f"kv {name} batch {bsz}: RocksDB {r['rocksdb']['avg_ms']:.3f} ms avg "
                    f"({r['rocksdb_over_embstore_avg']:.1f}x embstore)"
                )
            db.close()
            del db
            rocksdict.Rdict.destroy(str(rpath))
        out["regimes"][name] = res
    if rocksdict is not None:
        out["rocksdict"] = importlib.metadata.version("rocksdict")
    return out


def goals(res: dict) -> list[dict]:
    g = []
    if "training" in res:
        tr = res["training"]
        g.append(
            {
                "goal": "training: time per batch <= 1.25 x disk bound",
                "value": tr["time_over_bound"],
                "met": tr["time_over_bound"] <= 1.25,
            }
        )
        g.append(
            {
                "goal": "training: <= 1.2 I/Os per cold row",
                "value": tr["ios_per_cold_row"],
                "met": tr["ios_per_cold_row"] <= 1.2,
            }
        )
        g.append(
            {
                "goal": "training: hit rate >= 0.95 x oracle with compulsory misses (same rows)",
                "value": tr["hit_rate"] / tr["oracle_same_rows_online"],
                "met": tr["hit_rate"] >= 0.95 * tr["oracle_same_rows_online"],
            }
        )
        g.append(
            {
                "goal": "training: hit rate >= 0.95 x oracle (10 % most frequent)",
                "value": tr["hit_rate"] / tr["oracle_10pct"],
                "met": tr["hit_rate"] >= 0.95 * tr["oracle_10pct"],
            }
        )
    if "kv" in res:
        for name in ("a: fits", "b: 25%, Zipf(0.99)"):
            r = res["kv"]["regimes"].get(name, {}).get("batch_500", {})
            if "rocksdb_over_embstore_avg" in r:
                g.append(
                    {
                        "goal": f"kv {name}: RocksDB / embstore avg latency at batch 500 >= 5",
                        "value": r["rocksdb_over_embstore_avg"],
                        "met": r["rocksdb_over_embstore_avg"] >= 5,
                    }
                )
    return g


def report(res: dict) -> None:
    print(f"## bench_tier — {res['date']}, {res['machine']}, commit {res['commit']}\n")
    if "training" in res:
        tr = res["training"]
        print(
            f"### 1. training: {tr['rows']:,} rows x D 32 Adagrad, budget "
            f"{tr['budget_bytes'] / 2**20:.0f} MiB (of {tr['table_bytes_in_memory'] / 2**20:.0f}"
            f" MiB in memory), Zipf(1.05) batches of 4,096\n"
        )
        print("| figure | value |\n|---|---:|")
        for k in (
            "memory_ms_per_batch",
            "tiered_ms_per_batch",
            "tiered_over_memory",
            "hit_rate",
            "oracle_same_rows",
            "oracle_10pct",
            "oracle_same_rows_online",
            "compulsory_bound",
            "hot_rows_at_end",
            "cold_rows_per_batch",
            "ios_per_cold_row",
            "bound_ms_per_batch",
            "time_over_bound",
        ):
            v = tr[k]
            print(f"| {k} | {v:,.3f} |" if isinstance(v, float) else f"| {k} | {v:,} |")
        print()
    if "kv" in res:
        kv = res["kv"]
        print(
            f"### 2. lookups: {kv['rows']:,} rows x 1 KB, embstore vs RocksDB "
            f"{kv.get('rocksdict', '-')} (avg / p99 ms per batch)\n"
        )
        print("| regime | batch | embstore | RocksDB | RocksDB / embstore |")
        print("|---|---:|---:|---:|---:|")
        for name, r in kv["regimes"].items():
            for b in (10, 100, 500):
                x = r[f"batch_{b}"]
                e = x["embstore"]
                k = x.get("rocksdb")
                ks = f"{k['avg_ms']:.3f} / {k['p99_ms']:.3f}" if k else "-"
                ratio = f"{x['rocksdb_over_embstore_avg']:.2f}" if k else "-"
                print(f"| {name} | {b} | {e['avg_ms']:.3f} / {e['p99_ms']:.3f} | {ks} | {ratio} |")
        print()
    for g in res["goals"]:
        print(f"- {g['goal']}: {g['value']:.2f} ({'met' if g['met'] else 'NOT met'})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["training", "kv"], default=None, help="run one benchmark")
    p.add_argument("--rows", type=int, default=10_000_000, help="training rows (10M)")
    p.add_argument("--budget-share", type=float, default=0.10, help="training budget share")
    p.add_argument("--warm", type=int, default=100, help="training warm-up batches")
    p.add_argument("--batches", type=int, default=200, help="training timed batches")
    p.add_argument(
        "--iops",
        type=float,
        default=20_000.0,
        help="the device's 4 KiB random-read IOPS (fio, QD 32), for the disk bound",
    )
    p.add_argument("--kv-rows", type=int, default=2_000_000, help="rows of 1 KB (2M)")
    p.add_argument("--kv-regimes", default="abc", help="which regimes of benchmark 2 to run (abc)")
    p.add_argument("--kv-warm", type=int, default=200, help="warm-up batches per size")
    p.add_argument("--kv-batches", type=int, default=500, help="timed batches per size")
    p.add_argument(
        "--sync-eviction",
        action="store_true",
        help="training: evict on the calling thread (no evictor thread), for an A/B",
    )
    p.add_argument(
        "--eviction",
        default="lru_lfu",
        help="the store's replacement policy: lru_lfu (default), lru, lfu, group_lfu, none",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", type=pathlib.Path, default=None)
    p.add_argument("--quick", action="store_true", help="1M training rows, 200k kv rows")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.rows, args.kv_rows, args.batches, args.kv_batches = 1_000_000, 200_000, 100, 200
    parent = args.dir or pathlib.Path(__file__).resolve().parents[2] / "target"
    parent.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-tier-", dir=parent))
    res: dict[str, Any] = {
        **run_record(),
    }
    try:
        if args.only in (None, "training"):
            res["training"] = bench_training(args, root)
        if args.only in (None, "kv"):
            res["kv"] = bench_kv(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args, goals, report)


if __name__ == "__main__":
    sys.exit(main())
