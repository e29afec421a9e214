"""The training modules: :class:`Embedding` and :class:`EmbeddingBag` over embstore tables.

:class:`Embedding` and :class:`EmbeddingBag` take the arguments ``nn.Embedding`` and
``nn.EmbeddingBag`` take (``input``, ``offsets``, ``per_sample_weights``, ``mode``), but their
rows live in an embstore :class:`~embstore.Table` — keyed by raw int64 feature ids, as many as
memory holds — and are trained by the table's own optimizer, not by ``torch.optim``.

Training and eval mode. In training mode a lookup stores the rows of new ids — also under
``torch.no_grad()``: the mode decides, not autograd, so a no-grad forward in training mode
(e.g. a validation pass without ``model.eval()``) fills the table with rows that nothing
trains. Their values are what a later training lookup would store anyway (an initial row is a
function of the table's seed and the id), but they take memory and count as inserts; call
``model.eval()`` (unknown ids give zeros, nothing is stored) or pass ``on_miss="zeros"``. This
is kept rather than tying storing to autograd: a training forward that stored nothing under
no-grad would need a second table call for the initial values of its misses, and with
admission (``admission_min_count``) the lookups that count towards admitting an id would
depend on autograd state.

dtypes. Rows are float32 in the table. The output has the module's dtype: float32, or what
``model.half()``, ``.double()``, ``.to(torch.bfloat16)`` or ``dtype=`` made it, as for
``nn.Embedding``'s weight; the gradients handed to the table are float32.

Checkpoints. ``state_dict()`` carries each module's table under ``<module>._extra_state``:
every row with its optimizer state and metadata, and the table's step counter (Adam's ``t``),
**copied** into CPU tensors — a state dict takes as much memory as the table's rows,
``(D + S) * 4 + 40`` bytes a row (``S`` optimizer state floats). ``load_state_dict`` into a
model over a fresh table (same ``embedding_dim`` and optimizer; checked, with
:class:`~embstore.ShapeError` / :class:`~embstore.InvalidArgumentError`) restores them and
removes rows the checkpoint does not hold. A table used by two modules is copied once per
module, and loading restores it once per module with the same rows; pass
``rows_in_state_dict=False`` to all modules of the table but one — or to all of them, for a
table too big to copy, and save it with :meth:`~embstore.Table.save` instead. Checkpoints
from before embstore modules had extra state load with ``strict=False``. A table of a
distributed store is not carried by ``state_dict()`` (each process holds part of its rows: it
raises, naming the recipe): checkpoint it with ``torch.distributed.checkpoint`` and
:class:`embstore.torch.StoreState`, which also loads onto another process count.

Copies. ``copy.deepcopy(module)``, ``copy.copy`` and ``pickle`` (also ``torch.save(model)``)
raise :class:`~embstore.NotCopyableError`, a ``TypeError``: a copy could only share the table
with the original — a "best model" snapshot that keeps training. Copy ``model.state_dict()``
instead (``copy.deepcopy(model.state_dict())`` works), or save the table.

Not supported: ``padding_idx``, ``max_norm`` (so ``norm_type``), ``scale_grad_by_freq``,
``_weight``, ``_freeze`` and ``num_embeddings`` — the modules accept these ``nn.Embedding``
arguments with their default values only, and raise :class:`~embstore.InvalidArgumentError`
naming the argument otherwise. ``sparse`` may be either: the gradient of the pulled rows is
always handed to the table, which plays ``sparse=True``.

Shape letters: ``B`` bags (or the input's shape for :class:`Embedding`), ``N`` ids, ``D``
``embedding_dim``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embstore import _native
from embstore._arrays import as_ids, describe
from embstore.config import Optimizer, kind_of
from embstore.distributed.comm import check_not_process_local
from embstore.distributed.table import DistributedTable
from embstore.errors import (
    DTypeError,
    InvalidArgumentError,
    NotCopyableError,
    ShapeError,
)
from embstore.pins import Pins
from embstore.table import Table
from embstore.torch import _ops

# Version of the dict get_extra_state returns.
_STATE_FORMAT = 1


def _state_fields(d: int, s: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The row arrays of an extra state, in ``ExportChunk`` order: shape (``n`` rows) and the
    numpy dtype ``Table.import_`` takes."""
    return {
        "ids": ((0,), np.int64),
        "values": ((0, d), np.float32),
        "state": ((0, s), np.float32),
        "versions": ((0,), np.uint64),
        "replicas": ((0,), np.uint32),
        "update_counts": ((0,), np.uint64),
        "last_update_ms": ((0,), np.uint64),
    }


def _optimizer(table: Table) -> Optimizer:
    """The table's optimizer (``SGD(lr=...)``, ...); ``kind_of`` names it (``"adam"``)."""
    return table.config.optimizer


# Backward passes a module keeps before it warns that EmbeddingOptimizer.zero_grad() is not
# called (the pending gradients would grow without bound).
_PENDING_WARN = 256


class _Pull(torch.autograd.Function):
    """Eager ``embstore::pull``: the rows of ``ids``; backward stashes their gradient on the
    module."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, module: StoreModule, ids: np.ndarray, track: bool
    ) -> Any:
        ctx.module, ctx.ids = module, ids
        return module.pull_rows(ids, track)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.module.accumulate_grad(ctx.ids, grad)
        return None, None, None, None


class StoreModule(nn.Module):
    """What :class:`Embedding`, :class:`EmbeddingBag` and a collection's per-table modules
    share: the table, the lookup of a forward pass and the gradients kept for
    :class:`~embstore.torch.EmbeddingOptimizer` (``isinstance(m, StoreModule)`` finds the
    modules it steps)."""

    def __init__(
        self,
        table: Table,
        on_miss: str | None,
        rows_in_state_dict: bool,
        nn_args: dict[str, Any],
    ):
        super().__init__()
        if not isinstance(table, Table | DistributedTable):
            raise InvalidArgumentError(
                f"table must be an embstore.Table or DistributedTable, got {type(table)}"
            )
        if on_miss is not None and on_miss not in _native.ON_MISS:  # defined once, in Rust
            raise InvalidArgumentError(
                f"on_miss must be None or one of {_native.ON_MISS}, got {on_miss!r}"
            )
        dtype, device = _check_nn_args(type(self).__name__, table, nn_args)
        self.table = table
        self.on_miss = on_miss
        self.rows_in_state_dict = bool(rows_in_state_dict)
        self.embedding_dim = table.embedding_dim
        self._pending: list[tuple[np.ndarray, torch.Tensor]] = []
        # One per pending gradient: a storage-less tensor of its shape whose .grad is that
        # gradient (the same tensor), so torch.amp.GradScaler finds, checks and unscales the
        # pending gradients through EmbeddingOptimizer.param_groups as it does a model's.
        self._holders: list[torch.Tensor] = []
        self._pins = Pins()  # the rows of the forward passes since the last drop_grads()
        self._warned = False
        # What the operators know this module by, and the tensor that requires grad so a
        # training forward pass records embstore::pull for backward (a plain attribute: not a
        # parameter, not in the state dict; its gradient is empty).
        self._handle = _ops.register(self)
        self._anchor = torch.empty(0, requires_grad=True)
        # The output's dtype: rows are float32 in the table, but model.half() / .double() /
        # .to(torch.bfloat16) convert this empty buffer, and the output follows it.
        # Not persistent: a state dict does not depend on it.
        self.register_buffer(
            "_out_like", torch.empty(0, dtype=dtype, device=device), persistent=False
        )

    def _cast(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (float32) in the module's dtype; autograd hands float32 gradients back."""
        dtype = self._out_like.dtype
        return out if out.dtype == dtype else out.to(dtype)

    def lookup_mode(self) -> str:
        """The ``on_miss`` of a lookup now: the module's ``on_miss`` when given, else
        ``"init"`` in training mode and ``"zeros"`` in eval mode."""
        if self.on_miss is not None:
            return self.on_miss
        return "init" if self.training else "zeros"

    def _pull(self, ids: torch.Tensor) -> torch.Tensor:
        """``float32[N, D]`` rows of the flat ids, on the ids' device, wired for backward
        (the ``embstore::pull`` operator: one opaque call for ``torch.compile``)."""
        # A copy: the gradient must go to these ids even if the caller reuses the input
        # tensor's memory before backward or step().
        track = torch.is_grad_enabled() and self.training
        anchor = self._anchor if track else self._anchor.detach()
        if torch.compiler.is_compiling():
            flat = ids.reshape(-1).to(device="cpu", copy=True)
            rows = torch.ops.embstore.pull(anchor, flat, self._handle, self.embedding_dim, track)
        else:  # the same calls, ~100 us a step faster than through the dispatcher
            arr = np.array(as_ids(ids.reshape(-1))[0], copy=True)
            rows = _Pull.apply(anchor, self, arr, track)
        return rows if ids.device.type == "cpu" else rows.to(ids.device)

    def pull_rows(self, arr: np.ndarray, track: bool) -> torch.Tensor:
        """The rows of ``arr`` (``uint64[N]``) as ``float32[N, D]``, looked up with
        :meth:`lookup_mode` (what the ``embstore::pull`` operator returns). ``track``: a
        training forward pass with autograd, whose ids a tiered table keeps pinned until
        ``EmbeddingOptimizer.zero_grad()``; a table of this process alone in a multi-process
        job refuses it."""
        if track:
            check_not_process_local(self.table, "a training forward pass")
        if track:
            # The step's working set stays in memory until EmbeddingOptimizer.zero_grad()
            # (pinned before the lookup brings it in, so no eviction in between drops it).
            # Where the pins of the store's tables would pass 60 % of its memory budget the
            # rows go unpinned: an eviction may then drop some before the step, which reads
            # them back (same values, more disk reads), and the store keeps to its budget.
            self._pins.take(self.table, arr)
        return torch.from_numpy(self.table.lookup(arr, self.lookup_mode()))

    def accumulate_grad(self, ids: np.ndarray, grad: torch.Tensor) -> None:
        """Keep ``grad`` (``[N, D]``, as float32 on the CPU) for the rows of ``ids``
        (``uint64[N]``) until :class:`~embstore.torch.EmbeddingOptimizer` applies it (what a
        backward pass does); warns when many are kept and no ``zero_grad()`` drops them."""
        grad = grad.detach().to(device="cpu", dtype=torch.float32).contiguous()
        holder = torch.empty((), dtype=torch.float32).expand(grad.shape)
        holder.grad = grad
        self._pending.append((ids, grad))
        self._holders.append(holder)
        if len(self._pending) > _PENDING_WARN and not self._warned:
            self._warned = True
            warnings.warn(
                f"{len(self._pending)} backward passes of table '{self.table.name}' are kept; "
                "is EmbeddingOptimizer.zero_grad() called after step()?",
                RuntimeWarning,
                stacklevel=2,
            )

    def pending_grads(self) -> list[tuple[np.ndarray, torch.Tensor]]:
        """The gradients kept since the last :meth:`drop_grads`: ``(ids, grad)`` per backward
        pass, ``uint64[N]`` and ``float32[N, D]``."""
        return list(self._pending)

    def grad_holders(self) -> list[torch.Tensor]:
        """One storage-less tensor per pending gradient whose ``.grad`` is that gradient:
        what ``EmbeddingOptimizer.param_groups`` show ``torch.amp.GradScaler``."""
        return list(self._holders)

    def drop_grads(self) -> None:
        """Drop the pending gradients and release the rows the forward passes pinned (what
        ``EmbeddingOptimizer.zero_grad()`` does to each of its modules)."""
        self._pending.clear()
        self._holders.clear()
        self._warned = False
        self._pins.release()

    def get_extra_state(self) -> dict[str, Any]:
        """The table's rows, for ``state_dict()``: every row with its optimizer state and
        metadata, and the table's step counter, copied into CPU tensors (``(D + S) * 4 + 40``
        bytes a row); with ``rows_in_state_dict=False`` only the table's name, dims and
        optimizer. Tensors, ints, strings and bools: ``torch.load(weights_only=True)``
        reads them."""
        table = self.table
        if self.rows_in_state_dict:
            _refuse_distributed(table, "model.state_dict()")
        step = table.step
        chunks = list(table.export()) if self.rows_in_state_dict else []
        d, s = table.embedding_dim, table.state_dim
        out: dict[str, Any] = {
            "format": _STATE_FORMAT,
            "table": table.name,
            "embedding_dim": d,
            "optimizer": kind_of(_optimizer(table)),
            "state_dim": s,
            "step": step,
            "rows": self.rows_in_state_dict,
        }
        if not self.rows_in_state_dict:
            return out
        # Field by field, dropping each field's chunks once joined: the peak is the rows once
        # plus one field, not twice the rows.
        fields: list[Any] = [list(f) for f in zip(*chunks, strict=True)] if chunks else []
        del chunks
        for i, (key, (shape, dtype)) in enumerate(_state_fields(d, s).items()):
            parts = fields[i] if fields else []
            arr = np.concatenate(parts) if parts else np.empty(shape, dtype)
            if fields:
                fields[i] = None
            # Unsigned as int64 (uint64: the same bits), which every torch version stores.
            if arr.dtype == np.uint64:
                arr = arr.view(np.int64)
            elif arr.dtype == np.uint32:
                arr = arr.astype(np.int64)
            out[key] = torch.from_numpy(np.ascontiguousarray(arr))
        return out

    def set_extra_state(self, state: Any) -> None:
        """Replace the table's rows with those of ``get_extra_state`` (``load_state_dict``).

        Everything is checked first (a table of another ``embedding_dim`` or optimizer state
        width raises :class:`~embstore.ShapeError`, of another optimizer with the same width
        :class:`~embstore.InvalidArgumentError`) and a refused state changes nothing; then
        the rows are imported with their optimizer state and metadata, rows the state does
        not hold are removed and the step counter is set. Admission counts are kept. Do not
        train the table while it loads."""
        table = self.table
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise InvalidArgumentError(
                f"the state for table '{table.name}' is not from an embstore.torch module "
                f"(format {_STATE_FORMAT})"
            )
        d, s = table.embedding_dim, table.state_dim
        if state.get("embedding_dim") != d:
            raise ShapeError(
                f"embedding_dim mismatch for table '{table.name}': "
                f"expected {d}, got {state.get('embedding_dim')!r}"
            )
        optimizer = kind_of(_optimizer(table))
        if state.get("state_dim") != s:
            raise ShapeError(
                f"optimizer state width mismatch for table '{table.name}': expected {s} "
                f"({optimizer}), got {state.get('state_dim')!r} ({state.get('optimizer')})"
            )
        if state.get("optimizer") != optimizer:
            raise InvalidArgumentError(
                f"optimizer mismatch for table '{table.name}': "
                f"expected {optimizer}, got {state.get('optimizer')!r}"
            )
        if state.get("rows") is False:  # saved with rows_in_state_dict=False
            return
        _refuse_distributed(table, "model.load_state_dict()")
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an int >= 0, got {step!r}")
        arrays = []
        n = None
        for key, (shape, dtype) in _state_fields(d, s).items():
            t = state.get(key)
            if not isinstance(t, torch.Tensor):
                raise InvalidArgumentError(
                    f"the state for table '{table.name}' has no tensor {key!r}"
                )
            if n is None:
                n = t.shape[0] if t.dim() else -1
            want = (n, *shape[1:])
            if tuple(t.shape) != want:
                raise ShapeError(
                    f"{key} for table '{table.name}' must be {list(want)}, got {list(t.shape)}"
                )
            floating = np.dtype(dtype).kind == "f"
            if t.dtype.is_floating_point != floating or t.dtype.is_complex or t.dtype == torch.bool:
                kind = "float" if floating else "integer"
                raise DTypeError(
                    f"{key} for table '{table.name}' must be {kind}, got {describe(t)}"
                )
            t = t.detach().cpu()
            arr = (t.float() if floating else t).contiguous().numpy()
            if dtype == np.uint64:  # stored as int64 with the same bits
                arr = arr.astype(np.int64, copy=False).view(np.uint64)
            arrays.append(arr.astype(dtype, copy=False))
        # Not clear() and import: import_ checks every row before it writes one (non-finite
        # values, versions from the future), so a refused state leaves the table as it was.
        # Rows the state does not hold are removed after it.
        stale = [c.ids[~np.isin(c.ids, arrays[0])] for c in table.export()] if len(table) else []
        if n:
            table.import_(*arrays)
        if stale:
            table.remove(np.concatenate(stale))
        table.step = step

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickle, copy.copy and copy.deepcopy all come here. A copy could only share the table
        # with this module — a "snapshot" that goes on training — so refuse, and say what works.
        raise NotCopyableError(
            f"embstore.torch.{type(self).__name__} over table '{self.table.name}' cannot be "
            "pickled or copied: its rows live in the table, not in the module. Save "
            "model.state_dict() (it carries the rows) or table.save(path), and load into a "
            "model over its own table"
        )

    def extra_repr(self) -> str:
        return f"table={self.table.name!r}, embedding_dim={self.embedding_dim}"


class Embedding(StoreModule):
    """``nn.Embedding`` over an embstore table.

    Args:
        table: the :class:`~embstore.Table` holding the rows.
        on_miss: for ids without a row; default ``None``: ``"init"`` (create the row) in
            training mode, ``"zeros"`` (store nothing) in eval mode.
        rows_in_state_dict: whether ``state_dict()`` carries the table's rows (see the
            module docs); ``False`` for a table saved on its own (:meth:`~embstore.Table.save`)
            or already carried by another module.
        **nn_args: ``nn.Embedding``'s other arguments, for ported code. ``dtype`` (the
            output's, default float32) and ``device`` are honoured, ``embedding_dim`` must be
            the table's, ``sparse`` may be either (the table always acts as ``sparse=True``);
            ``num_embeddings`` is a capacity hint (any positive int; it reserves nothing: the
            table makes rows as ids are first used); ``device="meta"`` makes a module not yet
            materialised (nothing is done to the table, as at any creation;
            ``model.to_empty(device=...)`` or ``.to(device)`` materialises it, and its
            forward needs real ids); ``padding_idx``, ``max_norm``, ``norm_type``,
            ``scale_grad_by_freq``, ``_weight`` and ``_freeze`` are accepted only with their
            defaults, and any other value raises :class:`~embstore.InvalidArgumentError`
            naming the argument.

    Shape:
        ``input``: int64 ``[*]`` of any shape (raw feature ids); output: ``[*, D]`` on the
        input's device, float32 or the module's dtype (``model.half()``, ``.double()`` and
        ``.to(torch.bfloat16)`` convert it, as they convert ``nn.Embedding``'s weight; the
        table keeps float32 rows and gets float32 gradients).

    Example::

        >>> import embstore, embstore.torch, torch
        >>> table = embstore.Store().create_table("item", embedding_dim=4)
        >>> emb = embstore.torch.Embedding(table)
        >>> emb(torch.tensor([[1, 2], [3, 1]])).shape
        torch.Size([2, 2, 4])
    """

    def __init__(
        self,
        table: Table,
        on_miss: str | None = None,
        *,
        rows_in_state_dict: bool = True,
        **nn_args: Any,
    ):
        super().__init__(table, on_miss, rows_in_state_dict, nn_args)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        check_input(input)
        rows = self._pull(input)
        return self._cast(rows.view(*input.shape, self.embedding_dim))


class EmbeddingBag(StoreModule):
    """``nn.EmbeddingBag`` over an embstore table: sums, means or maxes of bags of rows.

    Args:
        table: the :class:`~embstore.Table` holding the rows.
        mode: ``"sum"``, ``"mean"`` (default, as ``nn.EmbeddingBag``) or ``"max"``.
        include_last_offset: as ``nn.EmbeddingBag``: ``offsets`` has ``B + 1`` entries.
        on_miss: as for :class:`Embedding`.
        rows_in_state_dict: as for :class:`Embedding`.
        **nn_args: ``nn.EmbeddingBag``'s other arguments, as for :class:`Embedding`.

    Shape:
        ``input``: int64 ``[B, L]`` (fixed-length bags, ``offsets`` must be None) or ``[N]``
        with ``offsets`` int64 (or int32) ``[B]`` (bag ``b`` is
        ``input[offsets[b]:offsets[b + 1]]``): non-decreasing, from 0, at most ``N``; with
        ``include_last_offset``, ``[B + 1]`` ending at ``N``. ``per_sample_weights``: float
        ``[B, L]`` or ``[N]`` like ``input``, ``mode="sum"`` only. Output: ``[B, D]`` in the
        module's dtype (as for :class:`Embedding`); an empty bag gives zeros. Bad arguments
        raise :class:`~embstore.ShapeError`, :class:`~embstore.DTypeError` or
        :class:`~embstore.InvalidArgumentError` before any row is looked up: a rejected call
        stores nothing.

    Example::

        >>> import embstore, embstore.torch, torch
        >>> table = embstore.Store().create_table("genre", embedding_dim=4)
        >>> bag = embstore.torch.EmbeddingBag(table, mode="sum")
        >>> bag(torch.tensor([5, 6, 7]), torch.tensor([0, 2])).shape
        torch.Size([2, 4])
    """

    def __init__(
        self,
        table: Table,
        mode: str = "mean",
        *,
        include_last_offset: bool = False,
        on_miss: str | None = None,
        rows_in_state_dict: bool = True,
        **nn_args: Any,
    ):
        super().__init__(table, on_miss, rows_in_state_dict, nn_args)
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgumentError(f"mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Every check comes before the lookup: a rejected call stores no row.
        check_input(input)
        if input.dim() == 2:
            if offsets is not None:
                raise ShapeError("offsets must be None when input is 2-D [B, L]")
            b, length = input.shape
            offsets = torch.arange(b) * length
            include_last_offset = False  # as nn.EmbeddingBag: offsets are made here
        elif input.dim() == 1:
            offsets = _check_offsets(offsets, input.numel(), self.include_last_offset)
            include_last_offset = self.include_last_offset
        else:
            raise ShapeError(f"input must be 1-D [N] or 2-D [B, L], got {input.dim()}-D")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise InvalidArgumentError(
                    f"per_sample_weights needs mode='sum', got mode={self.mode!r}"
                )
            if not isinstance(per_sample_weights, torch.Tensor) or not (
                per_sample_weights.dtype.is_floating_point
            ):
                got = describe(per_sample_weights)
                raise DTypeError(f"per_sample_weights must be a float tensor, got {got}")
            if per_sample_weights.shape != input.shape:
                raise ShapeError(
                    f"per_sample_weights must match input {list(input.shape)}, "
                    f"got {list(per_sample_weights.shape)}"
                )
            per_sample_weights = per_sample_weights.reshape(-1)
        rows = self._pull(input)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(device=rows.device, dtype=rows.dtype)
        # Pool with torch's own kernel over the pulled rows (row i is id i), so the semantics —
        # empty bags, include_last_offset, weights — are exactly nn.EmbeddingBag's.
        positions = torch.arange(input.numel(), device=rows.device)
        pooled = F.embedding_bag(
            positions,
            rows,
            offsets.to(rows.device),
            mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=include_last_offset,
        )
        return self._cast(pooled)


# nn.Embedding / nn.EmbeddingBag arguments without an embstore meaning: the values that change
# nothing, and why any other value cannot be honoured.
_NN_ARGS: dict[str, tuple[tuple[Any, ...], str]] = {
    "padding_idx": (
        (None,),
        "no id is special to a table; mask padded positions, or give them "
        "per_sample_weights 0 in an EmbeddingBag",
    ),
    "max_norm": ((None,), "rows are not renormalized on lookup"),
    "norm_type": ((2.0,), "it applies only with max_norm, which is not supported"),
    "scale_grad_by_freq": (
        (False,),
        "the table sums the gradients of duplicate ids into one step",
    ),
    "sparse": ((False, True), "it must be a bool (the table always acts as sparse=True)"),
    "_weight": (
        (None,),
        "rows live in the table; write them with table.assign(ids, rows) or table.import_()",
    ),
    "_freeze": ((False,), "to keep a table's rows fixed, leave it out of EmbeddingOptimizer"),
}


def _check_nn_args(cls: str, table: Table, nn_args: dict[str, Any]) -> tuple[torch.dtype, Any]:
    """Check the ``nn.Embedding`` arguments a ported call passes; return (dtype, device)."""
    dtype = nn_args.pop("dtype", None)
    device = nn_args.pop("device", None)
    dim = nn_args.pop("embedding_dim", None)
    # A capacity hint (TorchRec's configs always give one): a table takes any 64-bit id and
    # makes rows as they are first used, so the hint reserves nothing; only its type is checked.
    rows = nn_args.pop("num_embeddings", None)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise InvalidArgumentError(
            f"num_embeddings must be a positive int (a capacity hint: a table takes any "
            f"64-bit id), got {rows!r}"
        )
    for name, value in nn_args.items():
        if name not in _NN_ARGS:
            raise TypeError(f"{cls}.__init__() got an unexpected keyword argument {name!r}")
        harmless, why = _NN_ARGS[name]
        if not any(_same(value, h) for h in harmless):
            raise InvalidArgumentError(
                f"{name} is not supported by embstore.torch.{cls}: {why} (got {value!r})"
            )
    if dim is not None and dim != table.embedding_dim:
        raise ShapeError(
            f"embedding_dim mismatch for table '{table.name}': "
            f"expected {table.embedding_dim}, got {dim!r}"
        )
    if dtype is None:
        dtype = torch.float32
    elif not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise DTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype, device


def _refuse_distributed(table: Table, call: str) -> None:
    """A state dict cannot carry the rows of a distributed table (each process holds part of
    them): say what checkpoints one."""
    if table.distributed:
        raise InvalidArgumentError(
            f"{call} cannot carry the rows of table '{table.name}': it is a table of a "
            "distributed store, and each process holds part of its rows. Checkpoint with "
            "torch.distributed.checkpoint and embstore.torch.checkpoint.StoreState "
            "(dcp.save({'model': StoreState(model)}, checkpoint_id=...) on every process; "
            "it loads onto any process count), or with store.checkpoint(path) on every "
            "process; or create the module with rows_in_state_dict=False for a state dict "
            "without rows"
        )


def _same(value: Any, harmless: Any) -> bool:
    """``value`` is ``harmless`` (``None``, a bool) or equals it (a float such as 2.0)."""
    if value is harmless:
        return True
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and isinstance(harmless, float) and value == harmless


def check_input(input: Any) -> None:
    """Refuse an ``input`` that is not an integer tensor (before any row is looked up)."""
    if not isinstance(input, torch.Tensor):
        raise DTypeError(f"input must be an int64 tensor, got {type(input).__name__}")
    if input.dtype.is_floating_point or input.dtype.is_complex or input.dtype == torch.bool:
        raise DTypeError(f"input must be an int64 tensor, got {describe(input)}")
    if input.device.type == "meta":
        raise InvalidArgumentError(
            "input is on the meta device: an embstore module looks its rows up in its table, "
            "so it needs real ids (on the CPU or an accelerator); a module made with "
            "device='meta' is materialised by model.to_empty(device=...) or model.to(device)"
        )


def _check_offsets(offsets: Any, n: int, include_last_offset: bool) -> torch.Tensor:
    """``offsets`` of a 1-D ``input`` of ``n`` ids, checked as ``nn.EmbeddingBag`` needs them,
    as CPU int64."""
    if offsets is None:
        raise ShapeError("1-D input [N] needs offsets [B] (or give input as 2-D [B, L])")
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64, torch.int32):
        raise DTypeError(f"offsets must be a 1-D int64 tensor, got {describe(offsets)}")
    if offsets.dim() != 1:
        raise ShapeError(f"offsets must be a 1-D int64 tensor, got {describe(offsets)}")
    return torch.ops.embstore.check_offsets(offsets.detach(), n, include_last_offset)


__all__ = ["Embedding", "EmbeddingBag"]
