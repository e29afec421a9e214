"""A TorchRec DLRM script, trained on TorchRec or on embstore: the same model, loop and batches.

The script is written as a TorchRec user writes one (``torchrec.models.dlrm``'s DLRM: dense
arch, an ``EmbeddingBagCollection``, pairwise interaction, over arch; ``KeyedJaggedTensor``
batches; ``DistributedModelParallel`` under torchrun). ``--backend embstore`` changes only the
lines that build the collection and the sparse optimizer — the two blocks marked ``[backend]``
in :func:`main`; the model, the batches and the training loop are the same code.

The data: the synthetic Criteo-shaped click logs of ``python/benchmarks/training/synth_ctr.py``
(13 dense features, 26 categorical fields, labels from a hidden logistic model), given as
TorchRec gives them: row indices per field (``c0`` .. ``c25``, one id a sample) plus ``hist``,
a multi-hot, weighted feature (0 to 8 ids of field 2 a sample, recency weights) that shares
table ``t2`` with ``c2``. The collection is weighted (``is_weighted=True``): the one-hot
features carry weight 1. Both backends see the same batches (the same seed); embstore takes the
row indices as its ids.

The TorchRec side needs TorchRec (``make torchrec-deps``; its own virtualenv, ``.venv-torchrec``).
Without it, ``--backend embstore`` builds its batches with ``embstore.torch.KeyedJaggedTensor``
(the import fallback below), so the script runs with embstore alone.

Run::

    .venv/bin/python examples/torchrec_dlrm.py --backend embstore
    .venv-torchrec/bin/python examples/torchrec_dlrm.py --backend torchrec
    .venv/bin/torchrun --nproc-per-node 2 examples/torchrec_dlrm.py --backend embstore

Under torchrun TorchRec shards the tables with ``DistributedModelParallel`` (table- or
column-wise on CPU) and divides the sparse gradients by the process count; embstore keeps the
tables in a distributed store (``DistributedStore(path)``: each process owns a hash
partition of every table), the collection's lookups and ``EmbeddingOptimizer.step()`` reach
every partition, and the gradients are averaged over the processes, as DDP averages the dense
ones. Both print the test AUC and the median step time (rank 0; ``--json PATH`` writes them).
"""

from __future__ import annotations

import os

# One torch thread per process (as torchrun sets for several); before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import datetime
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

try:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
except ImportError:  # no TorchRec: embstore's own, with the same constructors and methods
    from embstore.torch import KeyedJaggedTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python/benchmarks/training"))
import synth_ctr

HIST_FIELD = 2  # the field whose table the multi-hot "hist" feature shares
HIST_MAX = 8
EVAL_START = 1_000_000  # evaluation batches: never trained on


# -- the model: torchrec.models.dlrm.DLRM's architecture -----------------------------------------


def mlp(in_features: int, sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(in_features, size), nn.ReLU()]
        in_features = size
    return nn.Sequential(*layers)


class SparseArch(nn.Module):
    """The collection's pooled embeddings as ``[B, F, D]``, features in config order."""

    def __init__(self, embedding_bag_collection: nn.Module) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        self.D = configs[0].embedding_dim
        self.feature_names = [name for c in configs for name in c.feature_names]
        self.F = len(self.feature_names)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).to_dict()
        return torch.cat([pooled[n] for n in self.feature_names], dim=1).reshape(-1, self.F, self.D)


class InteractionArch(nn.Module):
    """The dense vector and its pairwise dot products with every feature's and each other's."""

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        n = num_sparse_features + 1
        self.register_buffer("triu", torch.triu_indices(n, n, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        z = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.triu[0], self.triu[1]]
        return torch.cat([dense, dots], dim=1)


class DLRM(nn.Module):
    def __init__(
        self,
        embedding_bag_collection: nn.Module,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
    ) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        f, d = self.sparse_arch.F, self.sparse_arch.D
        assert dense_arch_layer_sizes[-1] == d, "the dense arch must end at embedding_dim"
        self.dense_arch = mlp(dense_in_features, dense_arch_layer_sizes)
        self.inter_arch = InteractionArch(f)
        over_in = d + (f + 1) * f // 2
        self.over_arch = nn.Sequential(
            mlp(over_in, over_arch_layer_sizes[:-1]),
            nn.Linear(over_arch_layer_sizes[-2], over_arch_layer_sizes[-1]),
        )

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor):
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense, sparse))


# -- the data -----------------------------------------------------------------------------------


def table_configs(config_class: type, rows: tuple[int, ...], dim: int, **extra) -> list:
    """One table per field; ``hist`` shares field 2's table."""
    return [
        config_class(
            name=f"t{f}",
            embedding_dim=dim,
            num_embeddings=n,
            feature_names=[f"c{f}"] + (["hist"] if f == HIST_FIELD else []),
            weight_init_min=-0.01,
            weight_init_max=0.01,
            **extra,
        )
        for f, n in enumerate(rows)
    ]


def make_batch(w: synth_ctr.Workload, index: int, rank: int, world: int):
    """Process ``rank``'s slice of global batch ``index``: (dense [b, 13], KJT, labels [b])."""
    g = synth_ctr.batch(w, index)
    rng = np.random.default_rng([w.seed, index, 17])
    n = w.batch_size
    ranks = np.stack([synth_ctr.ranks_of(g["sparse"][:, f], f) for f in range(synth_ctr.FIELDS)])
    # hist: the sample's own field-2 row half of the time, then rows of other samples' field 2.
    lens = rng.integers(0, HIST_MAX + 1, n)
    own = (rng.random(n) < 0.5) & (lens > 0)
    hist = ranks[HIST_FIELD][rng.integers(0, n, int(lens.sum()))]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    hist[starts[own]] = ranks[HIST_FIELD][own]
    recency = 1.0 / (1.0 + np.arange(lens.sum()) - np.repeat(starts, lens))

    per = n // world
    lo, hi = rank * per, (rank + 1) * per
    hlo, hhi = int(starts[lo]), int(starts[hi - 1] + lens[hi - 1])
    values = np.concatenate([ranks[:, lo:hi].reshape(-1), hist[hlo:hhi]])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"c{f}" for f in range(synth_ctr.FIELDS)] + ["hist"],
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(
            np.concatenate([np.ones(synth_ctr.FIELDS * per), lens[lo:hi]]).astype(np.int32)
        ),
        weights=torch.from_numpy(
            np.concatenate([np.ones(synth_ctr.FIELDS * per), recency[hlo:hhi]]).astype(np.float32)
        ),
    )
    return torch.from_numpy(g["dense"][lo:hi]), kjt, torch.from_numpy(g["label"][lo:hi])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# -- training -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("torchrec", "embstore"), default="embstore")
    ap.add_argument("--total-rows", type=int, default=200_000, help="rows of the 26 tables")
    ap.add_argument("--batches", type=int, default=300, help="training batches (global)")
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1024, help="global batch size")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=10, help="first steps not in the step time")
    ap.add_argument("--store-dir", type=Path, help="embstore under torchrun: the store's path")
    ap.add_argument("--json", help="where rank 0 writes its results ('-': stdout)")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.backend == "torchrec" or world > 1:  # DistributedModelParallel needs one always
        for k, v in (("RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531")):
            os.environ.setdefault(k, v)
        dist.init_process_group("gloo", world_size=world, timeout=datetime.timedelta(minutes=5))
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(1)
    if args.batch_size % world or not 0 <= args.warmup < args.batches:
        raise SystemExit("--batch-size must be a multiple of the processes, --warmup < --batches")

    w = synth_ctr.Workload.criteo(args.total_rows, batch_size=args.batch_size, seed=args.seed)
    train = [make_batch(w, i, rank, world) for i in range(args.batches)]
    evals = [make_batch(w, EVAL_START + i, rank, world) for i in range(args.eval_batches)]
    torch.manual_seed(args.seed)
    dense_sizes, over_sizes = [64, args.dim], [128, 64, 1]
    store, store_dir = None, None
    optimizers: list = []

    if args.backend == "torchrec":  # [backend] TorchRec: the collection and its sparse optimizer
        import torchrec
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.types import (
            KernelConfig,
            ParameterConstraints,
            TopologyFactory,
            TrainerConfig,
        )
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        ebc = torchrec.EmbeddingBagCollection(
            tables=table_configs(torchrec.EmbeddingBagConfig, w.rows_per_table, args.dim),
            is_weighted=True,
            device=torch.device("meta"),
        )
        model = DLRM(ebc, synth_ctr.DENSE, dense_sizes, over_sizes)
        apply_optimizer_in_backward(
            torch.optim.Adagrad, model.sparse_arch.parameters(), {"lr": 0.05, "eps": 1e-8}
        )
        # Sharded tables with the fused (fbgemm TBE) kernel: on CPU a table lives whole on one
        # process or split by columns (the planner's default, data parallel, would replicate
        # every table as a dense parameter).
        sharder = EmbeddingBagCollectionSharder()
        planner = EmbeddingShardingPlanner(
            topology=TopologyFactory.create_topology(
                TrainerConfig(world_size=world, local_world_size=world),
                kernel_config=KernelConfig(compute_device="cpu"),
            ),
            batch_size=args.batch_size // world,
            constraints={
                f"t{f}": ParameterConstraints(
                    sharding_types=["table_wise", "column_wise", "table_column_wise"],
                    compute_kernels=["fused"],
                )
                for f in range(synth_ctr.FIELDS)
            },
        )
        plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
        model = DistributedModelParallel(
            model, device=torch.device("cpu"), plan=plan, sharders=[sharder]
        )
        version = f"torchrec {torchrec.__version__}"
    else:  # [backend] embstore: the same configs over a store, the tables' own Adagrad
        import embstore
        import embstore.torch as et

        if world > 1:  # every process opens the same path: rank 0 picks it
            where = [str(args.store_dir or tempfile.mkdtemp(prefix="embstore-dlrm-"))]
            dist.broadcast_object_list(where, src=0)
            store_dir = Path(where[0])
        store = embstore.DistributedStore(store_dir) if world > 1 else embstore.Store(store_dir)
        ebc = et.EmbeddingBagCollection(
            store,
            table_configs(
                et.EmbeddingBagConfig,
                w.rows_per_table,
                args.dim,
                optimizer=embstore.Adagrad(lr=0.05, eps=1e-8),
            ),
            is_weighted=True,
        )
        model = DLRM(ebc, synth_ctr.DENSE, dense_sizes, over_sizes)
        optimizers.append(et.EmbeddingOptimizer(model))
        if world > 1:
            model = nn.parallel.DistributedDataParallel(model)
        version = f"embstore {getattr(embstore, '__version__', '?')}"

    dense_params = [p for p in model.parameters() if not hasattr(p, "_in_backward_optimizers")]
    optimizers.append(torch.optim.Adam(dense_params, lr=1e-3))
    loss_fn = nn.BCEWithLogitsLoss()

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[{args.backend}] {msg}", file=sys.stderr, flush=True)

    model.train()
    step_s = []
    every = max(1, args.batches // 5)
    for i, (dense, kjt, label) in enumerate(train):
        t0 = time.perf_counter()
        for opt in optimizers:
            opt.zero_grad()
        loss = loss_fn(model(dense, kjt).squeeze(-1), label)
        loss.backward()
        for opt in optimizers:
            opt.step()
        step_s.append(time.perf_counter() - t0)
        if (i + 1) % every == 0:
            log(f"batch {i + 1}/{args.batches} loss {loss.item():.4f}")

    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for dense, kjt, label in evals:
            scores.append(model(dense, kjt).squeeze(-1).numpy())
            labels.append(label.numpy())
    mine = (np.concatenate(scores), np.concatenate(labels))
    gathered = [mine]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    s = np.concatenate([g[0] for g in gathered]).astype(np.float64)
    y = np.concatenate([g[1] for g in gathered]).astype(np.float64)
    timed = step_s[args.warmup :]
    out = {
        "backend": args.backend,
        "version": version,
        "torch_version": torch.__version__,
        "processes": world,
        "cpu": cpu_model(),
        "total_rows": w.total_rows,
        "batches": args.batches,
        "batch_size": args.batch_size,
        "eval_examples": len(y),
        "auc": synth_ctr.auc(y, s),
        "eval_logloss": float(np.mean(np.logaddexp(0.0, s) - y * s)),
        "step_ms_median": 1e3 * statistics.median(timed),
        "step_ms_p90": 1e3 * float(np.quantile(timed, 0.9)),
        "final_loss": float(loss.item()),
    }
    log(f"test AUC {out['auc']:.4f}, median step {out['step_ms_median']:.2f} ms ({version})")
    if rank == 0 and args.json:
        text = json.dumps(out, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if store is not None:
        if world > 1:
            dist.barrier()
        store.close()
    if dist.is_initialized():
        dist.barrier()  # every process leaves together (gloo teardown)
        dist.destroy_process_group()
    if store_dir is not None and args.store_dir is None and rank == 0:
        shutil.rmtree(store_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
