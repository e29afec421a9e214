"""Features that meet under ``torchrun`` (2 processes, gloo on loopback): a GradScaler's
``unscale_`` before its step over a distributed store, a collection over a distributed store's
tables with DDP, a GradScaler and an lr scheduler, a distributed checkpoint of a bf16 table
restored whole in one process, and a rank-0-only checkpoint beside another process's session.
The job is ``dist_review.py`` beside this file."""

from __future__ import annotations

import re

from test_distributed import torchrun


def results(mode: str, tmp_path, **kw) -> tuple[int, str, dict[int, list[str]]]:
    code, out, _ = torchrun(2, "dist_review.py", mode, "--work", str(tmp_path), **kw)
    lines: dict[int, list[str]] = {0: [], 1: []}
    for m in re.finditer(r"RESULT rank=(\d) (.*)", out):
        lines[int(m[1])].append(m[2])
    return code, out, lines


def test_unscale_before_the_step_backs_off_on_every_process(tmp_path):
    # scaler.unscale_(sparse_opt) (to clip) before scaler.step: process 1 overflowed, process
    # 0 did not. Both skip, and both scalers back off: their scales stay equal.
    code, out, _ = results("unscale_first", tmp_path)
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        # Lines of two processes may run together: look for each process's own prefix.
        assert f"RESULT rank={rank} unchanged=True scale={2.0**15}" in out, (rank, out[-3000:])


def test_a_collection_over_distributed_tables_trains_with_ddp_a_scaler_and_a_scheduler(
    tmp_path,
):
    code, out, _ = results("ebc_ddp_amp", tmp_path)
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        # Three steps of both tables (one bf16), no overflow, the lr halved thrice and
        # restored from the optimizer's state_dict.
        want = f"RESULT rank={rank} steps=[3, 3] scale=1024.0 lr=0.00625"
        assert want in out, (rank, out[-3000:])


def test_a_bf16_distributed_checkpoint_restores_whole_in_one_process(tmp_path):
    code, out, _ = results("restore_bf16", tmp_path)
    assert code == 0, out[-4000:]
    assert "RESULT rank=0 same=True dtype=bf16 step=3" in out, out[-3000:]


def test_a_rank0_only_checkpoint_beside_a_session_names_where_the_other_waits(tmp_path):
    # Process 0 checkpoints alone while process 1 prepares a session's batch (on the other
    # process group): they are not caught at once (a limit, docs/training.md), but at the
    # timeout each names where the other waits rather than only "probably died".
    code, out, r = results("ckpt_vs_session_2", tmp_path, env={"EMBSTORE_DIST_TIMEOUT_S": "5"})
    assert code != 0
    err = {rank: next(x for x in r[rank] if "Error" in x) for rank in (0, 1)}
    assert "process 1 last waited in a session over ['t']" in err[0], (err, out[-3000:])
    assert "of its prep group" in err[0], err
    assert "process 0 last waited in checkpoint()" in err[1], (err, out[-3000:])
