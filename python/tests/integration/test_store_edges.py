"""The edges of a durable store as a user meets them: a damaged manifest, a full disk at close,
handles of a closed store, table names that look like paths, `verify`'s exit status and output,
and arguments with typos."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import embstore
from embstore import (
    CorruptionError,
    InvalidArgumentError,
    NoSpaceError,
    NotFoundError,
    StorageError,
    StoreClosedError,
)

CLI = [sys.executable, "-m", "embstore"]


def _store_with_rows(path, flushes: int = 1) -> None:
    with embstore.Store(path) as store:
        t = store.create_table("user", 8)
        for f in range(flushes):
            t.lookup(np.arange(1000 * f, 1000 * (f + 1)))
            store.flush()


def test_a_truncated_manifest_is_refused_verify_exits_1_and_no_segment_is_deleted(tmp_path):
    path = tmp_path / "s"
    _store_with_rows(path)
    segments = sorted((path / "seg").iterdir())
    manifest = path / "MANIFEST"
    manifest.write_bytes(manifest.read_bytes()[:40])  # the header and part of one record
    with pytest.raises(CorruptionError, match="MANIFEST"):
        embstore.Store(path)
    assert sorted((path / "seg").iterdir()) == segments
    assert all(s.stat().st_size > 4096 for s in segments)
    out = subprocess.run([*CLI, "verify", "--quiet", str(path)], capture_output=True, text=True)
    assert out.returncode == 1 and "DAMAGED" in out.stdout and "MANIFEST" in out.stdout, out
    report = embstore.verify(path)
    assert report["damage"] and report["tables"] == []
    assert sorted((path / "seg").iterdir()) == segments


def test_verify_prints_whole_progress_lines_into_a_pipe_and_no_rows_for_a_damaged_table(
    tmp_path,
):
    path = tmp_path / "s"
    _store_with_rows(path, flushes=12)
    out = subprocess.run([*CLI, "verify", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out
    assert "\r" not in out.stderr, repr(out.stderr)
    lines = out.stderr.splitlines()
    assert lines and all(line.startswith("verify: ") for line in lines), lines
    assert lines[-1] == "verify: 12/12 segments"
    assert len(lines) <= 11, lines  # one per tenth of the work, not one per segment
    # Damage one segment: the table's rows cannot be counted, and verify says so.
    seg = sorted((path / "seg").iterdir())[3]
    data = bytearray(seg.read_bytes())
    data[4096 + 50] ^= 0x01  # a value of the first record
    seg.write_bytes(bytes(data))
    report = embstore.verify(path)
    assert len(report["damage"]) == 1
    assert report["tables"][0]["rows"] is None and report["tables"][0]["memory_bytes"] is None
    out = subprocess.run([*CLI, "verify", "--quiet", str(path)], capture_output=True, text=True)
    assert out.returncode == 1, out
    row = next(line for line in out.stdout.splitlines() if line.strip().startswith("user"))
    assert row.split()[4] == "-", row  # the rows column (records stay counted)
    # Not a store at all: exit 2, not "damaged".
    out = subprocess.run([*CLI, "verify", str(tmp_path / "nothing")], capture_output=True)
    assert out.returncode == 2, out


@contextlib.contextmanager
def _small_disk(tmp_path, size: str = "1m"):
    """A tmpfs of `size` mounted for the test (root only; CI runs as root), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_close_on_a_full_disk_keeps_the_store_open_and_a_retry_writes_the_rows(tmp_path):
    with _small_disk(tmp_path) as disk:
        path = disk / "s"
        store = embstore.Store(path)
        t = store.create_table("user", 16)
        t.assign(np.arange(100), np.ones((100, 16), np.float32))
        store.flush()
        ballast = disk / "ballast"
        with open(ballast, "wb") as f:  # fill the disk
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        t.assign(np.arange(100, 3100), np.full((3000, 16), 2.0, np.float32))
        with pytest.raises(NoSpaceError):
            store.close()
        # Still open: nothing was lost, and leaving a `with` block on a full disk is the same.
        assert len(store["user"]) == 3100
        with pytest.raises(NoSpaceError), store:
            pass
        t.apply_gradients([0], np.ones((1, 16), np.float32))
        ballast.unlink()
        store.close()
        with pytest.raises(StoreClosedError):
            store.tables()
        again = embstore.Store(path)
        assert len(again["user"]) == 3100
        np.testing.assert_array_equal(again["user"].lookup([3000])[0], np.full(16, 2.0))
        again.close()


def test_handles_of_a_closed_store_raise_store_closed_error(tmp_path):
    store = embstore.Store(tmp_path / "s")
    t = store.create_table("user", 4)
    t.assign([1], np.ones((1, 4), np.float32))
    store.close()
    other = embstore.Store(tmp_path / "s")  # unlocked at once, handle or no handle
    calls = {
        "apply_gradients": lambda: t.apply_gradients([1], np.ones((1, 4), np.float32)),
        "lookup": lambda: t.lookup([1]),
        "assign": lambda: t.assign([2], np.ones((1, 4), np.float32)),
        "remove": lambda: t.remove([1]),
        "contains": lambda: t.contains([1]),
        "clear": t.clear,
        "save": lambda: t.save(tmp_path / "t.embt"),
    }
    for name, call in calls.items():
        with pytest.raises(StoreClosedError, match="closed"):
            call()
        assert issubclass(StoreClosedError, StorageError), name
    np.testing.assert_array_equal(other["user"].lookup([1]), np.ones((1, 4)))
    assert not other["user"].contains([2])[0]


@pytest.mark.parametrize("name", ["../../escape", "a/b", "/abs", "a\\b", ".", "..", "a\0b"])
def test_table_names_that_could_become_paths_are_refused(tmp_path, name):
    store = embstore.Store(tmp_path / "s")
    with pytest.raises(InvalidArgumentError, match="path separators"):
        store.create_table(name, 4)
    assert store.tables() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_arguments_with_typos_get_the_error_that_fits(tmp_path):
    store = embstore.Store(tmp_path / "s")
    store.create_table("user", 4).lookup([1, 2])
    with pytest.raises(NotFoundError, match="no such directory") as e:
        store.checkpoint(tmp_path / "c", since="/typo/nowhere")
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(InvalidArgumentError) as e:
        store.checkpoint(tmp_path / "c2", since=tmp_path / "s")  # a store, not a checkpoint
    assert "::" not in str(e.value), "a Python message names no Rust item"
    ckpt = store.checkpoint(tmp_path / "c3")
    for bad in (-1, -(2**70), 2**70):
        with pytest.raises(InvalidArgumentError, match="num_shards"):
            embstore.Store.restore(ckpt, tmp_path / f"r{bad}", num_shards=bad)


def test_flushes_compact_a_step_at_a_time_and_say_so(tmp_path):
    store = embstore.Store(tmp_path / "s")
    t = store.create_table("user", 4)
    ids = np.arange(40_000)
    flushes = []
    for step in range(8):
        some = ids[(ids * 7 + step) % 3 == 0] if step else ids
        t.assign(some, np.full((len(some), 4), float(step), np.float32))
        flushes.append(store.flush())
    assert sum(f["compacted_segments"] for f in flushes) > 0, flushes
    # No flush rewrote the whole table: each wrote what changed plus a bounded step.
    assert all(f["compactions"] == 0 for f in flushes), flushes
    assert max(f["records"] for f in flushes[1:]) < 3 * 40_000, flushes
    disk = sum(p.stat().st_size for p in (tmp_path / "s" / "seg").iterdir())
    assert disk < 2.2 * 40_000 * (64 + 24) + 8 * 8192, disk  # records and their footer entries
    store.close()
