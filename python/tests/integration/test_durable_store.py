"""Durable stores from Python: flush and reopen, a real ``kill -9`` of a training process,
checkpoints and restore, the lock, and the ``embstore inspect``/``verify`` commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import embstore
from embstore import CorruptionError, InvalidArgumentError, StoreLockedError


def rows_of(store: embstore.Store) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Every table's ids (sorted), values, state and step."""
    out = {}
    for name in store.tables():
        t = store[name]
        chunks = list(t.export(1 << 16))
        ids = np.concatenate([c.ids for c in chunks]) if chunks else np.zeros(0, np.uint64)
        values = np.concatenate([c.values for c in chunks]) if chunks else np.zeros((0, t.dim))
        state = np.concatenate([c.state for c in chunks]) if chunks else np.zeros((0, 0))
        order = np.argsort(ids)
        out[name] = (ids[order], values[order], state[order], t.step)
    return out


def assert_same(a, b) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for x, y in zip(a[name][:3], b[name][:3], strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)
        assert a[name][3] == b[name][3], name


def test_flush_reopen_and_lock(tmp_path):
    store = embstore.Store(tmp_path / "s")
    assert store.recovery()["created"]
    t = store.create_table("user", 8, optimizer=embstore.Adam(lr=0.01))
    ids = np.arange(5000, dtype=np.int64)
    t.lookup(ids)
    t.apply_gradients(ids[:3000], np.full((3000, 8), 0.5, np.float32))
    t.remove(ids[:10])
    written = store.flush()
    assert written["records"] == 5000  # 10 tombstones + 4990 rows
    with pytest.raises(StoreLockedError):
        embstore.Store(tmp_path / "s")
    want = rows_of(store)
    t.apply_gradients(ids[:5], np.ones((5, 8), np.float32))  # not flushed: lost at close
    del store, t
    again = embstore.Store(tmp_path / "s")
    assert not again.recovery()["created"]
    assert_same(rows_of(again), want)
    assert again.flush()["records"] == 0  # nothing changed since the open


WRITER = textwrap.dedent(
    """
    import os, sys, numpy as np, embstore
    path, acked = sys.argv[1], sys.argv[2]
    store = embstore.Store(path)
    t = store["t"] if "t" in store else store.create_table("t", 8, optimizer=embstore.Adagrad())
    rng = np.random.default_rng(7)
    for step in range(1_000_000):
        ids = rng.integers(0, 20_000, 512)
        t.lookup(ids)
        t.apply_gradients(ids, rng.standard_normal((512, 8)).astype(np.float32))
        if step % 20 == 19:
            store.flush()
            open(acked + ".tmp", "w").write(str(t.step))
            os.replace(acked + ".tmp", acked)
            print("flushed", t.step, flush=True)
    """
)


def test_kill_9_mid_training_reopens_to_the_last_flush(tmp_path):
    """A writer killed by SIGKILL while training and flushing reopens to a flushed state:
    its step is the last acknowledged flush's or the next one's (killed inside a flush
    whose manifest record was already durable), and every record checks out."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    acked = tmp_path / "acked"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "s"), str(acked)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        flushes = 0
        deadline = time.monotonic() + 60
        while flushes < 4 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            flushes += line.startswith("flushed")
        assert flushes >= 4, "the writer did not flush 4 times within 60 s"
        time.sleep(0.05)  # somewhere in the next steps or flush
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    last = int(acked.read_text())
    report = embstore.verify(tmp_path / "s")
    assert report["damage"] == []
    store = embstore.Store(tmp_path / "s")
    step = store["t"].step
    assert step in (last, last + 20), (step, last)
    values = rows_of(store)["t"][1]
    assert len(values) > 0 and np.isfinite(values).all()


def test_checkpoints_restore_onto_another_shard_count(tmp_path):
    store = embstore.Store(tmp_path / "s")
    t = store.create_table("item", 4, num_shards=4)
    t.lookup(np.arange(1000))
    c1 = store.checkpoint(tmp_path / "c1")
    assert c1.parent_id == 0 and c1.segments == 1
    t.apply_gradients(np.arange(100), np.ones((100, 4), np.float32))
    c2 = store.checkpoint(tmp_path / "c2", since=c1)
    assert c2.parent_id == c1.id
    want = rows_of(store)
    seen = []
    restored = embstore.Store.restore(
        c2, tmp_path / "r", num_shards=16, progress=lambda d, n: seen.append((d, n))
    )
    assert seen[-1] == (2, 2)
    assert restored["item"].config["num_shards"] == 16
    assert_same(rows_of(restored), want)
    with pytest.raises(InvalidArgumentError, match="not empty"):
        store.checkpoint(tmp_path / "c1")
    # A store held in memory checkpoints too, but only in full.
    with pytest.raises(InvalidArgumentError, match="only full checkpoints"):
        embstore.Store().checkpoint(tmp_path / "c9", since=c1)
    assert not (tmp_path / "c9").exists()


def exported(store: embstore.Store) -> dict[str, dict[str, np.ndarray]]:
    """Every table's exported arrays (values, state and metadata), sorted by id, and step."""
    keys = ("ids", "values", "state", "versions", "replicas", "update_counts", "last_update_ms")
    out = {}
    for name in store.tables():
        chunks = list(store[name].export())
        arrays = {k: np.concatenate([getattr(c, k) for c in chunks]) for k in keys if chunks}
        order = np.argsort(arrays.get("ids", []))
        out[name] = {k: v[order] for k, v in arrays.items()}
        out[name]["step"] = np.array(store[name].step)
    return out


def assert_exported_same(got, want, keys=None) -> None:
    assert got.keys() == want.keys()
    for name in want:
        for key in [k for k in keys or want[name] if k in want[name]]:
            assert key in got[name], f"{name}.{key}"
            np.testing.assert_array_equal(got[name][key], want[name][key], err_msg=f"{name}.{key}")


def test_a_model_trained_in_memory_checkpoints_and_restores_into_a_durable_store(tmp_path):
    torch = pytest.importorskip("torch")
    import embstore.torch as et

    class Model(torch.nn.Module):
        def __init__(self, store: embstore.Store):
            super().__init__()
            self.user = et.Embedding(store.table("user"))
            self.genres = et.EmbeddingBag(store.table("genre"), mode="sum")
            self.mlp = torch.nn.Linear(8, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            bags = self.genres(ids.reshape(2, -1) % 97)
            return self.mlp(self.user(ids).sum(0) + bags.sum(0)).sum()

    def train(model: torch.nn.Module, steps: int, seed: int) -> None:
        dense = torch.optim.SGD(model.mlp.parameters(), lr=0.01)
        sparse = et.EmbeddingOptimizer(model)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            ids = torch.randint(0, 5000, (64,), generator=gen)
            model(ids).backward()
            sparse.step()
            dense.step()
            sparse.zero_grad()
            dense.zero_grad()

    store = embstore.Store()
    store.create_table("user", 8, optimizer=embstore.Adam(lr=0.01), num_shards=4)
    store.create_table("genre", 8, optimizer=embstore.Adagrad(lr=0.05))
    store.create_table("unused", 3)
    torch.manual_seed(0)
    model = Model(store)
    train(model, 20, seed=1)
    want = exported(store)
    assert want["user"]["step"] == 20 and len(want["user"]["ids"]) > 500
    ckpt = store.checkpoint(tmp_path / "ckpt")
    assert ckpt.parent_id == 0 and ckpt.tables == 3 and ckpt.segments == 2
    seen = []
    store.checkpoint(tmp_path / "again", progress=lambda d, n: seen.append((d, n)))
    rows = sum(len(t.get("ids", [])) for t in want.values())
    assert seen[-1] == (rows, rows)
    # inspect and verify read it as any checkpoint.
    info = embstore.inspect(ckpt.path)
    assert {t["name"]: t["rows"] for t in info["tables"]} == {
        name: len(t.get("ids", [])) for name, t in want.items()
    }
    cmd = [sys.executable, "-m", "embstore", "verify", str(ckpt.path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out
    # Restored into a store in a directory: rows, optimizer state, metadata and steps alike.
    durable = embstore.Store.restore(ckpt, tmp_path / "durable")
    assert durable.path is not None
    assert_exported_same(exported(durable), want)
    assert durable["user"].config == store["user"].config
    # Training goes on identically in both (Adam's step and Adagrad's sums came along).
    again = Model(durable)
    again.mlp.load_state_dict(model.mlp.state_dict())
    train(model, 3, seed=2)
    train(again, 3, seed=2)
    # (Each store stamps its own writes' versions and times.)
    same = ("ids", "values", "state", "update_counts", "step")
    assert_exported_same(exported(durable), exported(store), same)
    assert "ids" not in want["unused"]  # an empty table comes back empty


def test_inspect_and_verify_commands(tmp_path):
    store = embstore.Store(tmp_path / "s")
    store.create_table("a", 4).lookup(np.arange(2000))
    store.flush()
    del store
    cmd = [sys.executable, "-m", "embstore"]
    out = subprocess.run([*cmd, "inspect", str(tmp_path / "s")], capture_output=True, text=True)
    assert out.returncode == 0 and "a " in out.stdout and "2,000" in out.stdout, out
    assert embstore.inspect(tmp_path / "s")["tables"][0]["rows"] == 2000
    out = subprocess.run([*cmd, "verify", str(tmp_path / "s")], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out
    seg = next((tmp_path / "s" / "seg").iterdir())
    data = bytearray(seg.read_bytes())
    data[4096 + 64 * 10 + 45] ^= 0x01
    seg.write_bytes(bytes(data))
    out = subprocess.run(
        [*cmd, "verify", "--quiet", str(tmp_path / "s")], capture_output=True, text=True
    )
    assert out.returncode == 1 and "DAMAGED" in out.stdout, out
    with pytest.raises(CorruptionError):
        embstore.Store(tmp_path / "s")
    out = subprocess.run(
        [*cmd, "verify", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "no such directory" in out.stderr, out
    assert os.path.exists(seg)


def test_a_memory_budget_keeps_most_rows_on_disk_with_the_same_numbers(tmp_path):
    rng = np.random.default_rng(5)
    memory = embstore.Store()
    tiered = embstore.Store(tmp_path / "s", memory_budget_bytes=256 << 10)
    tables = [s.create_table("t", 16, optimizer=embstore.Adagrad(lr=0.1)) for s in (memory, tiered)]
    assert [t.tiered for t in tables] == [False, True]
    for _ in range(30):
        ids = rng.integers(0, 20_000, 512)
        grads = rng.standard_normal((512, 16)).astype(np.float32)
        rows = [t.lookup(ids) for t in tables]
        np.testing.assert_array_equal(rows[0], rows[1])
        for t in tables:
            with t.pinned(ids):
                t.apply_gradients(ids, grads)
    stats = tables[1].stats()
    assert stats["rows"] == len(tables[0]) and stats["rows_on_disk"] > stats["rows"] // 2
    assert stats["cold_reads"] > 0 and stats["evicted_to_disk"] > 0
    limit, used = tiered.memory_budget
    assert limit == 256 << 10 and used < 2 * limit
    ids = np.arange(20_000)
    a, fa = tables[0].lookup(ids, on_miss="zeros", return_found=True)
    b, fb = tables[1].lookup(ids, on_miss="zeros", return_found=True)
    np.testing.assert_array_equal(fa, fb)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(embstore.CapacityError, match="memory budget"):
        tables[1].pin(np.arange(100_000))
    with pytest.raises(InvalidArgumentError, match="needs a path"):
        embstore.Store(memory_budget_bytes=1 << 20)


def test_compact_by_hand_shows_progress_and_keeps_the_rows(tmp_path, capsys):
    store = embstore.Store(tmp_path / "s")
    t = store.create_table("t", 8)
    for _ in range(3):
        t.apply_gradients(np.arange(5000), np.ones((5000, 8), np.float32))
        store.flush()
    want = rows_of(store)
    out = store.compact(progress=True)
    assert out["compactions"] == 1 and out["records"] == 5000
    assert "compact: 1/1 tables" in capsys.readouterr().err
    assert_same(rows_of(store), want)
    assert embstore.Store().compact() == {
        "segments": 0,
        "records": 0,
        "bytes": 0,
        "compactions": 0,
        "compacted_segments": 0,
        "spills_adopted": 0,
    }


def test_a_store_closes_with_a_flush_and_unlocks_its_directory(tmp_path):
    with embstore.Store(tmp_path / "s") as store:
        t = store.create_table("t", 4)
        t.lookup(np.arange(100))
        del t
    with pytest.raises(embstore.StorageError, match="closed"):
        store.tables()
    assert repr(store) == "Store(closed)"
    store.close()  # twice: a no-op
    again = embstore.Store(tmp_path / "s")  # unlocked, and the rows were flushed
    assert len(again["t"]) == 100
