"""Priority of a table's writes (embstore.Priority): the default rule marks about the top
(100 - k) % of a trainer's row writes significant; a Python rule decides instead, is called
once per write step, and a failing rule scores 0 with one warning; a follower of a scoring
table holds the same rows, its significant knowledge arrives, and nothing stays in its
significant store once normal sync has caught up."""

from __future__ import annotations

import numpy as np
import pytest

import embstore

D = 8


def _train(table: embstore.Table, steps: int, rows: int = 2_000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for step in range(steps):
        ids = np.arange(step * rows, (step + 1) * rows, dtype=np.uint64) % 5_000
        grads = rng.lognormal(0.0, 1.0, size=(rows, 1)).astype(np.float32) * np.ones(
            (rows, D), np.float32
        )
        table.apply_gradients(ids, grads)


def test_a_priority_is_checked_where_it_is_made():
    for bad in (0, 100, -1, float("nan"), True, "99"):
        with pytest.raises(embstore.InvalidArgumentError, match="percentile k"):
            embstore.Priority(k=bad)
    with pytest.raises(embstore.InvalidArgumentError, match="callable"):
        embstore.Priority(rule=3)
    with pytest.raises(embstore.InvalidArgumentError, match="window_s"):
        embstore.Priority(window_s=0)
    store = embstore.Store()
    with pytest.raises(embstore.InvalidArgumentError, match=r"embstore\.Priority"):
        store.create_table("t", D, priority=99)
    assert store.create_table("u", D).priority_stats() is None


def test_the_default_rule_marks_the_top_share_of_a_syncing_tables_writes():
    store = embstore.Store()
    port = store.serve_sync()
    try:
        item = store.create_table("item", D, priority=embstore.Priority(k=95))
        _train(item, 40)
        s = item.priority_stats()
        assert s["k"] == 95.0 and s["scored"] == 80_000 and s["p_k"] > 0
        share = s["significant"] / s["scored"]
        assert 0.02 < share < 0.12, s
        item.set_priority(None)
        assert item.priority_stats()["k"] is None  # still syncing: the stores' facts remain
    finally:
        port.stop()


def test_a_python_rule_decides_once_per_write_step_and_a_failing_one_scores_zero():
    calls = []

    def every_tenth(u):
        calls.append(len(u["key"]))
        assert set(u) >= {"key", "grad_l1", "writes", "freshness", "g_mean", "f_mean", "p_m"}
        return np.where(u["key"] % 10 == 0, 10.0, 1.0)

    store = embstore.Store()
    port = store.serve_sync()
    try:
        t = store.create_table(
            "t", D, num_shards=1, priority=embstore.Priority(k=95, rule=every_tenth)
        )
        _train(t, 20, rows=1_000)
        s = t.priority_stats()
        # One call per write step (one shard): 20 calls of 1,000 rows.
        assert calls == [1_000] * 20
        # 10 % of the keys score 10, the rest 1: the 95th percentile is 10, so exactly those
        # (the first step, before any threshold, marks none).
        assert 0.08 < s["significant"] / s["scored"] <= 0.11, s

        def broken(u):
            raise RuntimeError("no priority today")

        t.set_priority(embstore.Priority(k=90, rule=broken))
        with pytest.warns(RuntimeWarning, match="no priority today"):
            _train(t, 3, rows=500)
        s = t.priority_stats()
        assert s["scored"] == 1_500 and s["significant"] == 0, s
    finally:
        port.stop()


def test_a_follower_of_a_scoring_table_catches_up_with_nothing_left_ahead():
    primary = embstore.Store()
    port = primary.serve_sync(parts=64)
    try:
        item = primary.create_table("item", D, priority=embstore.Priority(k=90))
        _train(item, 10)
        replica = embstore.Store.follow(port.address, wait_ms=200)
        try:
            assert replica.wait_caught_up(timeout=30), replica.sync_status()
            r = replica.table("item")
            ids = np.arange(5_000, dtype=np.uint64)
            np.testing.assert_array_equal(
                r.lookup(ids, on_miss="zeros"), item.lookup(ids, on_miss="zeros")
            )
            s = r.priority_stats()
            assert s["k"] is None and s["significant_entries"] == 0 and s["enabled"], s
            status = replica.sync_status()[0]
            assert status["congested"] is False and status["prioritised_rows"] == 0, status
        finally:
            replica.close()
    finally:
        port.stop()


def test_significant_versions_name_the_writes_that_were_significant():
    store = embstore.Store()
    port = store.serve_sync()
    try:
        t = store.create_table(
            "t",
            D,
            num_shards=1,
            priority=embstore.Priority(k=95, rule=lambda u: u["key"] % 10 == 0),
        )
        ids = np.arange(1_000, dtype=np.uint64)
        for _ in range(3):
            t.apply_gradients(ids, np.ones((len(ids), D), np.float32))
        sigv = t.significant_versions(ids)
        versions = t.metadata(ids)["versions"]
        marked = sigv == versions
        np.testing.assert_array_equal(marked, ids % 10 == 0)
        assert (sigv[~marked] == 0).all()
    finally:
        port.stop()
