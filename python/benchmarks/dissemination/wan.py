"""The emulated WAN of ``shared/tools/wan/wan2.sh`` as a context manager.

``with Wan(WanConfig(3, 3, 50, 48, 25)) as w:`` runs ``wan2.sh up`` (one netns per server,
``ek-s<dc>-<k>`` at 198.18.<dc>.<k>, behind one router netns per DC, ``ek-r<dc>``) and always
``wan2.sh down`` on the way out, even when ``up`` failed half-way. The scripts are found at
``$EMBSTORE_WAN_TOOLS`` or ``<repo>/../shared/tools/wan``. :class:`WanUnavailable` says why the
WAN cannot be built here (not root, no ``ip netns``, scripts or ``iptables-legacy`` missing, no
``NetfilterQueue`` for the delay daemon); tests skip on it.

WAN bytes are read from the htb class counters of each router's uplink (``tc -s class show dev
wan0`` in ``ek-r<i>``): ``wan2.sh`` gives every destination DC ``j`` its own class ``1:j``, which
only packets from DC ``i``'s servers to DC ``j``'s servers enter. A packet crosses the WAN by
leaving exactly one router's uplink, so summing those classes over all routers counts every WAN
crossing once (a packet is counted on the sending side, including its IP and Ethernet headers;
ARP and router-local traffic go to the default class 1:999 and are not counted).
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[3]
CLONE_NEWNET = 0x40000000
_CLASS_SENT = re.compile(r"^class htb (\S+) .*\n\s+Sent (\d+) bytes", re.MULTILINE)


class WanUnavailable(RuntimeError):  # noqa: N818 (the name the harness documents)
    """The emulated WAN cannot be built on this machine (the message says why)."""


@dataclass(frozen=True)
class WanConfig:
    """``wan2.sh up NDC SERVERS NIC WAN ONE_WAY_MS [SLOW_SRC SLOW_DST SLOW_MBIT]`` with ``QMS``."""

    dcs: int = 3
    servers: int = 3
    nic_mbit: float = 50
    wan_mbit: float = 48
    one_way_ms: float = 25
    slow: tuple[int, int, float] | None = None
    qms: int = 100
    #: Every link's MTU after ``wan2.sh up`` (None: the script's 60000). A jumbo MTU keeps the
    #: delay daemons' packet rate low, but on a slow link one TCP send unit (at least two
    #: segments) holds hundreds of ms of the link: small flows wait behind it. 1500: a WAN's.
    mtu: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.dcs <= 250 or not 1 <= self.servers <= 250:
            raise ValueError(f"dcs and servers must be in 1..250, got {self.dcs}, {self.servers}")
        if not self.nic_mbit > 0 or not self.wan_mbit > 0 or self.one_way_ms < 0:
            raise ValueError("nic_mbit and wan_mbit must be > 0 and one_way_ms >= 0")
        if self.mtu is not None and not 576 <= self.mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {self.mtu}")
        if self.slow is not None:
            src, dst, mbit = self.slow
            if not (1 <= src <= self.dcs and 1 <= dst <= self.dcs and src != dst and mbit > 0):
                raise ValueError(f"slow link must be SRC DST MBIT of two DCs, got {self.slow}")

    def up_args(self) -> list[str]:
        args = [str(self.dcs), str(self.servers), f"{self.nic_mbit:g}", f"{self.wan_mbit:g}"]
        args.append(f"{self.one_way_ms:g}")
        if self.slow is not None:
            args += [str(self.slow[0]), str(self.slow[1]), f"{self.slow[2]:g}"]
        return args


def tools_dir() -> pathlib.Path:
    """Where ``wan2.sh`` and ``delayd.py`` are: ``$EMBSTORE_WAN_TOOLS`` or ../shared/tools/wan."""
    env = os.environ.get("EMBSTORE_WAN_TOOLS")
    return pathlib.Path(env) if env else REPO.parent / "shared" / "tools" / "wan"


def check_available(python: str = sys.executable) -> pathlib.Path:
    """Raise :class:`WanUnavailable` unless the WAN can be built; return the tools folder."""
    if os.geteuid() != 0:
        raise WanUnavailable("the emulated WAN needs root (network namespaces, tc, iptables)")
    tools = tools_dir()
    for name in ("wan2.sh", "delayd.py", "tcping.py"):
        if not (tools / name).is_file():
            raise WanUnavailable(f"{tools / name} is missing (set EMBSTORE_WAN_TOOLS)")
    for tool in ("ip", "tc", "iptables-legacy"):
        if shutil.which(tool) is None:
            raise WanUnavailable(f"`{tool}` is not installed: run `make wan-deps`")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise WanUnavailable(f"`ip netns` does not work here: {probe.stderr.strip()}")
    nfq = subprocess.run([python, "-c", "import netfilterqueue"], capture_output=True)
    if nfq.returncode != 0:
        raise WanUnavailable(f"{python} has no NetfilterQueue module: run `make wan-deps`")
    return tools


def ek_namespaces() -> list[str]:
    """The ``ek-*`` network namespaces that exist now (none should outlive a run)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith("ek-")]


def server_ns(dc: int, k: int) -> str:
    return f"ek-s{dc}-{k}"


def server_addr(dc: int, k: int) -> str:
    return f"198.18.{dc}.{k}"


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Stop ``proc`` by its PID: SIGTERM to its process group (it was started in a session of
    its own), then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout)


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def netns_socket(ns: str) -> socket.socket:
    """A TCP socket created inside network namespace ``ns`` (this thread switches into it only
    to create the socket; the socket stays there)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def netns_connect(ns: str, addr: tuple[str, int], timeout: float = 10.0) -> socket.socket:
    """A TCP connection from inside namespace ``ns``, retried until ``timeout`` while refused
    (the server is starting). Used to reach a server on its namespace's loopback without
    crossing any shaped link."""
    deadline = time.monotonic() + timeout
    while True:
        sock = netns_socket(ns)
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect(addr)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Wan:
    """The emulated WAN (see the module doc). Use as a context manager."""

    def __init__(self, cfg: WanConfig, python: str = sys.executable, log=None) -> None:
        self.cfg = cfg
        self.python = python
        self.log = log or (lambda msg: None)
        self.tools: pathlib.Path | None = None
        self.procs: list[subprocess.Popen] = []

    def _script(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, PY=self.python, QMS=str(self.cfg.qms))
        return subprocess.run(
            ["bash", str(self.tools / "wan2.sh"), *args], env=env, capture_output=True, text=True
        )

    def __enter__(self) -> Wan:
        self.tools = check_available(self.python)
        left = ek_namespaces()
        if left:
            raise WanUnavailable(
                f"ek-* namespaces already exist ({' '.join(left)}): another "
                "run is active, or run `wan2.sh down` for a stale one"
            )
        t0 = time.monotonic()
        try:
            up = self._script("up", *self.cfg.up_args())
            if up.returncode != 0:
                raise RuntimeError(
                    f"wan2.sh up {' '.join(self.cfg.up_args())} failed:\n{up.stderr.strip()}"
                )
            if self.cfg.mtu is not None:
                self._set_mtu(self.cfg.mtu)
            if self.cfg.one_way_ms > 0:
                self._wait_delayd()
        except BaseException:
            self.down()
            raise
        self.log(
            f"WAN up: {self.cfg.dcs} DCs x {self.cfg.servers} servers, NIC "
            f"{self.cfg.nic_mbit:g} Mbit, WAN {self.cfg.wan_mbit:g} Mbit, one-way "
            f"{self.cfg.one_way_ms:g} ms, QMS {self.cfg.qms}"
            + (f", MTU {self.cfg.mtu}" if self.cfg.mtu else "")
            + f" ({time.monotonic() - t0:.1f} s)"
        )
        return self

    @staticmethod
    def _set_mtu(mtu: int) -> None:
        """Every link but loopback in every ``ek-*`` namespace at ``mtu`` (bridges last, as
        they follow their ports)."""
        for ns in ek_namespaces():
            out = subprocess.run(
                ["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True, check=True
            ).stdout
            links = [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()]
            links = [x for x in links if x != "lo"]
            links.sort(key=lambda x: x in ("br0", "brs"))
            for link in links:
                subprocess.run(
                    ["ip", "-n", ns, "link", "set", "dev", link, "mtu", str(mtu)], check=True
                )

    def _wait_delayd(self, timeout: float = 10.0) -> None:
        """Wait until every DC's delay daemon has bound its queue (it prints one line)."""
        deadline = time.monotonic() + timeout
        for i in range(1, self.cfg.dcs + 1):
            logf = pathlib.Path(f"/tmp/ek-delayd-{i}.log")
            while not (logf.exists() and "delayd: queue" in logf.read_text()):
                if time.monotonic() > deadline:
                    text = logf.read_text() if logf.exists() else "(no log)"
                    raise RuntimeError(f"delay daemon of DC {i} did not start: {text}")
                time.sleep(0.05)

    def delayd_pids(self) -> list[int]:
        pids = []
        for i in range(1, self.cfg.dcs + 1):
            f = pathlib.Path(f"/tmp/ek-delayd-{i}.pid")
            if f.exists():
                pids.append(int(f.read_text().strip()))
        return pids

    def down(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
        self.procs.clear()
        if self.tools is not None:
            self._script("down", str(self.cfg.dcs), str(self.cfg.servers))

    def __exit__(self, *exc) -> None:
        t0 = time.monotonic()
        self.down()
        left = ek_namespaces()
        self.log(
            f"WAN down ({time.monotonic() - t0:.2f} s)"
            + (f"; LEFT OVER: {' '.join(left)}" if left else "")
        )

    def spawn(self, dc: int, k: int, argv: list[str], **popen) -> subprocess.Popen:
        """Start ``argv`` inside server ``(dc, k)``'s namespace, in a session of its own (so
        :func:`stop_process` stops its whole group); it is stopped when the WAN goes down."""
        if not (1 <= dc <= self.cfg.dcs and 1 <= k <= self.cfg.servers):
            raise ValueError(f"no server ({dc}, {k}) in {self.cfg.dcs} x {self.cfg.servers}")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", server_ns(dc, k), *argv], start_new_session=True, **popen
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        stop_process(proc)
        if proc in self.procs:
            self.procs.remove(proc)

    def tcp_counters(self, ns: str) -> dict[str, int]:
        """TCP loss counters of namespace ``ns`` so far (retransmitted segments, retransmission
        time-outs, tail-loss probes): where a small flow's latency goes when packets drop."""
        names = ["TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes"]
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "nstat", "-asz", *names], capture_output=True, text=True
        ).stdout
        got = {}
        for ln in out.splitlines():
            parts = ln.split()
            if len(parts) >= 2 and parts[0] in names:
                got[parts[0]] = int(parts[1])
        return got

    def wan_drops(self, src: int) -> int:
        """Packets DC ``src``'s WAN queues dropped so far (every class's bfifo)."""
        out = subprocess.run(
            ["ip", "netns", "exec", f"ek-r{src}", "tc", "-s", "qdisc", "show", "dev", "wan0"],
            capture_output=True,
            text=True,
        ).stdout
        drops = 0
        for ln in out.splitlines():
            if "dropped" in ln:
                drops += int(ln.split("dropped")[1].split(",")[0].strip())
        return drops

    def wan_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes sent so far on each DC-pair link ``(src_dc, dst_dc)`` (htb class ``1:dst`` on
        ``ek-r<src>``'s uplink); their sum counts every WAN crossing once."""
        out: dict[tuple[int, int], int] = {}
        for i in range(1, self.cfg.dcs + 1):
            res = subprocess.run(
                ["ip", "netns", "exec", f"ek-r{i}", "tc", "-s", "class", "show", "dev", "wan0"],
                capture_output=True,
                text=True,
                check=True,
            )
            # iproute2 of Debian 12 prints no JSON for htb classes: parse the text form.
            for handle, sent in _CLASS_SENT.findall(res.stdout):
                # wan2.sh names DC j's class "1:$j" and tc reads that as hex; it prints it back
                # with the same digits, so the decimal reading of the minor is j again.
                major, minor = handle.split(":")
                j = int(minor) if minor.isdigit() else 0
                if major == "1" and 1 <= j <= self.cfg.dcs and j != i:
                    out[(i, j)] = int(sent)
        return out


def add_network_args(ap) -> None:
    """The ``wan2.sh`` flags every dissemination benchmark takes (an argparse group)."""
    g = ap.add_argument_group("network (wan2.sh)")
    g.add_argument("--dcs", type=int, default=3, help="data centres, DC 1 trains (default 3)")
    g.add_argument("--servers", type=int, default=3, help="servers per DC (default 3)")
    g.add_argument("--nic", type=float, default=50, help="per-server NIC Mbit/s (default 50)")
    g.add_argument("--wan", type=float, default=48, help="per DC-pair WAN Mbit/s (default 48)")
    g.add_argument("--one-way-ms", type=float, default=25, help="one-way WAN delay (default 25)")
    g.add_argument(
        "--slow",
        nargs=3,
        type=float,
        metavar=("SRC", "DST", "MBIT"),
        help="one slower DC pair, e.g. 1 2 12.8 (the heterogeneous runs)",
    )
    g.add_argument("--qms", type=int, default=100, help="WAN queue bound in ms (default 100)")
    g.add_argument(
        "--mtu",
        type=int,
        default=None,
        help="every link's MTU (default: wan2.sh's 60000; 1500 as on a WAN)",
    )


def config_from_args(args) -> WanConfig:
    """The :class:`WanConfig` of :func:`add_network_args`' flags (ValueError if invalid)."""
    slow = None if args.slow is None else (int(args.slow[0]), int(args.slow[1]), args.slow[2])
    return WanConfig(
        args.dcs,
        args.servers,
        args.nic,
        args.wan,
        args.one_way_ms,
        slow=slow,
        qms=args.qms,
        mtu=getattr(args, "mtu", None),
    )


def pair_delta(before: dict, after: dict) -> dict[str, int]:
    """WAN bytes per DC pair between two :meth:`Wan.wan_bytes` readings, keyed ``"i->j"``."""
    return {f"{i}->{j}": after[(i, j)] - before.get((i, j), 0) for (i, j) in after}


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_sweep(args, run_rate, log, idle_pct) -> int:
    """The common ``main`` of the benchmarks: build the WAN of ``args``' network flags, call
    ``run_rate(w, args, rate)`` for each of ``args.rates`` (a dict each), add the network, the
    box CPU before the run (``idle_pct``) and the machine record, and write the records to
    ``args.json`` (or stdout). SIGTERM and SIGINT unwind through the ``finally`` blocks, so
    every process is stopped and the namespaces removed. Returns the exit code."""
    from lib.records import run_record

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_available(args.python)
    except WanUnavailable as e:
        print(f"error: the emulated WAN is unavailable: {e}", file=sys.stderr)
        return 2
    log(f"box CPU before the run (other work on the machine): {idle_pct} %")
    records = []
    try:
        with Wan(cfg, python=args.python, log=log) as w:
            for rate in args.rates:
                rec = run_rate(w, args, rate)
                rec.update(network=dict(cfg.__dict__), box_cpu_before_pct=idle_pct, **run_record())
                records.append(rec)
                if args.json:  # keep what is done if a later rate fails
                    pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    except WanUnavailable as e:
        print(f"error: the emulated WAN is unavailable: {e}", file=sys.stderr)
        return 2
    text = json.dumps(records, indent=1)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
        log(f"wrote {args.json}")
    else:
        print(text)
    return 0
