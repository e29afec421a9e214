"""The parameter server from Python: BSP and SSP bounds with worker threads, virtual gathers
that write nothing, every specialisation computing the same values, overflow warnings and
re-planning, a durable store under a memory budget, typed errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import embstore
from embstore.ps import OverflowWarning


def make_store(path=None, budget=None, dim=4, tables=("L", "R"), init=None):
    kw = {} if path is None else {"memory_budget_bytes": budget} if budget else {}
    store = embstore.Store(str(path), **kw) if path is not None else embstore.Store()
    for name in tables:
        store.create_table(
            name,
            embedding_dim=dim,
            optimizer=embstore.Delta(),
            initializer=init or embstore.Uniform(-1.0, 1.0),
            seed=3,
        )
    return store


def iteration(shift=0):
    """A small MF-like iteration: reads depend on earlier updates, deltas on reads."""

    def run(w):
        users = np.arange(w.id, 40, 2) + shift
        items = (users * 7 + 3) % 25
        for u, i in zip(users, items, strict=True):
            lu, ri = w.read("L", [u])[0], w.read("R", [i])[0]
            err = 1.0 - float(lu @ ri)
            w.update("L", [u], (0.05 * (err * ri - 0.01 * lu))[None])
            w.update("R", [i], (0.05 * (err * lu - 0.01 * ri))[None])
        w.clock()

    return run


def values(store, n=80, m=25):
    return store["L"].lookup(np.arange(n)), store["R"].lookup(np.arange(m))


def test_bsp_reads_see_exactly_every_earlier_clock():
    store = make_store(tables=("c",), dim=2, init=embstore.Zeros())
    ps = store.ps(["c"], workers=3)
    seen = []

    def body(w):
        v = w.read("c", [5])[0]
        seen.append((w.clock_now, float(v[0])))
        w.update("c", [5], np.array([[1.0, 2.0]], np.float32))
        w.clock()

    ps.run(body, clocks=10)
    assert len(seen) == 30
    for c, v in seen:
        assert v == 3 * (c - 1), (c, v)
    np.testing.assert_array_equal(store["c"].lookup([5]), [[30.0, 60.0]])
    assert ps.stats()["clocks"] == 10


def test_ssp_staleness_never_exceeds_the_slack():
    store = make_store(tables=("c",), dim=1, init=embstore.Zeros())
    slack = 2
    ps = store.ps(["c"], workers=2, consistency=embstore.SSP(slack=slack))
    lead = []

    def body(w):
        if w.id == 1:
            time.sleep(0.002)
        c = w.clock_now
        v = float(w.read("c", [1])[0, 0])
        own = c - 1
        assert v >= own + max(0, c - 1 - slack), (w.id, c, v)
        lead.append(c - ps.clocks()[1 - w.id])
        w.update("c", [1], np.ones((1, 1), np.float32))
        w.clock()

    ps.run(body, clocks=25)
    assert max(lead) <= slack
    assert max(lead) >= 1, "the fast worker never ran ahead"
    assert store["c"].lookup([1])[0, 0] == 50.0


def test_a_virtual_gather_writes_nothing_and_logs_what_a_real_iteration_does(tmp_path):
    store = make_store()
    ps = store.ps(["L", "R"], workers=2)
    assert not ps.worker(0).in_virtual_gather
    with ps.gather(virtual=True) as g:
        assert g.worker(1).in_virtual_gather
        for w in range(2):
            iteration()(g.worker(w))
    plan = ps.finish_gather()
    assert not ps.worker(1).in_virtual_gather
    assert len(store["L"]) == 0 and len(store["R"]) == 0
    logs = [ps.gathered(w) for w in range(2)]
    real_store = make_store()
    real = real_store.ps(["L", "R"], workers=2)
    real.gather(virtual=False)
    real.run(iteration(), clocks=1)
    real.finish_gather()
    assert logs == [real.gathered(w) for w in range(2)]
    s = plan.stats()
    assert s["rows"] == 40 + 25 and s["accesses"] == sum(len(x) for x in logs)
    assert s["prefetch_frames"] >= 2
    # Each worker updates its 20 users and its items: every one in its static thread cache.
    updated = sum(len({(t, k) for t, k, op in log if op == "update"}) for log in logs)
    assert s["thread_cache_rows"] == updated


@pytest.mark.filterwarnings("ignore::embstore.OverflowWarning")
@pytest.mark.parametrize(
    "specialise", ["all", "no-opt", "static", "prefetch", "thread-caches", "all-but-prefetch"]
)
@pytest.mark.parametrize("gather", ["virtual", "first-iteration", "missing", "false"])
def test_every_specialisation_and_access_information_computes_the_same_values(specialise, gather):
    ref_store = make_store()
    ref = ref_store.ps(["L", "R"], workers=2, specialise="no-opt")
    ref.run(iteration(), clocks=6)
    want = values(ref_store)

    store = make_store()
    ps = store.ps(["L", "R"], workers=2, specialise=specialise)
    clocks = 6
    if gather == "first-iteration":
        ps.gather(virtual=False)
        ps.run(iteration(), clocks=1)
        clocks -= 1
    else:
        with ps.gather(virtual=True) as g:
            for w in range(2):
                if gather == "virtual" or (gather == "missing" and w == 0):
                    iteration()(g.worker(w))
                elif gather == "false":
                    iteration(shift=17)(g.worker(w))
    ps.finish_gather()
    ps.run(iteration(), clocks=clocks)
    for got, exp in zip(values(store), want, strict=True):
        np.testing.assert_array_equal(got, exp)
    if specialise == "all" and gather == "virtual":
        assert ps.stats()["fetches"] == 0 and ps.stats()["overflow"] == 0


def test_a_drifting_pattern_warns_and_auto_replans():
    store = make_store()
    ps = store.ps(["L", "R"], workers=2, replan="auto")
    with ps.gather(virtual=True) as g:
        for w in range(2):
            iteration()(g.worker(w))
    ps.finish_gather()
    ps.run(iteration(), clocks=2)
    with pytest.warns(OverflowWarning, match="outside the plan"):
        ps.run(iteration(shift=40), clocks=5)
    s = ps.stats()
    assert s["overflow_warnings"] >= 1 and s["replans"] == 1, s
    before = ps.stats()["overflow"]
    ps.run(iteration(shift=40), clocks=2)
    assert ps.stats()["overflow"] == before


def test_a_durable_store_under_a_budget_trains_alike_and_checkpoints(tmp_path):
    ref_store = make_store()
    ref_store.ps(["L", "R"], workers=2).run(iteration(), clocks=4)
    want = values(ref_store)
    store = make_store(tmp_path / "s", budget=4096)
    ps = store.ps(["L", "R"], workers=2)
    with ps.gather() as g:
        for w in range(2):
            iteration()(g.worker(w))
    ps.finish_gather()
    ps.run(iteration(), clocks=4)
    store.flush()
    for got, exp in zip(values(store), want, strict=True):
        np.testing.assert_array_equal(got, exp)
    store.close()
    again = embstore.Store(str(tmp_path / "s"))
    for got, exp in zip(values(again), want, strict=True):
        np.testing.assert_array_equal(got, exp)


def test_bad_input_gets_typed_errors():
    store = make_store()
    store.create_table("adam", embedding_dim=4, optimizer=embstore.Adam())
    with pytest.raises(embstore.InvalidArgumentError, match="Delta"):
        store.ps(["L", "adam"], workers=2)
    with pytest.raises(embstore.TableNotFoundError):
        store.ps(["nope"], workers=1)
    with pytest.raises(embstore.InvalidArgumentError, match="workers"):
        store.ps(["L"], workers=0)
    with pytest.raises(embstore.InvalidArgumentError, match="consistency"):
        store.ps(["L"], workers=1, consistency="bsp")
    with pytest.raises(embstore.InvalidArgumentError, match="slack"):
        embstore.SSP(slack=-1)
    with pytest.raises(embstore.InvalidArgumentError, match="variant"):
        store.ps(["L"], workers=1, specialise="fast")
    ps = store.ps(["L", "R"], workers=2)
    w = ps.worker(0)
    with pytest.raises(embstore.TableNotFoundError):
        w.read("X", [1])
    with pytest.raises(embstore.ShapeError):
        w.update("L", [1, 2], np.zeros((3, 4), np.float32))
    with pytest.raises(embstore.ShapeError):
        w.read("L", [[1, 2]])
    with pytest.raises(embstore.InvalidArgumentError, match=">= 0"):
        w.read("L", [-1])
    with pytest.raises(embstore.NonFiniteError):
        w.update("L", [1], np.full((1, 4), np.nan, np.float32))
    with pytest.raises(embstore.InvalidArgumentError):
        ps.worker(2)
    with pytest.raises(embstore.InvalidArgumentError, match="no gather"):
        ps.finish_gather()
    w.update("L", [1], np.ones((1, 4), np.float32))
    with pytest.raises(embstore.InvalidArgumentError, match="clock"):
        ps.gather(virtual=True)
    assert w.read("L", []).shape == (0, 4)


def test_a_failing_iteration_stops_the_run_with_its_error():
    store = make_store()
    ps = store.ps(["L", "R"], workers=2)

    def body(w):
        if w.id == 1 and w.clock_now == 2:
            raise RuntimeError("boom in worker 1")
        w.read("L", [w.id])
        w.clock()

    done = threading.Event()

    def go():
        with pytest.raises(RuntimeError, match="boom"):
            ps.run(body, clocks=3)
        done.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout=20)
    assert done.is_set(), "a failed worker left the others waiting at the clock"
    with pytest.raises(embstore.StoreClosedError, match="worker 1 failed"):
        ps.worker(0).read("L", [0])


def test_delta_tables_are_refused_where_gradients_would_be_added():
    import torch

    import embstore.torch as et

    store = make_store(tables=("L",), dim=4)
    sess = store.session(["L"])
    batches = [np.array([1, 2])]
    with pytest.raises(embstore.InvalidArgumentError, match="Delta"):
        next(iter(sess.run(batches, ids=lambda b: {"L": b})))
    rows = [b.embeddings("L") for b in sess.run(batches, ids=lambda b: {"L": b}, train=False)]
    assert rows[0].shape == (2, 4)  # evaluating Delta tables is fine
    emb = et.Embedding(store["L"])
    with pytest.raises(embstore.InvalidArgumentError, match="Delta"):
        et.EmbeddingOptimizer(torch.nn.ModuleList([emb]))
