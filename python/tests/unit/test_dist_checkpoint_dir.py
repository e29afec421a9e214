"""The directory of a distributed checkpoint (one process, ``Comm.single()``): a marker is
written before anything else; a directory holding the marker and no manifest is an interrupted
checkpoint, replaced when the job writes that checkpoint again; anything else that is not empty
is refused with an error that says what it holds."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import embstore
from embstore import InvalidArgumentError
from embstore import distributed as edist
from embstore.distributed.files import checkpoint as dist_checkpoint


@pytest.fixture
def store(tmp_path):
    s = embstore.Store(tmp_path / "store")
    t = s.create_table("t", 4, optimizer=embstore.SGD(lr=0.5), seed=1)
    t.lookup(np.arange(100))
    yield s
    s.close()


def _checkpoint(store, path: pathlib.Path, step: int = 6):
    return dist_checkpoint(
        edist.Comm.single(),
        path,
        step,
        {"batch": step},
        write_part=lambda part: store.checkpoint(part),
        specs=lambda: {n: store.table(n).native().config() for n in store.tables()},
    )


def test_the_marker_is_written_first_and_removed_once_the_checkpoint_is_complete(
    store, tmp_path, monkeypatch
):
    ckpt = tmp_path / "ckpt" / "batch-00006"

    def dies(path, since=None):  # the partition is being written when the process dies
        assert (ckpt / edist.BEGUN).exists(), "the marker comes before any partition"
        pathlib.Path(path).mkdir()
        (pathlib.Path(path) / "MANIFEST").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "checkpoint", dies)
    with pytest.raises(KeyboardInterrupt):
        _checkpoint(store, ckpt)
    monkeypatch.undo()
    assert (ckpt / edist.BEGUN).exists() and not (ckpt / edist.MANIFEST).exists()
    assert embstore.latest_checkpoint(tmp_path / "ckpt") is None

    # The job reaches the step again: the interrupted checkpoint is replaced.
    _checkpoint(store, ckpt)
    assert (ckpt / edist.MANIFEST).exists() and not (ckpt / edist.BEGUN).exists()
    assert embstore.latest_checkpoint(tmp_path / "ckpt") == ckpt
    assert embstore.training_state(ckpt) == {"batch": 6}
    assert embstore.verify(ckpt / "rank-00000")["damage"] == []
    restored = embstore.Store.restore(ckpt / "rank-00000", tmp_path / "restored")
    assert len(restored["t"]) == 100
    restored.close()


def test_an_interrupted_checkpoint_with_partial_files_is_replaced(store, tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "rank-00000" / "seg").mkdir(parents=True)
    (ckpt / "rank-00000" / "seg" / "0000000000000001.seg").write_bytes(b"\0" * 100)
    (ckpt / "rank-00001").mkdir()
    (ckpt / edist.STATE_FILE).write_bytes(b"torn")
    (ckpt / (edist.MANIFEST + ".tmp")).write_text("{")
    (ckpt / edist.BEGUN).write_text("")  # even a marker cut short counts
    _checkpoint(store, ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        edist.MANIFEST,
        "rank-00000",
        edist.STATE_FILE,
    ]
    assert embstore.training_state(ckpt) == {"batch": 6}


def test_a_complete_checkpoint_is_never_overwritten(store, tmp_path):
    ckpt = tmp_path / "ckpt"
    _checkpoint(store, ckpt, step=4)
    with pytest.raises(InvalidArgumentError, match=r"holds a complete checkpoint \(step 4\)"):
        _checkpoint(store, ckpt, step=4)
    assert embstore.training_state(ckpt) == {"batch": 4}


def test_a_directory_without_the_marker_is_refused_saying_what_it_holds(store, tmp_path):
    # A checkpoint interrupted before markers were written: no manifest, partitions.
    old = tmp_path / "old"
    (old / "rank-00000").mkdir(parents=True)
    (old / "rank-00001").mkdir()
    with pytest.raises(InvalidArgumentError) as e:
        _checkpoint(store, old)
    msg = str(e.value)
    assert "interrupted checkpoint" in msg and "may be deleted" in msg, msg
    assert (old / "rank-00000").exists(), "nothing is deleted"

    # Other files: not a checkpoint at all.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError) as e:
        _checkpoint(store, other)
    msg = str(e.value)
    assert "holds no checkpoint" in msg and "notes.txt" in msg, msg
    assert "may be deleted" not in msg
    assert (other / "notes.txt").read_text() == "mine"
