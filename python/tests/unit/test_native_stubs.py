"""``_native.pyi`` says what the native module holds: every public class, function, method and
property of ``embstore._native`` is in the stubs and back, and where the module knows a
callable's parameters (pyo3's text signatures), the stubs name the same ones in the same
order. A method added to the bindings without its stub, or a parameter renamed in one of the
two, fails here."""

from __future__ import annotations

import ast
import inspect
import pathlib

import embstore._native as native

STUB = pathlib.Path(native.__file__).parent / "_native.pyi"


def _module_params(obj: object) -> list[str] | None:
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return None  # pyo3 gave no text signature
    return [p for p in sig.parameters if p not in ("self", "cls")]


def _stub_params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "property")
        or (isinstance(d, ast.Attribute) and d.attr in ("setter", "getter"))
        for d in fn.decorator_list
    )


def mismatches(module: object, stub_text: str) -> list[str]:
    """What the stubs and the module disagree on, one line each."""
    stub = {
        n.name: n
        for n in ast.parse(stub_text).body
        if isinstance(n, ast.ClassDef | ast.FunctionDef)
    }
    out = []
    for name in sorted(n for n in dir(module) if not n.startswith("_")):
        if callable(getattr(module, name)) and name not in stub:
            out.append(f"{name}: in the module, not in the stubs")
    for name, node in sorted(stub.items()):
        if not hasattr(module, name):
            out.append(f"{name}: in the stubs, not in the module")
            continue
        obj = getattr(module, name)
        if isinstance(node, ast.FunctionDef):
            got = _module_params(obj)
            if got is not None and got != _stub_params(node):
                out.append(f"{name}{tuple(_stub_params(node))} != {tuple(got)} in the module")
            continue
        members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        real = {m for m in dir(obj) if not m.startswith("_")}
        if isinstance(obj, type) and issubclass(obj, BaseException):
            real -= set(dir(BaseException))
        out += [f"{name}.{m}: in the module, not in the stubs" for m in sorted(real - set(members))]
        for m, fn in sorted(members.items()):
            if m.startswith("_") and m != "__init__":
                continue
            if m != "__init__" and not hasattr(obj, m):
                out.append(f"{name}.{m}: in the stubs, not in the module")
                continue
            if _is_property(fn):
                continue
            got = _module_params(obj if m == "__init__" else getattr(obj, m))
            if got is not None and got != _stub_params(fn):
                out.append(f"{name}.{m}{tuple(_stub_params(fn))} != {tuple(got)} in the module")
    return out


def test_the_stubs_say_what_the_native_module_holds():
    assert mismatches(native, STUB.read_text()) == []


def test_the_check_sees_a_missing_method_and_a_renamed_parameter():
    text = STUB.read_text()
    assert "    def close(self) -> None: ..." in text
    found = mismatches(native, text.replace("    def close(self) -> None: ...\n", "", 1))
    assert found == ["Store.close: in the module, not in the stubs"]
    renamed = text.replace("memory_budget_bytes: int | None = None", "budget: int | None = None", 1)
    found = mismatches(native, renamed)
    assert len(found) == 1 and found[0].startswith("Store.__init__("), found
