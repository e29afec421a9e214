"""The MovieLens demo with a follower in another emulated data centre
(``examples/movielens_ctr.py --follower-dc``): the trainer's sync port in DC 1, ``embstore serve
--follow`` in DC 2 serving the test users, 25 ms one way. Per epoch it prints the follower's
lag (at least the one-way delay), how many test users it served as trained (all, soon after
the epoch) and the WAN bytes; at the end the follower's totals and the same test AUC from its
rows as from the trainer's. Ctrl-C stops everything it started and removes the namespaces.

Skips, with the reason, where the emulated WAN cannot be built (not root, `make wan-deps`
missing, another run's ``ek-*`` namespaces); missing MovieLens data fails, as in
test_movielens.py (`make test-python` fetches it)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination.wan import ek_namespaces

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEMO = ROOT / "examples" / "movielens_ctr.py"
ONE_WAY_MS = 25
EPOCH_LINE = re.compile(
    r"follower in DC 2: lag p50 (\d+) ms, p99 (\d+) ms over ([\d,]+) replies applied; at the "
    r"epoch's end it served ([\d,]+) of ([\d,]+) test users' rows as trained, all of them (\d+) ms "
    r"later; WAN so far ([\d.]+) MB DC1->DC2, ([\d.]+) kB DC2->DC1"
)
FINAL_LINE = re.compile(
    r"follower in DC 2: lag p50 (\d+) ms, p99 (\d+) ms over the run \(([\d,]+) replies\); "
    r"([\d,]+) rows applied, ([\d.]+) MB pulled, (\d+) errors; WAN ([\d.]+) MB DC1->DC2"
)
AUC_LINE = re.compile(
    r"test AUC from the follower's rows ([\d.]+), from the trainer's ([\d.]+) \(same\)"
)


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def _leftovers() -> list[str]:
    """Processes the demo started (its follower and DC 2 client) that are still running."""
    out = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "embstore-demo-dc-" in cmd or "dc_lookup_client.py" in cmd:
            out.append(f"{proc.name}: {cmd}")
    return out


def _skip_if_another_run_took_the_wan(returncode: int | None, err: str) -> None:
    """Another run's WAN came up between the fixture's look and the demo's (the namespaces
    are machine-wide): the demo refused, as it should."""
    if returncode == 2 and "ek-* namespaces already exist" in err:
        pytest.skip(f"another run took the emulated WAN meanwhile: {err.strip()}")


def _demo(data_dir: pathlib.Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, str(DEMO), "--data-dir", str(data_dir), "--no-budget-run", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
@pytest.mark.data
def test_the_follower_in_dc2_serves_the_test_users_and_reports_its_lag(wan_free, data_dir):
    proc = _demo(data_dir, "--epochs", "2", "--follower-dc")
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the demo's own clean-up, by its PID
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    _skip_if_another_run_took_the_wan(proc.returncode, err)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert ek_namespaces() == []
    assert _leftovers() == []

    epochs = EPOCH_LINE.findall(out)
    assert len(epochs) == 2, out
    wan_so_far = []
    for p50, p99, replies, at_end, users, _catch_up, to_dc2, to_dc1 in epochs:
        # A row is visible in DC 2 one WAN crossing after it was written, at the earliest.
        assert ONE_WAY_MS <= int(p50) <= int(p99), out
        assert _num(replies) > 0
        assert _num(users) > 900 and _num(at_end) <= _num(users)
        assert float(to_dc2) > 1.0 and float(to_dc1) > 0.0  # rows out, requests back
        wan_so_far.append(float(to_dc2))
    assert wan_so_far[1] > wan_so_far[0]

    final = FINAL_LINE.search(out)
    assert final is not None, out
    p50, p99, replies, rows, pulled, errors, to_dc2 = final.groups()
    assert ONE_WAY_MS <= int(p50) <= int(p99)
    assert _num(replies) >= sum(_num(e[2]) for e in epochs)
    # Every stored row (3,026) was written in training and crossed at least once.
    assert _num(rows) >= 3026 and float(pulled) > 1.0 and int(errors) == 0
    # The rows crossed the WAN once: the link's bytes are about what the follower pulled (the
    # router's counters and the follower's byte count differ by some percent either way).
    assert 0.7 * float(pulled) <= float(to_dc2) < 1.5 * float(pulled) + 1.0
    follower_auc, trainer_auc = AUC_LINE.search(out).groups()
    assert follower_auc == trainer_auc and float(follower_auc) > 0.7


@pytest.mark.slow
@pytest.mark.data
def test_ctrl_c_stops_the_follower_and_removes_the_namespaces(wan_free, data_dir):
    proc = _demo(data_dir, "--epochs", "100", "--follower-dc")
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if "follower in DC 2:" in line or not line:
                break
        if "follower in DC 2:" not in seen[-1]:
            _, err = proc.communicate(timeout=60)
            _skip_if_another_run_took_the_wan(proc.returncode, err)
            raise AssertionError("".join(seen) + err)
        assert len(ek_namespaces()) > 0 and len(_leftovers()) > 0
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert ek_namespaces() == []
    assert _leftovers() == []


def test_without_the_wan_it_says_why_and_exits_2(tmp_path):
    env = dict(os.environ, EMBSTORE_WAN_TOOLS=str(tmp_path / "no-such-tools"))
    res = subprocess.run(
        [sys.executable, str(DEMO), "--data-dir", str(tmp_path), "--follower-dc"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    reason = "needs root" if os.geteuid() != 0 else "no-such-tools/wan2.sh is missing"
    assert "error: --follower-dc needs the emulated WAN:" in res.stderr
    assert reason in res.stderr
    assert "random split" not in res.stdout  # it stopped before any training
