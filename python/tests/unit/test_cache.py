"""embstore.InferenceCache, embstore.cache.evaluate and build_surrogates from Python."""

import numpy as np
import pytest
import torch

import embstore
from embstore.cache import SOURCES, build_surrogates, evaluate

D = 8


@pytest.fixture
def store():
    s = embstore.Store()
    rng = np.random.default_rng(3)
    for name in ("user", "item", "ctx"):
        t = s.create_table(name, embedding_dim=D)
        t.assign(np.arange(500), rng.normal(0, 0.1, (500, D)).astype(np.float32))
    return s


def test_lookup_returns_store_rows_then_cache_hits(store):
    cache = embstore.InferenceCache(store, ["user", "item", "ctx"], memory_budget_bytes=64 << 10)
    batch = {"user": np.array([1, 2]), "item": np.array([3, 3]), "ctx": np.array([0, 0])}
    rows, src = cache.lookup(batch, return_sources=True)
    for name in batch:
        np.testing.assert_array_equal(rows[name], store[name].lookup(batch[name]))
        assert [SOURCES[s] for s in src[name]] == ["store", "store"]
    rows2, src2 = cache.lookup(batch, return_sources=True)
    for name in batch:
        np.testing.assert_array_equal(rows2[name], rows[name])  # f32 L1 is exact
        assert all(SOURCES[s] == "l1" for s in src2[name])
    st = cache.stats()
    assert (st["requests"], st["perfect_hits"], st["misses"]) == (4, 2, 6)
    assert st["misses_per_request"][:4] == [2, 0, 0, 2]
    assert st["bytes"] <= st["memory_budget_bytes"] == 64 << 10
    assert st["metadata_bytes_per_entry"] <= 48


def test_int8_tier_returns_its_codec_and_counts_bytes(store):
    cache = embstore.InferenceCache(
        store, ["user", "item", "ctx"], memory_budget_bytes=16 << 10, tiers={"int8": 1.0}
    )
    ids = np.arange(20)
    batch = {"user": ids, "item": ids, "ctx": ids}
    cache.lookup(batch)
    rows, src = cache.lookup(batch, return_sources=True)
    exact = store["user"].lookup(ids)
    hit = src["user"] == SOURCES.index("l1")
    assert hit.any()
    err = np.abs(rows["user"][hit] - exact[hit])
    # Per-row affine int8: within half a step of the row's range (plus f16 header rounding).
    step = (exact[hit].max(1) - exact[hit].min(1)) / 255
    assert np.all(err <= step[:, None] * 0.5 + 1e-3)
    assert cache.stats()["tiers"][0]["codec"] == "int8"


def test_bags_are_pooled(store):
    cache = embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=64 << 10)
    batch = {"user": np.array([1, 2]), "item": (np.array([3, 4, 5]), np.array([0, 2]))}
    rows = cache.lookup(batch)
    items = store["item"].lookup(np.array([3, 4, 5]))
    np.testing.assert_allclose(rows["item"][0], items[:2].mean(0), rtol=1e-6)
    np.testing.assert_allclose(rows["item"][1], items[2], rtol=1e-6)
    rows = cache.lookup(batch, bag_mode="sum")
    np.testing.assert_allclose(rows["item"][0], items[:2].sum(0), rtol=1e-6)


def test_bad_input_gets_typed_errors_and_keeps_serving(store):
    cache = embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=64 << 10)
    with pytest.raises(embstore.TableNotFoundError):
        cache.lookup({"user": [1], "item": [2], "nope": [3]})
    with pytest.raises(embstore.InvalidArgumentError, match="missing"):
        cache.lookup({"user": [1]})  # wrong number of tables in a request
    with pytest.raises(embstore.ShapeError, match="same number of requests"):
        cache.lookup({"user": [1, 2], "item": [2]})
    with pytest.raises(embstore.ShapeError, match="at least one request"):
        cache.lookup({"user": np.array([], np.int64), "item": np.array([], np.int64)})
    with pytest.raises(embstore.InvalidArgumentError, match="integer ids"):
        cache.lookup({"user": [1.5], "item": [2]})
    with pytest.raises(embstore.InvalidArgumentError, match="fewer than one request"):
        embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=100)
    with pytest.raises(embstore.InvalidArgumentError, match="unknown codec"):
        embstore.InferenceCache(store, ["user"], memory_budget_bytes=1 << 20, tiers={"int3": 1.0})
    with pytest.raises(embstore.InvalidArgumentError, match="unknown policy"):
        embstore.InferenceCache(store, ["user"], memory_budget_bytes=1 << 20, policy="belady")
    with pytest.raises(embstore.InvalidArgumentError, match="sum to at most 1"):
        embstore.InferenceCache(
            store, ["user"], memory_budget_bytes=1 << 20, tiers={"f32": 0.7, "int8": 0.7}
        )
    with pytest.raises(embstore.TableNotFoundError):
        embstore.InferenceCache(store, ["user", "missing"], memory_budget_bytes=1 << 20)
    assert cache.stats()["requests"] == 0
    rows = cache.lookup({"user": [1], "item": [2]})
    np.testing.assert_array_equal(rows["user"], store["user"].lookup([1]))


#: Raw 64-bit ids as TorchRec and HugeCTR users have them (hashed, negative int64) and as
#: uint64: -1 and 2**64 - 1 are the same 64 bits, as are -2**63 and 2**63.
WIDE_INT64 = np.array([-1, -2, -(2**63), 2**63 - 1, 2**48, 0x5DEECE66D << 20], dtype=np.int64)
WIDE_UINT64 = np.array([2**64 - 1, 2**63, 2**48 + 1], dtype=np.uint64)


def test_any_64_bit_id_is_cached_and_served_exactly_per_table():
    # Before, the cache took ids in [0, 2**48) only (InvalidArgumentError for the rest).
    store = embstore.Store()
    rng = np.random.default_rng(5)
    ids = np.concatenate([WIDE_INT64.view(np.uint64), WIDE_UINT64])
    for name in ("user", "item"):  # the same raw ids in both tables, different rows
        store.create_table(name, embedding_dim=D).assign(
            ids, rng.normal(0, 1, (ids.size, D)).astype(np.float32)
        )
    for fast in (True, False):
        cache = embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=64 << 10)
        for batch_ids in (WIDE_INT64, WIDE_UINT64, [*map(int, WIDE_UINT64), -1]):
            want = {n: store[n].lookup(batch_ids) for n in ("user", "item")}
            assert not np.array_equal(want["user"], want["item"])
            for round_ in ("store", "l1"):
                if fast:  # arrays take the one-hot fast path (a list the general one)
                    batch = {"user": batch_ids, "item": batch_ids}
                else:  # bags of one id force the general path
                    bag = (batch_ids, np.arange(len(batch_ids)))
                    batch = {"user": bag, "item": bag}
                rows, src = cache.lookup(batch, return_sources=True)
                for n in ("user", "item"):
                    np.testing.assert_array_equal(rows[n], want[n], err_msg=f"{n} {batch_ids}")
                    # -1 as int64 and as uint64 is one key: cached by the first batch.
                    if round_ == "l1" or batch_ids is WIDE_INT64:
                        assert {SOURCES[s] for s in src[n]} == {round_}, (n, batch_ids)
        stats = cache.stats()
        assert stats["perfect_hits"] >= len(WIDE_INT64) + len(WIDE_UINT64), stats


def test_one_hot_fast_path_matches_the_general_path(store):
    # Two caches in the same state: one served through the fast path (one id per table as
    # integer arrays), one through the general path (a bag per table forces it). Same rows,
    # sources and counters, whatever the columns' dtype or strides.
    names = ["user", "item", "ctx"]
    fast = embstore.InferenceCache(store, names, memory_budget_bytes=8 << 10)
    slow = embstore.InferenceCache(store, names, memory_budget_bytes=8 << 10)
    rng = np.random.default_rng(11)
    for step in range(60):
        ids = rng.integers(0, 500, (int(rng.integers(1, 6)), 3))  # [B, T]; columns strided
        kind = step % 4
        if kind == 0:
            cols = [ids[:, k] for k in range(3)]
        elif kind == 1:
            cols = [ids[:, k].astype(np.int32) for k in range(3)]
        elif kind == 2:
            cols = [ids[:, k].astype(np.uint64) for k in range(3)]
        else:
            cols = [torch.from_numpy(np.ascontiguousarray(ids[:, k])) for k in range(3)]
        got, gsrc = fast.lookup(dict(zip(names, cols, strict=True)), return_sources=True)
        bags = {n: (ids[:, k].copy(), np.arange(len(ids))) for k, n in enumerate(names)}
        want, wsrc = slow.lookup(bags, return_sources=True)
        for n in names:
            np.testing.assert_array_equal(got[n], want[n])
            np.testing.assert_array_equal(gsrc[n], wsrc[n])
    for key in ("requests", "perfect_hits", "misses", "l1_hits"):
        assert fast.stats()[key] == slow.stats()[key], key


def test_evaluate_agrees_with_a_hand_computed_trace():
    # LRU, capacity 2 (see crates/embstore-cache/src/evaluate.rs for the same trace by hand):
    # [1,2] cold; [1,2] perfect; [3,1] 1 hit; [1,2] 1 hit; [1,2] perfect.
    trace = np.array([[1, 2], [1, 2], [3, 1], [1, 2], [1, 2]], dtype=np.uint64)
    r = evaluate(trace, "lru", capacity=2, mode="online")
    assert r["perfect_hit"] == pytest.approx(2 / 5)
    assert r["individual_hit"] == pytest.approx(6 / 10)
    assert r["compulsory_bound"] == pytest.approx(3 / 5)
    assert list(r["misses_per_request"]) == [2, 2, 1]
    assert r["served_perfect_hit"] == r["perfect_hit"]
    # Ragged input gives the same answer.
    assert evaluate([list(x) for x in trace], "lru", 2, "online")["perfect_hit"] == r["perfect_hit"]


def test_evaluate_bad_input():
    trace = np.array([[1, 2], [3, 4]], dtype=np.uint64)
    with pytest.raises(embstore.InvalidArgumentError, match="largest request"):
        evaluate(trace, "group_lfu", capacity=1)
    with pytest.raises(embstore.ShapeError):
        evaluate([np.array([1], np.uint64), np.array([], np.uint64)], "lru", 2)
    with pytest.raises(embstore.InvalidArgumentError, match="uint64"):
        evaluate(trace.astype(np.int64), "lru", 2)
    with pytest.raises(embstore.InvalidArgumentError, match="mode"):
        evaluate(trace, "lru", 2, mode="sideways")
    with pytest.raises(embstore.InvalidArgumentError, match="no parameter"):
        evaluate(trace, "lru", 2, policy_params={"age_alpha": 1.0})


def test_evaluate_scores_the_training_stores_own_eviction():
    assert embstore.cache.STORE_POLICIES == ("lru_lfu",)
    trace = embstore._native.synthetic_trace(
        num_requests=2000, num_tables=4, max_table_size=2000, seed=3
    )
    r = evaluate(trace, "lru_lfu", capacity=0.1)
    assert r["policy"] == "lru-lfu"  # report names are hyphenated, as "group-lfu"
    assert 0.0 < r["perfect_hit"] <= r["compulsory_bound"]
    assert r["perfect_hit"] <= r["individual_hit"]
    assert sum(r["misses_per_request"]) == r["requests"]
    # Deterministic, and "lru-lfu" spells the same policy.
    again = evaluate(trace, "lru-lfu", capacity=0.1)
    assert (again["perfect_hit"], again["individual_hit"]) == (
        r["perfect_hit"],
        r["individual_hit"],
    )
    with pytest.raises(embstore.InvalidArgumentError, match="takes no parameters"):
        evaluate(trace, "lru_lfu", capacity=0.1, policy_params={"age_alpha": 1.0})


def test_evaluate_drives_a_python_policy_and_the_whole_cache(store):
    class Everything:
        name = "oracle"

        def access(self, keys):
            return np.ones(len(keys), dtype=bool)

    trace = embstore._native.synthetic_trace(
        num_requests=400, num_tables=3, max_table_size=500, seed=5
    )
    r = evaluate(trace, Everything(), capacity=10, mode="online")
    assert r["policy"] == "oracle" and r["perfect_hit"] == 1.0

    class Broken:
        def access(self, keys):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        evaluate(trace, Broken(), capacity=10)
    # The whole cache: one f32 tier scores exactly like the bare policy of its capacity, the
    # bare policy seeing the keys the cache's policies see (group_assoc's sets hash them).
    for policy in ("group_lfu", "group_assoc"):
        cache = embstore.InferenceCache(
            store,
            ["user", "item", "ctx"],
            memory_budget_bytes=8 << 10,
            policy=policy,
            tiers={"f32": 1.0},
        )
        whole = evaluate(trace, cache, mode="prefix")
        bare = evaluate(policy_keys(trace), policy, capacity=cache.capacity, mode="prefix")
        assert whole["perfect_hit"] == bare["perfect_hit"] > 0, policy


def policy_keys(trace: np.ndarray) -> np.ndarray:
    """``trace`` ([N, G] trace keys) as the keys the cache's policies see."""
    return embstore._native.InferenceCache.policy_keys(trace.reshape(-1)).reshape(trace.shape)


def test_group_assoc_holds_rows_with_eleven_bytes_of_metadata(store):
    names = ["user", "item", "ctx"]
    # The group rule itself (a cache this small keeps it anyway; adaptive metadata: Rust tests).
    params = {
        "age_alpha": None,
        "ways": 8,
        "count_hits": True,
        "pin_request": True,
        "rule": "group",
    }
    cache = embstore.InferenceCache(
        store,
        names,
        memory_budget_bytes=16 << 10,
        policy="group_assoc",
        policy_params=params,
        tiers={"f32": 1.0},
    )
    batch = {"user": np.array([1, 2]), "item": np.array([3, 4]), "ctx": np.array([0, 0])}
    cache.lookup(batch)
    rows, src = cache.lookup(batch, return_sources=True)
    for name in batch:
        np.testing.assert_array_equal(rows[name], store[name].lookup(batch[name]))
        assert all(SOURCES[s] == "l1" for s in src[name])
    st = cache.stats()
    assert st["bytes"] <= st["memory_budget_bytes"]
    # 10 B of policy metadata, 1 B for the table of each slot's key.
    assert st["metadata_bytes_per_entry"] < 12
    # The whole cache scores exactly like the bare policy of its capacity.
    trace = embstore._native.synthetic_trace(
        num_requests=400, num_tables=3, max_table_size=500, seed=5
    )
    cache.clear()
    cache.reset_stats()
    whole = evaluate(trace, cache, mode="prefix")
    bare = evaluate(
        policy_keys(trace),
        "group_assoc",
        capacity=cache.capacity,
        mode="prefix",
        policy_params=params,
    )
    assert whole["perfect_hit"] == bare["perfect_hit"] > 0
    with pytest.raises(embstore.InvalidArgumentError, match="no parameter"):
        evaluate(trace, "group_assoc", 50, policy_params={"refresh_equal": True})
    with pytest.raises(embstore.InvalidArgumentError, match="ways"):
        evaluate(trace, "group_assoc", 50, policy_params={"ways": 0})


def test_libcachesim_policies_by_name():
    pytest.importorskip("libcachesim")
    trace = embstore._native.synthetic_trace(
        num_requests=2000, num_tables=4, max_table_size=3000, seed=2
    )
    ours = evaluate(trace, "lru", capacity=0.05)
    theirs = evaluate(trace, "LRU", capacity=0.05)
    assert ours["perfect_hit"] == theirs["perfect_hit"]  # two LRUs, one evaluator
    assert ours["individual_hit"] == theirs["individual_hit"]
    with pytest.raises(ValueError, match="ClockPro"):
        evaluate(trace, "ClockPro", capacity=0.05)


def test_surrogates_build_save_load_and_serve(store, tmp_path):
    sur = build_surrogates(store, ["item"], k=5, max_dist=1.5, version=7)
    s = sur["item"]
    assert len(s) == 500 and s.version == 7 and 0 < s.coverage <= 1
    alt, dist = s.get(3)
    assert alt != 3 and 0 <= dist <= 1.5
    s.save(tmp_path / "item.surr")
    again = embstore.cache.Surrogates.load(tmp_path / "item.surr")
    assert again.get(3) == s.get(3)
    data = bytearray((tmp_path / "item.surr").read_bytes())
    data[60] ^= 0xFF
    (tmp_path / "bad.surr").write_bytes(bytes(data))
    with pytest.raises(embstore.CorruptionError):
        embstore.cache.Surrogates.load(tmp_path / "bad.surr")
    with pytest.raises(embstore.CorruptionError):
        embstore.cache.Surrogates.open(tmp_path / "bad.surr")
    base = 6 << 10

    def cache_with(surrogates, budget, **kw):
        return embstore.InferenceCache(
            store,
            ["user", "item"],
            memory_budget_bytes=budget,
            tiers={"f32": 0.5, "int8": 0.5},
            surrogates=surrogates,
            surrogate_share=0.1,
            **kw,
        )

    # A build in memory costs 18 B a row of the budget, taken first.
    assert s.memory_bytes == 18 * 500 and not s.on_disk
    with pytest.raises(embstore.InvalidArgumentError, match="open the builds from disk"):
        cache_with(sur, base)
    # On disk it costs its block index; the same rows are served (inline fill, same sizes).
    disk = build_surrogates(store, ["item"], k=5, max_dist=1.5, version=7, directory=tmp_path)
    d = disk["item"]
    assert d.on_disk and d.path == str(tmp_path / "item.surr") and d.memory_bytes < 1000
    assert d.get(3) == s.get(3) and len(d) == 500 and d.version == 7
    in_memory = cache_with(sur, base + s.memory_bytes)
    inline = cache_with(disk, base + d.memory_bytes, l3_fill="inline")
    background = cache_with(disk, base, l3_fill="background")
    rng = np.random.default_rng(0)
    for _ in range(200):
        batch = {"user": rng.integers(0, 50, 8), "item": rng.integers(0, 500, 8)}
        want = in_memory.lookup(batch)
        got = inline.lookup(batch)
        for t in batch:
            np.testing.assert_array_equal(got[t], want[t])
        background.lookup(batch)
    background.sync_l3()
    for c, builds in ((in_memory, 18 * 500), (inline, d.memory_bytes), (background, None)):
        st = c.stats()
        assert st["l3_capacity"] > 0 and st["l3_inserts"] > 0
        assert st["served_perfect_hits"] >= st["perfect_hits"]
        assert st["bytes"] <= st["memory_budget_bytes"]
        if builds is not None:
            assert st["surrogate_table_bytes"] == builds
    assert in_memory.stats()["approximated"] == inline.stats()["approximated"]
    assert in_memory.stats()["l3_reads"] == 0 and inline.stats()["l3_reads"] > 0
    bg = background.stats()
    assert bg["l3_reads"] > 0 and bg["l3_queue_bytes"] > 0 and bg["l3_read_errors"] == 0
    with pytest.raises(embstore.InvalidArgumentError, match="l3_fill"):
        cache_with(disk, base, l3_fill="sometimes")


def test_torch_module(store):
    torch = pytest.importorskip("torch")
    import embstore.torch as et

    cache = embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=64 << 10)
    ebc = et.CachedEmbeddingBagCollection(cache)
    out = ebc({"user": torch.tensor([1, 2]), "item": torch.tensor([3, 4])})
    assert out["user"].dtype == torch.float32 and out["user"].shape == (2, D)
    np.testing.assert_array_equal(out["item"].numpy(), store["item"].lookup([3, 4]))
    assert set(ebc.last_sources) == {"user", "item"}


def test_the_default_tiers_are_a_quarter_f32_and_three_quarters_int4_and_say_so() -> None:
    """No `tiers`: exact f32 rows in L1, 4-bit rows in L2 (more rows in the same bytes), and
    `stats()` says the tiers are the default; `tiers={"f32": 1.0}` keeps every row exact."""
    store = embstore.Store()
    rng = np.random.default_rng(3)
    t = store.create_table("user", embedding_dim=16)
    t.assign(np.arange(2000), rng.standard_normal((2000, 16)).astype(np.float32) * 0.05)
    default = embstore.InferenceCache(store, ["user"], memory_budget_bytes=32 << 10)
    exact = embstore.InferenceCache(
        store, ["user"], memory_budget_bytes=32 << 10, tiers={"f32": 1.0}
    )
    st = default.stats()
    assert [x["codec"] for x in st["tiers"]] == ["f32", "int4"], st["tiers"]
    assert st["default_tiers"] and not exact.stats()["default_tiers"]
    assert dict(embstore.cache.DEFAULT_TIERS) == {"f32": 0.25, "int4": 0.75}
    assert default.capacity > 1.5 * exact.capacity, (default.capacity, exact.capacity)
    # Rows served from L2 are within int4's error of the exact ones; from L1, exact.
    ids = np.arange(0, 2000, 7)
    for _ in range(2):
        rows, src = default.lookup({"user": ids}, return_sources=True)
    want = t.lookup(ids)
    from_l2 = src["user"] == embstore.cache.SOURCES.index("l2")
    assert from_l2.any()
    step = (want.max(axis=1) - want.min(axis=1)) / 15
    err = np.abs(rows["user"] - want).max(axis=1)
    assert np.all(err[from_l2] <= step[from_l2] * 0.5 + 1e-3), err[from_l2].max()
    np.testing.assert_array_equal(rows["user"][~from_l2], want[~from_l2])
    exact_rows = exact.lookup({"user": ids})
    np.testing.assert_array_equal(exact_rows["user"], want)
