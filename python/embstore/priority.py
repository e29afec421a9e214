"""Priority of a table's writes when the WAN is short (:class:`Priority`).

A table that syncs scores each row its ``apply_gradients`` writes; the writes at or above the
``k``-th percentile of the recent ones are *significant*. While a follower's link is congested,
the significant writes travel ahead of the rest on a second connection and its reads serve
them at once; normal sync never stops and brings everything (docs/dissemination.md, "Priority
when the WAN is short").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from embstore.errors import InvalidArgumentError

__all__ = ["Priority"]


@dataclass(frozen=True)
class Priority:
    """How a table scores its writes.

    The default rule is Ekko's: ``p = (p_g + p_u) · p_m``, where ``p_g`` is the gradient's
    1-norm over its running mean, ``p_u`` a row's freshness over its running mean (1 for the
    write that creates a row, then ``1 / (1 + age / 60 s)``; the table remembers the creation
    of the rows it created in the last ten minutes, and any other row counts as ten minutes
    old) and ``p_m`` the model's share of inference requests. A write is significant when
    ``p`` is at or above the ``k``-th percentile of the priorities of the last ``window_s``
    seconds (a DDSketch, ±1 %).

    Args:
        k: the percentile, in (0, 100): 99 marks the top 1 %.
        rule: ``None`` for the rule above, or a callable ``rule(u) -> priorities`` called once
            per write call with ``u`` a dict of numpy arrays ``key`` (uint64), ``grad_l1``,
            ``writes`` (the row's earlier writes), ``freshness`` and floats ``g_mean``,
            ``f_mean``, ``p_m``; it returns one non-negative float per row. It runs on the
            writer's thread with no lock of the store held, and must not call into the
            store. An error scores the call's rows 0 (warned once).
        model: the model (a group of tables) the table belongs to, for ``p_m``.
        window_s: the window of the percentile, in seconds.
        half_life_s: the half-life of the running means, in seconds.

    Example::

        >>> import embstore
        >>> store = embstore.Store()
        >>> item = store.create_table("item", 16, priority=embstore.Priority(k=99))
        >>> item.priority_stats()["k"]
        99.0
    """

    k: float = 99.0
    rule: Callable[[dict[str, Any]], Any] | None = None
    model: int = 0
    window_s: float = 60.0
    half_life_s: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int | float) or not 0 < self.k < 100:
            raise InvalidArgumentError(f"priority percentile k must be in (0, 100), got {self.k!r}")
        if self.rule is not None and not callable(self.rule):
            raise InvalidArgumentError(f"priority rule must be callable, got {self.rule!r}")
        if isinstance(self.model, bool) or not isinstance(self.model, int) or self.model < 0:
            raise InvalidArgumentError(f"priority model must be an int >= 0, got {self.model!r}")
        for name in ("window_s", "half_life_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise InvalidArgumentError(f"priority {name} must be > 0, got {v!r}")

    def apply_to(self, native_table: Any) -> None:
        """Sets this priority on a native table (``embstore._native.Table``)."""
        native_table.set_priority(
            float(self.k),
            self.rule,
            int(self.model),
            float(self.window_s),
            float(self.half_life_s),
        )
