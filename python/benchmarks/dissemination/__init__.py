"""The dissemination benchmarks over an emulated WAN (``../shared/tools/wan/wan2.sh``): a
training data centre replicates table rows to inference data centres.

- ``wan``: brings the emulated WAN up and always down; runs processes in a server's network
  namespace; opens sockets inside a namespace; counts WAN bytes (htb class counters).
- ``trace``: the seeded update trace (Zipf keys, D float32 rows, a rate) and the load knob rho.
- ``cpu``: box and per-process CPU over a run, and the 70 % discard rule.
- ``latency``: per-update latency (max over replicas of visible - commit) and its summary.
- ``resp``: a minimal Redis (RESP2) client on a plain socket, for the Redis peer.
- ``redis_peer``: the outside peer, Redis primary -> replica replication (runnable).
- ``ekko_peer``: embstore's own dissemination, a training store's sync port -> followers
  (``embstore serve --follow``), DC-leader or direct (runnable); ``ekko_writer`` is its
  primary-and-writer process.
- ``plot``: latency and WAN bytes per update vs rate from the runs' JSON records;
  ``compare.sh`` runs both peers and plots (docs/dissemination-results.md).
- The paper's baselines (docs/dissemination-baselines.md): ``twopc_peer`` (2PC primary-backup,
  the paper's "Adam"; runnable) with its processes in ``twopc_node`` and its pure parts (frames,
  commit rule, rho, checkpoint cycle) in ``twopc``; ``checkpoint_peer`` (a measured full-table
  transfer and the checkpoint-broadcast cycle); ``ekko_peer --ablation A0..A3`` (spec section 9);
  ``plot_baselines`` (E1 and E4 plots and tables).

Every process runs on the same host (network namespaces share the clocks), so events from the
writer, the monitor and the replicas compare without skew. The Redis peer uses integer
microseconds of ``CLOCK_MONOTONIC`` (``time.monotonic_ns() // 1000``); embstore's followers
stamp their sync events with the wall clock (µs since the Unix epoch), so its writer does too.

The scripts run from ``python/benchmarks``'s folders, so they import this package as
``dissemination`` and the shared helpers as ``lib``.
"""
