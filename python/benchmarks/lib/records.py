"""Records of a benchmark run: progress lines, the commit and CPU
model for the machine record."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def git_commit() -> str:
    """The short commit of this checkout, or ``?``."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=pathlib.Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def run_record() -> dict[str, str]:
    """The date, machine (CPU model, core count, Python) and commit every result records."""
    return {
        "date": dt.date.today().isoformat(),
        "machine": f"{cpu_model()}, nproc {os.cpu_count()}, {platform.python_version()}",
        "commit": git_commit(),
    }


def finish(res: dict, args, goals, report) -> int:
    """The end of a benchmark's ``main``: judge the goals, then print JSON (``--json``) or the
    human report; returns the exit status."""
    res["goals"] = goals(res)
    log("done")
    if args.json:
        print(json.dumps(res))
    else:
        report(res)
    return 0
