"""Witnesses and rollback, as an operator runs them: a trainer serves its sync port, an
inference replica and a witness follow it; the model monitor records healthy windows in etcd,
the witness flushes its logs into its healthy store and records t_max; a bad update reaches the
replica; `embstore model rollback` pauses the trainer's writes (RollingBackError), writes only
the changed rows back with new versions, and the replica converges to the healthy state. A
restarted witness keeps its healthy store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import embstore
from embstore import _native
from embstore.witness import Witness, witnesses

D = 4


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embstore", *args], capture_output=True, text=True, timeout=timeout
    )


def _until(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _healthy_now(monitor: embstore.ModelMonitor) -> int:
    """Three good 1-s windows ending at the last whole second: the model is healthy up to
    then. Returns that time (s)."""
    time.sleep(1.05 - math.modf(time.time())[0])  # past the next whole second
    end = math.floor(time.time())
    for w in range(end - 3, end):
        monitor.report(w, 100, 1000, variant="live")
        monitor.report(w, 100, 1000, variant="baseline")
    monitor.advance(watermark=end + 0.5)
    return end


def _witness(source: str, etcd: str, tmp_path, name: str, token: str | None = None) -> Witness:
    """A started witness of model ctr, in ``tmp_path/name``, with short buckets and polls."""
    return Witness(
        source,
        model="ctr",
        etcd=etcd,
        data_dir=tmp_path / name,
        name=name,
        bucket_s=0.1,
        poll_s=0.05,
        token=token,
    ).start()


def _rows(t: embstore.Table, ids: list[int]) -> np.ndarray:
    return t.lookup(np.array(ids, dtype=np.uint64))


def test_a_paused_source_refuses_writes_and_takes_a_rollbacks_rows():
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=D)
    port = primary.serve_sync(token="s3cret")
    try:
        t.assign([1, 2], np.ones((2, D), np.float32))
        with pytest.raises(embstore.PermissionDeniedError):
            _native.sync_rollback(port.address, "pause", token="wrong")
        assert _native.sync_rollback(port.address, "pause", reason="test", token="s3cret") == 1
        with pytest.raises(embstore.RollingBackError, match="test"):
            t.assign([1], np.zeros((1, D), np.float32))
        with pytest.raises(embstore.RollingBackError):
            t.apply_gradients([1], np.zeros((1, D), np.float32))
        keys = np.array([1, 2], np.uint64)
        values = np.full((2, D), 7.0, np.float32)
        removed = np.array([False, True])
        n = _native.sync_rollback(
            port.address,
            "write",
            table="item",
            keys=keys,
            values=values,
            removed=removed,
            token="s3cret",
        )
        assert n == 2
        assert _rows(t, [1]).tolist() == [[7.0] * D]
        assert not t.contains([2])[0]
        with pytest.raises(embstore.ShapeError):
            _native.sync_rollback(
                port.address,
                "write",
                table="item",
                keys=keys,
                values=values[:1],
                removed=removed,
                token="s3cret",
            )
        with pytest.raises(embstore.TableNotFoundError):
            _native.sync_rollback(port.address, "pause", table="nope", token="s3cret")
        assert _native.sync_rollback(port.address, "resume", token="s3cret") == 1
        t.assign([1], np.zeros((1, D), np.float32))
    finally:
        port.stop()
        primary.close()


@pytest.mark.etcd
def test_rollback_restores_the_healthy_state_everywhere_writing_only_the_diff(tmp_path):
    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=D)
    port = primary.serve_sync(token="s3cret")
    (tmp_path / "token").write_text("s3cret\n")
    replica = None
    w = None
    try:
        ids = list(range(200))
        t.assign(ids, np.ones((200, D), np.float32))
        monitor = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        w = _witness(port.address, etcd.url, tmp_path, "w1", token="s3cret")
        replica = embstore.Store.follow(port.address, token="s3cret")
        assert w.wait_caught_up(30) and replica.wait_caught_up(30)
        healthy_end = _healthy_now(monitor)
        st = embstore.model.model_status("ctr", etcd.url)
        assert st["state"] == "healthy", st
        _until(lambda: w.stats()["t_max_ms"] > 0, "the witness's flush")
        assert w.stats()["t_max_ms"] <= healthy_end * 1000
        _until(
            lambda: embstore.model.model_status("ctr", etcd.url)["t_max_ms"].get("w1"),
            "t_max in etcd",
        )
        assert w.stats()["tables"]["item"]["healthy_rows"] == 200
        # A bad model: 20 rows overwritten, 5 created; the replica serves them.
        bad = list(range(20))
        t.assign(bad, np.full((20, D), 9.0, np.float32))
        t.assign(list(range(1000, 1005)), np.full((5, D), 9.0, np.float32))
        assert w.wait_caught_up(30) and replica.wait_caught_up(30)
        assert _rows(replica["item"], [0]).tolist() == [[9.0] * D]
        assert w.stats()["tables"]["item"]["logged_keys"] == 25
        live = witnesses("ctr", etcd.url)
        assert [x["name"] for x in live] == ["w1"] and live[0]["live"], live

        # Without the trainer's token the rollback cannot pause it: refused, nothing changed.
        r = _cli("model", "rollback", "ctr", "--etcd", etcd.url, "--timeout", "5")
        assert r.returncode == 1 and "token" in r.stderr, r.stderr
        r = _cli("model", "status", "ctr", "--etcd", etcd.url)
        assert "witness w1" in r.stdout and "rollback under way" in r.stdout, r.stdout
        token = str(tmp_path / "token")
        r = _cli(
            "model", "rollback", "ctr", "--etcd", etcd.url, "--json", "--sync-token-file", token
        )
        assert r.returncode == 0, r.stderr
        for step in ("①", "②", "③④", "⑤"):
            assert step in r.stdout, r.stdout
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["rows"] == 25, out  # the diff, not the table
        # The trainer and the replica hold the healthy rows; new rows are gone.
        assert replica.wait_caught_up(30)
        for store in (primary, replica):
            assert np.all(_rows(store["item"], bad) == 1.0)
            assert not store["item"].contains(list(range(1000, 1005))).any()
            assert np.all(_rows(store["item"], [150]) == 1.0)
        st = embstore.model.model_status("ctr", etcd.url)
        assert not st["rolling_back"], st
        assert _native.etcd_get([etcd.url], "/embstore/model/ctr/rollback") is None
        t.assign([5], np.zeros((1, D), np.float32))  # writes again

        # A restarted witness keeps its healthy store and logs nothing it already holds.
        w.stop()
        w = _witness(port.address, etcd.url, tmp_path, "w1", token="s3cret")
        assert w.wait_caught_up(30)
        tables = w.stats()["tables"]["item"]
        assert tables["restored_rows"] == 200, tables
        # Newer than the healthy store: the rollback's 25 rows and the write of row 5.
        assert tables["logged_keys"] == 25, tables
    finally:
        if w is not None:
            w.stop()
        if replica is not None:
            replica.close()
        port.stop()
        primary.close()
        etcd.stop()


@pytest.mark.etcd
def test_rollback_without_a_live_witness_says_so_and_changes_nothing(tmp_path):
    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    try:
        r = _cli("model", "rollback", "ctr", "--etcd", etcd.url)
        assert r.returncode == 1 and "no state recorded" in r.stderr, r.stderr
        m = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        _healthy_now(m)
        r = _cli("model", "rollback", "ctr", "--etcd", etcd.url)
        assert r.returncode == 1 and "no live witness" in r.stderr, r.stderr
        assert not embstore.model.model_status("ctr", etcd.url)["rolling_back"]
        # Another rollback running (its record heard from just now): refused, nothing changed.
        key = "/embstore/model/ctr/rollback"
        running = {"attempt": "1-2", "step": "write", "heartbeat_ms": int(time.time() * 1000)}
        assert _native.etcd_put_if([etcd.url], key, json.dumps(running).encode(), 0)
        r = _cli("model", "rollback", "ctr", "--etcd", etcd.url)
        assert r.returncode == 1 and "is running" in r.stderr and "'write'" in r.stderr, r.stderr
        assert json.loads(_native.etcd_get([etcd.url], key)[0]) == running
        # Its process died (not heard from for 10 s): a rerun goes on (here: to the next check).
        _native.etcd_delete([etcd.url], key)
        running["heartbeat_ms"] -= 10_000
        assert _native.etcd_put_if([etcd.url], key, json.dumps(running).encode(), 0)
        r = _cli("model", "rollback", "ctr", "--etcd", etcd.url)
        assert r.returncode == 1 and "no live witness" in r.stderr, r.stderr
        r = _cli("serve", "--witness", "--model", "ctr")
        assert r.returncode == 2 and "--follow" in r.stderr and "--data-dir" in r.stderr, r.stderr
    finally:
        etcd.stop()


@pytest.mark.etcd
def test_a_rollback_cut_short_leaves_writes_paused_and_a_rerun_finishes_it(tmp_path):
    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=D)
    port = primary.serve_sync()
    ws: list[Witness] = []

    try:
        t.assign(list(range(100)), np.ones((100, D), np.float32))
        monitor = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        ws = [
            _witness(port.address, etcd.url, tmp_path, "a"),
            _witness(port.address, etcd.url, tmp_path, "b"),
        ]
        assert all(w.wait_caught_up(30) for w in ws)
        _healthy_now(monitor)
        _until(lambda: all(w.stats()["t_max_ms"] > 0 for w in ws), "both witnesses' flush")
        t.assign(list(range(10)), np.full((10, D), 9.0, np.float32))
        assert all(w.wait_caught_up(30) for w in ws)
        # Witness b stops answering (its heartbeat is still fresh): the rollback waits, gives
        # up, and leaves the trainer's writes paused.
        ws[1].stop()
        with pytest.raises(embstore.UnavailableError, match="run the rollback again"):
            embstore.witness.rollback("ctr", etcd.url, timeout_s=2.0, say=lambda _line: None)
        with pytest.raises(embstore.RollingBackError):
            t.assign([1], np.zeros((1, D), np.float32))
        assert embstore.model.model_status("ctr", etcd.url)["rolling_back"]
        assert np.all(_rows(t, list(range(10))) == 9.0), "nothing written yet"
        # b restarts (its logs are gone; its healthy store is not) and the rerun finishes.
        ws[1] = _witness(port.address, etcd.url, tmp_path, "b")
        lines: list[str] = []
        out = embstore.witness.rollback("ctr", etcd.url, timeout_s=30.0, say=lines.append)
        assert any("continuing" in line for line in lines), lines
        assert out["rows"] == 10, out
        assert np.all(_rows(t, list(range(10))) == 1.0)
        assert not embstore.model.model_status("ctr", etcd.url)["rolling_back"]
        t.assign([1], np.zeros((1, D), np.float32))
    finally:
        for w in ws:
            w.stop()
        port.stop()
        primary.close()
        etcd.stop()


@pytest.mark.etcd
def test_serve_witness_from_the_command_line_flushes_and_stops_on_sigterm(tmp_path):
    import signal

    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=D)
    port = primary.serve_sync()
    proc = None
    try:
        t.assign(list(range(30)), np.ones((30, D), np.float32))
        monitor = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embstore",
                "serve",
                "--witness",
                "--follow",
                port.address,
                "--model",
                "ctr",
                "--etcd",
                etcd.url,
                "--data-dir",
                str(tmp_path / "w"),
                "--witness-name",
                "cli",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "witness cli of model ctr" in first, first
        _until(lambda: [w for w in witnesses("ctr", etcd.url) if w["name"] == "cli"], "its record")
        # Its record says what it holds: the 30 rows, logged (they arrived before the
        # healthy decision below), then flushed.
        _until(lambda: witnesses("ctr", etcd.url)[0]["logged_keys"] == 30, "the rows logged")
        assert witnesses("ctr", etcd.url)[0]["tables"] == ["item"]
        _healthy_now(monitor)
        _until(lambda: witnesses("ctr", etcd.url)[0]["healthy_rows"] == 30, "the rows flushed")
        _until(
            lambda: embstore.model.model_status("ctr", etcd.url)["t_max_ms"].get("cli"),
            "the witness's t_max in etcd",
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "30 rows held (0 restored at start)" in out, out
        assert out.rstrip().endswith("stopped"), out
        assert (tmp_path / "w" / "item.witness").stat().st_size > 30 * D * 4
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        port.stop()
        primary.close()
        etcd.stop()


@pytest.mark.etcd
def test_serving_clients_go_to_the_baseline_while_corrupted_and_back_once_healthy(tmp_path):
    """The whole loop as it runs in production: a live model and its delayed baseline, each a
    trainer followed by a serving replica; the click rates of what each replica serves are
    reported to the monitor; a burst of bad writes is detected from them, clients move to the
    baseline, the rollback restores the replica, and clients move back only once the reports
    say the model is healthy."""
    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    n = 1000
    ids = np.arange(n, dtype=np.int64)
    trainers, ports, servers, w, client = [], [], [], None, None
    try:
        for _ in ("ctr", "ctr-delayed"):
            s = embstore.Store(replica_id=1)
            s.create_table("item", embedding_dim=D).assign(
                list(range(n)), np.ones((n, D), np.float32)
            )
            trainers.append(s)
            ports.append(s.serve_sync())
            servers.append(embstore.Server(follow=ports[-1].address).start())
        live, base = (embstore.connect(s.address) for s in servers)
        w = _witness(ports[0].address, etcd.url, tmp_path, "w1")
        monitor = embstore.ModelMonitor(
            "ctr", etcd=etcd.url, baseline="ctr-delayed", window_s=1.0, lateness_s=0.0
        )
        next_window = [math.floor(time.time())]

        def clicks(c: embstore.RemoteClient) -> int:
            """A user clicks every tenth item whose row looks right."""
            rows = c.lookup("item", ids)
            return int(((rows[:, 0] < 5.0) & (ids % 10 == 0)).sum())

        def judge() -> str:
            """Three 1-s windows of reports from what the replicas serve now; the state."""
            got_live, got_base = clicks(live), clicks(base)
            first = next_window[0]
            time.sleep(max(0.0, first + 3.05 - time.time()))
            for t in range(first, first + 3):
                monitor.report(t, got_live, n, variant="live")
                monitor.report(t, got_base, n, variant="baseline")
            monitor.advance(watermark=first + 3)
            next_window[0] = first + 3
            return monitor.state

        assert w.wait_caught_up(30)
        _until(lambda: clicks(live) == 100, "the live replica")
        assert judge() == "healthy"
        _until(lambda: w.stats()["t_max_ms"] > 0, "the witness's flush")
        # No probe traffic here: the live replica's metrics are measured directly below.
        client = embstore.ModelClient(
            "ctr",
            etcd=etcd.url,
            clients={"ctr": live, "ctr-delayed": base},
            poll_s=0.05,
            probe_share=0.0,
            return_s=0.5,
        )
        assert client.route == "ctr"

        trainers[0]["item"].assign(list(range(500)), np.full((500, D), 9.0, np.float32))
        _until(lambda: clicks(live) == 50, "the bad rows at the live replica")
        assert judge() == "corrupted"
        _until(lambda: client.route == "ctr-delayed", "clients moving to the baseline")
        assert np.all(client.lookup("item", ids[:500]) == 1.0)

        # The rows are restored, but writes resume only once the model is healthy again: a
        # wait that times out leaves them paused and says how to go on.
        lines: list[str] = []
        with pytest.raises(embstore.UnavailableError, match="writes stay paused"):
            embstore.witness.rollback(
                "ctr", etcd.url, timeout_s=30.0, healthy_timeout_s=0.5, say=lines.append
            )
        assert any("until the monitor judges 'ctr' healthy (now corrupted" in x for x in lines)
        _until(lambda: clicks(live) == 100, "the live replica rolled back")
        with pytest.raises(embstore.RollingBackError):
            trainers[0]["item"].assign([n + 1], np.ones((1, D), np.float32))
        assert client.refresh() == "ctr-delayed", "back before the reports say healthy"
        # Run again, it waits for the monitor; the reports (from what the replicas serve) say
        # healthy; writes resume and clients return.
        done: dict[str, Any] = {}

        def rerun() -> None:
            try:
                done["out"] = embstore.witness.rollback(
                    "ctr", etcd.url, timeout_s=30.0, say=lines.append
                )
            except Exception as e:  # reported below
                done["error"] = e

        th = threading.Thread(target=rerun)
        th.start()
        _until(lambda: sum("writes stay paused" in x for x in lines) >= 2, "the rerun's wait")
        with pytest.raises(embstore.RollingBackError):
            trainers[0]["item"].assign([n + 1], np.ones((1, D), np.float32))
        assert judge() == "healthy"
        th.join(timeout=30)
        assert not th.is_alive() and "error" not in done, done
        assert done["out"]["rows"] == 500, done
        trainers[0]["item"].assign([n + 1], np.ones((1, D), np.float32))  # writes again
        _until(lambda: client.route == "ctr", "clients back on the model")
        assert np.all(client.lookup("item", ids) == 1.0)
        assert [(s["to"], s["why"]) for s in client.switches] == [
            ("ctr-delayed", "corrupted"),
            ("ctr", "healthy, returning over 0.5 s"),
        ]
    finally:
        if client is not None:
            client.close()
        if w is not None:
            w.stop()
        for s in servers:
            s.close()
        for p in ports:
            p.stop()
        for s in trainers:
            s.close()
        etcd.stop()


@pytest.mark.etcd
def test_a_durable_budgeted_trainer_over_tls_rolls_back_a_cleared_table_too(tmp_path):
    """Features as users combine them: the trainer is a store directory with a memory budget
    (rows on disk), serving its sync port over mutual TLS with a token; the witness follows
    over TLS; a bad update hits two tables, then the operator clears one of them at the
    trainer (a syncing store's tables cannot be dropped). The rollback (over TLS) restores the
    bad rows and the cleared table whole (the state at t_max), and the trainer's directory
    holds the healthy rows after a restart."""
    from test_cluster import _Etcd
    from test_serving import _pki

    _pki(tmp_path)
    pki = {k: tmp_path / f for k, f in (("ca", "ca.pem"), ("cert", "client.pem"))}
    pki["key"] = tmp_path / "client.key"
    etcd = _Etcd(tmp_path / "etcd")
    n = 3000
    primary = embstore.Store(tmp_path / "trainer", replica_id=1, memory_budget_bytes=64 << 10)
    for name in ("item", "user"):
        primary.create_table(name, embedding_dim=D).assign(
            list(range(n)), np.ones((n, D), np.float32)
        )
    port = primary.serve_sync(
        "127.0.0.1:0",
        token="s3cret",
        tls_cert=tmp_path / "server.pem",
        tls_key=tmp_path / "server.key",
        tls_client_ca=pki["ca"],
    )
    source = f"localhost:{port.address.rsplit(':', 1)[1]}"
    w = None
    try:
        monitor = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        w = Witness(
            source,
            model="ctr",
            etcd=etcd.url,
            data_dir=tmp_path / "w1",
            name="w1",
            bucket_s=0.1,
            poll_s=0.05,
            token="s3cret",
            tls_ca=pki["ca"],
            tls_cert=pki["cert"],
            tls_key=pki["key"],
        ).start()
        assert w.wait_caught_up(60)
        _healthy_now(monitor)
        _until(lambda: w.stats()["t_max_ms"] > 0, "the witness's flush")
        for name in ("item", "user"):
            primary[name].assign(list(range(100)), np.full((100, D), 9.0, np.float32))
        assert w.wait_caught_up(60)
        _until(lambda: w.stats()["tables"]["user"]["logged_keys"] == 100, "the bad rows")
        with pytest.raises(embstore.InvalidArgumentError, match="clear"):
            primary.drop_table("user")
        primary["user"].clear()
        assert w.wait_caught_up(60)
        lines: list[str] = []
        out = embstore.witness.rollback(
            "ctr",
            etcd.url,
            token="s3cret",
            tls=(pki["ca"], pki["cert"], pki["key"], None),
            timeout_s=60.0,
            say=lines.append,
        )
        assert out["rows"] == 100 + n, (out, lines)
        assert not embstore.model.model_status("ctr", etcd.url)["rolling_back"]
        assert np.all(_rows(primary["item"], list(range(100))) == 1.0)
        assert len(primary["user"]) == n and np.all(_rows(primary["user"], list(range(n))) == 1.0)
        primary["item"].assign([5], np.zeros((1, D), np.float32))  # writes again
        primary["item"].assign([6], np.full((1, D), 1.0, np.float32))
        port.stop()
        primary.close()
        primary = embstore.Store(tmp_path / "trainer", replica_id=1)
        assert sorted(primary.tables()) == ["item", "user"]
        assert np.all(_rows(primary["item"], [0, 50, 99, 2999]) == 1.0)
        assert np.all(_rows(primary["user"], [0, 50, 99, 2999]) == 1.0)
        assert _rows(primary["item"], [5]).tolist() == [[0.0] * D]
    finally:
        if w is not None:
            w.stop()
        port.stop()
        primary.close()
        etcd.stop()
