"""What scoring writes costs the trainer: `apply_gradients` on a table that syncs, with
`embstore.Priority(k=99)` against without, paired in one process.

Two tables of one store that serves its sync port (so both keep sync state), filled alike;
each round trains one pass of batches on each, the order alternating; the figure is the
median over rounds of (time with priority) / (time without). A second pair uses a Python rule
(the paper's formula in numpy) to show what a callable costs.

    .venv/bin/python python/benchmarks/dissemination/priority_cost.py [--rows 1000000] [--json F]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import embstore


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def python_rule(u: dict) -> np.ndarray:
    """The paper's rule in numpy (what a user's callable costs)."""
    g = u["grad_l1"] / u["g_mean"] if u["g_mean"] > 0 else np.ones(len(u["key"]))
    f = u["freshness"] / u["f_mean"] if u["f_mean"] > 0 else np.ones(len(u["key"]))
    return (g + f) * u["p_m"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="ids drawn from (default 1M)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--batches", type=int, default=50, help="batches per pass")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", help="write the record there")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    store = embstore.Store()
    port = store.serve_sync()
    try:
        tables = {
            "off": store.create_table("off", a.dim, optimizer=embstore.Adagrad()),
            "on": store.create_table(
                "on", a.dim, optimizer=embstore.Adagrad(), priority=embstore.Priority(k=99)
            ),
            "rule": store.create_table(
                "rule",
                a.dim,
                optimizer=embstore.Adagrad(),
                priority=embstore.Priority(k=99, rule=python_rule),
            ),
        }
        zipf = np.minimum(rng.zipf(1.1, size=(a.batches, a.batch)), a.rows).astype(np.uint64)
        grads = rng.normal(0, 0.01, size=(a.batch, a.dim)).astype(np.float32)
        for t in tables.values():  # create the rows, warm the caches
            for ids in zipf:
                t.apply_gradients(ids, grads)
        times: dict[str, list[float]] = {k: [] for k in tables}
        cpu: dict[str, list[float]] = {k: [] for k in tables}
        for r in range(a.rounds):
            order = list(tables) if r % 2 == 0 else list(reversed(tables))
            for name in order:
                t = tables[name]
                start, cpu0 = time.perf_counter(), time.process_time()
                for ids in zipf:
                    t.apply_gradients(ids, grads)
                times[name].append(time.perf_counter() - start)
                # CPU time of every thread of the process: what the trainer pays, less the
                # machine's noise (time stolen by other guests counts in wall time only).
                cpu[name].append(time.process_time() - cpu0)
        ratios = {
            k: [on / off for on, off in zip(times[k], times["off"], strict=True)]
            for k in ("on", "rule")
        }
        cpu_ratios = {
            k: [on / off for on, off in zip(cpu[k], cpu["off"], strict=True)]
            for k in ("on", "rule")
        }
        rows_s = a.batches * a.batch / statistics.median(times["off"])
        rec = {
            "cpu": cpu_model(),
            "rows": a.rows,
            "dim": a.dim,
            "batch": a.batch,
            "batches": a.batches,
            "rounds": a.rounds,
            "rows_per_s_off": rows_s,
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_on_over_off": statistics.median(ratios["on"]),
            "ratio_on_range": [min(ratios["on"]), max(ratios["on"])],
            "ratio_rule_over_off": statistics.median(ratios["rule"]),
            "ratio_rule_range": [min(ratios["rule"]), max(ratios["rule"])],
            "cpu_ratio_on_over_off": statistics.median(cpu_ratios["on"]),
            "cpu_ratio_on_range": [min(cpu_ratios["on"]), max(cpu_ratios["on"])],
            "cpu_ratio_rule_over_off": statistics.median(cpu_ratios["rule"]),
            "significant_share": {
                k: tables[k].priority_stats()["significant"] / tables[k].priority_stats()["scored"]
                for k in ("on", "rule")
            },
        }
        on, rule = rec["ratio_on_over_off"], rec["ratio_rule_over_off"]
        lo, hi = rec["ratio_on_range"]
        share = rec["significant_share"]["on"]
        print(
            f"apply_gradients {rows_s:,.0f} rows/s without priority; with Priority(k=99) "
            f"{on:.3f}x the time ({lo:.3f}..{hi:.3f}), {rec['cpu_ratio_on_over_off']:.3f}x the "
            f"CPU time ({rec['cpu_ratio_on_range'][0]:.3f}..{rec['cpu_ratio_on_range'][1]:.3f}), "
            f"with a Python rule {rule:.3f}x; "
            f"significant {share:.4f} - {rec['cpu']}"
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rec, f, indent=1)
    finally:
        port.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
