"""Plot embstore's dissemination against the Redis peer from their JSON records
(``ekko_peer.py --json`` and ``redis_peer.py --json``): mean and p99 latency (log scale) and WAN
bytes per update vs the update rate, one line per (system, topology, DCs x servers).

    plot.py ekko.json redis.json --out docs/img/dissemination_vs_redis.png

Only runs with the given one-way delay (default 25 ms) and length (default 30 s) are drawn;
``--dcs`` picks the cluster size (default 3); of repeated runs the last kept one is drawn, and a
discarded run (CPU rule) only when there is no other, hollow.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict

STYLE = {"redis": ("tab:red", "s"), "embstore": ("tab:blue", "o")}
NO_DC1_STYLE = ("tab:green", "^")  # embstore without followers in DC 1 (the Redis layout)


def load(paths: list[str]) -> list[dict]:
    recs = []
    for p in paths:
        recs += json.loads(pathlib.Path(p).read_text())
    return recs


def wire(r: dict) -> str:
    """What sets a run's wire apart in its label: f16 values (lossy), an older protocol.

    >>> wire({"sync_precision": "f16"}), wire({"sync_protocol": 5}), wire({"system": "redis"})
    (' f16', ' protocol 5', '')
    """
    out = " f16" if r.get("sync_precision") == "f16" else ""
    if r.get("sync_protocol") is not None and r["sync_protocol"] < 6:
        out += f" protocol {r['sync_protocol']}"
    return out


def series(
    recs: list[dict], dcs: int, one_way_ms: float, duration: float = 30
) -> dict[tuple, list[dict]]:
    """Records by (system, topology, dcs, servers), sorted by rate; of several runs at one rate
    the last one that was not discarded (or the last one)."""
    best: dict[tuple, dict] = {}
    for r in recs:
        net = r["network"]
        if net["dcs"] != dcs or net["one_way_ms"] != one_way_ms or "mean_s" not in r:
            continue
        if r["duration_s"] != duration:
            continue
        topo = r["topology"] + ("" if r.get("dc1_followers", True) else " no-DC1") + wire(r)
        key = (r["system"], topo, net["dcs"], net["servers"], r["rate_rows_s"])
        if key not in best or best[key].get("discarded") or not r.get("discarded"):
            best[key] = r
    out: dict[tuple, list[dict]] = defaultdict(list)
    for key, r in best.items():
        out[key[:4]].append(r)
    return {k: sorted(v, key=lambda r: r["rate_rows_s"]) for k, v in sorted(out.items())}


def table(recs: list[dict]) -> str:
    """A markdown table of every record, in the given order."""
    head = (
        "| system | topology | DCs x servers | one-way ms | rows/s | run s | mean s | p50 s | "
        "p99 s | max s | WAN B/update | primary NIC load | box CPU % | all procs % | own % | "
        "discarded |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in recs:
        net, cpu = r["network"], r["cpu"]
        topo = r["topology"] + ("" if r.get("dc1_followers", True) else " (no DC 1 followers)")
        topo += wire(r)
        lines.append(
            f"| {r['system']} | {topo} | {net['dcs']} x {net['servers']} | "
            f"{net['one_way_ms']:g} | {r['rate_rows_s']:g} | {r['duration_s']:g} | "
            f"{r.get('mean_s')} | "
            f"{r.get('p50_s')} | {r.get('p99_s')} | {r.get('max_s')} | "
            f"{r['wan_bytes_per_update']} | {r.get('primary_nic_load')} | {cpu['box_pct']} | "
            f"{cpu['all_processes_pct']} | {cpu['own_pct_of_box']} | "
            f"{'yes' if r['discarded'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="record files of ekko_peer.py / redis_peer.py")
    ap.add_argument("--out", default="docs/img/dissemination_vs_redis.png")
    ap.add_argument("--dcs", type=int, default=3, help="cluster size to draw (default 3)")
    ap.add_argument("--one-way-ms", type=float, default=25, help="delay to draw (default 25)")
    ap.add_argument(
        "--duration", type=float, default=30, help="seconds of updates to draw (default 30)"
    )
    ap.add_argument(
        "--topologies",
        nargs="+",
        default=["chain", "dc-leader"],
        help="topologies to draw (default: chain dc-leader, the fair pair)",
    )
    ap.add_argument(
        "--table", action="store_true", help="print a markdown table of every record and exit"
    )
    args = ap.parse_args(argv)
    if args.table:
        print(table(load(args.json)))
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {
        k: v
        for k, v in series(load(args.json), args.dcs, args.one_way_ms, args.duration).items()
        if k[1].split()[0] in args.topologies
    }
    if not data:
        print("error: no records match", file=sys.stderr)
        return 1
    fig, (ax_lat, ax_wan) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (system, topo, dcs, servers), rs in data.items():
        color, marker = NO_DC1_STYLE if "no-DC1" in topo else STYLE.get(system, ("k", "x"))
        label = f"{system} {topo} ({dcs}x{servers})"
        x = [r["rate_rows_s"] for r in rs]
        for key, ls, what in (("mean_s", "-", "mean"), ("p99_s", "--", "p99")):
            ax_lat.plot(x, [r[key] for r in rs], ls, color=color, label=f"{label} {what}")
            for r in rs:
                face = "none" if r.get("discarded") else color
                ax_lat.plot(r["rate_rows_s"], r[key], marker, color=color, mfc=face)
        ax_wan.plot(x, [r["wan_bytes_per_update"] for r in rs], "-" + marker, color=color,
                    label=label)  # fmt: skip
    ax_lat.set_yscale("log")
    ax_lat.set_xlabel("update rate (rows/s)")
    ax_lat.set_ylabel("latency per update (s), max over replicas")
    ax_lat.set_title("latency per update (log scale; lines only join measured rates)")
    ax_lat.grid(True, which="both", alpha=0.3)
    ax_lat.legend(fontsize=7)
    ax_wan.set_xlabel("update rate (rows/s)")
    ax_wan.set_ylabel("WAN bytes per update")
    ax_wan.set_title("WAN bytes per update (all DC pairs, both ways)")
    ax_wan.set_ylim(bottom=0)
    ax_wan.grid(True, alpha=0.3)
    ax_wan.legend(fontsize=7)
    fig.suptitle(
        f"embstore sync vs Redis replication, {args.dcs} DCs, NIC 50 / WAN 48 Mbit, "
        f"{args.one_way_ms:g} ms one way, Zipf(1.05) over 2^20 rows, D=16",
        fontsize=9,
    )
    fig.tight_layout()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
