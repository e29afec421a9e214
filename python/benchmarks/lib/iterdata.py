"""Three datasets for the iterative-ML benchmarks (PageRank on a graph, LDA on a corpus), built
from Debian's own package data on this machine. Nothing here is committed: the files go to
``--out`` (default ``.data/iter``).

- ``debian-graph.tsv``: the package dependency graph from ``apt-cache dumpavail``. An edge
  ``pkg -> dep`` for every name in a package's ``Depends`` and ``Pre-Depends`` (alternatives
  ``a | b`` give an edge to each; version constraints ``(...)`` and ``:any``/``:arch``
  qualifiers are dropped; duplicates and self-loops are dropped). Nodes are every package and
  every dependency target, numbered 0..N-1 in sorted order of name;
  ``debian-graph.names.txt`` has name ``i`` on line ``i`` (0-based). Lines are ``src<TAB>dst``,
  sorted, after ``#`` header lines (source, date, counts).
- ``debian-graph-x16.tsv``: synthetic, 16 relabelled copies of that graph (copy ``k``'s node
  ``i`` is ``k*N + i``) and 1 % extra edges (1 % of the union's edge count, rounded), each from
  a uniformly random node of one copy to a uniformly random node of another, seeded
  (:data:`X16_SEED`), without duplicates. Same format.
- ``manpages-tokens.txt``: an LDA corpus, one document per man page of Debian's ``manpages``
  and ``manpages-dev`` (regular files under ``usr/share/man``; symlinks and ``.so`` alias
  pages are skipped). A page is rendered by ``MANWIDTH=100 man -l -Tutf8 FILE | col -bx``,
  lower-cased and cut into tokens by ``[a-z][a-z_]{2,}``; a line is
  ``docname<TAB>token token ...`` (docname: the path under ``usr/share/man`` without ``.gz``).
  The installed packages are read if complete, else their ``.deb`` files are downloaded
  (``apt-get download``) and unpacked into a temporary folder, never installed.

Every output is written atomically (a temporary file, then a rename) and skipped when it
exists (``--force`` rebuilds); ``manifest.json`` describes them all, from their headers.

Command line (from the repository root)::

    .venv/bin/python python/benchmarks/lib/iterdata.py [--out .data/iter] [--force]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gzip
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import numpy as np

X16_COPIES = 16
X16_CROSS_SHARE = 0.01
X16_SEED = 20261208
MAN_PACKAGES = ("manpages", "manpages-dev")
TOKEN_RE = re.compile(r"[a-z][a-z_]{2,}")
MIN_FREQ = 5
POOL = 2
PROGRESS_EVERY = 200

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


@contextlib.contextmanager
def atomic_write(path: pathlib.Path) -> Iterator[object]:
    """Open ``path``'s temporary sibling for text writing; rename it over ``path`` on success."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_header(path: pathlib.Path) -> dict[str, str]:
    """The ``# key: value`` lines at the top of one of our outputs."""
    header = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            key, sep, value = line[1:].partition(":")
            if sep:
                header[key.strip()] = value.strip()
    return header


def write_header(f, fields: dict[str, object]) -> None:
    for key, value in fields.items():
        f.write(f"# {key}: {value}\n")


def write_edges(f, src: np.ndarray, dst: np.ndarray, chunk: int = 1 << 20) -> None:
    for lo in range(0, len(src), chunk):
        pairs = zip(src[lo : lo + chunk].tolist(), dst[lo : lo + chunk].tolist(), strict=True)
        f.write("".join(f"{a}\t{b}\n" for a, b in pairs))


# ---------------------------------------------------------------------------------------------
# The dependency graph


def dumpavail() -> str:
    """``apt-cache dumpavail``'s text; runs ``apt-get update -q`` first if it lists nothing."""
    log("running apt-cache dumpavail")
    text = subprocess.run(
        ["apt-cache", "dumpavail"], check=True, capture_output=True, text=True
    ).stdout
    if "\nPackage:" not in "\n" + text:
        log("apt-cache dumpavail listed no packages: running apt-get update -q, then again")
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=sys.stderr)
        text = subprocess.run(
            ["apt-cache", "dumpavail"], check=True, capture_output=True, text=True
        ).stdout
    return text


def parse_stanzas(text: str) -> Iterator[dict[str, str]]:
    """Deb822 stanzas (blank-line separated; a line starting with a space continues a field)."""
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t"):
                if key is not None:
                    fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            yield fields


def dependency_names(value: str) -> list[str]:
    """The package names a ``Depends`` value mentions (every alternative of ``a | b``)."""
    names = []
    for part in re.split(r"[,|]", re.sub(r"\([^)]*\)", "", value)):
        name = part.strip().split(":", 1)[0].strip()
        if name:
            names.append(name)
    return names


def build_graph(out: pathlib.Path) -> None:
    text = dumpavail()
    packages: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    for st in parse_stanzas(text):
        pkg = st.get("Package")
        if not pkg:
            continue
        packages.add(pkg)
        for field in ("Depends", "Pre-Depends"):
            for dep in dependency_names(st.get(field, "")):
                if dep != pkg:
                    pairs.add((pkg, dep))
    names = sorted(packages | {d for _, d in pairs})
    ids = {n: i for i, n in enumerate(names)}
    edges = np.array(sorted((ids[a], ids[b]) for a, b in pairs), dtype=np.int64).reshape(-1, 2)
    log(f"debian-graph: {len(packages):,} packages, {len(names):,} nodes, {len(edges):,} edges")
    with atomic_write(out / "debian-graph.names.txt") as f:
        f.write("".join(n + "\n" for n in names))
    with atomic_write(out / "debian-graph.tsv") as f:
        write_header(
            f,
            {
                "dataset": "Debian package dependency graph (Depends + Pre-Depends; pkg -> dep)",
                "source": "apt-cache dumpavail",
                "date": utc_now(),
                "packages": len(packages),
                "nodes": len(names),
                "edges": len(edges),
                "names": "debian-graph.names.txt (line i = node i)",
                "format": "src<TAB>dst, sorted",
            },
        )
        write_edges(f, edges[:, 0], edges[:, 1])


def load_edges(path: pathlib.Path) -> np.ndarray:
    """An ``(E, 2)`` int64 array of a TSV edge file's ``src dst`` lines (``#`` lines skipped)."""
    with open(path, encoding="utf-8") as f:
        body = "".join(line for line in f if not line.startswith("#"))
    return np.array(body.split(), dtype=np.int64).reshape(-1, 2)


def build_x16(out: pathlib.Path) -> None:
    base = out / "debian-graph.tsv"
    n = int(read_header(base)["nodes"])
    edges = load_edges(base)
    k = X16_COPIES
    offsets = np.repeat(np.arange(k, dtype=np.int64) * n, len(edges))
    src = np.tile(edges[:, 0], k) + offsets
    dst = np.tile(edges[:, 1], k) + offsets
    n_cross = round(X16_CROSS_SHARE * len(src))
    rng = np.random.default_rng(X16_SEED)
    cross: set[tuple[int, int]] = set()
    while len(cross) < n_cross:  # a cross edge joins two copies: it never repeats a copy's edge
        m = n_cross - len(cross)
        a = rng.integers(0, k, m)
        b = (a + rng.integers(1, k, m)) % k  # another copy, uniformly
        s = a * n + rng.integers(0, n, m)
        d = b * n + rng.integers(0, n, m)
        for pair in zip(s.tolist(), d.tolist(), strict=True):
            if len(cross) < n_cross:
                cross.add(pair)
    extra = np.array(sorted(cross), dtype=np.int64).reshape(-1, 2)
    src = np.concatenate([src, extra[:, 0]])
    dst = np.concatenate([dst, extra[:, 1]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    log(f"debian-graph-x16: {k * n:,} nodes, {len(src):,} edges ({n_cross:,} cross)")
    with atomic_write(out / "debian-graph-x16.tsv") as f:
        write_header(
            f,
            {
                "dataset": f"synthetic: {k} relabelled copies of debian-graph.tsv (copy k's node "
                f"i is k*{n} + i) plus {X16_CROSS_SHARE:.0%} random cross-copy edges",
                "source": "debian-graph.tsv (apt-cache dumpavail), synthetic",
                "date": utc_now(),
                "base_date": read_header(base).get("date", "?"),
                "seed": X16_SEED,
                "copies": k,
                "cross_edges": n_cross,
                "nodes": k * n,
                "edges": len(src),
                "format": "src<TAB>dst, sorted",
            },
        )
        write_edges(f, src, dst)


# ---------------------------------------------------------------------------------------------
# The man-page corpus


Pages = tuple[pathlib.Path, list[pathlib.Path], dict[str, str]]  # man root, files, versions


def installed_pages() -> Pages | None:
    """The man files of the installed packages and their versions; None unless all are there
    (a package missing, or files left out by a dpkg ``path-exclude``)."""
    files, versions = [], {}
    for pkg in MAN_PACKAGES:
        listing = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        if listing.returncode != 0:
            log(f"{pkg} is not installed")
            return None
        paths = [pathlib.Path(p) for p in listing.stdout.splitlines()]
        paths = [p for p in paths if p.parts[1:4] == ("usr", "share", "man") and len(p.parts) > 5]
        if not all(p.exists() or p.is_symlink() for p in paths):
            log(f"{pkg} is installed without all its man pages (a dpkg path-exclude?)")
            return None
        files += [p for p in paths if p.is_file() and not p.is_symlink()]
        versions[pkg] = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", pkg], check=True, capture_output=True, text=True
        ).stdout
    return pathlib.Path("/usr/share/man"), files, versions


def downloaded_pages(tmp: pathlib.Path) -> Pages:
    """``apt-get download`` the packages into ``tmp`` and unpack them there."""
    log(f"apt-get download {' '.join(MAN_PACKAGES)} (into {tmp}; not installed)")
    subprocess.run(["apt-get", "download", *MAN_PACKAGES], check=True, cwd=tmp, stdout=sys.stderr)
    root = tmp / "root"
    versions = {}
    for pkg in MAN_PACKAGES:
        (deb,) = tmp.glob(f"{pkg}_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        versions[pkg] = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
        ).stdout.strip()
    man = root / "usr" / "share" / "man"
    files = [p for p in man.rglob("*") if p.is_file() and not p.is_symlink()]
    return man, files, versions


def is_so_alias(path: pathlib.Path) -> bool:
    """Whether a page is only a ``.so other-page`` line (roff comments and blank lines aside)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    lines = [ln.strip() for ln in raw.decode("utf-8", "replace").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(('.\\"', "'\\\"", ".\\#"))]
    return len(lines) == 1 and lines[0].startswith(".so ")


def render(path: str) -> tuple[str, list[str], str]:
    """``(path, tokens, stderr)`` of one page rendered by ``man -l -Tutf8 | col -bx``."""
    env = {k: v for k, v in os.environ.items() if k != "MAN_KEEP_FORMATTING"}
    env.update(MANWIDTH="100", LC_ALL="C.UTF-8")
    man = subprocess.Popen(
        ["man", "-l", "-Tutf8", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    col = subprocess.run(["col", "-bx"], stdin=man.stdout, capture_output=True, env=env)
    man.stdout.close()
    err = man.stderr.read().decode("utf-8", "replace")
    if man.wait() != 0 or col.returncode != 0:
        err += f" (man exit {man.returncode}, col exit {col.returncode})"
    text = col.stdout.decode("utf-8", "replace").lower()
    return path, TOKEN_RE.findall(text), err.strip()


def ensure_man() -> None:
    if shutil.which("man") is None or shutil.which("col") is None:
        log("man or col is missing: apt-get install -y -q man-db bsdextrautils")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "man-db", "bsdextrautils"],
            check=True,
            stdout=sys.stderr,
        )


def build_manpages(out: pathlib.Path) -> None:
    ensure_man()
    with tempfile.TemporaryDirectory(prefix="iterdata-") as tmpdir:
        found = installed_pages()
        root, files, versions = found if found else downloaded_pages(pathlib.Path(tmpdir))
        docs = {str(p.relative_to(root)).removesuffix(".gz"): p for p in files}
        aliases = sorted(name for name, p in docs.items() if is_so_alias(p))
        for name in aliases:
            del docs[name]
        names = sorted(docs)
        log(
            f"manpages: {len(files):,} regular files, {len(aliases)} .so aliases skipped, "
            f"rendering {len(names):,} pages with {POOL} processes"
        )
        by_path = {str(docs[n]): n for n in names}
        tokens: dict[str, list[str]] = {}
        with multiprocessing.Pool(POOL) as pool:
            results = pool.imap_unordered(render, list(by_path), chunksize=4)
            for i, (path, toks, err) in enumerate(results, 1):
                tokens[by_path[path]] = toks
                if err:
                    log(f"  {by_path[path]}: {err.splitlines()[0][:160]}")
                if i % PROGRESS_EVERY == 0 or i == len(names):
                    log(f"  rendered {i:,}/{len(names):,} pages")
    freq = collections.Counter(t for toks in tokens.values() for t in toks)
    n_tokens = sum(freq.values())
    frequent = sum(1 for c in freq.values() if c >= MIN_FREQ)
    log(
        f"manpages-tokens: {len(names):,} documents, {n_tokens:,} tokens, vocabulary "
        f"{len(freq):,} ({frequent:,} words with frequency >= {MIN_FREQ})"
    )
    with atomic_write(out / "manpages-tokens.txt") as f:
        write_header(
            f,
            {
                "dataset": "LDA corpus: Debian man pages, one document per page",
                "source": "MANWIDTH=100 man -l -Tutf8 FILE | col -bx, lower-cased, tokens "
                f"{TOKEN_RE.pattern}; packages {', '.join(MAN_PACKAGES)}",
                "date": utc_now(),
                "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
                "skipped": f"{len(aliases)} .so alias pages, symlinks",
                "documents": len(names),
                "tokens": n_tokens,
                "vocabulary": len(freq),
                f"words_freq_ge_{MIN_FREQ}": frequent,
                "format": "docname<TAB>space-separated tokens",
            },
        )
        f.write("".join(f"{n}\t{' '.join(tokens[n])}\n" for n in names))


# ---------------------------------------------------------------------------------------------


def write_manifest(out: pathlib.Path) -> None:
    """``manifest.json``: every output's counts, date and source, read from its header."""
    keys = {
        "debian-graph.tsv": ("packages", "nodes", "edges"),
        "debian-graph-x16.tsv": ("nodes", "edges", "cross_edges", "seed"),
        "manpages-tokens.txt": ("documents", "tokens", "vocabulary", f"words_freq_ge_{MIN_FREQ}"),
    }
    manifest = {}
    for name, counts in keys.items():
        path = out / name
        if not path.exists():
            continue
        h = read_header(path)
        entry: dict[str, object] = {k: int(h[k]) for k in counts if k in h}
        if "edges" in entry:
            entry["rows"] = entry["edges"]
        if "documents" in entry:
            entry["rows"] = entry["documents"]
        entry.update(date=h.get("date"), source=h.get("source"), bytes=path.stat().st_size)
        if "versions" in h:
            entry["versions"] = h["versions"]
        manifest[name] = entry
    with atomic_write(out / "manifest.json") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Build the iterative-ML benchmark datasets from this Debian machine's own "
        "package data: debian-graph.tsv (+ .names.txt), debian-graph-x16.tsv and "
        "manpages-tokens.txt, with manifest.json. May run apt-get update / download / install "
        "(man-db) when something is missing. Takes about a minute or two.",
        epilog="Existing outputs are kept ('up to date') unless --force; "
        "debian-graph-x16.tsv is rebuilt when debian-graph.tsv is newer.",
    )
    ap.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(".data/iter"),
        help="output folder (default: .data/iter)",
    )
    ap.add_argument("--force", action="store_true", help="rebuild outputs that exist")
    args = ap.parse_args(argv)
    out: pathlib.Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    def stale(name: str, after: str | None = None) -> bool:
        path = out / name
        if args.force or not path.exists():
            return True
        if after and (out / after).stat().st_mtime > path.stat().st_mtime:
            log(f"{name}: {after} is newer, rebuilding")
            return True
        log(f"{name}: up to date")
        return False

    if stale("debian-graph.tsv") or not (out / "debian-graph.names.txt").exists():
        build_graph(out)
    if stale("debian-graph-x16.tsv", after="debian-graph.tsv"):
        build_x16(out)
    if stale("manpages-tokens.txt"):
        build_manpages(out)
    write_manifest(out)
    log(f"wrote {out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
