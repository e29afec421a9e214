"""A job the DCP checkpoint tests run (``test_dist_checkpoint_dcp.py``): a model with embstore
modules and a table trained by a session, over a distributed store, saved and loaded with
``torch.distributed.checkpoint`` through :class:`embstore.torch.checkpoint.StoreState`.

``train`` (under torchrun): train the model (DDP'd dense head, Adam and row-wise Adagrad tables)
and a session's table (Adagrad), try ``model.state_dict()`` (printing its error), ``dcp.save``,
and write every process's rows out. ``load`` (under torchrun, or ``--plain``: one process over a
store of its own, no ``torch.distributed``): the same model code over a new store,
``dcp.load``, rows written out; then one more training step, to show it trains on.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

import embstore
import embstore.torch as et
from embstore.torch.checkpoint import StoreState

TABLES = {
    "user": (8, embstore.Adam(lr=0.01)),
    "item": (8, embstore.RowWiseAdagrad(lr=0.05)),
    "tag": (4, embstore.Adagrad(lr=0.05)),
}
BATCH = 32


class Model(nn.Module):
    def __init__(self, store: embstore.Store) -> None:
        super().__init__()
        self.user = et.Embedding(store["user"])
        self.item = et.EmbeddingBag(store["item"], mode="sum")
        self.head = nn.Linear(16, 1)

    def forward(self, user: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.user(user), self.item(items)], dim=1)).squeeze(-1)


def make_store(path: pathlib.Path | None, distributed: bool) -> embstore.Store:
    store = embstore.DistributedStore(path) if distributed else embstore.Store()
    for name, (dim, opt) in TABLES.items():
        store.create_table(name, dim, optimizer=opt, seed=len(name))
    return store


def batch(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    user = torch.from_numpy(rng.integers(0, 3000, BATCH))
    items = torch.from_numpy(rng.integers(0, 50_000, (BATCH, 3)) * 7)
    label = torch.from_numpy(rng.integers(0, 2, BATCH).astype(np.float32))
    return user, items, label


def step(model: nn.Module, opts: list, rng: np.random.Generator) -> None:
    user, items, label = batch(rng)
    loss = nn.functional.binary_cross_entropy_with_logits(model(user, items), label)
    loss.backward()
    for o in opts:
        o.step()
        o.zero_grad()


def dump(store: embstore.Store, model: Model, out: pathlib.Path) -> None:
    arrays = {}
    for name in TABLES:
        local = store.table(name).local
        chunks = list(local.export(chunk_rows=1 << 20))
        arrays[f"{name}_ids"] = np.concatenate([c.ids for c in chunks])
        arrays[f"{name}_values"] = np.concatenate([c.values for c in chunks])
        arrays[f"{name}_state"] = np.concatenate([c.state for c in chunks])
        arrays[f"{name}_versions"] = np.concatenate([c.versions for c in chunks])
        arrays[f"{name}_step"] = np.array(local.step)
    for k, v in model.head.state_dict().items():
        arrays[f"head_{k}"] = v.numpy()
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"rank-{store.rank}.npz", **arrays)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "load"])
    p.add_argument("--work", required=True)
    p.add_argument("--plain", action="store_true")
    args = p.parse_args()
    work = pathlib.Path(args.work)
    ckpt = work / "dcp"
    if args.mode == "train":
        store = make_store(work / "store", distributed=True)
        rank = store.rank
        torch.manual_seed(0)
        model = Model(store)
        ddp = nn.parallel.DistributedDataParallel(model)
        dense = torch.optim.Adam(model.head.parameters(), lr=0.01)
        opts = [et.EmbeddingOptimizer(model), dense]
        rng = np.random.default_rng(100 + rank)
        for _ in range(4):
            user, items, label = batch(rng)
            loss = nn.functional.binary_cross_entropy_with_logits(ddp(user, items), label)
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad()
        sess = store.session(["tag"], prefetch=0)
        tags = [rng.integers(0, 400, 2 * BATCH) for _ in range(3)]
        for b in sess.run(tags, ids=lambda t: {"tag": t}):
            b.bags("tag", torch.arange(0, 2 * BATCH, 2), mode="mean").square().sum().backward()
            b.push_grads()
        try:
            model.state_dict()
            print(f"rank {rank}: STATE_DICT_OK", flush=True)
        except embstore.InvalidArgumentError as e:
            print(f"rank {rank}: STATE_DICT_ERROR {e}", flush=True)
        dcp.save(
            {"model": StoreState(model), "sessions": StoreState([store["tag"]])},
            checkpoint_id=ckpt,
        )
        dump(store, model, work / "saved")
        store.close()
        return 0
    if args.plain:
        store = make_store(None, distributed=False)
        out = work / "loaded-plain"
    else:
        dist_world = int(__import__("os").environ["WORLD_SIZE"])
        store = make_store(work / f"store-{dist_world}", distributed=True)
        out = work / f"loaded-{dist_world}"
    model = Model(store)  # a fresh head: its parameters come from the checkpoint
    state = {"model": StoreState(model), "sessions": StoreState([store["tag"]])}
    dcp.load(state, checkpoint_id=ckpt)
    dump(store, model, out)
    # It trains on (a collective step on every process of the loading job).
    step(model, [et.EmbeddingOptimizer(model)], np.random.default_rng(7 + store.rank))
    if dist.is_initialized():
        dist.barrier()
    print(f"rank {store.rank}: LOADED", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
