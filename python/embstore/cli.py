"""The ``embstore`` command line: ``embstore inspect DIR``, ``embstore verify DIR``,
``embstore serve [--store DIR] [--etcd URL] --listen HOST:PORT [--admin]``,
``embstore status HOST:PORT ... | --etcd URL``, ``embstore publish`` and the admin calls
``embstore load|drain|unload --server HOST:PORT ...``.

Run it as ``embstore ...`` (installed with the package) or ``python -m embstore ...``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import pathlib
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from embstore.errors import EmbstoreError, StoreLockedError
from embstore.store import inspect, verify


def _bytes_arg(text: str | int) -> int:
    """A size in bytes: `1073741824`, `512MiB`, `8GiB`, `2G` (powers of 1000), `64k`."""
    if isinstance(text, int):
        n = text
    else:
        t = text.strip().lower().removesuffix("b")
        base = 1024 if t.endswith("i") else 1000
        t = t.removesuffix("i")
        unit = t[-1:] if t[-1:].isalpha() else ""
        try:
            n = int(float(t[: len(t) - len(unit)]) * base ** " kmgt".index(unit or " "))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a size: {text!r} (say 1073741824, 512MiB, 8GiB)"
            ) from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a size must be above 0, got {text!r}")
    return n


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_report(path: str, r: dict[str, Any]) -> None:
    kind = "checkpoint" if r["checkpoint"] else "store"
    print(
        f"{path}: {kind}, manifest format {r['manifest_format']}, "
        f"segment format {r['segment_format']}"
    )
    if r["checkpoint"]:
        cid, parent = r["checkpoint"]
        base = f"increment on {parent:016x}" if parent else "full"
        print(f"  checkpoint {cid:016x} ({base})")
    header = (
        f"  {'table':<20} {'dim':>5} {'optimizer':<16} {'step':>10} {'rows':>12} "
        f"{'memory':>10} {'segments':>8} {'records':>12} {'disk':>10}"
    )
    print(header)
    for t in r["tables"]:
        rows = "-" if t["rows"] is None else f"{t['rows']:,}"
        print(
            f"  {t['name']:<20} {t['embedding_dim']:>5} {t['optimizer']:<16} {t['step']:>10} "
            f"{rows:>12} {_size(t['memory_bytes']):>10} {t['segments']:>8} "
            f"{t['records']:>12,} {_size(t['disk_bytes']):>10}"
        )
    if r["torn_manifest_bytes"]:
        print(f"  torn manifest tail: {r['torn_manifest_bytes']} bytes (dropped at the next open)")
    if r["orphan_segments"]:
        print(
            "  orphan segments (superseded: safe to remove while no process has the store open; "
            f"the next open deletes them): {', '.join(r['orphan_segments'])}"
        )
    if r.get("unaccounted_segments"):
        print(
            "  unaccounted segments (the manifest cannot prove them superseded; the store is "
            "not opened while they are here; move them aside, do not delete them): "
            f"{', '.join(r['unaccounted_segments'])}"
        )


class _Renamed(argparse.Action):
    """A flag's old spelling, kept as a deprecated alias: it stores under the new flag's dest,
    says on stderr that it is deprecated, and is left out of ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        kwargs.update(help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print(f"embstore: {option} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    """The ``embstore`` command line: one subparser per subcommand, each with ``run`` (the
    function that carries it out) as a default, and ``config_parser`` on those that read
    ``--config``."""
    parser = argparse.ArgumentParser(
        prog="embstore",
        description="Look at embstore store directories and checkpoints; serve them.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_inspect(sub)
    _add_verify(sub)
    serve, status = _add_serve(sub), _add_status(sub)
    _add_admin(sub)
    _add_model(sub)
    for p in (serve, status, _add_publish(sub)):
        p.add_argument(
            "--config",
            metavar="TOML",
            help="read settings from this TOML file: keys are the long flags without dashes "
            '(listen = "127.0.0.1:7000", etcd = "http://...", max_batch = 4096); flags '
            "given on the command line win",
        )
        p.set_defaults(config_parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        try:
            args.config_parser.set_defaults(**_config(args.config, args.config_parser))
        except ValueError as e:
            print(f"embstore {args.command}: {e}", file=sys.stderr)
            return 2
        args = parser.parse_args(argv)
    return args.run(args)


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="tables, rows, bytes and formats of a store or checkpoint (reads the manifest)",
        description="Describe a store directory or checkpoint from its manifest, without "
        "opening it (safe while another process has it open): per table its dim, optimizer, "
        "step, live rows (as of its last flush), the memory they take with every row in memory, "
        "segments, records and bytes on disk. `verify` counts the rows from every record.",
    )
    p.add_argument("dir", help="a store directory or a checkpoint")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_inspect)


def _add_verify(sub: Any) -> None:
    v = sub.add_parser(
        "verify",
        help="read every record and check every checksum; exit 1 on damage",
        description="Read every segment a store or checkpoint names, check every checksum and "
        "header, count the live rows; print a summary. Exit status: 0 intact, 1 damaged (a "
        "segment, or a manifest that fails its checks or cannot account for the segments on "
        "disk), 2 not readable at all (no such directory, permissions). Safe while another "
        "process has the store open: a walk that meets a segment a compaction replaced starts "
        "over on the new manifest.",
    )
    v.add_argument("dir", help="a store directory or a checkpoint")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("--quiet", action="store_true", help="no progress on stderr")
    v.set_defaults(run=_verify)


def _add_serve(sub: Any) -> argparse.ArgumentParser:
    srv = sub.add_parser(
        "serve",
        help="serve every table of a store directory over gRPC (batch lookups)",
        description="Serve every table of a store directory as version 1 (one process, no etcd; "
        "docs/serving.md), or start empty and take versions through admin calls "
        "(`embstore load`, with --admin), or join a cluster in etcd (--etcd): register under "
        "a lease and load what `embstore publish --etcd` assigns here. Lookups of missing ids "
        "return zeros and never insert. Stops on Ctrl-C or SIGTERM: no new connections, "
        "requests in flight finish, and a cluster member deregisters.",
    )
    srv.add_argument(
        "--etcd",
        metavar="URL[,URL...]",
        help="join the cluster in this etcd (e.g. http://127.0.0.1:2379); implies --admin",
    )
    srv.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the address clients dial, registered in etcd (default: the --listen address)",
    )
    srv.add_argument(
        "--lease-ttl",
        type=float,
        default=10.0,
        metavar="S",
        help="a dead member's slots move to others this long after its last renewal "
        "(default: %(default)s)",
    )
    srv.add_argument(
        "--store",
        metavar="DIR",
        help="serve every table of this store directory as version 1 (a directory is open in "
        "one process at a time: not one a trainer has open). With --follow: the follower's copy "
        "lives there (a new or empty directory is created as a store)",
    )
    srv.add_argument(
        "--admin",
        action="store_true",
        help="take admin calls (load, drain, unload); they need the --admin-token-file token "
        "(else the --read-token-file token; with neither, anyone may call: trusted networks only)",
    )
    srv.add_argument(
        "--listen",
        default="127.0.0.1:7000",
        metavar="HOST:PORT",
        help="address to listen on (port 0: any free port, printed) (default: %(default)s)",
    )
    srv.add_argument(
        "--memory-budget",
        type=_bytes_arg,
        default=None,
        metavar="BYTES",
        help="hold at most this much (e.g. 8GiB) of the served rows and their indexes in "
        "memory, for the store's tables and every shard loaded later together; other rows stay "
        "on disk and are read when looked up, so a shard may be larger than memory (default: "
        "every row in memory)",
    )
    srv.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="with --memory-budget: where loaded shards live, one directory each, holding links "
        "to the checkpoint's segment files (on the checkpoints' file system links cost nothing; "
        "elsewhere the files are copied). Put it on NVMe; it belongs to this server, which "
        "removes parts left there by an earlier run (default: a fresh directory under $TMPDIR, "
        "removed at exit)",
    )
    srv.add_argument(
        "--read-token-file",
        metavar="FILE",
        help="lookups need the token in FILE (or the admin token) (default: none needed)",
    )
    srv.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help="admin calls need the token in FILE (default: the read token, else none)",
    )
    srv.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    srv.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    srv.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS: clients need a certificate from this CA",
    )
    srv.add_argument(
        "--framed-listen",
        default="auto",
        metavar="HOST:PORT",
        help="the framed lookup path (binary frames, about 2.5x less latency than gRPC at "
        "batch 500); clients take it by default. 'auto': the --listen host, a free port; "
        "'off': none (default: auto)",
    )
    srv.add_argument(
        "--framed-unix",
        default=None,
        metavar="PATH",
        help="also serve the framed lookup path on this Unix socket, for model servers on the "
        "same host (default: off)",
    )
    # The framed path's flags were --fast-listen and --fast-unix: still taken, not shown.
    srv.add_argument("--fast-listen", dest="framed_listen", action=_Renamed, new="--framed-listen")
    srv.add_argument("--fast-unix", dest="framed_unix", action=_Renamed, new="--framed-unix")
    srv.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="also serve GET /metrics (Prometheus text format) there (default: off)",
    )
    srv.add_argument(
        "--sync-listen",
        metavar="HOST:PORT",
        help="also expose the store's tables for followers to pull fresh rows from "
        "(docs/dissemination.md) (default: off). This serves a store that no process trains: "
        "a store that trains serves its own sync port, from the training process, with "
        "store.serve_sync(HOST:PORT, token=...)",
    )
    srv.add_argument(
        "--follow",
        nargs="?",
        const="",
        metavar="HOST:PORT",
        help="hold a copy of the tables of the sync port at HOST:PORT and keep pulling what "
        "changes while serving lookups (with --store: the copy lives there; else in memory). "
        "Without HOST:PORT, with --etcd and --dc: pull each table from this data centre's "
        "leader, or, being the leader, from the primary. With --etcd and HOST:PORT (no --dc): "
        "a cluster member that keeps each version a roll loads here current (a roll replaces "
        "the base; sync continues on top of it)",
    )
    srv.add_argument(
        "--dc",
        metavar="NAME",
        help="this server's data centre: with --etcd, register the sync port there (a store "
        "that trains as a primary) and find sources there (--follow); --etcd then serves sync "
        "only, not the roll cluster",
    )
    srv.add_argument(
        "--sync-advertise",
        metavar="HOST:PORT",
        help="the sync address others dial, registered in etcd (default: the --sync-listen one)",
    )
    srv.add_argument(
        "--sync-token-file",
        metavar="FILE",
        help="the replication token: --sync-listen requires it of followers, --follow "
        "presents it (default: none)",
    )
    srv.add_argument(
        "--sync-tls-ca",
        metavar="PEM",
        help="with --follow: talk TLS to the source, trusting this CA (the sync port itself "
        "takes --tls-cert/--tls-key/--tls-client-ca)",
    )
    srv.add_argument("--sync-tls-cert", metavar="PEM", help="with --follow: a client certificate")
    srv.add_argument("--sync-tls-key", metavar="PEM", help="the client certificate's key")
    srv.add_argument(
        "--sync-tls-domain", help="the name the source's certificate carries (default: its host)"
    )
    srv.add_argument(
        "--sync-tombstone-horizon",
        type=_horizon,
        default=3600.0,
        metavar="SECONDS",
        help="with --sync-listen: how long a removal's tombstone is kept; a follower away for "
        "longer gets the parts with collected removals whole and drops the rows they lack "
        "(default: 3600)",
    )
    srv.add_argument(
        "--catch-up-timeout",
        type=_catch_up,
        default=60.0,
        metavar="SECONDS",
        help="with --follow: start serving lookups once caught up with the source (a joining "
        "or restarted replica would answer with missing or old rows), or after this long at "
        "most; 0 serves at once (default: 60)",
    )
    srv.add_argument(
        "--sync-with-state",
        action="store_true",
        help="with --follow: also take the optimizer state (a replica in the training data "
        "centre that may take over as primary; inference replicas need the values only)",
    )
    srv.add_argument(
        "--sync-precision",
        choices=["f32", "f16"],
        help="with --follow: the precision of the values the source sends (default f32, exact; "
        "f16 halves the WAN bytes of the values and rounds each to half precision, a relative "
        "2^-11: a lossy copy for serving, never for taking over training)",
    )
    srv.add_argument(
        "--sync-no-cache",
        action="store_true",
        help="answer every pull by a scan, never from the update cache (only for measuring "
        "what the cache gains)",
    )
    srv.add_argument(
        "--priority",
        choices=["on", "off"],
        default="on",
        help="with --follow: while the link to the source is congested (three replies in a row "
        "later than four times the link's usual lag, within 0.2..1 s), pull the source's "
        "significant writes ahead of the rest on a second connection (on, the default; only "
        "tables that score their writes with embstore.Priority at the trainer have any); off: "
        "normal sync only",
    )
    srv.add_argument(
        "--witness",
        action="store_true",
        help="be a witness of the model --model: follow --follow HOST:PORT (the trainer's sync "
        "port) serving nothing, keep the model's healthy state in --data-dir (flushed at each "
        "healthy decision the model monitor records in --etcd), and take part in `embstore "
        "model rollback`",
    )
    srv.add_argument("--model", help="with --witness: the model the followed tables belong to")
    srv.add_argument(
        "--witness-name",
        help="with --witness: its name in etcd (default: host name and --data-dir's base name; "
        "keep it across restarts)",
    )
    srv.add_argument(
        "--sync-no-shard-versions",
        action="store_true",
        help="with --follow: pull every part every round, skipping none by shard version (only "
        "for measuring what shard versions gain)",
    )
    srv.add_argument(
        "--sync-events",
        metavar="FILE",
        help="with --follow: append a 24-byte record per applied reply to FILE (time in µs, "
        "table as the CRC-32 of its name, part, newest timestamp known), for measuring "
        "dissemination latency (default: off)",
    )
    srv.add_argument(
        "--replica-id",
        type=int,
        default=None,
        metavar="N",
        help="this replica's id in row versions (default: 0, or a random one with --follow); "
        "replicas that sync need distinct ids",
    )
    srv.add_argument(
        "--max-batch",
        type=int,
        default=1 << 20,
        metavar="N",
        help="most ids one lookup may carry (default: %(default)s)",
    )
    srv.set_defaults(run=_serve)
    return srv


def _add_status(sub: Any) -> argparse.ArgumentParser:
    st = sub.add_parser(
        "status",
        help="what each server holds: tables, versions, shards, states",
        description="Ask each server what it holds and print it (exit 1 if none answers). With "
        "--etcd: the cluster's tables (version, shards, replicas, assignment, the last roll "
        "and its progress) and its registered servers, each asked what it holds.",
    )
    st.add_argument("servers", nargs="*", metavar="HOST:PORT", help="server addresses")
    st.add_argument("--etcd", metavar="URL[,URL...]", help="the cluster in this etcd")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.add_argument("--token-file", metavar="FILE", help="a read or admin token, if one is needed")
    _tls_args(st)
    st.set_defaults(run=_status)
    return st


def _add_model(sub: Any) -> None:
    m = sub.add_parser(
        "model",
        help="a model's health state in etcd (healthy / uncertain / corrupted, t_max per witness)",
        description="What etcd records of a model's health (embstore.ModelMonitor writes it): "
        "its state and when it was decided, the time up to which it is healthy, each witness's "
        "t_max, its corrupted intervals, whether a rollback runs, and the alternative model.",
    )
    msub = m.add_subparsers(dest="model_cmd", required=True, metavar="status|rollback|list")
    st = msub.add_parser("status", help="one model's state", description="One model's state.")
    st.add_argument("model", help="the model's name")
    st.add_argument("--etcd", required=True, metavar="URL[,URL...]", help="the cluster's etcd")
    st.add_argument("--json", action="store_true", help="print the record as JSON")
    st.set_defaults(run=_model_status)
    rb = msub.add_parser(
        "rollback",
        help="roll a model back to its healthy state, writing only what changed since",
        description="Rolls a model back (Ekko's five steps): pauses the trainers' writes "
        "(they fail with RollingBackError) and prioritised sync, waits until the witnesses hold "
        "everything, picks per trainer the witness whose t_max agrees with the others, writes "
        "its diff (the healthy rows of every key changed since) to the trainer with new "
        "versions, which sync carries to every replica, waits for the witnesses to see it, and "
        "resumes writes once the monitor judges the model healthy (at once if it was never "
        "corrupted; --resume now: at once). Prints each step. Cut short, run it again to "
        "finish.",
    )
    rb.add_argument("model", help="the model's name")
    rb.add_argument("--etcd", required=True, metavar="URL[,URL...]", help="the cluster's etcd")
    rb.add_argument(
        "--to",
        default="healthy",
        metavar="healthy|TIME",
        help="healthy (default): the witnesses' agreed t_max; or a UTC time "
        "(2026-11-26T10:42:00Z) at or after it",
    )
    rb.add_argument(
        "--keep-new-rows",
        action="store_true",
        help="keep rows created after that time (default: remove them)",
    )
    rb.add_argument("--sync-token-file", metavar="FILE", help="the trainers' replication token")
    rb.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long each step waits for the witnesses (default: 120)",
    )
    rb.add_argument(
        "--resume",
        choices=("healthy", "now"),
        default="healthy",
        help="when the trainers take writes again: once the model is judged healthy "
        "(default), or now",
    )
    rb.add_argument(
        "--healthy-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for a healthy model before writes resume (default: 600); past "
        "it writes stay paused and the command fails: run it again",
    )
    rb.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    rb.set_defaults(run=_model_rollback)
    ls = msub.add_parser("list", help="the models with a state", description="Models in etcd.")
    ls.add_argument("--etcd", required=True, metavar="URL[,URL...]", help="the cluster's etcd")
    ls.set_defaults(run=_model_list)


def _fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).isoformat(timespec="seconds")


def _model_status(args: argparse.Namespace) -> int:
    from embstore.model import model_status

    try:
        s = model_status(args.model, args.etcd)
    except EmbstoreError as e:
        print(f"embstore model status: {e}", file=sys.stderr)
        return 1
    if s is None:
        print(f"embstore model status: no state recorded for model '{args.model}'", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"model {args.model}: {s['state']} since {_fmt_ms(s['t_ms'])}")
    if s.get("t_healthy_ms") is not None:
        print(f"  healthy up to {_fmt_ms(s['t_healthy_ms'])}")
    from embstore.witness import rollback_in_progress, witnesses

    seen = {w["name"]: w for w in witnesses(args.model, args.etcd)}
    for name, t in sorted(s.get("t_max_ms", {}).items()):
        w = seen.get(name)
        where = f", following {w['source']}" if w else ""
        alive = "" if w is None else (", live" if w["live"] else ", not heard from")
        print(f"  witness {name}: t_max {_fmt_ms(t)}{where}{alive}")
    for c in s.get("corrupted", []):
        print(f"  corrupted {_fmt_ms(c['start_ms'])} .. {_fmt_ms(c.get('end_ms'))}")
    if s.get("rolling_back"):
        rb = rollback_in_progress(args.model, args.etcd)
        step = f" (step {rb['step']}, attempt {rb['attempt']})" if rb else ""
        print(f"  a rollback under way{step}: `embstore model rollback` finishes it")
    if s.get("alternative"):
        print(f"  alternative: {s['alternative']}")
    return 0


def _model_rollback(args: argparse.Namespace) -> int:
    from embstore.witness import rollback

    to: str | float = args.to
    if to != "healthy":
        try:
            t = _dt.datetime.fromisoformat(str(to).replace("Z", "+00:00"))
        except ValueError:
            print(
                f"embstore model rollback: --to must be healthy or a time, got {to!r}",
                file=sys.stderr,
            )
            return 2
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.UTC)
        to = t.timestamp()
    try:
        out = rollback(
            args.model,
            args.etcd,
            to=to,
            keep_new_rows=args.keep_new_rows,
            token=_token(args.sync_token_file),
            timeout_s=args.timeout,
            resume=args.resume,
            healthy_timeout_s=args.healthy_timeout,
            say=lambda line: print(line, flush=True),
        )
    except EmbstoreError as e:
        print(f"embstore model rollback: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    return 0


def _model_list(args: argparse.Namespace) -> int:
    from embstore.model import models

    try:
        for name in models(args.etcd):
            print(name)
    except EmbstoreError as e:
        print(f"embstore model list: {e}", file=sys.stderr)
        return 1
    return 0


def _add_admin(sub: Any) -> None:
    for name, what in (
        ("load", "load a shard of a table version from a checkpoint; returns once it is ready"),
        ("drain", "mark a table version draining (still served; clients prefer others)"),
        ("unload", "stop serving a table version"),
    ):
        a = sub.add_parser(name, help=what, description=what.capitalize() + ".")
        a.add_argument("--server", required=True, metavar="HOST:PORT", help="a server (--admin)")
        a.add_argument("--token-file", metavar="FILE", help="the admin token, if one is needed")
        _tls_args(a)
        a.add_argument("--table", required=True, help="the table's name")
        a.add_argument("--version", required=True, type=int, help="the table version")
        if name == "load":
            a.add_argument(
                "--checkpoint", required=True, help="the checkpoint (a path on the server)"
            )
            a.add_argument("--shard", type=int, default=0, help="which shard (default: 0)")
            a.add_argument(
                "--num-shards", type=int, default=1, help="shards of the version (default: 1)"
            )
        a.set_defaults(run=_admin)


def _add_publish(sub: Any) -> argparse.ArgumentParser:
    pub = sub.add_parser(
        "publish",
        help="roll a table to a new version, one column of replicas at a time",
        description="Roll a table to a new version (docs/serving.md): the spare column loads it; "
        "then each column in turn drains the old version, waits until no lookup names it, "
        "unloads it and loads the new one; then the spare column unloads. Clients read one "
        "complete version throughout. With --etcd the layout comes from the cluster (the next "
        "version number, the assignment, a spare server per shard; the shard count from "
        "--shards or the checkpoint's size and --max-shard-size) and the roll's progress is "
        "recorded there (`embstore status --etcd`). Without it, give the layout: --version, "
        "--column per replica, --spare; every server needs --admin. On an error the roll stops "
        "and names the step; the old version is still served.",
    )
    pub.add_argument("--etcd", metavar="URL[,URL...]", help="the cluster in this etcd")
    pub.add_argument("--table", required=True, help="the table's name")
    pub.add_argument("--checkpoint", required=True, help="its checkpoint (a path on the servers)")
    pub.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="with --etcd: shards of the new version, a power of two (default: from the "
        "checkpoint's size and --max-shard-size)",
    )
    pub.add_argument(
        "--max-shard-size",
        type=_bytes_arg,
        default=1 << 30,
        metavar="BYTES",
        help="with --etcd: the largest shard an automatic shard count allows "
        "(default: %(default)s)",
    )
    pub.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="R",
        help="with --etcd: replicas per shard (default: as now, 2 for a new table)",
    )
    pub.add_argument("--version", type=int, help="without --etcd: the new version")
    pub.add_argument(
        "--old-version", type=int, default=None, help="without --etcd: the version served now"
    )
    pub.add_argument(
        "--column",
        action="append",
        metavar="HOST:PORT,...",
        help="without --etcd: one replica of every shard, shard 0 first (repeat per replica)",
    )
    pub.add_argument(
        "--spare", metavar="HOST:PORT,...", help="without --etcd: the spare column, shard 0 first"
    )
    pub.add_argument("--token-file", metavar="FILE", help="the admin token, if one is needed")
    _tls_args(pub)
    pub.add_argument(
        "--drain-quiet",
        type=float,
        default=2.0,
        metavar="S",
        help="unload a draining replica once no lookup named it for S seconds (default: 2)",
    )
    pub.add_argument(
        "--drain-max",
        type=float,
        default=30.0,
        metavar="S",
        help="or after S seconds in all (default: 30)",
    )
    pub.set_defaults(run=_publish)
    return pub


def _inspect(args: argparse.Namespace) -> int:
    return _report(args, lambda a: inspect(a.dir))


def _verify(args: argparse.Namespace) -> int:
    return _report(args, lambda a: verify(a.dir, progress=not a.quiet and not a.json))


def _report(args: argparse.Namespace, read: Callable[[argparse.Namespace], dict[str, Any]]) -> int:
    """Print what ``read`` found in ``args.dir``, as JSON or text; exit 1 on damage, 2 when
    the directory cannot be read."""
    try:
        report = read(args)
    except EmbstoreError as e:
        print(f"embstore {args.command}: {args.dir}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(args.dir, report)
        if args.command == "verify":
            if report["damage"]:
                print(f"  DAMAGED: {len(report['damage'])} problem(s):")
                for line in report["damage"]:
                    print(f"    {line}")
            else:
                print("  ok: every record and checksum verified")
            if report["restarts"]:
                print(
                    f"  (the store changed during the walk: started over {report['restarts']} "
                    "time(s); the report is of the last manifest read)"
                )
    return 1 if report["damage"] else 0


def _config(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The settings in the TOML file at ``path``, as ``parser``'s defaults; ValueError for a
    file that cannot be read or a key that is not one of the command's flags."""
    import tomllib

    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read the config file {path}: {e}") from e
    known = {a.dest for a in parser._actions if a.option_strings} - {"help", "config"}
    renamed = {  # an old flag's name (a _Renamed alias) -> the dest of its new one
        o.lstrip("-").replace("-", "_"): (a.dest, a.new)
        for a in parser._actions
        if isinstance(a, _Renamed)
        for o in a.option_strings
    }
    out = {}
    for key, value in raw.items():
        dest = key.replace("-", "_")
        if dest in renamed:
            dest, new = renamed[dest]
            print(f"embstore: '{key}' in {path} is deprecated; use '{new[2:]}'", file=sys.stderr)
        if dest not in known:
            raise ValueError(
                f"unknown setting '{key}' in {path}; known: {', '.join(sorted(known))}"
            )
        if dest == "column" and isinstance(value, str):
            value = [value]
        out[dest] = value
    return out


def _tls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", metavar="PEM", help="talk TLS; the servers' CA")
    p.add_argument("--tls-cert", metavar="PEM", help="a client certificate (mutual TLS)")
    p.add_argument("--tls-key", metavar="PEM", help="the client certificate's key")
    p.add_argument("--tls-domain", help="the name the servers' certificates carry")


def _client_tls(args: argparse.Namespace) -> Any:
    from embstore.serving import native_tls

    return native_tls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_domain)


def _token(path: str | None) -> str | None:
    """The token in the file at ``path`` (surrounding whitespace dropped), or None."""
    if path is None:
        return None
    from embstore.errors import InvalidArgumentError

    try:
        token = pathlib.Path(path).read_text().strip()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the token file {path}: {e}") from e
    if not token:
        raise InvalidArgumentError(f"the token file {path} is empty")
    return token


def _catch_up(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = -1.0
    if not 0 <= s <= 86400:
        raise argparse.ArgumentTypeError(f"must be 0 to 86400 seconds, got {text!r}")
    return s


def _horizon(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = -1.0
    if not 0 <= s < 2**53 / 1000:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return s


def _serve_witness(args: argparse.Namespace) -> int:
    from embstore.witness import Witness

    missing = [
        flag
        for flag, v in (
            ("--follow HOST:PORT", args.follow),
            ("--model", args.model),
            ("--etcd", args.etcd),
            ("--data-dir", args.data_dir),
        )
        if not v
    ]
    if missing:
        print(f"embstore serve --witness: needs {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        w = Witness(
            args.follow,
            model=args.model,
            etcd=args.etcd,
            data_dir=args.data_dir,
            name=args.witness_name,
            token=_token(args.sync_token_file),
            tls_ca=args.sync_tls_ca,
            tls_cert=args.sync_tls_cert,
            tls_key=args.sync_tls_key,
            tls_domain=args.sync_tls_domain,
        ).start()
    except EmbstoreError as e:
        print(f"embstore serve: {e}", file=sys.stderr)
        return 2
    print(
        f"embstore serve: witness {w.name} of model {args.model}, following {args.follow}, "
        f"healthy store in {args.data_dir}; Ctrl-C or SIGTERM stops",
        flush=True,
    )

    def report(st: dict[str, Any]) -> None:
        tables = st["tables"].values()
        held = sum(t["healthy_rows"] for t in tables)
        restored = sum(t["restored_rows"] for t in tables)
        logged = sum(t["logged_keys"] for t in tables)
        print(
            f"embstore serve: witness {w.name}: tables {', '.join(st['tables']) or '-'}, "
            f"healthy up to {_fmt_ms(st['t_max_ms'] or None)}, {held:,} rows held "
            f"({restored:,} restored at start), {logged:,} keys logged since",
            flush=True,
        )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        last = None
        while not stop.wait(1.0):
            st = w.stats()
            now = (st["t_max_ms"], tuple(st["tables"]))
            if now != last:
                last = now
                report(st)
        report(w.stats())
    except KeyboardInterrupt:
        report(w.stats())
    finally:
        w.stop()
    print("embstore serve: stopped", flush=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from embstore.serving import Server

    if args.witness:
        return _serve_witness(args)
    if args.follow == "" and not (args.etcd and args.dc):
        print("embstore serve: --follow needs HOST:PORT, or --etcd and --dc", file=sys.stderr)
        return 2
    try:
        server = Server(
            args.store,
            args.listen,
            memory_budget_bytes=args.memory_budget,
            data_dir=args.data_dir,
            max_batch=args.max_batch,
            framed_listen=args.framed_listen,
            framed_unix=args.framed_unix,
            metrics=args.metrics,
            admin=args.admin,
            read_token=_token(args.read_token_file),
            admin_token=_token(args.admin_token_file),
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            etcd=_etcd(args.etcd) or None,
            advertise=args.advertise,
            lease_ttl_s=args.lease_ttl,
            sync_listen=args.sync_listen,
            sync_token=_token(args.sync_token_file),
            follow=args.follow,
            replica_id=args.replica_id,
            dc=args.dc,
            sync_advertise=args.sync_advertise,
            sync_events=args.sync_events,
            sync_tls_ca=args.sync_tls_ca,
            sync_tls_cert=args.sync_tls_cert,
            sync_tls_key=args.sync_tls_key,
            sync_tls_domain=args.sync_tls_domain,
            sync_cache=not args.sync_no_cache,
            sync_shard_versions=not args.sync_no_shard_versions,
            sync_priority=args.priority == "on",
            sync_tombstone_horizon_s=args.sync_tombstone_horizon,
            sync_with_state=args.sync_with_state,
            sync_precision=args.sync_precision,
            catch_up_timeout_s=args.catch_up_timeout,
        )
    except StoreLockedError as e:
        hint = ""
        if args.sync_listen:
            hint = (
                "; if a trainer has it open, serve the sync port from the training process "
                "instead: store.serve_sync(HOST:PORT, token=...) (docs/dissemination.md)"
            )
        print(f"embstore serve: {e}{hint}", file=sys.stderr)
        return 2
    except EmbstoreError as e:
        print(f"embstore serve: {e}", file=sys.stderr)
        return 2
    if server.tables:
        tables = f"tables {', '.join(server.tables)} (version 1)"
    elif args.etcd and not args.dc:
        tables = "the tables the cluster assigns here, as etcd records them"
    elif args.admin:
        tables = "no tables yet (`embstore load` loads them)"
    else:
        tables = "no tables"
    source = args.store or "no store"
    admin = ", admin calls on" if args.admin or (args.etcd and not args.dc) else ""
    if args.etcd and not args.dc:
        admin += f", member of the cluster in etcd {args.etcd}"
    if server.framed_address:
        admin += f", framed lookups on {server.framed_address}"
    if args.framed_unix:
        admin += f" and {args.framed_unix}"
    if server.metrics_address:
        admin += f", metrics on http://{server.metrics_address}/metrics"
    if server.sync_address:
        admin += f", sync port on {server.sync_address}"
    if args.follow is not None:
        via = args.follow or f"the sources in etcd for {args.dc}"
        into = " into the versions rolls load" if args.etcd and not args.dc else ""
        admin += f", following {via}{into}"
        if not into and args.catch_up_timeout > 0:
            admin += f" (serving once caught up, within {args.catch_up_timeout:g} s)"
        source = args.store or ("no store" if into else "an in-memory copy")
    elif args.dc:
        admin += f", registered in etcd as a primary of {args.dc}"
    if args.memory_budget:
        where = args.data_dir or "a directory under $TMPDIR"
        admin += f", memory budget {_size(args.memory_budget)} (loaded shards in {where})"
    print(
        f"embstore serve: {source} on {server.address}: {tables}{admin}; Ctrl-C or SIGTERM stops",
        flush=True,
    )
    try:
        server.run()
    except EmbstoreError as e:
        print(f"embstore serve: {e}", file=sys.stderr)
        return 1
    for st in server.sync_status():
        lag = "-" if st["lag_ms_p99"] is None else f"{st['lag_ms_p99']:.0f} ms"
        print(
            f"embstore serve: followed {st['table']} from {st['source']}: {st['rows_applied']:,} "
            f"rows applied, {st['parts']:,} parts pulled ({st['parts_from_cache']:,} from the "
            f"source's cache, {st['parts_skipped']:,} skipped as already known) in "
            f"{st['pulls']:,} pulls, {st['bytes_in']:,} bytes in, lag p99 "
            f"{lag}, {st['errors']} errors",
            flush=True,
        )
    print("embstore serve: stopped", flush=True)
    return 0


def _admin(args: argparse.Namespace) -> int:
    from embstore import _native

    extra = {}
    if args.command == "load":
        extra = {
            "shard": args.shard,
            "num_shards": args.num_shards,
            "checkpoint": str(args.checkpoint),
        }
    try:
        token = _token(args.token_file)
        held = _native.admin(
            args.server,
            args.command,
            args.table,
            args.version,
            **extra,
            token=token,
            tls=_client_tls(args),
        )
    except EmbstoreError as e:
        print(f"embstore {args.command}: {args.server}: {e}", file=sys.stderr)
        return 1
    _print_held(args.server, held)
    return 0


def _etcd(urls: str | None) -> list[str] | None:
    """``--etcd`` as the native calls take it."""
    return None if urls is None else [u for u in urls.split(",") if u.strip()]


def _publish(args: argparse.Namespace) -> int:
    from embstore import _native

    if not args.etcd:
        missing = [f for f in ("version", "column", "spare") if getattr(args, f) is None]
        if missing:
            print(
                "embstore publish: without --etcd, give the layout: "
                + ", ".join("--" + f for f in missing)
                + " missing",
                file=sys.stderr,
            )
            return 2
    try:
        token = _token(args.token_file)
        if args.etcd:
            version = _native.publish(
                _etcd(args.etcd),
                args.table,
                str(args.checkpoint),
                args.shards,
                args.max_shard_size,
                args.replicas,
                args.drain_quiet,
                args.drain_max,
                token=token,
                tls=_client_tls(args),
            )
            print(f"embstore publish: table '{args.table}' is at version {version}", flush=True)
        else:
            _native.roll(
                args.table,
                args.version,
                str(args.checkpoint),
                [c.split(",") for c in args.column],
                args.spare.split(","),
                args.old_version,
                args.drain_quiet,
                args.drain_max,
                token=token,
                tls=_client_tls(args),
            )
    except EmbstoreError as e:
        print(f"embstore publish: {e}", file=sys.stderr)
        return 1
    return 0


def _status(args: argparse.Namespace) -> int:
    from embstore import _native
    from embstore.serving import connect

    if not args.servers and not args.etcd:
        print("embstore status: give server addresses or --etcd", file=sys.stderr)
        return 2
    servers = list(args.servers)
    tables: list[dict[str, Any]] = []
    sync: list[dict[str, Any]] = []
    if args.etcd:
        try:
            members, controls = _native.cluster(_etcd(args.etcd))
        except EmbstoreError as e:
            print(f"embstore status: {e}", file=sys.stderr)
            return 1
        tables = [json.loads(c) for c in controls]
        try:
            sync = _native.sync_members(_etcd(args.etcd))
        except EmbstoreError as e:
            print(f"embstore status: {e}", file=sys.stderr)
            return 1
        servers += [addr for _, addr in members if addr not in servers]
        if not args.json:
            for t in tables:
                _print_control(t)
            _print_sync(sync)
        if not servers:
            if args.json:
                print(json.dumps({"tables": tables, "servers": {}, "sync": sync}))
            elif not sync:
                print("no server is registered")
            return 0
    try:
        token = _token(args.token_file)
        view = connect(
            servers,
            deadline_s=3.0,
            max_restarts=0,
            token=token,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_domain=args.tls_domain,
        ).view()
    except EmbstoreError as e:
        print(f"embstore status: {e}", file=sys.stderr)
        return 1
    held_by = {a: None if h is None else [list(x) for x in h] for a, h in view}
    if args.json:
        out = {"tables": tables, "servers": held_by, "sync": sync} if args.etcd else held_by
        print(json.dumps(out))
        return 0
    for addr, held in view:
        _print_held(addr, held)
    return 0


def _print_sync(members: list[dict[str, Any]]) -> None:
    """The replicas that sync, by data centre: primaries, and per followed table its lag, the
    parts still to pull, bytes pulled and its source (the DC's leader or a primary)."""
    for m in sorted(members, key=lambda m: (m["dc"], not m["primary"], m["replica"])):
        role = "primary" if m["primary"] else "replica"
        port = f" sync port {m['addr']}" if m["addr"] else ""
        print(f"sync {m['dc']} {role} {m['replica']}{port}: {m['status'] or '-'}")


def _print_control(t: dict[str, Any]) -> None:
    """A table's control record: what is served, where, and its last roll."""
    print(
        f"table {t['table']}: version {t['version']}, {t['num_shards']} shards "
        f"x {t['replicas']} replicas, checkpoint {t['checkpoint']}"
    )
    for s, replicas in enumerate(t["assignment"]):
        print(f"  shard {s}: {', '.join(replicas)}")
    roll = t.get("roll")
    if roll:
        line = (
            f"  last roll: {roll['from_version']} -> {roll['to_version']} {roll['state']}"
            f" (by {roll['coordinator']}), step: {roll['step']}"
        )
        print(line + (f", error: {roll['error']}" if roll["error"] else ""))


def _print_held(addr: str, held: list[tuple[str, int, int, int, str]] | None) -> None:
    """What a server holds, a line per table version (None: it did not answer)."""
    print(f"{addr}: no answer" if held is None else f"{addr}:{'' if held else ' nothing held'}")
    for table, version, shard, num_shards, state in held or []:
        print(f"  {table:<20} version {version:<8} shard {shard}/{num_shards}  {state}")


if __name__ == "__main__":
    sys.exit(main())
