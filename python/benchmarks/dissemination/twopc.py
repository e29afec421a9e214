"""The pure parts of the 2PC baseline (spec section 9, ``--sync 2pc``, the paper's "Adam"): the
frame format, the primary's commit rule, and the load arithmetic (rho of the 2PC primary, the
checkpoint-broadcast cycle).

Frames are length-prefixed, little-endian: ``u32 length`` (of what follows), ``u8 kind``, ``i64
batch``, ``u32 rows``, then for a PREPARE ``rows`` int64 keys and ``rows * dim`` float32 values
(numpy ``tobytes``); ACK, COMMIT and END carry no rows.
"""

from __future__ import annotations

import struct

import numpy as np

PREPARE, ACK, COMMIT, END = 1, 2, 3, 4
HEADER = struct.Struct("<IBqI")  # length, kind, batch, rows
assert HEADER.size == 17
FRAME_OVERHEAD = HEADER.size
# Bytes a row costs on the primary's NIC: 8 B key + 4 B per value, plus 4.6 % for what each batch
# adds per backup (the PREPARE header, the COMMIT frame, TCP/IP headers: wan2.sh's links have a
# 60,000-byte MTU, so a batch is about one segment). Measured on the WAN at 3 DCs x 3: 75-78 B
# per row and copy, both directions; at 10 DCs x 3, where a batch holds 14-34 rows, more
# (``twopc_peer.py`` records the measured load as ``primary_nic_load_measured``).
WIRE_FACTOR = 1514 / 1448  # the nominal 4.6 % (the rates of the recorded runs follow from it)


def encode(kind: int, batch: int, keys: np.ndarray | None = None, values=None) -> bytes:
    """One frame; ``keys`` (int64) and ``values`` (float32 ``[rows, dim]``) only for PREPARE."""
    if keys is None:
        return HEADER.pack(HEADER.size - 4, kind, batch, 0)
    k = np.ascontiguousarray(keys, dtype="<i8").tobytes()
    v = np.ascontiguousarray(values, dtype="<f4").tobytes()
    return HEADER.pack(HEADER.size - 4 + len(k) + len(v), kind, batch, len(keys)) + k + v


def decode_header(buf: bytes) -> tuple[int, int, int, int]:
    """``(length, kind, batch, rows)`` of a frame's first :data:`HEADER` bytes."""
    return HEADER.unpack_from(buf)


def decode_rows(body: bytes, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values of a PREPARE's body (the bytes after the header), copied."""
    keys = np.frombuffer(body, dtype="<i8", count=rows).copy()
    values = np.frombuffer(body, dtype="<f4", offset=8 * rows, count=rows * dim).copy()
    return keys, values.reshape(rows, dim)


def row_wire_bytes(dim: int) -> float:
    """What one row of a PREPARE costs on the wire, headers included."""
    return (8 + 4 * dim) * WIRE_FACTOR


class CommitRule:
    """The primary's rule: batch ``n`` commits once every one of ``backups`` has acked its
    PREPARE and ``n - 1`` has committed. :meth:`ack` returns the batches that commit now, in
    order.

    >>> c = CommitRule(2)
    >>> c.ack(1), c.ack(0), c.ack(1), c.ack(0)
    ([], [], [], [0, 1])
    """

    def __init__(self, backups: int) -> None:
        if backups < 1:
            raise ValueError("2PC needs at least one backup")
        self.backups = backups
        self.acks: dict[int, int] = {}
        self.next = 0  # the oldest batch not committed yet

    def ack(self, batch: int) -> list[int]:
        if batch < self.next:
            raise ValueError(f"ack of batch {batch}, which has committed")
        got = self.acks.get(batch, 0) + 1
        if got > self.backups:
            raise ValueError(f"batch {batch} acked {got} times by {self.backups} backups")
        self.acks[batch] = got
        out = []
        while self.acks.get(self.next) == self.backups:
            del self.acks[self.next]
            out.append(self.next)
            self.next += 1
        return out


def rho_2pc(rate: float, dim: int, replicas_total: int, nic_mbit: float) -> float:
    """The NIC load 2PC needs at its one primary: ``(R_total - 1)`` copies of every row.

    >>> round(rho_2pc(5140, 16, 9, 50), 2)
    0.5
    """
    return (replicas_total - 1) * rate * row_wire_bytes(dim) * 8 / (nic_mbit * 1e6)


def rate_for_rho_2pc(target: float, dim: int, replicas_total: int, nic_mbit: float) -> float:
    """The rate (rows/s) at which :func:`rho_2pc` is ``target``."""
    return target * nic_mbit * 1e6 / 8 / (replicas_total - 1) / row_wire_bytes(dim)


def checkpoint_cycle_s(
    table_bytes: float, dcs: int, servers: int, nic_mbit: float, wan_mbit: float
) -> dict[str, float]:
    """One checkpoint-broadcast cycle on ``wan2.sh``'s network: the primary sends the table to
    every other DC's leader (``dcs - 1`` copies through its one NIC; each copy also needs its
    DC pair's WAN class), then every leader copies it to its ``servers - 1`` peers (through the
    leader's NIC, in parallel across DCs). Returns the two stages and the cycle in seconds, and
    the mean visibility latency of an update under back-to-back cycles: it waits for the next
    cycle to start (half a cycle on average) and then a whole cycle, 1.5 cycles.

    >>> c = checkpoint_cycle_s(6.25e6, 3, 3, 50, 48)
    >>> c["wan_stage_s"], c["dc_stage_s"], c["cycle_s"], c["mean_latency_s"]
    (2.0, 2.0, 4.0, 6.0)
    """
    nic = nic_mbit * 1e6 / 8
    wan = wan_mbit * 1e6 / 8
    copies = dcs - 1
    wan_stage = max(copies * table_bytes / nic, table_bytes / wan) if copies else 0.0
    dc_stage = (servers - 1) * table_bytes / nic
    cycle = wan_stage + dc_stage
    return {
        "wan_stage_s": round(wan_stage, 3),
        "dc_stage_s": round(dc_stage, 3),
        "cycle_s": round(cycle, 3),
        "mean_latency_s": round(1.5 * cycle, 3),
    }
