#!/usr/bin/env python3
"""Runs the unsafe code of the index and the table engine under valgrind memcheck.

Miri cannot be installed on our machines, so valgrind stands in for it: it catches invalid
reads and writes, use after free and branches on uninitialised memory in the compiled test
binaries (it cannot see Rust aliasing rules, which only Miri checks).

Parts
- ``SELECTION``: which test binary of which crate, and which of its tests, run under memcheck.
  The unsafe code is NeighborHash's buckets, batched probes and mapped memory
  (``embstore-index``), and in ``embstore-table`` the row arenas, the shared output of batched
  lookups, the scoped worker pool, the aligned buffers and io_uring/pread reads of the I/O
  engine, and the tier that drives them. The selection reaches each of those through tests of
  the public API or unit tests named by module, and leaves out the tests that are slow only
  because they are big (memory-return and structure sweeps): under valgrind a test runs 20 to
  50 times slower, and the whole step should take 2 to 3 minutes on 2 cores.
- The binaries are built with ``cargo test --no-run --message-format=json``, whose artifact
  records give their paths; ``--list`` then checks that every filter still names a test, so a
  renamed or moved test fails this script loudly instead of silently dropping out of it.

Invariants
- Exit status 1 when valgrind reports any error (``--error-exitcode=1``) or a test fails;
  2 when a selected test no longer exists. Leaks are not checked: test harness threads and
  process-wide pools outlive ``main`` by design.
- Property tests run few cases (``PROPTEST_CASES``, default 8 here), except where a test fixes
  its own count in code.

Usage: ``python3 scripts/memcheck.py [--cases N] [--list]`` from the repository root
(``make memcheck`` installs valgrind first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (crate, test target ("lib" for the unit tests), test filters, exact?)
# Substring filters on unit tests name modules, so that a file moved into a folder
# (`arena` -> `shard::arena`) still matches; integration tests are named exactly.
SELECTION: list[tuple[str, str, list[str], bool]] = [
    # NeighborHash: buckets, SIMD/scalar probes, batched lookups, mapped memory.
    ("embstore-index", "lib", [], False),
    # Model-based: inserts, growth, deletes and rejected payloads against a HashMap.
    ("embstore-index", "model", [], False),
    # Arenas (chunk growth, huge mappings, truncation), the scoped pool, the I/O engine's
    # aligned buffers and reads, and read planning for cold records.
    ("embstore-table", "lib", ["arena", "sched", "disk::io", "disk::plan"], False),
    # Batched lookups and steps over many shards write through the shared output (`batch`,
    # `lookup`), checked against a model.
    ("embstore-table", "model", [], False),
    (
        "embstore-table",
        "table",
        [
            "serving_lookups_store_nothing",
            "the_first_missing_id_is_named_in_batch_order",
            "bad_input_is_a_typed_error_and_changes_nothing",
            "assign_and_import_metadata_and_state",
        ],
        True,
    ),
    # The tier: eviction to segments, faulting rows back in through the I/O engine.
    (
        "embstore-table",
        "tier",
        [
            "a_reopened_tiered_store_reads_only_what_it_uses",
            "random_sequences_with_checkpoints_restores_and_compactions_match_the_model",
        ],
        True,
    ),
    # Old files of every format, read back through segments and checkpoints.
    ("embstore-table", "formats", [], False),
]

VALGRIND = [
    "valgrind",
    "--quiet",
    "--tool=memcheck",
    "--error-exitcode=1",
    "--leak-check=no",
]


def build(crates: list[str]) -> dict[tuple[str, str], str]:
    """Builds the test binaries of `crates`; returns (crate, target) -> path of the binary."""
    cmd = ["cargo", "test", "--locked", "--no-run", "--message-format=json"]
    for c in crates:
        cmd += ["-p", c]
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    paths: dict[tuple[str, str], str] = {}
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        crate = Path(msg["manifest_path"]).parent.name
        kind = msg["target"]["kind"]
        target = "lib" if "lib" in kind or "rlib" in kind else msg["target"]["name"]
        paths[(crate, target)] = msg["executable"]
    return paths


def tests_of(binary: str) -> list[str]:
    """The test names in `binary` (libtest's `--list`)."""
    out = subprocess.run(
        [binary, "--list", "--format=terse"], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return [line[: -len(": test")] for line in out.splitlines() if line.endswith(": test")]


def check_filters(crate: str, target: str, binary: str, filters: list[str], exact: bool) -> int:
    """How many tests the filters select; exits 2 when one of them selects none."""
    names = tests_of(binary)
    if not filters:
        return len(names)
    picked = set()
    for f in filters:
        hits = [n for n in names if (n == f if exact else f in n)]
        if not hits:
            sys.exit(
                f"memcheck: filter {f!r} names no test in {crate}'s {target} tests: the test "
                "was renamed or moved; update SELECTION in scripts/memcheck.py"
            )
        picked.update(hits)
    return len(picked)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=8, help="PROPTEST_CASES (default 8)")
    ap.add_argument("--list", action="store_true", help="print the selection and exit")
    args = ap.parse_args()
    if shutil.which("valgrind") is None and not args.list:
        sys.exit("memcheck: valgrind not found (`make memcheck` installs it from Debian)")
    crates = sorted({c for c, *_ in SELECTION})
    paths = build(crates)
    env = dict(os.environ, PROPTEST_CASES=str(args.cases), RUST_BACKTRACE="1")
    failed = []
    start = time.monotonic()
    for crate, target, filters, exact in SELECTION:
        binary = paths.get((crate, target))
        if binary is None:
            sys.exit(f"memcheck: no test binary {target!r} in {crate}: update SELECTION")
        n = check_filters(crate, target, binary, filters, exact)
        label = f"{crate} {target}" + (f" ({n} tests)" if filters else f" (all {n} tests)")
        if args.list:
            print(label)
            continue
        cmd = VALGRIND + [binary, "--quiet", *filters] + (["--exact"] if exact else [])
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT / "crates" / crate, env=env).returncode
        status = "ok" if rc == 0 else f"FAILED (exit {rc})"
        print(f"==> memcheck {label}: {status} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(label)
    if args.list:
        return 0
    print(
        f"==> memcheck: {len(SELECTION) - len(failed)}/{len(SELECTION)} binaries clean "
        f"in {time.monotonic() - start:.0f} s"
    )
    if failed:
        print("memcheck: errors or failures in: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
