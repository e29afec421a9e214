"""`embstore serve` as a separate process on loopback, and `embstore.connect`: lookups equal the
store's rows; bad requests get typed errors and the server keeps serving; SIGTERM stops it
cleanly; a second server on the same store is refused.

Every test runs twice: with clients on the framed lookup path (``auto``: the servers offer it
by default) and on gRPC."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import embstore

D = 8


def _make_store(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Two tables with known rows; returns each one's rows for ids 0..99 (zeros where none)."""
    store = embstore.Store(path)
    rng = np.random.default_rng(7)
    expected = {}
    for name, n in (("user", 60), ("item", 30)):
        t = store.create_table(name, embedding_dim=D)
        ids = np.arange(n, dtype=np.int64) * 3 % 100
        values = rng.standard_normal((n, D)).astype(np.float32)
        t.assign(ids, values)
        full = np.zeros((100, D), np.float32)
        full[ids] = values
        expected[name] = full
    store.flush()
    del store
    return expected


def _embstore(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m embstore ARGS``, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "embstore", *args], capture_output=True, text=True, timeout=timeout
    )


class _Served:
    """`python -m embstore serve --listen 127.0.0.1:0 ARGS` on a free port, stopped by PID."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the first line names the address
        m = re.search(r" on 127\.0\.0\.1:(\d+):", line)
        if m is None:
            self.stop()
            raise AssertionError(f"no address in {line!r}: {self.proc.stderr.read()!r}")
        self.port = m.group(1)
        self.address = f"127.0.0.1:{self.port}"
        metrics = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
        self.metrics_url = metrics.group(1) if metrics else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(autouse=True, params=["auto", "grpc"])
def transport(request, monkeypatch) -> str:
    """The transport of every client a test connects (`embstore.connect`'s default)."""
    real = embstore.connect

    def connect(*args, **kwargs):
        kwargs.setdefault("transport", request.param)
        return real(*args, **kwargs)

    monkeypatch.setattr(embstore, "connect", connect)
    return request.param


@pytest.fixture
def served(tmp_path: pathlib.Path):
    expected = _make_store(tmp_path / "s")
    server = _Served("--store", str(tmp_path / "s"), "--metrics", "127.0.0.1:0")
    try:
        yield server, expected, tmp_path / "s"
    finally:
        server.stop()


def test_lookups_equal_the_stores_rows_and_bad_requests_get_typed_errors(served, transport) -> None:
    server, expected, _ = served
    client = embstore.connect(server.address)
    # By default the server offers the framed path and the client takes it.
    assert client.transport_to(server.address) == ("framed" if transport == "auto" else "grpc")
    ids = np.array([0, 3, 1, 99, 57, 3], dtype=np.int64)
    for name in ("user", "item"):
        rows, found, version = client.lookup(name, ids, return_found=True, return_version=True)
        assert rows.dtype == np.float32 and rows.shape == (len(ids), D)
        np.testing.assert_array_equal(rows, expected[name][ids])
        np.testing.assert_array_equal(found, expected[name][ids].any(axis=1))
        assert version == 1
    assert client.lookup("user", np.array([], dtype=np.int64)).shape == (0, D)
    with pytest.raises(embstore.TableNotFoundError, match="no server holds table 'nope'"):
        client.lookup("nope", ids)
    with pytest.raises(embstore.DTypeError):
        client.lookup("user", np.array([1.5]))
    with pytest.raises(embstore.ShapeError):
        client.lookup("user", np.zeros((2, 2), dtype=np.int64))
    # Garbage bytes on the port: the server drops that connection and serves on.
    import socket

    with socket.create_connection(tuple(server.address.rsplit(":", 1)), timeout=5) as s:
        s.sendall(b"\x00\x01GET / HTTP/1.1\r\n\r\n" + os.urandom(256))
        s.settimeout(5)
        try:
            s.recv(1024)
        except OSError:
            pass
    np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
    # Metrics count the lookups (the 4 tables' reads above, by outcome) and what is held.
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    assert re.search(r'embstore_lookups_total\{table="user",outcome="ok"\} \d+', text), text
    assert 'embstore_rows_held{table="item",version="1"} 30' in text, text
    # Status names what the server holds.
    out = _embstore("status", server.address, timeout=30)
    assert out.returncode == 0, out.stderr
    assert re.search(r"user\s+version 1\s+shard 0/1\s+ready", out.stdout), out.stdout


def test_sigterm_stops_the_server_and_a_second_server_on_the_store_is_refused(served) -> None:
    server, _, store_dir = served
    second = _embstore("serve", "--store", str(store_dir), "--listen", "127.0.0.1:0", timeout=30)
    assert second.returncode == 2
    assert "open in another process" in second.stderr
    # A directory without a store is refused, not created.
    empty = store_dir.parent / "empty"
    third = _embstore("serve", "--store", str(empty), "--listen", "127.0.0.1:0", timeout=30)
    assert third.returncode == 2 and "holds no store" in third.stderr, third
    assert not empty.exists()
    server.proc.send_signal(signal.SIGTERM)
    out, err = server.proc.communicate(timeout=15)
    assert server.proc.returncode == 0, err
    assert "stopped" in out
    # Nothing listens any more: a clear error, not a hang.
    start = time.monotonic()
    with pytest.raises(embstore.UnavailableError):
        embstore.connect(server.address, deadline_s=2.0)
    assert time.monotonic() - start < 10


def test_connect_checks_its_arguments() -> None:
    with pytest.raises(embstore.InvalidArgumentError):
        embstore.connect([])
    with pytest.raises(embstore.InvalidArgumentError):
        embstore.connect("127.0.0.1:1", max_restarts=-1)
    with pytest.raises(embstore.InvalidArgumentError):
        embstore.connect("127.0.0.1:1", deadline_s=0)
    with pytest.raises(embstore.InvalidArgumentError, match="either address or etcd"):
        embstore.connect("127.0.0.1:1", etcd="http://127.0.0.1:1")
    with pytest.raises(embstore.InvalidArgumentError, match="either address or etcd"):
        embstore.connect()
    # An etcd that does not answer: a clear error, not a hang.
    start = time.monotonic()
    with pytest.raises(embstore.UnavailableError, match="etcd"):
        embstore.connect(etcd="http://127.0.0.1:1")
    with pytest.raises(embstore.InvalidArgumentError, match="transport must be"):
        embstore.connect("127.0.0.1:1", transport="udp")
    assert time.monotonic() - start < 10


def test_serve_reads_a_config_file_and_flags_win(tmp_path: pathlib.Path) -> None:
    expected = _make_store(tmp_path / "s")
    config = tmp_path / "serve.toml"
    config.write_text(f'store = "{tmp_path / "s"}"\nmax-batch = 4\nlisten = "127.0.0.1:1"\n')
    server = _Served("--config", str(config))  # its --listen 127.0.0.1:0 wins over the file's
    try:
        client = embstore.connect(server.address)
        ids = np.arange(4, dtype=np.int64)
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
        with pytest.raises(embstore.CapacityError, match="at most 4 ids"):
            client.lookup("user", np.arange(5, dtype=np.int64))
    finally:
        server.stop()
    config.write_text("listen = 7\nno_such_setting = 1\n")
    out = _embstore("serve", "--config", str(config), timeout=30)
    assert out.returncode == 2 and "unknown setting 'no_such_setting'" in out.stderr, out
    out = _embstore("serve", "--config", str(tmp_path / "missing.toml"), timeout=30)
    assert out.returncode == 2 and "cannot read the config file" in out.stderr, out


def test_a_roll_across_server_processes_never_mixes_versions(tmp_path: pathlib.Path) -> None:
    """2 shards x 2 replicas and a spare column, six `embstore serve --admin` processes, all
    loaded from checkpoints through admin calls: version 1, then a roll to version 2 (column
    by column, as docs/serving.md describes) while a client reads batches; every batch is read
    at one version, and the client ends on version 2."""
    import threading

    from embstore import _native

    store = embstore.Store(tmp_path / "s")
    user = store.create_table("user", embedding_dim=4)
    ids = np.arange(1000, dtype=np.int64)

    def rows_of(version: int) -> np.ndarray:
        return np.stack([np.full(1000, version), ids, ids % 7, np.ones(1000)], 1).astype(np.float32)

    user.assign(ids, rows_of(1))
    c1 = store.checkpoint(tmp_path / "c1")
    user.assign(ids, rows_of(2))
    c2 = store.checkpoint(tmp_path / "c2", since=c1)
    user.assign(ids, rows_of(3))
    store.checkpoint(tmp_path / "c3", since=c2)
    del user, store

    servers: list[_Served] = []
    try:
        for _ in range(6):
            servers.append(_Served("--admin"))
        addrs = [s.address for s in servers]
        col_a, col_b, spare = addrs[0:2], addrs[2:4], addrs[4:6]

        def load(column: list[str], version: int, ckpt: pathlib.Path) -> None:
            for shard, addr in enumerate(column):
                _native.admin(addr, "load", "user", version, shard, 2, str(ckpt))

        load(col_a, 1, tmp_path / "c1")
        # The CLI's admin call, once.
        out = _embstore(
            "load",
            "--server",
            col_b[0],
            "--table",
            "user",
            "--version",
            "1",
            "--checkpoint",
            str(tmp_path / "c1"),
            "--shard",
            "0",
            "--num-shards",
            "2",
            timeout=60,
        )
        assert out.returncode == 0 and "version 1" in out.stdout, out
        _native.admin(col_b[1], "load", "user", 1, 1, 2, str(tmp_path / "c1"))

        client = embstore.connect(addrs, deadline_s=10.0, max_restarts=3)
        rows, version = client.lookup("user", ids, return_version=True)
        np.testing.assert_array_equal(rows, rows_of(1))
        assert version == 1

        stop, stats, errors = threading.Event(), {"batches": 0, "mixed": 0, "last": 0}, []

        def read() -> None:
            rng = np.random.default_rng(3)
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                batch = rng.choice(ids, 64)
                try:
                    got, v = client.lookup("user", batch, return_version=True)
                except Exception as e:  # recorded, asserted below
                    errors.append(e)
                    return
                if not (got[:, 0] == v).all() or not (got[:, 1] == batch).all():
                    stats["mixed"] += 1
                assert v >= stats["last"]
                stats["last"] = v
                stats["batches"] += 1

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.2)
        load(spare, 2, tmp_path / "c2")
        for column in (col_a, col_b):
            for addr in column:
                _native.admin(addr, "drain", "user", 1)
            time.sleep(0.3)
            for shard, addr in enumerate(column):
                _native.admin(addr, "unload", "user", 1)
                _native.admin(addr, "load", "user", 2, shard, 2, str(tmp_path / "c2"))
            time.sleep(0.3)
        for addr in spare:
            _native.admin(addr, "unload", "user", 2)
        wait = time.monotonic() + 10
        while stats["last"] < 2 and time.monotonic() < wait:
            time.sleep(0.05)
        assert stats["last"] == 2, stats
        # The next version through `embstore publish`, the same steps as above.
        out = _embstore(
            "publish",
            "--table",
            "user",
            "--version",
            "3",
            "--old-version",
            "2",
            "--checkpoint",
            str(tmp_path / "c3"),
            "--column",
            ",".join(col_a),
            "--column",
            ",".join(col_b),
            "--spare",
            ",".join(spare),
            "--drain-quiet",
            "0.2",
            "--drain-max",
            "2",
            timeout=120,
        )
        assert out.returncode == 0, out
        assert "done: table 'user' at version 3" in out.stdout, out.stdout
        wait = time.monotonic() + 10
        while stats["last"] < 3 and time.monotonic() < wait:
            time.sleep(0.05)
        stop.set()
        reader.join(timeout=30)
        assert not errors, errors
        assert stats["mixed"] == 0, stats
        assert stats["batches"] >= 20, stats
        assert stats["last"] == 3, stats
        for addr in col_a + col_b:
            held = _native.admin(addr, "drain", "user", 3)
            assert [(t, v, s) for t, v, s, _, _ in held] == [("user", 3, addrs.index(addr) % 2)]
        # A publish with a bad layout is refused before any change.
        bad = _embstore(
            "publish",
            "--table",
            "user",
            "--version",
            "4",
            "--checkpoint",
            str(tmp_path / "c3"),
            "--column",
            col_a[0],
            "--spare",
            ",".join(spare),
            timeout=60,
        )
        assert bad.returncode == 1 and "every column needs 2 servers" in bad.stderr, bad
        # A version that fails to load leaves the server as it was.
        with pytest.raises(embstore.TableNotFoundError):
            _native.admin(spare[0], "load", "nope", 3, 0, 2, str(tmp_path / "c2"))
        with pytest.raises(embstore.EmbstoreError):
            _native.admin(spare[0], "load", "user", 3, 0, 2, str(tmp_path / "missing"))
        np.testing.assert_array_equal(client.lookup("user", ids), rows_of(3))
    finally:
        for server in servers:
            server.stop()


def test_remote_embedding_reads_rows_of_any_shape(served) -> None:
    import pickle

    import torch

    import embstore.torch as et

    server, expected, _ = served
    emb = et.RemoteEmbedding(embstore.connect(server.address), "user")
    ids = torch.tensor([[0, 3, 5], [99, 3, 42]])
    out = emb(ids)
    assert out.shape == (2, 3, D) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), expected["user"][ids.numpy()])
    assert emb.last_version == 1 and list(emb.parameters()) == []
    half = et.RemoteEmbedding(embstore.connect(server.address), "user", dtype=torch.float16)
    assert half(ids).dtype == torch.float16
    assert emb(torch.zeros(0, dtype=torch.int64)).shape == (0, D)
    with pytest.raises(embstore.DTypeError):
        emb(torch.tensor([1.0]))
    with pytest.raises(embstore.NotCopyableError):
        pickle.dumps(emb)
    with pytest.raises(embstore.InvalidArgumentError):
        et.RemoteEmbedding(object(), "user")


def test_kill_9_of_a_replica_under_load_gives_no_client_visible_error(tmp_path) -> None:
    """Two replicas of one shard; a client reads in a loop while one replica is killed with
    SIGKILL: every batch still succeeds (the other replica answers) and equals the rows."""
    import threading

    expected = _make_store(tmp_path / "s")
    store = embstore.Store(tmp_path / "s")
    store.checkpoint(tmp_path / "c")
    del store
    servers: list[_Served] = []
    try:
        for _ in range(2):
            servers.append(_Served("--admin"))
        addrs = [s.address for s in servers]
        from embstore import _native

        for addr in addrs:
            _native.admin(addr, "load", "user", 1, 0, 1, str(tmp_path / "c"))
        client = embstore.connect(addrs, deadline_s=10.0)
        ids = np.arange(100, dtype=np.int64)
        done, count, errors = threading.Event(), [0], []

        def read() -> None:
            deadline = time.monotonic() + 30
            while not done.is_set() and time.monotonic() < deadline:
                try:
                    rows = client.lookup("user", ids)
                except Exception as e:  # recorded, asserted below
                    errors.append(e)
                    return
                if not np.array_equal(rows, expected["user"][ids]):
                    errors.append(AssertionError("wrong rows"))
                count[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)
        servers[0].proc.kill()  # SIGKILL: no goodbye
        before = count[0]
        time.sleep(0.5)
        done.set()
        reader.join(timeout=30)
        assert not errors, errors
        assert count[0] > before + 5, (before, count[0])
    finally:
        for server in servers:
            server.stop()


def test_tokens_guard_lookups_and_admin_calls(tmp_path: pathlib.Path) -> None:
    expected = _make_store(tmp_path / "s")
    (tmp_path / "read").write_text("r3ad-token\n")
    (tmp_path / "admin").write_text("adm1n-token")
    server = _Served(
        "--store",
        str(tmp_path / "s"),
        "--admin",
        "--read-token-file",
        str(tmp_path / "read"),
        "--admin-token-file",
        str(tmp_path / "admin"),
    )
    try:
        addr = server.address
        with pytest.raises(embstore.PermissionDeniedError):
            embstore.connect(addr)
        with pytest.raises(embstore.PermissionDeniedError):
            embstore.connect(addr, token="wrong")
        ids = np.array([0, 3], dtype=np.int64)
        for token in ("r3ad-token", "adm1n-token"):
            rows = embstore.connect(addr, token=token).lookup("user", ids)
            np.testing.assert_array_equal(rows, expected["user"][ids])
        drain = ("drain", "--server", addr, "--table", "user", "--version", "1")
        refused = _embstore(*drain, "--token-file", str(tmp_path / "read"), timeout=30)
        assert refused.returncode == 1 and "token" in refused.stderr, refused
        ok = _embstore(*drain, "--token-file", str(tmp_path / "admin"), timeout=30)
        assert ok.returncode == 0 and "draining" in ok.stdout, ok
        status = _embstore("status", addr, "--token-file", str(tmp_path / "read"), timeout=30)
        assert status.returncode == 0 and "user" in status.stdout, status
    finally:
        server.stop()


def _pki(d: pathlib.Path) -> None:
    """ca.pem, server.{pem,key} for localhost and client.{pem,key}, by Debian's openssl."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    new_key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    run(
        "req",
        "-x509",
        *new_key,
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
        "-days",
        "2",
        "-subj",
        "/CN=embstore test CA",
    )
    for name in ("server", "client"):
        run(
            "req",
            *new_key,
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
            "-subj",
            f"/CN={name}",
        )
        ext = d / f"{name}.ext"
        ext.write_text(
            "subjectAltName=DNS:localhost\n"
            if name == "server"
            else "extendedKeyUsage=clientAuth\n"
        )
        run(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-out",
            str(d / f"{name}.pem"),
            "-days",
            "2",
            "-extfile",
            str(ext),
        )


def test_mutual_tls_serves_clients_with_a_certificate_and_refuses_others(tmp_path) -> None:
    expected = _make_store(tmp_path / "s")
    _pki(tmp_path)
    server = _Served(
        "--store",
        str(tmp_path / "s"),
        "--tls-cert",
        str(tmp_path / "server.pem"),
        "--tls-key",
        str(tmp_path / "server.key"),
        "--tls-client-ca",
        str(tmp_path / "ca.pem"),
        "--metrics",
        "127.0.0.1:0",
    )
    try:
        addr = f"localhost:{server.port}"
        ids = np.array([0, 3], dtype=np.int64)
        client = embstore.connect(
            addr,
            tls_ca=tmp_path / "ca.pem",
            tls_cert=tmp_path / "client.pem",
            tls_key=tmp_path / "client.key",
        )
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
        # No client certificate, or plaintext: refused, a clear error, the server serves on.
        with pytest.raises(embstore.UnavailableError):
            embstore.connect(addr, tls_ca=tmp_path / "ca.pem", deadline_s=3.0)
        with pytest.raises(embstore.UnavailableError):
            embstore.connect(addr, deadline_s=3.0)
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
        with pytest.raises(embstore.InvalidArgumentError):
            embstore.connect(addr, tls_cert=tmp_path / "client.pem")
        # /metrics takes the same TLS: a scrape with a client certificate gets the metrics;
        # one without, or in plaintext, gets nothing, and the endpoint serves on.
        import http.client
        import ssl
        import urllib.request

        assert server.metrics_url is not None
        url = server.metrics_url.replace("http://127.0.0.1", "https://localhost")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        no_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        ctx.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
        for refused in (
            lambda: urllib.request.urlopen(url, timeout=10, context=no_cert).read(),
            lambda: urllib.request.urlopen(server.metrics_url, timeout=10).read(),
        ):
            with pytest.raises((OSError, http.client.HTTPException)):
                refused()
        text = urllib.request.urlopen(url, timeout=10, context=ctx).read().decode()
        assert 'embstore_lookups_total{table="user",outcome="ok"}' in text, text
    finally:
        server.stop()


def test_a_memory_budget_serves_shards_larger_than_it_from_linked_segments(tmp_path) -> None:
    """`serve --memory-budget 1MiB --data-dir`: two shards of a 5 MiB table loaded from a
    checkpoint are served equal to the table's rows while the server's budgeted memory stays
    near 1 MiB; each loaded shard is a directory of links in the data dir, gone on unload."""
    import urllib.request

    from embstore import _native

    store = embstore.Store(tmp_path / "s")
    n, d = 20_000, 64
    user = store.create_table("user", embedding_dim=d)
    ids = np.arange(n, dtype=np.int64) * 5 + 1
    values = np.random.default_rng(3).standard_normal((n, d)).astype(np.float32)
    user.assign(ids, values)
    store.checkpoint(tmp_path / "c")
    del user, store
    data = tmp_path / "data"
    server = _Served(
        "--admin", "--memory-budget", "1MiB", "--data-dir", str(data), "--metrics", "127.0.0.1:0"
    )
    try:
        for shard in range(2):
            _native.admin(server.address, "load", "user", 7, shard, 2, str(tmp_path / "c"))
        assert sorted(p.suffix for p in data.iterdir()) == [".part", ".part"]
        client = embstore.connect(server.address)
        order = np.random.default_rng(4).permutation(n)
        for batch in np.array_split(order, 40):
            rows, version = client.lookup("user", ids[batch], return_version=True)
            assert version == 7
            np.testing.assert_array_equal(rows, values[batch])
        missing = client.lookup("user", np.array([0, 2], dtype=np.int64), return_found=True)
        assert not missing[1].any() and not missing[0].any()
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        used = int(re.search(r'embstore_memory_budget_bytes\{kind="used"\} (\d+)', text)[1])
        assert 0 < used <= 1.25 * (1 << 20), text
        disk = int(re.search(r'embstore_bytes_on_disk\{table="user"\} (\d+)', text)[1])
        assert disk > 2 * n * d * 4, text  # both parts link the whole table's segments
        _native.admin(server.address, "unload", "user", 7)
        assert list(data.iterdir()) == []
    finally:
        server.stop()
    out = _embstore("serve", "--memory-budget", "lots", timeout=30)
    assert out.returncode == 2 and "not a size: 'lots'" in out.stderr, out


def test_tls_mistakes_name_their_cause_and_a_token_may_end_in_a_newline(tmp_path) -> None:
    """Swapped --tls-cert/--tls-key stop `serve` before its banner, saying so; `status`
    without --tls-ca at a TLS server says the server speaks TLS, and with another CA says
    unknown CA; `connect(token="...\\n")` works as the same token read from a file."""
    expected = _make_store(tmp_path / "s")
    _pki(tmp_path)
    (tmp_path / "other").mkdir()
    _pki(tmp_path / "other")
    cert, key = str(tmp_path / "server.pem"), str(tmp_path / "server.key")
    swapped = _embstore(
        "serve", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
        "--tls-cert", key, "--tls-key", cert, timeout=30,
    )  # fmt: skip
    assert swapped.returncode == 2 and "swapped" in swapped.stderr, swapped
    assert "embstore serve:" not in swapped.stdout, swapped
    mismatched = _embstore(
        "serve", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
        "--tls-cert", cert, "--tls-key", str(tmp_path / "client.key"), timeout=30,
    )  # fmt: skip
    assert mismatched.returncode == 2, mismatched
    assert "key does not match the certificate" in mismatched.stderr, mismatched
    (tmp_path / "read").write_text("r3ad-token\n")
    serve_token = ("--read-token-file", str(tmp_path / "read"))
    tls = ("--tls-cert", cert, "--tls-key", key)
    server = _Served("--store", str(tmp_path / "s"), *tls, *serve_token)
    token = ("--token-file", str(tmp_path / "read"))
    try:
        addr = f"localhost:{server.port}"
        plain = _embstore("status", addr, *token, timeout=30)
        assert plain.returncode == 1 and "the server speaks tls" in plain.stderr, plain
        other_ca = ("--tls-ca", str(tmp_path / "other" / "ca.pem"))
        wrong = _embstore("status", addr, *token, *other_ca, timeout=30)
        assert wrong.returncode == 1, wrong
        assert "tls handshake failed: unknown ca" in wrong.stderr, wrong
        ok = _embstore("status", addr, *token, "--tls-ca", str(tmp_path / "ca.pem"), timeout=30)
        assert ok.returncode == 0 and "user" in ok.stdout, ok
        with pytest.raises(embstore.UnavailableError, match="the server speaks tls"):
            embstore.connect(addr, token="r3ad-token", deadline_s=3.0)
        client = embstore.connect(addr, token="r3ad-token\n", tls_ca=tmp_path / "ca.pem")
        ids = np.array([0, 3], dtype=np.int64)
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
    finally:
        server.stop()


def test_serve_help_and_banner_say_what_the_flags_do(tmp_path) -> None:
    """`serve --help` says admin calls take the admin token; a server that joins a cluster in
    etcd does not claim to serve "tables none (version 1)"."""
    helped = _embstore("serve", "--help", timeout=30)
    assert helped.returncode == 0 and "no tokens yet" not in helped.stdout, helped
    assert "--admin-token-file token" in " ".join(helped.stdout.split()), helped
    # An etcd nobody listens at: the banner comes before joining, then the join fails.
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0",
         "--etcd", f"http://127.0.0.1:{port}", "--lease-ttl", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    banner = out.splitlines()[0] if out else err
    assert "(version 1)" not in banner and "tables none" not in banner, banner
    assert "the tables the cluster assigns here" in banner, banner


def test_an_answer_over_4_mib_is_read_and_a_batch_over_max_batch_is_refused(tmp_path) -> None:
    """40,000 ids at D 32 (a 5 MB answer, over gRPC's default 4 MiB) from a server process with
    its default limits; a batch over `--max-batch` is a `CapacityError`, counted as refused."""
    import urllib.request

    store = embstore.Store(tmp_path / "s")
    n, d = 40_000, 32
    user = store.create_table("user", embedding_dim=d)
    ids = np.arange(n, dtype=np.int64) * 3 + 1
    values = np.random.default_rng(5).standard_normal((n, d)).astype(np.float32)
    user.assign(ids, values)
    store.flush()
    del user, store
    server = _Served(
        "--store", str(tmp_path / "s"), "--max-batch", "50000", "--metrics", "127.0.0.1:0"
    )
    try:
        client = embstore.connect(server.address)
        np.testing.assert_array_equal(client.lookup("user", ids), values)
        with pytest.raises(embstore.CapacityError, match="at most 50000 ids"):
            client.lookup("user", np.arange(50_001, dtype=np.int64))
        np.testing.assert_array_equal(client.lookup("user", ids[:2]), values[:2])
        assert server.metrics_url is not None
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        assert 'embstore_lookups_total{table="user",outcome="ok"} 2' in text, text
        assert 'embstore_lookups_total{table="user",outcome="resourceexhausted"} 1' in text, text
    finally:
        server.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_framed_path_on_a_unix_socket_serves_clients_on_the_same_host(tmp_path, transport):
    """`serve --framed-unix PATH`: a client of a loopback address takes the socket (the rows
    equal gRPC's); `--framed-listen off` leaves gRPC only; the socket goes when the server
    stops."""
    expected = _make_store(tmp_path / "s")
    sock = tmp_path / "embstore.sock"
    ids = np.array([0, 3, 99, 57], dtype=np.int64)
    server = _Served("--store", str(tmp_path / "s"), "--framed-unix", str(sock))
    try:
        client = embstore.connect(server.address)
        want = "framed-unix" if transport == "auto" else "grpc"
        assert client.transport_to(server.address) == want
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
        # The lookup kept to the socket (a server slow to answer is waited for, not left).
        assert client.transport_to(server.address) == want
        assert sock.is_socket()
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        server.stop()
    assert not sock.exists(), "the socket outlived its server"
    server = _Served("--store", str(tmp_path / "s"), "--framed-listen", "off")
    try:
        client = embstore.connect(server.address)
        assert client.transport_to(server.address) == "grpc"
        np.testing.assert_array_equal(client.lookup("item", ids), expected["item"][ids])
    finally:
        server.stop()


def test_the_framed_paths_old_fast_spellings_still_work(tmp_path, transport, capsys):
    """The framed path was called "fast": `serve --fast-unix PATH --fast-listen off` (and in a
    config file), `connect(transport="fast")` and `_native.Server(fast_listen=...)` still work,
    each saying that it is deprecated; `serve --help` shows only the new flags."""
    expected = _make_store(tmp_path / "s")
    sock = tmp_path / "embstore.sock"
    ids = np.array([0, 3, 99, 57], dtype=np.int64)
    server = _Served(
        "--store", str(tmp_path / "s"), "--fast-unix", str(sock), "--fast-listen", "off"
    )
    try:
        with pytest.warns(DeprecationWarning, match="transport='framed'"):
            client = embstore.connect(server.address, transport="fast")
        # Only the socket is offered, and a framed-only client takes it.
        assert client.transport_to(server.address) == "framed-unix"
        np.testing.assert_array_equal(client.lookup("user", ids), expected["user"][ids])
    finally:
        server.stop()
    err = server.proc.stderr.read()
    assert "--fast-unix is deprecated; use --framed-unix" in err, err
    assert "--fast-listen is deprecated; use --framed-listen" in err, err
    shown = _embstore("serve", "--help", timeout=30).stdout
    assert "--framed-listen" in shown and "--framed-unix" in shown, shown
    assert "--fast-" not in shown, shown
    from embstore import cli

    config = tmp_path / "old.toml"
    config.write_text('fast-listen = "off"\nfast-unix = "x.sock"\n')
    serve = cli.build_parser().parse_args(["serve"]).config_parser
    assert cli._config(str(config), serve) == {"framed_listen": "off", "framed_unix": "x.sock"}
    assert "'fast-listen' in " in capsys.readouterr().err
    # The native server's old keywords: a DeprecationWarning, the same effect.
    from embstore import _native

    with pytest.warns(DeprecationWarning, match="fast_listen is deprecated; use framed_listen"):
        native = _native.Server(None, "127.0.0.1:0", fast_listen=None)
    assert native.framed_address is None
    native.stop()
    with pytest.raises(TypeError, match="unexpected keyword argument 'fast'"):
        _native.Server(None, "127.0.0.1:0", fast="auto")


def test_the_public_server_serves_from_its_thread_and_stops(tmp_path: pathlib.Path) -> None:
    """``embstore.Server``: what ``embstore serve`` runs, in this process: ports bound when
    made, served from its own thread inside ``with``, stopped at the end of the block."""
    store = embstore.Store(tmp_path / "s")
    store.create_table("user", embedding_dim=4).assign([1, 2], np.ones((2, 4), np.float32))
    store.close()
    server = embstore.Server(tmp_path / "s", framed_listen=None, metrics="127.0.0.1:0")
    assert server.tables == ["user"] and server.framed_address is None
    assert server.sync_address is None and server.sync_status() == []
    with server:
        with pytest.raises(embstore.InvalidArgumentError, match="started already"):
            server.start()
        client = embstore.connect(server.address, transport="grpc")
        rows, version = client.lookup("user", [1, 3], return_version=True)
        np.testing.assert_array_equal(rows, [[1.0] * 4, [0.0] * 4])
        assert version == 1
        import urllib.request

        url = f"http://{server.metrics_address}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert re.search(r'embstore_lookups_total\{[^}]*table="user"', text), text
    with pytest.raises(embstore.UnavailableError):
        embstore.connect(server.address, deadline_s=0.5, max_restarts=0).lookup("user", [1])
    # Closed: the directory is free again; bad options are typed errors.
    with pytest.raises(embstore.InvalidArgumentError, match="closed"):
        server.start()
    embstore.Store(tmp_path / "s").close()
    again = embstore.Server(tmp_path / "s", framed_listen=None)
    again.close()
    again.close()
    with pytest.raises(embstore.InvalidArgumentError, match="etcd"):
        embstore.Server(tmp_path / "s", etcd=[])
    with pytest.raises(embstore.InvalidArgumentError, match="horizon"):
        embstore.Server(tmp_path / "s", sync_tombstone_horizon_s=-1)
