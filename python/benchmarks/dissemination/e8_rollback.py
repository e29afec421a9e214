"""E8 (Ekko Fig 10, scaled): rolling a model back through witnesses against reloading it.

Set-up (``../shared/specs/ekko.md`` §8.4 E8, scaled ÷100): ``--shards`` trainers (default 5),
each a store with one table of ``--rows`` rows of dim 16 serving its sync port; each has a
witness that follows it through its own link of ``--mbit`` Mbit/s each way (8: a ÷100 NIC), a
token-bucket TCP relay in this process. A model monitor in a real etcd records healthy
windows, so the witnesses flush; then each trainer writes a bad update to the distinct rows a
window of ``W`` seconds would touch at ``--churn`` of the rows a minute (0.5 %, as the paper's
update-heavy model), and ``embstore.witness.rollback`` undoes it. The reload it is compared
with moves every byte of the table over the same link: a fresh replica syncs each shard whole
(measured as the witnesses' first catch-up, all shards at once, each on its own link).

Reports per window: the rollback's time (all of it, and the ③④ step the paper times:
the diff's write), rows written, the reload time, and their ratio. The windows are emulated by
their rows (the bad update is written at once, not spread over W seconds): what a rollback
costs depends on the distinct rows changed since t_max, not on how long they took.

    python python/benchmarks/dissemination/e8_rollback.py --json OUT.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import embstore
from embstore.witness import Witness, rollback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lib.records import cpu_model

D = 16


class Bucket:
    """A token bucket of ``rate`` bytes/s (one direction of a link)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.t = time.monotonic()
        self.tokens = 0.0

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.tokens + (now - self.t) * self.rate, self.rate * 0.05)
            self.t = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class Link:
    """A TCP relay to ``target`` limited to ``mbit`` each way; ``address`` is its end."""

    def __init__(self, target: str, mbit: float) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.up, self.down = Bucket(mbit * 1e6 / 8), Bucket(mbit * 1e6 / 8)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = False
        self.bytes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            for a, b, bucket in ((c, s, self.up), (s, c, self.down)):
                threading.Thread(target=self._pump, args=(a, b, bucket), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, bucket: Bucket) -> None:
        try:
            while True:
                data = a.recv(16384)
                if not data:
                    break
                bucket.take(len(data))
                self.bytes += len(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()


class Etcd:
    def __init__(self, dir: pathlib.Path) -> None:
        if not shutil.which("etcd"):
            sys.exit("etcd is not installed: `make services` installs etcd-server")
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{ports[0]}"
        peer = f"http://127.0.0.1:{ports[1]}"
        self.proc = subprocess.Popen(
            [
                *("etcd", "--data-dir", str(dir), "--listen-client-urls", self.url),
                *("--advertise-client-urls", self.url, "--listen-peer-urls", peer),
                *("--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                embstore.model.models(self.url)
                break
            except embstore.EmbstoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def healthy_now(monitor: embstore.ModelMonitor) -> None:
    """Three good 1-s windows up to the last whole second: healthy up to then."""
    time.sleep(1.05 - math.modf(time.time())[0])
    end = math.floor(time.time())
    for w in range(end - 3, end):
        monitor.report(w, 100, 1000, variant="live")
        monitor.report(w, 100, 1000, variant="baseline")
    monitor.advance(watermark=end + 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1 << 20, help="rows per shard (2^20)")
    ap.add_argument("--mbit", type=float, default=8.0, help="each link, each way (8)")
    ap.add_argument("--churn", type=float, default=0.005, help="share of rows a minute (0.005)")
    ap.add_argument("--windows", default="10,60,300", help="seconds rolled back (10,60,300)")
    ap.add_argument("--quick", action="store_true", help="2^18 rows a shard, windows 10,60")
    ap.add_argument("--json", help="write the record here")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.windows = 1 << 18, "10,60"
    windows = [float(w) for w in args.windows.split(",")]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="e8-"))
    etcd = Etcd(tmp / "etcd")
    trainers, ports, links, wits = [], [], [], []
    rng = np.random.default_rng(8)
    try:
        print(
            f"E8: {args.shards} shards x {args.rows:,} rows x dim {D}, links {args.mbit} Mbit/s",
            flush=True,
        )
        for i in range(args.shards):
            s = embstore.Store(replica_id=1 + i)
            t = s.create_table("item", embedding_dim=D)
            ids = np.arange(args.rows, dtype=np.uint64)
            for a in range(0, args.rows, 1 << 16):
                t.assign(
                    ids[a : a + (1 << 16)],
                    rng.standard_normal((min(1 << 16, args.rows - a), D)).astype(np.float32),
                )
            trainers.append(s)
            ports.append(s.serve_sync())
            links.append(Link(ports[-1].address, args.mbit))
        monitor = embstore.ModelMonitor("ctr", etcd=etcd.url, window_s=1.0, lateness_s=0.0)
        t0 = time.monotonic()
        for i in range(args.shards):
            wits.append(
                Witness(
                    links[i].address,
                    model="ctr",
                    etcd=etcd.url,
                    data_dir=tmp / f"w{i}",
                    name=f"w{i}",
                ).start()
            )
        for w in wits:
            assert w.wait_caught_up(3600)
        reload_s = time.monotonic() - t0
        reload_bytes = sum(link.bytes for link in links)
        print(
            f"reload (every shard whole over its link, in parallel): {reload_s:.1f} s, "
            f"{reload_bytes / 1e6:.1f} MB",
            flush=True,
        )
        results = []
        for window in windows:
            for _ in range(3):  # a healthy decision, until every witness flushed everything
                healthy_now(monitor)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(
                    w.stats()["tables"]["item"]["logged_keys"] for w in wits
                ):
                    time.sleep(0.05)
            assert not any(w.stats()["tables"]["item"]["logged_keys"] for w in wits), "no flush"
            n = round(args.churn * args.rows * window / 60)
            bad = {}
            for i, s in enumerate(trainers):
                ids = rng.choice(args.rows, n, replace=False).astype(np.uint64)
                bad[i] = (ids, s["item"].lookup(ids[:16]).copy())
                s["item"].assign(ids, np.full((n, D), 99.0, np.float32))
            for w in wits:
                assert w.wait_caught_up(600)
            before = sum(link.bytes for link in links)
            out = rollback("ctr", etcd.url, say=lambda line: print("  " + line, flush=True))
            moved = sum(link.bytes for link in links) - before
            for i, s in enumerate(trainers):
                ids, want = bad[i]
                assert np.array_equal(s["item"].lookup(ids[:16]), want), "not restored"
            r = {
                "window_s": window,
                "rows_per_shard": n,
                "rows_written": out["rows"],
                "rollback_s": out["seconds"],
                "write_s": out["steps"]["③④ diff written"],
                "steps": out["steps"],
                "link_bytes": moved,
                "reload_s": reload_s,
                "ratio_total": reload_s / out["seconds"],
                "ratio_write": reload_s / out["steps"]["③④ diff written"],
            }
            print(
                f"window {window:g} s: {n:,} rows a shard, rollback {out['seconds']:.2f} s "
                f"(diff written in {r['write_s']:.2f} s), {moved / 1e6:.2f} MB over the links; "
                f"reload {reload_s:.1f} s: {r['ratio_total']:.0f}x ({r['ratio_write']:.0f}x "
                "the write step)",
                flush=True,
            )
            results.append(r)
        record = {
            "experiment": "E8 rollback vs reload",
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "shards": args.shards,
            "rows": args.rows,
            "dim": D,
            "mbit": args.mbit,
            "churn_per_min": args.churn,
            "reload_s": reload_s,
            "reload_bytes": reload_bytes,
            "results": results,
            "command": " ".join(sys.argv),
        }
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(record, indent=1))
    finally:
        for w in wits:
            w.stop()
        for link in links:
            link.stop()
        for p in ports:
            p.stop()
        for s in trainers:
            s.close()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
