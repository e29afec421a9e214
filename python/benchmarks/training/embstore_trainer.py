"""embstore's side of the training benchmark: the model and workload of
:mod:`torchrec_peer` (:class:`synth_ctr.DenseHead` over 26 tables, the synthetic batches of
:mod:`synth_ctr`), the tables in a distributed embstore store (``DistributedStore``: each
process owns a hash partition of every table) trained through a session
(``store.session(..., prefetch=N)``: read + partition and prepare run on a background thread
ahead of training; gather and write-back in the training loop).

Run it from embstore's virtualenv, one process per rank under torchrun::

    .venv/bin/torchrun --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port 29533 python/benchmarks/training/embstore_trainer.py \\
        --total-rows 2000000 --batches 60 --eval-batches 5 --memory-budget-share 0.2 \\
        --json out.json

The contract shared with the TorchRec peer: dim 16; sparse Adagrad lr 0.05, eps 1e-8, initial
accumulator 0; rows initialised Uniform(-0.01, 0.01) (embstore creates a row on its first
lookup, TorchRec allocates every row up front); DenseHead in DDP with Adam lr 1e-3; BCE loss
averaged over the process's slice of the global batch, sparse gradients averaged over the
processes (the session's ``grad_average=True``), as DDP averages the dense ones; one torch
thread per process. Table ``f`` is ``t{f}`` and is keyed by field ``f``'s raw ids.

``--memory-budget-share F`` gives each process a budget of F x (the rows the run stores /
processes) x the bytes one row takes in embstore's memory (measured at startup). The rows the
run stores are the distinct ids of its training batches, counted before it starts (embstore
creates a row on first use, so a share of ``--total-rows`` would hold every row this run ever
touches when the run touches fewer: at 4M rows, 200 batches touch 20 % of them). Without it
every row stays in memory (a store in a directory, no budget).

``--fill`` first creates every row of every table (all ``--total-rows``, each process the rows it
owns, in chunks, with progress), so the store holds the whole model, most of it on disk, before
a batch trains; the budget is then the index of every row the process owns (~27 B a row: the
index stays in memory, hot or cold) plus ``--memory-budget-share`` of the rest of those rows'
bytes. A row's initial values depend only on its table's seed and its id, so the filled run
trains exactly as a run that creates rows on first use: the same losses, to the bit (the
evaluation differs slightly: ids never trained read their initial rows from the filled store and
zeros from the other).

Rank 0 writes the JSON (``--json``); progress goes to stderr.
"""

from __future__ import annotations

import os

# One thread per process (torchrun sets this only for several processes); before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import embstore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_ctr

EVAL_START = 1_000_000
FILL_CHUNK = 1 << 20
INDEX_BYTES_PER_ROW = 27
TABLES = [f"t{f}" for f in range(synth_ctr.FIELDS)]
OPTIMIZER = embstore.Adagrad(lr=0.05, eps=1e-8, initial_accumulator_value=0.0)
INITIALIZER = embstore.Uniform(low=-0.01, high=0.01)
PROBE_ROWS = 100_000


def bytes_per_row(dim: int) -> float:
    """What one row costs in embstore's memory: a throwaway in-memory table of the benchmark's
    dim and optimizer, ``PROBE_ROWS`` rows, its ``bytes_reserved`` / rows.

    ``bytes_reserved`` (indexes, arenas, metadata, free lists, all allocated) rather than
    ``bytes_used`` (live rows' values, state, metadata and index bucket only): the memory
    budget counts everything the tables allocate, and a table's arenas and index grow ahead
    of its rows, so ``bytes_used`` would under-count a row by the slack every table carries.
    (At dim 16 with Adagrad: ~210 B reserved vs 160 B used per row.)"""
    probe = embstore.Store()
    t = probe.create_table("probe", dim, optimizer=OPTIMIZER, initializer=INITIALIZER)
    t.lookup(np.arange(PROBE_ROWS, dtype=np.int64) * 2654435761 + 1)
    per_row = t.stats()["bytes_reserved"] / PROBE_ROWS
    probe.close()
    return per_row


def distinct_rows(w: synth_ctr.Workload, batches: int) -> int:
    """Rows the training batches create: distinct (field, id) pairs over all of them."""
    seen = [set() for _ in range(synth_ctr.FIELDS)]
    for i in range(batches):
        sparse = synth_ctr.batch(w, i)["sparse"]
        for f in range(synth_ctr.FIELDS):
            seen[f].update(np.unique(sparse[:, f]).tolist())
    return sum(len(s) for s in seen)


def fill(store: embstore.Store, w: synth_ctr.Workload, rank: int, world: int, log) -> dict:
    """Create every row of every table that this process owns (its hash partition of each
    table's ids), ``FILL_CHUNK`` ids at a time; log progress about every 10 %."""
    total = w.total_rows
    t0 = time.perf_counter()
    done = created = 0
    next_log = 0.1
    for f, (name, n) in enumerate(zip(TABLES, w.rows_per_table, strict=True)):
        local = store.table(name).local
        for s in range(0, n, FILL_CHUNK):
            ids = synth_ctr.field_ids(np.arange(s, min(n, s + FILL_CHUNK), dtype=np.int64), f)
            if world > 1:
                ids = ids[embstore.distributed.owner_of(ids.view(np.uint64), world) == rank]
            local.lookup(ids)
            created += len(ids)
            done += min(n, s + FILL_CHUNK) - s
            if done / total >= next_log:
                el = time.perf_counter() - t0
                log(f"fill: {done / total:.0%} of {total:,} rows in {el:.0f}s")
                next_log += 0.1
    store.flush()
    return {"rows_created": created, "fill_s": time.perf_counter() - t0}


def ids_of(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sparse = b["sparse"]
    return {name: sparse[:, f] for f, name in enumerate(TABLES)}


def proc_io() -> dict[str, int]:
    """This process's bytes read from block devices (``/proc/self/io``: its O_DIRECT reads; the
    page cache's hits are not in it), and the bytes written to the machine's disks by anyone
    (``/proc/diskstats``: the tier's segment writes are not all charged to the process that
    asked for them); zeros where absent."""
    out = {"read_bytes": 0, "write_bytes": 0}
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            k, _, v = line.partition(":")
            if k == "read_bytes":
                out[k] = int(v)
        disks = {
            d.name for d in Path("/sys/block").iterdir() if not d.name.startswith(("loop", "ram"))
        }
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if len(f) > 9 and f[2] in disks:
                out["write_bytes"] += int(f[9]) * 512
    except OSError:
        pass
    return out


def cold_counts(store: embstore.Store) -> dict[str, int]:
    """This process's cold reads (rows read back from disk) and their I/O requests."""
    st = [store.table(n).local.stats() for n in TABLES]
    return {k: sum(s.get(k, 0) for s in st) for k in ("cold_reads", "cold_read_ios")}


def stage_delta(after: dict, before: dict) -> dict:
    """``after - before`` for the session stats' per-stage seconds and counters."""
    return {
        "busy_s": {k: v - before["busy_s"][k] for k, v in after["busy_s"].items()},
        "blocked_s": {k: v - before["blocked_s"][k] for k, v in after["blocked_s"].items()},
        "rows": {k: v - before["rows"][k] for k, v in after["rows"].items()},
        "bytes_sent": after["bytes_sent"] - before["bytes_sent"],
        "bytes_received": after["bytes_received"] - before["bytes_received"],
        "batches": after["batches"] - before["batches"],
    }


def vm_rss_mb() -> float:
    """This process's resident memory now, MiB (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    synth_ctr.add_run_arguments(ap)
    ap.add_argument(
        "--memory-budget-share",
        type=float,
        default=None,
        help="per-process memory budget as a share of its rows' bytes (default: no budget)",
    )
    ap.add_argument(
        "--prefetch",
        type=synth_ctr.prefetch_arg,
        default=None,
        help="batches prepared ahead (default: auto, the session's lookahead chosen from the "
        "memory budget)",
    )
    ap.add_argument(
        "--staleness",
        type=int,
        default=0,
        choices=(0, 1),
        help="the session's staleness (1: a batch's rows gathered while the one before trains)",
    )
    ap.add_argument(
        "--fill",
        action="store_true",
        help="create every row of every table (all --total-rows) before training; the budget "
        "is then the index of every row plus the share of the rows' bytes",
    )
    ap.add_argument(
        "--store-dir", type=Path, help="where the store lives (default: a temp dir, removed)"
    )
    ap.add_argument("--json", type=Path, help="where rank 0 writes the results")
    args = ap.parse_args()

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", "29512")
    embstore.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    synth_ctr.check_run_arguments(args, world)
    share = args.memory_budget_share
    if share is not None and not share > 0:
        raise SystemExit("--memory-budget-share must be > 0")

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[embstore_trainer] {msg}", file=sys.stderr, flush=True)

    w = synth_ctr.Workload.criteo(args.total_rows, batch_size=args.batch_size, seed=args.seed)
    t0 = time.perf_counter()
    row_bytes = bytes_per_row(args.dim)
    stored = None
    budget = None
    if share is not None and args.fill:
        stored = w.total_rows
        mine = stored / world
        index = INDEX_BYTES_PER_ROW * mine
        budget = int(index + share * (row_bytes - INDEX_BYTES_PER_ROW) * mine)
    elif share is not None:
        stored = distinct_rows(w, args.batches)
        log(f"the run stores {stored:,} rows ({stored / w.total_rows:.1%} of {w.total_rows:,})")
        budget = int(share * (stored / world) * row_bytes)

    # Every process needs the same store path: rank 0 makes the temp dir and tells the others.
    temp = args.store_dir is None
    where: list = [str(args.store_dir) if not temp else None]
    if temp and rank == 0:
        where[0] = tempfile.mkdtemp(prefix="embstore-train-", dir="/tmp")
    dist.broadcast_object_list(where, src=0)
    store_dir = Path(where[0])

    # What torch, the interpreter and the workload hold before the store (goal: RSS within
    # 1.5x the budget on top of this).
    rss_before_store = vm_rss_mb()
    store = embstore.DistributedStore(store_dir, memory_budget_bytes=budget)
    for f, name in enumerate(TABLES):
        store.create_table(
            name, args.dim, optimizer=OPTIMIZER, initializer=INITIALIZER, seed=args.seed * 100 + f
        )
    filled = fill(store, w, rank, world, log) if args.fill else None
    if filled is not None:
        disk = sum(store.table(n).local.stats().get("rows_on_disk", 0) for n in TABLES)
        log(
            f"filled {filled['rows_created']:,} rows in {filled['fill_s']:.0f}s "
            f"({filled['rows_created'] / filled['fill_s'] / 1e6:.2f} M rows/s), {disk:,} on disk"
        )
    torch.manual_seed(args.seed)
    head = synth_ctr.DenseHead(args.dim)
    ddp = nn.parallel.DistributedDataParallel(head)
    dense_opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    log(
        f"{world} processes, {w.total_rows} rows, {row_bytes:.1f} B/row, budget "
        + ("none" if budget is None else f"{budget / 2**20:.1f} MiB/process ({share:g})")
        + f", prefetch {args.prefetch or 'auto'}; set up in {time.perf_counter() - t0:.1f}s"
    )

    sess = store.session(TABLES, prefetch=args.prefetch, staleness=args.staleness)
    ddp.train()
    step = max(1, args.batches // 10)
    start = time.perf_counter()
    at_warmup = sess.stats()
    io_warm, cold_warm = proc_io(), cold_counts(store)
    cold_start, warmup_s = cold_warm, None
    losses = []
    for i, b in enumerate(sess.run(synth_ctr.batches(w, 0, args.batches, rank, world), ids_of)):
        sparse = torch.stack([b.embeddings(name) for name in TABLES], dim=1)  # [B, 26, dim]
        dense_opt.zero_grad()
        loss = loss_fn(ddp(torch.from_numpy(b["dense"]), sparse), torch.from_numpy(b["label"]))
        loss.backward()
        b.push_grads()
        dense_opt.step()
        losses.append(loss.item())
        if i + 1 == args.warmup:
            dist.barrier()
            warmup_s = time.perf_counter() - start
            at_warmup = sess.stats()
            io_warm, cold_warm = proc_io(), cold_counts(store)
            start = time.perf_counter()
        if (i + 1) % step == 0 or i + 1 == args.batches:
            log(f"batch {i + 1}/{args.batches} loss {loss.item():.4f}")
    dist.barrier()
    train_s = time.perf_counter() - start
    timed = args.batches - args.warmup
    final = sess.stats()
    stats = stage_delta(final, at_warmup)
    io_end, cold_end = proc_io(), cold_counts(store)
    timed_io = {k: io_end[k] - io_warm[k] for k in io_end}
    timed_cold = {k: cold_end[k] - cold_warm[k] for k in cold_end}

    # Evaluation: a session that reads rows without creating any (ids never trained: zeros)
    # and pushes nothing; every process takes its slice, rank 0 gathers the scores.
    ddp.eval()
    scores, labels = [], []
    ev = store.session(TABLES, prefetch=0, on_miss="zeros")
    evb = synth_ctr.batches(w, EVAL_START, EVAL_START + args.eval_batches, rank, world)
    with torch.no_grad():
        for b in ev.run(evb, ids_of):
            sparse = torch.stack([b.embeddings(name) for name in TABLES], dim=1)
            scores.append(head(torch.from_numpy(b["dense"]), sparse).numpy())
            labels.append(b["label"])
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (np.concatenate(scores), np.concatenate(labels)))

    local = [store.table(name).local for name in TABLES]
    tstats = [t.stats() for t in local]
    mine = {
        "rows": sum(len(t) for t in local),
        "cold_reads": sum(s.get("cold_reads", 0) for s in tstats),
        "rows_on_disk": sum(s.get("rows_on_disk", 0) for s in tstats),
        "evicted_to_disk": sum(s.get("evicted_to_disk", 0) for s in tstats),
        "bytes_reserved": sum(s["bytes_reserved"] for s in tstats),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "rss_mb_before_store": rss_before_store,
        "memory_budget": store.memory_budget,
        # Over the timed batches: bytes this process read from disk, bytes written to the
        # machine's disks, and the rows read back from disk.
        "timed_read_bytes": timed_io["read_bytes"],
        "timed_write_bytes": timed_io["write_bytes"],
        "timed_cold_reads": timed_cold["cold_reads"],
        "timed_cold_read_ios": timed_cold["cold_read_ios"],
        "warmup_cold_reads": cold_warm["cold_reads"] - cold_start["cold_reads"],
    }
    per_proc: list = [None] * world
    dist.all_gather_object(per_proc, mine)

    if rank == 0:
        out = {
            "peer": "embstore",
            "embstore_version": getattr(embstore, "__version__", None),
            **synth_ctr.run_record(args, w, world, timed, train_s, gathered),
            # Batch generation runs in the session's read stage (background thread).
            "data_seconds_rank0": stats["busy_s"]["read"],
            "rss_mb_max": max(p["rss_mb"] for p in per_proc),
            # Peak RSS over what the process held before opening the store, per process, as a
            # multiple of its memory budget.
            "rss_over_budget": (
                None
                if budget is None
                else max(
                    (p["rss_mb"] - p["rss_mb_before_store"]) * 2**20 / budget for p in per_proc
                )
            ),
            "rss_mb_before_store": max(p["rss_mb_before_store"] for p in per_proc),
            "memory_budget_share": share,
            "memory_budget_bytes": budget,
            "rows_stored_by_the_run": stored,
            "bytes_per_row": row_bytes,
            "prefetch": args.prefetch,
            "lookahead": final["lookahead"],
            "staleness": args.staleness,
            # Over the timed batches (after warmup), rank 0's session.
            "stages": {"busy_s": stats["busy_s"], "blocked_s": stats["blocked_s"]},
            "stage_rows": stats["rows"],
            "stages_all_batches": {"busy_s": final["busy_s"], "blocked_s": final["blocked_s"]},
            "bytes_sent_per_batch": stats["bytes_sent"] / timed,
            "bytes_received_per_batch": stats["bytes_received"] / timed,
            "rows_pulled_per_batch": stats["rows"]["pulled"] / timed,
            "rows_pulled_remote_per_batch": stats["rows"]["pulled_remote"] / timed,
            "rows": sum(p["rows"] for p in per_proc),
            "cold_reads": sum(p["cold_reads"] for p in per_proc),
            "cold_reads_rank0": per_proc[0]["cold_reads"],
            "rows_on_disk": sum(p["rows_on_disk"] for p in per_proc),
            "evicted_to_disk": sum(p["evicted_to_disk"] for p in per_proc),
            "fill": filled,
            # Rank 0's training loss per batch: the same, to the bit, for runs that compute
            # the same (a filled store and one that creates rows on first use).
            "train_losses": losses,
            "timed_cold_reads_per_batch": sum(p["timed_cold_reads"] for p in per_proc) / timed,
            # The warm-up's batches (not timed above): their seconds and cold reads per second,
            # all processes together.
            "warmup_s": warmup_s,
            "warmup_examples_per_s": (
                args.warmup * args.batch_size / warmup_s if warmup_s else None
            ),
            "warmup_cold_reads_per_s": (
                sum(p["warmup_cold_reads"] for p in per_proc) / warmup_s if warmup_s else None
            ),
            "timed_read_bytes_per_cold_row": (
                sum(p["timed_read_bytes"] for p in per_proc)
                / max(1, sum(p["timed_cold_reads"] for p in per_proc))
            ),
            # Machine-wide (every process's tier and anything else writing), rank 0's window.
            "timed_disk_write_bytes_per_batch": per_proc[0]["timed_write_bytes"] / timed,
            "per_process": per_proc,
        }
        busy = stats["busy_s"]
        log(
            f"{out['examples_per_s']:.0f} examples/s over {timed} batches ({train_s:.1f}s), "
            f"AUC {out['auc']:.4f}, logloss {out['eval_logloss']:.4f}, "
            f"peak RSS {out['rss_mb_max']:.0f} MB; "
            "busy "
            + ", ".join(f"{k} {v:.1f}s" for k, v in busy.items())
            + f"; {out['rows']} rows, {out['cold_reads']} cold reads"
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        else:
            print(json.dumps(out, indent=2))
    dist.barrier()
    store.close()
    dist.barrier()
    if temp and rank == 0:
        shutil.rmtree(store_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
