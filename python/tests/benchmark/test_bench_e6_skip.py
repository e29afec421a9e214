"""python/benchmarks/dissemination/e6_skip.py (E6: parts skipped by shard versions) at a tiny
size, and plot_experiments.py on the records kept in docs/data.

Checks the bookkeeping and the direction of the effect only (idle tables skipped with shard
versions, every part pulled without); the figures are for the benchmark to report."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "dissemination" / "e6_skip.py"
DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs"


def test_predicted_skip_counts_distinct_parts_per_round():
    sys.path.insert(0, str(BENCH.parents[1]))
    try:
        from dissemination.e6_skip import predicted_skip
    finally:
        sys.path.remove(str(BENCH.parents[1]))
    # 4 batches of 2 updates; parts 0,0 | 1,2 | 3,3 | 4,5 over 8 parts.
    parts = np.array([0, 0, 1, 2, 3, 3, 4, 5])
    batches = [(0.01 * (i + 1), 2 * i, 2 * i + 2) for i in range(4)]
    # One batch per round: 1, 2, 1, 2 distinct -> 1.5 of 8.
    assert predicted_skip(parts, batches, 0.01, 10, 8) == pytest.approx(1 - 1.5 / 8)
    # Two batches per round: 3 and 3 distinct.
    assert predicted_skip(parts, batches, 0.02, 10, 8) == pytest.approx(1 - 3 / 8)
    # Rounds of half a batch see a batch's parts in half the rounds.
    assert predicted_skip(parts, batches, 0.005, 10, 8) == pytest.approx(1 - 0.75 / 8)


def test_tiny_run_skips_idle_parts_only_with_shard_versions(run_bench, tmp_path):
    out, png = tmp_path / "e6.json", tmp_path / "e6.png"
    p = run_bench(
        *("--duration", "3", "--rate", "2000", "--rows", "16384", "--parts", "64"),
        *("--idle-tables", "2", "--idle-rows", "4096", "--idle-every", "1"),
        *("--followers", "1", "--predict-round-ms", "50", "--join-timeout", "60"),
        *("--json", str(out), "--plot", str(png)),
        timeout=240,
    )
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["shard_versions"] for r in recs] == [True, False]
    on, off = recs
    for r in recs:
        assert r["caught_up_after"] and set(r["tables"]) == {"hot", "idle0", "idle1"}
        assert r["idle_writes"] >= 4 and r["all"]["rounds"] > 0
        hot = r["tables"]["hot"]
        assert hot["rounds"] > 10 and hot["rows_applied"] > 0
        assert set(hot["predicted_skip_ratio_at_round_ms"]) == {"50.0"}
    # With shard versions an idle table's round pulls only the part a write touched; the hot
    # table's rounds skip some parts too.
    for name in ("idle0", "idle1"):
        t = on["tables"][name]
        assert t["rounds"] >= 1 and t["parts"] <= 2 * on["idle_writes"]
        assert t["skip_ratio"] > 0.8
    assert 0 < on["tables"]["hot"]["skip_ratio"] < 1
    # Without, every round pulls every part (up to a round cut by the window's edges).
    assert abs(off["tables"]["hot"]["skip_ratio"]) < 0.1
    assert off["all"]["parts_per_s"] > 3 * on["all"]["parts_per_s"]
    assert png.stat().st_size > 10_000


def test_plots_of_the_kept_records(tmp_path):
    sys.path.insert(0, str(BENCH.parents[1]))
    try:
        from dissemination.plot_experiments import main
    finally:
        sys.path.remove(str(BENCH.parents[1]))
    assert main(["--data", str(DOCS / "data"), "--out", str(tmp_path)]) == 0
    for name in ("e2_checkpoint", "e3_slow_link", "e5_cache", "e6_skip"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name
