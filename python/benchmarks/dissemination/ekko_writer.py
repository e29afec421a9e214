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
port's counters as JSON, with ``tables``: each table's ``Table.sync_stats()``, and
``table_rows``: each table's ``len()``; ``quit`` or end of
input stops the port and exits.

For the ablation (spec section 9, A0-A3): ``--no-cache`` answers every pull by a scan
(``serve_sync(use_cache=False)``); ``--cold-tables N`` adds N tables ``cold0..`` of 2^16 rows
(same dimension) that get 1 % of all updates together: per batch, as many cold writes as keep
their running total at 1/99 of the trace's, spread over the tables and keys by a seeded
generator (uniform), written with one ``assign`` per touched table after the batch's hot write.
They are not measured; they are the idle-ish tables whose parts shard versions let a follower
skip.
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
from dissemination.trace import Trace, warm_mask


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="the sync port's host:port")
    ap.add_argument("--trace", required=True, help="the Trace as JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", type=int, default=1024, help="sync parts (default 1024)")
    ap.add_argument("--no-cache", action="store_true", help="answer every pull by a scan")
    ap.add_argument("--cold-tables", type=int, default=0, help="idle-ish extra tables (default 0)")
    ap.add_argument(
        "--priority",
        type=float,
        help="score the hot table's writes with embstore.Priority(k=K), and record per update "
        "whether it was significant (``sig`` in the output)",
    )
    ap.add_argument(
        "--warm-share",
        type=float,
        default=0.0,
        help="hold this share of the trace's keys before the run, unscored (default 0: the "
        "table starts empty and a key's first write in the run creates it)",
    )
    args = ap.parse_args()
    trace = Trace(**json.loads(args.trace))
    keys, values = trace.keys_values()
    batches = list(trace.batches())
    store = embstore.Store(replica_id=1)
    prio = embstore.Priority(k=args.priority) if args.priority else None
    table = store.create_table(
        "hot", embedding_dim=trace.dim, optimizer=embstore.Adagrad(lr=0.05), priority=prio
    )
    cold = [
        store.create_table(f"cold{i}", embedding_dim=trace.dim, optimizer=embstore.Adagrad(lr=0.05))
        for i in range(args.cold_tables)
    ]
    crng = np.random.default_rng(trace.seed + 1000)
    cold_done = 0
    if args.warm_share > 0:
        # Before the sync port: not scored, and followers get them as their first pull.
        uk = np.unique(keys)
        warm = uk[warm_mask(uk, args.warm_share)]
        wrng = np.random.default_rng(trace.seed + 2000)
        for a in range(0, len(warm), 1 << 16):
            chunk = warm[a : a + (1 << 16)]
            table.assign(chunk, wrng.standard_normal((len(chunk), trace.dim), dtype=np.float32))
    port = store.serve_sync(args.listen, parts=args.parts, use_cache=not args.no_cache)
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
            st = dict(port.stats())
            st["tables"] = {t.name: t.sync_stats() for t in [table, *cold]}
            st["table_rows"] = {t.name: len(t) for t in [table, *cold]}  # for cached_rows / rows
            print(json.dumps(st), flush=True)
        elif cmd[0] == "go":
            commit = np.zeros(len(batches), dtype=np.int64)
            rows = np.zeros(len(batches), dtype=np.int64)
            ts = np.zeros(len(keys), dtype=np.uint64)
            sig = np.zeros(len(keys), dtype=bool)
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
                if prio is not None:
                    sig[a:b] = table.significant_versions(keys[a:b]) == ts[a:b]
                if cold:
                    n_cold = b // 99 - cold_done
                    cold_done += n_cold
                    which = crng.integers(0, len(cold), n_cold)
                    for j in np.unique(which):
                        ids = crng.integers(0, 1 << 16, int((which == j).sum()), dtype=np.int64)
                        vals = crng.standard_normal((len(ids), trace.dim), dtype=np.float32)
                        cold[j].assign(ids, vals)
            elapsed = time.monotonic() - t0
            cpu_s = time.process_time() - cpu0  # the whole process: writes and the sync port
            np.savez(args.out, commit_us=commit, rows=rows, part=parts, ts=ts, sig=sig)
            done = {"elapsed_s": elapsed, "cpu_s": cpu_s, "batches_late_100ms": late}
            done["cold_updates"] = cold_done
            print("done " + json.dumps(done), flush=True)
        else:
            print(f"error unknown command {cmd[0]!r}", flush=True)
    port.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
