"""python/benchmarks/bench_durable.py runs at tiny sizes and reports consistent figures.

Only the bookkeeping is checked; latencies and ratios are for the benchmark to report.
"""

import json
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_durable.py"


def test_tiny_run_reports_both_systems(run_bench, tmp_path):
    p = run_bench(
        "--rows",
        "20000",
        "--batches",
        "20",
        "--every",
        "10",
        "--dir",
        str(tmp_path),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    d = r["durable"]
    assert len(d["flushes"]) == 2 and d["first_flush_bytes"] > 20000 * 256
    # Every changed row is written once per flush: records >= rows changed.
    assert all(f["records"] >= f["changed"] for f in d["flushes"])
    assert d["write_amplification"] > 1.0 and d["disk_over_live_max"] > 1.0
    rk = r["rocksdb"]
    assert "skipped" in rk or (len(rk["flushes"]) == 2 and rk["write_amplification"] > 0)
    assert list(tmp_path.iterdir()) == []  # both stores were deleted
