"""Training across processes, launched by ``torchrun`` on loopback (gloo): 1, 2 and 4
processes train alike; pipelined equals sequential under a tiny memory budget; a process killed
mid-training is restarted by torchrun's elastic mode and the run ends as if nothing happened;
a checkpoint restores onto another process count; and every fault or bad input stops every
process with a clear error, quickly, losing nothing from the checkpoint.

The jobs are ``dist_train.py`` and ``dist_faults.py`` beside this file."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import embstore
from embstore import distributed as edist

HERE = pathlib.Path(__file__).resolve().parent
TORCHRUN = pathlib.Path(sys.executable).with_name("torchrun")
TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    nproc: int,
    script: str,
    *args: str,
    restarts: int = 0,
    timeout: float = TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> tuple[int, str, float]:
    """Run ``script`` under torchrun on loopback; return (exit code, output, seconds). The job
    is killed (its process group) if it runs past ``timeout``. ``env``: more variables."""
    cmd = [
        str(TORCHRUN),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(restarts),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(HERE / script) if "/" not in script else script,
        *args,
    ]
    env = {**os.environ, "EMBSTORE_DIST_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun {script} {args} ran past {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out, time.monotonic() - start


def train(nproc: int, work: pathlib.Path, out: pathlib.Path, *args: str, **kw) -> str:
    code, text, _ = torchrun(
        nproc, "dist_train.py", "--work", str(work), "--out", str(out), *args, **kw
    )
    assert code == 0, text[-6000:]
    return text


def rows(run_dir: pathlib.Path) -> dict[str, tuple[np.ndarray, ...]]:
    """Every process's rows of every table, merged and sorted by id."""
    parts: dict[str, list[tuple[np.ndarray, ...]]] = {}
    steps: dict[str, set[int]] = {}
    for f in sorted(run_dir.glob("rank-*.npz")):
        z = np.load(f)
        for t in ("user", "item", "tag"):
            parts.setdefault(t, []).append((z[f"{t}_ids"], z[f"{t}_values"], z[f"{t}_state"]))
            steps.setdefault(t, set()).add(int(z[f"{t}_step"]))
    merged = {}
    for t, ps in parts.items():
        ids = np.concatenate([p[0] for p in ps])
        order = np.argsort(ids)
        assert len(steps[t]) == 1, f"processes disagree on {t}'s step: {steps[t]}"
        merged[t] = (
            ids[order],
            np.concatenate([p[1] for p in ps])[order],
            np.concatenate([p[2] for p in ps])[order],
            steps[t].pop(),
        )
    return merged


def assert_same_rows(a, b, *, exact: bool) -> None:
    for t in a:
        np.testing.assert_array_equal(a[t][0], b[t][0], err_msg=f"{t}: ids differ")
        assert a[t][3] == b[t][3], f"{t}: steps differ"
        for k in (1, 2):
            if exact:
                np.testing.assert_array_equal(a[t][k], b[t][k], err_msg=t)
            else:
                np.testing.assert_allclose(a[t][k], b[t][k], rtol=1e-4, atol=1e-6, err_msg=t)


def heads(run_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "head.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """The five runs of dist_train.py at 1, 2 and 4 processes."""
    root = tmp_path_factory.mktemp("dist")
    for n in (1, 2, 4):
        train(n, root / f"w{n}", root / f"o{n}")
    return root


@pytest.mark.parametrize("n", [2, 4])
def test_more_processes_train_like_one(runs, n):
    # The exact model's gradient sums are exact: bit-identical at every process count.
    assert_same_rows(rows(runs / "o1" / "exact"), rows(runs / f"o{n}" / "exact"), exact=True)
    # The MLP's: the same within float-summation tolerance, sparse rows and dense weights.
    one, many = rows(runs / "o1" / "mlp-seq"), rows(runs / f"o{n}" / "mlp-seq")
    assert_same_rows(one, many, exact=False)
    h1, hn = heads(runs / "o1" / "mlp-seq"), heads(runs / f"o{n}" / "mlp-seq")
    for k in h1:
        torch.testing.assert_close(h1[k], hn[k], rtol=1e-4, atol=1e-6)
    # A process count changes nothing structurally: every id trained somewhere, once.
    assert len(one["item"][0]) > 500


@pytest.mark.parametrize("n", [2, 4])
def test_staleness_one_trains_alike_on_every_process_count(runs, n):
    # Batch t+1 read before batch t is applied, in the same order everywhere: bit-identical
    # (gradients of +-1, 2, 3: exact sums) at every process count, under a tiny budget; the
    # gradients depend on the rows read, so staleness 0 ends elsewhere.
    one = rows(runs / "o1" / "sign-stale")
    assert_same_rows(one, rows(runs / f"o{n}" / "sign-stale"), exact=True)
    assert_same_rows(rows(runs / "o1" / "sign"), rows(runs / f"o{n}" / "sign"), exact=True)
    fresh = rows(runs / f"o{n}" / "sign")
    assert not np.array_equal(one["user"][1], fresh["user"][1])


def assert_same_model(a: pathlib.Path, b: pathlib.Path) -> None:
    """Two runs' rows and dense heads, bit for bit."""
    assert_same_rows(rows(a), rows(b), exact=True)
    h1, h2 = heads(a), heads(b)
    assert all(torch.equal(h1[k], h2[k]) for k in h1)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_pipelined_under_a_tiny_budget_equals_sequential_in_memory(runs, n):
    assert_same_model(runs / f"o{n}" / "mlp-seq", runs / f"o{n}" / "mlp-pipe-budget")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_default_lookahead_trains_bit_for_bit_like_sequential(runs, n):
    # prefetch=None under a budget that holds several batches' pins: batches prepared a group
    # at a time, their cold rows read together, every process grouping the same batches.
    look = runs / f"o{n}" / "mlp-lookahead"
    assert_same_model(runs / f"o{n}" / "mlp-seq", look)
    stats = [json.loads(f.read_text()) for f in sorted(look.glob("lookahead-*.json"))]
    assert len(stats) == n
    for s in stats:
        assert s["bounded_by"] in ("budget", "max"), s
        assert s["max_batches"] >= 3, s
        assert s["batches_read"] == 12 and s["reads"] < s["batches_read"], s


def test_a_killed_process_is_restarted_from_the_checkpoint_and_ends_the_same(tmp_path):
    ckpt_args = ("--runs", "mlp-seq", "--checkpoint-every", "4")
    plain = train(2, tmp_path / "wu", tmp_path / "ou", *ckpt_args)
    assert "resumed" not in plain
    text = train(
        2,
        tmp_path / "wk",
        tmp_path / "ok",
        *ckpt_args,
        "--kill-at",
        "6",
        "--resume",
        restarts=1,
    )
    assert "killing myself (SIGKILL) after batch 6" in text
    assert "rank 0: resumed from batch-00004 at batch 4" in text
    assert "rank 1: resumed from batch-00004 at batch 4" in text
    assert_same_model(tmp_path / "ok" / "mlp-seq", tmp_path / "ou" / "mlp-seq")
    # The killed attempt's store is kept (it may hold rows newer than the checkpoint).
    assert (tmp_path / "wk" / "mlp-seq" / "store" / edist.MANIFEST).exists()


def test_a_checkpoint_interrupted_by_a_dead_process_is_replaced_when_the_job_resumes(tmp_path):
    # docs/training.md's restart recipe: torchrun --max-restarts restarts the job, which resumes
    # from the newest complete checkpoint and so reaches the interrupted one's step again.
    ckpt_args = ("--runs", "exact", "--checkpoint-every", "2")
    train(2, tmp_path / "wu", tmp_path / "ou", *ckpt_args)
    text = train(
        2,
        tmp_path / "wk",
        tmp_path / "ok",
        *ckpt_args,
        "--kill-in-checkpoint",
        "6",
        "--resume",
        restarts=1,
    )
    assert "rank 1: killing myself (SIGKILL) in the checkpoint at batch 6" in text
    assert "rank 0: resumed from batch-00004 at batch 4" in text, text[-4000:]
    assert "rank 1: resumed from batch-00004 at batch 4" in text, text[-4000:]
    ckpts = tmp_path / "wk" / "exact" / "ckpt"
    # Written again, complete, and it restores.
    assert embstore.latest_checkpoint(ckpts) == ckpts / "batch-00012"
    again = ckpts / "batch-00006"
    assert (again / edist.MANIFEST).exists() and not (again / edist.BEGUN).exists()
    assert embstore.training_state(again) == {"batch": 6}
    for rank in (0, 1):
        assert embstore.verify(again / f"rank-{rank:05d}")["damage"] == []
    assert_same_rows(rows(tmp_path / "ok" / "exact"), rows(tmp_path / "ou" / "exact"), exact=True)


@pytest.mark.parametrize("new_count", [1, 4])
def test_a_checkpoint_restores_onto_another_process_count(runs, tmp_path, new_count):
    # 2 processes train 6 batches and checkpoint; `new_count` processes go on from there.
    train(2, tmp_path / "w2", tmp_path / "o2", "--runs", "exact", "--checkpoint-every", "6")
    ckpt = embstore.latest_checkpoint(tmp_path / "w2" / "exact" / "ckpt")
    assert ckpt is not None and ckpt.name == "batch-00012"
    first = tmp_path / "w2" / "exact" / "ckpt" / "batch-00006"
    text = train(
        new_count,
        tmp_path / "wn",
        tmp_path / "on",
        "--runs",
        "exact",
        "--restore",
        str(first),
    )
    assert "resumed from batch-00006 at batch 6" in text
    # Exact sums: the same rows, bit for bit, as the uninterrupted 1-process run.
    assert_same_rows(rows(runs / "o1" / "exact"), rows(tmp_path / "on" / "exact"), exact=True)


def faults(mode: str, tmp_path: pathlib.Path, *extra: str) -> dict[int, str]:
    code, out, _ = torchrun(2, "dist_faults.py", mode, "--work", str(tmp_path), *extra)
    # Two processes share the output: their lines may run into each other.
    results = {
        int(m[1]): m[2] for m in re.finditer(r"RESULT rank=(\d+) (.*?)(?=RESULT rank=|\n|$)", out)
    }
    assert sorted(results) == [0, 1], out[-4000:]
    assert code != 0
    # No process waited for a peer until the timeout: each test checks that the others name
    # the failed process and its error, which only the agreement (not a timeout) reports. No
    # bound on the seconds: a loaded machine must not fail the test.
    assert "lost its peers" not in out, out[-4000:]
    return results


def test_ids_of_the_wrong_dtype_on_one_process_stop_every_process(tmp_path):
    r = faults("dtype", tmp_path)
    assert r[1].startswith("DTypeError: ids must be 1-D int64")
    assert r[0].startswith("DistributedError: preparing a batch failed on process 1: DTypeError")


def test_tables_configured_differently_are_refused_on_every_process(tmp_path):
    r = faults("config", tmp_path)
    for rank in (0, 1):
        assert r[rank].startswith("InvalidArgumentError: table 't' is configured differently")
        assert "embedding_dim" in r[rank]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> tuple[dict[tuple[int, str], str], str]:
    """One 2-process job (dist_faults.py sessions): process 1 opens a session differently in
    each field in turn; then both open one alike and train. Returns {(rank, field): result}
    and the job's output."""
    work = tmp_path_factory.mktemp("sessions")
    code, out, _ = torchrun(2, "dist_faults.py", "sessions", "--work", str(work))
    assert code == 0, out[-4000:]
    found = re.finditer(
        r"SESSION rank=(\d+) field=(\w+) (.*?)(?=SESSION rank=|RESULT rank=|\n|$)", out
    )
    return {(int(m[1]), m[2]): m[3] for m in found}, out


@pytest.mark.parametrize(
    "field, there, here",
    [
        ("tables", "['u', 't']", "['t', 'u']"),
        ("grad_average", "False", "True"),
        ("staleness", "1", "0"),
        ("on_miss", "'zeros'", "'init'"),
    ],
)
def test_sessions_opened_differently_are_refused_on_every_process(sessions, field, there, here):
    results, out = sessions
    values = {0: here, 1: there}
    for rank in (0, 1):
        got = results.get((rank, field), "")
        assert got.startswith("InvalidArgumentError: store.session() was opened with "), out[-4000:]
        # The field and both values, each with its process.
        other = 1 - rank
        assert f"{field}={values[other]} on process {other}" in got, got
        assert f"{field}={values[rank]} on process {rank}" in got, got
    # Refused alike on every process: the job stayed in step and trained a session after.
    for rank in (0, 1):
        assert f"SESSION rank={rank} trained 3 batches" in out, out[-4000:]


def test_a_changed_process_count_without_a_restore_is_refused(tmp_path):
    (tmp_path / "s").mkdir()
    edist.write_manifest(tmp_path / "s", {"world_size": 4})
    r = faults("world", tmp_path)
    for rank in (0, 1):
        assert "written by 4 processes and this job has 2" in r[rank], r


def test_loaders_of_different_lengths_stop_every_process(tmp_path):
    r = faults("batches", tmp_path)
    for rank in (0, 1):
        assert "loaders ended at different batches" in r[rank]
        assert "process(es) [1] ran out after 5 batches" in r[rank]


def test_nan_gradients_on_one_process_apply_nothing_anywhere(tmp_path):
    code, out, _ = torchrun(2, "dist_faults.py", "nan", "--work", str(tmp_path))
    assert code != 0
    assert "rank=0 unchanged=True" in out and "rank=1 unchanged=True" in out, out[-3000:]
    assert "RESULT rank=1 NonFiniteError" in out
    assert "RESULT rank=0 DistributedError: pushing a batch's gradients failed on process 1" in out


def test_ddp_over_a_store_of_one_process_is_refused_on_every_process(tmp_path):
    r = faults("ddp_local", tmp_path)
    for rank in (0, 1):
        assert r[rank].startswith("DistributedError: a training forward pass of table 't'"), r
        assert "one of 2" in r[rank] and "DistributedStore(path)" in r[rank]


def test_a_job_that_leaves_without_tearing_down_has_its_groups_torn_down_at_exit(tmp_path):
    """A script that trains and returns, as most do, without destroy_process_group(): embstore
    tears down the groups it made (here also the default group, which it initialised) while
    the interpreter is whole; left to finalisation, gloo aborted one run in six (SIGABRT)."""
    code, out, _ = torchrun(2, "dist_faults.py", "exit", "--work", str(tmp_path))
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        assert f"RESULT rank={rank} ok" in out, out[-4000:]
        assert f"EXIT rank={rank} initialized=False" in out, out[-4000:]


def test_grad_scaler_overflow_on_one_process_skips_the_step_on_every_process(tmp_path):
    code, out, _ = torchrun(2, "dist_faults.py", "amp", "--work", str(tmp_path))
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        assert f"AMP rank={rank} session_unchanged=True" in out, out[-4000:]
        # Both scalers backed off, also process 0's, whose own gradients were finite.
        assert f"AMP rank={rank} session_scale=32768.0" in out, out[-4000:]
        # Three batches, one skipped: t stepped twice; u only by process 0's last loss.
        assert f"AMP rank={rank} steps t=2 u=1" in out, out[-4000:]
        assert f"AMP rank={rank} modules_unchanged=True scale=32768.0" in out, out[-4000:]


def test_processes_in_different_calls_are_told_which_within_seconds(tmp_path):
    r = faults("out_of_step", tmp_path)
    for rank in (0, 1):
        assert r[rank].startswith("DistributedError: the processes are out of step"), r
    assert "process 0 is in lookup('t')" in r[0] and "process 1 in checkpoint()" in r[0], r
    assert "process 1 is in checkpoint()" in r[1] and "process 0 in lookup('t')" in r[1], r
    assert "Evaluating on one process" in r[0]


def test_one_process_evaluates_alone_from_a_checkpoint_restored_whole(tmp_path):
    code, out, _ = torchrun(2, "dist_faults.py", "eval_one", "--work", str(tmp_path))
    assert code == 0, out[-4000:]
    m = re.search(r"EVAL rank=0 same=(\w+) rows=(\d+)", out)
    assert m and m[1] == "True", out[-4000:]
    local = [int(x) for x in re.findall(r"EVAL rank=\d local_rows=(\d+)", out)]
    assert len(local) == 2 and int(m[2]) == sum(local), out[-4000:]


def _check_checkpoint(ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Each partition of the checkpoint restores, passes verification and holds rows."""
    for rank in (0, 1):
        assert embstore.verify(ckpt / f"rank-{rank:05d}")["damage"] == []
        part = embstore.Store.restore(ckpt / f"rank-{rank:05d}", tmp_path / f"check-{rank}")
        assert len(part["t"]) > 100
        part.close()


def test_a_corrupt_segment_stops_the_job_naming_the_process_and_file(tmp_path, small_disk):
    # The checkpoint is on another file system (a copy, not hard links of the live segments,
    # which a failing disk would damage alike); the job damages process 1's live segments.
    ckpt = small_disk / "ckpt"
    r = faults("corrupt", tmp_path / "w", "--ckpt", str(ckpt))
    assert r[1].startswith("CorruptionError: ") and "rank-00001/seg/" in r[1], r
    assert "fails its checksum" in r[1]
    assert r[0].startswith("DistributedError: ") and "failed on process 1: CorruptionError" in r[0]
    assert embstore.latest_checkpoint(ckpt) == ckpt / "b20"
    _check_checkpoint(ckpt / "b20", tmp_path)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, another file system (root only; CI runs as root), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_stops_the_job_naming_the_process_and_file(tmp_path, small_disk):
    # Process 1's partition lives on the small disk (a partition directory may be a link).
    (tmp_path / "w" / "s").mkdir(parents=True)
    (small_disk / "p1").mkdir()
    (tmp_path / "w" / "s" / "rank-00001").symlink_to(small_disk / "p1")
    ckpt = tmp_path / "ckpt"
    r = faults("full", tmp_path / "w", "--ckpt", str(ckpt))
    assert r[1].startswith("NoSpaceError: ") and "rank-00001/seg/" in r[1], r
    assert "failed on process 1: NoSpaceError" in r[0]
    assert embstore.latest_checkpoint(ckpt) == ckpt / "b20"
    _check_checkpoint(ckpt / "b20", tmp_path)


@pytest.mark.data
def test_the_distributed_demo_trains_like_one_process(data_dir):
    """`torchrun --nproc-per-node 2 examples/movielens_ctr.py --distributed
    --memory-budget-share 0.2`: the documented second command of the demo."""
    demo = HERE.parents[2] / "examples" / "movielens_ctr.py"
    args = ("--distributed", "--memory-budget-share", "0.2", "--epochs", "1")
    args += ("--data-dir", str(data_dir), "--quiet")
    code, out, _ = torchrun(2, str(demo), *args)
    assert code == 0, out[-4000:]
    two = float(re.search(r"test AUC (0\.\d+) vs", out)[1])
    assert re.search(r"memory budget \d+ KiB per process: [\d,]+ rows on disk", out), out[-2000:]
    code, out1, _ = torchrun(1, str(demo), *args)
    assert code == 0, out1[-4000:]
    one = float(re.search(r"test AUC (0\.\d+) vs", out1)[1])
    assert abs(one - two) < 2e-4, (one, two)
    assert one > 0.76


def _ps_reference(total_workers: int, clocks: int) -> dict[str, np.ndarray]:
    """The parameter-server job's tables when one process runs every worker."""
    sys.path.insert(0, str(HERE))
    import dist_ps

    store = embstore.Store()
    dist_ps.make_tables(store)
    ps = store.ps(["L", "R"], workers=total_workers, specialise="no-opt")
    ps.run(dist_ps.iteration(total_workers), clocks=clocks)
    return {n: store[n].lookup(np.arange(k)) for n, k in dist_ps.KEYS.items()}


@pytest.mark.parametrize(
    ("specialise", "gather"), [("all", "virtual"), ("all", "first"), ("no-opt", "virtual")]
)
def test_a_parameter_server_across_processes_computes_what_one_process_does(
    tmp_path, specialise, gather
):
    out = tmp_path / "out"
    out.mkdir()
    code, log, _ = torchrun(
        2,
        "dist_ps.py",
        str(tmp_path / "store"),
        str(out),
        "--workers",
        "2",
        "--specialise",
        specialise,
        "--gather",
        gather,
    )
    assert code == 0, log[-4000:]
    want = _ps_reference(4, 5)
    got = {n: {} for n in want}
    for r in range(2):
        part = json.loads((out / f"rank-{r}.json").read_text())
        assert part["stray"] == 0, f"rank {r} kept rows placement had moved to it: {part}"
        assert "processes=2" in part["repr"]
        for n, rows in part["rows"].items():
            got[n].update({int(k): v for k, v in rows.items()})
        if specialise == "all" and gather == "virtual":
            assert part["stats"]["fetches"] == 0, part["stats"]
        assert part["plan"]["rows"] > 0
    for n, rows in want.items():
        assert sorted(got[n]) == list(range(len(rows)))
        mine = np.array([got[n][k] for k in range(len(rows))], np.float32)
        np.testing.assert_array_equal(mine, rows)
