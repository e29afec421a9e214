"""Reference implementations of the iterative benchmarks, what a user would run on one machine
instead of a parameter server: PageRank with a sparse matrix, matrix factorisation with numpy.
Each reports seconds per iteration (loading and set-up not counted) and its objective.

Command line (from the repository root; the data comes from ``lib/iterdata.py`` and
``lib/corpus.py``)::

    .venv/bin/python python/benchmarks/lib/iterref.py pagerank .data/iter/debian-graph.tsv
    .venv/bin/python python/benchmarks/lib/iterref.py mf .data/ml-100k/ml-100k.inter

Both print the median seconds per iteration over iterations 2..N (the first warms caches).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

try:
    import scipy.sparse as sp
except ImportError:  # the project's venv has no scipy: an equivalent numpy product below
    sp = None


def load_graph(edges_path: str | pathlib.Path) -> tuple[int, np.ndarray, np.ndarray]:
    """``(N, src, dst)`` of a ``src<TAB>dst`` file; N from its ``# nodes:`` header line, else
    the largest id + 1. ``#`` lines are skipped."""
    n = None
    body = []
    with open(edges_path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                key, _, value = line[1:].partition(":")
                if key.strip() == "nodes":
                    n = int(value)
            else:
                body.append(line)
    edges = np.array("".join(body).split(), dtype=np.int64).reshape(-1, 2)
    n = int(edges.max()) + 1 if n is None else n
    return n, edges[:, 0], edges[:, 1]


def pagerank_scipy(
    edges_path: str | pathlib.Path,
    iters: int = 20,
    damping: float = 0.85,
    residuals: list[float] | None = None,
) -> tuple[np.ndarray, list[float]]:
    """PageRank of the graph in ``edges_path`` by ``iters`` power iterations, in float64.

    With ``M`` the column-stochastic transition matrix (``M[d, s] = 1/outdeg(s)`` for each edge
    ``s -> d``, a CSR matrix) and ``D`` the dangling nodes (no out-edges), from ``r = 1/N``::

        r <- damping * (M @ r + sum(r[D]) / N) + (1 - damping) / N

    so ``sum(r)`` stays 1. Returns ``(r, seconds of each iteration)``; loading the file and
    building the matrix are not timed. ``residuals``, if given, gets each iteration's
    ``sum(|r_new - r|)`` appended (not timed either). Uses ``scipy.sparse.csr_matrix`` when scipy is
    installed, else the same CSR product in numpy (``np.add.reduceat`` over the row pointer).
    """
    n, src, dst = load_graph(edges_path)
    outdeg = np.bincount(src, minlength=n).astype(np.float64)
    dangling = outdeg == 0
    weights = 1.0 / outdeg[src]
    if sp is not None:
        m = sp.csr_matrix((weights, (dst, src)), shape=(n, n))
        matvec = m.__matmul__
    else:
        order = np.lexsort((src, dst))
        cols, vals = src[order], weights[order]
        indptr = np.searchsorted(dst[order], np.arange(n + 1))
        nonempty = np.flatnonzero(np.diff(indptr))

        def matvec(x: np.ndarray) -> np.ndarray:
            y = np.zeros(n)
            y[nonempty] = np.add.reduceat(vals * x[cols], indptr[nonempty])
            return y

    r = np.full(n, 1.0 / n)
    seconds = []
    for _ in range(iters):
        t0 = time.perf_counter()
        r_new = damping * (matvec(r) + r[dangling].sum() / n) + (1.0 - damping) / n
        seconds.append(time.perf_counter() - t0)
        if residuals is not None:
            residuals.append(float(np.abs(r_new - r).sum()))
        r = r_new
    return r, seconds


def load_ratings(path: str | pathlib.Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(users, items, ratings)`` of a RecBole atomic ``.inter`` file: users and items as dense
    ids 0.. in sorted order of their tokens, ratings float64. Columns are found by the header's
    names (``user_id:token``, ``item_id:token``, ``rating:float``)."""
    with open(path, encoding="utf-8") as f:
        names = [c.split(":")[0] for c in f.readline().rstrip("\n").split("\t")]
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    cols = {name: [row[names.index(name)] for row in rows] for name in ("user_id", "item_id")}
    _, users = np.unique(np.array(cols["user_id"]), return_inverse=True)
    _, items = np.unique(np.array(cols["item_id"]), return_inverse=True)
    ratings = np.array([row[names.index("rating")] for row in rows], dtype=np.float64)
    return users, items, ratings


def mf_numpy(
    ml100k_inter_path: str | pathlib.Path,
    rank: int = 256,
    epochs: int = 5,
    lr: float = 0.01,
    lam: float = 0.05,
    seed: int = 0,
) -> tuple[list[float], list[float]]:
    """Matrix factorisation ``rating ~ P[u] . Q[i]`` by mini-batch SGD, vectorised in numpy.

    ``P`` (users x rank) and ``Q`` (items x rank) start as N(0, 0.1) draws (``seed``). Each
    epoch visits the ratings in a fresh seeded random order, in mini-batches of 1000; per batch,
    with ``e = r - sum(P[u] * Q[i], 1)`` computed before either update::

        P[u] += lr * (e * Q[i] - lam * P[u])    Q[i] += lr * (e * P[u] - lam * Q[i])

    scattered with ``np.add.at`` (a user or item twice in a batch gets both updates). Returns
    ``(training RMSE over all ratings after each epoch, seconds of each epoch)``; the RMSE pass
    and loading are not timed.
    """
    users, items, ratings = load_ratings(ml100k_inter_path)
    rng = np.random.default_rng(seed)
    p = rng.normal(0.0, 0.1, (users.max() + 1, rank))
    q = rng.normal(0.0, 0.1, (items.max() + 1, rank))
    rmse, seconds = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        order = rng.permutation(len(ratings))
        for lo in range(0, len(order), 1000):
            b = order[lo : lo + 1000]
            u, i = users[b], items[b]
            pu, qi = p[u], q[i]
            e = (ratings[b] - np.einsum("bk,bk->b", pu, qi))[:, None]
            np.add.at(p, u, lr * (e * qi - lam * pu))
            np.add.at(q, i, lr * (e * pu - lam * qi))
        seconds.append(time.perf_counter() - t0)
        pred = np.einsum("bk,bk->b", p[users], q[items])
        rmse.append(float(np.sqrt(np.mean((ratings - pred) ** 2))))
    return rmse, seconds


def median_after_first(seconds: list[float]) -> float:
    """Median seconds of iterations 2..N (all of them if there is only one)."""
    return float(np.median(seconds[1:] if len(seconds) > 1 else seconds))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Single-machine reference runs of the iterative benchmarks; print seconds "
        "per iteration (median of iterations 2..N; loading not counted) and the objective."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("pagerank", help="PageRank (scipy.sparse CSR if installed, else numpy)")
    pr.add_argument("edges", type=pathlib.Path, help="src<TAB>dst file, e.g. debian-graph.tsv")
    pr.add_argument("--iters", type=int, default=20)
    pr.add_argument("--damping", type=float, default=0.85)
    pr.add_argument("--top", type=int, default=5, help="print the top K nodes (default 5)")
    mf = sub.add_parser("mf", help="matrix factorisation by numpy mini-batch SGD")
    mf.add_argument("inter", type=pathlib.Path, help="RecBole ml-100k.inter file")
    mf.add_argument("--rank", type=int, default=256)
    mf.add_argument("--epochs", type=int, default=5)
    mf.add_argument("--lr", type=float, default=0.01)
    mf.add_argument("--lam", type=float, default=0.05)
    mf.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.cmd == "pagerank":
        residuals: list[float] = []
        r, seconds = pagerank_scipy(args.edges, args.iters, args.damping, residuals)
        backend = "scipy.sparse" if sp is not None else "numpy (no scipy)"
        names_path = args.edges.with_name(args.edges.name.removesuffix(".tsv") + ".names.txt")
        names = names_path.read_text().split("\n") if names_path.exists() else None
        print(f"pagerank ({backend}): {len(r):,} nodes, {args.iters} iterations")
        print(f"seconds/iteration: {median_after_first(seconds):.4f} (median of 2..N)")
        print(f"last iteration's L1 change: {residuals[-1]:.3e}; sum(r) = {r.sum():.12f}")
        for rank, node in enumerate(np.argsort(-r)[: args.top], 1):
            label = f"  {names[node]}" if names else ""
            print(f"  #{rank} node {node}  r={r[node]:.6f}{label}")
    else:
        rmse, seconds = mf_numpy(args.inter, args.rank, args.epochs, args.lr, args.lam, args.seed)
        print(f"mf (numpy SGD): rank {args.rank}, {args.epochs} epochs, lr {args.lr}")
        for epoch, (e, s) in enumerate(zip(rmse, seconds, strict=True), 1):
            print(f"  epoch {epoch}: train RMSE {e:.4f}  {s:.3f} s")
        print(f"seconds/epoch: {median_after_first(seconds):.3f} (median of 2..N)")
        print(f"final train RMSE: {rmse[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
