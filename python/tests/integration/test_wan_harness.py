"""The emulated-WAN harness of the dissemination benchmarks (python/benchmarks/dissemination):
2 DCs x 1 server come up; a TCP request/response across them takes about the configured RTT
(shared/tools/wan/tcping.py); the WAN byte counters see what crossed (and nothing for traffic
inside a namespace); everything is torn down, even when the body fails. Skips, with the reason,
where namespaces or the WAN's dependencies (`make wan-deps`) are unavailable."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination.wan import (
    Wan,
    WanConfig,
    ek_namespaces,
    netns_connect,
)

pytestmark = pytest.mark.slow
ONE_WAY_MS = 25
PORT = 7311


def test_rtt_and_wan_bytes_then_teardown(python_with_nfq):
    cfg = WanConfig(dcs=2, servers=1, nic_mbit=50, wan_mbit=48, one_way_ms=ONE_WAY_MS)
    try:
        with Wan(cfg, python=python_with_nfq) as w:
            tcping = str(w.tools / "tcping.py")
            before = w.wan_bytes()
            assert set(before) == {(1, 2), (2, 1)}
            w.spawn(2, 1, [w.python, tcping, "server", "198.18.2.1", str(PORT)])
            time.sleep(0.3)
            out = subprocess.run(
                ["ip", "netns", "exec", "ek-s1-1", w.python, tcping, "client", "198.18.2.1",
                 str(PORT), "20"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            median = float(re.search(r"median ([\d.]+)", out.stdout).group(1))
            assert 2 * ONE_WAY_MS <= median < 2 * ONE_WAY_MS + 10, out.stdout
            after = w.wan_bytes()
            # 20 requests and replies of 32 bytes each, plus headers and the handshake.
            assert after[(1, 2)] - before[(1, 2)] >= 20 * 32
            assert after[(2, 1)] - before[(2, 1)] >= 20 * 32
            # 1 MB sent across is counted once (sender side), within headers' overhead.
            sink = w.spawn(2, 1, [w.python, "-c", _SINK, "198.18.2.1", str(PORT + 1)])
            base = w.wan_bytes()[(1, 2)]
            sock = netns_connect("ek-s1-1", ("198.18.2.1", PORT + 1))
            sock.sendall(b"x" * 1_000_000)
            sock.close()
            sink.wait(timeout=10)
            sent = w.wan_bytes()[(1, 2)] - base
            assert 1_000_000 <= sent < 1_100_000, sent
            # Loopback inside a namespace never reaches a WAN class.
            quiet = w.wan_bytes()
            subprocess.run(
                ["ip", "netns", "exec", "ek-s1-1", w.python, "-c",
                 "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                 "c = socket.create_connection(s.getsockname()); c.sendall(b'y' * 100000)"],
                check=True, timeout=10,
            )  # fmt: skip
            assert w.wan_bytes()[(1, 2)] - quiet[(1, 2)] < 1000
    finally:
        assert ek_namespaces() == []


_SINK = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); c, _ = s.accept()\n"
    "while c.recv(1 << 16): pass\n"
)


def test_teardown_after_a_failure(python_with_nfq):
    cfg = WanConfig(dcs=2, servers=1, one_way_ms=ONE_WAY_MS)
    with pytest.raises(RuntimeError, match="boom"), Wan(cfg, python=python_with_nfq) as w:
        w.spawn(1, 1, ["sleep", "60"])
        raise RuntimeError("boom")
    assert ek_namespaces() == []


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="slow link"):
        WanConfig(dcs=2, slow=(1, 3, 10))
    with pytest.raises(ValueError, match="dcs and servers"):
        WanConfig(dcs=0)
