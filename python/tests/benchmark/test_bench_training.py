"""The training benchmark's embstore side (``python/benchmarks/training/embstore_trainer.py``)
runs under torchrun on a tiny workload and writes the record the runner reads. (The TorchRec
peer needs its own virtualenv, ``make torchrec-deps``: not part of the tests.)"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[3]
TRAINER = ROOT / "python" / "benchmarks" / "training" / "embstore_trainer.py"
sys.path.insert(0, str(TRAINER.parent))
import synth_ctr  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_embstore_trainer_writes_its_record(tmp_path):
    r = _trainer(tmp_path, "r", "--memory-budget-share", "0.2", rows=20000, batches=8)
    assert r["peer"] == "embstore" and r["processes"] == 2
    assert r["examples_per_s"] > 0 and 0.4 < r["auc"] < 1.0
    assert r["rows_stored_by_the_run"] > 0 and r["memory_budget_bytes"] > 0
    assert r["bytes_sent_per_batch"] > 0 and set(r["stages"]["busy_s"]) >= {"gather", "train"}


def test_ranks_of_inverts_field_ids():
    ranks = np.array([0, 1, 7, 2**27 + 3, 2**40, 2**59 - 1], np.int64)
    for field in (0, 5, 25):
        ids = synth_ctr.field_ids(ranks, field)
        assert (synth_ctr.ranks_of(ids, field) == ranks).all()


def test_a_process_slice_of_a_global_batch_is_the_same_batch():
    w = synth_ctr.Workload.criteo(100_000, batch_size=64)
    whole = synth_ctr.batch(w, 3)
    halves = [next(synth_ctr.batches(w, 3, 4, rank=r, world=2)) for r in (0, 1)]
    for k in whole:
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), whole[k])


def _trainer(tmp_path, name: str, *extra: str, rows: int = 60000, batches: int = 6) -> dict:
    """Run the trainer on 2 processes (a tiny workload); its JSON record."""
    out = tmp_path / f"{name}.json"
    cmd = [
        str(pathlib.Path(sys.executable).with_name("torchrun")),
        "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_port()),
        str(TRAINER),
        "--total-rows", str(rows), "--batches", str(batches), "--warmup", "2",
        "--eval-batches", "1", "--batch-size", "512", "--json", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBSTORE_DIST_TIMEOUT_S": "60"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_filled_store_under_a_budget_trains_like_one_in_memory(tmp_path):
    """``--fill`` stores every row first (most of them on disk at a 10 % budget); rows'
    initial values depend only on their ids, so training computes the same as in memory (the
    evaluation differs: ids it never trained read their initial rows from the filled store,
    zeros from the other)."""
    mem = _trainer(tmp_path, "mem")
    big = _trainer(tmp_path, "big", "--fill", "--memory-budget-share", "0.1")
    assert big["rows"] == synth_ctr.Workload.criteo(60000).total_rows, big["rows"]
    assert big["rows_on_disk"] > big["rows"] // 2
    assert big["timed_cold_reads_per_batch"] > 0 and big["fill"]["rows_created"] > 0
    assert len(mem["train_losses"]) == 6 and big["train_losses"] == mem["train_losses"]
    stale = _trainer(tmp_path, "stale", "--staleness", "1")
    assert stale["staleness"] == 1 and stale["train_losses"][0] == mem["train_losses"][0]
    assert stale["train_losses"] != mem["train_losses"]


def test_the_staleness_benchmark_pairs_its_runs(tmp_path):
    out = tmp_path / "s.json"
    script = TRAINER.parent / "bench_training_more.py"
    cmd = [
        sys.executable,
        str(script),
        "staleness",
        "--quick",
        "--processes",
        "1",
        "--json",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBSTORE_DIST_TIMEOUT_S": "60"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert {run["staleness"] for run in r["runs"]} == {0, 1}
    assert r["summary"]["1"]["ratio"] > 0 and "paired 1/0" in done.stdout
