"""What :meth:`Store.checkpoint` returns: a checkpoint's path and what it holds (a value, below
the stores that write checkpoints, one process's or a distributed job's)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint written by :meth:`Store.checkpoint`; usable wherever a path is
    (``os.fspath(ckpt)``)."""

    path: pathlib.Path
    id: int
    parent_id: int
    tables: int
    segments: int
    bytes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", pathlib.Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)
