"""embstore.cache.evaluate cannot flatter: measured metadata, fresh copies of a cache, isolated
libCacheSim peers, and the guard against peers whose find and get disagree."""

import numpy as np
import pytest

import embstore
from embstore.cache import POLICIES, evaluate, synthetic_trace

D = 16


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(
        num_requests=3000, num_tables=4, num_contexts=2000, max_table_size=3000, seed=1
    )


def _same(a, b):
    """Two evaluator results (or stats) agree on every field."""
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a
    )


def _store(num_tables, dim=D):
    store = embstore.Store()
    names = [f"t{i}" for i in range(num_tables)]
    for name in names:
        store.create_table(name, embedding_dim=dim)
    return store, names


@pytest.mark.parametrize("budget", [40_000, 1 << 20])
def test_byte_budget_gives_our_policies_the_entries_an_inference_cache_holds(trace, budget):
    store, names = _store(4)
    for policy in [p for p in POLICIES if p != "ev_arc"]:
        cache = embstore.InferenceCache(store, names, budget, policy=policy)
        r = evaluate(trace, policy, capacity_bytes=budget, dim=D)
        assert r["capacity"] == cache.capacity, policy
    # group_assoc's 10-11 B an entry buys more than the 28 B a libCacheSim peer is given
    assert evaluate(trace, "group_assoc", capacity_bytes=budget, dim=D)["capacity"] > budget // (
        4 * D + 28
    )


def test_byte_budget_of_evaluator_only_policies_counts_their_measured_metadata(trace):
    budget = 1 << 20
    for policy in ("ev_arc", "lru_lfu"):
        r = evaluate(trace, policy, capacity_bytes=budget, dim=D)
        cap, meta = r["capacity"], r["metadata_bytes_per_entry"] + 1  # + the 1 B table tag
        assert cap * (4 * D + meta) <= budget < (cap + cap // 50 + 2) * (4 * D + meta), policy


def test_inference_cache_is_evaluated_as_a_fresh_copy(trace):
    store, names = _store(4)
    cache = embstore.InferenceCache(store, names, 40_000, policy="group_lfu")
    before = cache.stats()
    first = evaluate(trace, cache)
    second = evaluate(trace, cache)
    assert _same(first, second)
    assert first["requests"] == len(trace) - int(np.ceil(0.5 * len(trace)))
    assert _same(cache.stats(), before)  # the user's cache is untouched
    # the copy has the cache's own configuration: the bare policy of its capacity agrees
    assert first["capacity"] == cache.capacity


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"capacity": 100}, "capacity"),
        ({"capacity": 0.5}, "capacity"),
        ({"capacity_bytes": 1 << 20, "dim": D}, "capacity_bytes"),
        ({"dim": D}, "dim"),
        ({"policy_params": {"pin_request": True}}, "policy_params"),
    ],
)
def test_inference_cache_refuses_arguments_it_would_ignore(trace, kwargs, name):
    store, names = _store(4)
    cache = embstore.InferenceCache(store, names, 40_000)
    with pytest.raises(embstore.InvalidArgumentError, match=name):
        evaluate(trace, cache, **kwargs)


def test_lecar_and_cacheus_do_not_depend_on_what_ran_before(trace):
    pytest.importorskip("libcachesim")
    small = trace[:1500]
    first = evaluate(small, "LeCaR", 300)
    for name in ("Cacheus", "LeCaR", "LRU", "Cacheus"):
        evaluate(small, name, 300)
    assert _same(evaluate(small, "LeCaR", 300), first)
    cacheus = evaluate(small, "Cacheus", 300)
    evaluate(small, "LeCaR", 300)
    assert _same(evaluate(small, "Cacheus", 300), cacheus)


def test_isolated_errors_are_raised_in_the_caller(trace):
    pytest.importorskip("libcachesim")
    from embstore.cache import _libcachesim

    keys = trace[:10].reshape(-1)
    offsets = np.arange(0, keys.size + 1, trace.shape[1], dtype=np.uint64)
    with pytest.raises(embstore.InvalidArgumentError):
        _libcachesim.evaluate_isolated(keys, offsets, "LeCaR", 300, mode="prefix", warm_frac=1.5)


def _with_peer(policy, cache):
    """Points an existing LibCacheSimPolicy at another libCacheSim native cache."""
    policy._cache = cache
    policy._find = cache.find
    policy._get = cache.get
    return policy


def test_guard_counts_and_corrects_a_find_that_lies():
    pytest.importorskip("libcachesim")
    from embstore.cache._libcachesim import LibCacheSimPolicy

    class Liar:
        """An LRU whose find also reports key 99, which get never holds."""

        def __init__(self, inner):
            self.inner = inner

        def find(self, req, update):
            return True if req.obj_id == 99 else self.inner.find(req, update)

        def get(self, req):
            return False if req.obj_id == 99 else self.inner.get(req)

    p = LibCacheSimPolicy("LRU", 4)
    _with_peer(p, Liar(p._cache))
    keys = lambda *k: np.array(k, dtype=np.uint64)  # noqa: E731
    assert p.access(keys(1, 99)).tolist() == [False, False]
    assert p.access(keys(1, 99, 99)).tolist() == [True, False, False]
    assert p.find_get_disagreements == 3
    honest = LibCacheSimPolicy("LRU", 4)
    for r in ([1, 2], [1, 3], [2, 1], [4, 5, 6, 1]):
        honest.access(keys(*r))
    assert honest.find_get_disagreements == 0


def test_guard_catches_libcachesims_threelcache(trace):
    lcs = pytest.importorskip("libcachesim")
    from embstore import _native
    from embstore.cache._libcachesim import LibCacheSimPolicy

    keys = trace[:1500].reshape(-1)
    offsets = np.arange(0, keys.size + 1, trace.shape[1], dtype=np.uint64)
    p = _with_peer(LibCacheSimPolicy("LRU", 300), lcs.ThreeLCache(300, hashpower=12)._cache)
    r = _native.evaluate(keys, offsets, p, 300, mode="online")
    assert p.find_get_disagreements > 0
    # the hits counted are the ones get() made: a replay of get() alone agrees
    q = lcs.ThreeLCache(300, hashpower=12)._cache
    req = lcs.Request()
    req.obj_size = 1
    req.op = lcs.ReqOp.OP_GET
    probe_hits = 0
    for i, row in enumerate(trace[:1500].tolist()):
        req.clock_time = i + 1
        for k in row:
            req.obj_id = k
            probe_hits += q.find(req, False) is not None
            q.get(req)
    assert r["individual_hit"] * keys.size < probe_hits  # unguarded, find would flatter it


def test_libcachesim_results_report_find_get_disagreements(trace):
    pytest.importorskip("libcachesim")
    for name in ("LRU", "LeCaR"):
        assert evaluate(trace[:600], name, 200)["find_get_disagreements"] == 0


def test_in_place_warms_the_cache_given():
    store = embstore.Store()
    t = store.create_table("a", embedding_dim=4)
    t.assign(np.arange(50), np.ones((50, 4), np.float32))
    cache = embstore.InferenceCache(store, ["a"], 64 << 10)
    keys = np.arange(20, dtype=np.uint64).reshape(-1, 1)
    first = evaluate(keys, cache, mode="online", in_place=True)
    assert cache.stats()["requests"] == 20 and first["requests"] == 20
    again = evaluate(keys, cache, mode="online", in_place=True)
    assert again["perfect_hit"] == 1.0  # warm from the run before
    with pytest.raises(embstore.InvalidArgumentError, match="in_place"):
        evaluate(keys, "lru", 10, in_place=True)


def test_group_assoc_adapts_by_default_and_a_rule_can_be_fixed():
    # A static Zipf trace with little co-access: the admission filter's kind of traffic,
    # where the adaptive default must beat the plain group rule it starts from. 15 % of the
    # 16,931 keys: 2,540 entries, 79 sets (a cache of fewer than 64 sets keeps the group rule).
    keys = synthetic_trace(
        num_requests=40_000,
        num_tables=8,
        num_contexts=20_000,
        max_table_size=20_000,
        rho=0.3,
        seed=3,
    )
    runs = {
        rule: evaluate(keys, "group_assoc", 0.15, policy_params={"rule": rule})["perfect_hit"]
        for rule in ("adaptive", "group", "group_admission", "clock")
    }
    assert runs["adaptive"] == evaluate(keys, "group_assoc", 0.15)["perfect_hit"]
    assert runs["group_admission"] > runs["group"], runs
    assert runs["adaptive"] >= 0.9 * max(runs.values()) > runs["group"], runs
    with pytest.raises(embstore.InvalidArgumentError, match="unknown group_assoc rule"):
        evaluate(keys, "group_assoc", 0.05, policy_params={"rule": "mru"})
