"""The paper's "Adam" baseline (spec section 9, ``--sync 2pc``): primary-backup replication with
two-phase commit over the emulated WAN, measured like ``ekko_peer.py`` (same network, trace,
batches, latency definition, WAN counters and CPU rule).

The primary runs in DC 1 server 1 (``ek-s1-1``, ``twopc_node.py primary``) with its writer; every
other server of every DC runs a backup (``twopc_node.py backup``), R_total - 1 of them, and the
primary connects to each directly. Per 10 ms batch the primary sends PREPARE(n, rows) to every
backup, pipelined (no wait between broadcasts; at most ``--max-inflight`` unsent bytes per
backup), and COMMIT(n) once every backup has acked PREPARE n and n - 1 has committed; a backup
stages PREPAREs and applies them on COMMIT, in order, and logs the time of each apply.

An update's latency is the max over backups of (its batch applied there - its batch accepted at
the primary): commit = accepted, so queueing at the primary's NIC counts (spec section 10, G21).
``--rhos`` gives the load as the NIC load 2PC needs at its primary (``twopc.rho_2pc``) instead of
rates. Prints one JSON record per rate (stdout or ``--json FILE``), progress on stderr.

Needs root, ``make wan-deps`` and ../shared/tools/wan.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lib.records import log

from dissemination import latency, twopc
from dissemination.cpu import CpuMeter, idle_box_pct
from dissemination.trace import add_workload_args, check_workload_args, rho, trace_for
from dissemination.wan import Wan, add_network_args, pair_delta, run_sweep, server_addr

HERE = pathlib.Path(__file__).resolve().parent
EV_DTYPE = np.dtype([("t_us", "<u8"), ("batch", "<i8")])


def read_applied(path: pathlib.Path) -> np.ndarray:
    """A backup's apply log as ``int64[m, 2]`` rows of (t_us, batch + 1): the "polls" of
    :func:`latency.update_latencies`, whose offsets are batch numbers + 1."""
    raw = path.read_bytes() if path.exists() else b""
    n = len(raw) // EV_DTYPE.itemsize
    ev = np.frombuffer(raw[: n * EV_DTYPE.itemsize], dtype=EV_DTYPE)
    return np.stack([ev["t_us"].astype(np.int64), ev["batch"] + 1], axis=1)


def run_rate(w: Wan, args, rate: float) -> dict:
    trace = trace_for(args, rate)
    nd, ns = w.cfg.dcs, w.cfg.servers
    backups = [(d, k) for d in range(1, nd + 1) for k in range(1, ns + 1) if (d, k) != (1, 1)]
    load = twopc.rho_2pc(rate, trace.dim, nd * ns, w.cfg.nic_mbit)
    log(
        f"rate {rate:g} rows/s (rho_2pc {load:.2f}): {trace.updates} updates over "
        f"{trace.duration:g} s, {len(backups)} backups"
    )
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ek-2pc-"))
    procs: dict[tuple[int, int], subprocess.Popen] = {}
    primary = None
    node = str(HERE / "twopc_node.py")
    try:
        for d, k in backups:
            argv = [w.python, node, "backup", "--listen", f"{server_addr(d, k)}:{args.port}"]
            argv += ["--rows", str(trace.rows), "--dim", str(trace.dim)]
            argv += ["--events", str(tmp / f"s{d}-{k}.bin")]
            err = open(tmp / f"s{d}-{k}.err", "w")
            procs[(d, k)] = w.spawn(d, k, argv, stdout=subprocess.DEVNULL, stderr=err)
            err.close()
        argv = [w.python, node, "primary", "--trace", json.dumps(trace.as_dict())]
        argv += ["--out", str(tmp / "p.npz"), "--max-inflight", str(args.max_inflight)]
        argv += ["--drain", str(args.drain), "--warm-s", str(args.warm_s), "--backups"]
        argv += [f"{server_addr(d, k)}:{args.port}" for d, k in backups]
        err = open(tmp / "primary.err", "w")
        primary = w.spawn(
            1, 1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
        err.close()

        def read_line(timeout: float) -> str:
            if not select.select([primary.stdout], [], [], timeout)[0]:
                raise RuntimeError(f"the primary did not answer within {timeout:g} s")
            line = primary.stdout.readline()
            if not line:
                text = (tmp / "primary.err").read_text()[-2000:]
                raise RuntimeError(f"the primary exited ({primary.wait()}): {text}")
            return line.strip()

        ready = read_line(120)
        if not ready.startswith("ready"):
            raise RuntimeError(f"primary: {ready}")
        time.sleep(1.0)
        meter = CpuMeter()
        meter.watch("monitor", os.getpid())
        meter.watch("primary+writer", primary.pid)
        for s, p in procs.items():
            meter.watch(f"backup-s{s[0]}-{s[1]}", p.pid)
        for i, pid in enumerate(w.delayd_pids(), 1):
            meter.watch(f"delayd-{i}", pid)
        bytes0 = w.wan_bytes()
        meter.start()
        t_go = time.monotonic()
        primary.stdin.write("go\n")
        primary.stdin.flush()
        line = read_line(args.duration + args.drain + 60)
        if not line.startswith("done "):
            raise RuntimeError(f"primary: {line}")
        done = json.loads(line[5:])
        last = int(ready.split()[2]) + done["committed"] - 1
        # The COMMITs are on their way: wait until every backup logged the last one.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(
                (a := read_applied(tmp / f"s{d}-{k}.bin")).size and a[-1, 1] - 1 >= last
                for d, k in backups
            ):
                break
            time.sleep(0.05)
        cpu = meter.stop()
        run_s = time.monotonic() - t_go
        bytes1 = w.wan_bytes()
        data = np.load(tmp / "p.npz")
        replicas = {f"s{d}-{k}": read_applied(tmp / f"s{d}-{k}.bin") for d, k in backups}
        errors = {}
        for f in sorted(tmp.glob("*.err")):
            text = f.read_text().strip()
            if text:
                errors[f.stem] = "\n".join(text.splitlines()[-8:])
    finally:
        for p in procs.values():
            w.stop(p)
        if primary is not None:
            w.stop(primary)
        shutil.rmtree(tmp, ignore_errors=True)
    pair = pair_delta(bytes0, bytes1)
    wan_total = sum(pair.values())
    accept, rows = data["accept_us"], data["rows"]
    first = int(data["first_batch"])
    commits = np.stack([accept, np.arange(first + 1, first + len(rows) + 1), rows], axis=1)
    res = latency.summary(commits, replicas, wan_total)
    lat_b, _ = latency.update_latencies(commits, replicas)
    res["window_means_5s"] = latency.window_means(accept, lat_b, rows)
    per_dc = {}
    for dc in range(1, nd + 1):
        sub = {n: a for n, a in replicas.items() if n.startswith(f"s{dc}-")}
        lat, _ = latency.update_latencies(commits, sub)
        ok = ~np.isnan(lat)
        if ok.any():
            per_dc[str(dc)] = round(float(np.average(lat[ok], weights=rows[ok])), 4)
    ok = data["commit_us"] >= 0
    prim_commit = (data["commit_us"][ok] - accept[ok]) / 1e6
    res.update(
        system="2pc",
        topology="primary-backup",
        dc1_followers=True,
        rate_rows_s=rate,
        achieved_rows_s=round(res["updates"] / ((accept[-1] - accept[0]) / 1e6 + 0.01), 1),
        duration_s=args.duration,
        warm_s=args.warm_s,
        run_s=round(run_s, 1),
        writer=done,
        per_dc_mean_s=per_dc,
        primary_commit_mean_s=round(float(np.average(prim_commit, weights=rows[ok])), 4)
        if ok.any()
        else None,
        rho_2pc=round(twopc.rho_2pc(rate, trace.dim, nd * ns, w.cfg.nic_mbit), 3),
        rho_spec=round(rho(rate * 122, nd * ns, ns, w.cfg.nic_mbit), 3),
        primary_nic_load=round(twopc.rho_2pc(rate, trace.dim, nd * ns, w.cfg.nic_mbit), 3),
        # Forward WAN bytes per WAN copy, times every copy the primary sends, over the writes.
        primary_nic_load_measured=round(
            sum(v for k, v in pair.items() if k.startswith("1->"))
            / ((nd - 1) * ns)
            * (nd * ns - 1)
            * 8
            / args.duration
            / (w.cfg.nic_mbit * 1e6),
            3,
        )
        if nd > 1
        else None,
        wan_copies_expected=(nd - 1) * ns,
        wan_bytes_forward=sum(v for k, v in pair.items() if k.startswith("1->")),
        wan_bytes_by_pair=pair,
        stderr=errors,
        cpu=cpu,
        discarded=cpu["discarded"],
        trace=trace.as_dict(),
    )
    log(
        f"rate {rate:g}: mean {res.get('mean_s')} s, p99 {res.get('p99_s')} s, WAN "
        f"{wan_total / 1e6:.1f} MB = {res['wan_bytes_per_update']} B/update, committed "
        f"{done['committed']}/{done['batches']}, box CPU {cpu['box_pct']} %, all processes "
        f"{cpu['all_processes_pct']} %, own {cpu['own_pct_of_box']} %"
        + (" DISCARD" if cpu["discarded"] else "")
        + (
            f"; {res['batches_never_visible']} batches never visible"
            if res.get("batches_never_visible")
            else ""
        )
        + (f"; stderr from {', '.join(errors)}" if errors else "")
    )
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: twopc_peer.py --rhos 0.5 0.9 1.2 --json /tmp/2pc.json",
    )
    add_network_args(ap)
    add_workload_args(ap, [5000], "default 5000")
    g = ap.add_argument_group("2PC and measurement")
    g.add_argument(
        "--rhos",
        type=float,
        nargs="+",
        help="loads instead of --rates: the NIC load 2PC needs at the primary (twopc.rho_2pc)",
    )
    g.add_argument("--port", type=int, default=7200, help="backups' port (default 7200)")
    g.add_argument(
        "--max-inflight",
        type=int,
        default=64 << 20,
        help="unsent bytes per backup before the primary waits (default 64 MiB)",
    )
    g.add_argument(
        "--drain", type=float, default=60, help="max seconds to wait for the last commit"
    )
    g.add_argument(
        "--warm-s",
        type=float,
        default=2.0,
        help="seconds of the trace's first batches replayed (and committed) before the measured "
        "run, to warm the connections up (default 2; embstore's peer waits until its followers "
        "are in sync)",
    )
    g.add_argument("--python", default=sys.executable, help="python for every process")
    ap.add_argument("--json", metavar="FILE", help="write the records there (default stdout)")
    args = ap.parse_args(argv)
    if args.rhos:
        args.rates = [
            round(twopc.rate_for_rho_2pc(r, args.dim, args.dcs * args.servers, args.nic))
            for r in args.rhos
        ]
    check_workload_args(ap, args, min_dcs=1)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_sweep(args, run_rate, log, idle_box_pct(1.0))


if __name__ == "__main__":
    sys.exit(main())
