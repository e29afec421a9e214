"""A minimal Redis client (RESP2) on a plain socket: enough for the Redis peer's writer and
monitor (pipelined SETs, ``INFO replication``, ``ROLE``), with none of redis-py's per-command
overhead on a 2-core box."""

from __future__ import annotations

import socket


def command(*args: bytes | str | int) -> bytes:
    """One command in RESP (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class RespError(RuntimeError):
    """An error reply, or a reply the caller did not expect."""


class Conn:
    """A buffered reader of replies over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_line(self) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._fill()
        out = bytes(self.buf[:i])
        del self.buf[: i + 2]
        return out

    def reply(self):
        """One reply: str for +, int for :, bytes (or None) for $, list for *."""
        line = self.read_line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.read_exact(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RespError(f"bad reply line {line[:80]!r}")

    def call(self, *args):
        self.sock.sendall(command(*args))
        return self.reply()

    def expect_oks(self, n: int) -> None:
        """Read ``n`` ``+OK`` replies (pipelined SETs)."""
        got = self.read_exact(5 * n)
        if got != b"+OK\r\n" * n:
            i = got.find(b"-")
            raise RespError(f"a SET failed: {got[i : i + 120]!r}" if i >= 0 else "bad SET reply")


def info_fields(text: bytes) -> dict[str, str]:
    """The ``key:value`` lines of an INFO reply."""
    out = {}
    for ln in text.decode().splitlines():
        if ":" in ln and not ln.startswith("#"):
            k, v = ln.split(":", 1)
            out[k] = v
    return out
