"""Plots and tables of the paper's baselines (docs/dissemination-baselines.md) from the runs' JSON
records: E1 (embstore dc-leader vs 2PC over #DCs and the load rho), E4 (the ablation A0-A3).

    plot_baselines.py RUNS.json... --e1 docs/img/baselines_e1.png --e4 docs/img/baselines_e4.png
    plot_baselines.py RUNS.json... --table      # the markdown tables of the doc

E1 takes the embstore records without ablation switches or cold tables (``ablation`` unset) and
the 2PC records; E4 the embstore records with ``ablation`` set. Of repeated runs of one point
the last one not discarded by the CPU rule is used (or the last one).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

STYLE = {"embstore": ("tab:blue", "o"), "2pc": ("tab:red", "s")}


def load(paths: list[str]) -> list[dict]:
    recs = []
    for p in paths:
        data = json.loads(pathlib.Path(p).read_text())
        recs += data if isinstance(data, list) else [data]
    return recs


def _pick(best: dict, key, r: dict) -> None:
    if key not in best or best[key].get("discarded") or not r.get("discarded"):
        best[key] = r


def e1_points(recs: list[dict]) -> dict[tuple[str, int, float], dict]:
    """``(system, dcs, rho) -> record`` for E1 (rho = ``rho_2pc`` rounded to 0.1)."""
    best: dict = {}
    for r in recs:
        if r.get("system") not in STYLE or "mean_s" not in r or "rho_2pc" not in r:
            continue
        if r["system"] == "embstore" and (
            r.get("ablation") or r.get("cold_tables") or r["topology"] != "dc-leader"
        ):
            continue
        if r["network"]["one_way_ms"] != 25:
            continue
        _pick(best, (r["system"], r["network"]["dcs"], round(r["rho_2pc"], 1)), r)
    return best


def parts_of(r: dict) -> int:
    """The sync parts per table of an embstore record (older records: from the port's stats)."""
    if "parts" in r:
        return r["parts"]
    return r.get("primary_sync_stats", {}).get("tables", {}).get("hot", {}).get("parts", 1024)


def e4_points(recs: list[dict], dcs: int = 3, parts: int = 1024) -> dict[str, dict]:
    """``ablation step -> record`` of the runs at ``dcs`` DCs with ``parts`` parts."""
    best: dict = {}
    for r in recs:
        if r.get("system") == "embstore" and r.get("ablation") and "mean_s" in r:
            if r["network"]["dcs"] == dcs and parts_of(r) == parts:
                _pick(best, r["ablation"], r)
    return dict(sorted(best.items()))


def e1_table(points: dict) -> str:
    lines = [
        "| DCs x servers | rho | rows/s | embstore mean s | embstore p99 s | 2PC mean s | "
        "2PC p99 s | 2PC / embstore (mean) | WAN B/update embstore | WAN B/update 2PC | "
        "discarded |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(d, rho) for (_, d, rho) in points})
    for d, rho in keys:
        e, t = points.get(("embstore", d, rho)), points.get(("2pc", d, rho))
        ref = e or t
        ratio = f"{t['mean_s'] / e['mean_s']:.2f}x" if e and t else "-"
        disc = ", ".join(s for s, r in (("embstore", e), ("2PC", t)) if r and r.get("discarded"))

        def f(r, k):
            return r[k] if r else "-"

        lines.append(
            f"| {d} x {ref['network']['servers']} | {rho:.1f} | {ref['rate_rows_s']:g} | "
            f"{f(e, 'mean_s')} | {f(e, 'p99_s')} | {f(t, 'mean_s')} | {f(t, 'p99_s')} | "
            f"{ratio} | {f(e, 'wan_bytes_per_update')} | {f(t, 'wan_bytes_per_update')} | "
            f"{disc or 'no'} |"
        )
    return "\n".join(lines)


def e4_table(points: dict) -> str:
    lines = [
        "| step | topology | source cache | shard versions | cold tables | mean s | p99 s | "
        "step ratio | WAN B/update | primary sync B/update | pulls cached | pulls scanned | "
        "discarded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    prev = None
    for step, r in points.items():
        st = r.get("source_table_stats_run", {}).get("all", {})
        ratio = f"{prev['mean_s'] / r['mean_s']:.2f}x" if prev else "-"
        lines.append(
            f"| {step} | {r['topology']} | {r['source_cache']} | {r['shard_versions']} | "
            f"{r['cold_tables']} | {r['mean_s']} | {r['p99_s']} | {ratio} | "
            f"{r['wan_bytes_per_update']} | {r['primary_sync_bytes_per_update']} | "
            f"{st.get('pulls_cached', '-')} | {st.get('pulls_scanned', '-')} | "
            f"{'yes' if r.get('discarded') else 'no'} |"
        )
        prev = r
    if "A0" in points and "A3" in points:
        lines.append(f"\nA0 / A3 = {points['A0']['mean_s'] / points['A3']['mean_s']:.1f}x")
    return "\n".join(lines)


def plot_e1(points: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    dcs_all = sorted({d for (_, d, _) in points})
    rhos = sorted({rho for (_, _, rho) in points})
    styles = ["-", "--", ":", "-."]
    for system, (color, marker) in STYLE.items():
        for i, d in enumerate(dcs_all):
            pts = sorted((rho, r) for (s, dd, rho), r in points.items() if s == system and dd == d)
            if pts:
                a.plot(
                    [p[0] for p in pts],
                    [p[1]["mean_s"] for p in pts],
                    styles[i % 4],
                    color=color,
                    marker=marker,
                    label=f"{system} {d} DCs",
                )
        for i, rho in enumerate(rhos):
            pts = sorted((d, r) for (s, d, rr), r in points.items() if s == system and rr == rho)
            if pts:
                b.plot(
                    [p[0] for p in pts],
                    [p[1]["mean_s"] for p in pts],
                    styles[i % 4],
                    color=color,
                    marker=marker,
                    label=f"{system} rho {rho:.1f}",
                )
    for ax, xl in ((a, "rho (NIC load 2PC needs at the primary)"), (b, "data centres (x 3)")):
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("mean latency, s (max over replicas)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    b.set_xticks(dcs_all)
    fig.suptitle("E1: embstore (dc-leader) vs 2PC primary-backup, emulated WAN 48 Mbit, RTT 50 ms")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_e4(groups: dict[str, dict], out: str) -> None:
    """Grouped bars: per group (e.g. "3 DCs"), the steps' mean latency and WAN bytes/update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = ["A0", "A1", "A2", "A3"]
    names = ["A0\nVV only", "A1\n+cache", "A2\n+shard ver.", "A3\n+dc-leader"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(1, len(groups))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for g, (label, points) in enumerate(groups.items()):
        xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(steps))]
        lat = [points[s]["mean_s"] if s in points else 0 for s in steps]
        wan = [points[s]["wan_bytes_per_update"] if s in points else 0 for s in steps]
        a.bar(xs, lat, width, label=label, color=colors[g % 3])
        b.bar(xs, wan, width, label=label, color=colors[g % 3])
        for x, v in zip(xs, lat, strict=True):
            if v:
                a.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    for ax, yl in ((a, "mean latency, s (log)"), (b, "WAN bytes per update")):
        ax.set_xticks(range(len(steps)))
        ax.set_xticklabels(names)
        ax.set_ylabel(yl)
        ax.legend(fontsize=8)
    a.set_yscale("log")
    fig.suptitle("E4 ablation, rho 0.5, 7 cold tables, 1,024 parts per table")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--e1", help="write the E1 plot there")
    ap.add_argument("--e4", help="write the E4 plot there")
    ap.add_argument("--table", action="store_true", help="print the markdown tables")
    ap.add_argument("--e4-dcs", type=int, default=3, help="the ablation's DCs (default 3)")
    ap.add_argument("--e4-parts", type=int, default=1024, help="its parts (default 1024)")
    args = ap.parse_args(argv)
    recs = load(args.records)
    e1, e4 = e1_points(recs), e4_points(recs, args.e4_dcs, args.e4_parts)
    if args.e1 and e1:
        plot_e1(e1, args.e1)
    if args.e4 and e4:
        groups = {f"{d} DCs x 3": e4_points(recs, d, args.e4_parts) for d in (3, 10)}
        plot_e4({k: v for k, v in groups.items() if v}, args.e4)
    if args.table:
        print(e1_table(e1))
        print()
        print(e4_table(e4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
