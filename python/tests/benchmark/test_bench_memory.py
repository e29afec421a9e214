"""python/benchmarks/bench_memory.py runs at tiny sizes and reports consistent figures.

Only the bookkeeping is checked (fields, raw bytes, ratios derived from the readings); the
memory goals themselves are for the benchmark to report, not for a test to assert.
"""

import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_memory.py"

TINY = ["--rows", "20000", "--dim", "32", "--shrink-rows", "20000"]
TINY += ["--tables", "3", "--table-rows", "100"]
TINY += ["--budget-mib", "4", "--budget-rows", "20000", "--budget-dim", "32"]
TINY += ["--budget-steps", "5", "--large-ids", "5000", "--data-dir", "/nonexistent"]


@pytest.fixture(scope="module")
def result(run_bench):
    p = run_bench(*TINY, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_header_records_config_and_machine(result):
    assert result["benchmark"] == "memory"
    c, m = result["config"], result["machine"]
    assert (c["rows"], c["dim"], c["shrink_rows"]) == (20000, 32, 20000)
    assert c["scenarios"] == ["rows", "small", "shrink", "budget", "demo"]
    assert m["nproc"] >= 1 and m["cpu"] and m["commit"] and m["date"]


def test_rows_scenario(result):
    rows = result["scenarios"]["rows"]
    assert {opt: r["state_dim"] for opt, r in rows.items()} == {"SGD": 0, "Adagrad": 32, "Adam": 64}
    for r in rows.values():
        assert r["rows"] == r["stats"]["rows"] == 20000
        assert r["raw_bytes"] == 20000 * (32 + r["state_dim"]) * 4
        assert r["rss_base"] > 0 and r["rss_after"] > 0 and r["rss_growth"] > 0
        assert r["rss_growth"] == r["rss_after"] - r["rss_base"]
        b = r["beyond_raw_per_row"]
        assert b["rss"] == pytest.approx((r["rss_growth"] - r["raw_bytes"]) / 20000)
        assert b["bytes"] == pytest.approx((r["stats"]["bytes"] - r["raw_bytes"]) / 20000)


def test_small_scenario_runs_both_page_sizes(result):
    small = result["scenarios"]["small"]
    assert {r["huge_pages"] for r in small.values()} == {True, False}
    for r in small.values():
        assert r["rows"] == r["stats"]["rows"] == 3 * 100
        assert r["state_dim"] == 64  # Adam: 2 x D
        assert r["raw_bytes"] == 300 * (32 + 64) * 4
        assert r["rss_growth"] > 0
        assert r["rss_over_raw"] == pytest.approx(r["rss_growth"] / r["raw_bytes"])


def test_shrink_scenario(result):
    r = result["scenarios"]["shrink"]
    assert r["rows_filled"] == 20000 and r["rows_removed"] == 18000 and r["rows_live"] == 2000
    assert r["fresh"]["rows"] == r["after_remove"]["stats"]["rows"] == 2000
    assert r["raw_bytes_live"] == 2000 * (32 + 32) * 4  # Adagrad: S = D
    assert r["filled"]["rss_growth"] > 0 and r["fresh"]["rss_growth"] > 0
    assert r["after_clear"]["stats"]["rows"] == 0
    assert r["after_remove_over_fresh"] == pytest.approx(
        r["after_remove"]["rss_growth"] / r["fresh"]["rss_growth"]
    )


def test_budget_scenario(result):
    r = result["scenarios"]["budget"]
    assert r["budget"] == 4 << 20 and r["goal_bytes"] == int(1.5 * (4 << 20) + (32 << 20))
    assert r["raw_bytes"] == 20000 * (32 + 32) * 4  # Adagrad: S = D
    assert r["train"]["steps"] == 5 and r["after"]["steps"] == 20 and r["large"]["ids"] == 5000
    for phase in ("fill", "train", "large", "after"):
        limit, used = r[phase]["memory_budget"]
        assert limit == 4 << 20 and used > 0
    assert r["stats"]["rows"] == 20000 and r["stats"]["rows_on_disk"] > 0


def test_demo_scenario_is_skipped_without_the_data(result):
    assert "no MovieLens-100k" in result["scenarios"]["demo"]["skipped"]


def test_goals_listed_for_every_measurement(result):
    goals = result["goals"]
    want = ["rows"] * 3 + ["small"] * 2 + ["shrink"] + ["budget"] * 2
    assert [g["scenario"] for g in goals] == want
    for g in goals:
        assert isinstance(g["met"], bool) and isinstance(g["value"], float) and g["goal"]


def test_one_scenario_as_markdown(run_bench):
    p = run_bench(*TINY, "--scenario", "small")
    assert p.returncode == 0, p.stderr
    assert "| goal | measured | met |" in p.stdout
    assert "huge pages on: RSS <= 1.5x raw" in p.stdout
    assert "rows: bytes per row" not in p.stdout and "shrink: Adagrad" not in p.stdout
    assert "small: 3 tables" in p.stderr  # progress goes to stderr


def test_bad_size_is_refused(run_bench):
    p = run_bench("--rows", "0")
    assert p.returncode == 2 and "--rows must be >= 1" in p.stderr


def test_rows_scenario_with_16_bit_values(run_bench):
    args = ["--scenario", "rows", "--rows", "20000", "--dim", "32", "--dtype", "bf16"]
    p = run_bench(*args, "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["config"]["dtype"] == "bf16"
    for r in res["scenarios"]["rows"].values():
        # Values at 2 bytes, optimizer state at 4.
        assert r["raw_bytes"] == 20000 * (32 * 2 + r["state_dim"] * 4)
        assert r["rss_per_row"] == pytest.approx(r["rss_growth"] / 20000)
