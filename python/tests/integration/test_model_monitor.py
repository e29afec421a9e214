"""The model monitor (embstore.ModelMonitor) judges a model from its live and baseline
variants' click rates and records each confident decision in etcd, where `embstore model
status` reads it: healthy after three good windows (with the time up to which it is healthy),
corrupted after three significantly worse ones (with the interval), late reports ignored and
counted, bad input refused."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import subprocess
import sys
import time

import numpy as np
import pytest

import embstore

W = 30.0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embstore", *args], capture_output=True, text=True, timeout=60
    )


def test_bad_input_is_refused_where_it_is_given():
    with pytest.raises(embstore.InvalidArgumentError, match="model"):
        embstore.ModelMonitor("a/b")
    m = embstore.ModelMonitor("ctr")
    with pytest.raises(embstore.InvalidArgumentError):
        m.report(0, 1, 10, variant="shadow")
    with pytest.raises(embstore.InvalidArgumentError, match="timezone"):
        m.report(dt.datetime(2026, 1, 1), 1, 10)
    with pytest.raises(embstore.InvalidArgumentError):
        m.report(0, 11, 10)
    with pytest.raises(embstore.InvalidArgumentError):
        m.report(7, 1, 10)  # not the start of a window


@pytest.mark.etcd
def test_decisions_are_recorded_in_etcd_and_read_by_the_cli(tmp_path):
    from test_cluster import _Etcd

    etcd = _Etcd(tmp_path / "etcd")
    try:
        m = embstore.ModelMonitor(
            "ctr", etcd=etcd.url, baseline="ctr-delayed", window_s=W, latency_p99_s=2.0
        )
        t0 = 1_800_000_000.0  # a multiple of 30 s
        # Three good windows: healthy, and healthy up to the third window's end less 2 s.
        for w in range(3):
            assert m.report(t0 + w * W, 2_000, 40_000, variant="live")
            assert m.report(t0 + w * W, 2_000, 40_000, variant="baseline")
        out = m.advance(watermark=t0 + 3 * W + 30)
        assert [d["state"] for d in out] == ["uncertain", "uncertain", "healthy"]
        s = embstore.model.model_status("ctr", etcd.url)
        assert s["state"] == "healthy" and s["alternative"] == "ctr-delayed", s
        assert s["t_healthy_ms"] == int((t0 + 3 * W - 2.0) * 1000), s
        # A 20 % drop in the live click rate, three windows: corrupted (not after two).
        for w in range(3, 6):
            m.report(t0 + w * W, 1_600, 40_000, variant="live")
            m.report(t0 + w * W, 2_000, 40_000, variant="baseline")
        out = m.advance(watermark=t0 + 5 * W + 30)
        assert [d["verdict"] for d in out] == ["bad", "bad"] and m.state == "healthy"
        out = m.advance(watermark=t0 + 6 * W + 30)
        assert out[-1]["state"] == "corrupted" and out[-1]["changed"]
        s = embstore.model.model_status("ctr", etcd.url)
        assert s["state"] == "corrupted", s
        assert s["corrupted"] == [{"start_ms": int((t0 + 3 * W) * 1000), "end_ms": None}], s
        # A report for a window judged already is late: ignored and counted.
        assert not m.report(t0, 1, 10, variant="live")
        assert m.late_reports == 1
        # The CLI reads the same record.
        out = _cli("model", "status", "ctr", "--etcd", etcd.url, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["state"] == "corrupted"
        out = _cli("model", "status", "ctr", "--etcd", etcd.url)
        assert (
            "model ctr: corrupted since" in out.stdout and "alternative: ctr-delayed" in out.stdout
        )
        assert _cli("model", "list", "--etcd", etcd.url).stdout.split() == ["ctr"]
        missing = _cli("model", "status", "nope", "--etcd", etcd.url)
        assert missing.returncode == 1 and "no state recorded" in missing.stderr
    finally:
        etcd.stop()


class _Named:
    """A stand-in client that answers with its name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def lookup(self, table: str, ids, **kw):
        self.calls += 1
        return (self.name, table, list(ids))


def _route(client: embstore.ModelClient, want: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while client.route != want:
        assert time.monotonic() < deadline, f"route stayed {client.route!r}, wanted {want!r}"
        time.sleep(0.02)


@pytest.mark.etcd
def test_clients_follow_the_state_to_the_alternative_and_back_only_once_healthy(tmp_path):
    from test_cluster import _Etcd

    from embstore import _native

    etcd = _Etcd(tmp_path / "etcd")
    live, base = _Named("ctr"), _Named("ctr-delayed")
    clients = {"ctr": live, "ctr-delayed": base}
    try:
        # No state yet: the alternative must be given, and traffic goes to the model.
        with pytest.raises(embstore.InvalidArgumentError, match="alternative"):
            embstore.ModelClient("ctr", etcd=etcd.url, clients=clients)
        with pytest.raises(embstore.InvalidArgumentError, match="ctr"):
            embstore.ModelClient("ctr", etcd=etcd.url, clients={"ctr-delayed": base})
        c = embstore.ModelClient(
            "ctr", etcd=etcd.url, clients=clients, alternative="ctr-delayed", poll_s=0.05
        )
        assert c.lookup("item", np.array([1, 2])) == ("ctr", "item", [1, 2])
        c.close()

        m = embstore.ModelMonitor("ctr", etcd=etcd.url, baseline="ctr-delayed", window_s=W)
        t0 = 1_800_000_000.0

        def windows(first: int, live_clicks: int) -> None:
            for w in range(first, first + 3):
                m.report(t0 + w * W, live_clicks, 40_000, variant="live")
                m.report(t0 + w * W, 2_000, 40_000, variant="baseline")
            m.advance(watermark=t0 + (first + 3) * W + 30)

        windows(0, 2_000)
        assert m.state == "healthy"
        # The alternative named by the state must be one of the clients.
        with pytest.raises(embstore.InvalidArgumentError, match="ctr-delayed"):
            embstore.ModelClient("ctr", etcd=etcd.url, clients={"ctr": live})
        with embstore.ModelClient(
            "ctr", etcd=etcd.url, clients=clients, poll_s=0.05, probe_share=0.0, return_s=1.0
        ) as c:
            assert c.route == "ctr" and c.lookup("item", [3])[0] == "ctr"
            windows(3, 1_600)  # corrupted: traffic goes to the baseline
            assert m.state == "corrupted"
            _route(c, "ctr-delayed")
            assert c.lookup("item", [3])[0] == "ctr-delayed"
            # A little traffic still goes to the model (its metrics can show it healthy);
            # by key, one user keeps one model.
            with embstore.ModelClient(
                "ctr", etcd=etcd.url, clients=clients, probe_share=0.25, seed=7
            ) as p:
                print("seed 7")
                probes = sum(p.choose() == "ctr" for _ in range(400))
                assert 50 <= probes <= 150, probes
                users = [p.choose(key=f"user-{u}") for u in range(200)]
                assert users == [p.choose(key=f"user-{u}") for u in range(200)]
                assert 0 < users.count("ctr") < 200
                assert p.lookup("item", [3], model="ctr")[0] == "ctr"
                with pytest.raises(embstore.InvalidArgumentError, match="no client"):
                    p.lookup("item", [3], model="nope")
            with pytest.raises(embstore.InvalidArgumentError, match="probe_share"):
                embstore.ModelClient("ctr", etcd=etcd.url, clients=clients, probe_share=2)
            for bad in (-1.0, float("inf"), "30"):
                with pytest.raises(embstore.InvalidArgumentError, match="return_s"):
                    embstore.ModelClient("ctr", etcd=etcd.url, clients=clients, return_s=bad)
            with pytest.raises(embstore.InvalidArgumentError, match="resume"):
                embstore.witness.rollback("ctr", etcd.url, resume="later")
            _native.model_begin_rollback([etcd.url], "ctr")
            _native.model_end_rollback([etcd.url], "ctr")
            assert c.refresh() == "ctr-delayed"  # rolled back, but not healthy yet
            _native.model_begin_rollback([etcd.url], "ctr")
            windows(6, 2_000)  # healthy, while a rollback still runs: not yet
            assert m.state == "healthy"
            assert c.refresh() == "ctr-delayed"
            _native.model_end_rollback([etcd.url], "ctr")
            _route(c, "ctr")
            assert [(s["from"], s["to"]) for s in c.switches] == [
                ("ctr", "ctr-delayed"),
                ("ctr-delayed", "ctr"),
            ]
            assert "returning over 1 s" in c.switches[-1]["why"]
            # Traffic returns gradually: the share grows, and users who moved back stay.
            shares, moved = [], []
            while (share := c.share) < 1.0:
                shares.append(share)
                moved.append({u for u in range(400) if c.choose(key=f"user-{u}") == "ctr"})
                time.sleep(0.05)
            assert 5 <= len(shares) <= 100, shares  # about 1 s in 0.05-s steps
            assert shares == sorted(shares) and shares[0] < 0.5, shares
            assert all(a <= b for a, b in itertools.pairwise(moved))
            assert 0 < len(moved[len(moved) // 2]) < 400
            # etcd away: lookups keep their route, and the client says since when.
            etcd.stop()
            deadline = time.monotonic() + 30
            while c.stale is None:
                assert time.monotonic() < deadline, "the client did not notice etcd is away"
                time.sleep(0.05)
            assert c.lookup("item", [4])[0] == "ctr" and c.route == "ctr"
    finally:
        etcd.stop()
