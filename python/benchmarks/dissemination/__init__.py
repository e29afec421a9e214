"""The dissemination benchmarks over an emulated WAN (``../shared/tools/wan/wan2.sh``): a
training data centre replicates table rows to inference data centres.

- ``wan``: brings the emulated WAN up and always down; runs processes in a server's network
  namespace; opens sockets inside a namespace; counts WAN bytes (htb class counters).
- ``trace``: the seeded update trace (Zipf keys, D float32 rows, a rate) and the load knob rho.
- ``cpu``: box and per-process CPU over a run, and the 70 % discard rule.
- ``latency``: per-update latency (max over replicas of visible - commit) and its summary.
- ``resp``: a minimal Redis (RESP2) client on a plain socket, for the Redis peer.
- ``redis_peer``: the outside peer, Redis primary -> replica replication (runnable).

Times are integer microseconds of ``CLOCK_MONOTONIC`` (``time.monotonic_ns() // 1000``): every
process runs on the same host (network namespaces share the clock), so events from the writer,
the monitor and the replicas compare without skew.

The scripts run from ``python/benchmarks``'s folders, so they import this package as
``dissemination`` and the shared helpers as ``lib``.
"""
