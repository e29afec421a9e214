"""embstore's primary and writer (started by ``ekko_peer.py`` inside the training server's
namespace): one process holds the training store, exposes it on a sync port and replays a trace
with ``Table.assign`` at the trace's rate, one call per batch window. Per batch it records the
commit (wall clock, µs since the Unix epoch, right after ``assign`` returned: the clock of the
followers' ``--sync-events``), and per row its sync part and its version timestamp
(``Table.metadata``), which is what a follower's events are compared against.

Protocol with the parent, a line each way: prints ``ready N PARTS ADDRESS`` (N batches); then
``warm I`` writes warm-up row I (keys above the trace's key space) and answers ``warm PART TS``;
``go`` replays the trace, writes ``--out`` (npz: ``commit_us`` and ``rows`` per batch, ``part``
and ``ts`` per update in trace order) and answers ``done {json}``; ``stats`` answers the sync
port's counters as JSON; ``quit`` or end of input stops the port and exits.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import embstore
from dissemination.trace import Trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="the sync port's host:port")
    ap.add_argument("--trace", required=True, help="the Trace as JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", type=int, default=1024, help="sync parts (default 1024)")
    args = ap.parse_args()
    trace = Trace(**json.loads(args.trace))
    keys, values = trace.keys_values()
    batches = list(trace.batches())
    store = embstore.Store(replica_id=1)
    table = store.create_table("hot", embedding_dim=trace.dim, optimizer=embstore.Adagrad(lr=0.05))
    port = store.serve_sync(args.listen, parts=args.parts)
    parts = table.sync_parts_of(keys)  # fixed per key
    print(f"ready {len(batches)} {args.parts} {port.address}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "warm":
            ids = np.array([trace.rows + int(cmd[1])], dtype=np.int64)
            table.assign(ids, np.zeros((1, trace.dim), dtype=np.float32))
            ts = int(table.metadata(ids)["versions"][0])
            print(f"warm {int(table.sync_parts_of(ids)[0])} {ts}", flush=True)
        elif cmd[0] == "stats":
            print(json.dumps(port.stats()), flush=True)
        elif cmd[0] == "go":
            commit = np.zeros(len(batches), dtype=np.int64)
            rows = np.zeros(len(batches), dtype=np.int64)
            ts = np.zeros(len(keys), dtype=np.uint64)
            late = 0
            t0 = time.monotonic()
            cpu0 = time.process_time()
            for i, (due, a, b) in enumerate(batches):
                wait = t0 + due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -0.1:
                    late += 1
                table.assign(keys[a:b], values[a:b])
                commit[i] = time.time_ns() // 1000
                rows[i] = b - a
                ts[a:b] = table.metadata(keys[a:b])["versions"]
            elapsed = time.monotonic() - t0
            cpu_s = time.process_time() - cpu0  # the whole process: writes and the sync port
            np.savez(args.out, commit_us=commit, rows=rows, part=parts, ts=ts)
            done = {"elapsed_s": elapsed, "cpu_s": cpu_s, "batches_late_100ms": late}
            print("done " + json.dumps(done), flush=True)
        else:
            print(f"error unknown command {cmd[0]!r}", flush=True)
    port.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
