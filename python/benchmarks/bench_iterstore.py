"""The parameter server (IterStore) benchmark: every specialisation against none, on MF
(MovieLens-100k), PageRank (Debian's dependency graph and its x16 union) and LDA (Debian's man
pages), in one process
(threads) and across 2 and 4 processes on loopback, beside what a user would run on one
machine instead (scipy.sparse PageRank, a numpy mini-batch SGD).

Runs ``target/release/embstore-bench iter`` (build it first: ``make bench-iterstore`` does)
and ``lib/iterref.py``; writes every record to ``--json``, a plot to ``--plot`` and prints
the tables ``docs/benchmarks.md`` quotes. Time per iteration: median over runs of the median
of iterations 2..N.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "benchmarks" / "lib"))

import iterref  # noqa: E402

BENCH = ROOT / "target" / "release" / "embstore-bench"
EVERY = "every"
MAIN = "no-opt,all,all(first-iter)"


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_bench(app: list[str], processes: int, workers: int, variants: str, runs: int, iters: int):
    cmd = [str(BENCH), "iter", *app, "--processes", str(processes), "--workers", str(workers)]
    cmd += ["--variants", variants, "--runs", str(runs), "--iters", str(iters), "--json"]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in records:
        r["command"] = " ".join(cmd[1:])
        r["processes"] = processes
        r["workers"] = workers
    print(f"  {len(records)} variants in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / ".data"), help="the data directory")
    ap.add_argument("--json", help="write every record here")
    ap.add_argument("--plot", help="write the speed-up plot here (PNG)")
    ap.add_argument("--quick", action="store_true", help="1 run, the main variants, no x16")
    args = ap.parse_args()
    if not BENCH.exists():
        sys.exit(f"{BENCH} is missing: cargo build --release -p embstore-bench")
    data = pathlib.Path(args.data)
    graph, x16 = data / "iter" / "debian-graph.tsv", data / "iter" / "debian-graph-x16.tsv"
    inter = data / "ml-100k" / "ml-100k.inter"
    for f in (graph, inter):
        if not f.exists():
            sys.exit(f"{f} is missing: make data iter-data")
    runs = 1 if args.quick else 5
    variants = MAIN if args.quick else EVERY
    pr, mf = ["pagerank", "--edges", str(graph)], ["mf", "--data", str(inter)]
    records = []
    # One process (2 worker threads), then 2 and 4 processes (1 worker each; 4 oversubscribe
    # the 2 cores).
    for processes, workers in [(1, 2), (2, 1), (4, 1)]:
        records += run_bench(pr, processes, workers, variants, runs, 6)
        records += run_bench([*mf, "--rank", "256"], processes, workers, variants, runs, 5)
    lda = ["lda", "--docs", str(data / "iter" / "manpages-tokens.txt")]
    if (data / "iter" / "manpages-tokens.txt").exists():
        for processes, workers in [(1, 2), (2, 1)]:
            records += run_bench(lda, processes, workers, MAIN, min(runs, 3), 4)
        if not args.quick:
            # The thread caches' capacity (rows beyond it: a hash map per worker).
            for cap in (0, 1, 100, 1000):
                for r in run_bench([*lda, "--thread-cache-rows", str(cap)], 1, 2, "all", 3, 4):
                    r["variant"] = f"all, thread_cache_rows {cap}"
                    records.append(r)
    if not args.quick:
        records += run_bench([*mf, "--rank", "1000"], 2, 1, MAIN, runs, 5)
        if x16.exists():
            records += run_bench(["pagerank", "--edges", str(x16)], 2, 1, MAIN, 3, 3)
    # What a user would run on one machine instead.
    refs = []
    for path in [graph] + ([x16] if x16.exists() and not args.quick else []):
        _, secs = iterref.pagerank_scipy(path, iters=10)
        refs.append(
            {
                "app": f"pagerank ({path.name})",
                "peer": "scipy.sparse" if iterref.sp else "numpy",
                "s_per_iter": iterref.median_after_first(secs),
            }
        )
    for rank in (256,) if args.quick else (256, 1000):
        rmse, secs = iterref.mf_numpy(inter, rank=rank, epochs=4)
        refs.append(
            {
                "app": f"mf (rank {rank})",
                "peer": "numpy mini-batch SGD",
                "s_per_iter": iterref.median_after_first(secs),
                "rmse": rmse[-1],
            }
        )
    meta = {
        "date": dt.date.today().isoformat(),
        "cpu": cpu_model(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
    }
    report(records, refs, meta)
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"meta": meta, "records": records, "references": refs}, indent=1) + "\n"
        )
    if args.plot:
        plot(records, args.plot)
    return 0


def report(records, refs, meta) -> None:
    print(f"\n{meta['date']}, {meta['cpu']}, commit {meta['commit']}\n")
    cols = ["app", "processes x workers", "variant", "s/iter", "vs no-opt", "preprocess s"]
    print("| " + " | ".join([*cols, "MB on the wire/iter"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['app']} | {r['processes']} x {r['workers']} | {r['variant']} | "
            f"{r['s_per_iter']:.4f} | {r['speedup_vs_no_opt']:.2f}x | {r['preprocess_s']:.3f} | "
            f"{r.get('wire_mb_per_iter', 0):.2f} |"
        )
    print("\n| reference | peer | s/iter |\n|---|---|---|")
    for r in refs:
        print(f"| {r['app']} | {r['peer']} | {r['s_per_iter']:.4f} |")


def plot(records, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in records:
        groups.setdefault(
            (
                r["app"].split(" (")[0] + " " + r["app"].split(" (")[1].rstrip(")")
                if " (" in r["app"]
                else r["app"],
                r["processes"],
            ),
            [],
        ).append(r)
    keys = sorted(groups)
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 4.2), squeeze=False)
    for ax, k in zip(axes[0], keys, strict=True):
        rs = groups[k]
        ax.barh([r["variant"] for r in rs], [r["speedup_vs_no_opt"] for r in rs], color="#4477aa")
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{k[0]}\n{k[1]} process{'es' if k[1] > 1 else ''}", fontsize=8)
        ax.set_xlabel("speed-up vs no-opt", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
