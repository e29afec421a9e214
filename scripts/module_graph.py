#!/usr/bin/env python3
"""The module graph inside each crate, and the circles in it.

A crate's modules are its top-level files and folders under ``src/`` (a folder such as
``tier/`` or ``durable/`` is one module: its files may name each other). Module A depends on B
when A's non-test code names ``crate::B`` — directly, or through a name ``lib.rs`` re-exports
from B. ``#[cfg(test)]`` code and comments are left out: a test may reach anywhere.

    scripts/module_graph.py                  # every crate: its edges and circles
    scripts/module_graph.py crates/embstore-table

Exits 1 when a crate has a circle. ``python/tests/unit/test_architecture.py`` runs it on every
``make test``.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def module_graph(src: pathlib.Path) -> dict[str, set[str]]:
    """Module -> modules it names, for the crate whose ``src/`` is ``src``."""
    files = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src).with_suffix("").as_posix()
        files[rel.removesuffix("/mod")] = path.read_text()
    top = {name.split("/")[0] for name in files}
    reexported: dict[str, str] = {}
    for m in re.finditer(r"pub use (\w+)::\{?([^;]*)\}?;", files.get("lib", "")):
        for name in re.findall(r"\b([A-Za-z_]\w*)\b", m.group(2)):
            reexported.setdefault(name, m.group(1))

    def target(name: str) -> str | None:
        if name in top:
            return name
        return reexported.get(name)

    edges: dict[str, set[str]] = {}
    for name, text in files.items():
        if name == "lib":
            continue
        code = re.sub(r"//.*", "", text.split("#[cfg(test)]")[0])
        unit = name.split("/")[0]
        deps = edges.setdefault(unit, set())
        for path in re.findall(r"crate::((?:\w+::)*\{?[\w, :{}]*)", code):
            words = re.findall(r"\b(\w+)\b", path) if path.startswith("{") else path.split("::")[:1]
            for word in words:
                dep = target(word)
                if dep and dep != unit:
                    deps.add(dep)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    crates = [pathlib.Path(a) for a in argv] or sorted((ROOT / "crates").iterdir())
    bad = 0
    for crate in crates:
        edges = module_graph(crate / "src")
        found = circles(edges)
        print(f"== {crate.name}: {'circles ' + str(found) if found else 'no circle'}")
        for unit in sorted(edges):
            print(f"  {unit:14} -> {', '.join(sorted(edges[unit])) or '-'}")
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
