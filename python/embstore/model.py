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
import hashlib
import json
import logging
import random
import threading
import time
from typing import Any

from embstore import _native
from embstore.errors import InvalidArgumentError

__all__ = ["ModelClient", "ModelMonitor", "model_status", "models", "trusted"]

_log = logging.getLogger("embstore.model")


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


def trusted(record: dict[str, Any] | None) -> bool:
    """Whether clients send a model traffic, given its state record (``None``: no state is
    recorded yet, so nothing says otherwise): not while it rolls back, not while it is
    corrupted, and after a corruption only once it is healthy again (an ``uncertain`` model
    is trusted only if it was never corrupted)."""
    if record is None:
        return True
    if record.get("rolling_back"):
        return False
    state = record.get("state")
    return state == "healthy" or (state == "uncertain" and not record.get("corrupted"))


class ModelClient:
    """Lookups that follow a model's state in etcd (Ekko §5.3): they go to the model's own
    client while it is trusted, to its alternative's while it is corrupted or rolling back
    (all but ``probe_share`` of them, which keep the model's metrics coming), and back only
    once the model is healthy again (:func:`trusted`), gradually: its share of requests rises
    from ``probe_share`` to all over ``return_s`` seconds (and falls back to ``probe_share``
    at once if it is no longer trusted meanwhile).

    Args:
        model: the model's name.
        etcd: where its state is recorded (``http://host:port`` or a list).
        clients: a client per model name (anything with ``lookup(table, ids, **kw)``: a
            :class:`~embstore.RemoteClient`, a store's table map...); must hold ``model`` and
            the alternative.
        alternative: the model traffic goes to instead (``None``: the one its state names,
            from :class:`ModelMonitor`'s ``baseline``).
        poll_s: how often the state is read again (a background thread).
        probe_share: while the model is not trusted, this share of requests still goes to it
            (Ekko's step ⑤: a little traffic, so that the metrics reported from it can show
            it healthy again; 0: none). :meth:`choose` says which model a request goes to.
        return_s: once the model is trusted again, how long its share of requests takes to
            rise linearly from ``probe_share`` to all of them (0: all at once). A request
            keyed by a user moves back once and stays (the share only grows).
        seed: the seed of the draw of probe requests (``None``: from the system).

    The state is read once when made (``UnavailableError`` if etcd does not answer); later,
    while etcd is away, lookups keep the last route and :attr:`stale` says since when. Each
    change of route is logged (``embstore.model``) and kept in :attr:`switches`.

    Example::

        client = embstore.ModelClient("ctr", etcd="http://127.0.0.1:2379",
                                      clients={"ctr": embstore.connect("10.0.0.5:7000"),
                                               "ctr-delayed": embstore.connect("10.0.0.6:7000")})
        rows = client.lookup("item", ids)      # from ctr while it is trusted
    """

    def __init__(
        self,
        model: str,
        *,
        etcd: str | list[str],
        clients: dict[str, Any],
        alternative: str | None = None,
        poll_s: float = 0.2,
        probe_share: float = 0.01,
        return_s: float = 30.0,
        seed: int | None = None,
    ) -> None:
        if not isinstance(model, str) or not model or "/" in model:
            raise InvalidArgumentError(f"model must be a non-empty name without '/', got {model!r}")
        if not isinstance(clients, dict) or model not in clients:
            raise InvalidArgumentError(f"clients must be a dict holding a client for {model!r}")
        for name, c in clients.items():
            if not callable(getattr(c, "lookup", None)):
                raise InvalidArgumentError(f"the client for {name!r} has no lookup method")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not poll_s > 0:
            raise InvalidArgumentError(f"poll_s must be seconds > 0, got {poll_s!r}")
        if isinstance(probe_share, bool) or not isinstance(probe_share, int | float):
            raise InvalidArgumentError(f"probe_share must be in [0, 1], got {probe_share!r}")
        if not 0.0 <= probe_share <= 1.0:
            raise InvalidArgumentError(f"probe_share must be in [0, 1], got {probe_share!r}")
        if isinstance(return_s, bool) or not isinstance(return_s, int | float):
            raise InvalidArgumentError(f"return_s must be seconds >= 0, got {return_s!r}")
        if not 0.0 <= return_s < float("inf"):
            raise InvalidArgumentError(f"return_s must be seconds >= 0, got {return_s!r}")
        self.model = model
        self.probe_share = float(probe_share)
        self.return_s = float(return_s)
        # While the model's share ramps back up: when it began (monotonic) and the model the
        # rest of the requests still go to.
        self._back_at: float | None = None
        self._back_from: str | None = None
        self._rng = random.Random(seed)
        self._etcd = etcd_urls(etcd)
        self._clients = dict(clients)
        self._given_alternative = alternative
        self._poll_s = float(poll_s)
        self._lock = threading.Lock()
        self._record: dict[str, Any] | None = None
        self._route = model
        self._stale_since: float | None = None
        self.switches: list[dict[str, Any]] = []
        self._apply(model_status(model, self._etcd or []))  # raises if etcd does not answer
        if self._alternative() is None:
            raise InvalidArgumentError(
                f"model {model!r} has no alternative: pass alternative= or record one with "
                "ModelMonitor(baseline=...)"
            )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"embstore-model-{model}")
        self._thread.daemon = True
        self._thread.start()

    def _alternative(self) -> str | None:
        if self._given_alternative is not None:
            name = self._given_alternative
        else:
            name = (self._record or {}).get("alternative")
        if name is not None and name not in self._clients:
            raise InvalidArgumentError(
                f"model {self.model!r}'s alternative is {name!r}, which clients= does not hold"
            )
        return name

    def _apply(self, record: dict[str, Any] | None) -> None:
        with self._lock:
            self._record = record
            self._stale_since = None
            try:
                alternative = self._alternative()
            except InvalidArgumentError as e:  # renamed in etcd since: keep the route we have
                if not self.switches or self.switches[-1].get("error") != str(e):
                    _log.warning("%s", e)
                    self.switches.append({"t": time.time(), "error": str(e)})
                return
            route = self.model if trusted(record) or alternative is None else alternative
            if route != self._route:
                why = "healthy" if route == self.model else _why(record)
                if route == self.model and self.return_s > 0:
                    self._back_at, self._back_from = time.monotonic(), self._route
                    why += f", returning over {self.return_s:g} s"
                else:
                    self._back_at = self._back_from = None
                _log.warning("model %s: traffic goes to %s (%s)", self.model, route, why)
                self.switches.append(
                    {"t": time.time(), "from": self._route, "to": route, "why": why}
                )
                self._route = route

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                record = model_status(self.model, self._etcd or [])
            except Exception as e:  # etcd away: keep the route, say since when
                with self._lock:
                    if self._stale_since is None:
                        self._stale_since = time.time()
                        _log.warning(
                            "model %s: etcd does not answer (%s); keeping route", self.model, e
                        )
                continue
            self._apply(record)

    def refresh(self) -> str:
        """Reads the state now (not waiting for the next poll); the route it gives."""
        self._apply(model_status(self.model, self._etcd or []))
        return self.route

    @property
    def route(self) -> str:
        """The model lookups go to now (while its traffic returns, the share :attr:`share`
        of them; the rest still go where they went)."""
        return self._route

    @property
    def share(self) -> float:
        """The share of requests that go to the model now: 1 while it is trusted (once its
        traffic has returned), ``probe_share`` while it is not, and in between while its
        traffic returns (``return_s``)."""
        return self._share()[0]

    def _share(self) -> tuple[float, str]:
        """The model's share of requests and where the rest go."""
        with self._lock:
            if self._route != self.model:
                return self.probe_share, self._route
            if self._back_at is None or self._back_from is None:
                return 1.0, self.model
            done = (time.monotonic() - self._back_at) / self.return_s
            if done >= 1.0:
                self._back_at = self._back_from = None
                return 1.0, self.model
            return self.probe_share + (1.0 - self.probe_share) * done, self._back_from

    @property
    def state(self) -> dict[str, Any] | None:
        """The state record last read (see :func:`model_status`)."""
        return self._record

    @property
    def stale(self) -> float | None:
        """Since when (seconds since the epoch) etcd has not answered; None while it does."""
        return self._stale_since

    def choose(self, key: Any = None) -> str:
        """The model a request goes to: the model for its :attr:`share` of the requests, the
        alternative for the rest (by ``key``'s hash when given, so that one user keeps
        seeing one model, and one who moved back stays; else drawn at random)."""
        share, rest = self._share()
        if share >= 1.0:
            return self.model
        if share <= 0.0:
            return rest
        if key is None:
            probe = self._rng.random() < share
        else:
            h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest())
            probe = h / 2**64 < share
        return self.model if probe else rest

    def lookup(self, table: str, ids: Any, *, model: str | None = None, **kwargs: Any) -> Any:
        """The rows of ``ids`` in ``table`` from ``model``'s client (``None``: the model
        :meth:`choose` picks for this request), with the client's keywords."""
        name = self.choose() if model is None else model
        if name not in self._clients:
            raise InvalidArgumentError(f"no client for model {name!r}")
        return self._clients[name].lookup(table, ids, **kwargs)

    def close(self) -> None:
        """Stops following the state (the clients are the caller's)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelClient({self.model!r}, route={self._route!r})"


def _why(record: dict[str, Any] | None) -> str:
    if record is None:
        return "no state"
    if record.get("rolling_back"):
        return "rolling back"
    return str(record.get("state"))
