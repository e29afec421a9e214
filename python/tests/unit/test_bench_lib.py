"""The benchmarks' shared library (python/benchmarks/lib): the figures the scripts report are
computed by these functions, so they are checked here, without running a benchmark."""

import pathlib
import sys

import numpy as np
import pytest

import embstore

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def lib():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import lib.timing
        import lib.workloads

        return lib
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_zipf_ranks_stay_in_range_and_favour_low_ranks(lib):
    rng = np.random.default_rng(7)
    ranks = lib.workloads.zipf_ranks(rng, 50_000, 1000, 1.05)
    assert ranks.dtype == np.int64 and ranks.min() >= 0 and ranks.max() <= 999
    counts = np.bincount(ranks, minlength=1000)
    assert counts[0] > counts[1] > counts[10] > counts[500]


def test_zipf_ids_map_ranks_through_the_permutation(lib):
    perm = np.random.default_rng(1).permutation(100).astype(np.int64)
    ranks = lib.workloads.zipf_ranks(np.random.default_rng(3), 200, 100, 0.99)
    ids = lib.workloads.zipf_ids(np.random.default_rng(3), 0.99, 100, 200, perm)
    assert ids.tolist() == perm[ranks].tolist()


def test_fill_gives_every_id_a_row(lib):
    table = embstore.Store().create_table("t", embedding_dim=2)
    assert lib.workloads.fill(table, 1000, chunk=300) >= 0
    assert len(table) == 1000


def test_summaries_are_named_and_scaled_as_the_scripts_report_them(lib):
    values = np.array([1.0, 2.0, 3.0, 4.0])
    s = lib.timing.summarize(values, ("p50", "p99", "max"), suffix="_us")
    assert list(s) == ["p50_us", "p99_us", "max_us"]
    assert s["p50_us"] == 2.5 and s["max_us"] == 4.0
    ms = lib.timing.summarize([1e6, 3e6], ("mean",), prefix="lookup_", suffix="_ms", scale=1e-6)
    assert ms == {"lookup_mean_ms": 2.0}
    assert lib.timing.summarize([3.0, 1.0, 2.0], ("median", "min", "max")) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
    }
