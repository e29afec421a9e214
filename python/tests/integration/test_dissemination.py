"""Dissemination: a follower holds the primary's rows and keeps up with its writes, in one
process (`Store.follow`) and across processes (`embstore serve --follow`) through kill -9 of
the follower mid-pull and of the primary; bad tokens and id clashes are typed errors."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import embstore
from embstore.errors import InvalidArgumentError, PermissionDeniedError

HERE = pathlib.Path(__file__).parent


def _rows(t: embstore.Table) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for c in t.export(4096):
        out.update(zip(c.ids.tolist(), c.values, strict=True))
    return out


def _same(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_an_embedded_follower_holds_the_primarys_rows_and_follows_its_writes() -> None:
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=4, optimizer=embstore.Adagrad(lr=0.1))
    t.assign(np.arange(1000), np.ones((1000, 4), np.float32))
    with primary.serve_sync(token="tok") as port:
        replica = embstore.Store.follow(port.address, token="tok")
        try:
            assert replica.wait_caught_up(timeout=30)
            assert _same(_rows(replica["item"]), _rows(t))
            rng = np.random.default_rng(3)
            for _ in range(50):
                ids = rng.integers(0, 2000, size=32)
                t.apply_gradients(ids, rng.standard_normal((32, 4)).astype(np.float32))
            t.remove([1, 2, 3])
            assert replica.wait_caught_up(timeout=30)
            assert _same(_rows(replica["item"]), _rows(t))
            (s,) = replica.sync_status()
            assert s["table"] == "item" and s["connected"] and s["caught_up"], s
            # bytes_in: zstd-compressed (protocol 6), the 1,000 rows of ones to almost nothing
            assert s["errors"] == 0 and s["rows_applied"] >= 1000 and s["bytes_in"] > 4_000, s
            assert s["cache_hit_rate"] > 0.5 and s["lag_ms_p99"] is not None, s
            stats = t.sync_stats()
            assert stats is not None and stats["tombstones"] == 3 and stats["rows_sent"] > 0
            # Lookups on the replica answer while it follows.
            assert replica["item"].lookup([5]).shape == (1, 4)
        finally:
            replica.close()
        # A wrong token, and a replica with the primary's own id, are refused.
        with pytest.raises(PermissionDeniedError, match="wrong replication token"):
            embstore.Store.follow(port.address, token="nope")
        with pytest.raises(InvalidArgumentError, match="same replica id 1"):
            embstore.Store.follow(port.address, token="tok", replica_id=1)
        with pytest.raises(InvalidArgumentError, match="source must be 'host:port'"):
            embstore.Store.follow("nowhere")
    assert embstore.Store().create_table("x", embedding_dim=2).sync_stats() is None


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


class _Proc:
    """A process whose first stdout line matches ``pattern``; stopped by PID."""

    def __init__(self, args: list[str], pattern: str) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(pattern, line)
        if m is None:
            self.kill()
            raise AssertionError(f"unexpected first line {line!r}: {self.proc.stderr.read()!r}")
        self.match = m

    def wait_line(self, text: str, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if text in line:
                return
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError(f"no {text!r}: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL: no goodbye
        self.proc.wait(timeout=10)


def _primary(path: pathlib.Path, listen: str, steps: int, seed: int, out: pathlib.Path) -> _Proc:
    args = [sys.executable, str(HERE / "sync_primary.py"), str(path), listen, str(steps)]
    return _Proc([*args, str(seed), str(out)], r"^ready (127\.0\.0\.1:\d+)")


def _converges(client: embstore.serving.RemoteClient, npz: pathlib.Path, timeout: float) -> None:
    """Waits until lookups on the follower equal the primary's rows in ``npz`` (zeros for
    removed or absent ids)."""
    want = np.load(npz)
    expected = np.zeros((3000, 8), np.float32)
    expected[want["ids"]] = want["values"]
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = client.lookup("item", np.arange(3000))
        if np.array_equal(got, expected):
            return
        time.sleep(0.2)
    diff = int((got != expected).any(axis=1).sum()) if got is not None else -1
    raise AssertionError(f"the follower never converged: {diff} rows differ")


def test_followers_converge_through_kill_9_of_the_follower_and_of_the_primary(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    primary = _primary(tmp_path / "p", "127.0.0.1:0", 150, 1, tmp_path / "a.npz")
    source = primary.match.group(1)
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    follow = [*serve, "--follow", source, "--sync-token-file", str(token)]
    procs = [primary]
    try:
        follower = _Proc(follow, r" on (127\.0\.0\.1:\d+):")
        procs.append(follower)
        time.sleep(0.3)  # mid-pull: the primary is still writing
        follower.kill()
        follower = _Proc(follow, r" on (127\.0\.0\.1:\d+):")  # joins empty, new replica id
        procs.append(follower)
        primary.wait_line("done", timeout=60)
        client = embstore.connect(follower.match.group(1))
        _converges(client, tmp_path / "a.npz", timeout=30)
        # kill -9 of the primary, restarted from its directory on the same port (a new epoch):
        # the follower reconnects, and converges on what the restarted primary holds.
        primary.kill()
        primary = _primary(tmp_path / "p", source, 100, 2, tmp_path / "b.npz")
        procs.append(primary)
        primary.wait_line("done", timeout=60)
        _converges(client, tmp_path / "b.npz", timeout=30)
    finally:
        for p in procs:
            p.kill()


@pytest.mark.etcd
def test_through_etcd_a_leader_per_dc_pulls_from_the_primary_and_fails_over(tmp_path) -> None:
    """A primary in dc1 and two followers in dc2 that find their sources in etcd: one is the
    table's leader (pulling from the primary across the "WAN"), the other pulls from it; both
    hold the primary's rows. kill -9 of the leader: the survivor takes over within the lease
    TTL (2 s) plus a refresh, pulling from the primary."""
    from test_cluster import _Etcd, _status

    store = embstore.Store(tmp_path / "p", replica_id=1)
    t = store.create_table("item", embedding_dim=8)
    rng = np.random.default_rng(5)
    t.assign(np.arange(2000), rng.standard_normal((2000, 8)).astype(np.float32))
    expected = t.lookup(np.arange(2000), on_miss="zeros")
    store.close()
    etcd = _Etcd(tmp_path / "etcd")
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    sync = ["--etcd", etcd.url, "--sync-listen", "127.0.0.1:0"]
    procs: list[_Proc] = []
    try:
        procs.append(_Proc([*serve, "--store", str(tmp_path / "p"), *sync, "--dc", "dc1"], " on "))
        followers = [
            _Proc([*serve, "--follow", *sync, "--dc", "dc2"], r" on (127\.0\.0\.1:\d+):")
            for _ in range(2)
        ]
        procs += followers

        def dc2() -> list[dict]:
            return [m for m in _status(etcd.url)["sync"] if m["dc"] == "dc2"]

        def sources() -> dict[int, str]:
            return {m["replica"]: m["status"] for m in dc2()}

        primary_addr = next(m["addr"] for m in _status(etcd.url)["sync"] if m["primary"])

        def topology() -> tuple[dict, dict] | None:
            """(leader, other) once the leader pulls from the primary, the other from the
            leader, and neither has parts pending."""
            s = dc2()
            lead = [m for m in s if f"source={primary_addr}" in m["status"]]
            if len(s) != 2 or len(lead) != 1 or not all("pending=0" in m["status"] for m in s):
                return None
            rest = next(m for m in s if m is not lead[0])
            return (lead[0], rest) if f"source={lead[0]['addr']}" in rest["status"] else None

        deadline = time.monotonic() + 30
        while topology() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        found = topology()
        assert found is not None, sources()
        leader, other = found
        for f in followers:
            got = embstore.connect(f.match.group(1)).lookup("item", np.arange(2000))
            assert np.array_equal(got, expected)
        # An embedded follower in dc2, found through etcd: it pulls from the DC's leader.
        embedded = embstore.Store.follow(etcd=etcd.url, dc="dc2", wait_ms=100)
        try:
            assert embedded.wait_caught_up(timeout=30), embedded.sync_status()
            assert embedded.sync_status()[0]["source"] == leader["addr"]
            got = embedded["item"].lookup(np.arange(2000), on_miss="zeros")
            assert np.array_equal(got, expected)
        finally:
            embedded.close()
        # kill -9 of the leader: its lease expires, the survivor pulls from the primary.
        port = {re.search(r"sync port on ([\d.:]+)", f.match.string).group(1): f for f in followers}
        port[leader["addr"]].kill()
        killed_at = time.monotonic()
        while time.monotonic() < killed_at + 20:
            if f"source={primary_addr}" in _only(dc2(), other["replica"])["status"]:
                break
            time.sleep(0.1)
        took = time.monotonic() - killed_at
        print(f"leader failover: the survivor pulls from the primary {took:.2f} s after kill -9")
        assert f"source={primary_addr}" in _only(dc2(), other["replica"])["status"], sources()
        assert took < 2 + 1 + 1.5, f"failover took {took:.1f} s"  # TTL + 1 s + status refresh
        assert [m["replica"] for m in dc2()] == [other["replica"]], "the dead leader is gone"
    finally:
        for p in procs:
            p.kill()
        etcd.stop()


def _only(members: list[dict], replica: int) -> dict:
    return next((m for m in members if m["replica"] == replica), {"status": ""})


def test_the_sync_port_takes_the_serving_tls_and_a_follower_refuses_an_untrusted_source(
    tmp_path,
) -> None:
    """`embstore serve --tls-* --sync-listen`: a follower with the CA and a client certificate
    follows over mutual TLS; one without a certificate, one in plaintext and one trusting
    another CA are refused (typed errors), and nothing is created in their stores."""
    from test_serving import _pki

    _pki(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _pki(other)
    store = embstore.Store(tmp_path / "p", replica_id=1)
    t = store.create_table("item", embedding_dim=4)
    t.assign([1, 2, 3], np.ones((3, 4), np.float32))
    store.close()
    tls = ["--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key")]
    tls += ["--tls-client-ca", str(tmp_path / "ca.pem")]
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    primary = _Proc(
        [*serve, "--store", str(tmp_path / "p"), "--sync-listen", "127.0.0.1:0", *tls],
        r"sync port on 127\.0\.0\.1:(\d+)",
    )
    try:
        source = f"localhost:{primary.match.group(1)}"
        mine = {"tls_cert": tmp_path / "client.pem", "tls_key": tmp_path / "client.key"}
        replica = embstore.Store.follow(source, tls_ca=tmp_path / "ca.pem", **mine)
        try:
            assert replica.wait_caught_up(timeout=30)
            assert len(replica["item"]) == 3
        finally:
            replica.close()
        with pytest.raises(PermissionDeniedError, match=r"not trusted|TLS handshake"):
            embstore.Store.follow(source, tls_ca=other / "ca.pem", **mine)
        with pytest.raises(embstore.EmbstoreError):
            embstore.Store.follow(source, tls_ca=tmp_path / "ca.pem")  # no client certificate
        with pytest.raises(embstore.EmbstoreError):
            embstore.Store.follow(source)  # plaintext
        with pytest.raises(InvalidArgumentError, match="need tls_ca"):
            embstore.Store.follow(source, tls_cert=tmp_path / "client.pem")
    finally:
        primary.kill()


def test_kill_9_of_a_follower_under_reads_gives_no_client_visible_error(tmp_path) -> None:
    """Two followers of one primary serve lookups; a client reads from both in a loop while
    the primary keeps writing and one follower is killed with SIGKILL: every batch still
    succeeds (the other follower answers), and once writes stop it serves the primary's rows."""
    import threading

    primary = _primary(tmp_path / "p", "127.0.0.1:0", 200, 3, tmp_path / "a.npz")
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    follow = [*serve, "--follow", primary.match.group(1), "--sync-token-file", str(token)]
    procs = [primary]
    try:
        followers = [_Proc(follow, r" on (127\.0\.0\.1:\d+):") for _ in range(1)]
        procs += followers
        # The survivor also serves /metrics, where its freshness lag shows.
        metrics = r" on (127\.0\.0\.1:\d+):.*metrics on http://(127\.0\.0\.1:\d+)/metrics"
        followers.append(_Proc([*follow, "--metrics", "127.0.0.1:0"], metrics))
        procs.append(followers[1])
        client = embstore.connect([f.match.group(1) for f in followers], deadline_s=10.0)
        ids = np.arange(3000)
        done, count, errors = threading.Event(), [0], []

        def read() -> None:
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                try:
                    assert client.lookup("item", ids).shape == (3000, 8)
                except Exception as e:  # recorded, asserted below
                    errors.append(e)
                    return
                count[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)
        followers[0].kill()  # SIGKILL, mid-pull: the primary is still writing
        before = count[0]
        primary.wait_line("done", timeout=60)
        time.sleep(0.3)
        done.set()
        reader.join(timeout=60)
        assert not errors, errors
        assert count[0] > before + 5, (before, count[0])
        _converges(embstore.connect(followers[1].match.group(1)), tmp_path / "a.npz", 30)
        text = _get(f"http://{followers[1].match.group(2)}/metrics")
        lag = r'embstore_sync_lag_seconds\{table="item",quantile="0.99"\} [\d.e-]+'
        assert re.search(lag, text), text
        caught_up = r'embstore_sync_follow_state\{table="item",source="[^"]+",state="caught_up"\} 1'
        assert re.search(caught_up, text), text
        applied = re.search(r'embstore_sync_follow\{table="item",what="rows_applied"\} (\d+)', text)
        assert applied and int(applied.group(1)) > 0, text
    finally:
        for p in procs:
            p.kill()


def test_sync_status_from_another_thread_does_not_block_wait_caught_up() -> None:
    """A thread reading `sync_status()` in a loop while another waits in `wait_caught_up`:
    both return (they once deadlocked over the follower's lock and the GIL). In a child
    process, so that a deadlock fails the test by its timeout instead of hanging the run."""
    script = """
import threading, numpy as np, embstore
p = embstore.Store()
t = p.create_table("item", embedding_dim=4)
port = p.serve_sync("127.0.0.1:0", parts=64)
f = embstore.Store.follow(port.address, wait_ms=50)
done = threading.Event()
def poll():
    while not done.is_set():
        f.sync_status()
th = threading.Thread(target=poll)
th.start()
for i in range(20):
    t.assign(np.arange(i * 10, i * 10 + 10), np.ones((10, 4), np.float32))
    assert f.wait_caught_up(timeout=10)
done.set()
th.join()
f.stop_following()
port.stop()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_follower_away_longer_than_the_tombstone_horizon_drops_the_removed_rows(
    tmp_path,
) -> None:
    """Rows removed while a follower (in a directory) was stopped, whose tombstones the
    primary collected meanwhile (a horizon of 0 s), are gone from the follower once it
    restarts and catches up: it gets those parts whole."""
    p = embstore.Store()
    t = p.create_table("item", embedding_dim=4)
    port = p.serve_sync("127.0.0.1:0", parts=64, tombstone_horizon_s=0)
    t.assign(np.arange(1000), np.ones((1000, 4), np.float32))
    f = embstore.Store.follow(port.address, path=tmp_path / "r", wait_ms=50)
    assert f.wait_caught_up(timeout=20)
    f.close()
    t.remove(np.arange(0, 1000, 4))
    assert t.sync_stats()["tombstones"] == 250
    # Tombstones are collected at most every 5 s, on a removal, a change list or an applied
    # reply: here, when the follower comes back and asks what changed.
    time.sleep(5.2)
    f = embstore.Store.follow(port.address, path=tmp_path / "r", wait_ms=50)
    try:
        assert f.wait_caught_up(timeout=20)
        assert t.sync_stats()["tombstones"] == 0
        assert _same(_rows(f.table("item")), _rows(t))
        assert len(f.table("item")) == 750
    finally:
        f.close()
        port.stop()


def test_the_tombstone_horizon_must_be_seconds() -> None:
    with pytest.raises(InvalidArgumentError, match="tombstone_horizon_s"):
        embstore.Store().serve_sync(tombstone_horizon_s=float("nan"))
    out = subprocess.run(
        [sys.executable, "-m", "embstore", "serve", "--sync-tombstone-horizon", "-1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "must be a number of seconds" in out.stderr, out.stderr


def test_follow_needs_a_source_or_etcd_and_dc() -> None:
    with pytest.raises(InvalidArgumentError, match="a source"):
        embstore.Store.follow()
    with pytest.raises(InvalidArgumentError, match="a source"):
        embstore.Store.follow("127.0.0.1:1", etcd="http://127.0.0.1:1", dc="dc2")
    with pytest.raises(InvalidArgumentError, match="needs dc"):
        embstore.Store.follow(etcd="http://127.0.0.1:1")


def test_a_follower_with_state_holds_the_optimizer_state_too(tmp_path) -> None:
    """`embstore serve --follow ... --sync-with-state --store DIR`: the rows it writes carry the
    primary's optimizer state (a replica that may take over training); without the flag,
    values only (its state is the optimizer's initial one)."""
    import signal

    p = embstore.Store(replica_id=1)
    t = p.create_table("item", embedding_dim=4, optimizer=embstore.Adagrad(lr=0.1))
    port = p.serve_sync("127.0.0.1:0", parts=64)
    ids = np.arange(100)
    t.apply_gradients(ids, np.full((100, 4), 0.5, np.float32))
    want = {int(k): s for c in t.export(4096) for k, s in zip(c.ids, c.state, strict=True)}
    assert all(np.all(s > 0) for s in want.values())
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    try:
        for flag, same in (["--sync-with-state"], True), ([], False):
            d = tmp_path / f"r{int(same)}"
            embstore.Store(d).close()  # an empty store for the copy
            f = _Proc(
                [*serve, "--follow", port.address, "--store", str(d), *flag],
                r" on (127\.0\.0\.1:\d+):",
            )
            try:
                _converges_to(embstore.connect(f.match.group(1)), t, ids)
            finally:
                f.proc.send_signal(signal.SIGTERM)  # flushes before it exits
                f.proc.wait(timeout=30)
            r = embstore.Store(d)
            got = {
                int(k): s
                for c in r["item"].export(4096)
                for k, s in zip(c.ids, c.state, strict=True)
            }
            r.close()
            assert got.keys() == want.keys()
            assert all(np.array_equal(got[k], want[k]) for k in want) == same
    finally:
        port.stop()


def _converges_to(client, t: embstore.Table, ids: np.ndarray) -> None:
    want = t.lookup(ids, on_miss="zeros")
    deadline = time.monotonic() + 30
    while not np.array_equal(client.lookup("item", ids), want):
        assert time.monotonic() < deadline, "the follower did not converge"
        time.sleep(0.1)


def test_a_joining_replica_serves_once_caught_up() -> None:
    """`embstore serve --follow` starts answering lookups only once it holds the source's
    rows: the very first lookup, made as soon as it says where it listens, sees them all (a
    replica that served while joining would answer with zeros)."""
    p = embstore.Store(replica_id=1)
    t = p.create_table("item", embedding_dim=16)
    n = 400_000
    rng = np.random.default_rng(11)
    t.assign(np.arange(n), rng.standard_normal((n, 16)).astype(np.float32))
    port = p.serve_sync("127.0.0.1:0")
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    f = _Proc(
        [*serve, "--follow", port.address], r" on (127\.0\.0\.1:\d+):.*serving once caught up"
    )
    try:
        ids = rng.integers(0, n, 20_000)
        got = embstore.connect(f.match.group(1), deadline_s=60.0).lookup("item", ids)
        assert np.array_equal(got, t.lookup(ids, on_miss="zeros"))
    finally:
        f.kill()
        port.stop()


def test_a_follower_asking_for_f16_values_holds_them_rounded_to_half_precision() -> None:
    """`embstore serve --follow ... --sync-precision f16` (lossy, protocol 6): the source sends
    each value at half precision; the follower serves the primary's rows rounded to f16, every
    value within a relative 2^-11. Without the flag: exact."""
    p = embstore.Store(replica_id=1)
    t = p.create_table("item", embedding_dim=16)
    rng = np.random.default_rng(5)
    ids = np.arange(2000)
    t.assign(ids, rng.standard_normal((2000, 16)).astype(np.float32))
    want = t.lookup(ids, on_miss="zeros")
    port = p.serve_sync("127.0.0.1:0")
    serve = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]
    try:
        for flag, expect in (
            (["--sync-precision", "f16"], want.astype(np.float16).astype(np.float32)),
            ([], want),
        ):
            f = _Proc([*serve, "--follow", port.address, *flag], r" on (127\.0\.0\.1:\d+):")
            try:
                client = embstore.connect(f.match.group(1))
                deadline = time.monotonic() + 30
                while not np.array_equal(got := client.lookup("item", ids), expect):
                    assert time.monotonic() < deadline, np.abs(got - expect).max()
                    time.sleep(0.1)
                assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-11 + 1e-7)
            finally:
                f.kill()
    finally:
        port.stop()
