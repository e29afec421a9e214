"""A distributed store's files: its manifest (what makes a directory one), the partitions of
its checkpoints (a consistent cut: every process writes its partition at the same batch
boundary, process 0 the manifest last), and restoring onto the same or another process
count."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from embstore.checkpoints import Checkpoint
from embstore.distributed.comm import Comm
from embstore.distributed.placement import owner_of, part_dir
from embstore.errors import InvalidArgumentError, NotFoundError, UnsupportedFormatError

#: The file that makes a directory a distributed store (or a complete checkpoint of one).
MANIFEST = "embstore-distributed.json"
#: Process 0's pickled ``state`` argument of a checkpoint (epoch, step, the dense model...).
STATE_FILE = "training-state.pkl"
#: Written first into a checkpoint directory, before any partition: a directory holding it and
#: no :data:`MANIFEST` is a checkpoint whose writing was interrupted (replaced when the job
#: writes that checkpoint again). Removed once the manifest is written.
BEGUN = "embstore-checkpoint-begun.json"
_FORMAT = 1


def read_manifest(path: pathlib.Path) -> dict[str, Any] | None:
    file = path / MANIFEST
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise UnsupportedFormatError(f"{file} is not a distributed store's manifest: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("world_size"), int):
        raise UnsupportedFormatError(f"{file} is not a distributed store's manifest")
    if manifest.get("format", 0) > _FORMAT:
        raise UnsupportedFormatError(
            f"{file} was written by a newer embstore (format {manifest['format']})"
        )
    return manifest


def write_manifest(path: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Atomically: a temporary file, fsync, rename, fsync of the directory."""
    tmp = path / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": _FORMAT, **manifest}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_part(comm: Comm, path: pathlib.Path) -> pathlib.Path:
    """Check (or create) the manifest of a distributed store at ``path`` for this job's process
    count, on every process alike; return this process's partition directory."""
    what = f"opening the distributed store {path}"

    def create() -> None:
        if comm.rank != 0:
            return
        path.mkdir(parents=True, exist_ok=True)
        if read_manifest(path) is None:
            if any((path / n).exists() for n in ("MANIFEST", "LOCK", "seg")):
                raise InvalidArgumentError(
                    f"{path} holds a store that is not a distributed one (or lost its "
                    f"{MANIFEST}); give a new directory"
                )
            write_manifest(path, {"world_size": comm.world})

    def check() -> None:
        manifest = read_manifest(path)
        if manifest is None:
            raise NotFoundError(f"{path / MANIFEST} is missing (not a shared directory?)")
        if manifest["world_size"] != comm.world:
            raise InvalidArgumentError(
                f"the distributed store at {path} was written by {manifest['world_size']} "
                f"processes and this job has {comm.world}: each process owns a hash partition "
                "of the rows, so a store opens only with the process count that wrote it. "
                "Checkpoint it and DistributedStore.restore(checkpoint, new_path) "
                "with the new count"
            )

    comm.agreed(what, create)
    comm.agreed(what, check)
    return part_dir(path, comm.rank)


def latest_checkpoint(directory: str | os.PathLike[str]) -> pathlib.Path | None:
    """The newest *complete* checkpoint of a distributed store under ``directory`` (the one
    with the highest ``step`` in its manifest, then the newest), or ``None``. A checkpoint whose
    writing was interrupted has no manifest and is skipped (and kept)."""
    root = pathlib.Path(directory)
    if not root.is_dir():
        return None
    best: tuple[int, float, pathlib.Path] | None = None
    for child in root.iterdir():
        try:
            manifest = read_manifest(child) if child.is_dir() else None
        except UnsupportedFormatError:
            continue
        if manifest is None or "checkpoint" not in manifest:
            continue
        key = (int(manifest["checkpoint"].get("step", -1)), (child / MANIFEST).stat().st_mtime)
        if best is None or key > best[:2]:
            best = (*key, child)
    return None if best is None else best[2]


def training_state(checkpoint: str | os.PathLike[str]) -> Any:
    """The ``state`` a distributed checkpoint was written with (``None`` if none)."""
    path = pathlib.Path(checkpoint)
    manifest = read_manifest(path)
    if manifest is None or "checkpoint" not in manifest:
        raise NotFoundError(f"{path} is not a complete distributed checkpoint (no {MANIFEST})")
    if not manifest["checkpoint"].get("has_state"):
        return None
    with open(path / STATE_FILE, "rb") as f:
        return pickle.load(f)  # a file this job wrote


def checkpoint(
    comm: Comm,
    path: pathlib.Path,
    step: int | None,
    state: Any,
    *,
    write_part: Callable[[pathlib.Path], Checkpoint],
    specs: Callable[[], dict[str, Any]],
) -> Any:
    """Every process writes its partition into ``path/rank-<r>`` (``write_part``: the store's
    checkpoint of its own rows into that directory), process 0 its ``state``, then process 0
    writes the manifest (``specs``: the tables' configs; complete only once every partition
    is)."""

    what = f"checkpoint {path}"

    def make_dir() -> None:
        if comm.rank == 0:
            prepare_checkpoint_dir(path, comm.world, step)

    def write_mine() -> Any:
        result = write_part(part_dir(path, comm.rank))
        if comm.rank == 0 and state is not None:
            with open(path / STATE_FILE, "wb") as f:
                pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
        return result

    comm.agreed(what, make_dir)
    result = comm.agreed(what, write_mine)
    parts = comm.all_gather(
        {k: v for k, v in vars(result).items() if isinstance(v, int | str | float)}, what
    )

    def complete() -> None:
        if comm.rank == 0:
            write_manifest(
                path,
                {
                    "world_size": comm.world,
                    "checkpoint": {
                        "step": -1 if step is None else int(step),
                        "has_state": state is not None,
                        "tables": specs(),
                        "parts": parts,
                    },
                },
            )
            # Complete: the marker has done its work (a crash before this leaves both, and
            # the manifest is what counts).
            (path / BEGUN).unlink(missing_ok=True)

    comm.agreed(what, complete)
    return Checkpoint(
        path=path,
        id=0,
        parent_id=0,
        tables=int(parts[0].get("tables", 0)),
        segments=sum(int(p.get("segments", 0)) for p in parts),
        bytes=sum(int(p.get("bytes", 0)) for p in parts),
    )


def prepare_checkpoint_dir(path: pathlib.Path, world: int, step: int | None) -> None:
    """Process 0, at the start of a distributed checkpoint: make ``path`` ready and write the
    :data:`BEGUN` marker into it before anything else. A new or empty directory is used as
    is; one that holds the marker and no manifest is a checkpoint of this store whose writing
    was interrupted (a process died during it) and is emptied first, so that a job restarted
    from an earlier checkpoint writes it again when it reaches that step. Anything else is
    refused, saying what the directory holds: a complete checkpoint, a checkpoint interrupted
    before markers were written (no manifest: it may be deleted), or other files."""
    path.mkdir(parents=True, exist_ok=True)
    entries = sorted(p.name for p in path.iterdir())
    if entries:
        manifest = None
        try:
            manifest = read_manifest(path)
        except UnsupportedFormatError:
            pass
        if manifest is not None and "checkpoint" in manifest:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds a complete checkpoint (step "
                f"{manifest['checkpoint'].get('step')}); give a new directory (a checkpoint is "
                "never overwritten)"
            )
        if MANIFEST in entries:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds a distributed store or a "
                f"checkpoint ({MANIFEST}); give a new directory"
            )
        if BEGUN in entries:
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif any(n.startswith("rank-") or n == STATE_FILE for n in entries):
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty: it holds an interrupted "
                f"checkpoint ({', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''} "
                f"and no {MANIFEST}, so it is incomplete and nothing restores from it) left "
                "by an embstore that did not mark checkpoints it began; it may be deleted. "
                "Delete it, or give another directory"
            )
        else:
            raise InvalidArgumentError(
                f"checkpoint directory {path} is not empty and holds no checkpoint "
                f"({', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''}); give a new "
                "or empty directory"
            )
    marker = path / BEGUN
    with open(marker, "w") as f:
        json.dump({"world_size": world, "step": -1 if step is None else int(step)}, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_part(
    comm: Comm,
    checkpoint: pathlib.Path,
    path: pathlib.Path,
    restore_one: Callable[[pathlib.Path, pathlib.Path], Any],
    create: Callable[[pathlib.Path], Any],
) -> None:
    """Make this process's partition of a store at ``path`` from a distributed ``checkpoint``:
    its own partition when the process count is unchanged, else the rows it owns out of every
    partition. ``restore_one(src, dst)`` restores a one-process checkpoint into a new store and
    returns it (opened); ``create(dst)`` opens an empty one."""
    what = f"restoring {checkpoint}"

    def prepare() -> dict[str, Any]:
        manifest = read_manifest(checkpoint)
        if manifest is None or "checkpoint" not in manifest:
            raise NotFoundError(
                f"{checkpoint} is not a complete distributed checkpoint (no {MANIFEST}: its "
                "writing may have been interrupted)"
            )
        if comm.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            if any(path.iterdir()):
                raise InvalidArgumentError(f"restore target {path} is not empty")
            write_manifest(path, {"world_size": comm.world})
        return manifest

    manifest = comm.agreed(what, prepare)
    old_world = manifest["world_size"]
    target = part_dir(path, comm.rank)

    def restore() -> None:
        if old_world == comm.world:
            restore_one(part_dir(checkpoint, comm.rank), target).close()
        else:
            repartition(comm, checkpoint, old_world, target, manifest, restore_one, create)

    comm.agreed(what, restore)


def repartition(
    comm: Comm,
    checkpoint: pathlib.Path,
    old_world: int,
    target: pathlib.Path,
    manifest: dict[str, Any],
    restore_one: Callable[[pathlib.Path, pathlib.Path], Any],
    create: Callable[[pathlib.Path], Any],
) -> None:
    from embstore.config import from_native_spec

    store = create(target)
    try:
        specs = manifest["checkpoint"]["tables"]
        tables = {name: store.create_table(from_native_spec(spec)) for name, spec in specs.items()}
        steps: dict[str, int] = {}
        scratch = pathlib.Path(tempfile.mkdtemp(prefix=".repartition-", dir=target.parent))
        try:
            for p in range(old_world):
                src = restore_one(part_dir(checkpoint, p), scratch / f"part-{p}")
                try:
                    for name, table in tables.items():
                        old = src.table(name)
                        steps[name] = max(steps.get(name, 0), old.step)
                        for chunk in old.export(chunk_rows=1 << 16):
                            mine = owner_of(chunk.ids.view(np.uint64), comm.world) == comm.rank
                            if mine.any():
                                table.import_(
                                    *(f[mine] for f in chunk[:7]), optimizer=chunk.optimizer
                                )
                finally:
                    src.close()
                shutil.rmtree(scratch / f"part-{p}")  # a copy of the checkpoint's partition
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for name, table in tables.items():
            table.step = steps.get(name, 0)
        store.flush()
    finally:
        store.close()
