"""The Redis peer's writer (started by ``redis_peer.py`` inside the primary's server namespace):
replays a trace as pipelined SETs (key ``r%07d`` -> the row's ``dim`` float32 as raw bytes) at
the trace's rate, one pipeline per batch window, and records per batch the ack time (the commit)
and the primary's ``master_repl_offset`` after it (an ``INFO replication`` at the end of the same
pipeline, so it counts exactly the batches sent so far).

Protocol with the parent: prints ``ready N`` (N batches, all encoded up front) on stdout, starts on
a line on stdin, and at the end writes ``{"commits": [[t_us, offset, rows], ...], ...}`` to
``--out``. Times are CLOCK_MONOTONIC microseconds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dissemination.resp import Conn, command, info_fields
from dissemination.trace import Trace

KEY_DIGITS = 7


def encode_sets(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Every ``SET r<key> <values>`` of the trace as RESP, one row of bytes per update."""
    n, vbytes = len(keys), values.shape[1] * 4
    if int(keys.max(initial=0)) >= 10**KEY_DIGITS:
        raise ValueError(f"keys must be below 10**{KEY_DIGITS}")
    head = b"*3\r\n$3\r\nSET\r\n$%d\r\nr" % (KEY_DIGITS + 1)
    mid = b"\r\n$%d\r\n" % vbytes
    width = len(head) + KEY_DIGITS + len(mid) + vbytes + 2
    buf = np.empty((n, width), dtype=np.uint8)
    p = 0
    for part in (head, None, mid, "values", b"\r\n"):
        if part is None:
            for d in range(KEY_DIGITS):
                buf[:, p + d] = 48 + (keys // 10 ** (KEY_DIGITS - 1 - d)) % 10
            p += KEY_DIGITS
        elif part == "values":
            buf[:, p : p + vbytes] = np.ascontiguousarray(values).view(np.uint8).reshape(n, vbytes)
            p += vbytes
        else:
            buf[:, p : p + len(part)] = np.frombuffer(part, dtype=np.uint8)
            p += len(part)
    return buf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--trace", required=True, help="the Trace as JSON")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trace = Trace(**json.loads(args.trace))
    keys, values = trace.keys_values()
    enc = encode_sets(keys, values)
    info = command("INFO", "replication")
    batches = [(due, enc[a:b].tobytes() + info, b - a) for due, a, b in trace.batches()]
    del enc
    conn = Conn(socket.create_connection(("127.0.0.1", args.port)))
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print(f"ready {len(batches)}", flush=True)
    sys.stdin.readline()
    commits = []
    late = 0
    t0 = time.monotonic()
    cpu0 = time.process_time()
    for due, payload, rows in batches:
        wait = t0 + due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        elif wait < -0.1:
            late += 1
        conn.sock.sendall(payload)
        conn.expect_oks(rows)
        offset = int(info_fields(conn.reply())["master_repl_offset"])
        commits.append((time.monotonic_ns() // 1000, offset, rows))
    elapsed = time.monotonic() - t0
    cpu_s = time.process_time() - cpu0
    conn.close()
    pathlib.Path(args.out).write_text(
        json.dumps(
            {"commits": commits, "elapsed_s": elapsed, "cpu_s": cpu_s, "batches_late_100ms": late}
        )
    )
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
