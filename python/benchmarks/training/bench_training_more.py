"""Two more training benchmarks on the workload of :mod:`bench_training` (embstore only):

``staleness``
    The same run at staleness 0 and 1 (``store.session(..., staleness=1)``: a batch's rows
    gathered while the batch before trains), alternating, at each process count; prints the
    medians and the paired ratios of examples/s (1 over 0) and the AUCs.

``large``
    A store larger than memory: ``--fill`` creates every row of all ``--total-rows`` (200M by
    default: ~34 GB on disk at dim 16 with Adagrad) before training, each process holding the
    index of its rows and ``--memory-budget-share`` (10 %) of their bytes in memory; then the
    same run with every row it touches in memory (rows created on first use: a row's initial
    values depend only on its id, so both runs compute the same). Prints throughput, the ratio,
    cold rows and bytes read per batch and per cold row, per-stage times and RSS.

Run from embstore's virtualenv::

    .venv/bin/python python/benchmarks/training/bench_training_more.py staleness \\
        --processes 1,2 --repeats 3 --json docs/data/training-staleness.json
    .venv/bin/python python/benchmarks/training/bench_training_more.py large \\
        --processes 2 --json docs/data/training-large.json

``--quick``: a smoke run (small tables, few batches, one repeat).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth_ctr  # noqa: E402
from bench_training import run_one  # noqa: E402


def staleness(args: argparse.Namespace, tmp: Path) -> dict:
    runs = []
    for p in args.processes:
        for rep in range(args.repeats):
            order = (0, 1) if rep % 2 == 0 else (1, 0)
            for s in order:
                extra = ["--staleness", str(s)]
                if args.memory_budget_share is not None:
                    extra += ["--memory-budget-share", str(args.memory_budget_share)]
                rec = run_one("embstore_mem", p, rep, args, tmp, tuple(extra), f"-s{s}")
                if rec is not None:
                    print(
                        f"  {p} processes, staleness {s}: {rec['examples_per_s']:,.0f} "
                        f"examples/s, AUC {rec['auc']:.4f}",
                        flush=True,
                    )
                    runs.append(rec)
    print("\nprocesses | staleness 0 | staleness 1 | paired 1/0 (median) | AUC 0 / 1")
    summary = {}
    for p in args.processes:
        by = {(r["repeat"], r["staleness"]): r for r in runs if r["processes"] == p}
        s0 = [by[k]["examples_per_s"] for k in sorted(by) if k[1] == 0]
        s1 = [by[k]["examples_per_s"] for k in sorted(by) if k[1] == 1]
        pairs = [
            by[(r, 1)]["examples_per_s"] / by[(r, 0)]["examples_per_s"]
            for r in range(args.repeats)
            if (r, 0) in by and (r, 1) in by
        ]
        auc0 = [by[k]["auc"] for k in sorted(by) if k[1] == 0]
        auc1 = [by[k]["auc"] for k in sorted(by) if k[1] == 1]
        if not pairs:
            continue
        summary[p] = {
            "staleness0": statistics.median(s0),
            "staleness1": statistics.median(s1),
            "ratio": statistics.median(pairs),
            "ratios": pairs,
            "auc0": auc0,
            "auc1": auc1,
        }
        print(
            f"{p} | {statistics.median(s0):,.0f} | {statistics.median(s1):,.0f} | "
            f"{statistics.median(pairs):.3f} ({min(pairs):.3f}..{max(pairs):.3f}) | "
            f"{statistics.median(auc0):.4f} / {statistics.median(auc1):.4f}"
        )
    return {"runs": runs, "summary": summary}


def large(args: argparse.Namespace, tmp: Path) -> dict:
    recs = {}
    p = args.processes[0]
    for name, extra in (
        ("tiered", ["--fill", "--memory-budget-share", str(args.memory_budget_share or 0.1)]),
        ("in_memory", []),
    ):
        print(f"  {name} ...", flush=True)
        rec = run_one("embstore_mem", p, 0, args, tmp, tuple(extra), f"-{name}")
        if rec is None:
            continue
        recs[name] = rec
    if len(recs) == 2:
        t, m = recs["tiered"], recs["in_memory"]
        timed = args.batches - args.warmup
        print(
            f"\n{p} processes, {t['rows']:,} rows stored (tiered; {m['rows']:,} touched):\n"
            f"  tiered {t['examples_per_s']:,.0f} examples/s vs in memory "
            f"{m['examples_per_s']:,.0f}: {t['examples_per_s'] / m['examples_per_s']:.3f}x\n"
            f"  AUC {t['auc']:.4f} vs {m['auc']:.4f}; peak RSS {t['rss_mb_max']:,.0f} vs "
            f"{m['rss_mb_max']:,.0f} MB; budget "
            f"{t['memory_budget_bytes'] / 2**30:.2f} GiB/process\n"
            f"  cold rows {t['timed_cold_reads_per_batch']:,.0f}/batch, "
            f"{t['timed_read_bytes_per_cold_row']:,.0f} B read per cold row, "
            f"{t['timed_disk_write_bytes_per_batch'] / 2**20:.1f} MiB written/batch (machine)\n"
            f"  fill {t['fill']['rows_created']:,} rows (rank 0) in {t['fill']['fill_s']:.0f}s\n"
            "  rank 0 busy s over the timed batches: "
            + ", ".join(f"{k} {v:.1f}" for k, v in t["stages"]["busy_s"].items())
            + f" (of {timed} batches)"
        )
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("staleness", "large"))
    ap.add_argument("--processes", default=None, help="staleness: 1,2; large: 2")
    ap.add_argument("--total-rows", type=int, default=None, help="staleness 4M, large 200M")
    ap.add_argument("--batches", type=int, default=None, help="staleness 200, large 300")
    ap.add_argument("--warmup", type=int, default=None, help="staleness 5, large 20")
    ap.add_argument("--eval-batches", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4096, help="global batch size")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--prefetch", type=synth_ctr.prefetch_arg, default=None, help="default: auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-budget-share", type=float, default=None, help="large: default 0.1")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("--json", type=Path, help="where the records go")
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    args = ap.parse_args()
    big = args.part == "large"
    if args.quick:
        args.total_rows = args.total_rows or 200_000
        args.batches = args.batches or 12
        args.warmup = args.warmup or 2
        args.eval_batches = 1
        args.repeats = 1
    args.total_rows = args.total_rows or (200_000_000 if big else 4_000_000)
    args.batches = args.batches or (300 if big else 200)
    args.warmup = args.warmup or (20 if big else 5)
    args.processes = [int(x) for x in (args.processes or ("2" if big else "1,2")).split(",")]
    with tempfile.TemporaryDirectory(prefix="embstore-bench-training-") as d:
        tmp = Path(d)
        result = staleness(args, tmp) if args.part == "staleness" else large(args, tmp)
    record = {
        "part": args.part,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "args": {k: v for k, v in vars(args).items() if k != "json"} | {"json": None},
        **result,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
