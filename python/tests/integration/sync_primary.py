"""A training process for the dissemination tests: opens (or reopens) a store in DIR, serves
its sync port on LISTEN, prints ``ready <address>``, then runs STEPS optimizer steps on random
ids (flushing every 10), removes a few rows, flushes, writes every row to ROWS.npz and prints
``done``; then waits to be killed.

    python sync_primary.py DIR LISTEN STEPS SEED ROWS.npz
"""

from __future__ import annotations

import sys
import time

import numpy as np

import embstore


def main() -> None:
    path, listen, steps, seed, out = sys.argv[1:6]
    store = embstore.Store(path, replica_id=1)
    if "item" not in store:
        store.create_table("item", embedding_dim=8, optimizer=embstore.Adagrad(lr=0.1))
    t = store["item"]
    port = store.serve_sync(listen, token="t0ken")
    print(f"ready {port.address}", flush=True)
    rng = np.random.default_rng(int(seed))
    for step in range(int(steps)):
        ids = rng.integers(0, 3000, size=64)
        t.apply_gradients(ids, rng.standard_normal((64, 8)).astype(np.float32))
        if step % 10 == 9:
            store.flush()
        time.sleep(0.002)
    t.remove(rng.integers(0, 3000, size=20))
    store.flush()
    ids, values = [], []
    for chunk in t.export(4096):
        ids.append(chunk.ids)
        values.append(chunk.values)
    np.savez(out, ids=np.concatenate(ids), values=np.concatenate(values))
    print("done", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
