"""Training sessions in one process, and a distributed store of one process (its manifest,
checkpoints, restores): the pipeline is exact, its errors are typed, it releases what it
holds. The multi-process runs are in ``integration/test_distributed.py``."""

from __future__ import annotations

import gc
import json
import re
import socket
import threading
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

import embstore
from embstore import distributed as edist
from embstore.session import _MAX_GROUP
from embstore.table import Table

TABLES = {"user": 8, "item": 4}


def _data(seed: int, n: int = 30) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "user": rng.zipf(1.2, 32) % 3000,
            "item": (rng.zipf(1.1, (32, 3)) % 800) * 13,
            "y": rng.random(32).astype(np.float32),
        }
        for _ in range(n)
    ]


def _ids(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"user": b["user"], "item": b["item"]}


def _store(tmp_path, name: str, budget: int | None) -> embstore.Store:
    store = embstore.Store(tmp_path / name, memory_budget_bytes=budget)
    store.create_table("user", 8, optimizer=embstore.Adam(lr=0.01), seed=3)
    store.create_table("item", 4, optimizer=embstore.Adagrad(lr=0.05), seed=4)
    return store


def _train(
    store: embstore.Store, prefetch: int | None, data, staleness: int = 0, stats=None
) -> tuple[np.ndarray, ...]:
    torch.manual_seed(0)
    head = torch.nn.Linear(8 + 12, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    sess = store.session(["user", "item"], prefetch=prefetch, staleness=staleness)
    for b in sess.run(data, _ids):
        x = torch.cat([b.embeddings("user"), b.embeddings("item").reshape(len(b.y), -1)], 1)
        loss = torch.nn.functional.mse_loss(head(x).squeeze(-1), torch.from_numpy(b.y))
        loss.backward()
        b.push_grads()
        opt.step()
        opt.zero_grad()
    assert sess.stats()["batches"] == len(data)
    if stats is not None:
        stats.update(sess.stats())
    rows = tuple(store[t].lookup(np.arange(0, 10400), "zeros").copy() for t in TABLES) + tuple(
        p.detach().clone().numpy() for p in head.parameters()
    )
    return (*rows, np.array([store[t].step for t in TABLES]))


@pytest.mark.filterwarnings("ignore:embstore session:RuntimeWarning")
@pytest.mark.parametrize("budget", [None, 48 << 10], ids=["in-memory", "tiny-budget"])
def test_a_pipelined_session_trains_bit_for_bit_like_a_sequential_one(tmp_path, budget):
    data = _data(1)
    seq = _train(_store(tmp_path, "seq", None), 0, data)
    for prefetch in (1, 3):
        got = _train(_store(tmp_path, f"p{prefetch}", budget), prefetch, data)
        for a, b in zip(seq, got, strict=True):
            np.testing.assert_array_equal(a, b)
    # Every table stepped once per batch.
    assert list(seq[-1]) == [len(data), len(data)]


@pytest.mark.parametrize("staleness", [0, 1])
def test_the_default_lookahead_trains_bit_for_bit_and_stays_within_its_share(
    tmp_path, monkeypatch, staleness
):
    # prefetch=None under a budget that holds many batches' pins: batches prepared a group at
    # a time and their cold rows read together; the values are those of sequential training.
    from embstore.session import _LOOKAHEAD_SHARE

    data = _data(2, n=60)
    seq = _train(_store(tmp_path, "seq", None), 0, data, staleness)
    budget = 160 << 10
    store = _store(tmp_path, "look", budget)
    most = [0]
    pin = Table.pin

    def watched(self, ids):  # the store's pinned bytes after every pin
        added = pin(self, ids)
        most[0] = max(most[0], store._inner.pinned_bytes)
        return added

    monkeypatch.setattr(Table, "pin", watched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pin refused, no "budget too small"
        got = _train(store, None, data, staleness, stats := {})
    for a, b in zip(seq, got, strict=True):
        np.testing.assert_array_equal(a, b)
    look = stats["lookahead"]
    assert look["bounded_by"] == "budget"
    assert 0 < most[0] <= 0.6 * budget
    # The rows pinned ahead stay within the lookahead's share, but for the last group's
    # estimate (a batch's new pins vary).
    assert most[0] <= _LOOKAHEAD_SHARE * budget + _MAX_GROUP * look["batch_bytes"]


def test_a_lookahead_reads_groups_of_batches_and_says_so(tmp_path):
    store = _store(tmp_path, "s", 160 << 10)
    sess = store.session(["user", "item"])
    for b in sess.run(_data(3, n=40), _ids):
        (b.embeddings("user").sum() + b.embeddings("item").sum()).backward()
        b.push_grads()
    look = sess.stats()["lookahead"]
    assert look["batches"] >= 3 and look["bounded_by"] == "budget", look
    assert look["group"] >= 2 and look["max_batches"] >= 3, look
    assert look["batches_read"] == 40 and look["reads"] <= 1 + 40 // 2, look
    assert look["batch_bytes"] > 0
    text = sess.metrics_text()
    want = r'embstore_session_lookahead_batches\{process="0",session="\d+",bounded_by="budget"\}'
    assert re.search(want, text), text
    assert "embstore_session_lookahead_reads_total" in text
    # Without a budget: 2 ahead; a fixed prefetch: that many, a batch per read.
    mem = embstore.Store()
    mem.create_table("t", 4)
    assert mem.session(["t"]).stats()["lookahead"]["bounded_by"] == "no budget"
    fixed = store.session(["user", "item"], prefetch=3).stats()["lookahead"]
    assert (fixed["batches"], fixed["bounded_by"], fixed["group"]) == (3, "prefetch", 1)


def test_a_budget_too_small_for_a_lookahead_warns_and_trains_exactly(tmp_path):
    data = _data(4, n=20)
    seq = _train(_store(tmp_path, "seq", None), 0, data)
    with pytest.warns(RuntimeWarning, match="fewer than 2 batches ahead"):
        got = _train(_store(tmp_path, "small", 24 << 10), None, data)
    for a, b in zip(seq, got, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore:embstore session:RuntimeWarning")
@pytest.mark.parametrize("budget", [None, 48 << 10], ids=["in-memory", "tiny-budget"])
def test_staleness_one_is_the_same_with_and_without_a_pipeline(tmp_path, budget):
    data = _data(6)
    seq = _train(_store(tmp_path, "seq", None), 0, data, staleness=1)
    for prefetch in (1, 3):
        got = _train(_store(tmp_path, f"p{prefetch}", budget), prefetch, data, staleness=1)
        for a, b in zip(seq, got, strict=True):
            np.testing.assert_array_equal(a, b)
    # One step staler than staleness 0: not the same rows (the batches share hot ids).
    exact = _train(_store(tmp_path, "exact", None), 0, data)
    assert not np.array_equal(seq[0], exact[0])
    assert list(seq[-1]) == [len(data), len(data)]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_staleness_one_reads_a_batch_before_the_previous_one_is_applied(prefetch):
    """Batch t+1's rows are read after batch t-1's gradients and before batch t's: the table
    calls it stands for, in that order."""
    data = _data(7, n=6)
    a = embstore.Store()
    a.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), seed=1)
    b = embstore.Store()
    tb = b.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), seed=1)
    w = torch.arange(4, dtype=torch.float32) + 1
    sess = a.session(["t"], prefetch=prefetch, grad_average=False, staleness=1)
    got = []
    for batch in sess.run(data, lambda d: {"t": d["user"]}):
        got.append(batch.embeddings("t").detach().clone())
        (batch.embeddings("t") * w).sum().backward()
        batch.push_grads()
    want = [torch.from_numpy(tb.lookup(data[0]["user"]).copy())]
    for t in range(len(data)):
        if t + 1 < len(data):
            want.append(torch.from_numpy(tb.lookup(data[t + 1]["user"]).copy()))
        tb.apply_gradients(data[t]["user"], np.broadcast_to(w.numpy(), (len(data[t]["user"]), 4)))
    for g, x in zip(got, want, strict=True):
        torch.testing.assert_close(g, x, rtol=0, atol=0)
    ids = np.arange(3000)
    np.testing.assert_array_equal(a["t"].lookup(ids, "zeros"), tb.lookup(ids, "zeros"))


def test_a_session_equals_the_table_calls_it_stands_for(tmp_path):
    """embeddings() + push_grads() = lookup of the ids + apply_gradients of their gradient."""
    data = _data(2, n=5)
    a = embstore.Store()
    a.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), seed=1)
    b = embstore.Store()
    tb = b.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), seed=1)
    w = torch.arange(4, dtype=torch.float32)
    sess = a.session(["t"], prefetch=2, grad_average=False)
    for batch in sess.run(data, lambda d: {"t": d["user"]}):
        (batch.embeddings("t") * w).sum().backward()
        batch.push_grads()
        rows = torch.from_numpy(tb.lookup(batch.data["user"])).requires_grad_(True)
        (rows * w).sum().backward()
        tb.apply_gradients(batch.data["user"], rows.grad)
    ids = np.arange(3000)
    np.testing.assert_array_equal(a["t"].lookup(ids, "zeros"), tb.lookup(ids, "zeros"))


def test_bags_pool_like_embedding_bag():
    store = embstore.Store()
    store.create_table("g", 4, seed=2)
    ids = np.array([5, 6, 5, 7, 9])
    offsets = torch.tensor([0, 2, 2])
    sess = store.session(["g"], prefetch=0)
    for b in sess.run([ids], lambda i: {"g": i}):
        rows = torch.from_numpy(store["g"].lookup(ids))
        for mode in ("sum", "mean", "max"):
            want = torch.nn.functional.embedding_bag(torch.arange(5), rows, offsets, mode=mode)
            torch.testing.assert_close(b.bags("g", offsets, mode=mode), want, rtol=0, atol=0)
        assert b.unique_ids("g").tolist() == [5, 6, 7, 9]
        assert b.rows("g").shape == (5, 4)  # one row per id, in order


@pytest.mark.filterwarnings("ignore:embstore session:RuntimeWarning")
def test_session_stats_name_every_stage(tmp_path):
    store = _store(tmp_path, "s", 48 << 10)
    sess = store.session(["user", "item"], prefetch=2)
    for b in sess.run(_data(3, n=8), _ids):
        b.embeddings("user").sum().backward()
        b.push_grads()
    s = sess.stats()
    assert set(s["busy_s"]) == set(embstore.session.STAGES)
    assert all(v >= 0 for v in s["busy_s"].values())
    assert s["busy_s"]["prepare"] > 0 and s["busy_s"]["write_back"] > 0
    assert s["rows"]["pulled"] == s["rows"]["served"] > 0
    assert s["rows"]["pulled_remote"] == 0 and s["processes"] == 1


def test_bad_batches_raise_typed_errors_and_apply_nothing():
    store = embstore.Store()
    t = store.create_table("t", 4, optimizer=embstore.SGD(lr=1.0))
    ids = np.array([1, 2, 3])
    t.lookup(ids)
    before = t.lookup(ids).copy()

    def one(ids_fn, prefetch=2):
        sess = store.session(["t"], prefetch=prefetch)
        for b in sess.run([ids], ids_fn):
            return b
        return None

    with pytest.raises(embstore.DTypeError):
        one(lambda _: {"t": np.array([1.5, 2.0])})
    with pytest.raises(embstore.InvalidArgumentError, match="unknown"):
        one(lambda i: {"t": i, "nope": i})
    with pytest.raises(embstore.InvalidArgumentError, match="missing"):
        one(lambda i: {})
    with pytest.raises(embstore.TableNotFoundError):
        store.session(["nope"])
    with pytest.raises(embstore.InvalidArgumentError, match="prefetch"):
        store.session(["t"], prefetch=-1)
    for bad in (2, -1, True, "1"):
        with pytest.raises(embstore.InvalidArgumentError, match="staleness"):
            store.session(["t"], staleness=bad)
    sess = store.session(["t"], prefetch=0)
    for b in sess.run([ids], lambda i: {"t": i}):
        (b.embeddings("t") * float("nan")).sum().backward()
        with pytest.raises(embstore.NonFiniteError, match="nothing was applied"):
            b.push_grads()
        with pytest.raises(embstore.InvalidArgumentError, match="twice"):
            b.push_grads()
    np.testing.assert_array_equal(t.lookup(ids), before)
    assert t.step == 0


def _step(b) -> None:
    """A training step of a batch of ``_ids``: a loss over both tables, backward, push."""
    (b.embeddings("user").sum() + b.embeddings("item").sum()).backward()
    b.push_grads()


def test_an_error_of_the_loader_reaches_the_loop():
    store = embstore.Store()
    store.create_table("t", 4)

    def loader():
        yield np.array([1, 2])
        raise OSError("disk on fire")

    sess = store.session(["t"], prefetch=2)
    with pytest.raises(OSError, match="disk on fire"):
        for b in sess.run(loader(), lambda i: {"t": i}):
            b.embeddings("t").sum().backward()
            b.push_grads()


def test_breaking_out_releases_every_pin(tmp_path, monkeypatch):
    held: dict[int, int] = {}
    real_pin, real_unpin = Table.pin, Table.unpin

    def pin(self, ids):
        added = real_pin(self, ids)
        held[id(ids)] = held.get(id(ids), 0) + 1
        return added

    def unpin(self, ids):
        real_unpin(self, ids)
        held[id(ids)] -= 1

    monkeypatch.setattr(Table, "pin", pin)
    monkeypatch.setattr(Table, "unpin", unpin)
    store = _store(tmp_path, "s", 1 << 20)
    for staleness, prefetch in ((0, 3), (1, 3), (0, None), (1, None)):
        sess = store.session(["user", "item"], prefetch=prefetch, staleness=staleness)
        for n, b in enumerate(sess.run(_data(4), _ids)):
            _step(b)
            if n == 4:
                break
        assert held and all(v == 0 for v in held.values()), (staleness, prefetch, held)
        assert store._inner.pinned_bytes == 0
    # The session runs again from a clean state.
    assert sum(1 for b in sess.run(_data(5, n=3), _ids) if _step(b) is None) == 3


@pytest.mark.filterwarnings("ignore:embstore session:RuntimeWarning")
def test_the_cold_row_readers_end_with_the_run(tmp_path):
    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("embstore-read")]

    store = _store(tmp_path, "s", 48 << 10)
    seen = 0
    for b in store.session(["user", "item"], prefetch=2).run(_data(6), _ids):
        _step(b)
        seen = max(seen, len(readers()))
    assert seen > 0, "no batch read the cold rows of two tables at once"
    deadline = time.monotonic() + 5
    while readers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not readers(), "reader threads outlived the run"


def _owner_reference(key: int, world: int) -> int:
    """SplitMix64's finaliser in Python ints, top 32 bits scaled onto ``world``."""
    m = (1 << 64) - 1
    z = (key + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return ((z >> 32) * world) >> 32


def test_owner_of_is_fixed_and_spreads_structured_ids():
    # Fixed forever: checkpoints of distributed stores depend on it.
    keys = [0, 1, 2, 7, 1 << 40, 2**63 + 5, 2**64 - 1]
    for world in (2, 3, 4, 7):
        got = edist.owner_of(np.array(keys, dtype=np.uint64), world).tolist()
        assert got == [_owner_reference(k, world) for k in keys]
    for ids in (
        np.arange(100_000, dtype=np.uint64),
        np.arange(100_000, dtype=np.uint64) * 1024,
        np.arange(100_000, dtype=np.uint64) << np.uint64(40),
    ):
        for world in (2, 3, 4, 7):
            counts = np.bincount(edist.owner_of(ids, world), minlength=world)
            assert counts.min() > 0.95 * len(ids) / world, (world, counts)
    assert edist.owner_of(np.arange(5, dtype=np.uint64), 1).tolist() == [0] * 5


def test_owner_of_agrees_with_its_rust_twin():
    # The same table pins embstore_common::owner_of (crates/embstore-common/src/shard.rs), so a
    # Rust tool places a distributed checkpoint's ids where the processes put them.
    ids = np.array([0, 1, 2, 7, 1 << 40, 2**63 + 5, 2**64 - 1, 123_456_789], dtype=np.uint64)
    known = {
        2: [1, 1, 1, 0, 0, 0, 1, 0],
        3: [2, 1, 1, 1, 0, 0, 2, 0],
        4: [3, 2, 2, 1, 0, 1, 3, 0],
        7: [6, 3, 4, 2, 0, 2, 6, 0],
        1000: [883, 566, 591, 389, 124, 330, 893, 133],
    }
    for world, want in known.items():
        assert edist.owner_of(ids, world).tolist() == want, world


def test_distributed_without_a_launcher_says_what_is_missing(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(embstore.InvalidArgumentError, match="torchrun"):
        embstore.DistributedStore(tmp_path / "d")
    with pytest.raises(embstore.InvalidArgumentError, match="needs a path"):
        embstore.DistributedStore(None)
    # The flag of old names the class that replaced it.
    with pytest.raises(embstore.InvalidArgumentError, match=r"embstore\.DistributedStore\(path"):
        embstore.Store(tmp_path / "e", distributed=True)
    with pytest.raises(embstore.InvalidArgumentError, match=r"DistributedStore\.restore"):
        embstore.Store.restore(tmp_path / "ck", tmp_path / "f", distributed=True)
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()


@pytest.fixture
def one_process(monkeypatch):
    """A torch.distributed job of one process (what torchrun --nproc-per-node 1 sets up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_distributed_store_of_one_process_checkpoints_and_restores(tmp_path, one_process):
    store = embstore.DistributedStore(tmp_path / "d", memory_budget_bytes=1 << 20)
    assert (tmp_path / "d" / edist.MANIFEST).exists() and (tmp_path / "d" / "rank-00000").is_dir()
    assert json.loads((tmp_path / "d" / edist.MANIFEST).read_text())["world_size"] == 1
    t = store.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), initializer=embstore.Zeros())
    assert isinstance(t, embstore.DistributedTable) and store.world_size == 1
    t.apply_gradients([1, 2, 2], np.ones((3, 4), np.float32))
    rows = t.lookup(np.array([1, 2]))
    np.testing.assert_array_equal(rows, [[-0.5] * 4, [-1.0] * 4])  # duplicates summed
    assert len(t) == 2
    # Only the collective calls: one process's calls are on its partition, said by name.
    with pytest.raises(AttributeError, match=r"table\.local\.export\(\)"):
        t.export()
    assert not hasattr(t, "assign") and isinstance(t.local, embstore.Table)
    assert store.local.table("t") == t.local and not store.local.distributed
    assert sum(len(c.ids) for c in t.local.export(10)) == 2
    with pytest.raises(embstore.InvalidArgumentError, match="return_found"):
        t.lookup([1], return_found=True)
    # The store's other collective calls: a table made and dropped on every process, compacted.
    u = store.create_table(embstore.TableSpec("u", 2))
    assert "u" in store and store.tables() == ["t", "u"] and store["u"] == u
    with pytest.raises(embstore.InvalidArgumentError, match="not both"):
        store.create_table(embstore.TableSpec("v", 2), num_shards=2)
    store.drop_table("u")
    assert "u" not in store and "u" not in store.local
    assert isinstance(store.compact(), dict) and store.path == tmp_path / "d"
    assert "process 0 of 1" in repr(store) and "process 0 of 1" in repr(t)

    first = store.checkpoint(tmp_path / "ck" / "a", step=1, state={"epoch": 1})
    assert first.tables == 1
    t.apply_gradients([1], np.ones((1, 4), np.float32))
    store.checkpoint(tmp_path / "ck" / "b", step=2, state={"epoch": 2})
    (tmp_path / "ck" / "c").mkdir()  # an interrupted checkpoint: no manifest
    assert embstore.latest_checkpoint(tmp_path / "ck") == tmp_path / "ck" / "b"
    assert embstore.training_state(tmp_path / "ck" / "a") == {"epoch": 1}
    assert embstore.latest_checkpoint(tmp_path / "none") is None
    with pytest.raises(embstore.NotFoundError, match="not a complete"):
        embstore.training_state(tmp_path / "ck" / "c")
    with pytest.raises(embstore.InvalidArgumentError, match="not empty"):
        store.checkpoint(tmp_path / "ck" / "a")
    store.close()

    back = embstore.DistributedStore.restore(tmp_path / "ck" / "a", tmp_path / "r")
    np.testing.assert_array_equal(back.table("t").lookup(np.array([1, 2])), rows)
    assert back.table("t").local.step == 1
    back.close()
    with pytest.raises(embstore.InvalidArgumentError, match="not empty"):
        embstore.DistributedStore.restore(tmp_path / "ck" / "a", tmp_path / "r")
    with pytest.raises(embstore.NotFoundError, match="interrupted"):
        embstore.DistributedStore.restore(tmp_path / "ck" / "c", tmp_path / "r2")


def test_a_distributed_store_opens_only_with_its_process_count(tmp_path, one_process):
    root = tmp_path / "d"
    root.mkdir()
    edist.write_manifest(root, {"world_size": 2})
    with pytest.raises(embstore.InvalidArgumentError, match="written by 2 processes"):
        embstore.DistributedStore(root)
    plain = tmp_path / "plain"
    embstore.Store(plain).close()
    with pytest.raises(embstore.InvalidArgumentError, match="not a distributed one"):
        embstore.DistributedStore(plain)


def test_session_metrics_are_served_in_prometheus_text_format():
    import urllib.error
    import urllib.request

    store = embstore.Store()
    store.create_table("t", 4)
    sess = store.session(["t"], prefetch=1)
    for b in sess.run([np.array([1, 2, 3])] * 3, lambda i: {"t": i}):
        b.embeddings("t").sum().backward()
        b.push_grads()
    address = sess.serve_metrics("127.0.0.1:0")
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    label = re.search(r'embstore_session_batches_total\{process="0",session="(\d+)"\} 3', text)
    assert label, text
    first = f'process="0",session="{label.group(1)}"'
    assert 'stage="write_back",state="busy"' in text
    assert f'embstore_session_rows_total{{{first},kind="pulled"}} 9' in text
    # A second session is served by the same endpoint, each family's HELP and TYPE once.
    other = store.session(["t"], prefetch=0)
    assert other.serve_metrics("127.0.0.1:0") == address
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    assert text.count("# TYPE embstore_session_batches_total counter") == 1, text
    assert f"embstore_session_batches_total{{{first}}} 3" in text
    assert re.search(r'batches_total\{process="0",session="\d+"\} 0', text), text
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{address}/nope", timeout=10)
    with pytest.raises(embstore.InvalidArgumentError, match="host:port"):
        sess.serve_metrics("nope")
    with pytest.raises(embstore.InvalidArgumentError, match="already"):
        sess.serve_metrics("127.0.0.1:1")
    assert embstore.metrics.serve(address) == address  # the same address again: the same one
    # A session that is gone is scraped no more.
    del other
    gc.collect()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    assert text.count("embstore_session_batches_total{") == 1, text


def test_a_session_on_a_device_trains_as_on_the_host(tmp_path):
    """``device=`` puts the batch's rows on a torch device (CPU here; a CUDA device where one
    is present) and brings their gradients back: the same rows either way."""
    data = _data(6, n=6)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for device in [None, *devices]:
        store = embstore.Store()
        store.create_table("user", 8, optimizer=embstore.Adagrad(lr=0.1), seed=3)
        sess = store.session(["user"], prefetch=1, device=device)
        for b in sess.run(data, lambda d: {"user": d["user"]}):
            e = b.embeddings("user")
            assert e.device.type == (device or "cpu")
            (e * e).sum().backward()
            b.push_grads()
        results.append(store["user"].lookup(np.arange(3000), "zeros"))
    for r in results[1:]:
        np.testing.assert_array_equal(results[0], r)
