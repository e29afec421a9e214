"""A job for ``test_torchrec_dlrm.py``: an ``EmbeddingBagCollection`` (a table shared by two
features, weighted input; SGD and Adam) over a distributed store, trained with
``EmbeddingOptimizer`` by every process on its slice of the same global batches; each process
writes its partition's rows and its slice's evaluation output. :func:`train` with one process
over ``Store()`` is the reference: the processes' gradients are averaged, so the rows are the
one process's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import embstore
import embstore.torch as et

GLOBAL_BATCH = 8
STEPS = 4
TABLES = ("t_item", "t_user")


def configs() -> list:
    return [
        et.EmbeddingBagConfig(
            name="t_item",
            embedding_dim=4,
            feature_names=["item", "hist"],
            optimizer=embstore.SGD(lr=0.1),
            initializer=embstore.Uniform(-0.1, 0.1),
        ),
        et.EmbeddingBagConfig(
            name="t_user",
            embedding_dim=4,
            feature_names=["user"],
            optimizer=embstore.Adam(lr=0.01),
            initializer=embstore.Uniform(-0.1, 0.1),
        ),
    ]


def batch(step: int, rank: int, world: int) -> et.KeyedJaggedTensor:
    """Process ``rank``'s slice of global batch ``step``: item (one id), hist (0-3 ids, some
    of them other samples' items: ids repeat across processes), user (one id), weighted."""
    rng = np.random.default_rng([7, step])
    n = GLOBAL_BATCH
    item = rng.integers(0, 20, n)
    user = rng.integers(100, 110, n)
    hist_len = rng.integers(0, 4, n)
    hist = rng.integers(0, 20, int(hist_len.sum()))
    weights = rng.uniform(0.5, 1.5, int(hist_len.sum()))
    per = n // world
    lo, hi = rank * per, (rank + 1) * per
    hs = np.concatenate([[0], np.cumsum(hist_len)])
    values = np.concatenate([item[lo:hi], hist[hs[lo] : hs[hi]], user[lo:hi]])
    w = np.concatenate([np.ones(per), weights[hs[lo] : hs[hi]], np.ones(per)])
    lengths = np.concatenate([np.ones(per), hist_len[lo:hi], np.ones(per)])
    return et.KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "hist", "user"],
        values=torch.from_numpy(values.astype(np.int64)),
        lengths=torch.from_numpy(lengths.astype(np.int64)),
        weights=torch.from_numpy(w.astype(np.float32)),
    )


def train(store: embstore.Store, rank: int, world: int) -> np.ndarray:
    """Train STEPS steps on this process's slices; return its slice's evaluation output."""
    ebc = et.EmbeddingBagCollection(store, configs(), is_weighted=True)
    opt = et.EmbeddingOptimizer(ebc)
    for step in range(STEPS):
        pooled = ebc(batch(step, rank, world)).values()
        loss = (pooled - 0.5).pow(2).sum(dim=1).mean()  # the mean over this process's slice
        loss.backward()
        opt.step()
        opt.zero_grad()
    ebc.eval()
    with torch.no_grad():
        return ebc(batch(99, rank, world)).values().numpy()


def main() -> None:
    out = Path(sys.argv[1])
    store = embstore.DistributedStore(out / "store")
    rank, world = store.rank, store.world_size
    evaluated = train(store, rank, world)
    arrays = {"eval": evaluated}
    for name in TABLES:
        t = store.table(name).local
        chunks = list(t.export())
        arrays[f"{name}_ids"] = np.concatenate([c.ids for c in chunks])
        arrays[f"{name}_values"] = np.concatenate([c.values for c in chunks])
        arrays[f"{name}_step"] = np.array(t.step)
    np.savez(out / f"rank-{rank}.npz", **arrays)
    torch.distributed.barrier()
    store.close()
    print(f"rank {rank} of {world} done", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
