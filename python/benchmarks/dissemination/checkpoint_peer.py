"""Checkpoint broadcast (spec section 9, ``--sync checkpoint``, E2), as a measured transfer plus
arithmetic: the full table (``--rows`` keys as int64 and their ``--dim`` float32 values, raw
bytes, the 2PC frames' layout) is sent over TCP from the primary's namespace (``ek-s1-1``) to
DC 2's server 1 (one emulated WAN link), and then to DC 2's and DC 3's servers 1 at once (two
copies sharing the primary's NIC); each copy's time is measured. From the measured rates
(``twopc.checkpoint_cycle_s``'s model: the primary sends one copy per inference DC through its
NIC, each leader then copies it to its DC's other servers) it derives a back-to-back cycle and
an update's mean visibility latency (1.5 cycles: wait for the next cycle's start, then the
cycle) for ``--dcs-model`` DCs x ``--servers``. Prints one JSON record (stdout or ``--json``).

Needs root, ``make wan-deps`` and ../shared/tools/wan.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import sys
import threading
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lib.records import log, run_record

from dissemination import twopc
from dissemination.cpu import idle_box_pct
from dissemination.wan import Wan, add_network_args, config_from_args, netns_socket, server_addr


def transfer(payload: memoryview, dests: list[tuple[int, int]], port: int) -> list[float]:
    """Send ``payload`` from ``ek-s1-1`` to every server in ``dests`` at once; seconds each copy
    took from the start until its receiver had every byte."""
    servers, done = [], {}
    for d, k in dests:
        s = netns_socket(f"ek-s{d}-{k}")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((server_addr(d, k), port))
        s.listen(1)
        servers.append(s)

    def receive(i: int, srv: socket.socket) -> None:
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        got = 0
        while got < len(payload):
            n = conn.recv_into(buf)
            if not n:
                break
            got += n
        done[i] = time.monotonic()
        conn.close()

    def send(d: int, k: int) -> None:
        c = netns_socket("ek-s1-1")
        c.connect((server_addr(d, k), port))
        c.sendall(payload)
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        c.close()

    threads = [threading.Thread(target=receive, args=(i, s)) for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    senders = [threading.Thread(target=send, args=s) for s in dests]
    for t in senders:
        t.start()
    for t in threads + senders:
        t.join()
    for s in servers:
        s.close()
    return [round(done[i] - t0, 3) for i in range(len(dests))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_network_args(ap)
    ap.add_argument("--rows", type=int, default=1 << 20, help="table rows (default 2^20)")
    ap.add_argument("--dim", type=int, default=16, help="float32 per row (default 16)")
    ap.add_argument("--port", type=int, default=7300)
    ap.add_argument(
        "--dcs-model", type=int, nargs="+", default=[3, 10], help="DCs to derive cycles for"
    )
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    idle = idle_box_pct(1.0)
    rng = np.random.default_rng(1)
    table = (
        np.arange(args.rows, dtype=np.int64).tobytes()
        + rng.standard_normal((args.rows, args.dim), dtype=np.float32).tobytes()
    )
    payload = memoryview(table)
    cfg = config_from_args(args)
    with Wan(cfg, python=args.python, log=log) as w:
        b0 = w.wan_bytes()
        one = transfer(payload, [(2, 1)], args.port)
        b1 = w.wan_bytes()
        log(f"one copy, DC 1 -> DC 2: {len(payload) / 1e6:.1f} MB in {one[0]} s")
        two = transfer(payload, [(2, 1), (3, 1)], args.port + 1)
        log(f"two copies at once, DC 1 -> DC 2 and DC 3: {two} s")
    wire = b1[(1, 2)] - b0.get((1, 2), 0)
    rate_one = len(payload) / one[0]
    rate_nic = 2 * len(payload) / max(two)
    models = {}
    for dcs in args.dcs_model:
        # Scale the model's link rates so that it reproduces the measured copies.
        nic_eff = rate_nic * 8 / 1e6
        wan_eff = rate_one * 8 / 1e6
        models[str(dcs)] = twopc.checkpoint_cycle_s(
            len(payload), dcs, args.servers, nic_eff, wan_eff
        )
    rec = {
        "system": "checkpoint",
        "table_bytes": len(payload),
        "table_wire_bytes_one_copy": wire,
        "one_copy_s": one[0],
        "two_copies_s": two,
        "goodput_one_copy_mbit": round(rate_one * 8 / 1e6, 2),
        "goodput_primary_nic_mbit": round(rate_nic * 8 / 1e6, 2),
        "cycle_model": models,
        "network": dict(cfg.__dict__),
        "box_cpu_before_pct": idle,
        **run_record(),
    }
    text = json.dumps(rec, indent=1)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
