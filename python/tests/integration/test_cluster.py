"""A cluster in etcd, as processes on loopback: etcd (Debian's `etcd-server`), four `embstore
serve --etcd` processes (2 shards x 2 replicas) and `embstore publish --etcd`. Lookups from
Python equal the checkpoint's rows; `status --etcd` shows the table and its roll; a server
killed with SIGKILL is routed around and its slot is served again once its lease expires; a
server restarted on its address rejoins; SIGTERM deregisters; with etcd stopped, lookups go
on."""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from test_serving import _embstore, _Served

import embstore

pytestmark = pytest.mark.etcd

ROWS = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Etcd:
    """An etcd process on two free loopback ports, its data in ``dir``; stopped by PID."""

    def __init__(self, dir: pathlib.Path) -> None:
        assert shutil.which("etcd"), "etcd is not installed: `make setup` installs etcd-server"
        client, peer = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            [
                *("etcd", "--data-dir", str(dir), "--listen-client-urls", self.url),
                *("--advertise-client-urls", self.url, "--listen-peer-urls", peer_url),
                *("--initial-advertise-peer-urls", peer_url),
                *("--initial-cluster", f"default={peer_url}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while _embstore("status", "--etcd", self.url, timeout=20).returncode != 0:
            assert time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _rows_of(version: int, ids: np.ndarray) -> np.ndarray:
    return np.stack([np.full(len(ids), version), ids, ids % 7, np.ones(len(ids))], 1).astype(
        np.float32
    )


def _status(url: str) -> dict:
    out = _embstore("status", "--etcd", url, "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _wait(what: str, check, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {limit} s"
        time.sleep(0.3)


def test_a_cluster_in_etcd_publishes_repairs_rejoins_and_outlives_etcd(tmp_path) -> None:
    store = embstore.Store(tmp_path / "s")
    user = store.create_table("user", embedding_dim=4)
    ids = np.arange(ROWS, dtype=np.int64)
    user.assign(ids, _rows_of(1, ids))
    c1 = store.checkpoint(tmp_path / "c1")
    user.assign(ids, _rows_of(2, ids))
    store.checkpoint(tmp_path / "c2", since=c1)
    del user, store

    etcd = _Etcd(tmp_path / "etcd")
    servers: list[_Served] = []
    try:
        for _ in range(4):
            servers.append(_Served("--etcd", etcd.url, "--lease-ttl", "2"))
        _wait("4 servers registered", lambda: len(_status(etcd.url)["servers"]) == 4)
        # The first version: 2 shards x 2 replicas, placed by publish.
        out = _embstore(
            "publish", "--etcd", etcd.url, "--table", "user", "--checkpoint", str(tmp_path / "c1"),
            "--shards", "2", "--replicas", "2", timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "table 'user' is at version 1" in out.stdout, out.stdout
        client = embstore.connect(etcd=etcd.url, deadline_s=10.0, max_restarts=3)
        rows, version = client.lookup("user", ids, return_version=True)
        np.testing.assert_array_equal(rows, _rows_of(1, ids))
        assert version == 1

        # Version 2 with an automatic shard count (the checkpoint is far below --max-shard-size:
        # one shard), while this client reads: every batch at one version.
        out = _embstore(
            "publish", "--etcd", etcd.url, "--table", "user", "--checkpoint", str(tmp_path / "c2"),
            "--drain-quiet", "0.5", timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "version 1 -> 2, 1 shards x 2 replicas" in out.stdout, out.stdout
        deadline = time.monotonic() + 10
        while True:
            rows, version = client.lookup("user", ids, return_version=True)
            np.testing.assert_array_equal(rows, _rows_of(version, ids))
            if version == 2 or time.monotonic() > deadline:
                break
        assert version == 2
        status = _embstore("status", "--etcd", etcd.url, timeout=30)
        assert status.returncode == 0, status.stderr
        assert "table user: version 2, 1 shards x 2 replicas" in status.stdout, status.stdout
        assert "last roll: 1 -> 2 done" in status.stdout, status.stdout

        # SIGKILL one of the two replicas: lookups go on; once its lease (2 s) expires, its
        # slot moves to a live server, which loads it.
        table = _status(etcd.url)["tables"][0]
        victim_addr = table["assignment"][0][0]
        victim = next(s for s in servers if s.address == victim_addr)
        victim.proc.kill()
        victim.proc.wait(timeout=10)
        np.testing.assert_array_equal(client.lookup("user", ids), _rows_of(2, ids))

        def repaired() -> bool:
            s = _status(etcd.url)
            replicas = s["tables"][0]["assignment"][0]
            held = [
                a
                for a, h in s["servers"].items()
                if h and any(r[0] == "user" and r[1] == 2 and r[4] == "ready" for r in h)
            ]
            return victim_addr not in replicas and len(set(held) & set(replicas)) == 2

        _wait("the killed server's slot served again", repaired)
        np.testing.assert_array_equal(client.lookup("user", ids), _rows_of(2, ids))

        # Restarted on its address, it rejoins (registered again, nothing assigned yet).
        port = victim_addr.rsplit(":", 1)[1]
        servers.remove(victim)
        servers.append(
            _Served("--etcd", etcd.url, "--lease-ttl", "2", "--listen", f"127.0.0.1:{port}")
        )
        _wait(
            "the restarted server registered", lambda: victim_addr in _status(etcd.url)["servers"]
        )

        # SIGTERM: a member deregisters at once (well before its lease would expire).
        leaving = servers.pop(0)
        leaving.proc.send_signal(signal.SIGTERM)
        leaving.proc.wait(timeout=15)
        assert leaving.proc.returncode == 0
        assert leaving.address not in _status(etcd.url)["servers"]

        # etcd stops: the client goes on with the servers it knows.
        etcd.stop()
        for _ in range(10):
            np.testing.assert_array_equal(client.lookup("user", ids[:100]), _rows_of(2, ids[:100]))
    finally:
        for s in servers:
            s.stop()
        etcd.stop()


def test_a_roll_replaces_the_base_and_sync_continues_on_top(tmp_path) -> None:
    """Two cluster members follow a trainer's sync port (`serve --etcd --follow`): each version
    `publish` rolls in from the trainer's checkpoint is kept current from there, pulling only
    what is newer than the checkpoint; the next roll moves the base and sync goes on on top of
    it; lookups see one version per batch throughout."""
    trainer = embstore.Store(tmp_path / "s")
    user = trainer.create_table("user", embedding_dim=4)
    port = trainer.serve_sync("127.0.0.1:0", parts=64)
    ids = np.arange(ROWS, dtype=np.int64)
    user.assign(ids, _rows_of(1, ids))
    trainer.checkpoint(tmp_path / "c1")
    etcd = _Etcd(tmp_path / "etcd")
    servers: list[_Served] = []
    try:
        for _ in range(2):
            follow = ("--follow", port.address)
            servers.append(_Served("--etcd", etcd.url, "--lease-ttl", "2", *follow))
        _wait("2 servers registered", lambda: len(_status(etcd.url)["servers"]) == 2)
        # Written after the checkpoint, before the roll: the followers pull it on top.
        fresh = ids[:100]
        user.assign(fresh, _rows_of(5, fresh))
        out = _embstore(
            "publish", "--etcd", etcd.url, "--table", "user", "--checkpoint", str(tmp_path / "c1"),
            "--shards", "1", "--replicas", "2", timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        client = embstore.connect(etcd=etcd.url, deadline_s=10.0, max_restarts=3)
        want = np.concatenate([_rows_of(5, fresh), _rows_of(1, ids[100:])])

        def serves(rows: np.ndarray, version: int) -> bool:
            # Both replicas: a few lookups go round-robin over them.
            for _ in range(4):
                got, v = client.lookup("user", ids, return_version=True)
                if v != version or not np.array_equal(got, rows):
                    return False
            return True

        _wait("version 1 with the rows written after its checkpoint", lambda: serves(want, 1))
        # Writes while serving reach both replicas.
        user.assign(ids[200:300], _rows_of(6, ids[200:300]))
        want[200:300] = _rows_of(6, ids[200:300])
        _wait("fresh rows on top of version 1", lambda: serves(want, 1))

        # A new base: everything rewritten, checkpointed and rolled in; then more writes.
        user.assign(ids, _rows_of(2, ids))
        trainer.checkpoint(tmp_path / "c2")
        out = _embstore(
            "publish", "--etcd", etcd.url, "--table", "user", "--checkpoint", str(tmp_path / "c2"),
            "--drain-quiet", "0.5", timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        user.assign(ids[:50], _rows_of(7, ids[:50]))
        want = np.concatenate([_rows_of(7, ids[:50]), _rows_of(2, ids[50:])])
        _wait("fresh rows on top of version 2", lambda: serves(want, 2))
    finally:
        for s in servers:
            s.stop()
        etcd.stop()
        port.stop()
