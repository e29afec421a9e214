"""The embstore modules' table calls as ``torch.library`` custom operators, so that
``torch.compile`` (also ``fullgraph=True``) traces a model with embstore modules without a
graph break: each call is one opaque operator with a fake kernel giving the output's shape.

- ``embstore::pull(anchor, ids, handle, dim, track)``: the rows of ``ids`` (flat ``int64``)
  from the table of the module ``handle``, ``float32[N, dim]``; with ``track`` (a training
  forward pass with autograd) the rows of a tiered table are pinned until
  ``EmbeddingOptimizer.zero_grad()``. Its backward is ``embstore::stash``.
- ``embstore::stash(grad, ids, handle)``: keeps the rows' gradient on the module for
  ``EmbeddingOptimizer.step()``; returns the (empty) gradient of ``anchor``, a tensor of the
  module that requires grad, so the stash is an output of the backward graph and never
  dropped as dead code.
- ``embstore::check_offsets(offsets, n, include_last_offset)``: ``EmbeddingBag``'s checks of
  its offsets (data-dependent, so in an operator of their own), a CPU ``int64`` copy.

No ``from __future__ import annotations`` here: ``torch.library`` reads the schema from the
annotations.
"""

import itertools
import weakref
from typing import Any

import numpy as np
import torch

from embstore._arrays import as_ids
from embstore.errors import InvalidArgumentError, ShapeError

# The modules the operators serve, by handle (an int is what an operator can take).
_MODULES: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def register(module: Any) -> int:
    """A handle for ``module`` (kept weakly)."""
    handle = next(_HANDLES)
    _MODULES[handle] = module
    return handle


def _module(handle: int) -> Any:
    module = _MODULES.get(handle)
    if module is None:
        raise RuntimeError(f"embstore: the module of handle {handle} is gone")
    return module


def _flat_ids(ids: torch.Tensor) -> np.ndarray:
    return np.asarray(as_ids(ids)[0])


@torch.library.custom_op("embstore::pull", mutates_args=())
def pull(
    anchor: torch.Tensor, ids: torch.Tensor, handle: int, dim: int, track: bool
) -> torch.Tensor:
    return _module(handle).pull_rows(_flat_ids(ids), track)


@pull.register_fake
def _pull_fake(
    anchor: torch.Tensor, ids: torch.Tensor, handle: int, dim: int, track: bool
) -> torch.Tensor:
    return ids.new_empty((ids.shape[0], dim), dtype=torch.float32)


@torch.library.custom_op("embstore::stash", mutates_args=())
def stash(grad: torch.Tensor, ids: torch.Tensor, handle: int) -> torch.Tensor:
    _module(handle).accumulate_grad(_flat_ids(ids), grad)
    return grad.new_zeros(0)


@stash.register_fake
def _stash_fake(grad: torch.Tensor, ids: torch.Tensor, handle: int) -> torch.Tensor:
    return grad.new_empty(0)


def _pull_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.handle = inputs[2]
    ctx.save_for_backward(inputs[1])


def _pull_backward(ctx: Any, grad: torch.Tensor) -> Any:
    (ids,) = ctx.saved_tensors
    anchor_grad = torch.ops.embstore.stash(grad, ids, ctx.handle)
    return anchor_grad, None, None, None, None


torch.library.register_autograd("embstore::pull", _pull_backward, setup_context=_pull_setup)


def check_offset_values(offsets: torch.Tensor, n: int, include_last_offset: bool) -> torch.Tensor:
    """The data-dependent half of :func:`_check_offsets` (``embstore::check_offsets``): a
    CPU int64 copy of ``offsets``, or the error."""
    off = offsets.to(device="cpu", dtype=torch.int64, copy=True)
    arr = off.numpy()  # numpy: the checks below cost ~5 us, not ~20 us in torch ops
    if len(arr) == 0:
        if include_last_offset:
            raise ShapeError("offsets must have B + 1 >= 1 entries with include_last_offset=True")
        if n:
            raise InvalidArgumentError(f"offsets is empty (no bag) but input has {n} ids")
        return off
    if arr[0] != 0:
        raise InvalidArgumentError(f"offsets[0] must be 0, got {int(arr[0])}")
    if len(arr) > 1 and (dec := arr[1:] < arr[:-1]).any():
        i = int(dec.argmax()) + 1
        raise InvalidArgumentError(
            f"offsets must be non-decreasing, got offsets[{i}] = {int(arr[i])} "
            f"after offsets[{i - 1}] = {int(arr[i - 1])}"
        )
    last = int(arr[-1])
    if include_last_offset and last != n:
        raise InvalidArgumentError(
            f"offsets[-1] must be the input's length {n} with include_last_offset=True, got {last}"
        )
    if last > n:
        raise InvalidArgumentError(
            f"offsets[-1] must be at most the input's length {n}, got {last}"
        )
    return off


@torch.library.custom_op("embstore::check_offsets", mutates_args=())
def check_offsets(offsets: torch.Tensor, n: int, include_last_offset: bool) -> torch.Tensor:
    return check_offset_values(offsets, n, include_last_offset)


@check_offsets.register_fake
def _check_offsets_fake(offsets: torch.Tensor, n: int, include_last_offset: bool) -> torch.Tensor:
    return offsets.new_empty(offsets.shape, dtype=torch.int64, device="cpu")
