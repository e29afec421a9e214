"""Dissemination across emulated data centres (network namespaces, 25 ms one-way WAN delay):
a primary in DC 1 writes continuously (``sync_writer.py``: every row encodes its key's write
count) while followers in other DCs (``sync_follower.py``: ``Store.follow``, a reader thread
doing lookups, its ``sync_status()`` in a JSON file) follow it.

1. DC 2 is cut off for 60 s: its follower keeps serving lookups without an error, reports
   itself disconnected and applies nothing; DC 3's keeps following. After the link heals DC 2
   catches up within 30 s, and both end with exactly the primary's rows (no lost update).
2. A follower cut off for 10 s catches up by pulling only the rows that changed meanwhile, far
   fewer bytes than an empty replica joining under load pulls; that replica serves lookups
   while it joins, catches up within 30 s and ends with exactly the primary's rows.

Skips, with the reason, where namespaces or the WAN's dependencies (`make wan-deps`) are
unavailable, or where ``ek-*`` namespaces exist already."""

from __future__ import annotations

import json
import pathlib
import select
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination.wan import (
    Wan,
    WanConfig,
    ek_namespaces,
    server_addr,
)

pytestmark = pytest.mark.slow
HERE = pathlib.Path(__file__).parent
ONE_WAY_MS = 25
SYNC_PORT = 7400
KEYS = 50_000
RATE = 300  # rows written a second


def _config() -> WanConfig:
    return WanConfig(dcs=3, servers=1, nic_mbit=50, wan_mbit=48, one_way_ms=ONE_WAY_MS)


def _line(proc: subprocess.Popen, timeout: float, what: str, log: pathlib.Path) -> str:
    """The next stdout line of ``proc`` (text mode), or an AssertionError with its log."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        err = log.read_text() if log.exists() else ""
        raise AssertionError(f"{what}: no answer within {timeout:g} s (exit {proc.poll()}): {err}")
    return line.strip()


class _Run:
    """The writer and followers of one test, in the WAN's namespaces; logs and files in
    ``dir``. Every process is stopped by the WAN on the way out (by PID, process group)."""

    def __init__(self, w: Wan, dir: pathlib.Path) -> None:
        self.w, self.dir = w, dir
        self.writer: subprocess.Popen | None = None
        self.followers: dict[int, subprocess.Popen] = {}
        self.cut: set[int] = set()

    def start_writer(self) -> None:
        argv = [self.w.python, str(HERE / "sync_writer.py"), f"{server_addr(1, 1)}:{SYNC_PORT}"]
        argv += [str(KEYS), str(RATE), "7", str(self.dir / "primary.npz")]
        log = self.dir / "writer.err"
        with open(log, "w") as err:
            self.writer = self.w.spawn(
                1, 1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        line = _line(self.writer, 60, "the writer", log)
        assert line.startswith("ready "), line

    def start_follower(self, dc: int) -> float:
        """Starts an empty follower in DC ``dc``; returns when it was started."""
        argv = [self.w.python, str(HERE / "sync_follower.py"), f"{server_addr(1, 1)}:{SYNC_PORT}"]
        argv += [str(KEYS), str(self.status_path(dc))]
        log = self.dir / f"follower{dc}.err"
        started = time.monotonic()
        with open(log, "w") as err:
            self.followers[dc] = self.w.spawn(
                dc, 1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        line = _line(self.followers[dc], 60, f"the follower in DC {dc}", log)
        assert line.startswith("following "), line
        return started

    def status_path(self, dc: int) -> pathlib.Path:
        return self.dir / f"status{dc}.json"

    def status(self, dc: int) -> dict | None:
        """The follower's last report (None before the first)."""
        try:
            return json.loads(self.status_path(dc).read_text())
        except FileNotFoundError:
            return None

    def fresh(self, dc: int, after: float) -> dict:
        """A report of the follower written after wall time ``after`` (waits up to 5 s)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rep = self.status(dc)
            if rep is not None and rep["t"] > after:
                return rep
            time.sleep(0.05)
        raise AssertionError(f"the follower in DC {dc} stopped reporting: {self.status(dc)}")

    def wait_caught_up(self, dc: int, after: float, timeout: float) -> dict | None:
        """The first report that shows the follower connected and caught up by a round that
        ended after wall time ``after``; None if none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rep = self.status(dc)
            s = rep and rep["status"]
            if s and s["connected"] and s["caught_up"] and s["last_round_ms"] > after * 1000:
                return rep
            time.sleep(0.05)
        return None

    def partition(self, dc: int) -> None:
        """Drops every packet between DC ``dc`` and the other DCs (its router forwards
        nothing to or from the WAN): silently, as a cut link does."""
        for rule in (["-i", "wan0"], ["-o", "wan0"]):
            self._iptables(dc, "-I", rule)
        self.cut.add(dc)

    def heal(self, dc: int) -> None:
        for rule in (["-i", "wan0"], ["-o", "wan0"]):
            self._iptables(dc, "-D", rule)
        self.cut.discard(dc)

    def _iptables(self, dc: int, op: str, rule: list[str]) -> None:
        cmd = ["ip", "netns", "exec", f"ek-r{dc}", "iptables-legacy", op, "FORWARD", *rule]
        subprocess.run([*cmd, "-j", "DROP"], check=True, capture_output=True, timeout=10)

    def stop_writer(self) -> tuple[int, int]:
        """Stops the writes; the primary's rows are in primary.npz. (writes, keys written)"""
        self.writer.stdin.write("stop\n")
        self.writer.stdin.flush()
        line = _line(self.writer, 60, "the writer's stop", self.dir / "writer.err")
        assert line.startswith("stopped "), line
        writes, keys = line.split()[1:]
        return int(writes), int(keys)

    def assert_same_rows(self, dc: int) -> None:
        """The follower holds exactly the primary's rows (keys and values), after the writes
        stopped: asked up to 3 times, each after two rounds of pulls."""
        want = np.load(self.dir / "primary.npz")
        diff = None
        for attempt in range(3):
            path = self.dir / f"follower{dc}-{attempt}.npz"
            self.followers[dc].stdin.write(f"dump {path}\n")
            self.followers[dc].stdin.flush()
            line = _line(self.followers[dc], 90, f"DC {dc}'s dump", self.dir / f"follower{dc}.err")
            assert line.startswith("dumped "), line
            got = np.load(path)
            if np.array_equal(got["ids"], want["ids"]):
                diff = int((got["values"] != want["values"]).any(axis=1).sum())
                if diff == 0:
                    return
            else:
                diff = f"{len(got['ids'])} keys, the primary {len(want['ids'])}"
            time.sleep(1)
        raise AssertionError(f"DC {dc} does not hold the primary's rows: {diff} rows differ")

    def finish(self) -> tuple[int, int, dict[int, dict]]:
        """Stops the writes, then checks that DC 2 and DC 3 hold exactly the primary's rows and
        that no lookup failed or read a malformed row. Returns (writes, keys written, the
        followers' last reports by DC)."""
        writes, keys = self.stop_writer()
        for dc in (2, 3):
            self.assert_same_rows(dc)
        final = {dc: self.fresh(dc, time.time()) for dc in (2, 3)}
        for dc in (2, 3):
            assert final[dc]["lookup_errors"] == 0 and final[dc]["bad_rows"] == 0, final[dc]
        return writes, keys, final

    def heal_all(self) -> None:
        for dc in list(self.cut):
            try:
                self.heal(dc)
            except subprocess.CalledProcessError:
                pass


def test_a_dc_partitioned_for_60s_serves_throughout_then_catches_up_without_a_lost_update(
    python_with_nfq, tmp_path
) -> None:
    try:
        with Wan(_config(), python=python_with_nfq) as w:
            run = _Run(w, tmp_path)
            try:
                run.start_writer()
                for dc in (2, 3):
                    run.start_follower(dc)
                for dc in (2, 3):
                    assert run.wait_caught_up(dc, time.time(), 30), run.status(dc)
                time.sleep(2)  # following under the writes
                before = {dc: run.fresh(dc, time.time()) for dc in (2, 3)}
                run.partition(2)
                cut_at = time.time()
                seen_down = None  # when DC 2 first reported itself disconnected
                reports = []
                while time.time() < cut_at + 60:
                    time.sleep(0.5)
                    rep = run.status(2)
                    reports.append(rep)
                    s = rep["status"]
                    if seen_down is None and not s["connected"] and not s["caught_up"]:
                        seen_down = rep["t"] - cut_at
                    assert rep["lookup_errors"] == 0, rep
                end = {dc: run.fresh(dc, time.time()) for dc in (2, 3)}
                run.heal(2)
                healed_at = time.time()
                # During the cut: DC 2 served lookups without an error (nor a torn row), said
                # it was disconnected, and applied nothing after its connection timed out;
                # DC 3 kept following.
                lookups = end[2]["lookups"] - before[2]["lookups"]
                assert lookups > 60 * 10, (before[2], end[2])  # about 50 a second
                assert end[2]["lookup_errors"] == 0 and end[2]["bad_rows"] == 0, end[2]
                assert seen_down is not None and seen_down < 30, reports[-1]
                assert not end[2]["status"]["connected"] and not end[2]["status"]["caught_up"]
                assert end[2]["status"]["errors"] > before[2]["status"]["errors"], end[2]
                late = [r for r in reports if r["t"] > cut_at + 30]
                assert late and {r["status"]["rows_applied"] for r in late} == {
                    end[2]["status"]["rows_applied"]
                }, "DC 2 applied rows while it was cut off"
                s3 = end[3]["status"]
                assert s3["connected"] and s3["errors"] == before[3]["status"]["errors"], s3
                applied3 = s3["rows_applied"] - before[3]["status"]["rows_applied"]
                assert applied3 > 60 * RATE / 4, s3  # the hot keys coalesce between rounds
                # After the heal, DC 2 catches up within 30 s.
                rep = run.wait_caught_up(2, healed_at, 30)
                assert rep is not None, run.status(2)
                catch_up = rep["t"] - healed_at
                pulled = rep["status"]["rows_applied"] - end[2]["status"]["rows_applied"]
                time.sleep(2)
                writes, keys, _ = run.finish()
                print(
                    f"\n60 s partition of DC 2: it reported itself disconnected {seen_down:.1f} s "
                    f"after the cut ({end[2]['status']['last_error']}), served {lookups:,} "
                    f"lookups of 256 keys during the cut with 0 errors; DC 3 applied "
                    f"{applied3:,} rows meanwhile. After the heal DC 2 caught up in "
                    f"{catch_up:.2f} s ({pulled:,} rows applied, lag p99 "
                    f"{rep['status']['lag_ms_p99']} ms). The writer made {writes:,} writes to "
                    f"{keys:,} keys; DC 2 and DC 3 hold exactly the primary's {KEYS:,} rows."
                )
                assert catch_up <= 30
            finally:
                run.heal_all()
    finally:
        assert ek_namespaces() == []


def test_an_empty_replica_joins_under_load_and_a_short_partition_moves_only_changed_rows(
    python_with_nfq, tmp_path
) -> None:
    try:
        with Wan(_config(), python=python_with_nfq) as w:
            run = _Run(w, tmp_path)
            try:
                run.start_writer()
                run.start_follower(2)
                assert run.wait_caught_up(2, time.time(), 30), run.status(2)
                time.sleep(2)
                # A 10 s partition of DC 2, then its catch-up: bytes and rows it pulled.
                before = run.fresh(2, time.time())
                wan0 = w.wan_bytes()
                run.partition(2)
                cut_at = time.time()
                said = set()  # what DC 2's status said during the cut: (connected, caught_up)
                while time.time() < cut_at + 10:
                    time.sleep(0.5)
                    s = run.status(2)["status"]
                    said.add((s["connected"], s["caught_up"]))
                run.heal(2)
                healed_at = time.time()
                # A silent cut: no round finishes, so it stops counting as caught up (after
                # the long-poll's wait plus 3 s), well before its connection times out.
                assert any(not caught_up for _, caught_up in said), said
                rep = run.wait_caught_up(2, healed_at, 30)
                assert rep is not None, run.status(2)
                catch_up = rep["t"] - healed_at
                wan1 = w.wan_bytes()
                cu_bytes = rep["status"]["bytes_in"] - before["status"]["bytes_in"]
                cu_rows = rep["status"]["rows_applied"] - before["status"]["rows_applied"]
                cu_wan = wan1[(1, 2)] - wan0[(1, 2)]
                assert rep["lookup_errors"] == 0 and rep["bad_rows"] == 0, rep
                # An empty replica joins DC 3 under the same writes.
                started = run.start_follower(3)
                t3 = time.time()
                rep3 = run.wait_caught_up(3, t3, 30)
                assert rep3 is not None, run.status(3)
                join = time.monotonic() - started
                wan2 = w.wan_bytes()
                s3 = rep3["status"]
                join_wan = wan2[(1, 3)] - wan1[(1, 3)]
                assert s3["rows_applied"] >= KEYS and s3["errors"] == 0, s3
                assert rep3["lookups_joining"] > 0, rep3  # it served while it joined
                writes, keys, final = run.finish()
                print(
                    f"\n10 s partition of DC 2 (its status said (connected, caught_up) = "
                    f"{sorted(said)} during the cut): caught up {catch_up:.2f} s after the heal, "
                    f"pulling {cu_rows:,} rows in {cu_bytes:,} bytes ({cu_wan:,} WAN bytes "
                    f"DC 1->2 from the cut to caught up). Empty replica in DC 3: caught up "
                    f"{join:.2f} s after its process started, {s3['rows_applied']:,} rows applied, "
                    f"{s3['bytes_in']:,} bytes in ({join_wan:,} WAN bytes DC 1->3), "
                    f"{final[3]['lookups_joining']} lookups while joining, "
                    f"{final[3]['lookups']:,} in all, 0 errors. Catch-up / join bytes: "
                    f"{cu_bytes / s3['bytes_in']:.3f}. The writer made {writes:,} writes to "
                    f"{keys:,} keys; both hold exactly the primary's {KEYS:,} rows."
                )
                assert catch_up <= 30 and join <= 30
                # Catch-up is proportional to the rows that changed, not to the table.
                assert cu_rows < KEYS / 4, cu_rows
                assert cu_bytes < s3["bytes_in"] / 4, (cu_bytes, s3["bytes_in"])
                assert cu_wan < join_wan / 4, (cu_wan, join_wan)
            finally:
                run.heal_all()
    finally:
        assert ek_namespaces() == []
