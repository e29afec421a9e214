"""PageRank on the parameter server: a virtual iteration tells it what each worker touches,
then every real iteration reads its rows in bulk from a static arena.

Run: ``.venv/bin/python examples/iterstore_pagerank.py`` (after ``make develop``): a seeded
random graph of 5,000 nodes; ``--edges .data/iter/debian-graph.tsv`` for Debian's package
dependency graph (``make iter-data``). The ranks are checked against scipy.sparse.
"""

import argparse
import time

import numpy as np
import scipy.sparse as sp

import embstore

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--edges", help="src<TAB>dst per line ('#' comments); default: random")
parser.add_argument("--iters", type=int, default=20)
parser.add_argument("--workers", type=int, default=2)
args = parser.parse_args()

if args.edges:
    e = np.loadtxt(args.edges, dtype=np.int64, comments="#", ndmin=2)
    src, dst = e[:, 0], e[:, 1]
else:
    rng = np.random.default_rng(7)
    src, dst = rng.integers(0, 5000, 25_000), rng.zipf(1.5, 25_000) % 5000
    keep = src != dst
    src, dst = src[keep], dst[keep]
n = int(max(src.max(), dst.max())) + 1
out_degree = np.bincount(src, minlength=n)
dangling = np.flatnonzero(out_degree == 0)
order = np.argsort(dst, kind="stable")  # in-edges grouped by destination
in_src, in_dst = src[order], dst[order]
d = 0.85

store = embstore.Store()
store.create_table("rank", 1, optimizer=embstore.Delta(), initializer=embstore.Constant(1 / n))
store.create_table(
    "dangling", 1, optimizer=embstore.Delta(), initializer=embstore.Constant(len(dangling) / n)
)
ps = store.ps(["rank", "dangling"], workers=args.workers)


def iteration(w):
    """Worker w owns the nodes v % workers == w: new rank from its in-neighbours' ranks."""
    mine = np.arange(w.id, n, args.workers)
    edges = np.isin(in_dst, mine)
    srcs, dsts = in_src[edges], in_dst[edges]
    base = (1 - d) / n + d * w.read("dangling", [0])[0, 0] / n
    old = w.read("rank", mine)[:, 0]
    contrib = w.read("rank", srcs)[:, 0] / out_degree[srcs]
    new = base + d * np.bincount(dsts, weights=contrib, minlength=n)[mine]
    w.update("rank", mine, (new - old)[:, None])
    w.update("dangling", [0], [[np.sum((new - old)[out_degree[mine] == 0])]])
    w.clock()


with ps.gather(virtual=True) as g:  # reads return zeros here: nothing is read or written
    for w in range(args.workers):
        iteration(g.worker(w))
plan = ps.finish_gather()
print("plan:", plan)

start = time.perf_counter()
ps.run(iteration, clocks=args.iters)
took = time.perf_counter() - start
ranks = store["rank"].lookup(np.arange(n))[:, 0]

# The same power iteration in float64 with scipy.sparse.
m = sp.csr_matrix((1 / out_degree[src], (dst, src)), shape=(n, n))
r = np.full(n, 1 / n)
for _ in range(args.iters):
    r = d * (m @ r + r[dangling].sum() / n) + (1 - d) / n
top = np.argsort(-ranks)[:3]
print(f"{n} nodes, {len(src)} edges, {args.iters} iterations in {took:.3f} s")
print("top nodes:", top.tolist(), "ranks", [round(float(x), 5) for x in ranks[top]])
print(f"max |rank - scipy| = {np.abs(ranks - r).max():.2e}")
s = ps.stats()
print(f"rows fetched one at a time: {s['fetches']}, prefetched: {s['prefetch_rows']}")
