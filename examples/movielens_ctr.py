"""A DLRM-style click-through-rate model on MovieLens-100k: embeddings in embstore, MLP in torch.

What it shows:

* Raw 64-bit feature ids go straight into embstore tables — no vocabulary is built. Integer ids
  (user, item) are used as they are; string values (gender, occupation, zip prefix, age bucket,
  genre) become ids through a stable hash (``blake2b``, not Python's per-process ``hash``).
* ``embstore.torch.Embedding`` and ``embstore.torch.EmbeddingBag(mode="mean")`` with ``offsets``
  (the genres: a variable-length bag per movie) inside an ordinary ``nn.Module``. The rows are
  trained by the tables' own Adagrad through ``embstore.torch.EmbeddingOptimizer``; the dense
  layers by ``torch.optim.Adam``.
* Evaluation in ``model.eval()``: ids never seen in training (e.g. movies rated only in the
  test split) look up as zeros and are not stored, so the store holds exactly the training ids.

The task: a rating of 4 or 5 is a click (label 1), anything lower is not (label 0). Features:
user id, item id, age bucket, gender, occupation, zip prefix (first 3 characters) and genres.
The split is random with a fixed seed: 80% of the interactions train, 20% test. (A split by
time — train on the first 80% — leaves 85% of the test interactions with users who have none in
training, as MovieLens users arrive over time and rate in one burst: it measures cold start,
where an item's click rate is about as good as any model.)

Model (DLRM): one 16-dim embedding per field -> pairwise dot products of the 7 embeddings (21)
plus the concatenated embeddings (112) -> MLP 64-32-1 -> logit, trained with BCEWithLogitsLoss.

One table per field, not one shared table with field-prefixed ids: each field can then have its
own dim, optimizer and learning rate, and ``len(table)`` / ``table.stats()`` are per field.

Run (``make data`` fetches the data first)::

    make demo
    .venv/bin/python examples/movielens_ctr.py --data-dir .data/ml-100k --epochs 5 --seed 1

``--follower`` adds a replica that follows the training store (in this process);
``--follower-dc`` puts it in another data centre of an emulated WAN (root, ``make wan-deps``):
see :class:`FollowDc` and docs/dissemination.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import math
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TextIO

import numpy as np
import torch
from torch import nn

import embstore
import embstore.torch as et

# The model's dense half (DLRM's dot interaction and MLP) is shared with the benchmarks that
# measure this model: python/benchmarks/lib/ctr.py.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "benchmarks"))
from dissemination.latency import EVENT_DTYPE
from dissemination.wan import WanUnavailable
from lib.ctr import DotInteraction

CLIENT_SCRIPT = pathlib.Path(__file__).resolve().with_name("dc_lookup_client.py")
DEFAULT_DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / ".data" / "ml-100k"
EMBEDDING_DIM = 16
TEST_FRACTION = 0.2
SPLIT_SEED = 0
EVAL_BATCH_SIZE = 8192
# Batches a training session prepares ahead (with a 20 % budget, 2 ahead trained the 2 epochs
# in 3.2 s, 1 in 5.2 s, 0 in 6.9 s on the 2-core machine: the disk reads overlap training).
PREFETCH = 2
# Single-valued fields, in the column order of Interactions.ids; "genres" is the bag field.
SINGLE_FIELDS = ("user", "item", "age", "gender", "occupation", "zip3")
FIELDS = (*SINGLE_FIELDS, "genres")
# (upper bound, label): the MovieLens-1M age groups.
AGE_BUCKETS = (
    (18, "<18"),
    (25, "18-24"),
    (35, "25-34"),
    (45, "35-44"),
    (50, "45-49"),
    (56, "50-55"),
)


def stable_id(value: str) -> int:
    """A 64-bit feature id for a string value, the same in every process and on every machine."""
    digest = hashlib.blake2b(value.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def age_bucket(age: int) -> str:
    """The age group of ``age``: <18, 18-24, 25-34, 35-44, 45-49, 50-55 or 56+."""
    for upper, label in AGE_BUCKETS:
        if age < upper:
            return label
    return "56+"


@dataclass(frozen=True)
class Interactions:
    """Rated (user, movie) pairs as feature ids; the genre bags are stored once per movie."""

    ids: np.ndarray  #: int64 [n, len(SINGLE_FIELDS)]: one feature id per single-valued field
    genre_start: np.ndarray  #: int64 [n]: where the row's genre ids start in ``genre_ids``
    genre_len: np.ndarray  #: int64 [n]: how many genres the row's movie has
    genre_ids: np.ndarray  #: int64 [G]: the genre ids of every movie, one after another
    labels: np.ndarray  #: float32 [n]: 1.0 for a click (rating >= 4)

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: np.ndarray) -> Interactions:
        """The interactions at ``rows``, in that order."""
        return replace(
            self,
            ids=self.ids[rows],
            genre_start=self.genre_start[rows],
            genre_len=self.genre_len[rows],
            labels=self.labels[rows],
        )

    def genre_bags(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input, offsets)`` for ``EmbeddingBag``: the genre ids of ``rows``, one after
        another, and where each row's bag starts."""
        lengths = self.genre_len[rows]
        offsets = np.cumsum(lengths) - lengths
        positions = np.repeat(self.genre_start[rows] - offsets, lengths) + np.arange(lengths.sum())
        return self.genre_ids[positions], offsets

    def distinct_ids(self) -> dict[str, int]:
        """Distinct feature ids per field: the rows training on these interactions stores."""
        counts = {f: len(np.unique(self.ids[:, k])) for k, f in enumerate(SINGLE_FIELDS)}
        counts["genres"] = len(np.unique(self.genre_bags(np.arange(len(self)))[0]))
        return counts


def _read_atomic(path: pathlib.Path) -> list[list[str]]:
    """The rows of a RecBole atomic file (tab-separated, one header line)."""
    with path.open(encoding="utf-8") as f:
        next(f)
        return [line.rstrip("\n").split("\t") for line in f]


def load_movielens(data_dir: pathlib.Path) -> Interactions:
    """Read ``ml-100k.{inter,user,item}`` from ``data_dir``.

    Raises:
        FileNotFoundError: a file is missing; the message says how to fetch the data.
    """
    paths = [data_dir / f"ml-100k.{kind}" for kind in ("inter", "user", "item")]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: run `make data` to fetch MovieLens-100k into .data/ml-100k"
            )
    inter, users, items = (_read_atomic(path) for path in paths)

    user_features = {
        user: [
            int(user),
            stable_id(age_bucket(int(age))),
            stable_id(gender),
            stable_id(occupation),
            stable_id(zip_code[:3]),
        ]
        for user, age, gender, occupation, zip_code in users
    }
    genre_ids: list[int] = []
    genre_span: dict[str, tuple[int, int]] = {}
    for item, _title, _year, genres in items:
        names = genres.split()
        genre_span[item] = (len(genre_ids), len(names))
        genre_ids.extend(stable_id(name) for name in names)

    ids = np.empty((len(inter), len(SINGLE_FIELDS)), np.int64)
    genre_start = np.empty(len(inter), np.int64)
    genre_len = np.empty(len(inter), np.int64)
    labels = np.empty(len(inter), np.float32)
    for row, (user, item, rating, _timestamp) in enumerate(inter):
        user_id, *demographics = user_features[user]
        ids[row] = (user_id, int(item), *demographics)
        genre_start[row], genre_len[row] = genre_span[item]
        labels[row] = float(rating) >= 4.0
    return Interactions(ids, genre_start, genre_len, np.array(genre_ids, np.int64), labels)


def split(data: Interactions) -> tuple[Interactions, Interactions]:
    """``(train, test)``: a random ``1 - TEST_FRACTION`` of ``data`` and the rest, the same in
    every run (``SPLIT_SEED``)."""
    cut = round(len(data) * (1 - TEST_FRACTION))
    order = np.random.default_rng(SPLIT_SEED).permutation(len(data))
    return data.take(order[:cut]), data.take(order[cut:])


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def batches(
    data: Interactions, batch_size: int, order: np.ndarray, rank: int = 0, world: int = 1
) -> Iterator[Batch]:
    """``(ids [B, 6], genre_ids [N], genre_offsets [B], labels [B])`` over ``order``; of
    ``world`` processes, process ``rank`` gets its share of each batch (every process the same
    number of batches)."""
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        if world > 1:
            rows = np.array_split(rows, world)[rank]
        genre_ids, offsets = data.genre_bags(rows)
        yield (
            torch.from_numpy(data.ids[rows]),
            torch.from_numpy(genre_ids),
            torch.from_numpy(offsets),
            torch.from_numpy(data.labels[rows]),
        )


class DLRM(DotInteraction):
    """Embeddings from embstore -> pairwise dot products + concatenation -> MLP -> logit (the
    dense half is ``DotInteraction``, shared with the benchmarks)."""

    def __init__(self, tables: dict[str, embstore.Table], hidden: tuple[int, ...] = (64, 32)):
        super().__init__()
        self.fields = nn.ModuleList(et.Embedding(tables[f]) for f in SINGLE_FIELDS)
        self.genres = et.EmbeddingBag(tables["genres"], mode="mean")
        self.build_head(len(FIELDS), EMBEDDING_DIM, hidden)

    def forward(
        self, ids: torch.Tensor, genre_ids: torch.Tensor, genre_offsets: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B]`` for ``ids [B, 6]`` and the genre bags (``input``, ``offsets``)."""
        embs = [emb(ids[:, k]) for k, emb in enumerate(self.fields)]
        embs.append(self.genres(genre_ids, genre_offsets))
        return self.dense(torch.stack(embs, dim=1))  # [B, 7, D] -> [B]


class LookupTimer:
    """Ids looked up and seconds spent in the forward of the model's embstore modules (the
    table lookups), counted in training mode only."""

    def __init__(self, model: nn.Module):
        self.ids = 0
        self.seconds = 0.0
        self._start = 0.0
        for module in model.modules():
            if isinstance(module, et.Embedding | et.EmbeddingBag):
                module.register_forward_pre_hook(self._before)
                module.register_forward_hook(self._after)

    def _before(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if module.training:
            self.ids += args[0].numel()
            self._start = time.perf_counter()

    def _after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if module.training:
            self.seconds += time.perf_counter() - self._start


class Progress:
    """A one-line progress bar on stderr, redrawn with ``\\r``; when stderr is not a terminal,
    a plain line at each quarter of the epoch instead."""

    def __init__(self, title: str, total: int, enabled: bool, stream: TextIO = sys.stderr):
        self.title, self.total, self.enabled, self.stream = title, total, enabled, stream
        self.tty = stream.isatty()
        self.done = self.rows = 0
        self.loss_sum = 0.0
        self.start = self._drawn = time.perf_counter()

    def update(self, rows: int, loss: float) -> None:
        self.done += 1
        self.rows += rows
        self.loss_sum += loss * rows
        if not self.enabled:
            return
        now = time.perf_counter()
        finished = self.done == self.total
        if self.tty and (finished or now - self._drawn >= 0.1):
            self._drawn = now
            end = "\n" if finished else ""
            print(f"\r{self._line(now)}\x1b[K", end=end, file=self.stream, flush=True)
        elif not self.tty and self.done * 4 // self.total > (self.done - 1) * 4 // self.total:
            print(self._line(now), file=self.stream, flush=True)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.rows, 1)

    def _line(self, now: float) -> str:
        width = 24
        filled = width * self.done // self.total
        rate = self.rows / max(now - self.start, 1e-9)
        return (
            f"{self.title} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"batches  loss {self.mean_loss:.4f}  {rate:,.0f} rows/s"
        )


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney U) formula; tied scores get
    their average rank."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2  # 1-based rank of each distinct score
    ranks = average_rank[inverse]
    positive = labels > 0.5
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def popularity_scores(train: Interactions, test: Interactions) -> np.ndarray:
    """Each test row's item click-through rate in ``train``; the global rate for unseen items."""
    items, inverse = np.unique(train.ids[:, 1], return_inverse=True)
    ctr = np.bincount(inverse, weights=train.labels) / np.bincount(inverse)
    where = np.searchsorted(items, test.ids[:, 1]).clip(max=len(items) - 1)
    seen = items[where] == test.ids[:, 1]
    return np.where(seen, ctr[where], train.labels.mean())


@torch.no_grad()
def evaluate(model: DLRM, data: Interactions) -> tuple[float, float]:
    """``(log-loss, AUC)`` of ``model`` on ``data``, in eval mode (unknown ids: zeros)."""
    model.eval()
    order = np.arange(len(data))
    logits = torch.cat([model(*batch[:3]) for batch in batches(data, EVAL_BATCH_SIZE, order)])
    labels = torch.from_numpy(data.labels)
    logloss = nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    return logloss, auc(data.labels, logits.numpy())


def run(
    data_dir: str | pathlib.Path = DEFAULT_DATA_DIR,
    epochs: int = 3,
    batch_size: int = 1024,
    seed: int = 0,
    lr: float = 3e-3,
    emb_lr: float = 0.05,
    quiet: bool = False,
    store_dir: str | pathlib.Path | None = None,
    memory_budget_bytes: int | None = None,
    follower: bool = False,
    follower_dc: bool = False,
    session: bool = False,
    distributed: bool = False,
    metrics: str | None = None,
    dtype: str = "fp32",
) -> dict[str, Any]:
    """Train and evaluate; print progress (stderr) and per-epoch results unless ``quiet``.

    With ``store_dir`` (a new or empty directory) the tables live in a durable store there,
    flushed at the end of every epoch: the numbers are the same as in memory, and the trained
    tables stay on disk (``embstore.Store(store_dir)`` reopens them). ``memory_budget_bytes``
    (with ``store_dir``) caps the memory the tables hold: the other rows live on disk and are
    read back when a batch uses them — the numbers are still the same.

    With ``follower``, the training store serves a sync port and a replica follows it while
    it trains (``embstore.Store.follow``, the way an inference server in another data centre
    would): after every epoch it reports the replica's freshness lag and checks that the
    replica serves the test users' rows exactly as the trainer holds them (``follower`` in the
    result).

    With ``follower_dc``, the same across an emulated WAN (root and the WAN's dependencies
    needed, see :class:`FollowDc`): the trainer's sync port in data centre 1, an inference
    server (``embstore serve --follow ... --listen``) in data centre 2 that the test users'
    lookups go to; every epoch reports its freshness lag, how many test users it served as
    trained and the bytes that crossed the WAN, and the end its totals and the test AUC of the
    rows it serves (``follower_dc`` in the result).

    With ``session`` the batches go through a training session (``store.session``): its
    background thread partitions the next batches' ids and, with a memory budget, reads their
    rows from disk and pins them, while this one trains; ``embeddings()`` / ``bags()`` take the
    place of the embstore modules and ``push_grads()`` of ``EmbeddingOptimizer.step()``. The
    numbers are those of the module path. ``distributed`` (under torchrun; implies ``session``)
    spreads the tables over the job's processes (``embstore.DistributedStore``), each training on
    its share of every batch, the MLP in DDP; every process evaluates, process 0 prints.

    ``lr`` is the dense layers' Adam learning rate, ``emb_lr`` the tables' Adagrad one;
    ``dtype`` the tables' storage dtype (``"fp32"``, ``"bf16"`` or ``"fp16"``: 16-bit rows
    take half the memory; see docs/table.md). Torch
    runs on one thread: the MLP is too small to gain from more, and on a small machine torch's
    spinning worker threads can slow every step many times over when a core is busy elsewhere.

    Returns:
        ``test_auc``, ``test_logloss``, ``popularity_auc``, ``rows`` (stored, all tables),
        ``rows_per_table``, ``distinct_train_ids`` (per field), ``train_size``, ``test_size``,
        ``seconds`` and ``epochs``: one dict per epoch with ``train_logloss`` (mean of the
        epoch's batch losses), ``test_logloss``, ``test_auc``, ``rows``, ``lookups`` (ids
        looked up in training), ``lookups_per_s`` (per second of training wall time),
        ``lookups_per_s_in_store`` (per second spent in the embstore modules' forward),
        ``store_seconds`` (in those forwards and in ``EmbeddingOptimizer.step``),
        ``train_seconds`` (the epoch's training loop), ``seconds`` (with its tests);
        with a memory budget, ``peak_memory_bytes`` (the most the tables held after a step:
        with batches that touch more rows than the budget, their pinned rows exceed it).
    """
    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train, test = split(load_movielens(pathlib.Path(data_dir)))
    say = (lambda *args: None) if quiet else print
    say(
        f"random split (seed {SPLIT_SEED}): {len(train):,} interactions train, {len(test):,} "
        f"test; click rate {train.labels.mean():.3f} train, {test.labels.mean():.3f} test"
    )

    session = session or distributed
    if store_dir is not None:
        store_dir = pathlib.Path(store_dir)
        if store_dir.exists() and any(store_dir.iterdir()) and not distributed:
            raise FileExistsError(f"--store-dir {store_dir} is not empty; give a new directory")
    # Under torchrun the tables are shared by the job's processes: a store that wraps each
    # process's partition (the same calls below, made by every process).
    opener = embstore.DistributedStore if distributed else embstore.Store
    store = opener(store_dir, memory_budget_bytes=memory_budget_bytes)
    rank, world = store.rank, store.world_size
    if rank != 0:
        say = lambda *args: None  # noqa: E731 - process 0 speaks for the job
        quiet = True
    tables = {
        field: store.create_table(
            field,
            embedding_dim=EMBEDDING_DIM,
            optimizer=embstore.Adagrad(lr=emb_lr),
            initializer=embstore.Normal(std=0.01),
            seed=seed,
            dtype=dtype,
        )
        for field in FIELDS
    }
    model = DLRM(tables)

    def batch_ids(batch: Batch) -> dict[embstore.Table, torch.Tensor]:
        """The ids each table is looked up with in ``batch`` (for the prefetch thread)."""
        ids, genre_ids = batch[0], batch[1]
        return {tables[f]: ids[:, k] for k, f in enumerate(SINGLE_FIELDS)} | {
            tables["genres"]: genre_ids
        }

    def session_ids(batch: Batch) -> dict[str, torch.Tensor]:
        return {t.name: ids for t, ids in batch_ids(batch).items()}

    dense = model
    if distributed:
        # The MLP's gradients are averaged over the processes by DDP; the tables' by the
        # session (push_grads), the same way.
        dense = nn.parallel.DistributedDataParallel(model.mlp)
        model.mlp = dense  # type: ignore[assignment]
    dense_opt = torch.optim.Adam(model.parameters(), lr=lr)
    sparse_opt = et.EmbeddingOptimizer(model)
    timer = LookupTimer(model)
    loss_fn = nn.BCEWithLogitsLoss()
    sess = store.session(list(FIELDS), prefetch=PREFETCH) if session else None
    if sess is not None and metrics is not None:
        host, _, port = metrics.rpartition(":")
        # One port per process: the given one plus the process's rank.
        address = sess.serve_metrics(f"{host}:{int(port) + rank if int(port) else 0}")
        print(f"process {rank}: session metrics on http://{address}/metrics", file=sys.stderr)

    history: list[dict[str, Any]] = []
    peak_memory = 0  # bytes the tables held, at most, after a training step (with a budget)
    steps = math.ceil(len(train) / batch_size)
    # The follower starts once the tables exist (it follows the tables its source has when it
    # joins); FollowDc cleans up after itself if it fails half-way, the `finally` after that.
    sync: Follow | FollowDc | None = None
    if follower_dc:
        sync = FollowDc(store, say)
    elif follower:
        sync = Follow(store)
    try:
        for epoch in range(1, epochs + 1):
            model.train()
            progress = Progress(f"epoch {epoch}/{epochs}", steps, enabled=not quiet)
            timer.ids, timer.seconds = 0, 0.0
            step_seconds = 0.0
            epoch_start = time.perf_counter()
            epoch_batches = batches(train, batch_size, rng.permutation(len(train)), rank, world)
            if sess is not None:
                before = sess.stats()
                for b in sess.run(epoch_batches, session_ids):
                    _ids, _genre_ids, genre_offsets, labels = b.data
                    embs = [b.embeddings(f) for f in SINGLE_FIELDS]
                    embs.append(b.bags("genres", genre_offsets, mode="mean"))
                    loss = loss_fn(model.dense(torch.stack(embs, dim=1)), labels)
                    loss.backward()
                    b.push_grads()
                    dense_opt.step()
                    dense_opt.zero_grad()
                    if store.memory_budget is not None:
                        peak_memory = max(peak_memory, store.memory_budget[1])
                    progress.update(len(labels) * world, loss.item())
                after = sess.stats()
                timer.ids = after["rows"]["pulled"] - before["rows"]["pulled"]
                timer.seconds = sum(
                    after["busy_s"][k] - before["busy_s"][k] for k in ("gather", "write_back")
                )
                stages = {k: after["busy_s"][k] - before["busy_s"][k] for k in after["busy_s"]} | {
                    f"blocked_{k}": after["blocked_s"][k] - before["blocked_s"][k]
                    for k in after["blocked_s"]
                }
                exchanged = (after["bytes_sent"] - before["bytes_sent"]) + (
                    after["bytes_received"] - before["bytes_received"]
                )
            else:
                if memory_budget_bytes is not None:
                    # Rows beyond the budget live on disk: a background thread reads the next
                    # batch's rows (and pins them) while this one trains.
                    epoch_batches = embstore.prefetch(epoch_batches, batch_ids)
                for ids, genre_ids, genre_offsets, labels in epoch_batches:
                    loss = loss_fn(model(ids, genre_ids, genre_offsets), labels)
                    loss.backward()
                    dense_opt.step()
                    step_start = time.perf_counter()
                    sparse_opt.step()
                    step_seconds += time.perf_counter() - step_start
                    dense_opt.zero_grad()
                    sparse_opt.zero_grad()
                    if store.memory_budget is not None:
                        peak_memory = max(peak_memory, store.memory_budget[1])
                    progress.update(len(labels), loss.item())
            train_seconds = time.perf_counter() - epoch_start
            if sess is not None:
                test_logloss, test_auc = evaluate_tables(model, tables, test)
            else:
                test_logloss, test_auc = evaluate(model, test)
            stats = {
                "epoch": epoch,
                "train_logloss": progress.mean_loss,
                "test_logloss": test_logloss,
                "test_auc": test_auc,
                "rows": sum(len(t) for t in tables.values()),
                "lookups": timer.ids * world,
                "lookups_per_s": timer.ids / train_seconds,
                "lookups_per_s_in_store": timer.ids / timer.seconds,
                "store_seconds": timer.seconds + step_seconds,
                "train_seconds": train_seconds,
                "seconds": time.perf_counter() - epoch_start,
            }
            if sess is not None:
                stats["stages"] = stages
                stats["bytes_exchanged"] = exchanged
            if store_dir is not None:
                flush_start = time.perf_counter()
                flushed = store.flush()
                stats["flush"] = {**flushed, "seconds": time.perf_counter() - flush_start}
            history.append(stats)
            say(
                f"epoch {epoch}/{epochs}: train log-loss {stats['train_logloss']:.4f} | "
                f"test log-loss {test_logloss:.4f} | test AUC {test_auc:.4f} | "
                f"rows stored {stats['rows']:,}\n"
                + (
                    f"  {timer.ids / 1e6:.2f}M ids looked up: "
                    f"{stats['lookups_per_s'] / 1e6:.2f}M/s of training wall time, "
                    f"{stats['lookups_per_s_in_store'] / 1e6:.1f}M/s in embstore modules; "
                    f"{stats['store_seconds']:.2f}s of {train_seconds:.2f}s in embstore "
                    "(lookups + step)"
                    if sess is None
                    else f"  {stats['lookups']:,} rows gathered into batches "
                    f"({stats['lookups_per_s'] / 1e6:.2f}M/s of training wall time); "
                    f"{train_seconds:.2f}s of training"
                )
            )
            if "stages" in stats:
                st = stats["stages"]
                say(
                    "  session stages (s): "
                    + ", ".join(f"{k} {st[k]:.2f}" for k in embstore.session.STAGES)
                    + f"; waited for a prepared batch {st['blocked_train']:.2f}"
                    + (
                        f"; {stats['bytes_exchanged'] / 1e6:.1f} MB exchanged with the other "
                        f"{world - 1} process{'es' if world > 2 else ''}"
                        if world > 1
                        else ""
                    )
                )
            if sync is not None:
                stats["follower"] = sync.check(tables["user"], test.ids[:, 0])
                say(sync.line(stats["follower"]))
            if "flush" in stats:
                f = stats["flush"]
                say(
                    f"  flushed {f['records']:,} rows ({f['bytes'] / 1e6:.1f} MB) to "
                    f"{store_dir} in {f['seconds'] * 1e3:.0f} ms"
                )

        last = history[-1]
        if isinstance(sync, FollowDc):
            last["follower_dc"] = sync.finish(model, tables, test)
            say(sync.summary(last["follower_dc"]))
    finally:
        if sync is not None:
            sync.close()
    # Memory and disk are each process's own: its partition's (`local`: the table itself in
    # one process).
    result = {
        "test_auc": last["test_auc"],
        "test_logloss": last["test_logloss"],
        "popularity_auc": auc(test.labels, popularity_scores(train, test)),
        "rows": last["rows"],
        "rows_per_table": {field: len(t) for field, t in tables.items()},
        "memory_bytes": sum(t.local.stats()["bytes_reserved"] for t in tables.values()),
        # What the rows themselves take (values, optimizer state, metadata, index bucket) and
        # what every key's index takes (hot and cold indexes, 16 B a bucket).
        "row_bytes": sum(t.local.stats()["bytes_used"] for t in tables.values()),
        "index_bytes": sum(2 * 16 * t.local.index_stats()["capacity"] for t in tables.values()),
        "rows_on_disk": sum(t.local.stats()["rows_on_disk"] for t in tables.values()),
        "cold_reads": sum(t.local.stats()["cold_reads"] for t in tables.values()),
        "peak_memory_bytes": peak_memory,
        "cold_read_ios": sum(t.local.stats()["cold_read_ios"] for t in tables.values()),
        "distinct_train_ids": train.distinct_ids(),
        "train_size": len(train),
        "test_size": len(test),
        "seconds": time.perf_counter() - started,
        "epochs": history,
        "rank": rank,
        "processes": world,
        **{k: last[k] for k in ("follower", "follower_dc") if k in last},
    }
    if distributed:
        store.close()  # every process's partition flushed before the job ends
    return result


class Follow:
    """A replica following the training store over its sync port (as an inference server in
    another data centre would), and the check that it serves what the trainer holds."""

    def __init__(self, store: embstore.Store) -> None:
        self.port = store.serve_sync("127.0.0.1:0")
        self.replica = embstore.Store.follow(self.port.address)

    def check(self, table: embstore.Table, users: np.ndarray) -> dict[str, Any]:
        """Waits for the replica to catch up, then compares its rows of ``users`` (what it
        serves them) with the trainer's."""
        lags = [s for s in self.replica.sync_status() if s["lag_ms_p50"] is not None]
        start = time.perf_counter()
        caught_up = self.replica.wait_caught_up(timeout=30)
        wait_ms = (time.perf_counter() - start) * 1e3
        users = np.unique(users)
        served = self.replica[table.name].lookup(users, on_miss="zeros")
        trained = table.lookup(users, on_miss="zeros")
        same = int((served == trained).all(axis=1).sum())
        return {
            "lag_ms_p50": max((s["lag_ms_p50"] for s in lags), default=None),
            "lag_ms_p99": max((s["lag_ms_p99"] for s in lags), default=None),
            "caught_up": caught_up,
            "catch_up_ms": wait_ms,
            "users": len(users),
            "users_equal": same,
            "bytes_in": sum(s["bytes_in"] for s in self.replica.sync_status()),
        }

    @staticmethod
    def line(f: dict[str, Any]) -> str:
        p50, p99 = f["lag_ms_p50"], f["lag_ms_p99"]
        lag = f"lag p50 {p50:.0f} ms, p99 {p99:.0f} ms" if p50 is not None else "no lag yet"
        return (
            f"  follower: {lag} while training (worst table); in sync again "
            f"{f['catch_up_ms']:.0f} ms after the epoch (one change-list round); serves "
            f"{f['users_equal']:,} of {f['users']:,} test users' rows exactly as trained; "
            f"{f['bytes_in'] / 1e6:.1f} MB pulled so far"
        )

    def close(self) -> None:
        self.replica.close()
        self.port.stop()


class _NetNs:
    """``with _NetNs("ek-s1-1"):`` runs its body's socket calls in that network namespace: this
    thread enters it, and leaves it on the way out (other threads are not affected). A socket
    made inside stays there; threads started inside start there."""

    _libc = None

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def _setns(cls, fd: int) -> None:
        if cls._libc is None:
            cls._libc = ctypes.CDLL(None, use_errno=True)
        if cls._libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")

    def __enter__(self) -> None:
        self.own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
            try:
                self._setns(target)
            finally:
                os.close(target)
        except BaseException:
            os.close(self.own)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._setns(self.own)
        finally:
            os.close(self.own)


class FollowDc:
    """The trainer in data centre 1 and an inference server in data centre 2, across an
    emulated WAN (``python/benchmarks/dissemination/wan.py``: 2 DCs x 1 server, network
    namespaces ``ek-s1-1`` and ``ek-s2-1``, a shaped WAN link with a one-way delay). Needs root
    and the WAN's dependencies (``make wan-deps``): :func:`wan_unavailable` says why not.

    * The training store's sync port listens on DC 1's address (this process stays where it
      is; only the port's socket is made inside DC 1's namespace).
    * DC 2 runs ``embstore serve --follow <DC 1's sync port> --listen <DC 2>:7000
      --sync-events FILE``: an in-memory copy, kept fresh, serving lookups. Its freshness lag
      is read from the events file (one record per applied reply: now minus the write time of
      the newest row the reply brought, as in ``sync_status()``), its totals from the lines
      it prints when it stops.
    * The test users' lookups come from a client in DC 2 (``examples/dc_lookup_client.py``,
      ``embstore.connect`` to the follower), which this process drives over a pipe.

    Everything it starts is stopped by PID and the namespaces are removed by :meth:`close`,
    also when it fails half-way."""

    WAN: ClassVar[dict[str, float]] = {
        "dcs": 2,
        "servers": 1,
        "nic_mbit": 1000,
        "wan_mbit": 100,
        "one_way_ms": 25,
    }
    SERVE_PORT = 7000
    CATCH_UP_TIMEOUT = 60.0

    def __init__(self, store: embstore.Store, say: Any = print) -> None:
        from dissemination.wan import Wan, WanConfig, server_addr, server_ns

        self.say = say
        self.cfg = WanConfig(**self.WAN)
        self.stack = contextlib.ExitStack()
        try:
            tmp = pathlib.Path(
                self.stack.enter_context(tempfile.TemporaryDirectory(prefix="embstore-demo-dc-"))
            )
            self.wan = self.stack.enter_context(Wan(self.cfg, log=lambda msg: say(f"  {msg}")))
            with _NetNs(server_ns(1, 1)):
                self.port = store.serve_sync(f"{server_addr(1, 1)}:0")
            self.stack.callback(self.port.stop)
            self.events_path = tmp / "sync-events"
            self.events_pos = 0
            self.serve_address = f"{server_addr(2, 1)}:{self.SERVE_PORT}"
            self.follower_out = tmp / "follower.out"
            with open(self.follower_out, "wb") as out:
                self.follower = self.wan.spawn(
                    2,
                    1,
                    [
                        sys.executable, "-m", "embstore", "serve",
                        "--follow", self.port.address,
                        "--listen", self.serve_address,
                        "--sync-events", str(self.events_path),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            self._wait_started()
            self.client_err = tmp / "client.err"
            with open(self.client_err, "wb") as err:
                self.client = self.wan.spawn(
                    2,
                    1,
                    [sys.executable, str(CLIENT_SCRIPT), self.serve_address],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    bufsize=0,
                )
            self._buf = bytearray()
            if self._read_line(30.0) != "ready":
                raise RuntimeError("the lookup client in DC 2 did not start")
            self.bytes_start = self.wan.wan_bytes()
            self.lags: list[np.ndarray] = []
            say(
                f"  trainer's sync port on {self.port.address} (DC 1); follower serving "
                f"lookups on {self.serve_address} (DC 2); WAN {self.cfg.wan_mbit:g} Mbit/s, "
                f"{self.cfg.one_way_ms:g} ms one way"
            )
        except BaseException:
            self.stack.close()
            raise

    def _wait_started(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while f"on {self.serve_address}" not in self.follower_out.read_text(errors="replace"):
            if self.follower.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the follower in DC 2 did not start: "
                    + self.follower_out.read_text(errors="replace").strip()
                )
            time.sleep(0.05)

    def _fill(self, deadline: float) -> None:
        assert self.client.stdout is not None
        fd = self.client.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1 << 20) if ready else None
        if not chunk:
            why = "timed out" if chunk is None else "exited"
            raise RuntimeError(
                f"the lookup client in DC 2 {why}: "
                + self.client_err.read_text(errors="replace").strip()
            )
        self._buf += chunk

    def _read_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            self._fill(deadline)
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line.decode()

    def served(self, table: str, ids: np.ndarray, timeout: float = 30.0) -> np.ndarray:
        """The rows of ``ids`` as the follower in DC 2 serves them (zeros for ids it lacks),
        looked up by the client in DC 2."""
        assert self.client.stdin is not None
        ids = np.ascontiguousarray(ids, np.int64)
        self.client.stdin.write(f"{table} {len(ids)}\n".encode() + ids.tobytes())
        head = self._read_line(timeout).split(maxsplit=2)
        if head[0] != "rows":
            raise RuntimeError(f"lookup on the follower in DC 2 failed: {' '.join(head[1:])}")
        n, dim = int(head[1]), int(head[2])
        deadline = time.monotonic() + timeout
        while len(self._buf) < n * dim * 4:
            self._fill(deadline)
        rows = np.frombuffer(bytes(self._buf[: n * dim * 4]), np.float32).reshape(n, dim)
        del self._buf[: n * dim * 4]
        return rows

    def _new_lags(self) -> np.ndarray:
        """The freshness lag (ms) of each reply the follower applied since the last call."""
        try:
            with open(self.events_path, "rb") as f:
                f.seek(self.events_pos)
                raw = f.read()
        except FileNotFoundError:
            return np.zeros(0)
        n = len(raw) // EVENT_DTYPE.itemsize
        self.events_pos += n * EVENT_DTYPE.itemsize
        ev = np.frombuffer(raw[: n * EVENT_DTYPE.itemsize], EVENT_DTYPE)
        ev = ev[ev["newest_ts"] > 0]
        # newest_ts is a row version: milliseconds since the epoch << 16 | a counter.
        lag = ev["t_us"].astype(np.float64) / 1e3 - (ev["newest_ts"] >> 16).astype(np.float64)
        self.lags.append(lag)
        return lag

    def wan_mb(self) -> tuple[float, float]:
        """MB sent DC 1 -> DC 2 and DC 2 -> DC 1 since the WAN came up (headers included)."""
        now = self.wan.wan_bytes()
        return tuple((now[k] - self.bytes_start.get(k, 0)) / 1e6 for k in ((1, 2), (2, 1)))

    def check(self, table: embstore.Table, users: np.ndarray) -> dict[str, Any]:
        """After an epoch: how many of ``users``' rows the follower serves as the trainer holds
        them now, then how long until it serves all of them so; the lag of the replies it
        applied since the last check; the WAN bytes so far."""
        users = np.unique(users)
        trained = table.lookup(users, on_miss="zeros")
        start = time.monotonic()
        at_end = same = int((self.served(table.name, users) == trained).all(axis=1).sum())
        while same < len(users) and time.monotonic() - start < self.CATCH_UP_TIMEOUT:
            time.sleep(0.05)
            same = int((self.served(table.name, users) == trained).all(axis=1).sum())
        catch_up_ms = (time.monotonic() - start) * 1e3
        lag = self._new_lags()
        to_dc2, to_dc1 = self.wan_mb()
        return {
            "lag_ms_p50": float(np.percentile(lag, 50)) if len(lag) else None,
            "lag_ms_p99": float(np.percentile(lag, 99)) if len(lag) else None,
            "replies": len(lag),
            "users": len(users),
            "users_equal_at_epoch_end": at_end,
            "users_equal": same,
            "caught_up": same == len(users),
            "catch_up_ms": catch_up_ms,
            "wan_mb_to_dc2": to_dc2,
            "wan_mb_to_dc1": to_dc1,
        }

    @staticmethod
    def line(f: dict[str, Any]) -> str:
        p50, p99 = f["lag_ms_p50"], f["lag_ms_p99"]
        lag = f"lag p50 {p50:.0f} ms, p99 {p99:.0f} ms" if p50 is not None else "no lag yet"
        synced = (
            f"all of them {f['catch_up_ms']:.0f} ms later"
            if f["caught_up"]
            else f"only {f['users_equal']:,} after {f['catch_up_ms'] / 1e3:.0f} s (NOT in sync)"
        )
        return (
            f"  follower in DC 2: {lag} over {f['replies']:,} replies applied; at the epoch's "
            f"end it served {f['users_equal_at_epoch_end']:,} of {f['users']:,} test users' "
            f"rows as trained, {synced}; WAN so far {f['wan_mb_to_dc2']:.1f} MB DC1->DC2, "
            f"{f['wan_mb_to_dc1'] * 1e3:.1f} kB DC2->DC1"
        )

    def finish(
        self, model: DLRM, tables: dict[str, embstore.Table], test: Interactions
    ) -> dict[str, Any]:
        """Once training is over: the test AUC of the rows the follower serves and of the
        trainer's own (the same computation), then the follower's totals (it is stopped and
        reports them)."""
        trainer_auc = evaluate_rows(model, test, lambda f, ids: tables[f].lookup(ids, "zeros"))
        follower_auc = evaluate_rows(model, test, self.served)
        self.wan.stop(self.client)
        self.wan.stop(self.follower)
        report = self.follower_out.read_text(errors="replace")
        followed = re.findall(
            r"followed (\w+) from \S+: ([\d,]+) rows applied, .* ([\d,]+) bytes in, .* "
            r"(\d+) errors",
            report,
        )
        if len(followed) != len(tables):
            raise RuntimeError(f"the follower in DC 2 did not report every table:\n{report}")
        lag = np.concatenate(self.lags) if self.lags else np.zeros(0)
        to_dc2, to_dc1 = self.wan_mb()
        return {
            "lag_ms_p50": float(np.percentile(lag, 50)) if len(lag) else None,
            "lag_ms_p99": float(np.percentile(lag, 99)) if len(lag) else None,
            "replies": len(lag),
            "rows_applied": sum(int(r.replace(",", "")) for _, r, _, _ in followed),
            "bytes_in": sum(int(b.replace(",", "")) for _, _, b, _ in followed),
            "errors": sum(int(e) for *_, e in followed),
            "wan_mb_to_dc2": to_dc2,
            "wan_mb_to_dc1": to_dc1,
            "follower_auc": follower_auc,
            "trainer_auc": trainer_auc,
        }

    @staticmethod
    def summary(f: dict[str, Any]) -> str:
        p50, p99 = f["lag_ms_p50"], f["lag_ms_p99"]
        lag = f"lag p50 {p50:.0f} ms, p99 {p99:.0f} ms" if p50 is not None else "no lag"
        same = "same" if f["follower_auc"] == f["trainer_auc"] else "DIFFERS"
        return (
            f"follower in DC 2: {lag} over the run ({f['replies']:,} replies); "
            f"{f['rows_applied']:,} rows applied, {f['bytes_in'] / 1e6:.1f} MB pulled, "
            f"{f['errors']} errors; WAN {f['wan_mb_to_dc2']:.1f} MB DC1->DC2, "
            f"{f['wan_mb_to_dc1'] * 1e3:.1f} kB DC2->DC1\n"
            f"test AUC from the follower's rows {f['follower_auc']:.4f}, from the trainer's "
            f"{f['trainer_auc']:.4f} ({same})"
        )

    def close(self) -> None:
        """Stops the client, the follower and the sync port; removes the namespaces."""
        self.stack.close()


def wan_unavailable() -> str | None:
    """Why :class:`FollowDc` cannot run here (not root, ``make wan-deps`` missing, another
    run's namespaces present), or None."""
    from dissemination.wan import WanUnavailable, check_available, ek_namespaces

    try:
        check_available(sys.executable)
    except WanUnavailable as e:
        return str(e)
    left = ek_namespaces()
    if left:
        return f"ek-* namespaces already exist (another run?): {' '.join(left)}"
    return None


def evaluate_tables(
    model: DLRM, tables: dict[str, embstore.Table], data: Interactions
) -> tuple[float, float]:
    """``(log-loss, AUC)`` of ``model`` on ``data`` with the tables' rows (zeros for ids never
    trained), looked up through the tables themselves: in a distributed store every process
    calls this alike (the lookups are collective)."""
    logits = _dense_logits(model, data, lambda f, ids: tables[f].lookup(ids, "zeros"))
    labels = torch.from_numpy(data.labels)
    logloss = nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    return logloss, auc(data.labels, logits.numpy())


def evaluate_rows(
    model: DLRM, data: Interactions, lookup: Callable[[str, np.ndarray], np.ndarray]
) -> float:
    """The test AUC of ``model``'s dense layers on the rows ``lookup(field, ids)`` gives (zeros
    for unknown ids, as in :func:`evaluate`), e.g. as a follower serves them."""
    return auc(data.labels, _dense_logits(model, data, lookup).numpy())


def _dense_logits(
    model: DLRM, data: Interactions, lookup: Callable[[str, np.ndarray], np.ndarray]
) -> torch.Tensor:
    """Logits of ``model``'s dense layers over ``data`` with the rows ``lookup`` gives."""
    embs = [torch.from_numpy(lookup(f, data.ids[:, k]).copy()) for k, f in enumerate(SINGLE_FIELDS)]
    genre_ids, offsets = data.genre_bags(np.arange(len(data)))
    genre_rows = torch.from_numpy(lookup("genres", genre_ids).copy())
    embs.append(
        nn.functional.embedding_bag(
            torch.arange(len(genre_ids)), genre_rows, torch.from_numpy(offsets), mode="mean"
        )
    )
    model.eval()
    with torch.no_grad():
        return model.dense(torch.stack(embs, dim=1))


def summary(result: dict[str, Any]) -> str:
    """The closing lines: model vs popularity AUC, what the store holds, the run time."""
    gain = result["test_auc"] - result["popularity_auc"]
    per_table = ", ".join(f"{f} {n:,}" for f, n in result["rows_per_table"].items())
    return (
        f"test AUC {result['test_auc']:.4f} vs item-popularity baseline "
        f"{result['popularity_auc']:.4f} ({gain:+.4f})\n"
        f"rows stored: {result['rows']:,} ({per_table})\n"
        f"{len(result['epochs'])} epochs on {result['train_size']:,} interactions, tested on "
        f"{result['test_size']:,}, in {result['seconds']:.1f}s"
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train a DLRM-style CTR model (embstore embeddings + torch MLP) on "
        "MovieLens-100k; a rating >= 4 is a click. Random split with a fixed seed: 80% train, "
        "20% test.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        type=pathlib.Path,
        default=DEFAULT_DATA_DIR,
        help="directory with ml-100k.{inter,user,item} (fetch with `make data`)",
    )
    parser.add_argument(
        "--epochs", type=_positive_int, default=3, help="passes over the training set"
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=1024, help="interactions per step"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of torch, numpy (batch order) and the tables' initializers; the split is fixed",
    )
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (MLP)")
    parser.add_argument(
        "--emb-lr", type=float, default=0.05, help="Adagrad learning rate (embstore tables)"
    )
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="storage dtype of the tables' rows (16-bit: half the memory)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary: no progress, no epochs"
    )
    parser.add_argument(
        "--memory-budget",
        type=_positive_int,
        default=None,
        metavar="BYTES",
        help="with --store-dir: bytes of memory the tables may hold; other rows live on disk",
    )
    parser.add_argument(
        "--no-budget-run",
        action="store_true",
        help="skip the closing run with a memory budget (rows mostly on disk)",
    )
    parser.add_argument(
        "--budget-share",
        type=float,
        default=0.2,
        metavar="SHARE",
        help="the closing run's memory budget: every key's index plus this share of the rows' "
        "bytes, in (0, 1]",
    )
    followers = parser.add_mutually_exclusive_group()
    followers.add_argument(
        "--follower",
        action="store_true",
        help="also run a replica that follows the training store over its sync port and "
        "report, every epoch, how fresh it is and whether it serves the test users' rows as "
        "trained",
    )
    followers.add_argument(
        "--follower-dc",
        action="store_true",
        help="the same across an emulated WAN (2 data centres, 100 Mbit/s, 25 ms one way): "
        "an inference server in DC 2 follows the trainer in DC 1 and serves the test users; "
        "needs root and `make wan-deps` (exits 2 saying why when they are missing)",
    )
    parser.add_argument(
        "--store-dir",
        type=pathlib.Path,
        default=None,
        help="keep the tables in a durable store in this new directory, flushed every epoch "
        "(default: in memory; with --distributed or --memory-budget-share a temporary one)",
    )
    parser.add_argument(
        "--memory-budget-share",
        type=float,
        default=None,
        metavar="SHARE",
        help="train with a memory budget of every key's index plus this share of the rows' "
        "bytes (per process: its partition's), in (0, 1]; the other rows live on disk",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="run under torchrun (torchrun --nproc-per-node 2 examples/movielens_ctr.py "
        "--distributed): the tables are spread over the processes, each trains on its share of "
        "every batch through a training session; process 0 prints",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="with --distributed or --memory-budget-share: serve the training session's "
        "per-stage metrics (Prometheus text) on http://HOST:PORT+rank/metrics",
    )
    args = parser.parse_args(argv)
    if not 0 < args.budget_share <= 1:
        parser.error(f"--budget-share must be in (0, 1], got {args.budget_share}")
    if args.memory_budget_share is not None and not 0 < args.memory_budget_share <= 1:
        parser.error(f"--memory-budget-share must be in (0, 1], got {args.memory_budget_share}")
    if args.memory_budget_share is not None and args.memory_budget is not None:
        parser.error("give --memory-budget or --memory-budget-share, not both")
    if args.distributed and (args.follower or args.follower_dc):
        parser.error("--follower and --follower-dc run with one training process")
    if args.distributed or args.memory_budget_share is not None:
        return session_main(args)
    if args.follower_dc:
        why = wan_unavailable()
        if why is not None:
            print(f"error: --follower-dc needs the emulated WAN: {why}", file=sys.stderr)
            return 2
        # SIGTERM unwinds like Ctrl-C: the follower and the client are stopped, the
        # namespaces removed. SIGINT too when started in the background, where the shell
        # leaves it ignored (`cmd &`) and a `kill -INT` would otherwise do nothing.
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run(
            **training_args(args),
            quiet=args.quiet,
            store_dir=args.store_dir,
            memory_budget_bytes=args.memory_budget,
            follower=args.follower,
            follower_dc=args.follower_dc,
        )
    except (FileNotFoundError, FileExistsError, embstore.InvalidArgumentError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except WanUnavailable as err:  # another run took the namespaces after the check
        print(f"error: --follower-dc needs the emulated WAN: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(summary(result))
    if args.memory_budget is None and not args.no_budget_run:
        return budget_run(args, result)
    return 0


def session_main(args: argparse.Namespace) -> int:
    """``--distributed`` and/or ``--memory-budget-share``: one run through a training session,
    in the store at ``--store-dir`` or a temporary one (removed at the end)."""
    if args.distributed and "RANK" not in os.environ:
        print(
            "error: --distributed runs under torchrun, e.g. `torchrun --nproc-per-node 2 "
            "examples/movielens_ctr.py --distributed` (no RANK in the environment)",
            file=sys.stderr,
        )
        return 2
    budget = None
    if args.memory_budget_share is not None:
        index_bytes, row_bytes = table_bytes(args)
        world = int(os.environ.get("WORLD_SIZE", "1")) if args.distributed else 1
        budget = max(1, int((index_bytes + row_bytes * args.memory_budget_share) / world))
    elif args.memory_budget is not None:
        budget = args.memory_budget
    tmp = None
    store_dir = args.store_dir
    if store_dir is None and (budget is not None or args.distributed):
        # Every process of the job names the same directory: from torchrun's run id.
        job = "-".join(
            os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
        )
        job = re.sub(r"[^A-Za-z0-9.-]", "_", job) if args.distributed else str(os.getpid())
        tmp = pathlib.Path(tempfile.gettempdir()) / f"embstore-movielens-{job}"
        store_dir = tmp
    try:
        result = run(
            **training_args(args),
            quiet=args.quiet,
            store_dir=store_dir,
            memory_budget_bytes=budget,
            session=True,
            distributed=args.distributed,
            metrics=args.metrics,
        )
    except (FileNotFoundError, FileExistsError, embstore.InvalidArgumentError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if tmp is not None:
            if args.distributed and torch.distributed.is_initialized():
                torch.distributed.barrier()  # every process has closed its partition
            if int(os.environ.get("RANK", "0")) == 0:
                shutil.rmtree(tmp, ignore_errors=True)
    if result["rank"] == 0:
        print(summary(result))
        if budget is not None:
            print(
                f"memory budget {budget / 1024:.0f} KiB per process: "
                f"{result['rows_on_disk']:,} rows on disk at the end (process 0), "
                f"{result['cold_reads']:,} read back"
            )
    return 0


def table_bytes(args: argparse.Namespace) -> tuple[int, int]:
    """``(index bytes, row bytes)`` the training ids take in memory: the tables filled with
    them in a throwaway in-memory store (what a budget share is a share of)."""
    train, _ = split(load_movielens(args.data_dir))
    store = embstore.Store()
    index = rows = 0
    genre_ids, _ = train.genre_bags(np.arange(len(train)))
    for k, f in enumerate(FIELDS):
        t = store.create_table(
            f, EMBEDDING_DIM, optimizer=embstore.Adagrad(lr=args.emb_lr), dtype=args.dtype
        )
        t.lookup(genre_ids if f == "genres" else train.ids[:, k])
        rows += t.stats()["bytes_used"]
        index += 2 * 16 * t.index_stats()["capacity"]
    return index, rows


def training_args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments of :func:`run` that the command line sets, by name."""
    return {
        "data_dir": args.data_dir,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "lr": args.lr,
        "emb_lr": args.emb_lr,
        "dtype": args.dtype,
    }


def train_seconds(result: dict[str, Any]) -> float:
    """Seconds of training (no loading, no tests) over the epochs after the first, whose time
    also holds one-time warm-ups (torch's, the first run's); over the only one if there is
    one."""
    epochs = result["epochs"][1:] or result["epochs"]
    return sum(e["train_seconds"] for e in epochs)


def budget_run(args: argparse.Namespace, reference: dict[str, Any]) -> int:
    """The same training again with a memory budget that holds the index of every key plus
    ``--budget-share`` (20 %) of the rows' bytes (so most rows live on disk, in a temporary
    store); one line: its AUC, which must equal the in-memory run's, its time, and how much went
    through the disk."""
    share = args.budget_share
    budget = max(1, reference["index_bytes"] + int(reference["row_bytes"] * share))
    with tempfile.TemporaryDirectory(prefix="embstore-demo-") as tmp, warnings.catch_warnings():
        # A batch here touches more rows than the budget holds: the session says so (a
        # RuntimeWarning), and the line below says what it cost.
        warnings.filterwarnings("ignore", "embstore session", RuntimeWarning)
        tiered = run(
            **training_args(args),
            quiet=True,
            store_dir=pathlib.Path(tmp) / "store",
            memory_budget_bytes=budget,
            session=True,
        )
    same = abs(tiered["test_auc"] - reference["test_auc"]) <= 1e-6
    print(
        f"with a memory budget for {share:.0%} of the rows ({budget / 1024:.0f} KiB incl. the "
        f"index; "
        f"{tiered['rows_on_disk']:,} of {tiered['rows']:,} rows on disk at the end, "
        f"{tiered['cold_reads']:,} rows read back, at most "
        f"{tiered['peak_memory_bytes'] / 1024:.0f} KiB held: a batch's rows are pinned while "
        f"it trains and while it is read ahead): AUC {tiered['test_auc']:.4f} "
        f"({'same as in memory' if same else 'DIFFERS from memory'}); training "
        f"{train_seconds(tiered):.2f}s vs {train_seconds(reference):.2f}s in memory "
        f"({train_seconds(reference) / train_seconds(tiered):.0%} of the in-memory throughput)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
