"""A synthetic CTR workload shaped like Criteo's (13 dense features, 26 categorical ones, one id
per field per example), generated from a seed, and the DLRM-style model trained on it by every
training benchmark (embstore's sessions and the TorchRec peer alike).

Ids: field ``f``'s ids are Zipf(``alpha``) ranks over ``rows_per_table[f]`` rows, scattered by a
fixed mix (``id = (rank * 2654435761 mod 2^59) * 32 + f``, as int64: hot ids are not small
numbers, and ``ranks_of`` inverts it); labels come from a hidden logistic model over the ranks'
hidden weights and the dense features, so a trained model has an AUC to reach.

Every process generating batch ``i`` of a seed gets the same batch, so a run over ``P``
processes trains on the same global batches as one process (process ``r`` takes the ``r``-th
slice).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

DENSE = 13
FIELDS = 26
# Criteo Kaggle's cardinalities, scaled by `scale` (1.0: 33.8M rows in all).
CRITEO_ROWS = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
    """The shape of a synthetic run: ``rows_per_table`` per field, batch size, Zipf alpha."""

    rows_per_table: tuple[int, ...]
    batch_size: int = 4096
    alpha: float = 1.05
    seed: int = 0

    @classmethod
    def criteo(cls, total_rows: int, **kwargs: object) -> Workload:
        """Criteo's relative cardinalities scaled to ``total_rows`` rows in all (each table at
        least 4 rows)."""
        scale = total_rows / sum(CRITEO_ROWS)
        rows = tuple(max(4, int(r * scale)) for r in CRITEO_ROWS)
        return cls(rows, **kwargs)  # type: ignore[arg-type]

    @property
    def total_rows(self) -> int:
        return sum(self.rows_per_table)


def _zipf_ranks(rng: np.random.Generator, n_rows: int, alpha: float, size: int) -> np.ndarray:
    """Ranks in ``[0, n_rows)`` with P(rank k) ~ (k + 1)^-alpha: inverse-CDF sampling of the
    continuous approximation (fast for any n_rows, any alpha > 0)."""
    u = rng.random(size)
    if abs(alpha - 1.0) < 1e-9:
        k = np.exp(u * np.log(n_rows + 1.0)) - 1.0
    else:
        a = 1.0 - alpha
        k = (1.0 + u * ((n_rows + 1.0) ** a - 1.0)) ** (1.0 / a) - 1.0
    return np.minimum(k.astype(np.int64), n_rows - 1)


def field_ids(ranks: np.ndarray, field: int) -> np.ndarray:
    """The raw int64 id of rank ``ranks`` in field ``field``."""
    with np.errstate(over="ignore"):
        return ((ranks.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 62)).astype(
            np.int64
        ) * 32 + field


def ranks_of(ids: np.ndarray, field: int) -> np.ndarray:
    """The ranks of field ``field``'s raw ids (inverse of :func:`field_ids`): row indices in
    ``[0, rows_per_table[field])`` for a peer (TorchRec) that needs indices, not ids.

    ``field_ids``'s int64 ``* 32`` drops the top bits of its 62-bit product, so an id keeps
    ``rank * 2654435761 mod 2^59``; 2654435761 is odd, so its inverse mod 2^59 undoes it (exact
    for every rank below 2^59)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and not np.all((ids & 31) == field):
        raise ValueError(f"ids not of field {field}")
    with np.errstate(over="ignore"):
        mixed = ids.astype(np.uint64) >> np.uint64(5)
        return ((mixed * np.uint64(_INV_MIX)) & np.uint64((1 << 59) - 1)).astype(np.int64)


_INV_MIX = pow(2654435761, -1, 1 << 59)


def _hidden_weight(ranks: np.ndarray, field: int) -> np.ndarray:
    """A fixed pseudo-random weight per (field, rank): the hidden model's."""
    with np.errstate(over="ignore"):
        z = ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(field * 7919 + 1)
        z ^= z >> np.uint64(29)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(32)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 2.0 - 1.0


def batch(w: Workload, index: int) -> dict[str, np.ndarray]:
    """Global batch ``index``: ``sparse`` int64 [B, 26], ``dense`` float32 [B, 13],
    ``label`` float32 [B]."""
    rng = np.random.default_rng([w.seed, index])
    b = w.batch_size
    sparse = np.empty((b, FIELDS), np.int64)
    logit = np.zeros(b)
    for f, n in enumerate(w.rows_per_table):
        ranks = _zipf_ranks(rng, n, w.alpha, b)
        sparse[:, f] = field_ids(ranks, f)
        logit += _hidden_weight(ranks, f) * 0.6
    dense = rng.standard_normal((b, DENSE)).astype(np.float32)
    logit += dense[:, :4].sum(axis=1) * 0.3 - 1.0
    label = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return {"sparse": sparse, "dense": dense, "label": label}


def batches(w: Workload, start: int, stop: int, rank: int = 0, world: int = 1) -> Iterator[dict]:
    """Process ``rank``'s slice (of ``world``) of global batches ``start..stop``."""
    per = w.batch_size // world
    for i in range(start, stop):
        g = batch(w, i)
        yield {k: v[rank * per : (rank + 1) * per] for k, v in g.items()}


class DenseHead(nn.Module):
    """DLRM's dense half: bottom MLP over the dense features to ``dim``, pairwise dot products
    of the 27 vectors, top MLP to one logit."""

    def __init__(
        self, dim: int = 16, bottom: tuple[int, ...] = (64,), top: tuple[int, ...] = (128, 64)
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = DENSE
        for h in (*bottom, dim):
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.bottom = nn.Sequential(*layers)
        n = FIELDS + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        layers = []
        width = dim + self.pairs.shape[1]
        for h in top:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.top = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``dense`` [B, 13], ``sparse`` [B, 26, dim] -> logits [B]."""
        x = self.bottom(dense)
        z = torch.cat([x.unsqueeze(1), sparse], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(-1)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    s = scores[order]
    # average ranks of ties
    _, start, counts = np.unique(s, return_index=True, return_counts=True)
    for st, c in zip(start, counts, strict=True):
        if c > 1:
            ranks[order[st : st + c]] = st + (c + 1) / 2
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def prefetch_arg(text: str) -> int | None:
    """``--prefetch``: ``auto`` (None: the session's lookahead) or a number of batches."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or an int >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"auto or an int >= 0, got {text!r}")
    return n


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The command-line arguments every trainer of this workload takes (embstore's and the
    TorchRec peer's alike): the run's shape."""
    ap.add_argument("--total-rows", type=int, default=2_000_000)
    ap.add_argument("--batches", type=int, default=60, help="training batches (global)")
    ap.add_argument("--eval-batches", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4096, help="global batch size")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5, help="first batches trained, not timed")


def check_run_arguments(args: argparse.Namespace, world: int) -> None:
    """Exits saying what is wrong with :func:`add_run_arguments`' values for ``world``
    processes."""
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of {world}")
    if not 0 <= args.warmup < args.batches:
        raise SystemExit("--warmup must be below --batches")


def run_record(
    args: argparse.Namespace,
    w: Workload,
    world: int,
    timed: int,
    train_s: float,
    gathered: list[tuple[np.ndarray, np.ndarray]],
) -> dict[str, object]:
    """The fields of a trainer's JSON record every peer shares: the run's shape, its
    throughput over the ``timed`` batches, and its evaluation (``gathered``: every process's
    ``(logits, labels)``)."""
    s = np.concatenate([g[0] for g in gathered]).astype(np.float64)
    y = np.concatenate([g[1] for g in gathered]).astype(np.float64)
    return {
        "torch_version": torch.__version__,
        "processes": world,
        "total_rows": w.total_rows,
        "batches": args.batches,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "eval_batches": args.eval_batches,
        "train_seconds": train_s,
        "examples_per_s": timed * args.batch_size / train_s,
        "auc": auc(y, s),
        "eval_logloss": float(np.mean(np.logaddexp(0.0, s) - y * s)),
    }
