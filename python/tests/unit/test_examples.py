"""The examples in examples/ run as users would run them."""

import re
import subprocess
import sys


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
