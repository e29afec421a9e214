"""The test users' lookups in data centre 2, for ``movielens_ctr.py --follower-dc``.

Runs inside DC 2's network namespace (the demo starts it there), connects to the follower's
serving port with ``embstore.connect`` and answers the demo over its stdin/stdout, one request
at a time: ``TABLE N\\n`` and N int64 ids in; ``rows N D\\n`` and N x D float32 values out (zeros
for ids the follower holds no row of), or ``error MESSAGE\\n``. It prints ``ready`` once
connected and stops at the end of its input.

    python examples/dc_lookup_client.py 198.18.2.1:7000
"""

from __future__ import annotations

import sys

import numpy as np

import embstore
from embstore.errors import EmbstoreError


def main(address: str) -> int:
    client = embstore.connect(address, deadline_s=10.0)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    while line := inp.readline():
        table, n = line.decode().split()
        ids = np.frombuffer(inp.read(8 * int(n)), np.int64)
        try:
            rows = np.ascontiguousarray(client.lookup(table, ids), np.float32)
        except EmbstoreError as e:
            out.write(f"error {str(e).replace(chr(10), ' ')}\n".encode())
        else:
            out.write(f"rows {rows.shape[0]} {rows.shape[1]}\n".encode() + rows.tobytes())
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
