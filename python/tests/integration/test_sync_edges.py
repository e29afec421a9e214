"""Dissemination as users combine it with the rest of the store: a follower with a memory
budget and a directory (joined, restarted), expiry of rows on disk, a follower that becomes a
source in its own process, tables created and dropped at a source that syncs."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import embstore
from embstore.errors import InvalidArgumentError

# A follower with a memory budget and a directory: it joins, serves, closes, and a restart
# over the same directory follows again. Run in a process of its own so that a deadlock fails
# the test (by its timeout) instead of hanging the suite.
_BUDGETED_FOLLOWER = """
import sys, numpy as np, embstore
path = sys.argv[1]
primary = embstore.Store(replica_id=1)
t = primary.create_table("item", embedding_dim=16, optimizer=embstore.Adagrad(lr=0.1))
ids = np.arange(0, 60_000 * 7, 7)
t.assign(ids, np.full((ids.size, 16), 0.5, np.float32))
port = primary.serve_sync(token="tok")
for run in range(2):
    replica = embstore.Store.follow(port.address, token="tok", path=path,
                                    memory_budget_bytes=2 << 20)
    assert replica.wait_caught_up(timeout=120), replica.sync_status()
    t.assign(ids[:100], np.full((100, 16), float(run + 2), np.float32))
    assert replica.wait_caught_up(timeout=120), replica.sync_status()
    got = replica["item"].lookup(ids, on_miss="error")
    assert np.array_equal(got, t.lookup(ids, on_miss="error")), run
    assert replica["item"].stats()["rows_on_disk"] > 0, "the budget put no row on disk"
    replica.close()
    print("run", run, "ok", flush=True)
port.stop()
"""


def test_a_follower_with_a_memory_budget_joins_serves_restarts_and_closes(tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _BUDGETED_FOLLOWER, str(tmp_path / "replica")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["run 0 ok", "run 1 ok"], r.stdout


def test_expired_rows_on_disk_are_removed_too(tmp_path) -> None:
    store = embstore.Store(tmp_path / "s", memory_budget_bytes=1 << 20)
    t = store.create_table("item", embedding_dim=16, ttl=1.0)
    ids = np.arange(50_000)
    for chunk in np.array_split(ids, 10):
        t.assign(chunk, np.ones((chunk.size, 16), np.float32))
    assert t.stats()["rows_on_disk"] > 40_000
    time.sleep(1.2)
    assert t.evict_expired() == 50_000
    assert len(t) == 0
    found = t.lookup(ids, on_miss="zeros")
    assert not found.any(), "an expired row was served"
    store.close()


def test_a_follower_becomes_a_source_in_its_own_process() -> None:
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=4)
    t.assign(np.arange(500), np.ones((500, 4), np.float32))
    port = primary.serve_sync(token="tok", parts=64)
    replica = embstore.Store.follow(port.address, token="tok")
    try:
        assert replica.wait_caught_up(timeout=60)
        replica.stop_following()
        port.stop()
        # Asking for other sync options than the store holds is a clear error, not Rust text.
        with pytest.raises(InvalidArgumentError) as e:
            replica.serve_sync(parts=16)
        assert "syncs already" in str(e.value) and "64 parts" in str(e.value), e.value
        assert "SyncOptions" not in str(e.value) and "{" not in str(e.value), e.value
        # With the store's own options, it serves: a new replica follows it.
        with replica.serve_sync(token="tok2") as promoted:
            replica["item"].assign([7], [[9.0] * 4])
            other = embstore.Store.follow(promoted.address, token="tok2")
            try:
                assert other.wait_caught_up(timeout=60)
                assert len(other["item"]) == 500
                assert other["item"].lookup([7], on_miss="error")[0, 0] == 9.0
            finally:
                other.close()
    finally:
        replica.close()
        primary.close()


def test_a_table_created_at_the_source_is_followed_and_a_drop_is_refused() -> None:
    primary = embstore.Store(replica_id=1)
    primary.create_table("item", embedding_dim=4).assign([1], [[1.0] * 4])
    with primary.serve_sync(token="tok") as port:
        replica = embstore.Store.follow(port.address, token="tok")
        try:
            assert replica.wait_caught_up(timeout=60)
            users = primary.create_table("user", embedding_dim=8)
            users.assign(np.arange(100), np.full((100, 8), 3.0, np.float32))
            assert replica.wait_caught_up(timeout=60)
            assert [s["table"] for s in replica.sync_status()] == ["item", "user"]
            assert np.array_equal(
                replica["user"].lookup(np.arange(100)), users.lookup(np.arange(100))
            )
            with pytest.raises(InvalidArgumentError, match=r"while the store syncs.*clear\(\)"):
                primary.drop_table("user")
            users.clear()
            assert replica.wait_caught_up(timeout=60)
            assert len(replica["user"]) == 0
        finally:
            replica.close()
    primary.close()


@pytest.mark.etcd
def test_a_trainer_registers_its_own_sync_port_in_etcd(tmp_path) -> None:
    """The training process serves its sync port and registers it in etcd as a primary of its
    data centre; a replica of another data centre finds it there and follows; stopping the
    port deregisters it."""
    from test_cluster import _Etcd, _status

    etcd = _Etcd(tmp_path / "etcd")
    try:
        trainer = embstore.Store(tmp_path / "train", replica_id=1)
        t = trainer.create_table("item", embedding_dim=4, optimizer=embstore.Adagrad(lr=0.1))
        with pytest.raises(InvalidArgumentError, match="advertise="):
            trainer.serve_sync("0.0.0.0:0", etcd=etcd.url, dc="dc1")
        with pytest.raises(InvalidArgumentError, match="needs dc"):
            trainer.serve_sync(etcd=etcd.url)
        port = trainer.serve_sync(token="tok", etcd=etcd.url, dc="dc1")
        members = _status(etcd.url)["sync"]
        assert [(m["dc"], m["primary"], m["addr"]) for m in members] == [
            ("dc1", True, port.address)
        ], members
        replica = embstore.Store.follow(etcd=etcd.url, dc="dc2", token="tok")
        try:
            ids = np.arange(300)
            t.apply_gradients(ids, np.ones((300, 4), np.float32))
            assert replica.wait_caught_up(timeout=60), replica.sync_status()
            assert np.array_equal(replica["item"].lookup(ids, on_miss="error"), t.lookup(ids))
        finally:
            replica.close()
        port.stop()
        deadline = time.monotonic() + 30
        while any(m["primary"] for m in _status(etcd.url)["sync"]):
            assert time.monotonic() < deadline, "the stopped port stayed registered"
            time.sleep(0.2)
        trainer.close()
    finally:
        etcd.stop()
