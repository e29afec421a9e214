"""A training job the distributed tests run under ``torchrun`` (any process count that divides
the global batch): the same global batches at every process count, process ``r`` training on
the ``r``-th slice of each, and every table's rows written out at the end for the test to
compare.

Models: ``exact`` (a sparse-only loss whose gradients are small integers, SGD with a power-of-two
learning rate: every sum is exact, so the rows are bit-identical at every process count) and
``mlp`` (embeddings -> DDP'd MLP -> BCE, Adam and Adagrad: equal within float-summation
tolerance across process counts).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import embstore

GLOBAL_BATCH = 64
TABLES = {"user": 8, "item": 8, "tag": 4}


def global_batches(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        out.append(
            {
                # Zipf-ish ids: hot ids repeat within and across processes' slices.
                "user": (rng.zipf(1.3, GLOBAL_BATCH) % 5000).astype(np.int64),
                "item": (rng.zipf(1.2, (GLOBAL_BATCH, 3)) % 20000).astype(np.int64) * 7919,
                "tag": rng.integers(0, 50, (GLOBAL_BATCH, 2)).astype(np.int64),
                "label": rng.integers(0, 2, GLOBAL_BATCH).astype(np.float32),
            }
        )
    return out


def my_slice(batches: list[dict[str, np.ndarray]], rank: int, world: int) -> list[dict]:
    per = GLOBAL_BATCH // world
    return [{k: v[rank * per : (rank + 1) * per] for k, v in b.items()} for b in batches]


def ids_of(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"user": b["user"], "item": b["item"], "tag": b["tag"].reshape(-1)}


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8 + 3 * 8 + 4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(-1)


def make_store(path: pathlib.Path, model: str, budget: int | None) -> embstore.Store:
    store = embstore.DistributedStore(path, memory_budget_bytes=budget)
    for name, dim in TABLES.items():
        if model in ("exact", "sign"):
            opt: embstore.Optimizer = embstore.SGD(lr=1 / 16)
        elif name == "user":
            opt = embstore.Adam(lr=0.01)
        else:
            opt = embstore.Adagrad(lr=0.05)
        store.create_table(name, dim, optimizer=opt, seed=len(name))
    return store


def dump(store: embstore.Store, out: pathlib.Path) -> None:
    arrays = {}
    for name in TABLES:
        local = store.table(name).local
        chunks = list(local.export(chunk_rows=1 << 20))
        arrays[f"{name}_ids"] = np.concatenate([c.ids for c in chunks])
        arrays[f"{name}_values"] = np.concatenate([c.values for c in chunks])
        arrays[f"{name}_state"] = np.concatenate([c.state for c in chunks])
        arrays[f"{name}_step"] = np.array(local.step)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"rank-{store.rank}.npz", **arrays)


def train(
    args: argparse.Namespace,
    run: str,
    model: str,
    prefetch: int | None,
    budget: int | None,
    staleness: int = 0,
):
    rank, world = dist.get_rank(), dist.get_world_size()
    base = pathlib.Path(args.work) / run
    torch.manual_seed(0)
    head = Head()
    ddp = nn.parallel.DistributedDataParallel(head) if model == "mlp" else None
    dense_opt = torch.optim.Adam(head.parameters(), lr=0.01) if ddp is not None else None
    start_batch = 0
    ckpt = embstore.latest_checkpoint(base / "ckpt") if args.resume else None
    if args.restore:
        ckpt = pathlib.Path(args.restore)
    if ckpt is not None:
        state = embstore.training_state(ckpt)
        start_batch = state["batch"]
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = embstore.DistributedStore.restore(
            ckpt, base / f"store-r{attempt}", memory_budget_bytes=budget
        )
        if ddp is not None:
            head.load_state_dict(state["head"])
            dense_opt.load_state_dict(state["opt"])
        print(f"rank {rank}: resumed from {ckpt.name} at batch {start_batch}", flush=True)
    else:
        store = make_store(base / "store", model, budget)
    batches = my_slice(global_batches(args.seed, args.batches), rank, world)[start_batch:]
    sess = store.session(
        list(TABLES), prefetch=prefetch, grad_average=(model == "mlp"), staleness=staleness
    )
    done = start_batch
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for b in sess.run(batches, ids_of):
        n = len(b.label)
        if model == "sign":
            # d loss / d row = +-1, 2, 3: exact sums, and they depend on the rows' values
            # (their signs), so a stale read shows in the result.
            loss = (
                b.embeddings("user").abs().sum(-1) * 3
                + b.embeddings("item").abs().sum(dim=(-1, -2)) * 2
                + b.bags("tag", torch.arange(0, 2 * n, 2), mode="sum").abs().sum(-1)
            ).sum()
            loss.backward()
            b.push_grads()
        elif model == "exact":
            # d loss / d row = small integers: every sum below is exact in float32.
            loss = (
                b.embeddings("user").sum(-1) * 3
                + b.embeddings("item").sum(dim=(-1, -2)) * 2
                + b.bags("tag", torch.arange(0, 2 * n, 2), mode="sum").sum(-1)
            ).sum()
            loss.backward()
            b.push_grads()
        else:
            x = torch.cat(
                [
                    b.embeddings("user"),
                    b.embeddings("item").reshape(n, -1),
                    b.bags("tag", torch.arange(0, 2 * n, 2), mode="mean"),
                ],
                dim=1,
            )
            loss = nn.functional.binary_cross_entropy_with_logits(ddp(x), torch.from_numpy(b.label))
            loss.backward()
            b.push_grads()
            dense_opt.step()
            dense_opt.zero_grad()
        done += 1
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            state = {"batch": done}
            if ddp is not None:
                state |= {"head": head.state_dict(), "opt": dense_opt.state_dict()}
            if args.kill_in_checkpoint == done and first_attempt and rank == world - 1:
                die_after_writing_my_partition(store, rank, done)
            store.checkpoint(base / "ckpt" / f"batch-{done:05d}", step=done, state=state)
        if args.kill_at == done and first_attempt:
            if rank == world - 1:
                print(f"rank {rank}: killing myself (SIGKILL) after batch {done}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    stats = sess.stats()
    if rank == 0:
        print(f"{run}: {stats['batches']} batches, stages {stats['busy_s']}", flush=True)
    dump(store, pathlib.Path(args.out) / run)
    look = pathlib.Path(args.out) / run / f"lookahead-{rank}.json"
    look.write_text(json.dumps(stats["lookahead"]))
    if rank == 0 and ddp is not None:
        torch.save(head.state_dict(), pathlib.Path(args.out) / run / "head.pt")
    store.close()


def die_after_writing_my_partition(store: embstore.DistributedStore, rank: int, done: int) -> None:
    """Make this process die (SIGKILL) inside the next checkpoint, once it has written its
    partition: the checkpoint directory is left begun, with partitions, and no manifest."""
    local = store.local
    write = local.checkpoint

    def write_then_die(path, since=None, *, progress=False):
        write(path, since, progress=progress)
        print(
            f"rank {rank}: killing myself (SIGKILL) in the checkpoint at batch {done}", flush=True
        )
        os.kill(os.getpid(), signal.SIGKILL)

    local.checkpoint = write_then_die


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default="exact,sign,sign-stale,mlp-seq,mlp-pipe-budget,mlp-lookahead")
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument(
        "--kill-in-checkpoint",
        type=int,
        default=0,
        help="the last process dies in the checkpoint at this batch (first attempt only)",
    )
    p.add_argument("--resume", action="store_true", help="from the latest checkpoint, if any")
    p.add_argument("--restore", help="from this checkpoint (of any process count)")
    args = p.parse_args()
    torch.set_num_threads(1)
    embstore.init_distributed()
    plans = {
        "exact": ("exact", 2, None),
        "sign": ("sign", 2, None),
        "sign-stale": ("sign", 2, 96 << 10, 1),
        "mlp-seq": ("mlp", 0, None),
        "mlp-pipe-budget": ("mlp", 2, 96 << 10),
        # The default lookahead, under a budget that holds several batches ahead.
        "mlp-lookahead": ("mlp", None, 384 << 10),
    }
    for run in args.runs.split(","):
        train(args, run, *plans[run])
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
