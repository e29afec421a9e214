"""embstore's dissemination (sync port -> followers) over the emulated WAN, measured like the
Redis peer (``redis_peer.py``): same network, trace, latency definition, WAN counters and CPU.

The training store runs in DC 1 server 1 (``ek-s1-1``) with its writer in the same process
(``ekko_writer.py``: ``Table.assign`` of the trace in batch windows, the store's sync port on
``198.18.1.1:<sync-port>``). Every other server runs a follower, ``python -m embstore serve
--follow ... --sync-events FILE`` (an in-memory copy that serves lookups meanwhile).
``--topology dc-leader`` (the default, the fair match of Redis ``chain``): DC 1's other servers
follow the primary; in every other DC server 1 follows the primary across the WAN and exposes
its copy (``--sync-listen``), and the DC's other servers follow it (one WAN copy per DC).
``--topology direct``: every follower pulls from the primary. Unlike the Redis peer, DC 1's
other servers hold replicas too (they count in the latency, and their pulls share the primary's
NIC with the WAN ones); ``--no-dc1-followers`` leaves them out, as the Redis peer does.

The ablation of spec section 9 (A0 "VV only" -> A1 + cache -> A2 + shard versions -> A3 +
dc-leader): ``--source-no-cache`` makes the primary (and the DC leaders) answer every pull by a
scan, ``--no-shard-versions`` makes every follower pull every part every round
(``--sync-no-shard-versions``), ``--cold-tables N`` gives the primary N idle-ish tables
(``ekko_writer.py``); ``--ablation A0|A1|A2|A3`` sets the three switches and the topology.

An update (row ``k`` written with version ``v``, in sync part ``p``) is visible at a follower at
its first event with part ``p`` and newest timestamp >= ``v``; its latency is the max over all
followers of (visible - commit), commit = the writer's wall clock after ``assign`` returned
(``latency.row_latencies``). Prints one JSON record per rate (stdout or ``--json FILE``),
progress on stderr.

Needs root, ``make wan-deps`` (iptables, NetfilterQueue) and ../shared/tools/wan.
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
# The ablation steps of spec section 9: (topology, source cache, shard versions).
ABLATION = {
    "A0": ("direct", False, False),
    "A1": ("direct", True, False),
    "A2": ("direct", True, True),
    "A3": ("dc-leader", True, True),
}


def upstream(topology: str, dc: int, k: int) -> tuple[int, int]:
    """The server whose sync port the follower on ``(dc, k)`` pulls from."""
    return (1, 1) if topology == "direct" or dc == 1 or k == 1 else (dc, 1)


def is_leader(topology: str, dc: int, k: int) -> bool:
    """Whether ``(dc, k)`` exposes its copy for its DC (``--sync-listen``)."""
    return topology == "dc-leader" and dc > 1 and k == 1


def name(s: tuple[int, int]) -> str:
    return f"s{s[0]}-{s[1]}"


class Events:
    """A follower's ``--sync-events`` file, read as it grows: all events of the hot table so
    far (the idle tables' are left out) and, per part, the newest timestamp the follower knows."""

    def __init__(self, path: pathlib.Path, parts: int) -> None:
        self.path, self.pos, self.chunks = path, 0, []
        self.known = np.zeros(parts, dtype=np.uint64)
        self.last_t_us = 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                raw = f.read()
        except FileNotFoundError:
            return
        ev = latency.read_events(raw)
        if len(ev):
            self.pos += len(ev) * latency.EVENT_DTYPE.itemsize
            ev = latency.of_table(ev, "hot")
        if len(ev):
            self.chunks.append(ev.copy())
            np.maximum.at(self.known, ev["part"].astype(np.int64), ev["newest_ts"])
            self.last_t_us = int(ev["t_us"].max())

    def all(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else latency.read_events(b"")


class Cluster:
    """The primary (with its writer) and the followers of one run, started in the WAN's
    namespaces and stopped by PID; their stdout and stderr go to files in a temporary folder
    (kept in ``--raw`` when given)."""

    def __init__(self, w: Wan, args, trace) -> None:
        self.w, self.args, self.trace = w, args, trace
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="ek-embstore-"))
        self.primary: subprocess.Popen | None = None
        self.procs: dict[tuple[int, int], subprocess.Popen] = {}
        self.events: dict[tuple[int, int], Events] = {}
        in_dc1 = [] if args.no_dc1_followers else [(1, k) for k in range(2, w.cfg.servers + 1)]
        self.replicas = in_dc1 + [
            (d, k) for d in range(2, w.cfg.dcs + 1) for k in range(1, w.cfg.servers + 1)
        ]
        self.parts = 0
        self.batches = 0

    def _ask(self, line: str, timeout: float = 30.0) -> str:
        """Send a command to the writer and return its answer line."""
        self.primary.stdin.write(line + "\n")
        self.primary.stdin.flush()
        return self._read(timeout)

    def _read(self, timeout: float) -> str:
        ready, _, _ = select.select([self.primary.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"the writer did not answer within {timeout:g} s")
        line = self.primary.stdout.readline()
        if not line:
            raise RuntimeError(f"the writer exited ({self.primary.wait()}): {self.tail('writer')}")
        return line.strip()

    def tail(self, what: str, lines: int = 8) -> str:
        f = self.dir / f"{what}.err"
        return "\n".join(f.read_text().splitlines()[-lines:]) if f.exists() else "(no log)"

    def _follower(self, s: tuple[int, int]) -> None:
        dc, k = s
        up = upstream(self.args.topology, dc, k)
        ev = self.dir / f"events-{name(s)}.bin"
        argv = [self.w.python, "-m", "embstore", "serve", "--listen"]
        argv += [f"{server_addr(dc, k)}:{self.args.port}"]
        argv += ["--follow", f"{server_addr(*up)}:{self.args.sync_port}", "--sync-events", str(ev)]
        if is_leader(self.args.topology, dc, k):
            argv += ["--sync-listen", f"{server_addr(dc, k)}:{self.args.sync_port}"]
            if self.args.source_no_cache:
                argv += ["--sync-no-cache"]
        if self.args.no_shard_versions:
            argv += ["--sync-no-shard-versions"]
        if getattr(self.args, "follower_priority", None):
            argv += ["--priority", self.args.follower_priority]
        out = open(self.dir / f"{name(s)}.out", "w")
        err = open(self.dir / f"{name(s)}.err", "w")
        self.procs[s] = self.w.spawn(
            dc, k, argv, stdout=out, stderr=err, env=follower_env(self.args)
        )
        out.close()
        err.close()
        self.events[s] = Events(ev, self.parts)

    def _wait_up(self, servers: list[tuple[int, int]], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for s in servers:
            out = self.dir / f"{name(s)}.out"
            while "embstore serve:" not in (out.read_text() if out.exists() else ""):
                if self.procs[s].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"follower {name(s)} did not start (exit {self.procs[s].poll()}):\n"
                        + self.tail(name(s))
                    )
                time.sleep(0.05)

    def start(self, timeout: float = 60.0) -> None:
        argv = [self.w.python, str(HERE / "ekko_writer.py")]
        argv += ["--listen", f"{server_addr(1, 1)}:{self.args.sync_port}"]
        argv += ["--trace", json.dumps(self.trace.as_dict()), "--out", str(self.dir / "w.npz")]
        argv += ["--parts", str(self.args.parts), "--cold-tables", str(self.args.cold_tables)]
        if self.args.source_no_cache:
            argv += ["--no-cache"]
        if getattr(self.args, "warm_share", 0.0):
            argv += ["--warm-share", str(self.args.warm_share)]
        if getattr(self.args, "priority_k", None):
            argv += ["--priority", str(self.args.priority_k)]
        err = open(self.dir / "writer.err", "w")
        self.primary = self.w.spawn(
            1, 1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
        err.close()
        ready = self._read(120.0).split()
        if ready[0] != "ready":
            raise RuntimeError(f"writer failed to start: {ready}")
        self.batches, self.parts = int(ready[1]), int(ready[2])
        # DC leaders first (their DC's followers pull from them), then everyone else.
        leaders = [s for s in self.replicas if is_leader(self.args.topology, *s)]
        for s in leaders:
            self._follower(s)
        self._wait_up(leaders, timeout)
        rest = [s for s in self.replicas if s not in leaders]
        for s in rest:
            self._follower(s)
        self._wait_up(rest, timeout)
        # Settled = a warm-up row reaches every follower within a second, twice in a row.
        deadline = time.monotonic() + timeout
        settled, i = 0, 0
        while settled < 2:
            part, ts = (int(x) for x in self._ask(f"warm {i}").split()[1:])
            i += 1
            t_warm = time.monotonic()
            behind = self.replicas
            while behind and time.monotonic() - t_warm < 1.0:
                for e in self.events.values():
                    e.poll()
                behind = [s for s in self.replicas if self.events[s].known[part] < ts]
                time.sleep(0.02)
            settled = 0 if behind else settled + 1
            if time.monotonic() > deadline:
                tails = "".join(f"\n--- {name(s)}:\n" + self.tail(name(s)) for s in behind[:3])
                raise RuntimeError(f"followers not in sync after {timeout:.0f} s: {behind}{tails}")
            time.sleep(1.0)

    def stderr_report(self) -> dict[str, str]:
        """The followers' (and the writer's) non-empty stderr, last lines each."""
        out = {}
        for f in sorted(self.dir.glob("*.err")):
            text = f.read_text().strip()
            if text:
                out[f.stem] = "\n".join(text.splitlines()[-8:])
        return out

    def stop(self, keep: pathlib.Path | None) -> None:
        for proc in self.procs.values():
            self.w.stop(proc)
        if self.primary is not None:
            self.w.stop(self.primary)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for f in self.dir.glob("*.out"):
                shutil.copy(f, keep / f.name)
            for f in self.dir.glob("*.err"):
                shutil.copy(f, keep / f.name)
        shutil.rmtree(self.dir, ignore_errors=True)


def follower_env(args) -> dict[str, str]:
    """The followers' environment: the sync protocol they offer (``--sync-protocol``: 5 is the
    wire before packed, compressed answers) and the precision of the values they ask for
    (``--sync-precision f16``: lossy, protocol 6)."""
    env = dict(os.environ)
    if args.sync_protocol is not None:
        env["EMBSTORE_SYNC_PROTOCOL"] = str(args.sync_protocol)
    if args.sync_precision is not None:
        env["EMBSTORE_SYNC_PRECISION"] = args.sync_precision
    return env


BYTE_COUNTERS = (
    "bytes_in",
    "bytes_out",
    "bytes_out_raw",
    "frames_out",
    "packed_out",
    "changed_bytes",
    "part_bytes",
    "part_rows",
    "value_bytes",
)


def wire_breakdown(before: dict, after: dict, updates: int) -> dict:
    """Where the primary's sync bytes went over the run, per update (all its followers:
    the WAN leaders and, unless ``--no-dc1-followers``, DC 1's): what it received (lists,
    pulls), what it sent on the wire and would have sent unpacked, change lists' and parts'
    bodies, the rows and value bytes in them, the frames sent.

    >>> wire_breakdown({"bytes_out": 10, "part_rows": 1}, {"bytes_out": 30, "part_rows": 3}, 10)
    {'bytes_out': 2.0, 'part_rows': 0.2}
    """
    u = max(1, updates)
    return {c: round((after[c] - before.get(c, 0)) / u, 2) for c in BYTE_COUNTERS if c in after}


def table_stats_delta(before: dict | None, after: dict | None) -> dict:
    """The source's ``Table.sync_stats()`` counters over the run (after - before, per table),
    and their sum over the tables as ``all``.

    >>> table_stats_delta({"t": {"pulls_cached": 1, "d_prop_ms": 5}},
    ...                   {"t": {"pulls_cached": 4, "d_prop_ms": 7}})
    {'t': {'pulls_cached': 3}, 'all': {'pulls_cached': 3}}
    """
    counters = ("pulls_cached", "pulls_scanned", "rows_sent")
    out: dict[str, dict] = {}
    for name, a in (after or {}).items():
        b = (before or {}).get(name) or {}
        if a:
            out[name] = {c: a[c] - b.get(c, 0) for c in counters if c in a}
    present = [c for c in counters if any(c in t for t in out.values())]
    out["all"] = {c: sum(t.get(c, 0) for t in out.values()) for c in present}
    return out


def run_rate(w: Wan, args, rate: float) -> dict:
    trace = trace_for(args, rate)
    log(
        f"rate {rate:g} rows/s: trace seed {trace.seed}, {trace.updates} updates over "
        f"{trace.duration:g} s, Zipf({trace.zipf_a:g}) over {trace.rows} keys, D={trace.dim}"
    )
    cl = Cluster(w, args, trace)
    tag = f"embstore-{args.topology}-{w.cfg.dcs}x{w.cfg.servers}-{rate:g}"
    if w.cfg.one_way_ms != 25:
        tag += f"-{w.cfg.one_way_ms:g}ms"
    if args.no_dc1_followers:
        tag += "-nodc1"
    if args.ablation:
        tag += f"-{args.ablation}"
    if args.cold_tables:
        tag += f"-cold{args.cold_tables}"
    if args.sync_protocol is not None:
        tag += f"-p{args.sync_protocol}"
    if args.sync_precision is not None:
        tag += f"-{args.sync_precision}"
    keep = pathlib.Path(args.raw) / tag if args.raw else None
    exited: dict[str, int] = {}
    try:
        t0 = time.monotonic()
        cl.start()
        log(
            f"primary + {len(cl.replicas)} followers ({args.topology}) in sync "
            f"({time.monotonic() - t0:.1f} s)"
        )
        meter = CpuMeter()
        meter.watch("monitor", os.getpid())
        meter.watch("primary+writer", cl.primary.pid)
        for s, p in cl.procs.items():
            meter.watch(f"embstore-{name(s)}", p.pid)
        for i, pid in enumerate(w.delayd_pids(), 1):
            meter.watch(f"delayd-{i}", pid)
        port0 = json.loads(cl._ask("stats"))
        bytes0 = w.wan_bytes()
        meter.start()
        cl.primary.stdin.write("go\n")
        cl.primary.stdin.flush()
        t_go = time.monotonic()
        done = None
        final = None
        next_log = t_go + 5
        drain_deadline = None
        while True:
            t_round = time.monotonic()
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
                log(
                    f"writer done: {done['elapsed_s']:.1f} s, {done['batches_late_100ms']} "
                    "batches sent > 100 ms late; draining"
                )
            if final is not None and all((e.known >= final).all() for e in cl.events.values()):
                break
            if drain_deadline is not None and time.monotonic() > drain_deadline:
                log(f"drain timeout ({args.drain:g} s): some followers never caught up")
                break
            if time.monotonic() > next_log:
                next_log += 5
                now_ms = time.time_ns() // 1_000_000
                lag = max(now_ms - (int(e.known.max()) >> 16) for e in cl.events.values())
                log(
                    f"  t={time.monotonic() - t_go:5.1f} s: newest row at the slowest follower "
                    f"{lag / 1e3:.2f} s old"
                )
            sleep = 0.02 - (time.monotonic() - t_round)
            if sleep > 0:
                time.sleep(sleep)
        cpu = meter.stop()
        t_end = time.monotonic()
        bytes1 = w.wan_bytes()
        port1 = json.loads(cl._ask("stats"))
        for s, p in cl.procs.items():
            if p.poll() is not None:
                exited[name(s)] = p.returncode
        behind = {
            name(s): int((e.known < final).sum()) for s, e in cl.events.items() if final is not None
        }
        events = {name(s): e.all() for s, e in cl.events.items()}
    finally:
        errors = cl.stderr_report()
        cl.stop(keep)
    pair = pair_delta(bytes0, bytes1)
    wan_total = sum(pair.values())
    commit_us, rows = data["commit_us"], data["rows"]
    batch = np.repeat(np.arange(len(rows)), rows)
    lat, missing = latency.row_latencies(commit_us, batch, data["part"], data["ts"], events)
    res = latency.stats(lat, np.ones(len(lat), dtype=np.int64), missing, wan_total)
    res["batches"] = len(rows)
    res["window_means_5s"] = latency.window_means(commit_us[batch], lat, np.ones(len(lat)))
    res["updates_never_visible"] = res.pop("batches_never_visible")
    if keep is not None:
        np.savez_compressed(
            keep / "events.npz",
            commit_us=commit_us,
            rows=rows,
            part=data["part"],
            ts=data["ts"],
            **events,
        )
        log(f"raw events and follower logs in {keep}")
    per_dc = {}
    for dc in range(1, w.cfg.dcs + 1):
        sub = {n: a for n, a in events.items() if n.startswith(f"s{dc}-")}
        if sub:
            lat_dc, _ = latency.row_latencies(commit_us, batch, data["part"], data["ts"], sub)
            ok = ~np.isnan(lat_dc)
            per_dc[str(dc)] = round(float(lat_dc[ok].mean()), 4) if ok.any() else None
    nd, ns = w.cfg.dcs, w.cfg.servers
    sync_out = port1["bytes_out"] - port0["bytes_out"]
    run_s = t_end - t_go
    copies = (nd - 1) * (ns if args.topology == "direct" else 1)
    res.update(
        system="embstore",
        topology=args.topology,
        dc1_followers=not args.no_dc1_followers,
        ablation=args.ablation,
        source_cache=not args.source_no_cache,
        shard_versions=not args.no_shard_versions,
        cold_tables=args.cold_tables,
        parts=args.parts,
        rate_rows_s=rate,
        achieved_rows_s=round(
            res["updates"] / ((commit_us[-1] - commit_us[0]) / 1e6 + args.batch_ms / 1e3), 1
        ),
        duration_s=args.duration,
        run_s=round(run_s, 1),
        writer=done,
        per_dc_mean_s=per_dc,
        primary_sync_bytes_out=sync_out,
        primary_sync_bytes_per_update=round(sync_out / max(1, res["updates"]), 1),
        primary_sync_stats=port1,
        sync_protocol=args.sync_protocol,
        sync_precision=args.sync_precision or "f32",
        primary_wire_per_update=wire_breakdown(port0, port1, res["updates"]),
        source_table_stats_run=table_stats_delta(port0.get("tables"), port1.get("tables")),
        primary_nic_load=round(sync_out / run_s * 8 / (w.cfg.nic_mbit * 1e6), 3),
        wan_copies_expected=copies,
        wan_bytes_forward=sum(v for k, v in pair.items() if k.startswith("1->")),
        wan_bytes_by_pair=pair,
        parts_behind_at_end=behind,
        followers_exited=exited,
        stderr=errors,
        rho_spec=round(rho(rate * 122, nd * ns, ns, w.cfg.nic_mbit), 3),
        rho_2pc=round(twopc.rho_2pc(rate, trace.dim, nd * ns, w.cfg.nic_mbit), 3),
        cpu=cpu,
        discarded=cpu["discarded"],
        trace=trace.as_dict(),
    )
    log(
        f"rate {rate:g}: mean {res.get('mean_s')} s, p99 {res.get('p99_s')} s, WAN "
        f"{wan_total / 1e6:.1f} MB = {res['wan_bytes_per_update']} B/update, primary sync "
        f"{sync_out / 1e6:.1f} MB, box CPU {cpu['box_pct']} %, all processes "
        f"{cpu['all_processes_pct']} %, own {cpu['own_pct_of_box']} %"
        + (" DISCARD" if cpu["discarded"] else "")
        + (f"; {missing} updates never visible" if missing else "")
        + (f"; followers exited: {exited}" if exited else "")
        + (f"; stderr from {', '.join(errors)}" if errors else "")
    )
    log(f"rate {rate:g}: primary sync per update {res['primary_wire_per_update']}")
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: ekko_peer.py --rates 15000 45000 --json /tmp/ekko.json  "
        "(3 DCs x 3, NIC 50, WAN 48 Mbit, 25 ms one-way, 30 s of updates per rate)",
    )
    add_network_args(ap)
    add_workload_args(
        ap, [15000, 45000], "default 15000 45000: the Redis peer's, under and over its limit"
    )
    g = ap.add_argument_group("embstore and measurement")
    g.add_argument(
        "--topology",
        choices=["dc-leader", "direct"],
        default="dc-leader",
        help="dc-leader: one WAN follower per DC feeds its DC (default); direct: every "
        "follower pulls from the primary",
    )
    g.add_argument("--port", type=int, default=7000, help="followers' lookup port (default 7000)")
    g.add_argument("--sync-port", type=int, default=7100, help="sync port (default 7100)")
    g.add_argument(
        "--no-dc1-followers",
        action="store_true",
        help="no followers in DC 1's other servers (the Redis peer's layout: the primary's NIC "
        "carries only the WAN copies)",
    )
    g.add_argument("--parts", type=int, default=1024, help="sync parts per table (default 1024)")
    g.add_argument(
        "--rhos",
        type=float,
        nargs="+",
        help="loads instead of --rates: the NIC load 2PC would need at the primary "
        "(twopc.rho_2pc; the rates of twopc_peer.py --rhos)",
    )
    g.add_argument(
        "--source-no-cache",
        action="store_true",
        help="the primary and the DC leaders answer every pull by a scan (ablation)",
    )
    g.add_argument(
        "--no-shard-versions",
        action="store_true",
        help="followers pull every part every round (ablation)",
    )
    g.add_argument(
        "--warm-share",
        type=float,
        default=0.0,
        help="the hot table holds this share of the trace's keys before the run (default 0)",
    )
    g.add_argument(
        "--cold-tables",
        type=int,
        default=0,
        help="N extra tables of 2^16 rows with 1 %% of the updates together (default 0)",
    )
    g.add_argument(
        "--ablation",
        choices=list(ABLATION),
        help="A0: direct, no cache, no shard versions; A1: + cache; A2: + shard versions; "
        "A3: + dc-leader (sets --topology and the two switches)",
    )
    g.add_argument(
        "--sync-protocol",
        type=int,
        help="the sync protocol the followers offer (default: the build's; 5: every frame on "
        "its own, uncompressed, the wire before protocol 6)",
    )
    g.add_argument(
        "--sync-precision",
        choices=["f32", "f16"],
        help="the values' precision the followers ask for (protocol 6; f16 is lossy)",
    )
    g.add_argument(
        "--drain",
        type=float,
        default=30,
        help="max seconds to wait after the last write for followers to catch up (default 30)",
    )
    g.add_argument(
        "--python",
        default=sys.executable,
        help="python with embstore and NetfilterQueue, for the delay daemons, the primary and "
        "the followers (default: this one)",
    )
    ap.add_argument("--json", metavar="FILE", help="write the records there (default stdout)")
    ap.add_argument(
        "--raw",
        metavar="DIR",
        help="also keep each run's commits, per-row versions, follower events (.npz, µs since "
        "the epoch) and the followers' stdout/stderr there",
    )
    args = ap.parse_args(argv)
    if args.rhos:
        args.rates = [
            round(twopc.rate_for_rho_2pc(r, args.dim, args.dcs * args.servers, args.nic))
            for r in args.rhos
        ]
    if args.ablation:
        args.topology, cache, sv = ABLATION[args.ablation]
        args.source_no_cache, args.no_shard_versions = not cache, not sv
    check_workload_args(ap, args, min_dcs=1 if not args.no_dc1_followers else 2)
    if args.cold_tables < 0:
        ap.error("--cold-tables must be >= 0")
    for p in (args.port, args.sync_port):
        if not 1 <= p <= 65535:
            ap.error("--port and --sync-port must be in 1..65535")
    if args.parts < 1 or args.parts & (args.parts - 1):
        ap.error("--parts must be a power of two")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_sweep(args, run_rate, log, idle_box_pct(1.0))


if __name__ == "__main__":
    sys.exit(main())
