"""Dissemination: keep replicas of a store's tables fresh by pulling changed rows.

A store that trains exposes its tables on a *sync port* (:meth:`embstore.Store.serve_sync`);
a replica in another process or data centre *follows* it (:meth:`embstore.Store.follow`):
it asks which sync parts changed, pulls the rows newer than what it knows, applies them
last-writer-wins, and serves lookups all the while. Only changed rows move, each once per
pull however often it changed; a follower that falls behind, restarts or joins empty catches
up by the same pulls. ``docs/dissemination.md`` describes the protocol, the wire format and
the failure cases.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from embstore import _native
from embstore.errors import InvalidArgumentError
from embstore.serving import native_tls


class SyncPort:
    """A store's sync port (from :meth:`embstore.Store.serve_sync`): followers connect to
    :attr:`address`. Stop it with :meth:`stop` or a ``with`` block."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def address(self) -> str:
        """``host:port`` the port listens on."""
        return str(self._inner.address)

    def stats(self) -> dict[str, int]:
        """Connections accepted and refused, frame bytes in and out, pulls and parts served."""
        return dict(self._inner.stats())

    def stop(self) -> None:
        """Closes the port and its connections (followers retry until it is back)."""
        self._inner.stop()

    def __enter__(self) -> SyncPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SyncPort({self.address!r})"


def _path(p: Any, what: str) -> str | None:
    if p is None:
        return None
    if not isinstance(p, str | os.PathLike):
        raise InvalidArgumentError(f"{what} must be a path to a PEM file, got {p!r}")
    return os.fspath(p)


def serve(
    store_inner: Any,
    listen: str,
    token: str | None,
    parts: int | None = None,
    tls: tuple[Any, Any, Any] = (None, None, None),
    use_cache: bool | None = None,
    tombstone_horizon_s: float | None = None,
    etcd: str | list[str] | None = None,
    dc: str | None = None,
    advertise: str | None = None,
) -> SyncPort:
    """The native port for a store (see :meth:`embstore.Store.serve_sync`)."""
    endpoints = _etcd_endpoints(etcd, dc, "registering in etcd") if etcd is not None else None
    if dc is not None and etcd is None:
        raise InvalidArgumentError("dc names a data centre in etcd: pass etcd= too")
    if advertise is not None and (not isinstance(advertise, str) or ":" not in advertise):
        raise InvalidArgumentError(f"advertise must be 'host:port', got {advertise!r}")
    if not isinstance(listen, str) or ":" not in listen:
        raise InvalidArgumentError(f"listen must be 'host:port', got {listen!r}")
    if token is not None and not isinstance(token, str):
        raise InvalidArgumentError(f"token must be a str, got {token!r}")
    if parts is not None and (
        isinstance(parts, bool) or not isinstance(parts, int) or parts < 1 or parts & (parts - 1)
    ):
        raise InvalidArgumentError(f"parts must be a power of two, got {parts!r}")
    h = tombstone_horizon_s
    if h is not None and (
        isinstance(h, bool) or not isinstance(h, int | float) or not 0 <= h < 2**53 / 1000
    ):
        raise InvalidArgumentError(
            f"tombstone_horizon_s must be a number of seconds >= 0, got {tombstone_horizon_s!r}"
        )
    cert, key, client_ca = (
        _path(p, w) for p, w in zip(tls, ("tls_cert", "tls_key", "tls_client_ca"), strict=True)
    )
    native = _native.SyncServer(
        store_inner,
        listen,
        token,
        parts,
        cert,
        key,
        client_ca,
        None if use_cache is None else bool(use_cache),
        None if h is None else int(h * 1000),
        endpoints,
        dc if endpoints else None,
        advertise,
    )
    return SyncPort(native)


def _etcd_endpoints(etcd: str | list[str], dc: str | None, what: str) -> list[str]:
    """etcd's endpoints from a URL, a comma-separated list or a list; ``dc`` must be a name."""
    urls = [etcd] if isinstance(etcd, str) else etcd
    endpoints = [e for u in urls for e in str(u).split(",") if e]
    if not endpoints or not all(isinstance(e, str) for e in endpoints):
        raise InvalidArgumentError(f"etcd must be a URL or a list of URLs, got {etcd!r}")
    if not isinstance(dc, str) or not dc:
        raise InvalidArgumentError(f"{what} needs dc (a name), got {dc!r}")
    return endpoints


def new_replica_id() -> int:
    """A random replica id in 1..2**31 - 1: every replica needs its own (ids name what a
    replica knows); a replica that lost its state rejoins under a new one."""
    return 1 + secrets.randbelow(_native.MAX_REPLICA)


def start_follower(
    store_inner: Any,
    source: str | None,
    *,
    etcd: str | list[str] | None = None,
    dc: str | None = None,
    token: str | None,
    tables: list[str] | None,
    with_state: bool,
    wait_ms: int,
    tls: tuple[Any, Any, Any, str | None] = (None, None, None, None),
    priority: bool = True,
) -> Any:
    """The native follower (see :meth:`embstore.Store.follow`); ``priority=False``: no
    prioritised pulls when congested (a witness)."""
    if (source is None) == (etcd is None):
        raise InvalidArgumentError("follow needs a source ('host:port'), or etcd and dc")
    if source is not None and (not isinstance(source, str) or ":" not in source):
        raise InvalidArgumentError(f"source must be 'host:port' of a sync port, got {source!r}")
    endpoints = None
    if etcd is not None:
        endpoints = _etcd_endpoints(etcd, dc, "following through etcd")
    if tables is not None and (
        isinstance(tables, str) or not all(isinstance(t, str) for t in tables)
    ):
        raise InvalidArgumentError(f"tables must be a list of names, got {tables!r}")
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or not 0 <= wait_ms <= 5000:
        raise InvalidArgumentError(f"wait_ms must be in 0..5000, got {wait_ms!r}")
    ca, cert, key, domain = native_tls(*tls) or (None, None, None, None)
    return _native.Follower(
        store_inner,
        source or "",
        token or "",
        list(tables or []),
        bool(with_state),
        wait_ms,
        ca,
        cert,
        key,
        domain,
        endpoints,
        dc if endpoints else None,
        priority=priority,
    )
