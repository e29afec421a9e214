"""Every ```python block of README.md and docs/*.md runs.

Each block runs in a fresh namespace (holding only ``np`` and ``embstore``, the imports the
docs take as read) in its own temporary directory, so relative paths such as ``data/ctr`` land
there. A block that cannot run here (it needs a server, MovieLens data, or is a fragment of the
reader's own code) says so on a line ``# doctest: skip (reason)``; keep these few.
"""

import pathlib
import re

import numpy as np
import pytest

import embstore

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^#\s*doctest:\s*skip\b\s*(.*)$", re.M)

pytestmark = pytest.mark.docs


def _blocks() -> list[tuple[str, str]]:
    """``(file:line, source)`` of every ```python block."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        start = None
        for i, line in enumerate(lines):
            if start is None and line.strip() == "```python":
                start = i + 1
            elif start is not None and line.strip() == "```":
                found.append((f"{path.relative_to(ROOT)}:{start}", "\n".join(lines[start:i])))
                start = None
    return found


BLOCKS = _blocks()


def test_the_docs_have_python_blocks_and_few_skips():
    assert len(BLOCKS) >= 10
    skipped = [where for where, src in BLOCKS if SKIP.search(src)]
    assert len(skipped) <= len(BLOCKS) // 2, f"most blocks skip: {skipped}"


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_docs_block_runs(where, source, tmp_path, monkeypatch):
    if m := SKIP.search(source):
        reason = m.group(1).strip(" ()")
        assert reason, f"{where}: a '# doctest: skip' line must give its reason"
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    code = compile(source, where, "exec")
    exec(code, {"__name__": "__docs__", "np": np, "embstore": embstore})
