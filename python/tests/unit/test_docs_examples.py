"""Every ```python block of README.md and docs/*.md runs as a reader runs it.

A file's blocks run in order, in ONE namespace that holds nothing but what the blocks
themselves import and define (no imports or fixtures a reader does not have), in a fresh
Python process of its own started in an empty temporary directory, so relative paths such as
``data/ctr`` land there and nothing one file leaves behind (a store held open, a module
imported) reaches another. A block that cannot run here (it needs a server, torchrun,
MovieLens data, or is a fragment of the reader's own code) says so on a line
``# doctest: skip (reason)``; keep these few. A skipped block is still compiled and its
imports run, and every attribute it reaches on an embstore module (``embstore.torch``,
``et.EmbeddingBag``) must exist at that point, as the reader's process would have it.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^#\s*doctest:\s*skip\b\s*(.*)$", re.M)
TIMEOUT_S = 600  # a whole file's blocks; they take seconds

pytestmark = pytest.mark.docs

# Runs in the child process: reads [[path, first_line, source, skip], ...] from stdin.
RUNNER = r"""
import ast, importlib, json, sys, types

def imports_of(tree):
    return [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]

def check_attributes(tree, ns, where):
    # Every `mod.attr` where `mod` names an embstore module must resolve.
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        mod = ns.get(node.value.id)
        if not isinstance(mod, types.ModuleType) or not mod.__name__.startswith("embstore"):
            continue
        if not hasattr(mod, node.attr):
            sys.exit(
                f"{where}, line {node.lineno}: {node.value.id}.{node.attr} does not exist at "
                f"this point (a module the reader has not imported, or a name that is gone)"
            )

ns = {"__name__": "__main__"}
for path, first, source, skip in json.load(sys.stdin):
    where = f"{path}:{first}"
    # Padded so that tracebacks give the line in the document.
    code_text = "\n" * (first - 1) + source
    tree = ast.parse(code_text, path)
    if skip:
        print(f"--- {where}: skipped; checking its imports and names", flush=True)
        exec(compile(ast.Module(imports_of(tree), []), path, "exec"), ns)
        check_attributes(tree, ns, where)
        continue
    print(f"--- {where}", flush=True)
    exec(compile(tree, path, "exec"), ns)
print("--- done", flush=True)
"""


def _blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(first line, source)`` of every ```python block of ``path`` (lines from 1)."""
    found = []
    lines = path.read_text().splitlines()
    start = None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```python":
            start = i + 1
        elif start is not None and line.strip() == "```":
            found.append((start + 1, "\n".join(lines[start:i])))
            start = None
    return found


FILES = [(p, b) for p in DOCS if (b := _blocks(p))]
ALL = [(f"{p.relative_to(ROOT)}:{n}", src) for p, bs in FILES for n, src in bs]


def test_the_docs_have_python_blocks_and_few_skips():
    assert len(ALL) >= 10
    skipped = [where for where, src in ALL if SKIP.search(src)]
    assert len(skipped) <= len(ALL) // 2, f"most blocks skip: {skipped}"
    for where, src in ALL:
        if m := SKIP.search(src):
            assert m.group(1).strip(" ()"), f"{where}: a '# doctest: skip' line must give why"


@pytest.mark.parametrize(
    ("path", "blocks"), FILES, ids=[str(p.relative_to(ROOT)) for p, _ in FILES]
)
def test_docs_blocks_run_in_order(path, blocks, tmp_path):
    """The file's blocks, in order, in one namespace, in a fresh process in an empty cwd."""
    rel = str(path.relative_to(ROOT))
    todo = [(rel, first, src, bool(SKIP.search(src))) for first, src in blocks]
    if all(skip for *_, skip in todo):
        pytest.skip(f"every python block of {rel} is marked to skip")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER],
        cwd=work,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(json.dumps(todo), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{rel}: the blocks did not finish in {TIMEOUT_S} s:\n{out[-4000:]}")
    assert proc.returncode == 0 and out.rstrip().endswith("--- done"), (
        f"{rel}: a block failed as written:\n{out[-6000:]}"
    )
