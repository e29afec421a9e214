"""The batch-query service from Python: :class:`Server` (what ``embstore serve`` runs) and
its client, ``embstore.connect``.

A server serves every table of a store directory as version 1 (or what a cluster assigns it).
A client reads every row of a batch at ONE table version, fanned out to the shards of that
version (docs/serving.md):

    >>> import tempfile, numpy as np, embstore
    >>> path = tempfile.mkdtemp()
    >>> store = embstore.Store(path)
    >>> user = store.create_table("user", embedding_dim=4)
    >>> user.assign([1, 2], np.ones((2, 4), np.float32))
    >>> store.close()                                   # the server opens the directory
    >>> with embstore.Server(path) as server:           # serves in a thread of its own
    ...     client = embstore.connect(server.address)
    ...     rows, version = client.lookup("user", [1, 3], return_version=True)
    >>> rows.tolist(), version                          # a missing id gets zeros
    ([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], 1)
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from embstore import _native
from embstore._arrays import as_ids
from embstore.errors import InvalidArgumentError

__all__ = ["RemoteClient", "Server", "connect"]


class Server:
    """A batch-query server in this process: what ``embstore serve`` runs, with its options
    as keywords (``embstore serve --help`` says what each does). It binds its ports when made
    (``address`` is known at once: port 0 picks one); :meth:`start` serves from a thread of its
    own and :meth:`run` from the caller's (until :meth:`stop`, SIGINT or SIGTERM);
    :meth:`close` stops it and lets go of its store directory and ports. ``with Server(...) as
    server:`` starts it and closes it at the end of the block.

    Args:
        store: a store directory whose tables are served as version 1 (``None``: none, loaded
            through admin calls or assigned by a cluster).
        listen: ``host:port`` of the gRPC port (port 0 picks one).
        memory_budget_bytes, data_dir: a memory budget for the tables served (rows beyond it
            on disk, under ``data_dir`` or a new directory under ``$TMPDIR``).
        framed_listen: the framed lookup path's TCP port: ``"auto"`` (the default: a port
            next to ``listen``), ``"host:port"``, or ``None`` (off); ``framed_unix`` a Unix
            socket for clients on this host.
        metrics: ``host:port`` of ``GET /metrics``; ``admin`` takes admin calls.
        read_token, admin_token: tokens the calls must carry.
        tls_cert, tls_key, tls_client_ca: PEM files: TLS on every port, mutual with a CA.
        etcd, advertise, lease_ttl_s: join the cluster in etcd (``http://host:port`` or a
            list); with ``dc``, ``etcd`` is where sync members find each other instead.
        sync_listen, sync_token, follow, replica_id, dc, sync_*: the sync port and the
            follower (docs/dissemination.md); ``follow=""`` finds its source in etcd.
        catch_up_timeout_s: a follower serves once caught up, or after this long.
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | None = None,
        listen: str = "127.0.0.1:0",
        *,
        memory_budget_bytes: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        max_batch: int | None = None,
        framed_listen: str | None = "auto",
        framed_unix: str | os.PathLike[str] | None = None,
        metrics: str | None = None,
        admin: bool = False,
        read_token: str | None = None,
        admin_token: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_client_ca: str | os.PathLike[str] | None = None,
        etcd: str | list[str] | None = None,
        advertise: str | None = None,
        lease_ttl_s: float = 10.0,
        sync_listen: str | None = None,
        sync_token: str | None = None,
        follow: str | None = None,
        replica_id: int | None = None,
        dc: str | None = None,
        sync_advertise: str | None = None,
        sync_events: str | os.PathLike[str] | None = None,
        sync_tls_ca: str | os.PathLike[str] | None = None,
        sync_tls_cert: str | os.PathLike[str] | None = None,
        sync_tls_key: str | os.PathLike[str] | None = None,
        sync_tls_domain: str | None = None,
        sync_cache: bool = True,
        sync_shard_versions: bool = True,
        sync_tombstone_horizon_s: float = 3600.0,
        sync_with_state: bool = False,
        sync_priority: bool = True,
        sync_precision: str | None = None,
        catch_up_timeout_s: float = 60.0,
    ) -> None:
        etcds = None
        if etcd is not None:
            etcds = [etcd] if isinstance(etcd, str) else list(etcd)
            if not etcds or not all(isinstance(e, str) and e for e in etcds):
                raise InvalidArgumentError(
                    f"etcd must be 'http://host:port' or a list, got {etcd!r}"
                )
        if not isinstance(sync_tombstone_horizon_s, int | float) or not (
            0 <= sync_tombstone_horizon_s < 2**53 / 1000
        ):
            raise InvalidArgumentError(
                f"sync_tombstone_horizon_s must be seconds >= 0, got {sync_tombstone_horizon_s!r}"
            )
        path = lambda p: None if p is None else os.fspath(p)  # noqa: E731
        kwargs: dict[str, Any] = {}
        if max_batch is not None:
            kwargs["max_batch"] = max_batch
        self._inner = _native.Server(
            path(store),
            listen,
            memory_budget_bytes=memory_budget_bytes,
            admin=admin,
            metrics=metrics,
            read_token=read_token,
            admin_token=admin_token,
            tls_cert=path(tls_cert),
            tls_key=path(tls_key),
            tls_client_ca=path(tls_client_ca),
            etcd=None if dc else etcds,
            advertise=advertise,
            lease_ttl_s=lease_ttl_s,
            data_dir=path(data_dir),
            sync_listen=sync_listen,
            sync_token=sync_token,
            follow=follow,
            replica=replica_id,
            sync_events=path(sync_events),
            sync_etcd=etcds if dc else None,
            dc=dc,
            sync_advertise=sync_advertise,
            sync_tls_ca=path(sync_tls_ca),
            sync_tls_cert=path(sync_tls_cert),
            sync_tls_key=path(sync_tls_key),
            sync_tls_domain=sync_tls_domain,
            sync_cache=sync_cache,
            sync_shard_versions=sync_shard_versions,
            sync_tombstone_horizon_ms=int(sync_tombstone_horizon_s * 1000),
            sync_with_state=sync_with_state,
            sync_priority=sync_priority,
            sync_precision=sync_precision,
            catch_up_timeout_s=catch_up_timeout_s,
            framed_listen=framed_listen,
            framed_unix=path(framed_unix),
            **kwargs,
        )
        self._address = str(self._inner.address)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _server(self) -> Any:
        if self._inner is None:
            raise InvalidArgumentError(f"the server of {self._address} is closed")
        return self._inner

    @property
    def address(self) -> str:
        """``host:port`` of the gRPC port (the one the OS chose for port 0)."""
        return self._address

    @property
    def framed_address(self) -> str | None:
        """``host:port`` of the framed lookup path's TCP port, if offered."""
        return self._server().framed_address

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of ``GET /metrics``, if asked for."""
        return self._server().metrics_address

    @property
    def sync_address(self) -> str | None:
        """``host:port`` of the sync port, if one runs."""
        return self._server().sync_address

    @property
    def tables(self) -> list[str]:
        """Names of the tables served from ``store`` (each as version 1)."""
        return list(self._server().tables)

    def sync_status(self) -> list[dict[str, Any]]:
        """Where each followed table stands (empty when the server follows nothing)."""
        return list(self._server().sync_status())

    def run(self) -> None:
        """Serve until :meth:`stop` (from another thread), SIGINT or SIGTERM; then stop
        accepting, finish the requests in flight and return. Once only."""
        self._server().run()

    def start(self) -> Server:
        """Serve from a thread of the server's own; returns the server."""
        inner = self._server()
        if self._thread is not None:
            raise InvalidArgumentError("the server was started already")

        def serve() -> None:
            try:
                inner.run()
            except BaseException as e:  # raised by stop()
                self._error = e

        self._thread = threading.Thread(target=serve, name="embstore-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (requests in flight finish); after :meth:`start`, wait for its thread
        and raise what ended it, if anything did."""
        if self._inner is None:
            return
        self._inner.stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
            error, self._error = self._error, None
            if error is not None:
                raise error

    def close(self) -> None:
        """Stop serving and let go of the store directory and the ports (another server, or
        a :class:`~embstore.Store`, may open the directory then); a no-op when closed."""
        try:
            self.stop()
        finally:
            self._inner = None

    def __enter__(self) -> Server:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.__dict__.get("_inner") is None:
            return f"Server(address={self.__dict__.get('_address')!r}, closed)"
        return f"Server(address={self.address!r}, tables={self.tables!r})"


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
