"""A primary that writes continuously, for the dissemination tests over the emulated WAN:
serves its sync port on LISTEN, assigns every key of ``item`` (KEYS rows of 4 floats:
``[key, count, 2 * count, 1]``, count 0), prints ``ready <address>``, then rewrites about
RATE rows a second on Zipf-skewed keys, each write raising its key's count by one. On ``stop``
(a line on stdin) it stops writing, checks that every row encodes its key and count, writes
every row to OUT.npz (``ids``, ``values``), prints ``stopped <writes> <keys written>`` and
keeps serving sync until it is stopped.

    python sync_writer.py LISTEN KEYS RATE SEED OUT.npz
"""

from __future__ import annotations

import select
import sys
import time

import numpy as np

import embstore

TICK_S = 0.01


def row(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    c = counts.astype(np.float32)
    return np.stack([keys.astype(np.float32), c, 2 * c, np.ones_like(c)], axis=1)


def main() -> None:
    listen, keys, rate, seed, out = sys.argv[1:6]
    n, per_tick = int(keys), max(1, round(float(rate) * TICK_S))
    store = embstore.Store(replica_id=1)
    t = store.create_table("item", embedding_dim=4)
    port = store.serve_sync(listen, token="t0ken")
    counts = np.zeros(n, np.int64)
    t.assign(np.arange(n), row(np.arange(n), counts))
    print(f"ready {port.address}", flush=True)
    rng = np.random.default_rng(int(seed))
    hot = rng.permutation(n)  # Zipf ranks -> keys spread over every sync part
    writes = 0
    next_tick = time.monotonic()
    while not select.select([sys.stdin], [], [], 0)[0]:
        ids = np.unique(hot[(rng.zipf(1.2, per_tick) - 1) % n])
        counts[ids] += 1
        t.assign(ids, row(ids, counts[ids]))
        writes += len(ids)
        next_tick += TICK_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
    sys.stdin.readline()
    ids, values = [], []
    for chunk in t.export(8192):
        ids.append(chunk.ids)
        values.append(chunk.values)
    ids_a, values_a = np.concatenate(ids), np.concatenate(values)
    order = np.argsort(ids_a)
    ids_a, values_a = ids_a[order], values_a[order]
    assert np.array_equal(ids_a, np.arange(n)), "the primary lost a key"
    assert np.array_equal(values_a, row(np.arange(n), counts)), "a row is not its key's count"
    np.savez(out, ids=ids_a, values=values_a)
    print(f"stopped {writes} {int((counts > 0).sum())}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
