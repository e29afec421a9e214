"""One ``/metrics`` endpoint per process: what a process of the package measures (its training
sessions), in Prometheus' text format, served by the same endpoint a server runs (the native
one: over TLS when asked, ``text/plain; version=0.0.4``).

Sources register themselves (:func:`register`: a callable returning Prometheus text, held
weakly when it is a bound method, so a session that is gone stops being scraped); :func:`serve`
starts the process's endpoint once; :func:`text` is what it answers, every source's families
merged (each ``# HELP``/``# TYPE`` once, followed by the samples of every source).

    >>> import embstore.metrics as em
    >>> remove = em.register(lambda: '# TYPE demo_total counter\\ndemo_total{a="1"} 2\\n')
    >>> 'demo_total{a="1"} 2' in em.text()
    True
    >>> remove()
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from embstore import _native
from embstore.errors import InvalidArgumentError

__all__ = ["address", "register", "serve", "stop", "text"]

_lock = threading.Lock()
_ids = itertools.count(1)
# id -> a function returning the source (None once a weakly held source is gone).
_sources: dict[int, Callable[[], Callable[[], str] | None]] = {}
_endpoint: Any = None
_asked = ""  # the listen address the endpoint was started with (a host name, say)


def register(source: Callable[[], str]) -> Callable[[], None]:
    """Add ``source`` (a callable returning Prometheus text) to what the process's endpoint
    serves; returns a function that removes it. A bound method is held weakly: its object
    going away removes it."""
    if not callable(source):
        raise InvalidArgumentError(f"a metrics source must be callable, got {source!r}")
    held: Callable[[], Callable[[], str] | None]
    if hasattr(source, "__self__") and hasattr(source, "__func__"):
        held = weakref.WeakMethod(source)  # type: ignore[arg-type]
    else:

        def held() -> Callable[[], str]:
            return source

    key = next(_ids)
    with _lock:
        _sources[key] = held

    def remove() -> None:
        with _lock:
            _sources.pop(key, None)

    return remove


def text() -> str:
    """Every registered source's metrics, merged by family."""
    with _lock:
        entries = list(_sources.items())
    meta: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    order: list[str] = []
    gone = []
    for key, held in entries:
        source = held()
        if source is None:
            gone.append(key)
            continue
        for line in source().splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                lines = meta.setdefault(family, [])
                if family not in samples:
                    samples[family] = []
                    order.append(family)
                if not any(m.split(" ", 2)[1] == line.split(" ", 2)[1] for m in lines):
                    lines.append(line)
            elif line.startswith("#"):
                continue
            else:
                family = _family(line.split("{", 1)[0].split(" ", 1)[0], samples)
                if family not in samples:
                    samples[family] = []
                    order.append(family)
                samples[family].append(line)
    if gone:
        with _lock:
            for key in gone:
                _sources.pop(key, None)
    out = []
    for family in order:
        out += meta.get(family, [])
        out += samples[family]
    return "\n".join(out) + "\n" if out else ""


def _family(name: str, known: dict[str, list[str]]) -> str:
    """The family a sample belongs to: its name, or a histogram's/summary's base name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return name


def serve(
    listen: str = "127.0.0.1:0",
    *,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_client_ca: str | os.PathLike[str] | None = None,
) -> str:
    """Start the process's endpoint on ``listen`` (``host:port``; port 0 picks one), once;
    returns ``host:port``. Called again, it returns the running endpoint's address (a
    different fixed address is refused: a process has one endpoint). TLS from PEM files, as
    for the serving port."""
    global _endpoint, _asked
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgumentError(f"listen must be host:port, got {listen!r}")
    with _lock:
        if _endpoint is not None:
            if int(port) != 0 and listen not in (_endpoint.address, _asked):
                raise InvalidArgumentError(
                    f"this process serves its metrics on {_endpoint.address} already (one "
                    f"endpoint a process); asked for {listen}"
                )
            return str(_endpoint.address)
        paths = [None if p is None else os.fspath(p) for p in (tls_cert, tls_key, tls_client_ca)]
        _endpoint = _native.MetricsEndpoint(listen, text, *paths)
        _asked = listen
        return str(_endpoint.address)


def address() -> str | None:
    """``host:port`` of the process's endpoint, or ``None`` when it does not run."""
    with _lock:
        return None if _endpoint is None else str(_endpoint.address)


def stop() -> None:
    """Stop the process's endpoint (a later :func:`serve` starts it again)."""
    global _endpoint
    with _lock:
        endpoint, _endpoint = _endpoint, None
    if endpoint is not None:
        endpoint.stop()
