"""A durable store: tables larger than memory, flush, checkpoints, restore, inspect and verify.

Run: ``.venv/bin/python examples/durable_store.py`` (after ``make develop``). Everything is
written to a temporary directory, deleted at the end.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import embstore

root = pathlib.Path(tempfile.mkdtemp(prefix="embstore-example-"))
rng = np.random.default_rng(0)

# A store kept in a directory, with room in memory for about a tenth of its rows: the others
# live on disk and are read back when a batch uses them.
store = embstore.Store(root / "ctr", memory_budget_bytes=2 << 20)
user = store.create_table("user", embedding_dim=16, optimizer=embstore.Adagrad(lr=0.05))

for _ in range(50):
    ids = rng.integers(0, 50_000, 1024)
    with user.pinned(ids):  # the step's rows stay in memory until it is done
        rows = user.lookup(ids)
        user.apply_gradients(ids, rng.standard_normal(rows.shape).astype(np.float32))
stats = user.stats()
print(
    f"rows {stats['rows']:,}, on disk {stats['rows_on_disk']:,}, read back {stats['cold_reads']:,}"
)

written = store.flush()  # every write so far is durable
print("flushed", written["records"], "records")

ckpt = store.checkpoint(root / "ckpt-1")  # a consistent snapshot: hard links + a manifest
user.apply_gradients(ids, np.ones((len(ids), 16), np.float32))
inc = store.checkpoint(root / "ckpt-2", since=ckpt)  # only what changed since ckpt-1
print("checkpoints", ckpt.segments, "and", inc.segments, "segments")

# Restore the chain onto another shard count, as a new store.
copy = embstore.Store.restore(inc, root / "copy", num_shards=16)
same = np.array_equal(copy["user"].lookup(ids, on_miss="error"), user.lookup(ids))
print(
    "restored",
    len(copy["user"]),
    "rows on",
    copy["user"].config["num_shards"],
    "shards; same:",
    same,
)

# The command line reads a store or a checkpoint without opening it.
out = subprocess.run(
    [sys.executable, "-m", "embstore", "verify", "--quiet", str(root / "ckpt-2")],
    capture_output=True,
    text=True,
)
print(out.stdout.strip().splitlines()[-1])

del user, store, copy
reopened = embstore.Store(root / "ctr")  # every flushed row comes back
print("reopened", len(reopened["user"]), "rows")
del reopened
shutil.rmtree(root)
