"""The small library the benchmark scripts in python/benchmarks/ share (and the demo,
``examples/movielens_ctr.py``, for its model). The scripts run from their folder, so they
import it as ``lib``.

- ``records``: progress lines, the machine record (date, CPU, cores, commit) and the common end
  of a benchmark's ``main`` (goals, then JSON or a report).
- ``workloads``: Zipf-distributed ids (an inverse CDF, any exponent) and filling a table.
- ``timing``: latency and rate summaries under the keys each benchmark's JSON uses.
- ``ctr``: the CTR model's dense half (DLRM's dot interaction and MLP), shared by the demo and
  ``bench_cache_accuracy.py``.
"""
