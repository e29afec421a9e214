"""CPU over a run, and the spec's discard rule (a run is not network-bound, so it is discarded,
when the box exceeds 70 % of its cores).

Three figures, because none is right alone on this machine: ``box_pct`` from ``/proc/stat`` is
tick-sampled (HZ=100 here) and misses work that wakes on a 10 ms cadence and sleeps again before
the next tick, which is what a pipelined writer, a poller and the servers they drive do;
``all_processes_pct`` sums the precise per-process times of every process alive at the end (it
misses processes that started and exited during the run, e.g. a compiler's short jobs); the run's
own processes are listed one by one. The discard rule takes the largest. Both box figures include
whatever else runs on the machine."""

from __future__ import annotations

import os
import time

DISCARD_ABOVE = 70.0
_TICK = os.sysconf("SC_CLK_TCK")


def _box() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already inside user/nice
    return total - idle, total


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _all_procs() -> dict[int, float]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            secs = proc_cpu_s(int(entry))
            if secs is not None:
                out[int(entry)] = secs
    return out


class CpuMeter:
    """Box CPU % (of all cores) and each named process's CPU % (of one core) between
    :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}

    def watch(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.box0 = _box()
        self.all0 = _all_procs()
        self.proc0 = {n: proc_cpu_s(p) for n, p in self.pids.items()}

    def stop(self, extra_cpu_s: dict[str, float] | None = None) -> dict:
        """The figures since :meth:`start`; ``extra_cpu_s`` adds CPU seconds of processes that
        already exited (they report their own)."""
        wall = time.monotonic() - self.t0
        busy1, total1 = _box()
        all1 = _all_procs()
        cores = os.cpu_count() or 1
        all_pct = sum(v - self.all0.get(p, 0.0) for p, v in all1.items()) / wall / cores * 100
        busy = (busy1 - self.box0[0]) / max(1, total1 - self.box0[1]) * 100
        procs = {}
        for name, pid in self.pids.items():
            a, b = self.proc0.get(name), proc_cpu_s(pid)
            if a is not None and b is not None:
                procs[name] = round((b - a) / wall * 100, 1)
        for name, secs in (extra_cpu_s or {}).items():
            procs[name] = round(secs / wall * 100, 1)
        own = sum(procs.values()) / cores
        return {
            "seconds": round(wall, 2),
            "cores": os.cpu_count(),
            "box_pct": round(busy, 1),
            "all_processes_pct": round(all_pct, 1),
            "own_pct_of_box": round(own, 1),
            "per_process_pct_of_core": procs,
            "discarded": max(busy, all_pct, own) > DISCARD_ABOVE,
        }


def idle_box_pct(seconds: float = 1.0) -> float:
    """Box CPU % over ``seconds`` before a run: what the rest of the machine is doing."""
    b0 = _box()
    time.sleep(seconds)
    b1 = _box()
    return round((b1[0] - b0[0]) / max(1, b1[1] - b0[1]) * 100, 1)
