"""Benchmark: memory per row of the embedded table, measured as process RSS (issue 7).

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_memory.py                  # full sizes (~25 s)
    .venv/bin/python python/benchmarks/bench_memory.py --quick          # rows / 10 (~10 s)
    .venv/bin/python python/benchmarks/bench_memory.py --scenario small --json

The full run needs about 4 GiB of memory at its peak (Adam, 5M rows) and takes about 25 s on a
2-core AMD EPYC. Shape letters: ``D`` embedding_dim, ``S`` optimizer state floats per row
(``Table.state_dim``). ``raw`` is what the rows themselves need: ``rows x (D + S) x 4`` bytes.

Every measurement runs in its own fresh interpreter (this script re-run with ``sys.executable``),
so that no earlier table, allocator arena or page cache of the parent inflates it. A child reads
``VmRSS`` from ``/proc/self/status`` once after importing numpy and embstore, creating the
``Store`` and allocating (and touching) its id and output buffers — the baseline — and again
after the work; the figure is the growth. Before every reading it runs ``gc.collect()`` and
glibc's ``malloc_trim(0)`` (through ctypes), so freed heap memory of Python, numpy and the
native module is given back to the kernel and not counted. ``stats()["bytes"]`` (and
``bytes_used`` / ``bytes_reserved`` where the table reports them) is recorded beside RSS.

1. ``rows``: 5,000,000 rows (``--rows``), D = 64 (``--dim``), for each of SGD (S = 0), Adagrad
   (S = D) and Adam (S = 2D); default table settings (8 shards, huge pages on, Normal init).
   Rows are inserted by ``table.lookup(ids, on_miss="init")`` in batches of 65,536 distinct
   random 64-bit ids (a bijective 64-bit mix of a counter: random-looking, never repeated).
   Reported: bytes per row beyond raw, from RSS and from ``stats()``. Goal: <= 48 B/row.
2. ``small``: 100 tables (``--tables``) x 1,000 rows (``--table-rows``), Adam, D = 64, default
   settings, once with huge pages on (the default) and once with ``huge_pages=False``.
   Reported: RSS growth / raw. Goal: <= 1.5x.
3. ``shrink``: 2,000,000 rows (``--shrink-rows``), D = 64, Adagrad: fill as in 1, then
   ``table.remove()`` a random 90 % of the ids (batches of 65,536), measure; then
   ``table.clear()``, measure. A separate child fills a fresh table with only the surviving
   10 % (the live rows' needs). Goal: RSS growth after removal <= 1.5 x the fresh table's. Also
   reported: growth after removal / raw bytes of the live rows, and growth after ``clear()``
   (should fall back near the empty table's).

4. ``budget``: a durable store with ``memory_budget_bytes`` of ``--budget-mib`` (64) over
   ``--budget-rows`` rows (1,000,000; 250,000 with ``--quick``) of D = ``--budget-dim`` (256),
   Adagrad: 2 GiB of rows (values and state), 32x the budget. Here RSS is read from
   ``/proc/self/statm`` with **no** ``gc`` or ``malloc_trim`` from the script: the store must
   give memory back itself. Baseline: after importing, opening the store and allocating (and
   touching) every buffer. Phases: fill (``lookup(on_miss="init")`` of 65,536 new ids a call),
   ``flush()``; ``--budget-steps`` (200) training steps of 4,096 ids drawn Zipf(1.1) over the
   rows (``lookup`` + ``apply_gradients`` under ``table.pinned(ids)``); one lookup of
   ``--large-ids`` (300,000) distinct random ids, most of them on disk; 20 more steps.
   Reported: RSS above the baseline at its highest after a call of each phase and at the end
   of each, and ``store.memory_budget``. Goals: through training and after the large call,
   RSS above the baseline <= 1.5 x the budget + 32 MiB.

5. ``demo``: ``examples/movielens_ctr.py`` (``make demo``; its closing run holds every key's
   index plus 20 % of the rows' bytes), run ``--demo-runs`` (2) times; from its last line, the
   budget and the most its store held after a training step, as the store counts
   (``store.memory_budget``). Goal: <= 1.5 x the budget. Skipped when MovieLens-100k is not
   under ``--data-dir`` (``make data``).

``--no-huge-pages`` passes ``huge_pages=False`` to the tables of scenarios 1 and 3 (scenario 2
runs both variants anyway). ``--dtype bf16`` (or ``fp16``) stores the row values of scenarios 1-3
at 2 bytes each (``create_table(dtype=...)``; optimizer state stays 4 bytes), and ``raw`` counts
them at 2 bytes; compare ``RSS B/row`` (growth / rows) between a ``--dtype fp32`` and a
``--dtype bf16`` run (``--scenario rows``). Progress goes to stderr; results (markdown tables, or
one JSON object with ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime as dt
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from lib.records import cpu_model, finish, git_commit, log

import embstore

SCENARIOS = ("rows", "small", "shrink", "budget", "demo")
OPTIMIZERS = ("SGD", "Adagrad", "Adam")
BATCH = 65_536
REMOVE_FRACTION = 0.9
GOAL_BEYOND_RAW_B = 48.0
GOAL_SMALL_RATIO = 1.5
GOAL_SHRINK_RATIO = 1.5
# Scenario budget: RSS above the baseline <= GOAL_BUDGET_RATIO x budget + GOAL_BUDGET_SLACK.
GOAL_BUDGET_RATIO = 1.5
GOAL_BUDGET_SLACK = 32 << 20
# Scenario demo: the most held after a step <= GOAL_DEMO_RATIO x the budget.
GOAL_DEMO_RATIO = 1.5
REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN_BATCH = 4096
MIB = 1 << 20


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=None, help="rows, scenario rows (default 5M)")
    p.add_argument("--dim", type=int, default=64, help="embedding_dim (default 64)")
    p.add_argument(
        "--shrink-rows", type=int, default=None, help="rows filled, scenario shrink (default 2M)"
    )
    p.add_argument("--tables", type=int, default=100, help="tables, scenario small (100)")
    p.add_argument(
        "--table-rows", type=int, default=1000, help="rows per table, scenario small (1000)"
    )
    p.add_argument("--budget-mib", type=int, default=64, help="memory budget, scenario budget")
    p.add_argument(
        "--budget-rows", type=int, default=None, help="rows, scenario budget (default 1M)"
    )
    p.add_argument("--budget-dim", type=int, default=256, help="embedding_dim, scenario budget")
    p.add_argument("--budget-steps", type=int, default=200, help="training steps, scenario budget")
    p.add_argument(
        "--large-ids", type=int, default=300_000, help="ids of the large lookup, scenario budget"
    )
    p.add_argument(
        "--data-dir",
        default=str(REPO / ".data" / "ml-100k"),
        help="MovieLens-100k, scenario demo (default .data/ml-100k)",
    )
    p.add_argument("--demo-runs", type=int, default=2, help="runs of the demo, scenario demo")
    p.add_argument("--seed", type=int, default=0, help="seed of the ids")
    p.add_argument(
        "--scenario", choices=SCENARIOS, action="append", help="run only this one (repeatable)"
    )
    p.add_argument("--quick", action="store_true", help="rows=500k, shrink-rows=200k")
    p.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="huge_pages=False for the tables of scenarios rows and shrink (default: on)",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="storage dtype of the row values, scenarios rows, small and shrink (default fp32)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    # Internal: run one measurement (a JSON spec) in this fresh process and print its result.
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rows is None:
        a.rows = 500_000 if a.quick else 5_000_000
    if a.shrink_rows is None:
        a.shrink_rows = 200_000 if a.quick else 2_000_000
    if a.budget_rows is None:
        a.budget_rows = 250_000 if a.quick else 1_000_000
    for name in (
        "rows",
        "dim",
        "shrink_rows",
        "tables",
        "table_rows",
        "budget_mib",
        "budget_rows",
        "budget_dim",
        "budget_steps",
        "large_ids",
    ):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.shrink_rows < 10:
        p.error("--shrink-rows must be >= 10 (10 % of them survive)")
    if a.large_ids > a.budget_rows:
        p.error("--large-ids must be <= --budget-rows")
    a.scenario = list(dict.fromkeys(a.scenario or SCENARIOS))
    return a


# ---------------------------------------------------------------------------------------------
# Child side: one measurement in a fresh process


_MALLOC_TRIM = None


def malloc_trim() -> None:
    """glibc ``malloc_trim(0)``: give freed heap memory back to the kernel (no-op elsewhere)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


def read_kib(path: str, keys: Sequence[str]) -> dict[str, int]:
    """``key: value`` lines of a /proc file, in bytes (the file gives kB); missing keys are 0."""
    out = dict.fromkeys(keys, 0)
    try:
        with open(path) as f:
            for ln in f:
                k, _, v = ln.partition(":")
                if k in out:
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def memory() -> dict[str, int]:
    """This process's memory after ``gc.collect()`` and ``malloc_trim(0)``: ``rss`` (VmRSS),
    ``peak`` (VmHWM) and ``thp`` (AnonHugePages: the part of RSS on transparent huge pages)."""
    gc.collect()
    malloc_trim()
    s = read_kib("/proc/self/status", ("VmRSS", "VmHWM"))
    thp = read_kib("/proc/self/smaps_rollup", ("AnonHugePages",))["AnonHugePages"]
    return {"rss": s["VmRSS"], "peak": s["VmHWM"], "thp": thp}


def mix(out: np.ndarray, seed: int) -> np.ndarray:
    """Replace each ``out[i]`` (uint64) by ``mix(seed, out[i])`` in place and return ``out``.
    The mix is splitmix64's finalizer, a bijection of 64-bit integers, so distinct counters
    give distinct, random-looking ids."""
    out += np.uint64((seed * 0x9E3779B97F4A7C15) & (2**64 - 1))
    out ^= out >> np.uint64(30)
    out *= np.uint64(0xBF58476D1CE4E5B9)
    out ^= out >> np.uint64(27)
    out *= np.uint64(0x94D049BB133111EB)
    out ^= out >> np.uint64(31)
    return out


def counter_ids(out: np.ndarray, start: int, seed: int) -> np.ndarray:
    """``out[i] = mix(seed, start + i)``, in place."""
    out[:] = np.arange(start, start + len(out), dtype=np.uint64)
    return mix(out, seed)


def table_stats(table: Any) -> dict[str, Any]:
    """The byte counts of ``table.stats()``: ``bytes`` and, when reported, ``bytes_used`` and
    ``bytes_reserved``."""
    s = table.stats()
    out = {"rows": s["rows"], "bytes": s["bytes"]}
    for k in ("bytes_used", "bytes_reserved"):
        if s.get(k) is not None:
            out[k] = s[k]
    return out


def add_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The sum of two ``table_stats`` (a key only one side has is dropped)."""
    return {k: a[k] + b[k] for k in a if k in b}


def statm_rss() -> int:
    """This process's resident bytes, from ``/proc/self/statm`` (no ``gc``, no trim)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def budget_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Scenario budget (see the module docs), in this fresh process."""
    import tempfile

    dim, rows, budget = spec["dim"], spec["rows"], spec["budget"]
    root = pathlib.Path(__file__).resolve().parents[2] / "target"
    root.mkdir(exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="bench-memory-", dir=root)
    rng = np.random.default_rng(spec["seed"])
    ids = np.ones(BATCH, np.int64)
    out = np.ones((BATCH, dim), np.float32)
    large = np.ones(spec["large_ids"], np.int64)
    large_out = np.ones((spec["large_ids"], dim), np.float32)
    step_out = np.ones((TRAIN_BATCH, dim), np.float32)
    grads = np.full((TRAIN_BATCH, dim), 0.01, np.float32)
    store = embstore.Store(tmp.name + "/store", memory_budget_bytes=budget)
    table = store.create_table("t", embedding_dim=dim, optimizer=embstore.Adagrad(lr=0.01))
    base = statm_rss()
    res: dict[str, Any] = {"spec": spec, "rss_base": base}

    def above() -> int:
        return statm_rss() - base

    t0 = time.perf_counter()
    peak = 0
    for lo in range(0, rows, BATCH):
        n = min(BATCH, rows - lo)
        ids[:n] = np.arange(lo, lo + n)
        table.lookup(ids[:n], on_miss="init", out=out[:n])
        peak = max(peak, above())
    store.flush()
    res["fill"] = {"seconds": time.perf_counter() - t0, "peak": peak, "end": above()}
    res["fill"]["memory_budget"] = list(store.memory_budget)
    log(f"  filled {rows:,} rows in {res['fill']['seconds']:.1f} s; RSS +{peak / MIB:.0f} MiB")

    def train(steps: int) -> dict[str, Any]:
        top, t0 = 0, time.perf_counter()
        for _ in range(steps):
            b = (rng.zipf(1.1, TRAIN_BATCH) - 1) % rows
            with table.pinned(b):
                table.lookup(b, out=step_out)
                table.apply_gradients(b, grads)
            top = max(top, above())
        return {
            "steps": steps,
            "seconds": time.perf_counter() - t0,
            "peak": top,
            "end": above(),
            "memory_budget": list(store.memory_budget),
        }

    res["train"] = train(spec["steps"])
    log(f"  training: RSS at most +{res['train']['peak'] / MIB:.0f} MiB")
    large[:] = rng.choice(rows, len(large), replace=False)
    t0 = time.perf_counter()
    table.lookup(large, on_miss="zeros", out=large_out)
    res["large"] = {
        "ids": len(large),
        "seconds": time.perf_counter() - t0,
        "end": above(),
        "memory_budget": list(store.memory_budget),
    }
    log(f"  after a lookup of {len(large):,} ids: RSS +{res['large']['end'] / MIB:.0f} MiB")
    res["after"] = train(20)
    res["stats"] = {
        k: v for k, v in table.stats().items() if isinstance(v, int) and k != "rows_per_shard"
    }
    store.close()
    tmp.cleanup()
    return res


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["scenario"] == "budget":
        return budget_child(spec)
    optimizers = {"SGD": embstore.SGD, "Adagrad": embstore.Adagrad, "Adam": embstore.Adam}
    store = embstore.Store()
    dim = spec["dim"]
    ids = np.ones(BATCH, np.uint64)  # touched before the baseline, reused for every batch
    values = np.ones((BATCH, dim), np.float32)
    base = memory()
    res: dict[str, Any] = {"spec": spec, "base": base}

    def create(name: str) -> Any:
        return store.create_table(
            name,
            embedding_dim=dim,
            optimizer=optimizers[spec["optimizer"]](),
            huge_pages=spec["huge_pages"],
            dtype=spec.get("dtype", "fp32"),
        )

    def fill(table: Any, n: int, counters: np.ndarray | None = None) -> float:
        """Insert the ids of counters ``0..n-1`` (or of ``counters[:n]``) with
        ``lookup(on_miss="init")``; return the seconds it took."""
        t0 = time.perf_counter()
        for lo in range(0, n, BATCH):
            b = ids[: min(BATCH, n - lo)]
            if counters is None:
                counter_ids(b, lo, spec["seed"])
            else:
                b[:] = counters[lo : lo + len(b)]
                mix(b, spec["seed"])
            table.lookup(b, on_miss="init", out=values[: len(b)])
        return time.perf_counter() - t0

    if spec["scenario"] == "small":
        n = spec["table_rows"]
        tables = [create(f"t{i}") for i in range(spec["tables"])]
        t0 = time.perf_counter()
        for i, t in enumerate(tables):
            t.lookup(counter_ids(ids[:n], i * n, spec["seed"]), on_miss="init", out=values[:n])
        res["fill_s"] = time.perf_counter() - t0
        res["state_dim"] = tables[0].state_dim
        total = table_stats(tables[0])
        for t in tables[1:]:
            total = add_stats(total, table_stats(t))
        res["stats"] = total
        res["after"] = memory()
        return res

    table = create("bench")
    res["state_dim"] = table.state_dim
    n = spec["rows"]
    if spec["scenario"] == "rows":
        res["fill_s"] = fill(table, n)
        res["stats"] = table_stats(table)
        res["after"] = memory()
        return res

    # shrink: the same permutation in the "shrink" and "shrink_fresh" children; its first 90 %
    # are removed, the rest survive. It is dropped before each reading.
    def permutation() -> np.ndarray:
        return np.random.default_rng(spec["seed"]).permutation(n).astype(np.uint64)

    n_removed = int(n * REMOVE_FRACTION)
    if spec["scenario"] == "shrink_fresh":
        live = permutation()[n_removed:]
        res["fill_s"] = fill(table, len(live), live)
        del live
        res["stats"] = table_stats(table)
        res["after"] = memory()
        return res
    res["empty"] = memory()
    res["empty_stats"] = table_stats(table)
    res["fill_s"] = fill(table, n)
    res["filled"] = memory()
    res["filled_stats"] = table_stats(table)
    order = permutation()
    t0 = time.perf_counter()
    removed = 0
    for lo in range(0, n_removed, BATCH):
        b = ids[: min(BATCH, n_removed - lo)]
        b[:] = order[lo : lo + len(b)]
        removed += table.remove(mix(b, spec["seed"]))
    res["remove_s"] = time.perf_counter() - t0
    res["removed"] = removed
    del order
    res["after_remove"] = memory()
    res["after_remove_stats"] = table_stats(table)
    table.clear()
    res["after_clear"] = memory()
    res["after_clear_stats"] = table_stats(table)
    return res


# ---------------------------------------------------------------------------------------------
# Parent side: run the children, derive the figures


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; its progress goes to our stderr."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"error: measurement {spec} failed with exit status {p.returncode}")
    return json.loads(p.stdout)


VALUE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def raw_bytes(rows: int, dim: int, state_dim: int, dtype: str = "fp32") -> int:
    """What the rows need: ``D`` values of the dtype and ``S`` f32 state floats each."""
    return rows * (dim * VALUE_BYTES[dtype] + state_dim * 4)


def per_row_beyond_raw(total: int, rows: int, raw: int) -> float:
    return (total - raw) / rows


def scenario_rows(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for opt in OPTIMIZERS:
        log(f"rows: {opt}, {args.rows:,} rows x dim {args.dim}")
        r = run_child(
            {
                "scenario": "rows",
                "optimizer": opt,
                "rows": args.rows,
                "dim": args.dim,
                "huge_pages": not args.no_huge_pages,
                "seed": args.seed,
                "dtype": args.dtype,
            }
        )
        rows, s = r["stats"]["rows"], r["stats"]
        raw = raw_bytes(rows, args.dim, r["state_dim"], args.dtype)
        growth = r["after"]["rss"] - r["base"]["rss"]
        res = {
            "rows": rows,
            "dim": args.dim,
            "state_dim": r["state_dim"],
            "raw_bytes": raw,
            "rss_base": r["base"]["rss"],
            "rss_after": r["after"]["rss"],
            "rss_growth": growth,
            "thp_growth": r["after"]["thp"] - r["base"]["thp"],
            "rss_peak": r["after"]["peak"],
            "stats": s,
            "fill_s": r["fill_s"],
            "beyond_raw_per_row": {"rss": per_row_beyond_raw(growth, rows, raw)},
            "rss_per_row": growth / rows,
        }
        for k in ("bytes", "bytes_used", "bytes_reserved"):
            if k in s:
                res["beyond_raw_per_row"][k] = per_row_beyond_raw(s[k], rows, raw)
        log(
            f"  {rows:,} rows in {r['fill_s']:.1f} s; RSS +{growth / MIB:,.0f} MiB, "
            f"{res['rss_per_row']:.1f} B/row, {res['beyond_raw_per_row']['rss']:.1f} B/row "
            "beyond raw"
        )
        out[opt] = res
    return out


def scenario_small(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for hp in (True, False):
        key = "huge_pages" if hp else "no_huge_pages"
        log(f"small: {args.tables} tables x {args.table_rows:,} rows, Adam, huge_pages={hp}")
        r = run_child(
            {
                "scenario": "small",
                "optimizer": "Adam",
                "tables": args.tables,
                "table_rows": args.table_rows,
                "dim": args.dim,
                "huge_pages": hp,
                "seed": args.seed,
                "dtype": args.dtype,
            }
        )
        rows = r["stats"]["rows"]
        raw = raw_bytes(rows, args.dim, r["state_dim"], args.dtype)
        growth = r["after"]["rss"] - r["base"]["rss"]
        res = {
            "tables": args.tables,
            "rows": rows,
            "dim": args.dim,
            "state_dim": r["state_dim"],
            "huge_pages": hp,
            "raw_bytes": raw,
            "rss_base": r["base"]["rss"],
            "rss_after": r["after"]["rss"],
            "rss_growth": growth,
            "thp_growth": r["after"]["thp"] - r["base"]["thp"],
            "stats": r["stats"],
            "fill_s": r["fill_s"],
            "rss_over_raw": growth / raw,
            "stats_over_raw": {k: r["stats"][k] / raw for k in r["stats"] if k != "rows"},
        }
        log(f"  RSS +{growth / MIB:,.1f} MiB = {res['rss_over_raw']:.2f}x raw")
        out[key] = res
    return out


def scenario_shrink(args: argparse.Namespace) -> dict[str, Any]:
    spec = {
        "scenario": "shrink",
        "optimizer": "Adagrad",
        "rows": args.shrink_rows,
        "dim": args.dim,
        "huge_pages": not args.no_huge_pages,
        "seed": args.seed,
        "dtype": args.dtype,
    }
    log(f"shrink: fill {args.shrink_rows:,} rows, Adagrad, remove {REMOVE_FRACTION:.0%}, clear")
    r = run_child(spec)
    log("shrink: a fresh table of the surviving rows, in another process")
    f = run_child({**spec, "scenario": "shrink_fresh"})
    base = r["base"]["rss"]
    live = r["after_remove_stats"]["rows"]
    raw_live = raw_bytes(live, args.dim, r["state_dim"], args.dtype)
    fresh_growth = f["after"]["rss"] - f["base"]["rss"]
    res: dict[str, Any] = {
        "rows_filled": r["filled_stats"]["rows"],
        "rows_removed": r["removed"],
        "rows_live": live,
        "dim": args.dim,
        "state_dim": r["state_dim"],
        "raw_bytes_filled": raw_bytes(
            r["filled_stats"]["rows"], args.dim, r["state_dim"], args.dtype
        ),
        "raw_bytes_live": raw_live,
        "rss_base": base,
        "fill_s": r["fill_s"],
        "remove_s": r["remove_s"],
        "rss_peak": r["after_clear"]["peak"],
    }
    for state in ("empty", "filled", "after_remove", "after_clear"):
        res[state] = {"rss_growth": r[state]["rss"] - base, "stats": r[f"{state}_stats"]}
    res["fresh"] = {
        "rows": f["stats"]["rows"],
        "rss_base": f["base"]["rss"],
        "rss_growth": fresh_growth,
        "stats": f["stats"],
    }
    after = res["after_remove"]["rss_growth"]
    res["after_remove_over_fresh"] = after / fresh_growth if fresh_growth > 0 else float("inf")
    res["after_remove_over_raw_live"] = after / raw_live
    res["fresh_over_raw_live"] = fresh_growth / raw_live
    log(
        f"  after remove RSS +{after / MIB:,.0f} MiB, fresh +{fresh_growth / MIB:,.0f} MiB "
        f"({res['after_remove_over_fresh']:.2f}x); after clear "
        f"+{res['after_clear']['rss_growth'] / MIB:,.1f} MiB"
    )
    return res


def scenario_budget(args: argparse.Namespace) -> dict[str, Any]:
    budget = args.budget_mib * MIB
    log(
        f"budget: {args.budget_mib} MiB over {args.budget_rows:,} rows x dim {args.budget_dim}, "
        f"Adagrad"
    )
    r = run_child(
        {
            "scenario": "budget",
            "budget": budget,
            "rows": args.budget_rows,
            "dim": args.budget_dim,
            "steps": args.budget_steps,
            "large_ids": args.large_ids,
            "seed": args.seed,
        }
    )
    r["budget"] = budget
    r["raw_bytes"] = raw_bytes(args.budget_rows, args.budget_dim, args.budget_dim)
    r["goal_bytes"] = int(GOAL_BUDGET_RATIO * budget + GOAL_BUDGET_SLACK)
    return r


def scenario_demo(args: argparse.Namespace) -> dict[str, Any]:
    import re

    data = pathlib.Path(args.data_dir)
    if not (data / "ml-100k.inter").exists():
        log(f"demo: skipped, no MovieLens-100k under {data} (make data)")
        return {"skipped": f"no MovieLens-100k under {data}"}
    line = re.compile(r"\(([\d,]+) KiB incl\. the index;.* at most ([\d,]+) KiB held")
    runs = []
    for i in range(args.demo_runs):
        log(f"demo: run {i + 1} of {args.demo_runs}")
        cmd = [sys.executable, str(REPO / "examples" / "movielens_ctr.py"), "--data-dir", str(data)]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        m = line.search(p.stdout)
        if p.returncode != 0 or m is None:
            raise SystemExit(f"error: the demo failed (exit status {p.returncode})")
        budget, held = (int(g.replace(",", "")) << 10 for g in m.groups())
        runs.append({"budget": budget, "held": held, "line": p.stdout.strip().splitlines()[-1]})
        log(f"  at most {held >> 10:,} KiB held for a budget of {budget >> 10:,} KiB")
    return {"runs": runs}


def goals(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    sc = res["scenarios"]
    for opt, r in sc.get("rows", {}).items():
        v = r["beyond_raw_per_row"]["rss"]
        out.append(
            {
                "scenario": "rows",
                "goal": f"{opt}, {r['rows']:,} rows: RSS beyond raw "
                f"<= {GOAL_BEYOND_RAW_B:.0f} B/row",
                "value": v,
                "unit": "B/row",
                "met": v <= GOAL_BEYOND_RAW_B,
            }
        )
    for r in sc.get("small", {}).values():
        v = r["rss_over_raw"]
        hp = "on" if r["huge_pages"] else "off"
        out.append(
            {
                "scenario": "small",
                "goal": f"{r['tables']} tables x {r['rows'] // r['tables']:,} rows, huge pages "
                f"{hp}: RSS <= {GOAL_SMALL_RATIO}x raw",
                "value": v,
                "unit": "x raw",
                "met": v <= GOAL_SMALL_RATIO,
            }
        )
    if "shrink" in sc:
        r = sc["shrink"]
        v = r["after_remove_over_fresh"]
        out.append(
            {
                "scenario": "shrink",
                "goal": f"{r['rows_filled']:,} rows, {REMOVE_FRACTION:.0%} removed: RSS <= "
                f"{GOAL_SHRINK_RATIO}x a fresh table of the live rows",
                "value": v,
                "unit": "x fresh",
                "met": v <= GOAL_SHRINK_RATIO,
            }
        )
    if "budget" in sc:
        r = sc["budget"]
        bound = f"{GOAL_BUDGET_RATIO}x the budget + {GOAL_BUDGET_SLACK >> 20} MiB"
        for label, v in (
            ("through training", max(r["train"]["peak"], r["after"]["peak"])),
            ("after a large call", r["large"]["end"]),
        ):
            out.append(
                {
                    "scenario": "budget",
                    "goal": f"{r['budget'] >> 20} MiB budget over {r['raw_bytes'] / 2**30:.1f} "
                    f"GiB of rows, {label}: RSS <= {bound} ({r['goal_bytes'] / MIB:.0f} MiB)",
                    "value": v / MIB,
                    "unit": "MiB",
                    "met": v <= r["goal_bytes"],
                }
            )
    if sc.get("demo", {}).get("runs"):
        runs = sc["demo"]["runs"]
        v = max(r["held"] / r["budget"] for r in runs)
        out.append(
            {
                "scenario": "demo",
                "goal": f"the demo at 20 % ({len(runs)} runs): the most held after a step <= "
                f"{GOAL_DEMO_RATIO}x its budget ({runs[0]['budget'] >> 10:,} KiB)",
                "value": v,
                "unit": "x budget",
                "met": v <= GOAL_DEMO_RATIO,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Report


def machine() -> dict[str, Any]:
    cpu = cpu_model()
    try:
        thp = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        thp = thp.split("[", 1)[1].split("]", 1)[0] if "[" in thp else thp.strip()
    except OSError:
        thp = "?"
    mem = read_kib("/proc/meminfo", ("MemTotal",))["MemTotal"]
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "mem_total": mem,
        "thp_enabled": thp,
        "malloc_trim": bool(_MALLOC_TRIM),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "embstore": os.path.dirname(embstore.__file__),
        "commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def md_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def mib(b: float) -> str:
    return f"{b / MIB:,.1f}"


def opt_stat(s: dict[str, Any], key: str, f: Any = mib) -> str:
    return f(s[key]) if key in s else "-"


def report(res: dict[str, Any]) -> None:
    c, m = res["config"], res["machine"]
    print(
        f"bench_memory: dim={c['dim']} rows={c['rows']:,} shrink_rows={c['shrink_rows']:,} "
        f"small={c['tables']}x{c['table_rows']:,} batch={BATCH:,} seed={c['seed']} "
        f"huge_pages={c['huge_pages']} (rows, shrink); RSS = VmRSS growth over a fresh "
        f"process's baseline, after gc + malloc_trim(0)\n"
    )
    print(
        f"machine: {m['cpu']}, nproc={m['nproc']}, {m['mem_total'] / 2**30:.0f} GiB, THP "
        f"{m['thp_enabled']}; numpy {m['numpy']}; commit {m['commit']}; {m['date']}\n"
    )
    md_table(
        ["goal", "measured", "met"],
        [
            [g["goal"], f"{g['value']:.2f} {g['unit']}", "yes" if g["met"] else "**no**"]
            for g in res["goals"]
        ],
    )
    sc = res["scenarios"]
    if "rows" in sc:
        print(
            f"rows ({c['dtype']} values): RSS B/row = RSS growth / rows; bytes per row beyond "
            "raw = (total - rows x (D x value bytes + S x 4)) / rows\n"
        )
        rows = []
        for opt, r in sc["rows"].items():
            b = r["beyond_raw_per_row"]
            rows.append(
                [
                    f"{opt} (S={r['state_dim']})",
                    f"{r['rows']:,}",
                    mib(r["raw_bytes"]),
                    mib(r["rss_growth"]),
                    f"{r['rss_growth'] / r['rows']:.1f}",
                    f"{b['rss']:.1f}",
                    f"{b['bytes']:.1f}",
                    opt_stat(b, "bytes_used", lambda v: f"{v:.1f}"),
                    opt_stat(b, "bytes_reserved", lambda v: f"{v:.1f}"),
                    f"{r['fill_s']:.1f}",
                ]
            )
        md_table(
            [
                "optimizer",
                "rows",
                "raw MiB",
                "RSS MiB",
                "RSS B/row",
                "RSS B/row beyond raw",
                "bytes B/row",
                "bytes_used B/row",
                "bytes_reserved B/row",
                "fill s",
            ],
            rows,
        )
    if "small" in sc:
        print("small: Adam tables, RSS and stats bytes summed over the tables\n")
        rows = []
        for r in sc["small"].values():
            s = r["stats"]
            rows.append(
                [
                    "on" if r["huge_pages"] else "off",
                    f"{r['tables']} x {r['rows'] // r['tables']:,}",
                    mib(r["raw_bytes"]),
                    mib(r["rss_growth"]),
                    f"{r['rss_over_raw']:.2f}",
                    mib(s["bytes"]),
                    opt_stat(s, "bytes_used"),
                    opt_stat(s, "bytes_reserved"),
                ]
            )
        md_table(
            [
                "huge pages",
                "tables x rows",
                "raw MiB",
                "RSS MiB",
                "RSS / raw",
                "bytes MiB",
                "bytes_used MiB",
                "bytes_reserved MiB",
            ],
            rows,
        )
    if "budget" in sc:
        r = sc["budget"]
        print(
            f"budget: {r['budget'] >> 20} MiB over {r['spec']['rows']:,} rows x dim "
            f"{r['spec']['dim']} Adagrad ({mib(r['raw_bytes'])} MiB of rows); RSS above the "
            f"baseline, no trim from the script\n"
        )
        rows = []
        for label, ph in (
            ("fill", r["fill"]),
            (f"training, {r['train']['steps']} steps", r["train"]),
            (f"lookup of {r['large']['ids']:,} ids", r["large"]),
            (f"training, {r['after']['steps']} more steps", r["after"]),
        ):
            rows.append(
                [
                    label,
                    mib(ph["peak"]) if "peak" in ph else "-",
                    mib(ph["end"]),
                    mib(ph["memory_budget"][1]),
                    f"{ph['seconds']:.1f}",
                ]
            )
        md_table(["phase", "RSS max MiB", "RSS end MiB", "budget used MiB", "s"], rows)
    if "shrink" in sc:
        r = sc["shrink"]
        print(
            f"shrink: Adagrad, {r['rows_filled']:,} rows filled, {r['rows_removed']:,} removed; "
            f"raw of the live rows {mib(r['raw_bytes_live'])} MiB\n"
        )
        fresh, raw_live = r["fresh"]["rss_growth"], r["raw_bytes_live"]
        rows = []
        for label, st in (
            ("empty table", r["empty"]),
            (f"filled, {r['rows_filled']:,} rows", r["filled"]),
            (f"after remove, {r['rows_live']:,} live", r["after_remove"]),
            (f"fresh table, {r['fresh']['rows']:,} rows (own process)", r["fresh"]),
            ("after clear()", r["after_clear"]),
        ):
            g, s = st["rss_growth"], st["stats"]
            rows.append(
                [
                    label,
                    mib(g),
                    f"{g / fresh:.2f}" if fresh > 0 else "-",
                    f"{g / raw_live:.2f}",
                    mib(s["bytes"]),
                    opt_stat(s, "bytes_used"),
                    opt_stat(s, "bytes_reserved"),
                ]
            )
        md_table(
            [
                "state",
                "RSS MiB",
                "/ fresh",
                "/ raw live",
                "bytes MiB",
                "bytes_used MiB",
                "bytes_reserved MiB",
            ],
            rows,
        )


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(child(spec)))
        return 0
    malloc_trim()  # resolves _MALLOC_TRIM for the machine record
    res: dict[str, Any] = {
        "benchmark": "memory",
        "config": {
            "rows": args.rows,
            "dim": args.dim,
            "shrink_rows": args.shrink_rows,
            "tables": args.tables,
            "table_rows": args.table_rows,
            "batch": BATCH,
            "remove_fraction": REMOVE_FRACTION,
            "seed": args.seed,
            "huge_pages": not args.no_huge_pages,
            "dtype": args.dtype,
            "budget_mib": args.budget_mib,
            "budget_rows": args.budget_rows,
            "budget_dim": args.budget_dim,
            "budget_steps": args.budget_steps,
            "large_ids": args.large_ids,
            "demo_runs": args.demo_runs,
            "scenarios": args.scenario,
        },
        "machine": machine(),
        "scenarios": {},
    }
    log(f"bench_memory: scenarios {', '.join(args.scenario)}")
    run = {
        "rows": scenario_rows,
        "small": scenario_small,
        "shrink": scenario_shrink,
        "budget": scenario_budget,
        "demo": scenario_demo,
    }
    for name in args.scenario:
        res["scenarios"][name] = run[name](args)
    status = finish(res, args, goals, report)
    if args.json_out:
        pathlib.Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
