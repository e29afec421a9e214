"""TorchRec, the peer of embstore's training benchmark: the same DLRM-style model
(:class:`synth_ctr.DenseHead` over 26 embedding tables) trained on the same synthetic batches
(:mod:`synth_ctr`), with every row in memory, sharded over the processes by TorchRec's
DistributedModelParallel on CPU (gloo).

Run it from its own virtualenv (``make torchrec-deps``), one process per rank under torchrun::

    .venv-torchrec/bin/torchrun --nproc-per-node 2 python/benchmarks/training/torchrec_peer.py \\
        --total-rows 2000000 --batches 60 --eval-batches 5 --json out.json

The contract shared with embstore's side: dim 16; sparse Adagrad lr 0.05, eps 1e-8, initial
accumulator 0 (fbgemm's fused EXACT_ADAGRAD, applied in the backward pass); rows initialised
Uniform(-0.01, 0.01); dense half in DDP with Adam lr 1e-3; BCE-with-logits loss averaged over
the process's slice of the global batch; one torch thread per process. Field ``f``'s raw ids
are mapped back to their ranks (:func:`synth_ctr.ranks_of`), so table ``f`` has exactly
``rows_per_table[f]`` rows and no two ids share a row (the rows embstore holds).

TorchRec divides the sparse gradients that come back through its all-to-all by the number of
processes (``comm_ops.set_gradient_division``, on by default), as DDP averages the dense ones:
both halves step on the gradient of the mean loss over the global batch.

Rank 0 writes the JSON (``--json``); progress goes to stderr.
"""

from __future__ import annotations

import os

# One thread per process (torchrun sets this only for several processes); before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import collections
import datetime
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torchrec
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    KernelConfig,
    ParameterConstraints,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_ctr

FEATURES = [f"f{f}" for f in range(synth_ctr.FIELDS)]
EVAL_START = 1_000_000
SHARDINGS = {
    # The planner's choice among what TorchRec offers on CPU but data parallel (a replicated
    # table would be a dense parameter, averaged by DDP and stepped by Adam, not Adagrad).
    # Row-wise sharding is CUDA/TPU-only in TorchRec (EmbeddingBagCollectionSharder's
    # sharding_types): on CPU a table lives whole on one process, or split by columns.
    "auto": [
        ShardingType.TABLE_WISE.value,
        ShardingType.COLUMN_WISE.value,
        ShardingType.TABLE_COLUMN_WISE.value,
    ],
    "table_wise": [ShardingType.TABLE_WISE.value],
    "column_wise": [ShardingType.COLUMN_WISE.value],
}


class Dlrm(nn.Module):
    """An EmbeddingBagCollection of the 26 tables (one id per field: a bag of one) under
    :class:`synth_ctr.DenseHead`."""

    def __init__(self, rows_per_table: tuple[int, ...], dim: int):
        super().__init__()
        self.dim = dim
        tables = [
            EmbeddingBagConfig(
                name=f"t{f}",
                embedding_dim=dim,
                num_embeddings=n,
                feature_names=[FEATURES[f]],
                pooling=PoolingType.SUM,
                weight_init_min=-0.01,
                weight_init_max=0.01,
            )
            for f, n in enumerate(rows_per_table)
        ]
        # On meta: DistributedModelParallel allocates and initialises each process's shards.
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.head = synth_ctr.DenseHead(dim)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(sparse).values()  # [B, 26 * dim], in the tables' order
        return self.head(dense, pooled.view(-1, len(FEATURES), self.dim))


def to_inputs(b: dict[str, np.ndarray]) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """A batch slice from :func:`synth_ctr.batches` as (dense, KJT of row indices, labels)."""
    sparse = b["sparse"]
    n = sparse.shape[0]
    ranks = np.stack([synth_ctr.ranks_of(sparse[:, f], f) for f in range(sparse.shape[1])])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES,
        values=torch.from_numpy(ranks.reshape(-1)),  # key-major: field 0's n ids, then field 1's
        lengths=torch.ones(len(FEATURES) * n, dtype=torch.int32),
    )
    return torch.from_numpy(b["dense"]), kjt, torch.from_numpy(b["label"])


def describe_plan(plan: object, world: int) -> tuple[str, dict]:
    """A line and a per-table dict for the sharding the planner chose, with the rows (a
    column-wise shard counts its share of the columns) each process holds."""
    tables = {}
    held = [0.0] * world
    for module_plan in plan.plan.values():  # type: ignore[attr-defined]
        for name, ps in module_plan.items():
            shards = ps.sharding_spec.shards
            cols = max(m.shard_offsets[1] + m.shard_sizes[1] for m in shards)
            for m in shards:
                held[m.placement.rank()] += m.shard_sizes[0] * m.shard_sizes[1] / cols
            tables[name] = {
                "sharding": ps.sharding_type,
                "kernel": ps.compute_kernel,
                "ranks": ps.ranks,
            }
    kinds = collections.Counter(t["sharding"] for t in tables.values())
    kernels = collections.Counter(t["kernel"] for t in tables.values())
    line = (
        ", ".join(f"{n} tables {k}" for k, n in sorted(kinds.items()))
        + " by TorchRec's planner on CPU (gloo); rows per process "
        + "/".join(f"{h:.0f}" for h in held)
        + "; kernel "
        + ", ".join(sorted(kernels))
        + " (fbgemm CPU TBE, EXACT_ADAGRAD in backward)"
    )
    return line, tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    synth_ctr.add_run_arguments(ap)
    ap.add_argument("--sharding", choices=sorted(SHARDINGS), default="auto")
    ap.add_argument("--json", type=Path, help="where rank 0 writes the results")
    args = ap.parse_args()

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    synth_ctr.check_run_arguments(args, world)

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[torchrec_peer] {msg}", file=sys.stderr, flush=True)

    w = synth_ctr.Workload.criteo(args.total_rows, batch_size=args.batch_size, seed=args.seed)
    torch.manual_seed(args.seed)
    model = Dlrm(w.rows_per_table, args.dim)
    sharder = EmbeddingBagCollectionSharder(
        fused_params={
            "optimizer": EmbOptimType.EXACT_ADAGRAD,
            "learning_rate": 0.05,
            "eps": 1e-8,
        }
    )
    constraints = {
        f"t{f}": ParameterConstraints(
            sharding_types=SHARDINGS[args.sharding], compute_kernels=["fused"]
        )
        for f in range(synth_ctr.FIELDS)
    }
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world, local_world_size=world),
        kernel_config=KernelConfig(compute_device="cpu"),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=args.batch_size // world,
        constraints=constraints,
        # Memory is no constraint here (every row fits); the default, heuristic reservation
        # warns that it misjudges dense tensors.
        storage_reservation=FixedPercentageStorageReservation(0.15),
    )
    t0 = time.perf_counter()
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    sharding, per_table = describe_plan(plan, world)
    dmp = DistributedModelParallel(
        module=model, device=torch.device("cpu"), plan=plan, sharders=[sharder]
    )
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=1e-3),
    )
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    log(f"{world} processes, {w.total_rows} rows; sharding: {sharding}")
    log(f"set up in {time.perf_counter() - t0:.1f}s")
    loss_fn = nn.BCEWithLogitsLoss()

    dmp.train()
    data_s = 0.0
    step = max(1, args.batches // 10)
    start = time.perf_counter()
    t_data = time.perf_counter()
    for i, b in enumerate(synth_ctr.batches(w, 0, args.batches, rank, world)):
        dense, kjt, label = to_inputs(b)
        if i >= args.warmup:
            data_s += time.perf_counter() - t_data
        opt.zero_grad()
        loss = loss_fn(dmp(dense, kjt), label)
        loss.backward()
        opt.step()
        if i + 1 == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        if (i + 1) % step == 0 or i + 1 == args.batches:
            log(f"batch {i + 1}/{args.batches} loss {loss.item():.4f}")
        t_data = time.perf_counter()
    dist.barrier()
    train_s = time.perf_counter() - start
    timed = args.batches - args.warmup

    # Every process takes its slice of each evaluation batch (the sharded tables need all of
    # them in every forward); rank 0 gathers the scores.
    dmp.eval()
    scores, labels = [], []
    with torch.no_grad():
        for b in synth_ctr.batches(w, EVAL_START, EVAL_START + args.eval_batches, rank, world):
            dense, kjt, label = to_inputs(b)
            scores.append(dmp(dense, kjt).numpy())
            labels.append(label.numpy())
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (np.concatenate(scores), np.concatenate(labels)))
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)

    if rank == 0:
        out = {
            "peer": "torchrec",
            "torchrec_version": torchrec.__version__,
            **synth_ctr.run_record(args, w, world, timed, train_s, gathered),
            "data_seconds_rank0": data_s,
            "rss_mb_max": float(rss.item()),
            "sharding": sharding,
            "tables": per_table,
        }
        log(
            f"{out['examples_per_s']:.0f} examples/s over {timed} batches "
            f"({train_s:.1f}s, of which data {data_s:.1f}s on rank 0), AUC {out['auc']:.4f}, "
            f"logloss {out['eval_logloss']:.4f}, peak RSS {out['rss_mb_max']:.0f} MB"
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        else:
            print(json.dumps(out, indent=2))
    # Every process leaves together: one tearing gloo down while another still writes its
    # results can abort the latter ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
