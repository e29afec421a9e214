"""Faults of a distributed job, one per mode, run under ``torchrun`` by ``test_distributed.py``.

Every process prints one line ``RESULT rank=<r> <ExceptionType>: <message>`` (``RESULT rank=<r>
ok`` if nothing was raised) and exits 3 after an embstore error, so the test can check that every
process stopped, with which error, and quickly (no process left waiting for another)."""

from __future__ import annotations

import argparse
import atexit
import errno
import faulthandler
import os
import pathlib
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import embstore


def store_with_table(path: pathlib.Path, dim: int = 4, budget: int | None = None):
    store = embstore.DistributedStore(path, memory_budget_bytes=budget)
    store.create_table("t", dim, optimizer=embstore.Adagrad(lr=0.1), seed=1)
    return store


def train(store, batches, *, nan_on: int | None = None):
    rank = store.rank
    sess = store.session(["t"], prefetch=2)
    for n, b in enumerate(sess.run(batches, lambda ids: {"t": ids})):
        loss = b.embeddings("t").pow(2).sum()
        if nan_on == rank:
            loss = loss * float("nan")
        loss.backward()
        b.push_grads()
        if n + 1 == len(batches) // 2:
            yield n + 1


def batches_for(rank: int, n: int, seed: int = 0, span: int = 20000) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, rank])
    return [rng.integers(0, span, 256) for _ in range(n)]


def run(mode: str, work: pathlib.Path, ckpt: pathlib.Path) -> None:
    rank = int(os.environ["RANK"])
    if mode == "dtype":
        store = store_with_table(work / "s")
        data = batches_for(rank, 4)
        if rank == 1:
            data[2] = data[2].astype(np.float64) + 0.5
        list(train(store, data))
    elif mode == "config":
        store_with_table(work / "s", dim=8 if rank == 1 else 4)
    elif mode == "sessions":
        open_sessions(store_with_table(work / "s"), rank)
    elif mode == "exit":  # train, then leave without tearing anything down
        list(train(store_with_table(work / "s"), batches_for(rank, 3)))
    elif mode == "world":
        embstore.DistributedStore(work / "s")
    elif mode == "batches":
        store = store_with_table(work / "s")
        list(train(store, batches_for(rank, 6 if rank == 0 else 5)))
    elif mode == "nan":
        store = store_with_table(work / "s")
        list(train(store, batches_for(rank, 2)))
        t = store.table("t")
        probe = np.arange(0, 20000, 7)
        before = t.lookup(probe)
        try:
            list(train(store, batches_for(rank, 2, seed=1), nan_on=1))
        finally:
            # Every process raised at the same push, so the processes are still in step:
            # a collective lookup shows that no process applied anything.
            unchanged = np.array_equal(t.lookup(probe), before)
            print(f"rank={rank} unchanged={unchanged}", flush=True)
    elif mode in ("corrupt", "full"):
        budget = 64 << 10
        store = store_with_table(work / "s", budget=budget)
        steps = train(store, batches_for(rank, 40))
        done = next(steps)  # half-way: checkpoint, then damage rank 1's live store
        store.checkpoint(ckpt / f"b{done}", step=done)
        print(f"rank={rank} checkpointed", flush=True)
        store.flush()  # collective: every process
        if mode == "corrupt" and rank == 1:
            corrupt_a_segment(work / "s" / "rank-00001")
        if mode == "full" and rank == 1:
            fill_the_disk(work / "s" / "rank-00001")
        torch.distributed.barrier()
        for _ in steps:
            pass
        store.checkpoint(ckpt / "end", step=40)  # full: the flush fails here
    elif mode == "ddp_local":
        ddp_over_a_store_of_one_process()
    elif mode == "amp":
        amp_and_unused_tables(work, rank)
    elif mode == "out_of_step":
        store = store_with_table(work / "s")
        list(train(store, batches_for(rank, 2)))
        if rank == 0:  # evaluation on process 0 alone, by a collective lookup...
            store.table("t").lookup(np.arange(10))
        else:  # ...while process 1 goes on to its checkpoint
            store.checkpoint(ckpt / "c1", step=2)
    elif mode == "eval_one":
        store = store_with_table(work / "s")
        list(train(store, batches_for(rank, 3)))
        probe = np.arange(0, 20000, 13)
        expected = store.table("t").lookup(probe, "zeros")  # collective, before the checkpoint
        store.checkpoint(ckpt / "c1", step=3)
        if rank == 0:  # the documented recipe: the checkpoint, restored whole, here alone
            whole = embstore.Store.restore(ckpt / "c1", work / "eval")
            got = whole["t"].lookup(probe, "zeros")
            total = len(store.table("t").local)
            print(f"EVAL rank=0 same={np.array_equal(got, expected)} rows={len(whole['t'])}")
            whole.close()
        else:
            total = len(store.table("t").local)
        torch.distributed.barrier()
        print(f"EVAL rank={rank} local_rows={total}", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


def ddp_over_a_store_of_one_process() -> None:
    """The README's first line and the DDP a user always adds: refused at the first step."""
    import embstore.torch as et

    store = embstore.Store()
    emb = et.Embedding(store.create_table("t", 4))
    dense = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    dense(emb(torch.tensor([1, 2, 3]))).sum().backward()


def amp_and_unused_tables(work: pathlib.Path, rank: int) -> None:
    """A distributed store under torch.amp.GradScaler, by a session and by modules: an
    overflow on process 1 alone applies nothing on any process and every scaler backs off;
    then a table only process 0's loss uses is stepped (on its owners), and one no loss uses
    is not. Prints ``AMP rank=<r> <what>=<value>`` lines."""
    import embstore.torch as et

    store = embstore.DistributedStore(work / "s")
    for name in ("t", "u"):
        store.create_table(name, 4, optimizer=embstore.Adam(lr=0.1), seed=3)
    t, u = store.table("t"), store.table("u")
    probe = np.arange(0, 64)
    sess = store.session(["t", "u"], prefetch=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    data = [np.arange(rank, 64, 2) + 0 for _ in range(3)]
    rows_before = None
    for n, b in enumerate(sess.run(data, lambda i: {"t": i, "u": i})):
        loss = b.embeddings("t").pow(2).sum()
        if n == 1:
            rows_before = t.lookup(probe)  # collective: in step on every process
            if rank == 1:
                loss = loss * float("inf")
        if n == 2 and rank == 0:
            loss = loss + b.embeddings("u").sum()
        scaler.scale(loss).backward()
        b.push_grads(scaler=scaler)
        scaler.update()
        if n == 1:
            print(
                f"AMP rank={rank} session_unchanged={np.array_equal(t.lookup(probe), rows_before)}"
            )
            print(f"AMP rank={rank} session_scale={scaler.get_scale()}")
    print(f"AMP rank={rank} steps t={t.local.step} u={u.local.step}", flush=True)
    # Modules over the distributed tables, stepped by a GradScaler.
    emb = et.Embedding(t)
    opt = et.EmbeddingOptimizer(emb)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    before = t.lookup(probe)
    loss = emb(torch.arange(rank, 64, 2)).pow(2).sum()
    if rank == 1:
        loss = loss * float("nan")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    unchanged = np.array_equal(t.lookup(probe), before)
    print(f"AMP rank={rank} modules_unchanged={unchanged} scale={scaler.get_scale()}", flush=True)


def open_sessions(store, rank: int) -> None:
    """Process 1 opens a session differently from process 0 in one field at a time: every
    process prints ``SESSION rank=<r> field=<f> <ExceptionType>: <message>`` (or ``ok``). Then
    both open one alike (``prefetch`` may differ) and train on it: still in step."""
    store.create_table("u", 4, optimizer=embstore.Adagrad(lr=0.1), seed=2)
    alike = {"tables": ["t", "u"], "grad_average": True, "staleness": 0, "on_miss": "init"}
    other = {"tables": ["u", "t"], "grad_average": False, "staleness": 1, "on_miss": "zeros"}
    for field in alike:
        kw = dict(alike)
        if rank == 1:
            kw[field] = other[field]
        tables = kw.pop("tables")
        try:
            store.session(tables, prefetch=0, **kw)
            print(f"SESSION rank={rank} field={field} ok", flush=True)
        except embstore.EmbstoreError as e:
            print(f"SESSION rank={rank} field={field} {type(e).__name__}: {e}", flush=True)
    sess = store.session(["t", "u"], prefetch=2 * rank)
    for b in sess.run(batches_for(rank, 3), lambda ids: {"t": ids, "u": ids[::-1].copy()}):
        (b.embeddings("t").pow(2).sum() + b.embeddings("u").sum()).backward()
        b.push_grads()
    print(f"SESSION rank={rank} trained {sess.stats()['batches']} batches", flush=True)


def corrupt_a_segment(part: pathlib.Path) -> None:
    """Flip bytes all through every segment file of a partition, in place (as a failing disk
    would; the checkpoint is on another file system, so it holds copies, not hard links)."""
    for victim in sorted(p for p in (part / "seg").iterdir() if p.suffix == ".seg"):
        with open(victim, "r+b") as f:
            data = bytearray(f.read())
            for off in range(64, len(data), 61):
                data[off] ^= 0xFF
            f.seek(0)
            f.write(data)
    print(f"rank=1 corrupted the segments in {part / 'seg'}", flush=True)


def fill_the_disk(part: pathlib.Path) -> None:
    """Take every free byte of the file system the partition is on (the test mounts a small
    tmpfs there), as another program filling the disk would, whatever the store left free.
    Unbuffered writes, halving the size down to one byte at each "no space left": nothing is
    held back in a buffer that a later flush or close would fail to write (a buffered filler
    raised ENOSPC itself, at close), and no free space is left for the store's next write."""
    fd = os.open(part / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    size, zeros, taken = 1 << 20, bytes(1 << 20), 0
    try:
        while size >= 1:
            try:
                written = os.write(fd, zeros[:size])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                size //= 2
                continue
            taken += written
            if written < size:  # the disk filled part-way through this write
                size //= 2
    finally:
        os.close(fd)
    print(f"rank=1 filled the disk of {part} ({taken} bytes)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--work", required=True)
    p.add_argument("--ckpt", help="checkpoints here (default: WORK/ckpt)")
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)  # a stack dump of a process that hangs
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if args.mode == "exit":
        # Registered before embstore's own handler, so it runs after it (atexit is LIFO).
        atexit.register(
            lambda: print(f"EXIT rank={rank} initialized={dist.is_initialized()}", flush=True)
        )
    try:
        embstore.init_distributed()
        run(args.mode, pathlib.Path(args.work), pathlib.Path(args.ckpt or args.work + "/ckpt"))
    except embstore.EmbstoreError as e:
        print(f"RESULT rank={rank} {type(e).__name__}: {e}", flush=True)
        wait_for_peers_results(pathlib.Path(args.work), rank)
        return 3
    print(f"RESULT rank={rank} ok", flush=True)
    return 0


def wait_for_peers_results(work: pathlib.Path, rank: int, timeout_s: float = 30.0) -> None:
    """After an error: marks this process's RESULT as printed and waits (bounded) until every
    process's is. torchrun stops the others as soon as one exits with an error, and on a loaded
    machine a peer that detected the same fault a moment later would be stopped before it says
    so. (A process that ends well exits at once: torchrun waits for those.)"""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    work.mkdir(parents=True, exist_ok=True)
    (work / f"result-printed-{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((work / f"result-printed-{r}").exists() for r in range(world)):
            return
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
