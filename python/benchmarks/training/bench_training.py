"""The training benchmark's runner: embstore with every row in memory, embstore under a memory
budget, and TorchRec (:mod:`torchrec_peer`, from ``.venv-torchrec``), on the same synthetic
workload (:mod:`synth_ctr`), at each process count, alternating the three and repeating.

Run it with embstore's interpreter::

    .venv/bin/python python/benchmarks/training/bench_training.py \\
        --total-rows 4000000 --batches 200 --eval-batches 5 --repeats 3

It writes every run's JSON record to ``--out`` (``docs/data/training-runs.json``), prints the
medians and paired ratios (embstore under the budget / TorchRec and / embstore in memory, per
repeat, then their median) and draws examples/s against processes, with min-max bars, into
``--png`` (``docs/img/training_throughput.png``). Process counts above the machine's cores
are oversubscribed (marked ``*``). ``--quick``: a smoke run (few batches, one repeat, 1 and 2
processes; output under /tmp unless ``--out``/``--png`` say otherwise).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
import synth_ctr  # noqa: E402

EMBSTORE_TORCHRUN = ROOT / ".venv" / "bin" / "torchrun"
TORCHREC_TORCHRUN = ROOT / ".venv-torchrec" / "bin" / "torchrun"
CONFIGS = ("embstore_mem", "embstore_budget", "torchrec")
LABELS = {
    "embstore_mem": "embstore, in memory",
    "embstore_budget": "embstore, budget {share:g}",
    "torchrec": "TorchRec",
}
OUT_NAME = "training-runs.json"
PNG_NAME = "training_throughput.png"
STAGES = ("read", "partition", "prepare", "gather", "train", "write_back")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (torchrun's port 0 hangs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(config: str, processes: int, args: argparse.Namespace, out: Path) -> list[str]:
    torchrun = TORCHREC_TORCHRUN if config == "torchrec" else EMBSTORE_TORCHRUN
    script = HERE / ("torchrec_peer.py" if config == "torchrec" else "embstore_trainer.py")
    cmd = [
        str(torchrun),
        "--nnodes", "1",
        "--nproc-per-node", str(processes),
        "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()),
        str(script),
        "--total-rows", str(args.total_rows),
        "--batches", str(args.batches),
        "--eval-batches", str(args.eval_batches),
        "--batch-size", str(args.batch_size),
        "--dim", str(args.dim),
        "--seed", str(args.seed),
        "--warmup", str(args.warmup),
        "--json", str(out),
    ]  # fmt: skip
    if config != "torchrec":
        cmd += ["--prefetch", "auto" if args.prefetch is None else str(args.prefetch)]
    if config == "embstore_budget":
        cmd += ["--memory-budget-share", str(args.memory_budget_share)]
    return cmd


def run_one(
    config: str,
    processes: int,
    repeat: int,
    args: argparse.Namespace,
    tmp: Path,
    extra: tuple[str, ...] = (),
    tag: str = "",
) -> dict | None:
    """One run of ``config``'s trainer (``extra``: more trainer arguments; ``tag``: told apart
    in the file names); its JSON record with how it ran, or None (said why) if it failed."""
    name = f"{config}{tag}-p{processes}-r{repeat}"
    out = tmp / f"{name}.json"
    log = tmp / f"{name}.log"
    cmd = command(config, processes, args, out) + list(extra)
    store_dir = tmp / f"{name}-store"
    if config != "torchrec":
        # The runner's own directory: removed below even when the run crashes.
        cmd += ["--store-dir", str(store_dir)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=args.timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - start
    shutil.rmtree(store_dir, ignore_errors=True)
    if rc != 0 or not out.exists():
        lines = log.read_text(errors="replace").splitlines()
        # The first Python traceback (a process's own error), then torchrun's summary.
        first = next((i for i, ln in enumerate(lines) if "Traceback" in ln), None)
        shown = [*lines[first : first + 25], "..."] if first is not None else []
        shown += lines[-8:]
        print(f"  FAILED ({rc}) {shlex.join(cmd)}\n    " + "\n    ".join(shown), flush=True)
        return None
    rec = json.loads(out.read_text())
    rec |= {
        "config": config,
        "repeat": repeat,
        "oversubscribed": processes > (os.cpu_count() or 1),
        "wall_s": wall,
        "command": shlex.join(cmd),
    }
    return rec


def source_digest() -> str:
    """A digest of embstore's Python sources and native module: a run whose digest changed
    between its start and end mixed two versions of the code."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "python" / "embstore").rglob("*")):
        if f.is_file() and f.suffix in (".py", ".so"):
            h.update(f.relative_to(ROOT).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarise(runs: list[dict], args: argparse.Namespace) -> str:
    lines = []
    cores = os.cpu_count() or 1
    share = args.memory_budget_share

    def by(config: str, p: int) -> list[dict]:
        return [r for r in runs if r["config"] == config and r["processes"] == p]

    head = (
        f"{'P':>3} {'config':<22} {'n':>2} {'ex/s med':>9} {'min':>8} {'max':>8} {'AUC':>7} "
        f"{'RSS MB':>7} {'KB sent/b':>9} {'remote/b':>8} {'cold rd':>8}"
    )
    lines += ["Medians over repeats (examples/s over the timed batches; * oversubscribed)", head]
    for p in args.processes:
        mark = "*" if p > cores else " "
        for c in CONFIGS:
            rs = by(c, p)
            if not rs:
                continue
            eps = [r["examples_per_s"] for r in rs]
            es = c != "torchrec"
            lines.append(
                f"{p:>2}{mark} {LABELS[c].format(share=share):<22} {len(rs):>2} "
                f"{median(eps):>9.0f} {min(eps):>8.0f} {max(eps):>8.0f} "
                f"{median([r['auc'] for r in rs]):>7.4f} "
                f"{median([r['rss_mb_max'] for r in rs]):>7.0f} "
                + (
                    f"{median([r['bytes_sent_per_batch'] for r in rs]) / 1024:>9.1f} "
                    f"{median([r['rows_pulled_remote_per_batch'] for r in rs]):>8.0f} "
                    f"{median([r['cold_reads'] for r in rs]):>8.0f}"
                    if es
                    else f"{'-':>9} {'-':>8} {'-':>8}"
                )
            )
    lines += [
        "",
        "embstore per-stage seconds, rank 0, timed batches (median): busy per stage, "
        "blocked (prepare waiting for room / train waiting for a batch), train wall",
        f"{'P':>3} {'config':<22} "
        + " ".join(f"{s:>10}" for s in STAGES)
        + f" {'blk prep':>9} {'blk train':>9} {'wall':>7}",
    ]
    for p in args.processes:
        mark = "*" if p > cores else " "
        for c in CONFIGS[:2]:
            rs = by(c, p)
            if not rs:
                continue
            busy = [median([r["stages"]["busy_s"][s] for r in rs]) for s in STAGES]
            blk = [median([r["stages"]["blocked_s"][k] for r in rs]) for k in ("prepare", "train")]
            lines.append(
                f"{p:>2}{mark} {LABELS[c].format(share=share):<22} "
                + " ".join(f"{b:>10.2f}" for b in busy)
                + f" {blk[0]:>9.2f} {blk[1]:>9.2f} "
                + f"{median([r['train_seconds'] for r in rs]):>7.2f}"
            )
    lines += ["", "Paired ratios of examples/s (same repeat and process count): per repeat; median"]
    pairs = (
        ("embstore_budget", "torchrec", f"embstore@{share:g} / TorchRec"),
        ("embstore_budget", "embstore_mem", f"embstore@{share:g} / embstore in memory"),
        ("embstore_mem", "torchrec", "embstore in memory / TorchRec"),
    )
    for p in args.processes:
        mark = "*" if p > cores else " "
        for a, b, name in pairs:
            ratios = []
            for rep in range(args.repeats):
                ra = [r for r in by(a, p) if r["repeat"] == rep]
                rb = [r for r in by(b, p) if r["repeat"] == rep]
                if ra and rb:
                    ratios.append(ra[0]["examples_per_s"] / rb[0]["examples_per_s"])
            if ratios:
                lines.append(
                    f"{p:>2}{mark} {name:<36} "
                    + " ".join(f"{x:.3f}" for x in ratios)
                    + f"; median {median(ratios):.3f}"
                )
    return "\n".join(lines)


def plot(runs: list[dict], args: argparse.Namespace, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cores = os.cpu_count() or 1
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"embstore_mem": "o-", "embstore_budget": "s-", "torchrec": "^--"}
    for c in CONFIGS:
        xs, ys, lo, hi = [], [], [], []
        for p in args.processes:
            eps = [r["examples_per_s"] for r in runs if r["config"] == c and r["processes"] == p]
            if not eps:
                continue
            m = median(eps)
            xs.append(p)
            ys.append(m)
            lo.append(m - min(eps))
            hi.append(max(eps) - m)
        if xs:
            ax.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                fmt=styles[c],
                capsize=4,
                label=LABELS[c].format(share=args.memory_budget_share),
            )
    over = [p for p in args.processes if p > cores]
    if over:
        ax.axvspan(cores + 0.5, max(args.processes) + 0.5, color="0.9", zorder=0)
        ax.text(
            cores + 0.6,
            0.02,
            f"oversubscribed\n({cores} cores)",
            transform=ax.get_xaxis_transform(),
        )
    ax.set_xticks(args.processes)
    ax.set_xticklabels([f"{p}*" if p > cores else str(p) for p in args.processes])
    ax.set_xlabel("processes (torchrun, one host)")
    ax.set_ylabel("examples/s (median, min-max bars)")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"Training throughput, {args.total_rows / 1e6:g}M rows, dim {args.dim}, "
        f"batch {args.batch_size}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total-rows", type=int, default=None, help="default 4M (--quick: 400k)")
    ap.add_argument("--batches", type=int, default=None, help="default 200 (--quick: 20)")
    ap.add_argument("--eval-batches", type=int, default=None, help="default 5 (--quick: 2)")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=None, help="default 5 (--quick: 3)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--processes", default=None, help="default 1,2,4 (--quick: 1,2)")
    ap.add_argument("--memory-budget-share", type=float, default=0.2)
    ap.add_argument("--prefetch", type=synth_ctr.prefetch_arg, default=None, help="default: auto")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--retries", type=int, default=1, help="reruns of a failed run")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    args = ap.parse_args()
    q = args.quick
    defaults = {
        "total_rows": 400_000 if q else 4_000_000,
        "batches": 20 if q else 200,
        "eval_batches": 2 if q else 5,
        "warmup": 3 if q else 5,
        "repeats": 1 if q else 3,
        "processes": "1,2" if q else "1,2,4",
        "out": Path("/tmp/training-runs-quick.json") if q else ROOT / "docs/data" / OUT_NAME,
        "png": Path("/tmp/training_throughput_quick.png") if q else ROOT / "docs/img" / PNG_NAME,
    }
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.processes = [int(p) for p in str(args.processes).split(",")]
    for tr in (EMBSTORE_TORCHRUN, TORCHREC_TORCHRUN):
        if not tr.exists():
            raise SystemExit(f"{tr} is missing")

    cores = os.cpu_count() or 1
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "host": platform.node(),
        "cores": cores,
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "embstore_digest": source_digest(),
        "git_dirty": subprocess.run(
            ["git", "status", "--porcelain", "--", "python/embstore"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "order": "per repeat and process count, the three configs in an order rotated by one "
        "each repeat",
    }
    runs: list[dict] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        for rep in range(args.repeats):
            for p in args.processes:
                k = rep % len(CONFIGS)
                for c in CONFIGS[k:] + CONFIGS[:k]:
                    mark = " (oversubscribed)" if p > cores else ""
                    print(f"repeat {rep + 1}/{args.repeats}, {p} processes{mark}: {c}", flush=True)
                    rec = run_one(c, p, rep, args, Path(tmp))
                    for _ in range(args.retries):
                        if rec is not None:
                            break
                        print("  retrying (a fresh port)", flush=True)
                        rec = run_one(c, p, rep, args, Path(tmp))
                    if rec is None:
                        continue
                    print(
                        f"  {rec['examples_per_s']:.0f} examples/s, AUC {rec['auc']:.4f}, "
                        f"wall {rec['wall_s']:.0f}s",
                        flush=True,
                    )
                    runs.append(rec)
                    meta["wall_s"] = time.perf_counter() - t_all
                    doc = {"meta": meta, "runs": runs}
                    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    meta["wall_s"] = time.perf_counter() - t_all
    digest = source_digest()
    if digest != meta["embstore_digest"]:
        meta["embstore_digest_at_end"] = digest
        print("WARNING: embstore's sources changed during the run: the runs mix two versions")
    args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print()
    print(summarise(runs, args))
    if runs:
        plot(runs, args, args.png)
    print(f"\n{len(runs)} runs in {meta['wall_s']:.0f}s; records: {args.out}; plot: {args.png}")


if __name__ == "__main__":
    main()
