"""The examples in examples/ run as users would run them."""

import subprocess
import sys


def test_table_basics_runs(repo_root):
    out = subprocess.run(
        [sys.executable, str(repo_root / "examples" / "table_basics.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "rows (4, 8) stored 3" in out
    assert "found [ True False]" in out
    assert "genre rows 4, step 20" in out
