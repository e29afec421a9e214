"""The 2PC baseline's processes (started by ``twopc_peer.py`` in the WAN's namespaces).

``twopc_node.py backup --listen HOST:PORT --rows N --dim D --events FILE``: a backup. It takes one
connection (the primary's), stages every PREPARE(n, rows) and acks it at once, and on COMMIT(n)
applies the staged batches up to ``n``, in order, to its in-memory table (a float32 array), then
appends ``t_us u64 | batch i64`` (wall clock µs since the Unix epoch, after the apply) to
``FILE``. END or end of the connection stops it.

``twopc_node.py primary --backups HOST:PORT... --trace JSON --out FILE``: the primary and its
writer, one asyncio thread. It connects to every backup (direct, primary-backup fan-out), warms
the connections up with ``--warm-s`` seconds of the trace's first batches at the trace's rate (2PC
batches 0..W-1, waited for until committed; not measured), prints ``ready N W`` (N trace
batches, the first of them is 2PC batch W), and on ``go`` replays the trace (the same batches as
``ekko_writer.py``): per batch window it stamps the batch accepted (wall clock µs: the commit time
of the latency, so queueing counts) and writes PREPARE to every backup without waiting for
anything (pipelined); a backup's unsent bytes are bounded by ``--max-inflight`` (the replay waits
for that one backup to drain below it). An ACK may commit batches (:class:`twopc.CommitRule`);
COMMIT(n) goes to every backup. After the last batch it waits for the last commit (at most
``--drain`` s), sends END, writes ``--out`` (npz: ``accept_us``, ``commit_us``, ``rows`` per
batch; ``first_batch`` = W) and prints ``done {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import socket
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dissemination import twopc
from dissemination.trace import Trace


def _addr(s: str) -> tuple[str, int]:
    host, port = s.rsplit(":", 1)
    return host, int(port)


def _recv_exact(f, n: int) -> bytes:
    buf = f.read(n)
    if len(buf) != n:
        raise EOFError
    return buf


def backup(args) -> int:
    table = np.zeros((args.rows, args.dim), dtype=np.float32)
    srv = socket.create_server(_addr(args.listen))
    print(f"listening {args.listen}", flush=True)
    conn, _ = srv.accept()
    srv.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rf = conn.makefile("rb", buffering=1 << 20)
    staged: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    applied = -1
    ev = open(args.events, "wb", buffering=0)
    rec = np.zeros(1, dtype=[("t_us", "<u8"), ("batch", "<i8")])
    try:
        while True:
            head = _recv_exact(rf, twopc.HEADER.size)
            length, kind, n, rows = twopc.decode_header(head)
            body = _recv_exact(rf, length + 4 - twopc.HEADER.size) if rows else b""
            if kind == twopc.PREPARE:
                staged[n] = twopc.decode_rows(body, rows, args.dim)
                conn.sendall(twopc.encode(twopc.ACK, n))
            elif kind == twopc.COMMIT:
                while applied < n:
                    keys, values = staged.pop(applied + 1)
                    table[keys] = values  # in batch order: the last write of a key wins
                    applied += 1
                rec["t_us"] = time.time_ns() // 1000
                rec["batch"] = n
                ev.write(rec.tobytes())
            elif kind == twopc.END:
                break
    except (EOFError, ConnectionError):
        pass
    finally:
        ev.close()
        conn.close()
    return 0


class Primary:
    def __init__(self, args) -> None:
        self.args = args
        self.trace = Trace(**json.loads(args.trace))
        self.writers: list[asyncio.StreamWriter] = []
        self.rule = twopc.CommitRule(len(args.backups))
        self.committed = asyncio.Event()
        self.last = -1  # the last batch to commit (set when the replay ends)
        self.commit_us: list[int] = []
        self.waits = 0

    async def read_acks(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                head = await reader.readexactly(twopc.HEADER.size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            _, kind, n, _ = twopc.decode_header(head)
            if kind != twopc.ACK:
                continue
            for c in self.rule.ack(n):
                frame = twopc.encode(twopc.COMMIT, c)
                for w in self.writers:
                    w.write(frame)
                self.commit_us.append(time.time_ns() // 1000)
                if c == self.last:
                    self.committed.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        acks = []
        for b in self.args.backups:
            deadline = time.monotonic() + 60
            while True:
                try:
                    reader, writer = await asyncio.open_connection(*_addr(b))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            writer.transport.get_extra_info("socket").setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )
            writer.transport.set_write_buffer_limits(high=self.args.max_inflight)
            self.writers.append(writer)
            acks.append(asyncio.create_task(self.read_acks(reader)))
        keys, values = self.trace.keys_values()
        batches = list(self.trace.batches())
        warm = [b for b in batches if b[0] <= self.args.warm_s]
        self.last = len(warm) - 1
        t0 = time.monotonic()
        for i, (due, a, b) in enumerate(warm):
            wait = t0 + due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            frame = twopc.encode(twopc.PREPARE, i, keys[a:b], values[a:b])
            for w in self.writers:
                w.write(frame)
        if warm:
            await asyncio.wait_for(self.committed.wait(), 60)
        self.committed.clear()
        first = len(warm)
        self.commit_us.clear()
        print(f"ready {len(batches)} {first}", flush=True)
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        while (await stdin.readline()).strip() != b"go":
            pass
        accept = np.zeros(len(batches), dtype=np.int64)
        rows = np.zeros(len(batches), dtype=np.int64)
        self.last = first + len(batches) - 1
        late = 0
        t0 = time.monotonic()
        cpu0 = time.process_time()
        for i, (due, a, b) in enumerate(batches):
            wait = t0 + due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -0.1:
                late += 1
            accept[i] = time.time_ns() // 1000
            rows[i] = b - a
            frame = twopc.encode(twopc.PREPARE, first + i, keys[a:b], values[a:b])
            for w in self.writers:
                w.write(frame)
            for w in self.writers:  # the in-flight bound: wait only for a backup over it
                if w.transport.get_write_buffer_size() >= self.args.max_inflight:
                    self.waits += 1
                    await w.drain()
        elapsed = time.monotonic() - t0
        try:
            await asyncio.wait_for(self.committed.wait(), self.args.drain)
        except TimeoutError:
            pass
        for w in self.writers:
            w.write(twopc.encode(twopc.END, -1))
        for w in self.writers:
            try:
                await asyncio.wait_for(w.drain(), 5)
            except (TimeoutError, ConnectionError):
                pass
        commit = np.full(len(batches), -1, dtype=np.int64)
        commit[: len(self.commit_us)] = self.commit_us
        np.savez(self.args.out, accept_us=accept, commit_us=commit, rows=rows, first_batch=first)
        done = {
            "elapsed_s": elapsed,
            "cpu_s": time.process_time() - cpu0,
            "batches_late_100ms": late,
            "committed": len(self.commit_us),
            "batches": len(batches),
            "inflight_waits": self.waits,
        }
        print("done " + json.dumps(done), flush=True)
        for w in self.writers:
            w.close()
        for t in acks:
            t.cancel()
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    b = sub.add_parser("backup")
    b.add_argument("--listen", required=True)
    b.add_argument("--rows", type=int, required=True)
    b.add_argument("--dim", type=int, required=True)
    b.add_argument("--events", required=True)
    p = sub.add_parser("primary")
    p.add_argument("--backups", nargs="+", required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-inflight", type=int, default=64 << 20)
    p.add_argument("--drain", type=float, default=30)
    p.add_argument("--warm-s", type=float, default=2.0, help="warm-up seconds (default 2)")
    args = ap.parse_args()
    if args.role == "backup":
        return backup(args)
    return asyncio.run(Primary(args).run())


if __name__ == "__main__":
    sys.exit(main())
