"""python/benchmarks/bench_tier.py runs at tiny sizes and reports consistent figures.

Only the bookkeeping is checked; latencies and ratios are for the benchmark to report.
"""

import json
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tier.py"


def test_tiny_run_reports_both_benchmarks(run_bench, tmp_path):
    p = run_bench(
        "--rows",
        "20000",
        "--warm",
        "5",
        "--batches",
        "10",
        "--kv-rows",
        "5000",
        "--kv-warm",
        "5",
        "--kv-batches",
        "20",
        "--dir",
        str(tmp_path),
        "--json",
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    tr = r["training"]
    assert 0 <= tr["hit_rate"] <= 1 and 0 <= tr["oracle_10pct"] <= 1
    # Compulsory misses only lower an oracle; holding every row bounds any number of them.
    assert tr["oracle_same_rows_online"] <= tr["oracle_same_rows"] + 1e-12
    assert tr["oracle_same_rows_online"] <= tr["compulsory_bound"] + 1e-12
    assert tr["bound_ms_per_batch"] >= tr["memory_ms_per_batch"]
    regimes = r["kv"]["regimes"]
    assert len(regimes) == 3
    for res in regimes.values():
        assert {"batch_10", "batch_100", "batch_500"} <= res.keys()
    assert list(tmp_path.iterdir()) == []
