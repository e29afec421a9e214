"""``torch.compile`` (Inductor) vs eager: the training step of a model with four embstore
modules (two ``Embedding``, two ``EmbeddingBag``) and a dense MLP, on the same batches.

Each side trains its own store; the steps run interleaved in rounds (a round: ``--block`` eager
steps, then as many compiled ones, or the other way round on odd rounds), so a noisy, shared
machine slows both alike; the figure is the median of the per-round ratios compiled / eager
(paired), with each side's median step. Compilation (the first steps) is timed apart.

    make bench-compile ARGS="--rounds 20"
    .venv/bin/python python/benchmarks/bench_torch_compile.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
from torch import nn

import embstore
import embstore.torch as et


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Model(nn.Module):
    def __init__(self, store: embstore.Store, dim: int) -> None:
        super().__init__()
        mk = lambda n: store.create_table(n, dim, optimizer=embstore.Adagrad(lr=0.05))  # noqa: E731
        self.user = et.Embedding(mk("user"))
        self.item = et.Embedding(mk("item"))
        self.tags = et.EmbeddingBag(mk("tags"), mode="sum")
        self.hist = et.EmbeddingBag(mk("hist"), mode="mean")
        self.mlp = nn.Sequential(
            nn.Linear(4 * dim, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1)
        )

    def forward(self, user, item, tags, offsets, hist):
        x = torch.cat(
            [self.user(user), self.item(item), self.tags(tags, offsets), self.hist(hist)], dim=1
        )
        return self.mlp(x).squeeze(-1)


def batches(n: int, b: int, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append(
            (
                torch.randint(0, 100_000, (b,), generator=g),
                torch.randint(0, 100_000, (b,), generator=g),
                torch.randint(0, 10_000, (3 * b,), generator=g),
                torch.arange(b) * 3,
                torch.randint(0, 50_000, (b, 8), generator=g),
                torch.rand(b, generator=g),
            )
        )
    return out


class Side:
    def __init__(self, dim: int, compiled: bool) -> None:
        torch.manual_seed(0)
        self.store = embstore.Store()
        self.model = Model(self.store, dim)
        self.forward = torch.compile(self.model, fullgraph=True) if compiled else self.model
        self.sparse = et.EmbeddingOptimizer(self.model)
        self.dense = torch.optim.Adam(self.model.mlp.parameters(), lr=1e-3)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def step(self, b: tuple[torch.Tensor, ...]) -> float:
        start = time.perf_counter()
        loss = self.loss_fn(self.forward(*b[:5]), b[5].round())
        loss.backward()
        self.sparse.step()
        self.dense.step()
        self.sparse.zero_grad()
        self.dense.zero_grad()
        return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    data = batches(args.warmup + args.rounds * args.block, args.batch)
    eager, compiled = Side(args.dim, False), Side(args.dim, True)
    began = time.perf_counter()
    for b in data[: args.warmup]:
        compiled.step(b)
    compile_s = time.perf_counter() - began
    for b in data[: args.warmup]:
        eager.step(b)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    ratios = []
    at = args.warmup
    for r in range(args.rounds):
        block = data[at : at + args.block]
        at += args.block
        order = (eager, compiled) if r % 2 == 0 else (compiled, eager)
        got = {}
        for side in order:
            got[side] = [side.step(b) for b in block]
        e, c = statistics.median(got[eager]), statistics.median(got[compiled])
        times["eager"] += got[eager]
        times["compiled"] += got[compiled]
        ratios.append(c / e)
        print(
            f"round {r + 1}/{args.rounds}: eager {e * 1e3:.2f} ms, compiled {c * 1e3:.2f} ms",
            file=sys.stderr,
        )
    result = {
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "batch": args.batch,
        "dim": args.dim,
        "steps_each": args.rounds * args.block,
        "compile_s": round(compile_s, 1),
        "eager_ms": round(statistics.median(times["eager"]) * 1e3, 3),
        "compiled_ms": round(statistics.median(times["compiled"]) * 1e3, 3),
        "ratio_compiled_over_eager": round(statistics.median(ratios), 3),
        "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
