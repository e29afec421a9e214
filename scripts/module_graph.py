#!/usr/bin/env python3
"""The module graph inside each crate and inside the Python package, and the circles in them.

Rust: a crate's modules are its files under ``src/`` (``tier/pins.rs`` is ``tier/pins``, a
folder's ``mod.rs`` is the folder). Module A depends on B when A's non-test code names B or an
item of B: by ``crate::``, ``super::`` or ``self::`` paths (a name that a module re-exports with
``pub use`` resolves to the module it comes from). A folder's ``mod.rs`` naming its own files is
not a dependency (the folder is made of them); a file naming its folder's ``mod.rs`` is.
``#[cfg(test)]`` code and comments are left out: a test may reach anywhere.

Python: the modules of ``python/embstore``. A module depends on every ``embstore`` module it
imports, at the top or deferred inside a function (a deferred import still closes a circle);
``from embstore import X`` names the module ``X`` comes from. Imports under ``if
TYPE_CHECKING:`` are left out (they never run).

    scripts/module_graph.py                  # every crate and the Python package
    scripts/module_graph.py crates/embstore-table

Exits 1 when there is a circle. ``python/tests/unit/test_architecture.py`` runs it on every
``make test``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "embstore"


def _rust_files(src: pathlib.Path) -> dict[str, str]:
    files = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src).with_suffix("").as_posix()
        files[rel.removesuffix("/mod")] = path.read_text()
    return files


def module_graph(src: pathlib.Path) -> dict[str, set[str]]:
    """Module -> modules it names, for the crate whose ``src/`` is ``src``."""
    files = _rust_files(src)
    mods = set(files)
    # Per module: names it re-exports -> the path they come from.
    reexports: dict[str, dict[str, str]] = {}
    for m, text in files.items():
        for use in re.finditer(r"pub(?:\([\w:]+\))? use ([\w:]+)::\{?([^;]*?)\}?;", text):
            for name in re.findall(r"\b([A-Za-z_]\w*)\b", use.group(2)):
                reexports.setdefault(m, {})[name] = use.group(1)

    def resolve(at: str, segs: list[str], depth: int = 0) -> str:
        """The module a path names, read from module ``at`` ("" for the crate root)."""
        cur = at
        for i, s in enumerate(segs):
            if s == "self":
                continue
            if s == "super":
                cur = cur.rsplit("/", 1)[0] if "/" in cur else ""
                continue
            child = f"{cur}/{s}" if cur else s
            if child in mods:
                cur = child
                continue
            source = reexports.get(cur or "lib", {}).get(s)
            if source and depth < 8:
                parts = source.split("::")
                if parts[0] == "crate":
                    return resolve("", [*parts[1:], *segs[i + 1 :]], depth + 1)
                return resolve(cur, [*parts, *segs[i + 1 :]], depth + 1)
            break
        return cur or "lib"

    edges: dict[str, set[str]] = {}
    for m, text in files.items():
        code = re.sub(r"//.*", "", text.split("#[cfg(test)]")[0])
        at = "" if m == "lib" else m
        deps = edges.setdefault(m, set())
        paths: list[tuple[str, list[str]]] = []
        for root, rest in re.findall(r"\b(crate|super|self)((?:::\w+)+)", code):
            segs = rest.strip(":").split("::")
            paths.append(("", segs) if root == "crate" else (at, [root, *segs]))
        groups = re.findall(r"\b(crate|super|self)::(?:([\w:]+)::)?\{([^;]*?)\};", code)
        for root, mid, body in groups:
            pre = [p for p in (mid or "").split("::") if p]
            for item in re.findall(r"[\w:]+", body):
                segs = [*pre, *[p for p in item.split("::") if p]]
                paths.append(("", segs) if root == "crate" else (at, [root, *segs]))
        for base, segs in paths:
            dep = resolve(base, segs)
            if dep not in (m, "lib") and not dep.startswith(m + "/"):
                deps.add(dep)
    return edges


def _python_modules(package: pathlib.Path) -> dict[str, pathlib.Path]:
    mods = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def python_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> ``embstore`` modules it imports, for the package at ``package``."""
    mods = _python_modules(package)
    top = package.name

    def absolute(node: ast.ImportFrom, pkg: str) -> str:
        if not node.level:
            return node.module or ""
        base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def own(name: str) -> str:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    reexports: dict[str, dict[str, str]] = {}
    for name, path in mods.items():
        if path.name == "__init__.py":
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ImportFrom):
                    src = absolute(node, name)
                    for a in node.names:
                        sub = f"{src}.{a.name}"
                        reexports.setdefault(name, {})[a.asname or a.name] = (
                            sub if sub in mods else src
                        )

    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = edges.setdefault(name, set())

        def add(target: str, name: str = name, deps: set[str] = deps) -> None:
            target = own(target)
            if target and target != name and not name.startswith(target + "."):
                deps.add(target)

        def walk(nodes: list[ast.stmt] | list[ast.AST], pkg: str = pkg) -> None:
            for node in nodes:
                if isinstance(node, ast.If) and _type_checking(node.test):
                    walk(node.orelse, pkg)
                    continue
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] == top:
                            add(a.name)
                elif isinstance(node, ast.ImportFrom):
                    src = absolute(node, pkg)
                    if src.split(".")[0] == top:
                        for a in node.names:
                            sub = f"{src}.{a.name}"
                            add(sub if sub in mods else reexports.get(src, {}).get(a.name, src))
                walk(list(ast.iter_child_nodes(node)), pkg)

        walk(ast.parse(path.read_text()).body)
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


def _report(label: str, edges: dict[str, set[str]]) -> bool:
    found = circles(edges)
    print(f"== {label}: {'circles ' + str(found) if found else 'no circle'}")
    for unit in sorted(edges):
        print(f"  {unit:28} -> {', '.join(sorted(edges[unit])) or '-'}")
    return bool(found)


def main(argv: list[str]) -> int:
    crates = [pathlib.Path(a) for a in argv] or sorted(
        p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir()
    )
    bad = sum(_report(crate.name, module_graph(crate / "src")) for crate in crates)
    if not argv:
        bad += _report("python/embstore", python_graph())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
