"""`verify` of a store whose manifest cannot account for its segments: it lists the files that
are safe to remove (superseded) apart from the unaccounted ones, never the same file as both
"deleted at the next open" and damage, and the open is refused naming both."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import embstore
from embstore import CorruptionError

CLI = [sys.executable, "-m", "embstore"]


def _damaged(path) -> tuple[str, list[str]]:
    """A store whose manifest lost the records of its last two flushes (two segments newer
    than every record, as an older build left behind failed manifest writes), plus a
    superseded leftover. Returns the leftover's name and the unaccounted names."""
    seg = path / "seg"
    with embstore.Store(path) as store:
        t = store.create_table("user", 8)
        t.lookup(np.arange(100))
        store.flush()
        old = (path / "MANIFEST").read_bytes()
        before = sorted(p.name for p in seg.iterdir())
        for f in range(2):
            t.lookup(np.arange(1000 * (f + 1), 1000 * (f + 1) + 10))
            store.flush()
    newer = sorted(p.name for p in seg.iterdir() if p.name not in before)
    assert len(newer) == 2, newer
    (path / "MANIFEST").write_bytes(old)
    leftover = "0000000000000000.seg"  # below every seq the manifest handed out
    shutil.copy(seg / before[0], seg / leftover)
    return leftover, newer


def test_verify_names_the_safe_files_apart_from_the_unaccounted_ones(tmp_path):
    path = tmp_path / "s"
    leftover, newer = _damaged(path)

    report = embstore.verify(path)
    assert report["orphan_segments"] == [leftover]
    assert report["unaccounted_segments"] == newer
    assert len(report["damage"]) == 1
    line = report["damage"][0]
    assert f"Safe to remove (superseded): {leftover}" in line, line
    assert f"not safe to delete: {', '.join(newer)}" in line, line
    assert embstore.inspect(path)["unaccounted_segments"] == newer

    out = subprocess.run([*CLI, "verify", "--quiet", str(path)], capture_output=True, text=True)
    assert out.returncode == 1, out
    lines = out.stdout.splitlines()
    orphan = [x for x in lines if "orphan segments" in x]
    unaccounted = [x for x in lines if "unaccounted segments" in x]
    assert len(orphan) == 1 and orphan[0].endswith(leftover), lines
    assert "safe to remove" in orphan[0], lines
    assert len(unaccounted) == 1 and unaccounted[0].endswith(", ".join(newer)), lines
    # No file is both "deleted at the next open" and damage.
    assert not any(n in orphan[0] for n in newer), lines
    assert any("DAMAGED" in x for x in lines), lines

    with pytest.raises(CorruptionError) as e:
        embstore.Store(path)
    assert all(n in str(e.value) for n in newer), e.value
    assert f"{leftover} the manifest proves superseded and safe to remove" in str(e.value)
    assert (path / "seg" / leftover).exists()

    # Moving the unaccounted files aside opens the store at the manifest's state.
    for n in newer:
        (path / "seg" / n).rename(tmp_path / n)
    with embstore.Store(path) as store:
        assert len(store["user"]) == 100
        assert store.recovery()["orphan_segments"] == [leftover]
    out = subprocess.run([*CLI, "verify", "--quiet", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "unaccounted" not in out.stdout, out
