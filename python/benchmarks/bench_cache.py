"""Benchmark: the inference cache's perfect hits against libCacheSim, and its lookup latency.

Run from the repository root::

    .venv/bin/python python/benchmarks/bench_cache.py --json /tmp/bench_cache/full.json \\
        --plots docs/img                                   # all three (~25-30 min, 2 cores)
    .venv/bin/python python/benchmarks/bench_cache.py --quick       # small sizes (~2 min)
    .venv/bin/python python/benchmarks/bench_cache.py --parts latency

The metric is the *perfect hit*: a request whose keys (one per table) were all in memory
(design note ``evstore.md`` §1). Every figure comes from the one evaluator,
``embstore.cache.evaluate``, in ``prefix`` mode (warm on the first half of a trace, count the
second half) unless a table says otherwise; ``compulsory`` is the infinite-cache bound.

**Traces.** ML7 and ML11: MovieLens-100k, 100,000 requests x 7 or 11 tables (3,577 and
37,685 unique keys), from ``--ml-dir``. Synthetic: ``embstore._native.synthetic_trace``,
200,000 requests x 26 tables (sizes log-spaced 10..200k), 200k contexts ~ Zipf(1), co-access
rho in {0.3, 0.7, 0.9}, no drift; seeds 1..5 for the 5 % point (mean +- sd), seed 1 for the
size sweep, seed 0 only for tuning.

**1. policy** — L1 alone at equal *entries*. Ours: ``lru``, ``lfu`` (aging alpha 2),
``group_lfu`` (defaults: alpha 2, pinning), ``group_lfu`` tuned, ``ev_lfu_paper``, ``ev_arc``;
every libCacheSim policy of ``embstore.cache._libcachesim.available()`` (ClockPro, CAR and
Belady are not offered; the report says why). Sizes 0.5..90 % of the trace's unique keys,
at least G (the request size) entries; prefix mode at every size, online and replay at 5 %
(synthetic: seed 1 only). Tuning (no tuning on measured data): ``group_lfu``'s ``age_alpha``
from {none, 0.5, 1, 2, 4, 8} is chosen per size by prefix-mode perfect hits on another split
— ML: the first half of the trace alone, with the same entries as the measured run (the
reported prefix figure counts only the second half); synthetic: seed 0. libCacheSim costs
~1 us a key per pass, so the synthetic size sweep runs all sizes only for ``--sweep-rhos``
(0.7) and ``--reduced-sizes`` (1, 5, 20, 50 %) for the other rho.

**2. system** — L1+L2+L3 at equal *bytes*: B = 5 % of (unique keys x 4 D bytes), D 16 (and
36). Baselines get B / (4 D + 28) entries (28 B = GroupLfu's measured metadata per entry, as
if the policy ran inside our store). Ours: ``InferenceCache`` (``group_lfu`` defaults) over a
``Store`` holding a row for every id 0..max of each table: (a) f32; (b) f32 / int8 50/50;
(c) f32 / int4 25/75; (d) int8 / int4 50/50; (e) int4; (f) the best of a-e (by its measured
perfect hits) + surrogates built from access counts of the trace's first half (k 10, cosine,
max_dist 0.5; D in ``--surrogate-dims``). Nothing is trained: rows are Gaussian
N(0, 0.05^2), so surrogate *quality* is meaningless; only the served-minus-exact gain is
reported. ML11 and synthetic rho 0.7 seed 1.

**3. latency** — ML11 at D 16, the cache (``f32``, ``group_lfu``) warmed at a 5 % and a
100 % (all fits) budget, timed on second-half requests: ``cache.lookup`` (Python API) with
batches of 1 and 256 requests vs ``Table.lookup`` of the same ids (one call per table, as a
model would), ``numpy.take`` from dense per-table arrays and ``torch.nn.Embedding``. Latency
is per call (a call serves 1 or 256 requests); throughput in requests/s; the median of
``--reps`` (3) repetitions of each figure. No Rust-side number here.

The policy runs are independent tasks on ``--workers`` (2) processes; each task runs in a
fresh process forked from a clean server, so LeCaR and Cacheus (which draw from
libCacheSim's one unseedable generator) give the same figures on every run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import math
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import numpy as np
from lib.records import finish, log, run_record

import embstore
from embstore import _native
from embstore import cache as ecache
from embstore.cache import traces
from embstore.errors import InvalidArgumentError

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = (0.005, 0.01, 0.02, 0.05, 0.10, 0.20, 0.50, 0.90)
AT = 0.05  # the headline size (fraction of unique keys, or of fp32 bytes in part 2)
# group_lfu's default (2) first: choose_alpha breaks ties towards the first, and a tuning split
# that never evicts (90 % of ML7) ties every alpha.
ALPHAS: tuple[float | None, ...] = (2.0, None, 0.5, 1.0, 4.0, 8.0)
OURS = ("lru", "lfu", "group_lfu", "group_lfu_tuned", "ev_lfu_paper", "ev_arc")
GROUP_AWARE = ("group_lfu", "group_lfu_tuned", "ev_arc", "ev_lfu_paper")
TIERS: dict[str, dict[str, float]] = {
    "a": {"f32": 1.0},
    "b": {"f32": 0.5, "int8": 0.5},
    "c": {"f32": 0.25, "int4": 0.75},
    "d": {"int8": 0.5, "int4": 0.5},
    "e": {"int4": 1.0},
}
META = 28  # bytes of policy metadata per entry given to the baselines (GroupLfu's, measured)
SYN_TABLES = 26
RESULT_KEYS = (
    "perfect_hit",
    "served_perfect_hit",
    "individual_hit",
    "compulsory_bound",
    "mean_misses",
    "metadata_bytes_per_entry",
)


def lcs_available() -> list[str]:
    """libCacheSim's offered policies, or [] when libcachesim is not installed."""
    try:
        from embstore.cache import _libcachesim

        return _libcachesim.available()
    except ImportError:
        return []


def lcs_excluded() -> dict[str, str]:
    """The policies libCacheSim has that the wrapper refuses, with the reason."""
    from embstore.cache import _libcachesim

    names = {"clockpro": "ClockPro", "car": "CAR", "belady": "Belady"}
    return {names.get(k, k): v for k, v in _libcachesim._NOT_OFFERED.items()}


# --- traces (built where they are used: in the parent and in each task's process) -----------

_KEYS: dict[tuple, np.ndarray] = {}


def syn_spec(args: argparse.Namespace, rho: float, seed: int) -> tuple:
    return ("syn", rho, seed, args.syn_requests, args.syn_contexts, args.syn_max_table)


def ml_spec(args: argparse.Namespace, fields: int, half: bool = False) -> tuple:
    return ("ml", str(args.ml_dir), fields, args.ml_requests, half)


def spec_name(spec: tuple) -> str:
    if spec[0] == "ml":
        return f"ml{spec[2]}" + ("_first_half" if spec[4] else "")
    return f"syn_rho{spec[1]}"


def load(spec: tuple) -> tuple[np.ndarray, list[str]]:
    """``(keys uint64[N, G], table names)`` of a trace spec (cached per process)."""
    if spec not in _KEYS:
        if spec[0] == "ml":
            _, path, fields, n, half = spec
            tr = traces.movielens(path, fields=fields)
            keys = tr.keys[:n] if n else tr.keys
            if half:
                keys = keys[: len(keys) // 2]
            _KEYS[spec] = np.ascontiguousarray(keys)
        else:
            _, rho, seed, n, contexts, max_table = spec
            _KEYS[spec] = _native.synthetic_trace(
                num_requests=n,
                num_tables=SYN_TABLES,
                num_contexts=contexts,
                max_table_size=max_table,
                rho=rho,
                drift=0.0,
                seed=seed,
            )
    keys = _KEYS[spec]
    names = (
        list(traces.ML_FIELDS[: spec[2]])
        if spec[0] == "ml"
        else [f"t{i}" for i in range(SYN_TABLES)]
    )
    return keys, names


def capacity_of(run: dict, keys: np.ndarray, unique: int) -> int:
    """Entries for a run: given, from a byte budget (B / (4 D + 28)), or a fraction of the
    unique keys with a floor of G."""
    if run.get("capacity"):
        return int(run["capacity"])
    if run.get("budget_dim"):
        d = run["budget_dim"]
        return max(1, int(AT * unique * 4 * d) // (4 * d + META))
    return max(keys.shape[1], round(run["frac"] * unique))


def run_task(task: dict) -> list[dict]:
    """One policy on one trace, every run of ``task["runs"]`` in order (one process)."""
    keys, _ = load(task["trace"])
    unique = int(np.unique(keys).size)
    out = []
    for run in task["runs"]:
        cap = capacity_of(run, keys, unique)
        rec = {
            "trace": task["name"],
            "seed": task.get("seed"),
            "family": task["family"],
            "policy": task["policy"],
            "purpose": task["purpose"],
            "frac": run.get("frac"),
            "budget_dim": run.get("budget_dim"),
            "mode": run["mode"],
            "params": run.get("params"),
            "capacity": cap,
            "unique_keys": unique,
            "requests": int(keys.shape[0]),
            "tables": int(keys.shape[1]),
        }
        t0 = time.perf_counter()
        try:
            if task["family"] == "libcachesim":
                from embstore.cache._libcachesim import LibCacheSimPolicy

                # An object, not the name: evaluate() maps "LRU"/"LFU" to our lru/lfu.
                r = ecache.evaluate(keys, LibCacheSimPolicy(task["policy"], cap), cap, run["mode"])
            else:
                name = "group_lfu" if task["policy"].startswith("group_lfu") else task["policy"]
                r = ecache.evaluate(keys, name, cap, run["mode"], policy_params=run.get("params"))
        except InvalidArgumentError as e:  # a libCacheSim policy below its smallest size
            rec["skipped"] = str(e)
            out.append(rec)
            continue
        rec["seconds"] = time.perf_counter() - t0
        rec |= {k: float(r[k]) for k in RESULT_KEYS}
        rec["misses_per_request"] = [int(x) for x in r["misses_per_request"]]
        out.append(rec)
    return out


def run_tasks(tasks: list[dict], workers: int, what: str) -> list[dict]:
    """Runs ``tasks`` on ``workers`` processes, each task in a fresh process (so libCacheSim's
    process-wide generator starts the same for every task), longest first."""
    if not tasks:
        return []
    tasks = sorted(tasks, key=lambda t: -t["cost"])
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__"])
    records: list[dict] = []
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, max_tasks_per_child=1
    ) as ex:
        futures = {ex.submit(run_task, t): t for t in tasks}
        for i, f in enumerate(concurrent.futures.as_completed(futures), 1):
            t = futures[f]
            recs = f.result()
            records += recs
            secs = sum(r.get("seconds", 0.0) for r in recs)
            if secs > 2 or i == len(tasks) or i % 25 == 0:
                log(
                    f"{what}: {i}/{len(tasks)} tasks ({time.perf_counter() - t0:.0f} s); "
                    f"{t['name']} seed {t.get('seed')} {t['policy']}: {len(recs)} runs "
                    f"in {secs:.1f} s"
                )
    return records


# --- 1. policy -----------------------------------------------------------------------------


def policy_traces(args: argparse.Namespace) -> list[dict]:
    """The traces of part 1: ``{name, specs {seed: spec}, sweep sizes, tune spec}``."""
    out = []
    if args.ml:
        for fields in (7, 11):
            out.append(
                {
                    "name": f"ml{fields}",
                    "specs": {None: ml_spec(args, fields)},
                    "sizes": args.sizes,
                    "tune": ml_spec(args, fields, half=True),
                }
            )
    for rho in args.rhos:
        sizes = args.sizes if rho in args.sweep_rhos else args.reduced_sizes
        out.append(
            {
                "name": f"syn_rho{rho}",
                "specs": {s: syn_spec(args, rho, s) for s in range(1, args.seeds + 1)},
                "sizes": sizes,
                "tune": syn_spec(args, rho, 0),
            }
        )
    return out


def task_cost(spec: tuple, runs: list[dict], family: str) -> float:
    """Rough seconds of a task, to start the longest first."""
    if spec[0] == "ml":
        keys = (spec[3] or 100_000) * spec[2] / (2 if spec[4] else 1)
    else:
        keys = spec[3] * SYN_TABLES
    passes = sum(2 if r["mode"] == "replay" else 1 for r in runs)
    return passes * keys * (1e-6 if family == "libcachesim" else 1.2e-7)


def make_task(name, spec, seed, family, policy, purpose, runs) -> dict:
    return {
        "name": name,
        "trace": spec,
        "seed": seed,
        "family": family,
        "policy": policy,
        "purpose": purpose,
        "runs": runs,
        "cost": task_cost(spec, runs, family),
    }


def policy_runs(tr: dict, seed: int | None, params: Any = None) -> list[dict]:
    """Prefix at every sweep size (seed 1 / ML), prefix at 5 % (other seeds), online and
    replay at 5 % (seed 1 / ML). ``params``: a dict, or a function of the size."""

    def p(frac: float) -> Any:
        return params(frac) if callable(params) else params

    sweep = seed in (None, 1)
    sizes = tr["sizes"] if sweep else [AT]
    runs = [{"frac": f, "mode": "prefix", "params": p(f)} for f in sizes]
    if sweep:
        runs += [{"frac": AT, "mode": m, "params": p(AT)} for m in ("online", "replay")]
    return runs


def bench_policy_tasks(args: argparse.Namespace, lcs: list[str]) -> tuple[list, list]:
    """The tasks of part 1 that need no tuned parameter, and the tuning tasks."""
    tasks, tune = [], []
    for tr in policy_traces(args):
        for seed, spec in tr["specs"].items():
            for pol in OURS:
                if pol == "group_lfu_tuned":
                    continue
                tasks.append(
                    make_task(tr["name"], spec, seed, "ours", pol, "policy", policy_runs(tr, seed))
                )
            for pol in lcs:
                runs = policy_runs(tr, seed)
                tasks.append(make_task(tr["name"], spec, seed, "libcachesim", pol, "policy", runs))
        for alpha in ALPHAS:
            params = {"age_alpha": alpha, "pin_request": True}
            if tr["tune"][0] == "ml":
                # the same entries as the measured run on the whole trace
                keys, _ = load(tr["specs"][None])
                u = int(np.unique(keys).size)
                runs = [
                    {
                        "frac": f,
                        "capacity": max(keys.shape[1], round(f * u)),
                        "mode": "prefix",
                        "params": params,
                    }
                    for f in tr["sizes"]
                ]
            else:
                runs = [{"frac": f, "mode": "prefix", "params": params} for f in tr["sizes"]]
            tune.append(
                make_task(
                    tr["name"],
                    tr["tune"],
                    0 if tr["tune"][0] == "syn" else None,
                    "ours",
                    "group_lfu",
                    "tune",
                    runs,
                )
            )
    return tasks, tune


def choose_alpha(records: list[dict]) -> dict[str, dict[float, float | None]]:
    """Per trace and size, the ``age_alpha`` with the most perfect hits on the tuning split
    (ties to the first of ALPHAS)."""
    best: dict[str, dict[float, tuple[float, float | None]]] = {}
    for a in ALPHAS:
        for r in records:
            if r["purpose"] != "tune" or r["params"]["age_alpha"] != a:
                continue
            cur = best.setdefault(r["trace"], {}).get(r["frac"])
            if cur is None or r["perfect_hit"] > cur[0]:
                best[r["trace"]][r["frac"]] = (r["perfect_hit"], a)
    return {t: {f: v[1] for f, v in d.items()} for t, d in best.items()}


def tuned_tasks(args: argparse.Namespace, alpha: dict) -> list[dict]:
    tasks = []
    for tr in policy_traces(args):
        a = alpha[tr["name"]]
        for seed, spec in tr["specs"].items():
            runs = policy_runs(tr, seed, lambda f, a=a: {"age_alpha": a[f], "pin_request": True})
            tasks.append(
                make_task(tr["name"], spec, seed, "ours", "group_lfu_tuned", "policy", runs)
            )
    return tasks


def best_at(p5: dict, family: str, names: tuple | list) -> tuple[str | None, float]:
    """The policy of ``names`` with the most perfect hits (mean over seeds) and that rate."""
    c = [(p5[family][p]["perfect_hit"]["mean"], p) for p in names if p in p5[family]]
    return (max(c)[1], max(c)[0]) if c else (None, float("nan"))


def mean_sd(xs: list[float]) -> dict:
    a = np.array(xs, dtype=float)
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0, "n": a.size}


def summarize_policy(args, records: list[dict], alpha: dict, lcs: list[str]) -> dict:
    """Per trace: the sweep (seed 1 / ML), the 5 % point (mean +- sd over seeds for synthetic),
    the tuning table and the best of ours vs the best of libCacheSim."""
    out: dict[str, Any] = {}
    for tr in policy_traces(args):
        name = tr["name"]
        recs = [r for r in records if r["trace"] == name and "skipped" not in r]
        pol = [r for r in recs if r["purpose"] == "policy"]
        first = None if name.startswith("ml") else 1
        sweep: dict[str, dict] = {}
        for family, names in (("ours", OURS), ("libcachesim", lcs)):
            sweep[family] = {}
            for p in names:
                rows = [
                    r
                    for r in pol
                    if r["policy"] == p
                    and r["family"] == family
                    and r["seed"] == first
                    and r["mode"] == "prefix"
                ]
                sweep[family][p] = {
                    str(r["frac"]): {
                        k: r[k]
                        for k in ("capacity", "perfect_hit", "individual_hit", "mean_misses")
                    }
                    for r in sorted(rows, key=lambda r: r["frac"])
                }
        bound = {
            str(r["frac"]): r["compulsory_bound"]
            for r in pol
            if r["seed"] == first and r["mode"] == "prefix"
        }
        at: dict[str, dict] = {}
        for mode in ("prefix", "online", "replay"):
            at[mode] = {}
            for family, names in (("ours", OURS), ("libcachesim", lcs)):
                at[mode][family] = {}
                for p in names:
                    rows = [
                        r
                        for r in pol
                        if r["policy"] == p
                        and r["family"] == family
                        and r["frac"] == AT
                        and r["mode"] == mode
                    ]
                    if not rows:
                        continue
                    rows.sort(key=lambda r: r["seed"] or 0)
                    at[mode][family][p] = {
                        "seeds": [r["seed"] for r in rows],
                        "perfect_hit": mean_sd([r["perfect_hit"] for r in rows]),
                        "individual_hit": mean_sd([r["individual_hit"] for r in rows]),
                        "mean_misses": mean_sd([r["mean_misses"] for r in rows]),
                        "compulsory_bound": mean_sd([r["compulsory_bound"] for r in rows]),
                        "capacity": [r["capacity"] for r in rows],
                        "misses_per_request": rows[0]["misses_per_request"],
                    }
        p5 = at["prefix"]

        tune = {}
        for r in (r for r in recs if r["purpose"] == "tune"):
            a = r["params"]["age_alpha"]
            tune.setdefault(str(r["frac"]), {})["none" if a is None else str(a)] = r["perfect_hit"]
        ref = [r for r in pol if r["seed"] == first]
        out[name] = {
            "requests": ref[0]["requests"] if ref else None,
            "tables": ref[0]["tables"] if ref else None,
            "unique_keys": ref[0]["unique_keys"] if ref else None,
            "seeds": [s for s in tr["specs"] if s is not None],
            "sweep_seed": first,
            "tuned_on": "first half of the trace" if name.startswith("ml") else "seed 0",
            "sizes": list(tr["sizes"]),
            "compulsory_bound": bound,
            "sweep": sweep,
            "at_5pct": at,
            "alpha_tuned": {str(f): a for f, a in alpha.get(name, {}).items()},
            "tuning": tune,
            "best_ours": best_at(p5, "ours", OURS),
            "best_group_aware": best_at(p5, "ours", GROUP_AWARE),
            "best_libcachesim": best_at(p5, "libcachesim", lcs),
        }
    return out


# --- 2. system -------------------------------------------------------------------------------


def system_specs(args: argparse.Namespace) -> list[tuple]:
    specs = [ml_spec(args, 11)] if args.ml else []
    return [*specs, syn_spec(args, args.system_rho, 1)]


def system_baseline_tasks(args: argparse.Namespace, lcs: list[str]) -> list[dict]:
    tasks = []
    for spec in system_specs(args):
        seed = 1 if spec[0] == "syn" else None
        for d in args.dims:
            runs = [{"budget_dim": d, "mode": "prefix"}]
            for p in ("lru", "group_lfu"):
                tasks.append(make_task(spec_name(spec), spec, seed, "ours", p, "system", runs))
            for p in lcs:
                tasks.append(
                    make_task(spec_name(spec), spec, seed, "libcachesim", p, "system", runs)
                )
    return tasks


def table_ids(keys: np.ndarray) -> np.ndarray:
    """The per-table ids of table-qualified keys (``int64[N, G]``)."""
    return (keys & np.uint64((1 << traces.ID_BITS) - 1)).astype(np.int64)


def build_store(ids: np.ndarray, names: list[str], dim: int, seed: int = 0) -> Any:
    """A store with a Gaussian N(0, 0.05^2) row for every id 0..max of each column."""
    store = embstore.Store()
    rng = np.random.default_rng(seed)
    for g, name in enumerate(names):
        t = store.create_table(name, embedding_dim=dim)
        n = int(ids[:, g].max()) + 1
        for start in range(0, n, 1 << 16):
            m = min(n, start + (1 << 16)) - start
            rows = rng.normal(0.0, 0.05, (m, dim)).astype(np.float32)
            t.assign(np.arange(start, start + m, dtype=np.int64), rows)
    return store


def cache_figures(cache: Any, r: dict) -> dict:
    s = cache.stats()
    return {k: float(r[k]) for k in RESULT_KEYS} | {
        "capacity": int(r["capacity"]),
        "tiers": [
            {k: t[k] for k in ("codec", "capacity", "len", "row_bytes", "metadata_bytes")}
            for t in s["tiers"]
        ],
        "l3_capacity": int(s["l3_capacity"]),
        "l3_bytes": int(s["l3_bytes"]),
        "approximated": int(r["approximated"]),
        "bytes": int(s["bytes"]),
        "memory_budget_bytes": int(s["memory_budget_bytes"]),
    }


def bench_system(args: argparse.Namespace, baselines: list[dict], lcs: list[str]) -> dict:
    out: dict[str, Any] = {}
    for spec in system_specs(args):
        keys, names = load(spec)
        name = spec_name(spec)
        ids = table_ids(keys)
        unique = int(np.unique(keys).size)
        half = len(keys) // 2
        counts = {}
        for g, t in enumerate(names):
            u, c = np.unique(ids[:half, g], return_counts=True)
            counts[t] = (u, c)
        out[name] = {"requests": len(keys), "tables": len(names), "unique_keys": unique}
        out[name]["seed"] = 1 if spec[0] == "syn" else None
        out[name]["store_rows"] = int(sum(int(ids[:, g].max()) + 1 for g in range(len(names))))
        for d in args.dims:
            budget = int(AT * unique * 4 * d)
            t0 = time.perf_counter()
            store = build_store(ids, names, d)
            log(
                f"system {name} D {d}: store of {out[name]['store_rows']:,} rows in "
                f"{time.perf_counter() - t0:.1f} s; budget {budget:,} B"
            )
            res: dict[str, Any] = {
                "budget_bytes": budget,
                "baseline_entries": budget // (4 * d + META),
                "baselines": {},
                "ours": {},
            }
            for r in baselines:
                if r["trace"] == name and r["budget_dim"] == d and "skipped" not in r:
                    label = r["policy"] if r["family"] == "libcachesim" else f"ours:{r['policy']}"
                    res["baselines"][label] = {
                        k: r[k] for k in ("capacity", "perfect_hit", "individual_hit")
                    }
            for cfg, tiers in TIERS.items():
                try:
                    cache = embstore.InferenceCache(
                        store, tables=names, memory_budget_bytes=budget, tiers=tiers
                    )
                except InvalidArgumentError as e:  # a tier below one request's keys
                    res["ours"][cfg] = {"tiers_share": tiers, "skipped": str(e)}
                    log(f"system {name} D {d} ({cfg}) {tiers}: skipped ({e})")
                    continue
                t0 = time.perf_counter()
                r = ecache.evaluate(keys, cache, mode="prefix", in_place=True)
                res["ours"][cfg] = {"tiers_share": tiers} | cache_figures(cache, r)
                res["ours"][cfg]["seconds"] = time.perf_counter() - t0
                log(f"system {name} D {d} ({cfg}) {tiers}: perfect {r['perfect_hit']:.4f}")
                del cache
            ran = {k: v for k, v in res["ours"].items() if "skipped" not in v}
            top = max(ran, key=lambda c: ran[c]["perfect_hit"]) if ran else None
            if d in args.surrogate_dims and top is not None:
                t0 = time.perf_counter()
                # On disk (the cache counts 8 B per 227 rows of them, not 18 B a row), fed
                # inline so that the figure is deterministic.
                sur_dir = tempfile.TemporaryDirectory(prefix="embstore-surrogates-")
                sur = ecache.build_surrogates(
                    store, names, counts=counts, k=10, max_dist=0.5, directory=sur_dir.name
                )
                build_s = time.perf_counter() - t0
                rows = sum(len(s) for s in sur.values())
                coverage = sum(s.coverage * len(s) for s in sur.values()) / max(rows, 1)
                cache = embstore.InferenceCache(
                    store,
                    tables=names,
                    memory_budget_bytes=budget,
                    tiers=TIERS[top],
                    surrogates=sur,
                    l3_fill="inline",
                )
                r = ecache.evaluate(keys, cache, mode="prefix", in_place=True)
                res["ours"]["f"] = {"tiers_share": TIERS[top], "base": top} | cache_figures(
                    cache, r
                )
                res["ours"]["f"] |= {
                    "surrogate_build_s": build_s,
                    "surrogate_coverage": coverage,
                    "surrogate_coverage_per_table": {t: s.coverage for t, s in sur.items()},
                    "served_minus_exact": r["served_perfect_hit"] - r["perfect_hit"],
                }
                log(
                    f"system {name} D {d} (f) = ({top}) + surrogates (built in {build_s:.1f} s, "
                    f"coverage {coverage:.3f}): perfect {r['perfect_hit']:.4f}, served "
                    f"{r['served_perfect_hit']:.4f}"
                )
                del cache, sur
                sur_dir.cleanup()
            lb = [(v["perfect_hit"], k) for k, v in res["baselines"].items() if k in lcs]
            res["best_libcachesim"] = max(lb)[::-1] if lb else (None, float("nan"))
            ran = {k: v for k, v in res["ours"].items() if "skipped" not in v}
            ours = [(v["perfect_hit"], k) for k, v in ran.items()]
            res["best_ours"] = max(ours)[::-1] if ours else (None, float("nan"))
            served = [(v["served_perfect_hit"], k) for k, v in ran.items()]
            res["best_ours_served"] = max(served)[::-1] if served else (None, float("nan"))
            out[name][f"D{d}"] = res
            del store
    return out


# --- 3. latency ------------------------------------------------------------------------------


def timed(fn: Any, calls: list[Any], warm: int = 20) -> np.ndarray:
    for c in calls[:warm]:
        fn(c)
    lat = np.empty(len(calls))
    for i, c in enumerate(calls):
        t0 = time.perf_counter()
        fn(c)
        lat[i] = time.perf_counter() - t0
    return lat


def lookup_methods(cache: Any, names: list[str], tables: list, dense: list, embs: list) -> dict:
    """``{method: (call, prepare)}``: ``prepare(ids int64[B, G])`` builds one call's argument
    (outside the timing), ``call(arg)`` looks up every table's rows of ``B`` requests."""
    import torch

    def as_batch(a: np.ndarray) -> dict:
        return {t: np.ascontiguousarray(a[:, g]) for g, t in enumerate(names)}

    def as_cols(a: np.ndarray) -> list:
        return [np.ascontiguousarray(a[:, g]) for g in range(a.shape[1])]

    def as_tensors(a: np.ndarray) -> list:
        return [torch.from_numpy(c) for c in as_cols(a)]

    def store(cols: list) -> list:
        return [t.lookup(x) for t, x in zip(tables, cols, strict=True)]

    def take(cols: list) -> list:
        return [np.take(w, x, axis=0) for w, x in zip(dense, cols, strict=True)]

    def emb(cols: list) -> list:
        with torch.inference_mode():
            return [e(c) for e, c in zip(embs, cols, strict=True)]

    return {
        "cache.lookup": (cache.lookup, as_batch),
        "Table.lookup": (store, as_cols),
        "numpy.take": (take, as_cols),
        "torch.nn.Embedding": (emb, as_tensors),
    }


def bench_latency(args: argparse.Namespace) -> dict:
    import torch

    spec = ml_spec(args, 11)
    keys, names = load(spec)
    ids = table_ids(keys)
    d = 16
    unique = int(np.unique(keys).size)
    store = build_store(ids, names, d)
    tables = [store.table(t) for t in names]
    dense = [t.lookup(np.arange(int(ids[:, g].max()) + 1)) for g, t in enumerate(tables)]
    embs = []
    for w in dense:
        e = torch.nn.Embedding(w.shape[0], d)
        with torch.no_grad():
            e.weight.copy_(torch.from_numpy(w))
        embs.append(e)
    half = len(keys) // 2
    n1 = min(args.latency_requests, len(keys) - half)
    nb = min(args.latency_batches, (len(keys) - half) // 256)
    singles = [ids[half + i : half + i + 1] for i in range(n1)]
    batches = [ids[half + 256 * i : half + 256 * (i + 1)] for i in range(nb)]
    out: dict[str, Any] = {
        "embedding_dim": d,
        "unique_keys": unique,
        "single_calls": n1,
        "batch_calls": nb,
        "torch_threads": torch.get_num_threads(),
        "budgets": {},
    }
    budgets = {"5%": int(AT * unique * 4 * d), "100%": int(unique * (4 * d + 64) * 1.5)}
    for label, budget in budgets.items():
        cache = embstore.InferenceCache(store, tables=names, memory_budget_bytes=budget)
        warm_to = half if label == "5%" else len(keys)
        for s in range(0, warm_to, 256):
            b = ids[s : min(warm_to, s + 256)]
            cache.lookup({t: b[:, g] for g, t in enumerate(names)})
        resident = sum(t["len"] for t in cache.stats()["tiers"])
        cache.reset_stats()

        methods = lookup_methods(cache, names, tables, dense, embs)
        res: dict[str, Any] = {"budget_bytes": budget, "resident_keys_after_warm": resident}
        for bsz, calls in ((1, singles), (256, batches)):
            for m, (fn, prep) in methods.items():
                args_ = [prep(c) for c in calls]
                reps = []
                for _ in range(args.reps):
                    lat = timed(fn, args_)
                    reps.append(
                        {
                            "p50_us": float(np.percentile(lat, 50) * 1e6),
                            "p99_us": float(np.percentile(lat, 99) * 1e6),
                            "requests_per_s": bsz * len(lat) / float(lat.sum()),
                        }
                    )
                res[f"batch_{bsz}/{m}"] = {
                    k: float(np.median([r[k] for r in reps])) for k in reps[0]
                } | {"reps": reps}
                log(
                    f"latency {label} batch {bsz} {m}: p50 "
                    f"{res[f'batch_{bsz}/{m}']['p50_us']:.1f} us"
                )
        s = cache.stats()
        res["timed_perfect_hit_rate"] = float(s["perfect_hit_rate"])
        res["timed_individual_hit_rate"] = float(s["individual_hit_rate"])
        out["budgets"][label] = res
        del cache
    return out


# --- plots, goals, report --------------------------------------------------------------------


def plot_policy(pol: dict, lcs: list[str], folder: pathlib.Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    colors = plt.get_cmap("tab20").colors
    for name, tr in pol.items():
        fig, ax = plt.subplots(figsize=(8, 5.5))
        i = 0
        for family, names, style in (("ours", OURS, "-"), ("libcachesim", lcs, "--")):
            for p in names:
                pts = tr["sweep"][family].get(p, {})
                if not pts:
                    continue
                xs = [float(f) * 100 for f in pts]
                ys = [v["perfect_hit"] for v in pts.values()]
                label = p if family == "ours" else f"{p} (libCacheSim)"
                ax.plot(xs, ys, style, color=colors[i % 20], marker=".", label=label)
                i += 1
        xs = [float(f) * 100 for f in tr["compulsory_bound"]]
        ax.plot(
            sorted(xs),
            [tr["compulsory_bound"][k] for k in sorted(tr["compulsory_bound"], key=float)],
            ":",
            color="black",
            label="compulsory bound",
        )
        ax.set_xscale("log")
        ax.set_xlabel("cache size, % of unique keys (entries; log)")
        ax.set_ylabel("perfect-hit rate (prefix: second half)")
        seed = f", seed {tr['sweep_seed']}" if tr["sweep_seed"] is not None else ""
        ax.set_title(
            f"{name}: {tr['requests']:,} requests x {tr['tables']} tables, "
            f"{tr['unique_keys']:,} keys{seed}"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
        fig.tight_layout()
        path = folder / f"cache_perfect_hits_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def goals(res: dict) -> list[dict]:
    g = []
    for name, tr in res.get("policy", {}).get("traces", {}).items():
        if name != "ml11" and not name.startswith("syn"):
            continue
        (po, vo), (pl, vl) = tr["best_group_aware"], tr["best_libcachesim"]
        if pl is None:
            continue
        what = "mean over seeds " if name.startswith("syn") else ""
        g.append(
            {
                "goal": f"policy {name}: best group-aware ({po}) >= best libCacheSim ({pl}) "
                f"perfect hits at 5 % ({what}prefix), difference in points",
                "value": (vo - vl) * 100,
                "met": vo >= vl,
            }
        )
    for name, tr in res.get("system", {}).items():
        for dkey, r in tr.items():
            if not dkey.startswith("D") or None in (r["best_libcachesim"][0], r["best_ours"][0]):
                continue
            (po, vo), (pl, vl) = r["best_ours"], r["best_libcachesim"]
            primary = dkey == "D16"
            g.append(
                {
                    "goal": f"system {name} {dkey}: best ours ({po}) exact perfect hits >= best "
                    f"libCacheSim fp32 ({pl}) + 10 points at a 5 % byte budget"
                    + ("" if primary else " (info; the goal is at D 16)")
                    + ", difference in points",
                    "value": (vo - vl) * 100,
                    "met": vo >= vl + 0.10,
                }
            )
    return g


def row_name(policy: str, family: str) -> str:
    return policy if family == "ours" else f"{policy} (lcs)"


def pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def report(res: dict) -> None:
    print(f"## bench_cache — {res['date']}, {res['machine']}, commit {res['commit']}\n")
    print(f"command: `{res['command']}`; wall {res['wall_s'] / 60:.1f} min\n")
    if "policy" in res:
        pol = res["policy"]
        print("### 1. policy: L1 at equal entries (perfect-hit % / individual-hit %)\n")
        print(f"libCacheSim {pol['libcachesim_version']}: {', '.join(pol['libcachesim'])}.")
        for k, v in pol["libcachesim_excluded"].items():
            print(f"Not run: {k} — {v}.")
        print(
            "Ours: group_lfu = defaults (age_alpha 2, pin_request); group_lfu_tuned = "
            "age_alpha chosen per size on the tuning split (ML: first half; synthetic: seed 0); "
            "lfu ages with alpha 2. Prefix mode unless marked.\n"
        )
        for name, tr in pol["traces"].items():
            seeds = f"; seeds {tr['seeds']}" if tr["seeds"] else ""
            print(
                f"#### {name}: {tr['requests']:,} requests x {tr['tables']} tables, "
                f"{tr['unique_keys']:,} unique keys{seeds}; sweep on "
                f"{'seed ' + str(tr['sweep_seed']) if tr['sweep_seed'] else 'the whole trace'}\n"
            )
            sizes = [str(s) for s in tr["sizes"]]
            print("| policy | " + " | ".join(f"{100 * float(s):g} %" for s in sizes) + " |")
            print("|---|" + "---:|" * len(sizes))
            cap = next(iter(tr["sweep"]["ours"].values()), {})
            print(
                "| entries | "
                + " | ".join(f"{cap[s]['capacity']:,}" if s in cap else "-" for s in sizes)
                + " |"
            )
            for family in ("ours", "libcachesim"):
                for p, pts in tr["sweep"][family].items():
                    cells = [
                        f"{pct(pts[s]['perfect_hit'])} / {pct(pts[s]['individual_hit'])}"
                        if s in pts
                        else "-"
                        for s in sizes
                    ]
                    print(f"| {row_name(p, family)} | " + " | ".join(cells) + " |")
            print(
                "| compulsory bound | "
                + " | ".join(pct(tr["compulsory_bound"].get(s)) for s in sizes)
                + " |"
            )
            al = ", ".join(
                f"{100 * float(f):g} %: {'none' if a is None else a}"
                for f, a in tr["alpha_tuned"].items()
            )
            print(f"\nage_alpha chosen (tuned on {tr['tuned_on']}): {al}\n")
            at = tr["at_5pct"]
            sd = "mean ± sd over seeds, " if tr["seeds"] else ""
            print(
                f"At 5 % ({sd}perfect %; individual %; mean misses per request; online and "
                f"replay{' seed 1' if tr['seeds'] else ''}):\n"
            )
            print("| policy | prefix perfect | prefix individual | misses/req | online | replay |")
            print("|---|---:|---:|---:|---:|---:|")
            for family in ("ours", "libcachesim"):
                for p, v in at["prefix"][family].items():
                    ph = v["perfect_hit"]
                    cell = (
                        f"{pct(ph['mean'])} ± {pct(ph['sd'])}" if ph["n"] > 1 else pct(ph["mean"])
                    )
                    on = at["online"][family].get(p, {}).get("perfect_hit", {}).get("mean")
                    rp = at["replay"][family].get(p, {}).get("perfect_hit", {}).get("mean")
                    print(
                        f"| {row_name(p, family)} | {cell} | "
                        f"{pct(v['individual_hit']['mean'])} | {v['mean_misses']['mean']:.2f} | "
                        f"{pct(on)} | {pct(rp)} |"
                    )
            (po, vo), (pg, vg), (pl, vl) = (
                tr["best_ours"],
                tr["best_group_aware"],
                tr["best_libcachesim"],
            )
            print(
                f"\nbest of ours {po} {pct(vo)}; best group-aware {pg} {pct(vg)}; best "
                f"libCacheSim {pl} {pct(vl)}; group-aware - libCacheSim = "
                f"{(vg - vl) * 100:+.1f} points\n"
            )
    if "system" in res:
        print("### 2. system: L1+L2+L3 at equal bytes (5 % of unique keys x 4 D), prefix\n")
        print(
            f"Baselines hold B / (4 D + {META}) entries ({META} B = GroupLfu's measured "
            "metadata per entry). Rows are untrained Gaussian N(0, 0.05^2): surrogate quality "
            "is meaningless; (f) is the best of a-e by its measured perfect hits + L3.\n"
        )
        for name, tr in res["system"].items():
            for dkey, r in tr.items():
                if not dkey.startswith("D"):
                    continue
                print(
                    f"#### {name} {dkey}: {tr['requests']:,} requests, {tr['unique_keys']:,} "
                    f"keys, store {tr['store_rows']:,} rows; budget {r['budget_bytes']:,} B, "
                    f"baseline {r['baseline_entries']:,} entries\n"
                )
                print("| config | tiers (entries) | bytes used | perfect % | served % | indiv % |")
                print("|---|---|---:|---:|---:|---:|")
                for cfg, v in r["ours"].items():
                    if "skipped" in v:
                        print(f"| ({cfg}) {v['tiers_share']} | skipped: {v['skipped']} |||||")
                        continue
                    tiers = " + ".join(f"{t['codec']} {t['capacity']:,}" for t in v["tiers"])
                    if v["l3_capacity"]:
                        tiers += f" + L3 {v['l3_capacity']:,}"
                    print(
                        f"| ({cfg}) {v['tiers_share']} | {tiers} | {v['bytes']:,} | "
                        f"{pct(v['perfect_hit'])} | {pct(v['served_perfect_hit'])} | "
                        f"{pct(v['individual_hit'])} |"
                    )
                for p, v in sorted(r["baselines"].items(), key=lambda kv: -kv[1]["perfect_hit"]):
                    print(
                        f"| {p} | {v['capacity']:,} | - | {pct(v['perfect_hit'])} | - | "
                        f"{pct(v['individual_hit'])} |"
                    )
                f = r["ours"].get("f")
                if f:
                    print(
                        f"\n(f): surrogates built in {f['surrogate_build_s']:.1f} s, coverage "
                        f"{f['surrogate_coverage']:.3f} of rows within max_dist 0.5; served - "
                        f"exact = {f['served_minus_exact'] * 100:+.2f} points"
                    )
                (po, vo), (pl, vl) = r["best_ours"], r["best_libcachesim"]
                print(
                    f"\nbest ours ({po}) {pct(vo)} vs best libCacheSim fp32 ({pl}) {pct(vl)}: "
                    f"{(vo - vl) * 100:+.1f} points (served: {r['best_ours_served'][0]} "
                    f"{pct(r['best_ours_served'][1])})\n"
                )
    if "latency" in res:
        lat = res["latency"]
        print(
            f"### 3. latency: ML11, D {lat['embedding_dim']}, {lat['single_calls']:,} calls of 1 "
            f"request and {lat['batch_calls']} of 256; median of reps; torch threads "
            f"{lat['torch_threads']}\n"
        )
        print("| budget | batch | method | p50 us/call | p99 us/call | requests/s |")
        print("|---|---:|---|---:|---:|---:|")
        for label, r in lat["budgets"].items():
            for k, v in r.items():
                if "/" not in k:
                    continue
                b, m = k.split("/")
                print(
                    f"| {label} | {b.split('_')[1]} | {m} | {v['p50_us']:.1f} | "
                    f"{v['p99_us']:.1f} | {v['requests_per_s']:,.0f} |"
                )
        for label, r in lat["budgets"].items():
            print(
                f"\n{label}: {r['budget_bytes']:,} B, {r['resident_keys_after_warm']:,} keys "
                f"resident after warm-up; perfect hits while timed "
                f"{pct(r['timed_perfect_hit_rate'])} %"
            )
        print()
    if "plots" in res:
        print("plots: " + ", ".join(res["plots"]) + "\n")
    for g in res["goals"]:
        print(f"- {g['goal']}: {g['value']:+.2f} ({'met' if g['met'] else 'NOT met'})")


def plain(x: Any) -> Any:
    """``x`` with numpy scalars and arrays made JSON-ready."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--parts",
        default="policy,system,latency",
        help="comma-separated parts to run: policy, system, latency (all)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: synthetic 20k requests, 20k contexts, tables up to 20k rows, rho "
        "0.7, seeds 1-2, sizes 1/5/20 %%, D 16 only, fewer timed calls",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="write the results as JSON to PATH ('-': print JSON instead of the report)",
    )
    p.add_argument(
        "--plots",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="write one perfect-hit vs size PNG per trace of part 1 into DIR",
    )
    p.add_argument("--workers", type=int, default=2, help="processes for the policy runs (2)")
    p.add_argument(
        "--ml-dir",
        type=pathlib.Path,
        default=ROOT / ".data" / "ml-100k",
        help="MovieLens-100k recbole atomic files; skipped when absent",
    )
    p.add_argument("--no-ml", action="store_true", help="skip the MovieLens traces")
    p.add_argument("--ml-requests", type=int, default=0, help="first N ML requests (0: all)")
    p.add_argument("--syn-requests", type=int, default=200_000, help="synthetic requests")
    p.add_argument("--syn-contexts", type=int, default=200_000, help="synthetic contexts")
    p.add_argument("--syn-max-table", type=int, default=200_000, help="largest synthetic table")
    p.add_argument("--rhos", type=floats, default=[0.3, 0.7, 0.9], help="synthetic co-access")
    p.add_argument("--seeds", type=int, default=5, help="synthetic seeds 1..S at 5 %% (5)")
    p.add_argument(
        "--sizes",
        type=floats,
        default=[100 * s for s in SIZES],
        help="cache sizes, %% of unique keys (0.5,1,2,5,10,20,50,90); 5 is always added",
    )
    p.add_argument(
        "--sweep-rhos", type=floats, default=[0.7], help="synthetic rho that get every size (0.7)"
    )
    p.add_argument(
        "--reduced-sizes",
        type=floats,
        default=[1, 5, 20, 50],
        help="sizes (%%) for the other rho (1,5,20,50)",
    )
    p.add_argument("--dims", type=floats, default=[16, 36], help="system: embedding_dim (16,36)")
    p.add_argument(
        "--surrogate-dims",
        type=floats,
        default=[16],
        help="system: dims that also run (f) with surrogates (16)",
    )
    p.add_argument("--system-rho", type=float, default=0.7, help="system: synthetic rho (0.7)")
    p.add_argument("--latency-requests", type=int, default=3000, help="timed 1-request calls")
    p.add_argument("--latency-batches", type=int, default=150, help="timed 256-request calls")
    p.add_argument("--reps", type=int, default=3, help="latency repetitions (median)")
    args = p.parse_args()
    if args.quick:
        args.syn_requests, args.seeds, args.rhos = 20_000, 2, [0.7]
        args.syn_contexts = args.syn_max_table = 20_000
        args.sizes, args.reduced_sizes, args.dims = [1, 5, 20], [5], [16]
        args.latency_requests, args.latency_batches = 500, 20
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in ("policy", "system", "latency")]
    if bad:
        p.error(f"unknown parts {bad}; choose from policy, system, latency")
    args.sizes = sorted({round(s / 100, 6) for s in args.sizes} | {AT})
    args.reduced_sizes = sorted({round(s / 100, 6) for s in args.reduced_sizes} | {AT})
    args.dims = [int(d) for d in args.dims]
    args.surrogate_dims = [int(d) for d in args.surrogate_dims]
    args.ml = not args.no_ml and (args.ml_dir / "ml-100k.inter").is_file()
    if not args.ml:
        log(f"MovieLens skipped ({'--no-ml' if args.no_ml else f'no {args.ml_dir}'})")
        if "latency" in parts:
            parts.remove("latency")
            log("latency skipped: it runs on ML11")

    t_start = time.perf_counter()
    lcs = lcs_available()
    if not lcs:
        log("libcachesim not installed: libCacheSim baselines skipped")
    res: dict[str, Any] = {
        **run_record(),
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
    }
    tasks, tune = bench_policy_tasks(args, lcs) if "policy" in parts else ([], [])
    base_tasks = system_baseline_tasks(args, lcs) if "system" in parts else []
    records = run_tasks(tasks + tune + base_tasks, args.workers, "policy runs")
    if "policy" in parts:
        alpha = choose_alpha(records)
        records += run_tasks(tuned_tasks(args, alpha), args.workers, "tuned runs")
        pol = summarize_policy(args, records, alpha, lcs)
        res["policy"] = {
            "libcachesim": lcs,
            "libcachesim_version": (importlib.metadata.version("libcachesim") if lcs else None),
            "libcachesim_excluded": lcs_excluded() if lcs else {},
            "traces": pol,
            "task_seconds": sum(r.get("seconds", 0.0) for r in records),
        }
        if args.plots:
            res["plots"] = plot_policy(pol, lcs, args.plots)
    if "system" in parts:
        res["system"] = bench_system(args, records, lcs)
    if "latency" in parts:
        res["latency"] = bench_latency(args)
    res["wall_s"] = time.perf_counter() - t_start
    res["records"] = records
    res = plain(res)
    if args.json == "-":
        return finish(res, args, goals, report)

    def report_and_save(r: dict) -> None:
        if args.json:
            path = pathlib.Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(r))
            log(f"wrote {path}")
        report(r)

    return finish(res, argparse.Namespace(json=False), goals, report_and_save)


if __name__ == "__main__":
    sys.exit(main())
