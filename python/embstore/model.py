"""A model's health, judged from your own metrics (:class:`ModelMonitor`), and its state as
etcd records it (:func:`model_status`, ``embstore model status``).

Ekko §5.3: a live model is compared with a *baseline* (a copy trained on delayed data, serving
a small share of traffic). Per window of event time (30 s) the monitor takes the successes and
trials each variant saw (clicks and impressions), and once the window's lateness has passed
judges it: *bad* when the live rate is more than 5 % below the baseline's and a two-proportion
z-test says so (z > 3), *ok* when it is within 2 %. Three bad windows in a row make the model
*corrupted*, three ok ones *healthy*; anything else leaves the state as it was (only confident
changes are recorded). With etcd, each confident decision and each healthy window (with the
time up to which the state propagated is healthy, for the witnesses) is written to
``/embstore/model/<model>/state`` by compare-and-swap, at rising times only.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any

from embstore import _native
from embstore.errors import InvalidArgumentError

__all__ = ["ModelMonitor", "model_status", "models"]


def _ms(t: Any, what: str) -> int:
    if isinstance(t, _dt.datetime):
        if t.tzinfo is None:
            raise InvalidArgumentError(f"{what} must be timezone-aware, got {t!r}")
        return int(t.timestamp() * 1000)
    if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
        raise InvalidArgumentError(f"{what} must be a datetime or seconds >= 0, got {t!r}")
    return round(t * 1000)


def etcd_urls(etcd: str | list[str] | None) -> list[str] | None:
    """etcd endpoints as a list (a comma-separated string, or a list)."""
    if etcd is None:
        return None
    return etcd.split(",") if isinstance(etcd, str) else list(etcd)


class ModelMonitor:
    """Judges a model's health from the metrics its live and baseline variants report.

    Args:
        model: the model's name (no ``/``).
        etcd: where the model's state is recorded (``None``: kept here only).
        metric: what the reports count (a label, e.g. ``"ctr"``).
        baseline: the baseline model's name: the alternative clients use while this one is
            not trusted (recorded with the state).
        window_s, lateness_s: the windows of event time and how late a report may come.
        latency_p99_s: the dissemination latency: the state propagated by a window's end is
            healthy up to ``end - latency_p99_s``.

    Example::

        >>> import embstore
        >>> m = embstore.ModelMonitor("ctr", window_s=30)
        >>> for w in range(3):
        ...     m.report(w * 30, 1_000, 20_000, variant="live")
        ...     m.report(w * 30, 1_000, 20_000, variant="baseline")
        True
        True
        True
        True
        True
        True
        >>> [d["state"] for d in m.advance(watermark=3 * 30 + 30)]
        ['uncertain', 'uncertain', 'healthy']
    """

    def __init__(
        self,
        model: str,
        *,
        etcd: str | list[str] | None = None,
        metric: str = "ctr",
        baseline: str | None = None,
        window_s: float = 30.0,
        lateness_s: float = 30.0,
        latency_p99_s: float = 0.0,
    ) -> None:
        if not isinstance(model, str) or not model or "/" in model:
            raise InvalidArgumentError(f"model must be a non-empty name without '/', got {model!r}")
        self.metric = metric
        self._inner = _native.ModelMonitor(
            model,
            etcd=etcd_urls(etcd),
            baseline=baseline,
            window_s=float(window_s),
            lateness_s=float(lateness_s),
            latency_p99_s=float(latency_p99_s),
        )

    def __repr__(self) -> str:
        return f"ModelMonitor({self.model!r}, metric={self.metric!r}, state={self.state!r})"

    @property
    def model(self) -> str:
        """The model's name."""
        return self._inner.model

    @property
    def state(self) -> str:
        """``"healthy"``, ``"uncertain"`` or ``"corrupted"``."""
        return self._inner.state

    @property
    def late_reports(self) -> int:
        """Reports that came after their window was judged (ignored)."""
        return self._inner.late_reports

    def report(
        self, window_start: Any, successes: int, trials: int, *, variant: str = "live"
    ) -> bool:
        """Add ``successes`` of ``trials`` (clicks of impressions) seen by ``variant``
        (``"live"`` or ``"baseline"``) in the window starting at ``window_start`` (a
        timezone-aware datetime, or seconds since the epoch; a multiple of the window).
        Reports of one window add up. False when the window was judged already (late)."""
        return self._inner.report(variant, _ms(window_start, "window_start"), successes, trials)

    def advance(self, watermark: Any = None) -> list[dict[str, Any]]:
        """Judge every window whose end plus the lateness is at or before ``watermark`` (a
        datetime or seconds; ``None``: now): one dict per judged window that had a report
        (``verdict``, ``ratio``, ``z``, ``state``, ``changed``, ``t_healthy_ms``, ...); with
        etcd, confident decisions and healthy windows are recorded there."""
        w = time.time() if watermark is None else watermark
        return self._inner.advance(_ms(w, "watermark"))


def model_status(model: str, etcd: str | list[str]) -> dict[str, Any] | None:
    """The state etcd records for ``model`` (``state``, ``t_ms``, ``t_max_ms`` per witness,
    ``corrupted`` intervals, ``rolling_back``, ``alternative``, ``t_healthy_ms``), or None."""
    raw = _native.model_state_json(etcd_urls(etcd), model)
    return None if raw is None else json.loads(raw)


def models(etcd: str | list[str]) -> list[str]:
    """The models with a state in ``etcd``."""
    return _native.model_list(etcd_urls(etcd))
