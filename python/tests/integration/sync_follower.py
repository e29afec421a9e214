"""A follower for the dissemination tests over the emulated WAN: ``Store.follow(SOURCE)``
(in memory, joining empty), then, until stopped:

- a reader thread looks up BATCH random keys of ``item`` (``on_miss="zeros"``, as serving
  does) every 20 ms, counting lookups, errors, and rows that are neither absent (zeros) nor
  a row the writer could have written (``sync_writer.py``: ``[key, c, 2c, 1]``), and
  those made before its first caught-up round (``lookups_joining``);
- every 0.2 s it writes ``{"t", "status": sync_status()[0], "lookups", "lookups_joining",
  "lookup_errors", "bad_rows", "last_lookup_error"}`` to STATUS.json (replaced atomically);
- on a line ``dump PATH`` on stdin it waits for two caught-up rounds that end after the
  request (the second starts after it), writes every row to PATH (npz: ``ids``,
  ``values``) and prints ``dumped <rows> caught-up|not-caught-up``.

It prints ``following <source>`` once ``follow`` returned.

    python sync_follower.py SOURCE KEYS STATUS.json
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

import embstore

BATCH = 256


def main() -> None:
    source, keys, status_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = embstore.Store.follow(source, token="t0ken")
    t = store["item"]
    print(f"following {source}", flush=True)
    stats = {
        "lookups": 0,
        "lookups_joining": 0,
        "lookup_errors": 0,
        "bad_rows": 0,
        "last_lookup_error": None,
    }
    joined = False
    stop = threading.Event()

    def reader() -> None:
        nonlocal joined
        rng = np.random.default_rng()
        while not stop.wait(0.02):
            joined = joined or store.sync_status()[0]["caught_up"]
            ids = rng.integers(0, keys, size=BATCH)
            try:
                v = t.lookup(ids, on_miss="zeros")
            except Exception as e:  # counted: the test asserts there are none
                stats["lookup_errors"] += 1
                stats["last_lookup_error"] = repr(e)
                continue
            absent = ~v.any(axis=1)
            c = v[:, 1]
            ok = (v[:, 0] == ids) & (v[:, 2] == 2 * c) & (v[:, 3] == 1) & (c >= 0)
            stats["bad_rows"] += int((~(absent | ok)).sum())
            stats["lookups"] += 1
            stats["lookups_joining"] += not joined

    def reporter() -> None:
        tmp = status_path + ".tmp"
        while not stop.wait(0.2):
            (s,) = store.sync_status()
            with open(tmp, "w") as f:
                json.dump({"t": time.time(), "status": s, **stats}, f)
            os.replace(tmp, status_path)

    def caught_up_after(since: float, timeout: float = 30.0) -> bool:
        """Whether a round that ended after ``since`` left nothing pending (polled here:
        ``Store.wait_caught_up`` would hang while the other threads call ``sync_status``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (s,) = store.sync_status()
            if s["caught_up"] and s["last_round_ms"] > since * 1000:
                return True
            time.sleep(0.01)
        return False

    threads = [threading.Thread(target=f, daemon=True) for f in (reader, reporter)]
    for th in threads:
        th.start()
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "dump":
            ok = caught_up_after(time.time()) and caught_up_after(time.time())
            ids, values = [], []
            for chunk in t.export(8192):
                ids.append(chunk.ids)
                values.append(chunk.values)
            ids_a = np.concatenate(ids) if ids else np.zeros(0, np.int64)
            values_a = np.concatenate(values) if values else np.zeros((0, 4), np.float32)
            order = np.argsort(ids_a)
            np.savez(arg, ids=ids_a[order], values=values_a[order])
            print(f"dumped {len(ids_a)} {'caught-up' if ok else 'not-caught-up'}", flush=True)
    stop.set()


if __name__ == "__main__":
    main()
