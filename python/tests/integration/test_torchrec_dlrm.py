"""The TorchRec DLRM example (``examples/torchrec_dlrm.py``) trains on embstore with only the
collection and sparse optimizer lines changed, to TorchRec's AUC on the same batches; and the
collection modules train over a distributed store as one process over the global batch.

The embstore side always runs (with TorchRec missing, on ``embstore.torch.KeyedJaggedTensor``);
the TorchRec side runs where its virtualenv exists (``make torchrec-deps``: ``.venv-torchrec`` in
the repository root, or ``EMBSTORE_TORCHREC_PYTHON``), else that test is skipped."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from test_distributed import torchrun

import embstore

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLE = ROOT / "examples" / "torchrec_dlrm.py"
# Small enough for < 60 s on two busy cores; enough batches for the AUC to settle.
ARGS = ["--total-rows", "20000", "--batches", "300", "--batch-size", "256", "--eval-batches", "40"]
AUC_TOLERANCE = 0.005


def torchrec_python() -> pathlib.Path | None:
    given = os.environ.get("EMBSTORE_TORCHREC_PYTHON")
    candidates = [pathlib.Path(given)] if given else []
    candidates.append(ROOT / ".venv-torchrec/bin/python")
    return next((c for c in candidates if c.exists()), None)


def run_example(python: str | pathlib.Path, backend: str, timeout: float = 300) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [str(python), str(EXAMPLE), "--backend", backend, *ARGS, "--json", "-"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.fixture(scope="module")
def embstore_run() -> dict:
    return run_example(sys.executable, "embstore")


def test_the_example_trains_on_embstore(embstore_run):
    out = embstore_run
    assert out["backend"] == "embstore" and out["processes"] == 1
    assert out["auc"] > 0.7, out  # the hidden model is learnt (0.5: nothing learnt)
    assert out["step_ms_median"] > 0


def test_embstore_reaches_torchrecs_auc_on_the_same_batches(embstore_run):
    python = torchrec_python()
    if python is None:
        pytest.skip("no TorchRec virtualenv (.venv-torchrec: make torchrec-deps)")
    theirs = run_example(python, "torchrec")
    assert theirs["backend"] == "torchrec"
    assert theirs["eval_examples"] == embstore_run["eval_examples"]
    gap = abs(embstore_run["auc"] - theirs["auc"])
    assert gap <= AUC_TOLERANCE, (embstore_run["auc"], theirs["auc"])


def test_the_example_diff_is_the_collection_and_optimizer_lines():
    """The two backends share the model, the batches and the loop: the script has exactly two
    backend-specific blocks, marked, and the loop calls no backend-specific name."""
    text = EXAMPLE.read_text()
    assert text.count("# [backend]") == 2
    loop = text[text.index("model.train()") :]
    for name in ("embstore", "torchrec", "et.", "DistributedModelParallel"):
        assert name not in loop.split("out = {")[0], name


def test_a_collection_over_a_distributed_store_trains_as_one_process(tmp_path):
    """Two processes, each on half of every global batch (its loss the mean over its half),
    end with the rows of one process over the whole batches: the lookups reach every
    partition, gradients go to the rows' owners and are averaged over the processes (as DDP
    averages the dense ones). Before, the two processes' gradients were summed."""
    import dist_collection as job

    code, out, _ = torchrun(2, "dist_collection.py", str(tmp_path))
    assert code == 0, out[-6000:]
    ref_store = embstore.Store()
    ref_eval = job.train(ref_store, 0, 1)
    parts = [np.load(tmp_path / f"rank-{r}.npz") for r in range(2)]
    for name in job.TABLES:
        ids = np.concatenate([p[f"{name}_ids"] for p in parts])
        values = np.concatenate([p[f"{name}_values"] for p in parts])
        order = np.argsort(ids)
        ref = list(ref_store[name].export())
        ref_ids = np.concatenate([c.ids for c in ref])
        ref_values = np.concatenate([c.values for c in ref])
        ref_order = np.argsort(ref_ids)
        np.testing.assert_array_equal(ids[order], ref_ids[ref_order])
        np.testing.assert_allclose(values[order], ref_values[ref_order], rtol=1e-5, atol=1e-6)
        assert {int(p[f"{name}_step"]) for p in parts} == {ref_store[name].step} == {job.STEPS}
    # Evaluation (eval mode: one gather of every table's rows): each process's slice.
    evaluated = np.concatenate([p["eval"] for p in parts])
    np.testing.assert_allclose(evaluated, ref_eval, rtol=1e-5, atol=1e-6)
