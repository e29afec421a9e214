"""Plots of the dissemination experiments not drawn by ``plot.py`` / ``plot_baselines.py``, from
the runs' JSON records in docs/data (no new runs): E2 (checkpoint broadcast vs embstore), E3 (one
slow link: per-DC latency of embstore, 2PC and Redis), E5 (the source's update cache) and E6
(parts skipped by shard versions, from ``e6_skip.py``'s records).

    plot_experiments.py --data docs/data --out docs/img      # all four: e2_checkpoint.png,
                                                             # e3_slow_link.png, e5_cache.png,
                                                             # e6_skip.png

E2 takes baselines-runs.json's ``checkpoint`` record (its cycle model) and E1 embstore records (as
``plot_baselines.py`` picks them); E3 the records whose network has a slow link; E5 the embstore
records with the source's ``sync_stats()`` and ``len()`` per table; E6 ``e6-skip*.json``. Of
repeated runs of one point the last one not discarded by the CPU rule is used (or the last one).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dissemination.plot_baselines import _pick, e1_points, load

COLORS = {"embstore": "tab:blue", "2pc": "tab:red", "redis": "tab:orange", "checkpoint": "tab:gray"}
LABELS = {
    "embstore": "embstore (dc-leader)",
    "2pc": "2PC primary-backup",
    "redis": "Redis chain",
    "checkpoint": "checkpoint broadcast (model)",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_e2(recs: list[dict], out: str) -> bool:
    """Mean latency: the checkpoint cycle model (1.5 cycles) next to embstore's E1 means (the
    range over rho) at 3 and 10 DCs, log scale, with the ratio written above."""
    ck = [r for r in recs if r.get("system") == "checkpoint" and "cycle_model" in r]
    if not ck:
        return False
    model = ck[-1]["cycle_model"]
    e1 = e1_points(recs)
    dcs = [d for d in sorted(int(k) for k in model) if any(k[1] == d for k in e1)]
    if not dcs:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, d in enumerate(dcs):
        means = [r["mean_s"] for (s, dd, _), r in e1.items() if s == "embstore" and dd == d]
        lo, hi = min(means), max(means)
        ckpt = model[str(d)]["mean_latency_s"]
        ax.bar(
            i - 0.2,
            ckpt,
            0.4,
            color=COLORS["checkpoint"],
            label=LABELS["checkpoint"] if not i else None,
        )
        ax.bar(
            i + 0.2,
            hi,
            0.4,
            color=COLORS["embstore"],
            label="embstore (highest mean over rho)" if not i else None,
        )
        ax.errorbar(i + 0.2, hi, yerr=[[hi - lo], [0]], color="k", capsize=3, lw=1)
        ax.text(i - 0.2, ckpt, f"{ckpt:.0f} s", ha="center", va="bottom", fontsize=8)
        ax.text(i + 0.2, hi, f"{lo:.3f}-{hi:.3f} s", ha="center", va="bottom", fontsize=8)
        ax.text(i, ckpt * 2.2, f"{ckpt / hi:,.0f}x", ha="center", fontsize=9, weight="bold")
    ax.set_xticks(range(len(dcs)))
    ax.set_xticklabels([f"{d} DCs x 3" for d in dcs])
    ax.set_yscale("log")
    ax.set_ylim(top=max(model[str(d)]["mean_latency_s"] for d in dcs) * 6)
    ax.set_ylabel("mean latency, s (log)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    c = ck[-1]
    fig.suptitle(
        f"E2: checkpoint broadcast ({c['table_bytes'] / 1e6:.1f} MB, cycle modelled from measured "
        f"copies) vs embstore (E1)\nWAN 48 Mbit, NIC 50 Mbit, RTT 50 ms",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def e3_points(recs: list[dict]) -> dict[tuple[int, float, str], dict]:
    """``(dcs, rate, system) -> record`` of the runs with a slow link."""
    best: dict = {}
    for r in recs:
        if r.get("network", {}).get("slow") and "per_dc_mean_s" in r and r.get("system"):
            _pick(best, (r["network"]["dcs"], r["rate_rows_s"], r["system"]), r)
    return best


def plot_e3(recs: list[dict], out: str) -> bool:
    """Per configuration (DCs, rate): grouped bars of each system's mean latency in DC 1, the
    slow DC and a fast DC, log scale."""
    pts = e3_points(recs)
    if not pts:
        return False
    configs = sorted({(d, rate) for d, rate, _ in pts})
    systems = [s for s in ("embstore", "2pc", "redis") if any(k[2] == s for k in pts)]
    plt = _plt()
    fig, axes = plt.subplots(1, len(configs), figsize=(3.8 * len(configs), 4.2), sharey=True)
    axes = axes if len(configs) > 1 else [axes]
    for ax, (d, rate) in zip(axes, configs, strict=True):
        slow = None
        for j, s in enumerate(systems):
            r = pts.get((d, rate, s))
            if not r:
                continue
            slow = r["network"]["slow"]
            src, dst = str(int(slow[0])), str(int(slow[1]))
            fast = next(k for k in sorted(r["per_dc_mean_s"], key=int) if k not in (src, dst))
            vals = [r["per_dc_mean_s"].get(src), r["per_dc_mean_s"][dst], r["per_dc_mean_s"][fast]]
            xs = [i + (j - (len(systems) - 1) / 2) * 0.27 for i in range(3)]
            for x, v in zip(xs, vals, strict=True):
                if v is None:
                    continue
                face = "none" if r.get("discarded") else COLORS[s]
                ax.bar(x, v, 0.27, color=face, edgecolor=COLORS[s])
                ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(3))
        ax.set_xticklabels(
            [f"DC {src}\n(training)", f"DC {dst}\n(slow link)", f"DC {fast}\n(fast)"]
        )
        ax.set_title(f"{d} DCs x 3, {rate:,.0f} rows/s", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("mean latency, s (log; DC 1: no Redis replica)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[s]) for s in systems]
    fig.legend(handles, [LABELS[s] for s in systems], loc="lower center", ncol=3, fontsize=8)
    n = pts[next(iter(pts))]["network"]
    fig.suptitle(
        f"E3: one slow link (DC {n['slow'][0]} -> DC {n['slow'][1]} {n['slow'][2]} Mbit, others "
        f"{n['wan_mbit']} Mbit, NIC {n['nic_mbit']:g}, RTT {2 * n['one_way_ms']} ms), 30 s runs",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=110)
    return True


def e5_points(recs: list[dict]) -> list[tuple[str, dict]]:
    """``(label, record)`` of the embstore runs with the source's table stats and rows."""
    best: dict = {}
    for r in recs:
        st = r.get("primary_sync_stats", {})
        if (
            r.get("system") == "embstore"
            and "hot" in st.get("table_rows", {})
            and not r.get("ablation")
        ):
            n = r["network"]
            key = (
                "E3 " if n.get("slow") else "",
                n["dcs"],
                r["rate_rows_s"],
                "" if r.get("dc1_followers", True) else "\nno DC 1",
            )
            _pick(best, key, r)
    out = []
    for (e3, d, rate, nodc1), r in sorted(
        best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][2])
    ):
        out.append((f"{e3}{d}x3{nodc1}\n{rate / 1000:g}k rows/s", r))
    return out


def plot_e5(recs: list[dict], out: str) -> bool:
    """Per run: the update cache's hit rate (pulls cached / all pulls) and the rows it holds as a
    share of the table's rows, with D_prop at the end."""
    pts = e5_points(recs)
    if not pts:
        return False
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = range(len(pts))
    hits, shares, dprop = [], [], []
    for _, r in pts:
        t = r["primary_sync_stats"]["tables"]["hot"]
        pulls = t["pulls_cached"] + t["pulls_scanned"]
        hits.append(100 * t["pulls_cached"] / pulls if pulls else 0)
        shares.append(100 * t["cached_rows"] / r["primary_sync_stats"]["table_rows"]["hot"])
        dprop.append(t["d_prop_ms"] / 1000)
    a.bar(xs, hits, 0.6, color=COLORS["embstore"])
    a.axhline(99.4, color="k", ls="--", lw=1, label="goal: hit >= 99.4 %")
    for x, v in zip(xs, hits, strict=True):
        a.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    a.set_ylim(95, 100.6)
    a.set_ylabel("update cache hit rate, % of pulls")
    b.bar(xs, shares, 0.6, color="tab:green")
    b.axhline(0.5, color="k", ls="--", lw=1, label="goal: cache <= 0.5 % of rows")
    for x, v, dp in zip(xs, shares, dprop, strict=True):
        b.text(x, v, f"{v:.0f} %\nD_prop {dp:.1f} s", ha="center", va="bottom", fontsize=6)
    b.set_ylim(0, max(shares) * 1.25)
    b.set_ylabel("rows cached, % of the table's rows")
    for ax in (a, b):
        ax.set_xticks(list(xs))
        ax.set_xticklabels([p[0] for p in pts], fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right" if ax is a else "upper right")
    fig.suptitle(
        "E5: the source's update cache (table hot, 1,024 parts, rows the 30 s trace touched; "
        "counters at the end of the run)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def plot_e6(recs: list[dict], out: str) -> bool:
    """Per table and over all tables: the skip ratio (1 - parts pulled / (rounds x parts)) with
    shard versions on and off (the mean over runs, each run a dot), and the parts pulled per
    second per follower (log)."""
    recs = [r for r in recs if r.get("experiment") == "E6"]
    if not recs:
        return False
    plt = _plt()
    names = [*recs[0]["tables"], "all"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, (on, color) in enumerate(((True, "tab:blue"), (False, "tab:gray"))):
        rs = [r for r in recs if r["shard_versions"] == on]
        if not rs:
            continue
        x = [i + (j - 0.5) * 0.4 for i in range(len(names))]

        def get(r, n, k):
            return (r["all"] if n == "all" else r["tables"][n])[k]

        skip = [[100 * get(r, n, "skip_ratio") for r in rs] for n in names]
        rate = [[get(r, n, "parts_per_s") for r in rs] for n in names]
        label = f"shard versions {'on' if on else 'off'} ({len(rs)} run{'s' * (len(rs) > 1)})"
        a.bar(x, [sum(v) / len(v) for v in skip], 0.4, color=color, label=label)
        b.bar(x, [sum(v) / len(v) for v in rate], 0.4, color=color, label=label)
        for xi, vs, ps in zip(x, skip, rate, strict=True):
            a.plot([xi] * len(vs), vs, ".", color="k", ms=3)
            b.plot([xi] * len(ps), ps, ".", color="k", ms=3)
            if on:
                a.text(
                    xi, max(vs), f"{sum(vs) / len(vs):.1f}", ha="center", va="bottom", fontsize=6
                )
    on = [r for r in recs if r["shard_versions"]]
    if on:
        # The paper's reading: a round visits every table (hot rounds x parts x tables).
        x = len(names) - 0.2
        v = [100 * r["all"]["skip_ratio_per_hot_round_all_tables"] for r in on]
        a.bar(x, sum(v) / len(v), 0.4, color="tab:cyan", label="all, a round visiting every table")
        a.plot([x] * len(v), v, ".", color="k", ms=3)
        a.text(x, max(v), f"{sum(v) / len(v):.1f}", ha="center", va="bottom", fontsize=6)
        # The trace's prediction for the hot table at WAN-like round lengths.
        pred = on[0]["tables"]["hot"].get("predicted_skip_ratio_at_round_ms", {})
        for ms, val in pred.items():
            if float(ms) < 1000:
                a.plot(-0.2, 100 * val, "_", color="tab:red", ms=14, mew=2)
                a.text(
                    0.0, 100 * val, f"predicted, {float(ms):g} ms rounds", fontsize=6, va="center"
                )
    a.axhline(95, color="k", ls="--", lw=1, label="goal: >= 95 %")
    a.set_ylabel("skip ratio, % of (round, part) pairs not pulled")
    a.set_ylim(0, 105)
    b.set_yscale("log")
    b.set_ylabel("parts pulled per second per follower (log)")
    for ax in (a, b):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=7, rotation=30)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left" if ax is a else "upper right")
    a.set_xticks(range(len(names) + 1))
    a.set_xticklabels([*names, "all, per\nhot round"], fontsize=7, rotation=30)
    a.legend(fontsize=6, loc="lower right")
    r = recs[0]
    t = r["trace"]
    idle = (
        f"a write every {r['idle_every_s']:g} s each"
        if r.get("idle_every_s")
        else f"{100 * r['idle_share']:.2g} % of writes"
    )
    fig.suptitle(
        f"E6: hot table 2^{t['rows'].bit_length() - 1} rows, Zipf {t['zipf_a']}, "
        f"{t['rate']:,.0f} rows/s; {r['idle_tables']} idle tables ({idle}); {r['parts']:,} parts; "
        f"{r['followers']} followers on loopback",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="docs/data", help="the records' folder (default docs/data)")
    ap.add_argument("--out", default="docs/img", help="where the PNGs go (default docs/img)")
    ap.add_argument("--only", nargs="+", choices=["e2", "e3", "e5", "e6"], help="only these")
    args = ap.parse_args(argv)
    data, out = pathlib.Path(args.data), pathlib.Path(args.out)
    runs = [str(p) for p in sorted(data.glob("*.json")) if not p.name.startswith("e6-")]
    recs = load(runs)
    # E2's embstore means are E1's, as baselines-runs.json holds them (plot_baselines.py's E1).
    base = load([str(p) for p in sorted(data.glob("baselines-runs.json"))])
    e6 = load([str(p) for p in sorted(data.glob("e6-skip.json"))])
    jobs = {
        "e2": (plot_e2, base, "e2_checkpoint.png"),
        "e3": (plot_e3, recs, "e3_slow_link.png"),
        "e5": (plot_e5, recs, "e5_cache.png"),
        "e6": (plot_e6, e6, "e6_skip.png"),
    }
    for name, (fn, rs, file) in jobs.items():
        if args.only and name not in args.only:
            continue
        done = fn(rs, str(out / file))
        print(f"{name}: {out / file if done else 'no records'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
