"""E6: how many sync parts shard versions let a follower skip, with idle tables present.

One process holds a primary store with one hot table (``--rows`` keys x ``--dim`` float32, the
trace of ``trace.py``: Zipf writes at ``--rate`` rows/s in ``--batch-ms`` batches, one
``Table.assign`` per batch) and ``--idle-tables`` idle tables of ``--idle-rows`` keys each that
get one write of one row every ``--idle-every`` seconds each (staggered), or, with
``--idle-share F``, a share F of all updates spread uniformly over them (the rule of
``ekko_writer.py --cold-tables``, which uses 1/99). The store serves a sync port
(``Store.serve_sync``, ``--parts`` parts per table) on loopback, and ``--followers`` followers
pull from it: each is what ``embstore serve --follow HOST:PORT`` runs (``_native.Server``, the
CLI's server, in this process), with shard versions on, or off as with
``--sync-no-shard-versions``, one mode after the other (``--modes on off``), each with a fresh
primary and the same trace.

Every table is filled first (every key written once, ``--no-prefill`` skips it) and the followers
catch up; then the counters of each followed table's ``sync_status()`` are read before and after
the trace, and over that window: rounds, parts pulled (``parts``), parts skipped as already
known (``parts_skipped``), pulls, and the skip ratio = 1 - parts pulled / (rounds x parts per
table), the share of (round, part) pairs a round did not pull, per table and over all tables.
The hot table's ratio is compared with what the trace predicts: 1 - (distinct parts the trace
touches in a window of one mean round) / parts.

This is a count, not a latency: on loopback rounds are shorter than over a WAN, so each round
sees fewer changes and skips more of the hot table than it would at 50 ms RTT (the prediction
shows by how much). CPU is recorded (``cpu``) because the round rate depends on it.

    python python/benchmarks/dissemination/e6_skip.py --json /tmp/e6.json --plot docs/img/e6.png
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import embstore
from dissemination.cpu import CpuMeter, idle_box_pct
from dissemination.trace import Trace
from embstore import _native

COUNTERS = ("rounds", "parts", "parts_skipped", "pulls", "parts_from_cache", "rows_applied")


def statuses(followers) -> list[dict[str, dict]]:
    """Per follower: table -> its ``sync_status()`` entry."""
    return [{s["table"]: dict(s) for s in f.sync_status()} for f in followers]


def wait_caught_up(followers, tables: list[str], timeout: float) -> bool:
    """Polls until every follower has every table connected, caught up, nothing pending."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = True
        for st in statuses(followers):
            for name in tables:
                s = st.get(name)
                if not s or not s["connected"] or not s["caught_up"] or s["parts_pending"]:
                    ok = False
        if ok:
            return True
        time.sleep(0.2)
    return False


def predicted_skip(
    parts_of_keys: np.ndarray, batches: list, round_s: float, batch_ms: float, parts: int
) -> float:
    """1 - (distinct parts the trace touches in a window of one mean round) / parts. A round
    shorter than a batch sees a batch's parts in that share of rounds (a batch's write can land
    while a round is under way, so rounds may outnumber batches)."""
    per_batch = round_s * 1000 / batch_ms
    w = max(1, round(per_batch))
    distinct = []
    for i in range(0, len(batches) - w + 1, w):
        a, b = batches[i][1], batches[i + w - 1][2]
        distinct.append(len(np.unique(parts_of_keys[a:b])))
    if not distinct:
        return float("nan")
    touched = float(np.mean(distinct)) * (min(1.0, per_batch) if w == 1 else 1.0)
    return 1 - touched / parts


def fill(table, rows: int, dim: int, rng) -> None:
    for a in range(0, rows, 1 << 16):
        b = min(rows, a + (1 << 16))
        table.assign(np.arange(a, b, dtype=np.int64), rng.standard_normal((b - a, dim), np.float32))


def run_mode(args, trace: Trace, shard_versions: bool) -> dict:
    keys, values = trace.keys_values()
    batches = list(trace.batches())
    store = embstore.Store(replica_id=1)
    hot = store.create_table("hot", embedding_dim=trace.dim, optimizer=embstore.Adagrad(lr=0.05))
    idle = [
        store.create_table(f"idle{i}", embedding_dim=trace.dim, optimizer=embstore.Adagrad(lr=0.05))
        for i in range(args.idle_tables)
    ]
    names = ["hot"] + [t.name for t in idle]
    port = store.serve_sync("127.0.0.1:0", parts=args.parts)
    followers = []
    try:
        rng = np.random.default_rng(trace.seed + 2000)
        t_fill = time.monotonic()
        if not args.no_prefill:
            fill(hot, trace.rows, trace.dim, rng)
            for t in idle:
                fill(t, args.idle_rows, trace.dim, rng)
        for i in range(args.followers):
            followers.append(
                _native.Server(
                    None,
                    "127.0.0.1:0",
                    follow=port.address,
                    replica=2 + i,
                    sync_shard_versions=shard_versions,
                )
            )
        if not wait_caught_up(followers, names, args.join_timeout):
            raise RuntimeError(f"followers did not catch up in {args.join_timeout} s")
        join_s = time.monotonic() - t_fill
        print(f"  filled and joined in {join_s:.1f} s", file=sys.stderr)
        box_before = idle_box_pct(1.0)
        s0 = statuses(followers)
        meter = CpuMeter()
        meter.watch("e6 (primary, writer, followers)", os.getpid())
        meter.start()
        crng = np.random.default_rng(trace.seed + 1000)
        idle_writes = 0
        share_done = 0
        n_idle = len(idle)
        next_idle = [args.idle_every * (i + 1) / max(1, n_idle) for i in range(n_idle)]
        late = 0
        t0 = time.monotonic()
        for due, a, b in batches:
            wait = t0 + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif wait < -0.1:
                late += 1
            hot.assign(keys[a:b], values[a:b])
            if not idle:
                continue
            if args.idle_share > 0:  # ekko_writer's rule, at share F instead of 1/99
                n = int(b * args.idle_share / (1 - args.idle_share)) - share_done
                share_done += n
                which = crng.integers(0, n_idle, n)
                for j in np.unique(which):
                    ids = crng.integers(0, args.idle_rows, int((which == j).sum()), dtype=np.int64)
                    idle[j].assign(ids, crng.standard_normal((len(ids), trace.dim), np.float32))
                    idle_writes += len(ids)
            else:
                for j in range(n_idle):
                    if due >= next_idle[j]:
                        next_idle[j] += args.idle_every
                        ids = crng.integers(0, args.idle_rows, 1, dtype=np.int64)
                        idle[j].assign(ids, crng.standard_normal((1, trace.dim), np.float32))
                        idle_writes += 1
        window_s = time.monotonic() - t0
        s1 = statuses(followers)
        cpu = meter.stop()
        cpu["box_pct_before"] = box_before
        # A count, not a latency: the CPU rule does not discard it, but the hot table's round
        # rate (and so its skip ratio) depends on the CPU the box leaves it.
        cpu["box_over_70pct"] = cpu.pop("discarded")
        caught = wait_caught_up(followers, names, args.join_timeout)
    finally:
        for f in followers:
            f.stop()
        port.stop()

    per_table: dict[str, dict] = {}
    for name in names:
        d = {
            k: sum(s1[i][name][k] - s0[i][name][k] for i in range(len(followers))) for k in COUNTERS
        }
        pairs = d["rounds"] * args.parts
        d["skip_ratio"] = round(1 - d["parts"] / pairs, 5) if pairs else None
        d["rounds_per_s"] = round(d["rounds"] / window_s / len(followers), 2)
        d["parts_per_s"] = round(d["parts"] / window_s / len(followers), 1)
        per_table[name] = d
    tot = {k: sum(per_table[n][k] for n in names) for k in COUNTERS}
    pairs = tot["rounds"] * args.parts
    tot["skip_ratio"] = round(1 - tot["parts"] / pairs, 5) if pairs else None
    tot["parts_per_s"] = round(tot["parts"] / window_s / len(followers), 1)
    # The paper's round visits every table: pairs = hot rounds x parts x tables.
    hot_rounds = per_table["hot"]["rounds"]
    paper_pairs = hot_rounds * args.parts * len(names)
    tot["skip_ratio_per_hot_round_all_tables"] = (
        round(1 - tot["parts"] / paper_pairs, 5) if paper_pairs else None
    )
    pred = None
    parts_of_keys = np.asarray(hot.sync_parts_of(keys))
    if hot_rounds:
        round_s = window_s * len(followers) / hot_rounds
        pred = round(predicted_skip(parts_of_keys, batches, round_s, trace.batch_ms, args.parts), 5)
        per_table["hot"]["mean_round_ms"] = round(round_s * 1000, 2)
    per_table["hot"]["predicted_skip_ratio"] = pred
    # What the hot table would skip with the longer rounds of a WAN (e.g. 2-3 RTT of 50 ms).
    per_table["hot"]["predicted_skip_ratio_at_round_ms"] = {
        str(ms): round(
            predicted_skip(parts_of_keys, batches, ms / 1e3, trace.batch_ms, args.parts), 5
        )
        for ms in args.predict_round_ms
    }
    return {
        "experiment": "E6",
        "shard_versions": shard_versions,
        "followers": len(followers),
        "follower": "embstore serve --follow (in-process _native.Server)",
        "network": "loopback",
        "parts": args.parts,
        "trace": trace.as_dict(),
        "idle_tables": args.idle_tables,
        "idle_rows": args.idle_rows,
        "idle_every_s": None if args.idle_share > 0 else args.idle_every,
        "idle_share": args.idle_share,
        "idle_writes": idle_writes,
        "prefill": not args.no_prefill,
        "join_s": round(join_s, 2),
        "window_s": round(window_s, 2),
        "batches_late_100ms": late,
        "caught_up_after": caught,
        "tables": per_table,
        "all": tot,
        "cpu": cpu,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": _commit(),
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=pathlib.Path(__file__).parent,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def summary(r: dict) -> str:
    a, h = r["all"], r["tables"]["hot"]
    idle = [v for k, v in r["tables"].items() if k != "hot"]
    idle_ratio = None
    if idle:
        rounds = sum(v["rounds"] for v in idle)
        parts = sum(v["parts"] for v in idle)
        idle_ratio = 1 - parts / (rounds * r["parts"]) if rounds else None
    return (
        f"shard versions {'on ' if r['shard_versions'] else 'off'}: all tables skip "
        f"{_pct(a['skip_ratio'])} ({a['parts']:,} parts pulled in {a['rounds']:,} rounds), hot "
        f"{_pct(h['skip_ratio'])} (predicted {_pct(h.get('predicted_skip_ratio'))}, "
        f"{h['rounds_per_s']} rounds/s), idle {_pct(idle_ratio)}, per hot round over all tables "
        f"{_pct(a['skip_ratio_per_hot_round_all_tables'])}; parts pulled/s per follower "
        f"{a['parts_per_s']:,}; box CPU {r['cpu']['box_pct']} % (this process "
        f"{r['cpu']['own_pct_of_box']} % of the box)"
    )


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="shard versions on and/or off, one run each (default: on off)",
    )
    ap.add_argument("--rate", type=float, default=15_000, help="hot rows/s (default 15000)")
    ap.add_argument("--duration", type=float, default=30, help="seconds of writes (default 30)")
    ap.add_argument("--rows", type=int, default=1 << 20, help="hot keys (default 2^20)")
    ap.add_argument("--dim", type=int, default=16, help="float32 per row (default 16)")
    ap.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent (default 1.05)")
    ap.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    ap.add_argument("--batch-ms", type=float, default=10, help="write batch window (default 10)")
    ap.add_argument("--parts", type=int, default=1024, help="sync parts per table (default 1024)")
    ap.add_argument("--idle-tables", type=int, default=7, help="idle tables (default 7)")
    ap.add_argument("--idle-rows", type=int, default=1 << 18, help="keys each (default 2^18)")
    ap.add_argument(
        "--idle-every",
        type=float,
        default=3.0,
        help="seconds between writes to one idle table (default 3)",
    )
    ap.add_argument(
        "--idle-share",
        type=float,
        default=0.0,
        help="instead: this share of all updates goes to the idle tables (0.0101 "
        "is ekko_writer's 1/99)",
    )
    ap.add_argument("--followers", type=int, default=2, help="followers (default 2)")
    ap.add_argument("--no-prefill", action="store_true", help="start from empty tables")
    ap.add_argument("--join-timeout", type=float, default=120, help="catch-up bound, s")
    ap.add_argument(
        "--predict-round-ms",
        type=float,
        nargs="*",
        default=[50, 150, 1000],
        help="also predict the hot table's skip ratio at these round lengths (default 50 150 1000)",
    )
    ap.add_argument("--json", help="append the records (a JSON list) to this file")
    ap.add_argument("--plot", help="write the plot (PNG) of this run's records here")
    args = ap.parse_args(argv)
    if args.followers < 1 or args.idle_tables < 0 or not 0 <= args.idle_share < 1:
        ap.error("--followers >= 1, --idle-tables >= 0, 0 <= --idle-share < 1")
    trace = Trace(
        seed=args.seed,
        rows=args.rows,
        dim=args.dim,
        rate=args.rate,
        duration=args.duration,
        zipf_a=args.zipf,
        batch_ms=args.batch_ms,
    )
    recs = []
    for mode in args.modes:
        print(f"== shard versions {mode}", file=sys.stderr)
        r = run_mode(args, trace, mode == "on")
        print(summary(r), flush=True)
        recs.append(r)
    if args.json:
        p = pathlib.Path(args.json)
        old = json.loads(p.read_text()) if p.exists() else []
        p.write_text(json.dumps(old + recs, indent=1) + "\n")
    if args.plot:
        from dissemination.plot_experiments import plot_e6

        plot_e6(recs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
