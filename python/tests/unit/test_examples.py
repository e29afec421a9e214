"""The examples in examples/ run as users would run them."""

import re
import subprocess
import sys

import pytest


def run_example(repo_root, name: str) -> str:
    """Runs ``examples/<name>`` in a fresh interpreter and returns its stdout."""
    return subprocess.run(
        [sys.executable, str(repo_root / "examples" / name)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout


def test_index_basics_runs(repo_root):
    out = run_example(repo_root, "index_basics.py")
    assert "lookups:" in out and "None]" in out
    assert "rejected: payload 4503599627370496 out of range" in out


def test_table_basics_runs(repo_root):
    out = run_example(repo_root, "table_basics.py")
    assert "rows (4, 8) stored 3" in out
    assert "found [ True False]" in out
    assert "genre rows 4, step 20" in out


def test_durable_store_runs(repo_root):
    out = run_example(repo_root, "durable_store.py")
    assert "same: True" in out and "on 16 shards" in out
    assert "ok: every record and checksum verified" in out
    rows = re.search(r"^rows ([\d,]+),", out, re.M).group(1).replace(",", "")
    assert f"reopened {rows} rows" in out


def test_iterstore_pagerank_matches_scipy(repo_root):
    out = run_example(repo_root, "iterstore_pagerank.py")
    diff = float(re.search(r"max \|rank - scipy\| = (\S+)", out).group(1))
    assert diff <= 1e-6, out
    assert "rows fetched one at a time: 0," in out


@pytest.mark.data
def test_iterstore_mf_trains_without_a_demand_miss(repo_root):
    out = run_example(repo_root, "iterstore_mf.py")
    rmse = [float(x) for x in re.findall(r"rmse (\d+\.\d+)", out)]
    assert len(rmse) == 5 and rmse[-1] < 0.95 and rmse[-1] < rmse[0], out
    assert "rows fetched one at a time after the plan: 0," in out


def test_iterstore_lda_improves_the_likelihood_without_a_demand_miss(repo_root):
    out = run_example(repo_root, "iterstore_lda.py")
    ll = [float(x) for x in re.findall(r"log p\(w\|z\) (-?\d+\.\d+)", out)]
    assert len(ll) == 3 and ll[-1] > ll[0] + 0.1 * abs(ll[0]), out
    assert "rows fetched one at a time: 0," in out
