"""A parameter-server job the distributed tests run under ``torchrun``: every process runs
``--workers`` threads over the tables of one distributed store; after the run (and ``close()``,
which moves placed rows back) each process writes the rows the store keeps on it to
``OUT/rank-<r>.json`` for the test to compare with one process running every worker.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

import embstore
from embstore import distributed as edist

KEYS = {"L": 80, "R": 25}


def iteration(total_workers: int):
    """An MF-like iteration: reads depend on earlier updates, deltas on reads (the unit tests'
    ``iteration``, by global worker number)."""

    def run(w):
        g = w.global_id
        users = np.arange(g, 80, total_workers)
        items = (users * 7 + 3) % 25
        for u, i in zip(users, items, strict=True):
            lu, ri = w.read("L", [u])[0], w.read("R", [i])[0]
            err = 1.0 - float(lu @ ri)
            w.update("L", [u], (0.05 * (err * ri - 0.01 * lu))[None])
            w.update("R", [i], (0.05 * (err * lu - 0.01 * ri))[None])
        w.clock()

    return run


def make_tables(store) -> None:
    """The job's tables (the test's one-process reference makes the same)."""
    for name in KEYS:
        store.create_table(
            name,
            embedding_dim=4,
            optimizer=embstore.Delta(),
            initializer=embstore.Uniform(-1.0, 1.0),
            seed=3,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clocks", type=int, default=5)
    ap.add_argument("--specialise", default="all")
    ap.add_argument("--gather", choices=["virtual", "first"], default="virtual")
    args = ap.parse_args()
    embstore.init_distributed()
    store = embstore.DistributedStore(args.path)
    make_tables(store)
    ps = store.ps(["L", "R"], workers=args.workers, specialise=args.specialise)
    total = ps.processes * ps.workers
    run = iteration(total)
    clocks = args.clocks
    if args.gather == "virtual":
        with ps.gather(virtual=True) as g:
            for w in range(ps.workers):
                run(g.worker(w))
    else:
        ps.gather(virtual=False)
        ps.run(run, clocks=1)
        clocks -= 1
    plan = ps.finish_gather()
    ps.run(run, clocks=clocks)
    stats = ps.stats()
    ps.close()
    rank, world = store.rank, store.world_size
    rows, stray = {}, 0
    for name, n in KEYS.items():
        ids = np.arange(n, dtype=np.uint64)
        mine = ids[edist.owner_of(ids, world) == rank]
        table = store.local[name]
        rows[name] = {int(k): v.tolist() for k, v in zip(mine, table.lookup(mine), strict=True)}
        others = ids[edist.owner_of(ids, world) != rank]
        stray += int(table.contains(others).sum())
    out = pathlib.Path(args.out) / f"rank-{rank}.json"
    out.write_text(
        json.dumps(
            {
                "rows": rows,
                "stray": stray,
                "plan": plan.stats(),
                "stats": stats,
                "repr": repr(ps),
            }
        )
    )
    store.close()


if __name__ == "__main__":
    main()
