"""Argument normalisers shared by every module that hands arrays to native code: ids to
contiguous ``uint64[B]`` (:func:`as_ids`), rows to ``float32[B, D]`` (:func:`as_rows`), a
caller's ``out`` buffer checked (:func:`check_out`), metadata arrays (:func:`uint_array`) and
results back on the ids' torch device (:func:`on_device`).

Invariants: what leaves here is C-contiguous and aligned, so native code reads it without a
copy; a bad argument raises :class:`DTypeError` / :class:`ShapeError` /
:class:`InvalidArgumentError` before anything is read or written; torch is never imported here
(a tensor is recognised only when torch is already loaded).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from embstore.errors import DTypeError, InvalidArgumentError, ShapeError

if TYPE_CHECKING:
    from embstore.table import Table


def torch_tensor(x: Any) -> Any:
    """``x`` if it is a torch tensor (without importing torch), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x
    return None


def as_ids(ids: Any) -> tuple[np.ndarray, Any]:
    """Normalise ``ids`` to a contiguous ``uint64[B]`` array; also return the torch device of
    tensor input (None for anything else)."""
    device = None
    if type(ids) is np.ndarray:
        arr = ids
        if arr.dtype.kind == "O" and arr.ndim == 1:
            arr = python_ints(arr.tolist(), arr)
    elif (t := torch_tensor(ids)) is not None:
        device = t.device
        if t.dtype.is_floating_point or t.dtype.is_complex:  # bfloat16 has no numpy dtype
            raise DTypeError(f"ids must be 1-D int64, got {t.dim()}-D {str(t.dtype)[6:]}")
        arr = torch_numpy(t)  # a bool tensor is refused by the dtype check below
    else:
        arr = np.asarray(ids)
        if arr.size == 0 and arr.dtype.kind == "f":  # [] is float64 to numpy
            arr = arr.astype(np.int64)
        elif arr.dtype.kind in "fO" and arr.ndim == 1:
            arr = python_ints(ids, arr)
    if arr.dtype != np.int64 and arr.dtype != np.uint64:
        if arr.dtype.kind not in "iu":
            raise DTypeError(f"ids must be 1-D int64, got {arr.ndim}-D {arr.dtype}")
        arr = arr.astype(np.int64)
    if arr.ndim != 1:
        raise ShapeError(f"ids must be 1-D int64, got {arr.ndim}-D {arr.dtype}")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.require(arr, requirements=("C", "A"))  # a strided or misaligned view: copy
    return arr.view(np.uint64), device


def python_ints(seq: Any, arr: np.ndarray) -> np.ndarray:
    """A sequence of Python ints that numpy could not type (it mixes ids below 2**63 with ids
    at or above it) as ``uint64``; anything else comes back unchanged for the dtype check."""
    items = list(seq)
    if not all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in items):
        return arr
    if any(not -(2**63) <= int(x) < 2**64 for x in items):
        raise InvalidArgumentError("ids must fit in 64 bits (-2**63 <= id < 2**64)")
    return np.fromiter((int(x) & (2**64 - 1) for x in items), dtype=np.uint64, count=len(items))


def torch_numpy(t: Any) -> np.ndarray:
    """A CPU tensor's data as numpy (no copy when contiguous); other devices are copied."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().numpy()


def as_rows(x: Any, n: int, table: Table, what: str) -> np.ndarray:
    """Normalise ``x`` to a C-contiguous ``float32[n, D]`` array."""
    if (t := torch_tensor(x)) is not None:
        if not t.dtype.is_floating_point:
            raise DTypeError(f"{what} must be float32, got {str(t.dtype)[6:]}")
        # float16/bfloat16 (AMP) become float32 here: numpy has no bfloat16.
        x = torch_numpy(t.float())  # .float() is a no-op for float32
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        if arr.dtype.kind != "f" and not (arr.size == 0 and arr.dtype.kind in "iuf"):
            raise DTypeError(f"{what} must be float32, got {arr.dtype}")
        arr = arr.astype(np.float32)
    if arr.ndim == 1 and arr.size == 0 and n == 0:
        arr = arr.reshape(0, table.embedding_dim)
    if arr.ndim != 2:
        raise ShapeError(f"{what} must be 2-D [B, D], got {arr.ndim}-D shape {list(arr.shape)}")
    if arr.shape[1] != table.embedding_dim:
        raise ShapeError(
            f"embedding_dim mismatch for table '{table.name}': "
            f"expected {table.embedding_dim}, got {arr.shape[1]}"
        )
    if arr.shape[0] != n:
        raise ShapeError(f"{what} has {arr.shape[0]} rows for {n} ids")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.require(arr, requirements=("C", "A"))
    return arr


def check_out(out: Any, ids: np.ndarray, dim: int) -> None:
    """``out`` must be a writable, aligned, C-contiguous ``float32[B, D]`` numpy array that
    shares no memory with the ids: anything else would be written wrongly, or not at all."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        kind = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise DTypeError(f"out must be a float32 numpy array, got {kind}")
    if out.shape != (len(ids), dim):
        raise ShapeError(
            f"out must be [{len(ids)}, {dim}] for {len(ids)} ids, got {list(out.shape)}"
        )
    if not (out.flags.c_contiguous and out.flags.aligned):
        raise ShapeError("out must be a C-contiguous, aligned float32 [B, D] array")
    if not out.flags.writeable:
        raise InvalidArgumentError("out is read-only")
    if np.may_share_memory(out, ids):
        raise InvalidArgumentError("out shares memory with the ids")


def uint_array(x: Any, dtype: Any, what: str, n: int) -> np.ndarray:
    """``x`` as a contiguous ``dtype[n]`` array of non-negative integers that fit ``dtype``."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise DTypeError(f"{what} must be integers, got {arr.dtype}")
    if arr.shape != (n,):
        raise ShapeError(f"{what} must be [{n}], got {list(arr.shape)}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, got {arr.min()}")
    if arr.size and int(arr.max()) > np.iinfo(dtype).max:
        raise InvalidArgumentError(f"{what} must be at most {np.iinfo(dtype).max}, got {arr.max()}")
    return np.ascontiguousarray(arr, dtype=dtype)


def on_device(arr: np.ndarray, device: Any) -> Any:
    """``arr`` as a torch tensor on ``device`` when the ids were a tensor, else as is."""
    if device is None:
        return arr
    torch = sys.modules["torch"]
    t = torch.from_numpy(arr)
    return t if device.type == "cpu" else t.to(device)


def describe(x: Any) -> str:
    """``x``'s dtype and rank for an error message (``1-D float32``) when it is a torch
    tensor, else its type's name."""
    torch = sys.modules.get("torch")  # x cannot be a tensor of a torch not imported
    if torch is not None and isinstance(x, torch.Tensor):
        return f"{x.dim()}-D {str(x.dtype).removeprefix('torch.')}"
    return type(x).__name__
