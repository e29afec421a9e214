"""The TorchRec DLRM script ported to embstore (``examples/torchrec_dlrm.py``): its two backends
on the same batches, at 1 and 2 processes, interleaved (TorchRec, embstore, then embstore,
TorchRec on the next repeat); the median step time of each run, the paired ratio
embstore / TorchRec of each repeat (its median over the repeats), and the test AUCs.

Each backend runs in its own virtualenv: embstore in this interpreter's, TorchRec in
``.venv-torchrec`` (``make torchrec-deps``; ``--torchrec-python`` to point elsewhere). Several
processes run under ``torch.distributed.run`` (torchrun), on loopback.

    .venv/bin/python python/benchmarks/training/bench_dlrm_port.py --repeats 3 \\
        --json docs/data/dlrm-port.json

``--quick``: a smoke run (small tables, few batches, one repeat). Other arguments after ``--``
go to the example (``-- --batch-size 4096``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torchrec_dlrm.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def run(python: str, backend: str, processes: int, extra: list[str], tmp: Path) -> dict | None:
    out = tmp / f"{backend}-{processes}.json"
    out.unlink(missing_ok=True)
    cmd = [python]
    if processes > 1:
        cmd += [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(processes),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
        ]
    cmd += [str(EXAMPLE), "--backend", backend, *extra, "--json", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        print(f"  {backend} x{processes} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", default="1,2", help="process counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torchrec-python", default=str(ROOT / ".venv-torchrec/bin/python"))
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    ap.add_argument("--json", type=Path, help="where to write the results")
    ap.add_argument("example_args", nargs="*", help="after --: arguments of the example")
    args = ap.parse_args()
    if not Path(args.torchrec_python).exists():
        raise SystemExit(
            f"no TorchRec interpreter at {args.torchrec_python}: run `make torchrec-deps` "
            "or give --torchrec-python"
        )
    extra = list(args.example_args)
    repeats = args.repeats
    if args.quick:
        extra = ["--total-rows", "20000", "--batches", "60", "--batch-size", "256", *extra]
        repeats = 1
    pythons = {"embstore": sys.executable, "torchrec": args.torchrec_python}
    procs = [int(p) for p in args.processes.split(",")]
    cpu = cpu_model()
    print(f"CPU: {cpu} ({os.cpu_count()} logical CPUs); example args: {extra}", flush=True)

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-dlrm-port-") as tmp:
        for p in procs:
            for rep in range(repeats):
                order = ("torchrec", "embstore") if rep % 2 == 0 else ("embstore", "torchrec")
                for backend in order:
                    rec = run(pythons[backend], backend, p, extra, Path(tmp))
                    if rec is None:
                        continue
                    rec["repeat"] = rep
                    runs.append(rec)
                    print(
                        f"  {p} process(es), repeat {rep}, {backend}: median step "
                        f"{rec['step_ms_median']:.2f} ms, AUC {rec['auc']:.4f}",
                        flush=True,
                    )

    summary = []
    print(
        "\nprocesses | TorchRec step ms | embstore step ms | embstore/TorchRec (paired median)"
        " | AUC TorchRec | AUC embstore"
    )
    for p in procs:
        by = {
            b: {r["repeat"]: r for r in runs if r["processes"] == p and r["backend"] == b}
            for b in pythons
        }
        paired = [
            by["embstore"][k]["step_ms_median"] / by["torchrec"][k]["step_ms_median"]
            for k in by["embstore"]
            if k in by["torchrec"]
        ]
        if not paired:
            continue

        def med(b: str, key: str, by: dict = by) -> float:
            return statistics.median(r[key] for r in by[b].values())

        row = {
            "processes": p,
            "torchrec_step_ms": med("torchrec", "step_ms_median"),
            "embstore_step_ms": med("embstore", "step_ms_median"),
            "ratio_paired_median": statistics.median(paired),
            "ratios": paired,
            "auc_torchrec": med("torchrec", "auc"),
            "auc_embstore": med("embstore", "auc"),
        }
        summary.append(row)
        print(
            f"{p} | {row['torchrec_step_ms']:.2f} | {row['embstore_step_ms']:.2f} | "
            f"{row['ratio_paired_median']:.2f}x | {row['auc_torchrec']:.4f} | "
            f"{row['auc_embstore']:.4f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "cpu": cpu,
                    "logical_cpus": os.cpu_count(),
                    "example_args": extra,
                    "repeats": repeats,
                    "summary": summary,
                    "runs": runs,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
