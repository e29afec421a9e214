"""The crate graph keeps its layers: no dependency circle, and the rules of docs/architecture.md.

The graph is ``cargo metadata``'s (normal and build dependencies between workspace members;
dev-dependencies may reach up, the code may not), read by ``scripts/architecture_diagram.py``,
the script that draws ``docs/img/architecture.png`` from the same graph.
"""

import importlib.util
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "architecture_diagram.py"

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")


@pytest.fixture(scope="module")
def diagram():
    spec = importlib.util.spec_from_file_location("architecture_diagram", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph(diagram):
    graph, _ = diagram.crate_graph(diagram.cargo_metadata(ROOT))
    assert "embstore-table" in graph and "embstore-index" in graph, sorted(graph)
    return graph


def test_the_workspace_has_no_dependency_circle(diagram, graph):
    assert diagram.find_cycle(graph) is None
    rows = diagram.layers(graph)
    level = {c: k for k, row in enumerate(rows) for c in row}
    assert sorted(level) == sorted(graph)
    for c, deps in graph.items():
        for d in deps:
            assert level[c] > level[d], f"{c} (layer {level[c]}) is not above {d}"


def test_a_circle_is_found_and_named(diagram):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert diagram.find_cycle(graph) == ["a", "b", "c", "a"]
    with pytest.raises(ValueError, match="dependency circle: a -> b -> c -> a"):
        diagram.layers(graph)
    assert diagram.layers({"top": {"mid", "low"}, "mid": {"low"}, "low": set()}) == [
        ["low"],
        ["mid"],
        ["top"],
    ]


def test_the_training_store_does_not_link_the_inference_cache(diagram, graph):
    assert "embstore-cache" not in diagram.depends_on(graph, "embstore-table")


def test_the_client_and_the_cluster_crate_do_not_link_the_storage_engine(diagram, graph):
    for crate in ("embstore-client", "embstore-cluster"):
        assert "embstore-table" not in diagram.depends_on(graph, crate), crate


def test_sync_does_not_link_serving(diagram, graph):
    # the follower writes into a `Target` (a store, or a server's synced versions): the trait
    # lives in the table crate and the server implements it
    assert "embstore-server" not in diagram.depends_on(graph, "embstore-sync")


def test_the_shared_vocabulary_and_the_policies_sit_below_the_engines(diagram, graph):
    assert diagram.depends_on(graph, "embstore-common") == set()
    assert diagram.depends_on(graph, "embstore-index") <= {"embstore-common"}
    assert diagram.depends_on(graph, "embstore-policy") <= {"embstore-common", "embstore-index"}
    assert "embstore-common" in diagram.depends_on(graph, "embstore-proto")


@pytest.fixture(scope="module")
def modules():
    spec = importlib.util.spec_from_file_location(
        "module_graph", ROOT / "scripts" / "module_graph.py"
    )
    graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph)
    return graph


def test_no_crate_has_a_circle_among_its_files(modules):
    crates = sorted(p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())
    assert len(crates) >= 10, crates
    found = {c.name: modules.circles(modules.module_graph(c / "src")) for c in crates}
    assert {name: c for name, c in found.items() if c} == {}
    # The check finds a circle where there is one.
    assert modules.circles({"table": {"tier"}, "tier": {"shard", "table"}, "shard": set()}) == [
        ["table", "tier"]
    ]


def test_the_python_package_has_no_import_circle(modules):
    edges = modules.python_graph()
    assert len(edges) >= 20 and "embstore.store" in edges, sorted(edges)
    assert "embstore.session" in edges["embstore.store"]  # the graph sees the imports
    assert modules.circles(edges) == []


def test_the_guard_sees_circles_between_files_of_a_folder_and_through_deferred_imports(
    modules, tmp_path
):
    src = tmp_path / "crate" / "src"
    (src / "tier").mkdir(parents=True)
    (src / "lib.rs").write_text("mod tier;\npub use tier::Tier;\n")
    (src / "tier" / "mod.rs").write_text("mod pins;\nmod reclaim;\npub struct Tier;\n")
    (src / "tier" / "pins.rs").write_text("use super::reclaim::Evict;\npub struct Pins;\n")
    (src / "tier" / "reclaim.rs").write_text(
        "pub struct Evict(crate::tier::pins::Pins);\n#[cfg(test)]\nuse crate::Tier;\n"
    )
    edges = modules.module_graph(src)
    assert edges["tier"] == set(), edges  # a folder is made of its files: no dependency
    assert modules.circles(edges) == [["tier/pins", "tier/reclaim"]], edges
    pkg = tmp_path / "embstore"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from embstore.a import A\n")
    (pkg / "a.py").write_text("class A:\n    pass\n\n\ndef f():\n    from embstore.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nfrom embstore import A\n\n"
        "if TYPE_CHECKING:\n    from embstore.c import C\nB = A\n"
    )
    (pkg / "c.py").write_text("from embstore.b import B\n")
    edges = modules.python_graph(pkg)
    assert edges["embstore.b"] == {"embstore.a"}, edges  # TYPE_CHECKING imports never run
    assert modules.circles(edges) == [["embstore.a", "embstore.b"]], edges


def test_no_module_of_the_python_package_reaches_a_private_name_of_another(modules):
    found = modules.private_reaches()
    assert found == [], "\n".join(found)


def test_the_guard_sees_private_names_reached_from_another_module(modules, tmp_path):
    pkg = tmp_path / "embstore"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_c.py").write_text("def describe():\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "class A:\n"
        "    __slots__ = ('_rows',)\n\n"
        "    def __init__(self):\n        self._rows = 1\n\n"
        "    def _grow(self):\n        return self._rows\n\n\n"
        "def use(other):\n    return other._grow(), other._rows\n\n\n"
        "_helper = 1\n"
    )
    (pkg / "sub" / "b.py").write_text(
        "import sys\n\n"
        "from embstore import _c\n"
        "from embstore._c import describe\n"
        "from ..a import A, _helper\n\n\n"
        "class B(A):\n"
        "    def f(self, a):\n"
        "        sys._getframe(0), a.__class__, super()._grow(), self._grow()\n"
        "        return a._grow(), getattr(a, '_rows'), _c, describe, _helper\n\n"
        "    def _own(self, b):\n        return b._own()\n"
    )
    assert modules.private_reaches(pkg) == [
        "embstore/sub/b.py:5: from embstore.a import _helper names '_helper', "
        "private to embstore.a",
        "embstore/sub/b.py:11: a._grow names '_grow', private to embstore.a",
        "embstore/sub/b.py:11: getattr(a, '_rows') names '_rows', private to embstore.a",
    ]
