"""``torch.distributed.checkpoint`` over a distributed store: a model (embstore modules over
Adam and row-wise Adagrad tables, a DDP'd dense head) and a session's table (Adagrad) trained
by 2 processes under torchrun, saved with ``dcp.save`` through
:class:`embstore.torch.checkpoint.StoreState`, load onto 1 process (no torch.distributed) and
onto 4 with every row, its optimizer state and version, each table's step and the dense head
as saved, each row on the process that owns it; and ``model.state_dict()`` under torchrun
names that recipe. The job is ``dist_dcp.py`` beside this file."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from test_distributed import TIMEOUT_S, torchrun

from embstore import distributed as edist

HERE = pathlib.Path(__file__).resolve().parent
TABLES = ("user", "item", "tag")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[pathlib.Path, str]:
    work = tmp_path_factory.mktemp("dcp")
    code, out, _ = torchrun(2, "dist_dcp.py", "train", "--work", str(work))
    assert code == 0, out[-6000:]
    return work, out


def rows(run_dir: pathlib.Path) -> dict[str, dict[str, np.ndarray]]:
    """Every process's rows of every table, merged and sorted by id (each table's step: the
    highest any process has), and process 0's dense head."""
    files = sorted(run_dir.glob("rank-*.npz"))
    assert files, f"no rows written in {run_dir}"
    merged: dict[str, dict[str, np.ndarray]] = {}
    for t in TABLES:
        parts = [np.load(f) for f in files]
        ids = np.concatenate([z[f"{t}_ids"] for z in parts])
        order = np.argsort(ids)
        merged[t] = {
            k: np.concatenate([z[f"{t}_{k}"] for z in parts])[order]
            for k in ("ids", "values", "state", "versions")
        }
        merged[t]["step"] = np.array(max(int(z[f"{t}_step"]) for z in parts))
    head = np.load(files[0])
    merged["head"] = {k: head[k] for k in head.files if k.startswith("head_")}
    return merged


def assert_loaded_as_saved(work: pathlib.Path, loaded_dir: pathlib.Path, world: int) -> None:
    saved = rows(work / "saved")
    loaded = rows(loaded_dir)
    for t in TABLES:
        assert len(saved[t]["ids"]) > 100, f"{t}: too few rows trained to test anything"
        for k in ("ids", "values", "state", "versions", "step"):
            np.testing.assert_array_equal(loaded[t][k], saved[t][k], err_msg=f"{t}: {k}")
    assert saved["user"]["step"] > 0 and np.abs(saved["item"]["state"]).sum() > 0
    for k, v in saved["head"].items():
        np.testing.assert_array_equal(loaded["head"][k], v, err_msg=k)
    # Each row sits on the process that owns it in the loading job.
    for f in sorted(loaded_dir.glob("rank-*.npz")):
        rank = int(f.stem.split("-")[1])
        z = np.load(f)
        for t in TABLES:
            owners = edist.owner_of(z[f"{t}_ids"].view(np.uint64), world)
            assert (owners == rank).all(), f"{t}: process {rank} holds rows it does not own"
            assert int(z[f"{t}_step"]) == int(saved[t]["step"]), f"{t}: step on {rank}"


def test_state_dict_under_torchrun_names_the_distributed_recipe(saved):
    _, out = saved
    assert "STATE_DICT_OK" not in out
    # Two processes share the output: their lines may run into each other.
    errors = re.findall(r"rank (\d+): STATE_DICT_ERROR (.*?)(?=rank \d+: |\n|$)", out)
    assert sorted(int(r) for r, _ in errors) == [0, 1], out[-4000:]
    for _, line in errors:
        assert "StoreState" in line and "torch.distributed.checkpoint" in line, line
        assert "store.checkpoint" in line, line


def test_a_two_process_dcp_checkpoint_loads_onto_one_process(saved):
    work, _ = saved
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, str(HERE / "dist_dcp.py"), "load", "--plain", "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "LOADED" in proc.stdout
    assert_loaded_as_saved(work, work / "loaded-plain", 1)


def test_a_two_process_dcp_checkpoint_loads_onto_four_processes(saved):
    work, _ = saved
    code, out, _ = torchrun(4, "dist_dcp.py", "load", "--work", str(work))
    assert code == 0, out[-6000:]
    assert out.count("LOADED") == 4, out[-4000:]
    assert_loaded_as_saved(work, work / "loaded-4", 4)
