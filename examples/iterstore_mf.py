"""Matrix factorisation on MovieLens-100k with the parameter server: two workers (threads),
each with its users' ratings; the first epoch runs for real while the server watches it, and
every later epoch reads its rows in bulk from a static arena.

Run: ``.venv/bin/python examples/iterstore_mf.py`` (after ``make demo`` or ``make data``,
which fetch MovieLens-100k into ``.data``; ``EMBSTORE_DATA`` names another directory).
"""

import os
import pathlib
import sys
import time

import numpy as np

import embstore

path = pathlib.Path(os.environ.get("EMBSTORE_DATA", ".data")) / "ml-100k" / "ml-100k.inter"
if not path.exists():
    sys.exit(f"{path} is missing: run `make data` first")
ratings = np.loadtxt(path, skiprows=1, usecols=(0, 1, 2))
users, items, stars = ratings[:, 0].astype(np.int64), ratings[:, 1].astype(np.int64), ratings[:, 2]
RANK, LR, LAMBDA, WORKERS, BATCH = 64, 0.02, 0.05, 2, 256

store = embstore.Store()
for name in ("user", "item"):
    store.create_table(
        name, RANK, optimizer=embstore.Delta(), initializer=embstore.Normal(std=0.1), seed=1
    )
ps = store.ps(["user", "item"], workers=WORKERS)


def epoch(w):
    """One pass over worker w's ratings in mini-batches: SGD steps pushed as deltas."""
    mine = np.flatnonzero(users % WORKERS == w.id)
    for b in range(0, len(mine), BATCH):
        i = mine[b : b + BATCH]
        u, v = w.read("user", users[i]), w.read("item", items[i])  # [B, RANK] each
        err = (stars[i] - np.sum(u * v, axis=1))[:, None]
        w.update("user", users[i], LR * (err * v - LAMBDA * u))
        w.update("item", items[i], LR * (err * u - LAMBDA * v))
    w.clock()


def rmse():
    u, v = store["user"].lookup(users), store["item"].lookup(items)
    return float(np.sqrt(np.mean((stars - np.sum(u * v, axis=1)) ** 2)))


ps.gather(virtual=False)  # epoch 1 runs for real and is logged
ps.run(epoch, clocks=1)
plan = ps.finish_gather()
print(f"epoch 1: rmse {rmse():.4f}; plan: {plan}")
fetched = ps.stats()["fetches"]  # rows read one at a time while epoch 1 was watched
for e in range(2, 6):
    start = time.perf_counter()
    ps.run(epoch, clocks=1)
    print(f"epoch {e}: rmse {rmse():.4f} ({time.perf_counter() - start:.2f} s)")
s = ps.stats()
print(f"rows fetched one at a time after the plan: {s['fetches'] - fetched}, clocks {s['clocks']}")
