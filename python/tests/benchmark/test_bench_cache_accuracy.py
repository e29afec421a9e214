"""python/benchmarks/bench_cache_accuracy.py: its metrics and split on hand examples, the
native warm-up it relies on, and a tiny run's bookkeeping (f32 serving bit-identical to exact).

The accuracy goal itself is for the benchmark to report, not for a test to assert.
"""

import json
import pathlib

import numpy as np
import pytest

import embstore
from embstore.cache import traces

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cache_accuracy.py"
DATA = pathlib.Path(__file__).resolve().parents[3] / ".data" / "ml-100k"


def test_metrics_on_scikit_learns_example(bench):
    # scikit-learn's docs: average_precision_score = 0.83, roc_auc_score = 0.75.
    y, s = np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])
    assert bench.average_precision(y, s) == pytest.approx(5 / 6)
    assert bench.roc_auc(y, s) == pytest.approx(0.75)


def test_metrics_with_ties(bench):
    # Three tied at 0.5 (two positives, one negative): each positive beats the 0.2 negative
    # and ties the other one (1/2); the only threshold with positives has precision 2/3.
    y, s = np.array([1, 0, 1, 0]), np.array([0.5, 0.5, 0.5, 0.2])
    assert bench.roc_auc(y, s) == pytest.approx(0.75)
    assert bench.average_precision(y, s) == pytest.approx(2 / 3)
    # Perfect and reversed rankings.
    y2 = np.array([0, 0, 1, 1])
    assert bench.roc_auc(y2, np.array([1.0, 2, 3, 4])) == 1.0
    assert bench.roc_auc(y2, np.array([4.0, 3, 2, 1])) == 0.0
    assert bench.average_precision(y2, np.array([1.0, 2, 3, 4])) == 1.0


def brute_auc(y, s):
    p, n = s[y == 1], s[y == 0]
    return float(((p[:, None] > n[None, :]) + 0.5 * (p[:, None] == n[None, :])).mean())


def brute_ap(y, s):
    ap, prev_recall = 0.0, 0.0
    for t in np.unique(s)[::-1]:
        chosen = s >= t
        tp = int((chosen & (y == 1)).sum())
        recall = tp / int((y == 1).sum())
        ap += (recall - prev_recall) * tp / int(chosen.sum())
        prev_recall = recall
    return ap


def test_weighted_metrics_equal_the_metrics_on_repeated_examples(bench):
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        s = np.round(rng.standard_normal(n), 1)  # many ties
        w = rng.integers(0, 4, (3, n)).astype(float)
        w[:, :2] = 1  # both classes present in every draw
        ap, auc = bench.weighted_metrics(y, bench._ranked(s), w)
        for r in range(3):
            reps = w[r].astype(int)
            yr, sr = np.repeat(y, reps), np.repeat(s, reps)
            assert auc[r] == pytest.approx(brute_auc(yr, sr))
            assert ap[r] == pytest.approx(brute_ap(yr, sr))
        assert bench.roc_auc(y, s) == pytest.approx(brute_auc(y, s))
        assert bench.average_precision(y, s) == pytest.approx(brute_ap(y, s))


def test_per_user_split_takes_each_users_last_fifth(bench):
    users = np.array([1, 2, 1, 1, 2, 1, 1, 2, 2, 2, 3, 3])
    test = bench.per_user_split(users, 0.2)
    # user 1: 5 requests -> 1 test (index 6); user 2: 5 -> 1 (index 9); user 3: 2 -> 0.
    assert np.flatnonzero(test).tolist() == [6, 9]
    test = bench.per_user_split(users, 0.5)
    # user 1: 2.5 rounds half up to 3 (indices 3, 5, 6); user 2: 3 (7, 8, 9); user 3: 1.
    assert np.flatnonzero(test).tolist() == [3, 5, 6, 7, 8, 9, 11]


def test_native_warm_up_leaves_the_state_of_python_lookups(bench):
    """``warm(..., batch=1)`` runs through ``evaluate(keys, cache)``; the cache must end as
    one-request Python lookups leave it: the same rows and sources on the next requests."""
    rng = np.random.default_rng(3)
    sizes, fields = [50, 200, 7], ["a", "b", "c"]
    store = embstore.Store()
    for f, n in zip(fields, sizes, strict=True):
        t = store.create_table(f, embedding_dim=8)
        t.assign(np.arange(n), rng.standard_normal((n, 8)).astype(np.float32))
    ids = np.stack([rng.zipf(1.3, 1500) % n for n in sizes], axis=1).astype(np.int64)
    outs = []
    for batch in (1, None):
        cache = embstore.InferenceCache(store, fields, 4096, tiers={"f32": 0.5, "int8": 0.5})
        if batch == 1:
            bench.warm(cache, fields, ids[:1000], 1)
        else:
            for row in ids[:1000]:
                cache.lookup({f: row[k : k + 1] for k, f in enumerate(fields)})
        outs.append((cache.stats()["perfect_hits"], bench.lookup_all(cache, fields, ids[1000:], 1)))
    (p0, (rows0, src0)), (p1, (rows1, src1)) = outs
    assert p0 == p1
    assert np.array_equal(src0, src1)
    assert all(np.array_equal(a, b) for a, b in zip(rows0, rows1, strict=True))
    assert np.any(src0 == embstore.cache.SOURCES.index("l2"))  # L2 was exercised


@pytest.mark.data
@pytest.mark.skipif(
    not (DATA / "ml-100k.inter").is_file(), reason="MovieLens-100k absent (make data)"
)
def test_tiny_run_bookkeeping_and_f32_bit_identity(run_bench):
    p = run_bench(
        "--quick",
        "--seeds",
        "1",
        "--epochs",
        "1",
        "--requests",
        "20000",
        "--resamples",
        "50",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["benchmark"] == "cache_accuracy"
    assert r["requests"] == 20000
    assert r["train_requests"] + r["test_requests"] == 20000
    assert 0.15 < r["test_requests"] / r["requests"] < 0.25
    assert len(r["seeds"]) == 1
    s = r["seeds"][0]
    assert 0.5 < s["roc_auc"] < 1 and 0 < s["pr_auc"] < 1
    fields = len(traces.ML_FIELDS[:7])
    assert len(r["served"]) == 7 * 2
    for name, v in r["served"].items():
        assert 0 <= v["perfect_hit_rate"][0] <= v["served_perfect_hit_rate"][0] <= 1, name
        assert sum(v["sources"].values()) == r["test_requests"] * fields, name
        assert v["rows_mismatched"] == 0, name
        if not v["surrogates"]:
            assert v["sources"]["surrogate"] == 0, name
            assert v["perfect_hit_rate"] == v["served_perfect_hit_rate"], name
        for m in ("pr_auc", "roc_auc"):
            lo, hi = v[m]["relative"]["ci"]
            assert lo <= hi, name
            assert v[f"{m}_goal_met"] == (hi <= 0.002), name
        if v["mix"] == "f32":
            # The f32-only cache serves exact rows: the logits are bit-identical, every
            # bootstrap difference is exactly zero.
            assert v["bit_identical"] == [True], name
            assert v["mean_abs_logit_change"] == [0.0], name
            for m in ("pr_auc", "roc_auc"):
                d = v[m]["delta"]
                assert d["per_seed"] == [0.0] and d["ci"] == [0.0, 0.0], name
                assert d["per_seed_ci"] == [[0.0, 0.0]], name
    sur = r["served"]["f32/int8+sur @ 0.2"]
    assert sur["sources"]["surrogate"] > 0
    assert len(r["uniform"]) == 3
    for name, v in r["uniform"].items():
        assert v["all_hits"] and v["rows_mismatched"] == 0, name
    goals = {g["goal"]: g["met"] for g in r["goals"]}
    assert all(met for goal, met in goals.items() if "bit-identical" in goal)
    assert goals["every served row equals its source's decode(encode(row)) (rows mismatched)"]
