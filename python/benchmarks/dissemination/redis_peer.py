"""The outside peer for dissemination: Redis primary -> replica replication over the emulated WAN.

A primary ``redis-server`` runs in DC 1 server 1 (``ek-s1-1``); every server of the other DCs
runs a replica. ``--topology chain`` (the default, the fair comparison with a DC-leader topology):
server 1 of each DC replicates from the primary over the WAN and the DC's other servers replicate
from it; ``--topology direct``: every replica replicates from the primary (one WAN copy per
replica). A writer in ``ek-s1-1`` (the training server: it writes to its local store over
loopback) replays a seeded Zipf trace as pipelined SETs of one row each and records the ack time
and the primary's replication offset per batch; this process polls every replica's ``ROLE``
(its applied replication offset) over the replica namespace's loopback every ``--poll-ms`` and
so learns when each batch became visible there. Latency of an update = max over replicas of
(visible - commit); see ``latency.py``. WAN bytes come from the routers' per-DC-pair htb classes
(``wan.py``). Prints one JSON record per rate (stdout or ``--json FILE``), progress on stderr.

Needs root, ``make wan-deps`` (iptables, NetfilterQueue, redis-server) and ../shared/tools/wan.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lib.records import log

from dissemination import latency
from dissemination.cpu import CpuMeter, idle_box_pct
from dissemination.resp import Conn, command, info_fields
from dissemination.trace import add_workload_args, check_workload_args, rho, trace_for
from dissemination.wan import (
    Wan,
    add_network_args,
    netns_connect,
    pair_delta,
    run_sweep,
    server_addr,
    server_ns,
)

HERE = pathlib.Path(__file__).resolve().parent
# The flags of the spec's Appendix A.1 measurement; --protected-mode no because replicas in other
# namespaces connect from non-loopback addresses without a password; no 5 s wait before the
# initial (empty) full sync, which only shortens the start.
REDIS_FLAGS = [
    "--save", "", "--appendonly", "no", "--repl-backlog-size", "256mb",
    "--client-output-buffer-limit", "replica 0 0 0",
    "--protected-mode", "no", "--bind", "0.0.0.0", "--daemonize", "no",
    "--repl-diskless-sync-delay", "0",
]  # fmt: skip
ROLE = command("ROLE")


def mono_us() -> int:
    return time.monotonic_ns() // 1000


def upstream(topology: str, dc: int, k: int) -> tuple[int, int]:
    """The server whose redis the replica on ``(dc, k)`` replicates from."""
    return (1, 1) if topology == "direct" or k == 1 else (dc, 1)


class Cluster:
    """The primary and replicas of one run (started in the WAN's namespaces; stopped by PID)."""

    def __init__(self, w: Wan, args) -> None:
        self.w, self.args = w, args
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="ek-redis-"))
        self.procs: dict[tuple[int, int], subprocess.Popen] = {}
        self.conns: dict[tuple[int, int], Conn] = {}
        self.replicas = [
            (d, k) for d in range(2, w.cfg.dcs + 1) for k in range(1, w.cfg.servers + 1)
        ]

    def _start(self, dc: int, k: int, extra: list[str]) -> None:
        d = self.dir / f"s{dc}-{k}"
        d.mkdir()
        argv = [self.args.redis_server, "--port", str(self.args.port), *REDIS_FLAGS]
        argv += ["--dir", str(d), "--logfile", str(d / "redis.log"), *extra]
        self.procs[(dc, k)] = self.w.spawn(dc, k, argv, stdout=subprocess.DEVNULL)

    def start(self, timeout: float = 60.0) -> None:
        self._start(1, 1, [])
        self.conns[(1, 1)] = Conn(netns_connect(server_ns(1, 1), ("127.0.0.1", self.args.port)))
        for dc, k in self.replicas:
            up = upstream(self.args.topology, dc, k)
            self._start(dc, k, ["--replicaof", server_addr(*up), str(self.args.port)])
        for dc, k in self.replicas:
            self.conns[(dc, k)] = Conn(
                netns_connect(server_ns(dc, k), ("127.0.0.1", self.args.port))
            )
        deadline = time.monotonic() + timeout
        # Settled = a warm-up write reaches every replica within a second, twice in a row, a
        # second apart: chained replicas can reconnect (and resync) once their DC's first
        # replica has finished its own initial sync, which would show as a start-up transient.
        settled = 0
        while settled < 2:
            self.conns[(1, 1)].call("SET", "warmup", settled)
            target = self.primary_offset()
            t_warm = time.monotonic()
            behind = self.replicas
            while behind and time.monotonic() - t_warm < 1.0:
                roles = {s: self.conns[s].call("ROLE") for s in self.replicas}
                behind = [s for s, r in roles.items() if r[3] != b"connected" or r[4] < target]
                time.sleep(0.02)
            settled = 0 if behind else settled + 1
            if time.monotonic() > deadline:
                tails = "".join(f"\n--- {s[0]}-{s[1]}:\n" + self.log_tail(s) for s in behind[:3])
                raise RuntimeError(f"replicas not in sync after {timeout:.0f} s: {behind}{tails}")
            time.sleep(1.0)

    def log_tail(self, server: tuple[int, int], lines: int = 5) -> str:
        """The last lines of a server's redis log (the folder goes when the run ends)."""
        f = self.dir / f"s{server[0]}-{server[1]}" / "redis.log"
        return "\n".join(f.read_text().splitlines()[-lines:]) if f.exists() else "(no log)"

    def primary_offset(self) -> int:
        info = info_fields(self.conns[(1, 1)].call("INFO", "replication"))
        return int(info["master_repl_offset"])

    def stop(self) -> None:
        for c in self.conns.values():
            c.close()
        for proc in self.procs.values():
            self.w.stop(proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def poll_round(cl: Cluster, last: dict, polls: dict) -> None:
    """Send ROLE to every replica at once, then read each reply; append ``(t_us, offset)`` to a
    replica's polls when its offset moved (the first poll that shows an offset is its time)."""
    for s in cl.replicas:
        cl.conns[s].sock.sendall(ROLE)
    for s in cl.replicas:
        off = cl.conns[s].reply()[4]
        if off != last[s]:
            last[s] = off
            polls[s].append((mono_us(), off))


def run_rate(w: Wan, args, rate: float) -> dict:
    trace = trace_for(args, rate)
    log(
        f"rate {rate:g} rows/s: trace seed {trace.seed}, {trace.updates} updates over "
        f"{trace.duration:g} s, Zipf({trace.zipf_a:g}) over {trace.rows} keys, D={trace.dim}"
    )
    cl = Cluster(w, args)
    writer = None
    out_file = cl.dir / "commits.json"
    try:
        t0 = time.monotonic()
        cl.start()
        log(
            f"primary + {len(cl.replicas)} replicas ({args.topology}) in sync "
            f"({time.monotonic() - t0:.1f} s)"
        )
        argv = [
            w.python,
            str(HERE / "redis_writer.py"),
            "--port",
            str(args.port),
            "--trace",
            json.dumps(trace.as_dict()),
            "--out",
            str(out_file),
        ]
        writer = w.spawn(1, 1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = writer.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"writer failed to start (exit {writer.wait()})")
        meter = CpuMeter()
        meter.watch("monitor", os.getpid())
        for s, p in cl.procs.items():
            meter.watch(f"redis-s{s[0]}-{s[1]}", p.pid)
        for i, pid in enumerate(w.delayd_pids(), 1):
            meter.watch(f"delayd-{i}", pid)
        off0 = cl.primary_offset()
        bytes0 = w.wan_bytes()
        last = {s: -1 for s in cl.replicas}
        polls = {s: [] for s in cl.replicas}
        meter.start()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        t_go = time.monotonic()
        commits = None
        final = None
        next_log = t_go + 5
        drain_deadline = None
        while True:
            t_round = time.monotonic()
            poll_round(cl, last, polls)
            if commits is None and writer.poll() is not None:
                if writer.returncode != 0:
                    raise RuntimeError(f"writer exited with {writer.returncode}")
                data = json.loads(out_file.read_text())
                commits = np.array(data["commits"], dtype=np.int64).reshape(-1, 3)
                final = int(commits[-1, 1])
                drain_deadline = time.monotonic() + args.drain
                log(
                    f"writer done: {data['elapsed_s']:.1f} s, {data['batches_late_100ms']} "
                    "batches sent > 100 ms late; draining"
                )
            if final is not None and min(last.values()) >= final:
                break
            if drain_deadline is not None and time.monotonic() > drain_deadline:
                log(f"drain timeout ({args.drain:g} s): some replicas never caught up")
                break
            if time.monotonic() > next_log:
                next_log += 5
                lag = max(cl.primary_offset() - v for v in last.values())
                log(f"  t={time.monotonic() - t_go:5.1f} s: max replica lag {lag / 1e6:.2f} MB")
            sleep = args.poll_ms / 1000 - (time.monotonic() - t_round)
            if sleep > 0:
                time.sleep(sleep)
        cpu = meter.stop({"writer": data["cpu_s"]})
        t_end = time.monotonic()
        bytes1 = w.wan_bytes()
        stream = cl.primary_offset() - off0
    finally:
        if writer is not None:
            w.stop(writer)
        cl.stop()
    pair = pair_delta(bytes0, bytes1)
    wan_total = sum(pair.values())
    arrays = {
        f"s{d}-{k}": np.array(p, dtype=np.int64).reshape(-1, 2) for (d, k), p in polls.items()
    }
    res = latency.summary(commits, arrays, wan_total)
    if args.raw:
        raw = pathlib.Path(args.raw)
        raw.mkdir(parents=True, exist_ok=True)
        name = raw / f"redis-{args.topology}-{w.cfg.dcs}x{w.cfg.servers}-{rate:g}.npz"
        np.savez_compressed(name, commits=commits, **arrays)
        log(f"raw events in {name} (commits: t_us, offset, rows; s<dc>-<k>: t_us, offset)")
    per_dc = {}
    for dc in range(2, w.cfg.dcs + 1):
        sub = {n: a for n, a in arrays.items() if n.startswith(f"s{dc}-")}
        per_dc[str(dc)] = latency.summary(commits, sub, 0).get("mean_s")
    nd, ns = w.cfg.dcs, w.cfg.servers
    primary_copies = (nd - 1) * (ns if args.topology == "direct" else 1)
    stream_rate = stream / args.duration
    set_bytes = stream / max(1, res["updates"])
    res.update(
        system="redis",
        topology=args.topology,
        rate_rows_s=rate,
        achieved_rows_s=round(
            res["updates"] / ((commits[-1, 0] - commits[0, 0]) / 1e6 + args.batch_ms / 1e3), 1
        ),
        duration_s=args.duration,
        run_s=round(t_end - t_go, 1),
        per_dc_mean_s=per_dc,
        replication_stream_bytes=stream,
        stream_bytes_per_update=round(set_bytes, 1),
        wan_copies_expected=primary_copies if args.topology == "direct" else nd - 1,
        wan_bytes_forward=sum(v for k, v in pair.items() if k.startswith("1->")),
        wan_bytes_by_pair=pair,
        primary_nic_load=round(primary_copies * stream_rate * 8 / (w.cfg.nic_mbit * 1e6), 3),
        wan_link_load=round(
            (ns if args.topology == "direct" else 1) * stream_rate * 8 / (w.cfg.wan_mbit * 1e6), 3
        ),
        rho_spec=round(rho(rate * 122, nd * ns, ns, w.cfg.nic_mbit), 3),
        cpu=cpu,
        discarded=cpu["discarded"],
        trace=trace.as_dict(),
    )
    log(
        f"rate {rate:g}: mean {res.get('mean_s')} s, p99 {res.get('p99_s')} s, WAN "
        f"{wan_total / 1e6:.1f} MB = {res['wan_bytes_per_update']} B/update, box CPU "
        f"{cpu['box_pct']} %, all processes {cpu['all_processes_pct']} %, own "
        f"{cpu['own_pct_of_box']} %" + (" DISCARD" if cpu["discarded"] else "")
    )
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: redis_peer.py --rates 15000 45000 --json /tmp/redis.json  "
        "(3 DCs x 3, NIC 50, WAN 48 Mbit, 25 ms one-way, 30 s of updates per rate)",
    )
    add_network_args(ap)
    add_workload_args(
        ap,
        [15000, 45000],
        "default 15000 45000: under and over the primary's NIC with the chain topology at 3 DCs",
    )
    g = ap.add_argument_group("redis and measurement")
    g.add_argument(
        "--topology",
        choices=["chain", "direct"],
        default="chain",
        help="chain: one WAN replica per DC feeds its DC (default); direct: all "
        "replicas from the primary",
    )
    g.add_argument("--port", type=int, default=6390, help="redis port in every namespace")
    g.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    g.add_argument("--poll-ms", type=float, default=10, help="replica poll period (default 10)")
    g.add_argument(
        "--drain",
        type=float,
        default=60,
        help="max seconds to wait after the last write for replicas to catch up (default 60)",
    )
    g.add_argument(
        "--python",
        default=sys.executable,
        help="python with NetfilterQueue, for the delay daemons and the writer (default: this one)",
    )
    ap.add_argument("--json", metavar="FILE", help="write the records there (default stdout)")
    ap.add_argument(
        "--raw",
        metavar="DIR",
        help="also save each run's commit and poll events (.npz, CLOCK_MONOTONIC µs) there",
    )
    args = ap.parse_args(argv)
    check_workload_args(ap, args)
    if args.rows > 10**7:
        ap.error("--rows must be <= 10^7 (keys are 7 digits)")
    if args.poll_ms <= 0:
        ap.error("--poll-ms must be > 0")
    if not (1 <= args.port <= 65535):
        ap.error("--port must be in 1..65535")
    if shutil.which(args.redis_server) is None:
        ap.error(f"no redis-server ({args.redis_server}): run `make wan-deps`")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_sweep(args, run_rate, log, idle_box_pct(1.0))


if __name__ == "__main__":
    sys.exit(main())
