"""`embstore serve --follow SRC --store DIR` creates its copy in a new or empty directory (as
`Store.follow(path=DIR)` does), keeps it across a restart, and refuses a non-empty directory
that holds no store, saying what to give instead."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import numpy as np

import embstore

SERVE = [sys.executable, "-m", "embstore", "serve", "--listen", "127.0.0.1:0"]


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A server and the address its first line names; the caller stops it by PID."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    m = re.search(r" on (127\.0\.0\.1:\d+):", line)
    if m is None:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"unexpected first line {line!r}: {proc.stderr.read()!r}")
    return proc, m.group(1)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # flushes the copy, then exits
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _serves(address: str, want: np.ndarray, ids: np.ndarray) -> None:
    client = embstore.connect(address, deadline_s=30.0)
    deadline = time.monotonic() + 60
    got = None
    while time.monotonic() < deadline:
        got = client.lookup("item", ids)
        if np.array_equal(got, want):
            return
        time.sleep(0.1)
    diff = -1 if got is None else int((got != want).any(axis=1).sum())
    raise AssertionError(f"the follower never served the primary's rows: {diff} differ")


def test_serve_follow_creates_its_store_in_a_new_or_empty_directory(tmp_path) -> None:
    primary = embstore.Store(replica_id=1)
    t = primary.create_table("item", embedding_dim=4)
    ids = np.arange(200)
    t.assign(ids, np.arange(800, dtype=np.float32).reshape(200, 4))
    port = primary.serve_sync("127.0.0.1:0", token="tok")
    token = tmp_path / "token"
    token.write_text("tok\n")
    follow = [*SERVE, "--follow", port.address, "--sync-token-file", str(token)]
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        for d in (tmp_path / "new" / "replica", empty):
            proc, address = _start([*follow, "--store", str(d)])
            try:
                _serves(address, t.lookup(ids, on_miss="zeros"), ids)
                t.assign([7], [[-1.0] * 4])  # ... and it follows what changes
                _serves(address, t.lookup(ids, on_miss="zeros"), ids)
            finally:
                _stop(proc)
            assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
            # The copy is a store, kept on disk: it reopens with the rows.
            copy = embstore.Store(d)
            try:
                want = t.lookup(ids, on_miss="zeros")
                assert np.array_equal(copy["item"].lookup(ids, on_miss="zeros"), want)
            finally:
                copy.close()
        # Restarted over the copy it kept, it follows on.
        t.assign([8], [[-2.0] * 4])
        proc, address = _start([*follow, "--store", str(empty)])
        try:
            _serves(address, t.lookup(ids, on_miss="zeros"), ids)
        finally:
            _stop(proc)
        # A directory with other files in it is not made a store: a clear refusal.
        junk = tmp_path / "junk"
        junk.mkdir()
        (junk / "notes.txt").write_text("mine\n")
        out = subprocess.run(
            [*follow, "--store", str(junk), "--framed-listen", "off"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, out
        assert "holds no store" in out.stderr and "not empty" in out.stderr, out.stderr
        assert "new or empty directory" in out.stderr, out.stderr
        assert sorted(p.name for p in junk.iterdir()) == ["notes.txt"]
    finally:
        port.stop()
