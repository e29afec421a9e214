"""Where two features meet under ``torchrun`` (2 processes), one mode per run, run by
``test_dist_combinations.py``. Every process prints ``RESULT rank=<r> ...`` lines."""

from __future__ import annotations

import argparse
import faulthandler
import os
import pathlib
import signal
import sys
import time

import numpy as np
import torch

import embstore


def grad_scaler_unscale_first(work: pathlib.Path, rank: int) -> None:
    """``scaler.unscale_(sparse_opt)`` (to clip) before ``scaler.step``, an overflow on
    process 1 only: both processes skip and both scalers back off alike."""
    import embstore.torch as et

    store = embstore.DistributedStore(work / "s")
    t = store.create_table("t", 4, optimizer=embstore.SGD(lr=0.1), seed=3)
    emb = et.Embedding(t)
    opt = et.EmbeddingOptimizer(emb)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    probe = np.arange(0, 64)
    _ = t.lookup(probe)
    before = t.lookup(probe)
    loss = emb(torch.arange(rank, 64, 2)).pow(2).sum()
    if rank == 1:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    same = np.array_equal(t.lookup(probe), before)
    print(f"RESULT rank={rank} unchanged={same} scale={scaler.get_scale()}", flush=True)


def ebc_ddp_amp(work: pathlib.Path, rank: int) -> None:
    """EmbeddingBagCollection over a distributed store's tables, DDP over the dense part, a
    GradScaler stepping both optimizers, and an lr scheduler on the embedding optimizer."""
    import embstore.torch as et

    store = embstore.DistributedStore(work / "s")
    cfgs = [
        et.EmbeddingBagConfig(
            name="t_item",
            embedding_dim=4,
            feature_names=["item", "hist"],
            optimizer=embstore.Adam(lr=0.05),
            initializer=embstore.Uniform(-1, 1),
            data_type="BF16",
        ),
        et.EmbeddingBagConfig(
            name="t_user",
            embedding_dim=4,
            feature_names=["user"],
            pooling="mean",
            optimizer=embstore.Adagrad(lr=0.05),
            initializer=embstore.Uniform(-1, 1),
        ),
    ]
    ebc = et.EmbeddingBagCollection(store, cfgs)
    torch.manual_seed(0)
    dense = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(12, 1))
    sparse = et.EmbeddingOptimizer(ebc)
    sched = torch.optim.lr_scheduler.StepLR(sparse, step_size=1, gamma=0.5)
    dopt = torch.optim.SGD(dense.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        lengths = torch.randint(0, 3, (3 * 8,), generator=g)
        values = torch.randint(0, 50, (int(lengths.sum()),), generator=g)
        kjt = et.KeyedJaggedTensor.from_lengths_sync(["item", "hist", "user"], values, lengths)
        loss = dense(ebc(kjt).values()).square().mean()
        scaler.scale(loss).backward()
        scaler.step(dopt)
        scaler.step(sparse)
        scaler.update()
        sched.step()
        dopt.zero_grad()
        sparse.zero_grad()
    saved = sparse.state_dict()
    other = et.EmbeddingOptimizer(ebc)
    other.load_state_dict(saved)
    steps = [store.table(n).local.step for n in ("t_item", "t_user")]
    print(
        f"RESULT rank={rank} steps={steps} scale={scaler.get_scale()} "
        f"lr={other.param_groups[0]['lr']}",
        flush=True,
    )


def checkpoint_vs_session(work: pathlib.Path, rank: int, prefetch: int) -> None:
    """Process 0 checkpoints (a rank-0-only checkpoint) while process 1 goes on to a
    session's next batch: they are out of step; how soon does each say so, and how?"""
    store = embstore.DistributedStore(work / "s")
    store.create_table("t", 4, optimizer=embstore.SGD(lr=0.1), seed=1)
    sess = store.session(["t"], prefetch=prefetch)  # collective: opened on both
    began = time.monotonic()
    try:
        if rank == 0:
            store.checkpoint(work / "ckpt", step=1)
        else:
            for b in sess.run([np.arange(8)] * 2, lambda i: {"t": i}):
                b.embeddings("t").sum().backward()
                b.push_grads()
    finally:
        print(f"RESULT rank={rank} seconds={time.monotonic() - began:.0f}", flush=True)


def restore_bf16_whole(work: pathlib.Path, rank: int) -> None:
    """A distributed checkpoint of a bf16 table, restored whole on process 0 alone."""
    store = embstore.DistributedStore(work / "s")
    store.create_table("t", 4, optimizer=embstore.Adam(lr=0.1), seed=1, dtype="bf16")
    sess = store.session(["t"], prefetch=1)
    rng = np.random.default_rng(rank)
    for b in sess.run([rng.integers(0, 500, 64) for _ in range(3)], lambda i: {"t": i}):
        b.embeddings("t").pow(2).sum().backward()
        b.push_grads()
    probe = np.arange(0, 500, 3)
    expected = store.table("t").lookup(probe, "zeros")
    store.checkpoint(work / "ckpt", step=3)
    if rank == 0:
        whole = embstore.Store.restore(work / "ckpt", work / "whole")
        got = whole["t"].lookup(probe, "zeros")
        print(
            f"RESULT rank=0 same={np.array_equal(got, expected)} "
            f"dtype={whole['t'].config['dtype']} step={whole['t'].step}",
            flush=True,
        )
        whole.close()
    torch.distributed.barrier()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--work", required=True)
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    work = pathlib.Path(args.work)
    try:
        embstore.init_distributed()
        if args.mode == "unscale_first":
            grad_scaler_unscale_first(work, rank)
        elif args.mode == "ebc_ddp_amp":
            ebc_ddp_amp(work, rank)
        elif args.mode.startswith("ckpt_vs_session"):
            checkpoint_vs_session(work, rank, int(args.mode.rsplit("_", 1)[1]))
        elif args.mode == "restore_bf16":
            restore_bf16_whole(work, rank)
        else:
            raise SystemExit(f"unknown mode {args.mode}")
    except embstore.EmbstoreError as e:
        print(f"RESULT rank={rank} {type(e).__name__}: {e}", flush=True)
        return 3
    print(f"RESULT rank={rank} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
