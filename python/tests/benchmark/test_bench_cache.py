"""python/benchmarks/bench_cache.py runs at tiny sizes and reports consistent figures.

Only the bookkeeping is checked; hit rates against each other and latencies are for the
benchmark to report.
"""

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BENCH = ROOT / "python" / "benchmarks" / "bench_cache.py"
HAS_ML = (ROOT / ".data" / "ml-100k" / "ml-100k.inter").is_file()
TINY_SYN = ["--syn-requests", "2000", "--syn-contexts", "2000", "--syn-max-table", "2000"]


def run(run_bench, tmp_path: pathlib.Path, *extra: str) -> dict:
    out = tmp_path / "res.json"
    no_ml = [] if HAS_ML else ["--no-ml"]
    p = run_bench(*TINY_SYN, "--ml-requests", "2000", "--json", str(out), *extra, *no_ml)
    assert p.returncode == 0, p.stderr
    assert "## bench_cache" in p.stdout
    return json.loads(out.read_text())


def check_rates(r: dict) -> None:
    for k in ("perfect_hit", "served_perfect_hit", "individual_hit", "compulsory_bound"):
        assert 0.0 <= r[k] <= 1.0, (k, r)
    # A request all of whose keys were resident has seen them all before.
    assert r["perfect_hit"] <= r["served_perfect_hit"] <= r["compulsory_bound"] + 1e-12
    if r["purpose"] != "system":
        assert r["capacity"] >= r["tables"]  # the floor C >= G
    assert sum(r["misses_per_request"]) > 0


def test_tiny_policy_and_system(run_bench, tmp_path):
    pytest.importorskip("libcachesim")
    from embstore.cache import _libcachesim

    lcs = _libcachesim.available()
    r = run(
        run_bench,
        tmp_path,
        *("--parts", "policy,system", "--seeds", "2", "--rhos", "0.7", "--sizes", "5,50"),
        *("--reduced-sizes", "5", "--dims", "16", "--plots"),
        str(tmp_path / "img"),
    )
    pol = r["policy"]
    assert pol["libcachesim"] == lcs
    assert set(pol["libcachesim_excluded"]) == {"ClockPro", "CAR", "Belady"}
    names = ["syn_rho0.7"] + (["ml7", "ml11"] if HAS_ML else [])
    assert sorted(pol["traces"]) == sorted(names)
    for name, tr in pol["traces"].items():
        assert tr["sizes"] == [0.05, 0.5]
        assert set(tr["alpha_tuned"]) == {"0.05", "0.5"}
        assert set(tr["sweep"]["ours"]) == {
            "lru", "lfu", "group_lfu", "group_lfu_tuned", "ev_lfu_paper", "ev_arc",
        }  # fmt: skip
        assert set(tr["sweep"]["libcachesim"]) == set(lcs)
        for family in ("ours", "libcachesim"):
            for pts in tr["sweep"][family].values():
                assert set(pts) == {"0.05", "0.5"}
                for v in pts.values():
                    assert 0.0 <= v["perfect_hit"] <= v["individual_hit"] <= 1.0
        for mode in ("prefix", "online", "replay"):
            assert set(tr["at_5pct"][mode]["libcachesim"]) == set(lcs)
        seeds = tr["at_5pct"]["prefix"]["ours"]["group_lfu"]["seeds"]
        assert seeds == ([1, 2] if name.startswith("syn") else [None])
        assert tr["best_libcachesim"][0] in lcs
        assert (tmp_path / "img" / f"cache_perfect_hits_{name}.png").stat().st_size > 0
    runs = [x for x in r["records"] if "skipped" not in x]
    assert runs and all(x["purpose"] in ("policy", "tune", "system") for x in runs)
    for x in runs:
        check_rates(x)
    # Tuning never ran on a measured trace: ML on its first half, synthetic on seed 0.
    tune = [x for x in runs if x["purpose"] == "tune"]
    assert {x["seed"] for x in tune if x["trace"].startswith("syn")} == {0}
    assert all(x["requests"] == 1000 for x in tune if x["trace"].startswith("ml"))

    for tr in r["system"].values():
        s = tr["D16"]
        assert set(s["ours"]) == {"a", "b", "c", "d", "e", "f"}
        assert set(s["baselines"]) == set(lcs) | {"ours:lru", "ours:group_lfu"}
        for v in s["baselines"].values():
            assert v["capacity"] == s["budget_bytes"] // (4 * 16 + 28)
        for v in s["ours"].values():
            assert v["bytes"] <= s["budget_bytes"] == v["memory_budget_bytes"]
            assert 0.0 <= v["perfect_hit"] <= v["served_perfect_hit"] <= 1.0
            assert len(v["tiers"]) == len(v["tiers_share"])
        assert s["ours"]["f"]["tiers_share"] == s["ours"][s["ours"]["f"]["base"]]["tiers_share"]
    goals = [g["goal"].split(":")[0] for g in r["goals"]]
    assert goals == [f"policy {n}" for n in pol["traces"] if n != "ml7"] + [
        f"system {n} D16" for n in r["system"]
    ]
    assert all(isinstance(g["met"], bool) for g in r["goals"])


@pytest.mark.data
@pytest.mark.skipif(not HAS_ML, reason="the latency part runs on ML11 (.data/ml-100k)")
def test_tiny_latency(run_bench, tmp_path):
    pytest.importorskip("torch")
    r = run(
        run_bench,
        tmp_path,
        *("--parts", "latency", "--latency-requests", "50", "--latency-batches", "2"),
        *("--reps", "2"),
    )
    lat = r["latency"]
    assert set(lat["budgets"]) == {"5%", "100%"}
    full = lat["budgets"]["100%"]
    assert full["resident_keys_after_warm"] == lat["unique_keys"]
    assert full["timed_perfect_hit_rate"] == 1.0
    for res in lat["budgets"].values():
        for bsz in (1, 256):
            for m in ("cache.lookup", "Table.lookup", "numpy.take", "torch.nn.Embedding"):
                v = res[f"batch_{bsz}/{m}"]
                assert 0 < v["p50_us"] <= v["p99_us"]
                assert v["requests_per_s"] > 0 and len(v["reps"]) == 2
    assert "policy" not in r and "system" not in r
