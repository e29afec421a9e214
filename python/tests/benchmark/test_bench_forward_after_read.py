"""python/benchmarks/bench_forward_after_read.py (issue 10, benchmark 4's miss penalty): a tiny
run prints one row per mode with positive times, the sleep and busy-wait steps last as long as
asked, and the scratch file is removed.

How much slower the forward pass gets is for the benchmark to report, not for a test to assert.
"""

import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_forward_after_read.py"


def test_tiny_run_reports_every_mode_and_removes_its_file(run_bench, tmp_path):
    p = run_bench(
        "--steps",
        "20",
        "--repeats",
        "1",
        "--file-mb",
        "1",
        "--spin-us",
        "300",
        "--dir",
        str(tmp_path),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    rows = {}
    for line in p.stdout.splitlines()[2:]:
        mode, step, forward = (c.strip() for c in line.strip("|").split("|"))
        rows[mode] = (float(step), float(forward))
    assert set(rows) == {"none", "read", "spin", "sleep"}
    assert all(f > 0 for _, f in rows.values())
    assert rows["spin"][0] >= 300 and rows["sleep"][0] >= 300
    assert rows["read"][0] > rows["none"][0]
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_refused(run_bench, tmp_path):
    p = run_bench("--steps", "0", "--dir", str(tmp_path), timeout=120)
    assert p.returncode == 2
    assert "must be positive" in p.stderr
