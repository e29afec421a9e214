"""When the embedding modules' gradients reach their tables: :class:`EmbeddingOptimizer`.

The forward pass pulls rows from the table. The backward pass keeps the gradient of the pulled
rows (accumulating over backward passes, as ``.grad`` does); :meth:`EmbeddingOptimizer.step`
hands them to the tables (one ``apply_gradients`` per table, duplicate ids summed) and
:meth:`EmbeddingOptimizer.zero_grad` drops them. Dense layers keep using ``torch.optim``::

    loss.backward()
    dense_opt.step(); sparse_opt.step()
    dense_opt.zero_grad(); sparse_opt.zero_grad()

Why on ``step()`` and not inside backward: it keeps torch's contract that nothing changes until
``step()``. Gradient accumulation over several backward passes, a table shared by two modules
(both gradients summed into one step, as torch sums them into one ``.grad``), skipping a step
on a NaN loss, and ``zero_grad()`` all behave as they do for ``nn.Embedding``; applying inside
backward would take one optimizer step per module and per backward pass, which for Adagrad and
Adam is a different update.

Mixed precision. ``torch.amp.GradScaler`` steps an :class:`EmbeddingOptimizer` as it steps a
``torch.optim`` one — ``scaler.scale(loss).backward(); scaler.step(sparse_opt);
scaler.update()``: the pending gradients are its parameters' gradients (``param_groups``
expose them), so the scaler checks them for inf/NaN, ``step()`` applies them unscaled, a step
whose gradients overflowed applies nothing (on every process of a distributed store when any
process's overflowed) and the scaler backs off. Rows come out as in the same run without a
scaler. ``scaler.unscale_(sparse_opt)`` before the step (to inspect or clip) unscales them in
place, as for dense parameters. Calling ``sparse_opt.step()`` directly after a scaled
backward applies the scaled gradients, as ``torch.optim`` optimizers do. :class:`EmbeddingOptimizer`
is a ``torch.optim.Optimizer`` with one param group per table, so ``torch.optim.lr_scheduler``
schedules the tables' learning rates.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from embstore.config import refuse_delta
from embstore.errors import InvalidArgumentError, NotCopyableError
from embstore.table import Table
from embstore.torch.sparse import StoreModule


def _store_modules(modules: nn.Module | Iterable[nn.Module]) -> list[StoreModule]:
    if isinstance(modules, nn.Module):
        modules = [modules]
    found: dict[int, StoreModule] = {}  # by identity: a module listed twice steps once
    for m in modules:
        found.update((id(x), x) for x in m.modules() if isinstance(x, StoreModule))
    return list(found.values())


class _PendingParams(Sequence[torch.Tensor]):
    """A param group's ``"params"``: one tensor per pending gradient of the group's table,
    whose ``.grad`` is that gradient (read live from the modules, so what ``GradScaler`` sees
    is what :meth:`EmbeddingOptimizer.step` applies); empty after ``zero_grad()``."""

    def __init__(self, modules: list[StoreModule], extra: list[torch.Tensor]) -> None:
        self._modules = modules
        self._extra = extra  # another process's overflow, for GradScaler to see (see step)

    def _all(self) -> list[torch.Tensor]:
        return [h for m in self._modules for h in m.grad_holders()] + self._extra

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._all())

    def __len__(self) -> int:
        return sum(len(m.grad_holders()) for m in self._modules) + len(self._extra)

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __repr__(self) -> str:
        return f"<{len(self)} pending gradients>"


def _table_lr(table: Table) -> float:
    """The learning rate the table's optimizer was created with."""
    return float(table.config.optimizer.lr)


class EmbeddingOptimizer(torch.optim.Optimizer):
    """Applies the gradients that embstore modules collected to their tables.

    Each table is stepped by its own optimizer (given at ``create_table``); this object only
    decides *when*, and with which learning rate: at :meth:`step`, with every pending gradient
    of a table — from all modules and backward passes since the last step — in one
    ``apply_gradients`` call, however many modules or handles reach the table.

    It is a ``torch.optim.Optimizer`` with one param group per table (``"params"`` empty,
    ``"table"`` its name, ``"lr"`` its learning rate), so ``torch.optim.lr_scheduler``
    (``StepLR``, ``LambdaLR``, ``CosineAnnealingLR``, …) schedules the tables' learning rates:
    a scheduler multiplies each group's initial lr — the table's own, or ``lr`` — and
    :meth:`step` hands each group's current lr to ``apply_gradients(..., lr=)``. Tables with
    different learning rates keep their ratio under one schedule. ``state_dict()`` /
    ``load_state_dict()`` save and restore the groups (``lr``, ``initial_lr``); the rows and
    their optimizer state travel in the model's ``state_dict()``.

    Args:
        modules: a model (searched with ``.modules()``) or modules holding
            :class:`Embedding`/:class:`EmbeddingBag` layers.
        lr: when set, every table's learning rate, in place of the one its optimizer was
            created with (``opt.lr = x`` sets every group's lr between steps; ``None``: each
            table's own again).
        grad_average: with a distributed store's tables (:class:`~embstore.DistributedStore`
            under torchrun), average the processes' gradients of a row (True, the default: as
            DDP averages the dense gradients and TorchRec divides its sparse ones, so a loss
            that is each process's mean over its share trains like one process over the
            global batch) or sum them (False). :meth:`step` sends the gradients of all of one
            store's tables to the rows' owners in one exchange; it is collective: every
            process steps (its model's tables are the same everywhere), with gradients or not.

    Example::

        >>> import embstore, embstore.torch as et, torch
        >>> store = embstore.Store()
        >>> emb = et.Embedding(store.create_table("item", 4, optimizer=embstore.Adagrad(lr=0.1)))
        >>> opt = et.EmbeddingOptimizer(emb)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        >>> emb(torch.tensor([1, 2])).sum().backward()
        >>> opt.step(), sched.step(), opt.param_groups[0]["lr"]
        (2, None, 0.05)
    """

    def __init__(
        self,
        modules: nn.Module | Iterable[nn.Module],
        lr: float | None = None,
        *,
        grad_average: bool = True,
    ):
        found = _store_modules(modules)
        if not found:
            raise InvalidArgumentError("no embstore.torch Embedding or EmbeddingBag found")
        if lr is not None:
            lr = _check_lr(lr)
        # One group per table, in the order the modules were found; a Table compares equal
        # for every handle of one table (``store.table(name)`` makes a new one per call).
        tables = list(dict.fromkeys(m.table for m in found))
        refuse_delta(tables, "EmbeddingOptimizer")
        groups = [
            {"params": [], "table": t.name, "lr": _table_lr(t) if lr is None else lr}
            for t in tables
        ]
        self._building = True
        super().__init__(groups, {"lr": lr})
        self._building = False
        self.modules = found
        self._tables = tables
        self._elsewhere: list[torch.Tensor] = []
        for i, (group, table) in enumerate(zip(self.param_groups, tables, strict=True)):
            mine = [m for m in found if m.table == table]
            group["params"] = _PendingParams(mine, self._elsewhere if i == 0 else [])
        self._comms = [t.store.comm for t in tables if t.distributed]
        self._agreed_overflow = False
        if not isinstance(grad_average, bool):
            raise InvalidArgumentError(f"grad_average must be a bool, got {grad_average!r}")
        self.grad_average = grad_average
        self._pushers: dict[tuple[int, tuple[str, ...]], Any] = {}

    @property
    def lr(self) -> float | None:
        """The learning rate of every group, or None when the groups differ."""
        lrs = {float(g["lr"]) for g in self.param_groups}
        return lrs.pop() if len(lrs) == 1 else None

    @lr.setter
    def lr(self, value: float | None) -> None:
        for group, table in zip(self.param_groups, self._tables, strict=True):
            group["lr"] = _table_lr(table) if value is None else _check_lr(value)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only the constructor adds groups: one per table of the modules."""
        if not self._building:
            raise InvalidArgumentError(
                "EmbeddingOptimizer has one param group per table of its modules; "
                "make a new EmbeddingOptimizer to step other modules"
            )
        super().add_param_group(param_group)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Apply every pending gradient with each table's group lr.

        As with ``torch.optim``, gradients stay until :meth:`zero_grad`: a second ``step()``
        without ``zero_grad()`` (or a new backward pass) steps with them again.

        Args:
            closure: as for ``torch.optim``: called first, with gradients enabled, to compute
                the loss (and run backward).

        Returns:
            The closure's loss when one is given; otherwise the rows stepped.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = getattr(self, "grad_scale", None)  # set by GradScaler.step for the call
        found_inf = getattr(self, "found_inf", None)
        agreed, self._agreed_overflow = self._agreed_overflow, False
        self._elsewhere.clear()
        if found_inf is not None and (float(found_inf) > 0 or agreed):
            return loss if closure is not None else 0
        inv_scale = None if scale is None else 1.0 / float(scale)
        pending: dict[Table, tuple[list[np.ndarray], list[torch.Tensor]]] = {
            t: ([], []) for t in self._tables
        }
        for m in self.modules:
            ids, grads = pending[m.table]
            for i, g in m.pending_grads():
                ids.append(i)
                grads.append(g)
        stepped = 0
        # A distributed store's tables (several processes): every table of one store and lr
        # in one collective push, also those without a gradient here (see _push_distributed).
        together: dict[tuple[int, float], list[tuple[Table, Any, Any]]] = {}
        for group, table in zip(self.param_groups, self._tables, strict=True):
            ids, grads = pending[table]
            lr = float(group["lr"])
            many = table.distributed and table.store.world_size > 1
            if not ids and not many:
                continue
            all_ids = (ids[0] if len(ids) == 1 else np.concatenate(ids)) if ids else None
            all_grads = (grads[0] if len(grads) == 1 else torch.cat(grads)) if ids else None
            if all_grads is not None and inv_scale is not None and inv_scale != 1.0:
                # As GradScaler.unscale_: multiplied by the float32 of the fp64 reciprocal.
                all_grads = all_grads * torch.tensor(inv_scale, dtype=torch.float32)
            if many:
                together.setdefault((id(table.store), lr), []).append((table, all_ids, all_grads))
                continue
            stepped += table.apply_gradients(all_ids, all_grads.numpy(), lr=lr)
        for (_, lr), items in together.items():
            stepped += self._push_distributed(items, lr)
        return loss if closure is not None else stepped

    def _push_distributed(self, items: list[tuple[Table, Any, Any]], lr: float) -> int:
        """One exchange of ids and one of gradients for the tables of one distributed store:
        each table's gradients to the rows' owners, which sum them over the processes —
        averaged (``grad_average``: each process's share divided by the process count, as DDP
        averages the dense gradients and TorchRec divides its sparse ones) — and step each id
        once. A table no process has a gradient for is not stepped. Collective: every process
        steps the same tables (its model's), gradients or not. Returns the unique ids sent."""
        from embstore.session import Session

        store = items[0][0].store
        names = tuple(t.name for t, _, _ in items)
        sess = self._pushers.get((id(store), names))
        if sess is None:
            sess = Session(store, list(names), prefetch=0, grad_average=False)
            self._pushers[(id(store), names)] = sess
        scale = np.float32(1.0 / store.world_size) if self.grad_average else None

        def grads_of(t: int, uniq: np.ndarray, inv: Any) -> np.ndarray:
            table, _, g = items[t]
            acc = torch.zeros((len(uniq), table.embedding_dim), dtype=torch.float32)
            if g is not None:
                # Per id, in the ids' order: the sums apply_gradients makes of duplicates.
                acc.index_add_(0, torch.from_numpy(inv), g)
            a = acc.numpy()
            return a * scale if scale is not None else a

        return sess.apply_gradients_together(
            [ids for _, ids, _ in items],
            grads_of,
            lr,
            what=f"EmbeddingOptimizer.step() of {list(names)}",
        )

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """Read by ``torch.amp.GradScaler.step`` (only there, once per call, on every
        process): True, so the scaler calls :meth:`step` also after an overflow, with the
        scale (``grad_scale``; None once ``unscale_`` ran) and the overflow (``found_inf``) as
        attributes, and :meth:`step` unscales or skips.

        With a distributed store's tables the processes first agree here whether any
        process's gradients overflowed (collective): where another's did, a gradient of inf
        joins this optimizer's parameters, so this process's scaler sees the overflow too,
        skips alike and backs off alike (the scales must stay equal: DDP sums the dense
        gradients of every process's scaled loss)."""
        if self._comms:
            mine = any(
                not bool(torch.isfinite(p.grad).all())
                for g in self.param_groups
                for p in g["params"]
                if p.grad is not None
            )
            what = "checking a scaled step for overflow (GradScaler.step)"
            self._agreed_overflow = any(self._comms[0].all_gather(mine, what))
            if self._agreed_overflow and not mine:
                flag = torch.zeros(1)
                flag.grad = torch.full((1,), float("inf"))
                self._elsewhere.append(flag)
                _record_overflow_in_scaler(self)
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every pending gradient and release the rows pinned by the forward passes
        (``set_to_none`` is accepted for torch's signature)."""
        self._elsewhere.clear()
        for m in self.modules:
            m.drop_grads()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the groups' ``lr`` (and a scheduler's ``initial_lr``) from
        :meth:`state_dict`; the groups must be for the same tables, in the same order."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        saved = [g.get("table") for g in groups] if isinstance(groups, list) else None
        ours = [g["table"] for g in self.param_groups]
        if saved != ours:
            raise InvalidArgumentError(
                f"the optimizer state is for tables {saved}, this EmbeddingOptimizer steps {ours}"
            )
        assert groups is not None
        # The groups' settings only: their "params" are the pending gradients of the moment,
        # not saved (the rows and their optimizer state travel in the model's state_dict()).
        for group, loaded in zip(self.param_groups, groups, strict=True):
            group.update({k: v for k, v in loaded.items() if k not in ("params", "table")})

    def state_dict(self) -> dict[str, Any]:
        """The groups' settings (``table``, ``lr``, a scheduler's ``initial_lr``); no
        gradients and no rows (those travel in the model's ``state_dict()``)."""
        return {
            "state": {},
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": []}
                for g in self.param_groups
            ],
        }

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise NotCopyableError(
            "EmbeddingOptimizer cannot be pickled or copied: it holds its modules' tables. "
            "Save opt.state_dict() and load it into a new EmbeddingOptimizer"
        )


def _record_overflow_in_scaler(optimizer: EmbeddingOptimizer) -> None:
    """Another process's gradients overflowed: where ``scaler.unscale_(optimizer)`` ran
    before this ``scaler.step(optimizer)`` (to clip), the scaler already holds this process's
    own check (finite) and would not look again, so it would skip the step but not back off,
    and the processes' scales would part. Record the overflow in that check too (the scaler
    is the caller of :attr:`EmbeddingOptimizer._step_supports_amp_scaling`). Before any
    ``unscale_`` the check is empty and is made after this, over the flag ``step`` sees."""
    frame = sys._getframe(1)
    for _ in range(4):  # the property's getter is called from GradScaler.step
        if frame is None:
            return
        scaler = frame.f_locals.get("self")
        if isinstance(scaler, torch.amp.GradScaler):
            state = scaler._per_optimizer_states.get(id(optimizer))
            for found_inf in (state or {}).get("found_inf_per_device", {}).values():
                found_inf.fill_(1.0)
            return
        frame = frame.f_back


def _check_lr(lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, int | float | np.floating | torch.Tensor):
        raise InvalidArgumentError(f"lr must be a float >= 0, got {lr!r}")
    value = float(lr)
    if not value >= 0 or value == float("inf"):
        raise InvalidArgumentError(f"lr must be a finite float >= 0, got {lr!r}")
    return value


__all__ = ["EmbeddingOptimizer"]
