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

Private names: no module of the Python package names a private name (``_x``, not a dunder)
that another of its modules defines: not as ``obj._x`` (unless ``obj`` is ``self``, ``cls`` or
``super()``), not as ``getattr(obj, "_x")``, not by ``from embstore.m import _x``. A module
defines the names it binds at its top level and what its classes hold (methods, class
attributes, ``self._x = ...`` in their methods). The check goes by name: a private name that no
module of the package defines (``sys._getframe``, ``torch._C``) is a library's business, and
one that the module itself defines is its own. What one module needs of another is a public
name of the other, if need be in a private module (``embstore/_arrays.py``'s ``as_ids``).

Exits 1 when there is a circle or a private name reached from another module.
``python/tests/unit/test_architecture.py`` runs both checks on every ``make test``.
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


def _absolute(node: ast.ImportFrom, pkg: str) -> str:
    """The module a ``from ... import`` names, read from package ``pkg``."""
    if not node.level:
        return node.module or ""
    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def python_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> ``embstore`` modules it imports, for the package at ``package``."""
    mods = _python_modules(package)
    top = package.name

    def own(name: str) -> str:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    reexports: dict[str, dict[str, str]] = {}
    for name, path in mods.items():
        if path.name == "__init__.py":
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ImportFrom):
                    src = _absolute(node, name)
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
                    src = _absolute(node, pkg)
                    if src.split(".")[0] == top:
                        for a in node.names:
                            sub = f"{src}.{a.name}"
                            add(sub if sub in mods else reexports.get(src, {}).get(a.name, src))
                walk(list(ast.iter_child_nodes(node)), pkg)

        walk(ast.parse(path.read_text()).body)
    return edges


def _is_private(name: str) -> bool:
    """``_x`` is private; a dunder (``__x__``) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: module-level bindings (def, class, assignment), and
    what a class defined in it holds (methods, class attributes, ``__slots__``, and what its
    methods assign to ``self.`` or ``cls.``)."""
    names: set[str] = set()

    def targets(node: ast.AST) -> list[ast.expr]:
        if isinstance(node, ast.Assign):
            return node.targets
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            return [node.target]
        return []

    def bind(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                bind(t)

    def body(nodes: list[ast.stmt], in_class: bool) -> None:
        """Bindings of a module's or a class's body (``if``/``try`` blocks included)."""
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    body(node.body, True)
                elif in_class:
                    for sub in ast.walk(node):
                        for t in targets(sub):
                            if (
                                isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id in ("self", "cls")
                            ):
                                names.add(t.attr)
                continue
            for t in targets(node):
                bind(t)
                if in_class and isinstance(t, ast.Name) and t.id == "__slots__":
                    value = node.value  # type: ignore[attr-defined]
                    for elt in getattr(value, "elts", []):
                        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                            names.add(elt.value)
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    body([c for c in children if isinstance(c, ast.stmt)], in_class)
                    for h in children:
                        if isinstance(h, ast.ExceptHandler):
                            body(h.body, in_class)

    body(tree.body, False)
    return {n for n in names if _is_private(n)}


def _reaches(tree: ast.Module, pkg: str, top: str) -> list[tuple[int, str, str, str]]:
    """(line, private name, how, the module imported from or "") for each place a module names
    a private name on something other than ``self``, ``cls`` or ``super()``: ``x._name``,
    ``getattr(x, "_name")`` and its kin, and ``from <package module> import _name``."""
    found: list[tuple[int, str, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            found.append((node.lineno, node.attr, f"{ast.unparse(v)}.{node.attr}", ""))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            obj = node.args[0]
            if not (isinstance(obj, ast.Name) and obj.id in ("self", "cls")):
                found.append((node.lineno, node.args[1].value, ast.unparse(node), ""))
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(node, pkg)
            if src.split(".")[0] == top:
                for a in node.names:
                    if _is_private(a.name):
                        found.append((node.lineno, a.name, f"from {src} import {a.name}", src))
    return found


def private_reaches(package: pathlib.Path = PACKAGE) -> list[str]:
    """Each place a module of the package names a private name (``_x``) that another module of
    the package defines and it does not: ``file:line: how names 'name', private to where``.

    Only names defined somewhere in the package count (``sys._getframe`` and ``torch._C`` are
    their libraries' business); importing a private module (``from . import _ops``) or public
    names from one (``from embstore._arrays import describe``) is fine."""
    mods = _python_modules(package)
    top = package.name
    trees = {name: ast.parse(path.read_text()) for name, path in mods.items()}
    own = {name: _own_names(tree) for name, tree in trees.items()}
    owners: dict[str, list[str]] = {}
    for name, names in own.items():
        for n in names:
            owners.setdefault(n, []).append(name)
    bad: list[tuple[str, int, str]] = []
    for name, tree in trees.items():
        path = mods[name]
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for line, n, how, src in _reaches(tree, pkg, top):
            if n in own[name] or n not in owners or f"{src}.{n}" in mods:
                continue  # its own name, a library's, or a module
            where = ", ".join(sorted(owners[n]))
            rel = path.relative_to(package.parent).as_posix()
            bad.append((rel, line, f"{rel}:{line}: {how} names '{n}', private to {where}"))
    return [msg for *_, msg in sorted(set(bad))]


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
        reaches = private_reaches()
        print(f"== python/embstore: {len(reaches)} private name(s) reached from another module")
        for line in reaches:
            print(f"  {line}")
        bad += bool(reaches)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
