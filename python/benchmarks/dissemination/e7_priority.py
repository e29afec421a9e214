"""E7 (spec ekko.md §8.4): a WAN cut with prioritised sync on and off.

The training store (its writer scores the hot table's writes with ``embstore.Priority(k)``)
streams a trace to followers in every other data centre over the emulated WAN
(``ekko_peer.Cluster``, ``wan2.sh``). At ``--cut-at`` s every training → inference WAN class is
cut to ``--cut-mbit`` (``tc class change`` on DC 1's router), and restored at ``--restore-at``.
The same trace runs twice, the followers' prioritised pulls off and on (``embstore serve
--priority off|on``), in alternating order over ``--repeats``.

Per update: visible at a follower at the first sync event covering its version (normal sync)
or the first ``.ahead`` record of its key at or above its version (taken ahead); its latency is
the max over followers of (visible - commit). Classes: ``significant`` (the writer's table
marked the write: ``Table.significant_versions``), ``new`` (the first write of a key), ``other``;
phases by commit time: before the cut, during it, after it. Also: the freshness proxy (the
share of the rows created in the last 60 s visible at every follower, sampled every 5 s of the
cut), the quality proxy (every 10 s, per follower, the access-weighted L1 distance between
its rows and the primary's: mean over followers and the worst follower's mean, per phase),
WAN bytes per DC pair, and the primary's TCP losses and the WAN queues' drops during the cut.
The WAN's links have a 1500-byte MTU unless ``--mtu`` says otherwise. Needs root,
``make wan-deps``.

    sudo .venv/bin/python python/benchmarks/dissemination/e7_priority.py --json e7.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import select
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lib.records import log

from dissemination import ekko_peer, latency
from dissemination.cpu import CpuMeter
from dissemination.trace import trace_for, warm_mask
from dissemination.wan import Wan, config_from_args, pair_delta

AHEAD = np.dtype(
    [("t_us", "<u8"), ("table", "<u4"), ("part", "<u4"), ("key", "<u8"), ("ts", "<u8")]
)


def cut(w: Wan, mbit: float) -> None:
    """Every WAN class from DC 1 (training) to the other DCs at ``mbit``."""
    for j in range(2, w.cfg.dcs + 1):
        subprocess.run(
            ["ip", "netns", "exec", "ek-r1", "tc", "class", "change", "dev", "wan0", "parent",
             "1:", "classid", f"1:{j}", "htb", "rate", f"{mbit}mbit", "ceil", f"{mbit}mbit",
             "burst", "64k", "cburst", "64k", "quantum", "60000"],
            check=True,
        )  # fmt: skip


def ahead_visible(keys: np.ndarray, ts: np.ndarray, rec: np.ndarray) -> np.ndarray:
    """Per update (key, version ts), the first ``.ahead`` record time of its key at or above
    ``ts`` (int64 µs), or -1."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(rec) == 0:
        return out
    order = np.lexsort((rec["t_us"], rec["key"]))
    rk, rt, rts = rec["key"][order], rec["t_us"][order].astype(np.int64), rec["ts"][order]
    uk, start = np.unique(rk, return_index=True)
    end = np.append(start[1:], len(rk))
    pos = np.searchsorted(uk, keys)
    hit = (pos < len(uk)) & (uk[np.minimum(pos, len(uk) - 1)] == keys)
    for i in np.flatnonzero(hit):
        a, b = start[pos[i]], end[pos[i]]
        known = np.maximum.accumulate(rts[a:b])
        j = np.searchsorted(known, ts[i], side="left")
        if j < b - a:
            out[i] = rt[a + j]
    return out


def quality(
    kidx: np.ndarray,
    values: np.ndarray,
    commit: np.ndarray,
    vis: np.ndarray,
    weight: np.ndarray,
    t_us: int,
) -> float:
    """The quality proxy at ``t_us`` for one follower: the access-weighted mean L1 distance
    between the primary's rows (each key's last update committed by then) and the follower's
    (its last update visible there by then; zeros before any), keys weighted by how often the
    trace touches them. Updates are in commit order, so a key's later update is a newer
    version."""
    n_keys = len(weight)
    idx = np.arange(len(kidx))
    last_p = np.full(n_keys, -1, dtype=np.int64)
    m = commit <= t_us
    np.maximum.at(last_p, kidx[m], idx[m])
    last_f = np.full(n_keys, -1, dtype=np.int64)
    m = (vis >= 0) & (vis <= t_us)
    np.maximum.at(last_f, kidx[m], idx[m])
    has = np.flatnonzero(last_p >= 0)
    if len(has) == 0:
        return 0.0
    lp, lf = last_p[has], last_f[has]
    differ = lp != lf
    d = np.zeros(len(has))
    theirs = np.where(lf[differ, None] >= 0, values[np.maximum(lf[differ], 0)], 0.0)
    d[differ] = np.abs(values[lp[differ]] - theirs).sum(axis=1)
    return float((weight[has] * d).sum() / weight[has].sum())


def run(w: Wan, args, mode: str) -> dict:
    trace = trace_for(args, args.rate)
    args.follower_priority, args.priority_k = mode, args.k
    cl = ekko_peer.Cluster(w, args, trace)
    try:
        cl.start()
        meter = CpuMeter()
        meter.watch("primary+writer", cl.primary.pid)
        for s, p in cl.procs.items():
            meter.watch(f"embstore-{ekko_peer.name(s)}", p.pid)
        bytes0 = w.wan_bytes()
        meter.start()
        cl.primary.stdin.write("go\n")
        cl.primary.stdin.flush()
        t_go = time.monotonic()
        go_us = time.time_ns() // 1000
        state, done, drain_deadline, final = "before", None, None, None
        loss: dict = {}
        wan = {}
        while True:
            t = time.monotonic() - t_go
            if state == "before" and t >= args.cut_at:
                b = w.wan_bytes()
                wan["before"] = pair_delta(bytes0, b)
                bytes0 = b
                loss0 = (w.tcp_counters("ek-s1-1"), w.wan_drops(1))
                cut(w, args.cut_mbit)
                state = "during"
                log(f"  {mode}: t={t:.1f} s cut to {args.cut_mbit} Mbit/s")
            elif state == "during" and t >= args.restore_at:
                b = w.wan_bytes()
                wan["during"] = pair_delta(bytes0, b)
                bytes0 = b
                tcp1, drops1 = w.tcp_counters("ek-s1-1"), w.wan_drops(1)
                loss = {k: v - loss0[0].get(k, 0) for k, v in tcp1.items()}
                loss["wan_queue_drops"] = drops1 - loss0[1]
                log(f"  {mode}: during the cut, the primary's TCP and DC 1's WAN queues: {loss}")
                cut(w, args.wan)
                state = "after"
                log(f"  {mode}: t={t:.1f} s restored to {args.wan} Mbit/s")
            for e in cl.events.values():
                e.poll()
            if done is None and select.select([cl.primary.stdout], [], [], 0)[0]:
                line = cl._read(1.0)
                if not line.startswith("done "):
                    raise RuntimeError(f"writer: {line}")
                done = json.loads(line[5:])
                data = np.load(cl.dir / "w.npz")
                final = np.zeros(cl.parts, dtype=np.uint64)
                np.maximum.at(final, data["part"].astype(np.int64), data["ts"])
                drain_deadline = time.monotonic() + args.drain
            if state == "after" and final is not None:
                if all((e.known >= final).all() for e in cl.events.values()):
                    break
                if time.monotonic() > drain_deadline:
                    log(f"  {mode}: drain timeout")
                    break
            time.sleep(0.05)
        wan["after"] = pair_delta(bytes0, w.wan_bytes())
        cpu = meter.stop()
        events = {ekko_peer.name(s): e.all() for s, e in cl.events.items()}
        ahead = {}
        for s, e in cl.events.items():
            f = pathlib.Path(str(e.path) + ".ahead")
            raw = f.read_bytes() if f.exists() else b""
            rec = np.frombuffer(raw[: len(raw) // AHEAD.itemsize * AHEAD.itemsize], dtype=AHEAD)
            ahead[ekko_peer.name(s)] = rec[rec["table"] == latency.table_id("hot")]
    finally:
        cl.stop(None)
    keys, values = trace.keys_values()
    commit_us, rows = data["commit_us"], data["rows"]
    batch = np.repeat(np.arange(len(rows)), rows)
    commit = commit_us[batch].astype(np.int64)
    # The quality proxy every 10 s of each phase, per follower (mean over followers, worst).
    uniq, kidx = np.unique(keys, return_inverse=True)
    weight = np.bincount(kidx, minlength=len(uniq)).astype(np.float64)
    values = np.asarray(values, dtype=np.float32)[: len(commit)]
    kidx = kidx[: len(commit)]
    q_times = {
        "before": np.arange(5.0, args.cut_at, 10.0),
        "during": np.arange(args.cut_at + 5, args.restore_at, 10.0),
        "after": np.arange(args.restore_at + 5, args.restore_at + 30, 10.0),
    }
    q: dict[str, list[list[float]]] = {k: [] for k in q_times}
    worst = np.zeros(len(commit), dtype=np.int64)
    missing = np.zeros(len(commit), dtype=bool)
    vis_all = np.zeros(len(commit), dtype=np.int64)
    for n, ev in events.items():
        vis = latency.row_visible_times(data["part"], data["ts"], ev)
        va = ahead_visible(keys.astype(np.uint64), data["ts"], ahead[n])
        both = np.where((va >= 0) & ((vis < 0) | (va < vis)), va, vis)
        for phase, times in q_times.items():
            q[phase].append(
                [quality(kidx, values, commit, both, weight, go_us + int(t * 1e6)) for t in times]
            )
        missing |= both < 0
        worst = np.maximum(worst, both - commit)
        vis_all = np.maximum(vis_all, both)
    lat = worst / 1e6
    lat[missing] = np.nan
    _, first = np.unique(keys, return_index=True)
    new = np.zeros(len(keys), dtype=bool)
    new[first] = True
    new &= ~warm_mask(keys, getattr(args, "warm_share", 0.0))  # created in the run
    sig = data["sig"]
    t_rel = (commit - go_us) / 1e6
    phase = np.where(t_rel < args.cut_at, 0, np.where(t_rel < args.restore_at, 1, 2))
    # Per follower, the significant writes of the cut: how late normal sync and the rows
    # taken ahead brought them, and the share that came ahead first (where a row waits).
    per_follower = {}
    sel = sig & (phase == 1)
    for n, ev in events.items():
        vis = latency.row_visible_times(data["part"][sel], data["ts"][sel], ev)
        va = ahead_visible(keys.astype(np.uint64)[sel], data["ts"][sel], ahead[n])
        c = commit[sel]
        ok_n, ok_a = vis >= 0, va >= 0
        first_ahead = ok_a & (~ok_n | (va < vis))
        first_s = np.where(first_ahead, va, vis) - c
        ok_f = ok_n | ok_a
        bins = ((c - go_us) / 1e6 - args.cut_at) // 10
        per_follower[n] = {
            "normal_mean_s": round(float(((vis - c)[ok_n]).mean() / 1e6), 4)
            if ok_n.any()
            else None,
            "ahead_mean_s": round(float(((va - c)[ok_a]).mean() / 1e6), 4) if ok_a.any() else None,
            "ahead_p50_p99_s": [
                round(float(np.percentile((va - c)[ok_a], q) / 1e6), 4) for q in (50, 99)
            ]
            if ok_a.any()
            else None,
            # The first of the two, per 10 s of the cut: where a slow follower lost its time.
            "first_mean_s_per_10s": [
                round(float(first_s[ok_f & (bins == b)].mean() / 1e6), 4)
                if (ok_f & (bins == b)).any()
                else None
                for b in range(int((args.restore_at - args.cut_at) // 10))
            ],
            "ahead_share": round(float(ok_a.mean()), 4) if len(c) else None,
            "ahead_first_share": round(float(first_ahead.mean()), 4) if len(c) else None,
        }
    for n, v in sorted(per_follower.items()):
        log(f"  {n} first arrival per 10 s of the cut: {v['first_mean_s_per_10s']}")
    if any(v["ahead_mean_s"] is not None for v in per_follower.values()):
        log(
            "  per follower, significant during the cut (normal / ahead mean s, share ahead "
            "first): "
            + "; ".join(
                f"{n} {v['normal_mean_s']} / {v['ahead_mean_s']} {v['ahead_first_share']}"
                for n, v in sorted(per_follower.items())
            )
        )
    out: dict = {"mode": mode, "cpu": cpu, "discarded": cpu["discarded"], "writer": done}
    out["loss_during_cut"] = loss
    for cname, sel in (("significant", sig), ("new", new), ("other", ~sig & ~new), ("all", None)):
        for pi, pname in enumerate(("before", "during", "after")):
            m = phase == pi if sel is None else (phase == pi) & sel
            x = lat[m]
            x = x[~np.isnan(x)]
            out[f"{cname}_{pname}"] = {
                "n": int(m.sum()),
                "mean_s": round(float(x.mean()), 4) if len(x) else None,
                "p50_s": round(float(np.percentile(x, 50)), 4) if len(x) else None,
                "p99_s": round(float(np.percentile(x, 99)), 4) if len(x) else None,
                "never_visible": int(m.sum() - len(x)),
            }
    # Freshness proxy during the cut: at each 5-s sample t, the share of the rows created in
    # the last 60 s (new keys committed in [t - 60, t]) visible at every follower by t.
    fresh = []
    for t in np.arange(args.cut_at + 5, args.restore_at + 0.1, 5.0):
        t_us = go_us + int(t * 1e6)
        m = new & (commit <= t_us) & (commit >= t_us - 60_000_000)
        if m.any():
            fresh.append(
                round(float(((vis_all[m] > 0) & (vis_all[m] <= t_us) & ~missing[m]).mean()), 4)
            )
    out["freshness_during_cut"] = fresh
    out["freshness_mean"] = round(float(np.mean(fresh)), 4) if fresh else None
    out["quality_by_phase"] = {
        phase: {
            "mean": round(float(np.mean(v)), 6) if len(v) and len(v[0]) else None,
            "worst_follower": round(float(np.max(np.mean(v, axis=1))), 6)
            if len(v) and len(v[0])
            else None,
        }
        for phase, v in q.items()
    }
    log(f"  {mode}: quality proxy (access-weighted L1 to the primary) {out['quality_by_phase']}")
    out["wan_bytes_by_phase"] = {k: sum(v.values()) for k, v in wan.items()}
    out["rows_taken_ahead"] = int(sum(len(a) for a in ahead.values()))
    out["significant_during_per_follower"] = per_follower
    out["significant_share"] = round(float(sig.mean()), 4)
    log(
        f"{mode}: significant before/during/after mean "
        + " / ".join(str(out[f"significant_{p}"]["mean_s"]) for p in ("before", "during", "after"))
        + " s; new "
        + " / ".join(str(out[f"new_{p}"]["mean_s"]) for p in ("before", "during", "after"))
        + " s; other "
        + " / ".join(str(out[f"other_{p}"]["mean_s"]) for p in ("before", "during", "after"))
        + f" s; freshness {out['freshness_mean']}; ahead {out['rows_taken_ahead']} rows; box CPU "
        + f"{cpu['box_pct']} %"
        + (" DISCARD" if cpu["discarded"] else "")
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=12_000, help="rows/s (default 12,000)")
    ap.add_argument("--k", type=float, default=99.0, help="the writer's percentile (default 99)")
    ap.add_argument("--cut-at", type=float, default=30.0)
    ap.add_argument("--restore-at", type=float, default=90.0)
    ap.add_argument("--cut-mbit", type=float, default=3.84)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json")
    known, rest = ap.parse_known_args(argv)
    # The cluster's own flags (network, workload, topology): ekko_peer's, with E7's defaults.
    # A WAN's MTU (1500): at wan2.sh's 60,000 a cut link of 3.84 Mbit/s spends 250 ms on
    # one TCP send unit, and no flow crosses it faster than the bulk one ahead of it.
    base = ["--dcs", "5", "--servers", "3", "--duration", str(known.restore_at + 30)]
    base += ["--mtu", "1500"]
    args = ekko_peer.parse_args(base + rest)
    for k, v in vars(known).items():
        setattr(args, k, v)
    records = []
    with Wan(config_from_args(args), python=args.python, log=log) as w:
        for r in range(known.repeats):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                log(f"E7 repeat {r + 1}/{known.repeats}, prioritised pulls {mode}")
                rec = run(w, args, mode)
                rec["repeat"] = r
                records.append(rec)
    doc = {
        "experiment": "E7",
        "rate_rows_s": known.rate,
        "k": known.k,
        "cut": [known.cut_at, known.restore_at, known.cut_mbit],
        "network": vars(config_from_args(args))
        if hasattr(config_from_args(args), "__dict__")
        else None,
        "cpu_model": next(
            (
                ln.split(":", 1)[1].strip()
                for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")
            ),
            "unknown",
        ),
        "pid": os.getpid(),
        "runs": records,
    }
    text = json.dumps(doc, indent=1, default=str)
    if known.json:
        pathlib.Path(known.json).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
