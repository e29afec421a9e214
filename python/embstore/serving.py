"""The batch-query service's Python client: ``embstore.connect``.

A server runs with ``embstore serve --store DIR --listen HOST:PORT`` (every table of the store,
served as version 1). A client reads every row of a batch at ONE table version, fanned out to
the shards of that version (docs/serving.md):

    >>> import tempfile, numpy as np, embstore
    >>> from embstore import _native
    >>> path = tempfile.mkdtemp()
    >>> store = embstore.Store(path)
    >>> user = store.create_table("user", embedding_dim=4)
    >>> user.assign([1, 2], np.ones((2, 4), np.float32))
    >>> _ = store.flush(); del user, store              # the server opens the directory
    >>> server = _native.Server(path, "127.0.0.1:0")    # what `embstore serve` runs
    >>> import threading; t = threading.Thread(target=server.run); t.start()
    >>> client = embstore.connect(server.address)
    >>> rows, version = client.lookup("user", [1, 3], return_version=True)
    >>> rows.tolist(), version                          # a missing id gets zeros
    ([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], 1)
    >>> server.stop(); t.join()
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from embstore import _native
from embstore._arrays import as_ids
from embstore.errors import InvalidArgumentError

__all__ = ["RemoteClient", "connect"]


class RemoteClient:
    """A client of a fixed set of batch-query servers (see :func:`connect`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def lookup(
        self,
        table: str,
        ids: Any,
        *,
        return_version: bool = False,
        return_found: bool = False,
    ) -> Any:
        """``float32[B, D]``: the rows of ``ids`` (int64 ``[B]``) in ``table``, every one read at
        the same table version; ids without a row get zeros. With ``return_found`` also a
        ``bool[B]`` mask of the ids that have a row, with ``return_version`` also the version:
        ``rows``, ``(rows, version)``, ``(rows, found)`` or ``(rows, found, version)``.

        Raises :class:`TableNotFoundError` when no server holds ``table``,
        :class:`UnavailableError` when no complete version can be read before the deadline,
        :class:`CapacityError` for a batch above the servers' maximum."""
        if not isinstance(table, str):
            raise InvalidArgumentError(f"table must be a str, got {type(table).__name__}")
        arr = as_ids(ids)[0]
        values, found, version = self._inner.lookup(table, arr)
        out: tuple[Any, ...] = (values,)
        if return_found:
            out += (found,)
        if return_version:
            out += (version,)
        return out[0] if len(out) == 1 else out

    def transport_to(self, address: str) -> str | None:
        """How lookups reach the server at ``address`` now: ``"framed"`` (the framed lookup
        path over TCP), ``"framed-unix"`` (over the server's Unix socket, same host) or
        ``"grpc"``; None for an address this client does not know."""
        return self._inner.transport_to(address)

    def view(self) -> list[tuple[str, list[tuple[str, int, int, int, str]] | None]]:
        """Per server: its address and what it held when last heard from, as
        ``(table, version, shard, num_shards, state)``; None for a server that has not
        answered."""
        return self._inner.view()

    def __repr__(self) -> str:
        return f"RemoteClient({[addr for addr, _ in self.view()]!r})"


def connect(
    address: str | list[str] | None = None,
    *,
    etcd: str | list[str] | None = None,
    deadline_s: float = 5.0,
    max_restarts: int = 2,
    token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_domain: str | None = None,
    transport: str = "auto",
) -> RemoteClient:
    """A client of the server at ``address`` (``"host:port"``), or of every server in a list
    (the replicas and shards of a fixed cluster). It asks each what it holds; a lookup then
    fans out to the shards of one version, tries another replica on failure, and gives up
    after ``deadline_s`` seconds or ``max_restarts`` fresh starts. ``token`` is sent with
    every call to servers started with a read token (``embstore serve --read-token-file``).
    With ``tls_ca`` (a PEM file of the CA the servers' certificates chain to) the client
    talks TLS, checking the certificates against ``tls_domain`` (default: the address's host);
    ``tls_cert`` and ``tls_key`` add a client certificate for servers that ask for one.

    With ``etcd`` (``"http://host:port"``, or a list of etcd members) instead of an address,
    the client finds the servers registered in etcd (``embstore serve --etcd``), keeps
    re-reading them (servers that join later are used), and goes on with the ones it knows
    while etcd is away.

    ``transport`` picks how lookups travel: ``"auto"`` (the default) takes the framed lookup
    path wherever a server offers it — binary frames on a TCP port of its own, or its Unix
    socket when the server is on this host and ``tls_ca`` is not given — once the endpoint has
    answered as that server (not another one behind a tunnel or port mapping), and gRPC
    elsewhere; ``"grpc"`` always takes gRPC; ``"framed"`` only the framed path. Both give the
    same rows, versions and errors (docs/serving.md, "Choosing a transport"). ``"fast"``, the
    framed path's old name, is a deprecated alias of ``"framed"`` (a DeprecationWarning).

    Raises :class:`UnavailableError` if no server answers, :class:`PermissionDeniedError` if
    they refuse the token (or its absence)."""
    if (address is None) == (etcd is None):
        raise InvalidArgumentError("give either address or etcd")
    etcds = None
    if etcd is not None:
        etcds = [etcd] if isinstance(etcd, str) else list(etcd)
        if not etcds or not all(isinstance(e, str) and e for e in etcds):
            raise InvalidArgumentError(f"etcd must be 'http://host:port' or a list, got {etcd!r}")
    addresses = [] if address is None else [address] if isinstance(address, str) else list(address)
    if etcds is None and (not addresses or not all(isinstance(a, str) and a for a in addresses)):
        raise InvalidArgumentError(
            f"address must be 'host:port' or a list of them, got {address!r}"
        )
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise InvalidArgumentError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if token is not None:
        if not isinstance(token, str) or not token.strip():
            raise InvalidArgumentError("token must be a non-empty str")
        token = token.strip()  # as from a token file: a trailing newline is not the token's
    if transport == "fast":
        warnings.warn(
            "transport='fast' is deprecated; use transport='framed'", DeprecationWarning, 2
        )
        transport = "framed"
    if transport not in ("auto", "grpc", "framed"):
        raise InvalidArgumentError(
            f"transport must be 'auto', 'grpc' or 'framed', got {transport!r}"
        )
    tls = native_tls(tls_ca, tls_cert, tls_key, tls_domain)
    return RemoteClient(
        _native.Client(addresses, float(deadline_s), max_restarts, token, tls, etcds, transport)
    )


def native_tls(ca: Any, cert: Any, key: Any, domain: str | None) -> tuple[Any, ...] | None:
    """The TLS settings of a client, checked, as the native module takes them: ``(ca, cert,
    key, domain)`` with the paths as strings, or None without a CA (plain TCP). ``cert`` and
    ``key`` (mutual TLS) go together; all three need ``ca``."""
    if ca is None:
        if cert is not None or key is not None or domain is not None:
            raise InvalidArgumentError("tls_cert, tls_key and tls_domain need tls_ca")
        return None
    if (cert is None) != (key is None):
        raise InvalidArgumentError("tls_cert and tls_key go together")
    paths = [os.fspath(p) if p is not None else None for p in (ca, cert, key)]
    return (*paths, domain)
