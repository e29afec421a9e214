#!/usr/bin/env python3
"""Draws the workspace's crates in layers: docs/img/architecture.png.

The graph comes from ``cargo metadata --format-version 1 --no-deps``: the workspace members and,
for each, its normal and build dependencies on other members (dev-dependencies are left out:
a test may reach up, the code may not). It works for whatever crates exist.

Parts
- ``crate_graph``: member -> the members it depends on, with each member's description.
- ``find_cycle``: a dependency circle as a list of crates, or ``None``.
- ``layers``: layer 0 holds the crates that depend on no member; every other crate sits one
  layer above the highest crate it depends on, so a crate is always above everything it
  depends on and an arrow always points down.
- ``depends_on``: the transitive closure, for the layering rules that
  ``python/tests/unit/test_architecture.py`` checks.
- ``draw``: boxes per layer, ordered within a layer to cross fewer arrows (a few barycentre
  sweeps), an arrow from each crate to each crate it depends on directly.

Usage (the project venv has matplotlib)::

    .venv/bin/python scripts/architecture_diagram.py [--out docs/img/architecture.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "img" / "architecture.png"

# One line per crate for the boxes; a crate not named here shows the first clause of its
# Cargo.toml description.
ROLES = {
    "embstore-common": "shared vocabulary: Error, shard_of_key, hashers, clocks",
    "embstore-index": "NeighborHash: the cacheline-aware hash index",
    "embstore-policy": "replacement policies: store eviction, cache policies",
    "embstore-table": "tables, shards, optimizers; tier, durability, disk/",
    "embstore-cache": "inference cache: levels, codecs, surrogates, evaluator",
    "embstore-replication": "dissemination: the sync state machine, simulated network",
    "embstore-proto": "gRPC wire contract",
    "embstore-cluster": "control plane: etcd, assignments, rolls, publish",
    "embstore-server": "services: hosting, lookup, admin, metrics, TLS",
    "embstore-client": "data plane: fan-out, version-consistent reads",
    "embstore-python": "PyO3 bindings: embstore._native",
    "embstore-bench": "load generator and workload profiles",
}


def cargo_metadata(root: Path = ROOT) -> dict:
    """``cargo metadata`` of the workspace at `root` (no registry access: ``--no-deps``)."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=root,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(out)


def crate_graph(meta: dict) -> tuple[dict[str, set[str]], dict[str, str]]:
    """(member -> members it depends on, member -> description) from cargo metadata."""
    members = set(meta["workspace_members"])
    packages = [p for p in meta["packages"] if p["id"] in members]
    names = {p["name"] for p in packages}
    graph: dict[str, set[str]] = {}
    about: dict[str, str] = {}
    for p in packages:
        deps = {
            d.get("rename") or d["name"]
            for d in p["dependencies"]
            if d["kind"] in (None, "build") and d["name"] in names
        }
        graph[p["name"]] = {d for d in deps if d in names}
        about[p["name"]] = p.get("description") or ""
    return graph, about


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A dependency circle (first crate repeated at the end), or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(c: str) -> list[str] | None:
        state[c] = 1
        path.append(c)
        for d in sorted(graph.get(c, ())):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[c] = 2
        return None

    for c in sorted(graph):
        if c not in state and (found := visit(c)):
            return found
    return None


def layers(graph: dict[str, set[str]]) -> list[list[str]]:
    """Crates by layer, bottom first (see the module docs). Raises ValueError on a circle."""
    cycle = find_cycle(graph)
    if cycle:
        raise ValueError("dependency circle: " + " -> ".join(cycle))
    level: dict[str, int] = {}

    def height(c: str) -> int:
        if c not in level:
            level[c] = 1 + max((height(d) for d in graph[c]), default=-1)
        return level[c]

    out: list[list[str]] = [[] for _ in range(1 + max(map(height, graph), default=-1))]
    for c in sorted(graph):
        out[level[c]].append(c)
    return out


def depends_on(graph: dict[str, set[str]], crate: str) -> set[str]:
    """Every member `crate` depends on, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(crate, ()))
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo.extend(graph.get(c, ()))
    return seen


def order_within_layers(graph: dict[str, set[str]], rows: list[list[str]]) -> list[list[str]]:
    """Rows reordered so that arrows cross less: each crate moves towards the mean position of
    its neighbours in the layers below and above (barycentre heuristic, a few sweeps)."""
    rows = [list(r) for r in rows]
    users: dict[str, set[str]] = {c: set() for c in graph}
    for c, deps in graph.items():
        for d in deps:
            users[d].add(c)

    def pos() -> dict[str, float]:
        return {c: (i + 0.5) / len(r) for r in rows for i, c in enumerate(r)}

    for _ in range(4):
        for k in list(range(1, len(rows))) + list(range(len(rows) - 2, -1, -1)):
            p = pos()

            def key(c: str, p: dict[str, float] = p) -> float:
                near = [p[n] for n in graph[c] | users[c]]
                return sum(near) / len(near) if near else p[c]

            rows[k].sort(key=key)
    return rows


def role(name: str, description: str) -> str:
    if name in ROLES:
        return ROLES[name]
    first = description.split(":")[0].split(",")[0].strip()
    return first[:60]


def draw(graph: dict[str, set[str]], about: dict[str, str], out: Path) -> None:
    """Writes the layered diagram of `graph` to `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    rows = order_within_layers(graph, layers(graph))
    width = max(len(r) for r in rows)
    box_w, box_h, gap_x, gap_y = 2.6, 0.9, 0.5, 0.9
    fig_w = max(8.0, width * (box_w + gap_x) + 1.6)
    fig_h = len(rows) * (box_h + gap_y) + 1.2
    fig, ax = plt.subplots(figsize=(fig_w * 0.75, fig_h * 0.75))
    ax.set_xlim(0, fig_w)
    ax.set_ylim(0, fig_h)
    ax.axis("off")
    cmap = plt.get_cmap("Pastel1")
    centre: dict[str, tuple[float, float]] = {}
    for k, row in enumerate(rows):
        y = 0.6 + k * (box_h + gap_y)
        span = len(row) * box_w + (len(row) - 1) * gap_x
        x0 = 1.2 + (fig_w - 1.2 - span) / 2
        ax.text(0.15, y + box_h / 2, f"layer {k}", va="center", fontsize=8, color="0.45")
        for i, c in enumerate(row):
            x = x0 + i * (box_w + gap_x)
            centre[c] = (x + box_w / 2, y + box_h / 2)
            ax.add_patch(
                FancyBboxPatch(
                    (x, y),
                    box_w,
                    box_h,
                    boxstyle="round,pad=0.02,rounding_size=0.08",
                    facecolor=cmap(k % 9),
                    edgecolor="0.3",
                    linewidth=1.0,
                    zorder=2,
                )
            )
            ax.text(
                x + box_w / 2,
                y + box_h * 0.7,
                c,
                ha="center",
                va="center",
                fontsize=9,
                fontweight="bold",
                zorder=3,
            )
            text = "\n".join(textwrap.wrap(role(c, about.get(c, "")), 30)[:2])
            ax.text(
                x + box_w / 2,
                y + box_h * 0.3,
                text,
                ha="center",
                va="center",
                fontsize=6.5,
                color="0.2",
                zorder=3,
            )
    level = {c: k for k, row in enumerate(rows) for c in row}
    for c, deps in graph.items():
        for d in deps:
            (x1, y1), (x2, y2) = centre[c], centre[d]
            # Spread the ends along the box edges towards the other end, and draw an arrow
            # that skips layers lighter and bent, so that it does not run through the boxes.
            lean = max(-0.4 * box_w, min(0.4 * box_w, (x2 - x1) * 0.2))
            skips = level[c] - level[d] > 1
            ax.add_patch(
                FancyArrowPatch(
                    (x1 + lean, y1 - box_h / 2),
                    (x2 - lean, y2 + box_h / 2),
                    arrowstyle="-|>",
                    mutation_scale=9,
                    color="0.6" if skips else "0.3",
                    linewidth=0.7 if skips else 0.9,
                    connectionstyle=f"arc3,rad={0.18 if skips else 0.0}",
                    shrinkA=1,
                    shrinkB=1,
                    zorder=1,
                )
            )
    ax.set_title(
        "embstore crates by layer: an arrow means depends on (grey: skips a layer);\n"
        "a crate sits above everything it depends on",
        fontsize=10,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG to write")
    args = ap.parse_args(argv)
    graph, about = crate_graph(cargo_metadata())
    try:
        rows = layers(graph)
    except ValueError as e:
        print(f"architecture_diagram: {e}", file=sys.stderr)
        return 1
    draw(graph, about, args.out)
    for k, row in reversed(list(enumerate(rows))):
        print(f"layer {k}: {', '.join(row)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
