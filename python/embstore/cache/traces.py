"""Request traces for the inference cache: MovieLens-100k as ML7 / ML11, and key qualification.

A trace is ``N`` requests of ``G`` keys, one key per table (``G = T``, one-hot fields). Keys
are table-qualified ``uint64``: ``key = table_index << 48 | id`` with ``id < 2**48``, so the
same id in two tables is two keys. Shape letters: ``N`` requests, ``G`` keys per request.

Parts:

- :class:`Trace` — the arrays of one trace: ``keys`` (``uint64[N, G]``), the per-table dense
  ``ids`` (``int64[N, G]``) they were made from, ``tables`` (field names), and per request the
  ``timestamps``, the raw ``users`` (for per-user chronological splits) and ``labels``.
- :func:`qualify` — ``int[N, G]`` per-table ids to ``uint64[N, G]`` keys.
- :func:`movielens` — ML-100k (the recbole atomic files) as a trace of 7 or 11 fields.

Layout of ``keys`` for ML7 (one row per rating, in time order)::

    column:   0       1       2       3          4             5       6
    table:    user    item    age     gender     occupation    zip     release_year
    key:      0<<48|u 1<<48|i 2<<48|a 3<<48|g    4<<48|o       5<<48|z 6<<48|y

Every field's values get dense ids ``0..n-1`` in order of first appearance in the
time-ordered trace, so a trace is fully determined by its files.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

import numpy as np

from embstore.errors import DTypeError, InvalidArgumentError, ShapeError

__all__ = ["ML_FIELDS", "Trace", "movielens", "qualify"]

#: Bits of a key that hold the id; the table index sits above them.
ID_BITS = 48
#: Ids must be below this (2**48).
ID_LIMIT = 1 << ID_BITS
#: At most this many tables (the table index is 16 bits).
MAX_TABLES = 1 << (64 - ID_BITS)

#: The MovieLens fields in nesting order: ``fields=7`` (ML7) takes the first 7, ``fields=11``
#: (ML11) all of them. The last four are crosses: ``user_x_genre`` pairs the user with the
#: item's first listed genre, ``user_x_hour`` with the rating's hour of day (UTC).
ML_FIELDS: tuple[str, ...] = (
    "user",
    "item",
    "age",
    "gender",
    "occupation",
    "zip",
    "release_year",
    "item_x_gender",
    "item_x_occupation",
    "user_x_genre",
    "user_x_hour",
)


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """``N`` requests of ``G`` keys, one per table.

    Attributes:
        keys: ``uint64[N, G]`` table-qualified keys; row ``n`` is request ``n``. For traces
            built here, ``keys == qualify(ids)``.
        tables: the ``G`` table (field) names, in column order.
        ids: ``int64[N, G]`` the per-table ids before qualification (dense: ``0..n_g - 1``).
        timestamps: ``int64[N]`` seconds since the epoch, non-decreasing for MovieLens.
        users: ``int64[N]`` the raw user id of each request (for per-user splits).
        labels: ``int8[N]`` the click-style label (MovieLens: ``rating >= 4``), or ``None``.
    """

    keys: np.ndarray
    tables: list[str]
    ids: np.ndarray
    timestamps: np.ndarray
    users: np.ndarray
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        keys, ids = np.asarray(self.keys), np.asarray(self.ids)
        if keys.dtype != np.uint64 or keys.ndim != 2:
            raise DTypeError(f"keys must be 2-D uint64 [N, G], got {keys.ndim}-D {keys.dtype}")
        if ids.dtype.kind not in "iu" or ids.ndim != 2:
            raise DTypeError(f"ids must be 2-D int64 [N, G], got {ids.ndim}-D {ids.dtype}")
        n, g = keys.shape
        if ids.shape != keys.shape:
            raise ShapeError(
                f"ids must match keys' shape {list(keys.shape)}, got {list(ids.shape)}"
            )
        tables = list(self.tables)
        if len(tables) != g:
            raise ShapeError(f"{g} key columns but {len(tables)} table names")
        object.__setattr__(self, "keys", np.ascontiguousarray(keys))
        object.__setattr__(self, "ids", np.ascontiguousarray(ids, dtype=np.int64))
        object.__setattr__(self, "tables", tables)
        for what in ("timestamps", "users", "labels"):
            value = getattr(self, what)
            if value is None and what == "labels":
                continue
            arr = np.asarray(value)
            if arr.dtype.kind not in "iub" or arr.shape != (n,):
                raise ShapeError(
                    f"{what} must be 1-D integers of length {n}, got {arr.dtype} {list(arr.shape)}"
                )
            dtype = np.int8 if what == "labels" else np.int64
            object.__setattr__(self, what, np.ascontiguousarray(arr, dtype=dtype))

    def __len__(self) -> int:
        """Number of requests (``N``)."""
        return int(self.keys.shape[0])

    def __repr__(self) -> str:
        n, g = self.keys.shape
        return f"Trace({n} requests x {g} tables: {', '.join(self.tables)})"

    def unique_keys(self) -> np.ndarray:
        """The distinct keys, sorted: ``uint64[K]`` (the working set over all tables)."""
        return np.unique(self.keys)

    def num_embeddings(self) -> list[int]:
        """Rows each table needs for its dense ids (``ids[:, g].max() + 1``; 0 when empty)."""
        if self.ids.shape[0] == 0:
            return [0] * self.ids.shape[1]
        return [int(m) + 1 for m in self.ids.max(axis=0)]


def qualify(table_ids: np.ndarray) -> np.ndarray:
    """Table-qualified keys: column ``g``'s ids tagged with table ``g``.

    Args:
        table_ids: ``int[N, G]`` non-negative ids below ``2**48``, column ``g`` from table
            ``g``; ``G`` at most 65,536.

    Returns ``uint64[N, G]`` with ``key[n, g] = g << 48 | table_ids[n, g]``.

    Example::

        >>> qualify(np.array([[5, 5]])).tolist()
        [[5, 281474976710661]]
    """
    arr = np.asarray(table_ids)
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"table_ids must be 2-D integers, got {arr.ndim}-D {arr.dtype}")
    if arr.ndim != 2:
        raise ShapeError(f"table_ids must be 2-D [N, G], got {arr.ndim}-D shape {list(arr.shape)}")
    g = arr.shape[1]
    if g > MAX_TABLES:
        raise InvalidArgumentError(f"at most {MAX_TABLES} tables fit in a key, got G = {g}")
    if arr.size:
        if arr.dtype.kind == "i" and (lo := int(arr.min())) < 0:
            raise InvalidArgumentError(f"table_ids must be >= 0, got {lo}")
        if (hi := int(arr.max())) >= ID_LIMIT:
            raise InvalidArgumentError(f"table_ids must be below 2**48, got {hi}")
    tags = np.arange(g, dtype=np.uint64) << np.uint64(ID_BITS)
    return np.ascontiguousarray(arr.astype(np.uint64) | tags)


def movielens(path: str | os.PathLike[str], fields: int = 7) -> Trace:
    """MovieLens-100k as a request trace: one request per rating, in time order.

    Args:
        path: a directory holding the recbole atomic files ``ml-100k.inter``,
            ``ml-100k.user`` and ``ml-100k.item`` (tab-separated, typed header such as
            ``user_id:token``).
        fields: how many of :data:`ML_FIELDS` to use: 7 is ML7 (user, item, age, gender,
            occupation, zip, release_year), 11 is ML11 (ML7 plus item x gender,
            item x occupation, user x first genre, user x hour of day). Any 1..11 gives that
            prefix (the nested subsets).

    Requests are sorted by ``(timestamp, user, item)`` (ids compared as numbers). Field
    values are raw tokens, and each field's distinct tokens get dense ids in order of first
    appearance; a cross gets dense ids over its distinct pairs. Tokens are not cleaned: the
    two items without a release year keep their tokens (``unkonwn`` and ``V``) as two
    values. ``labels`` is ``rating >= 4``.

    On the full data set: 100,000 requests; 3,577 distinct keys for ML7, 37,685 for ML11.
    """
    if isinstance(fields, bool) or not isinstance(fields, int | np.integer):
        raise DTypeError(f"fields must be an int, got {type(fields).__name__}")
    if not 1 <= fields <= len(ML_FIELDS):
        raise InvalidArgumentError(
            f"fields must be in 1..{len(ML_FIELDS)} (7: ML7, 11: ML11), got {fields}"
        )
    root = pathlib.Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no MovieLens directory at {str(root)!r}")
    inter = _read_atomic(root / "ml-100k.inter", ("user_id", "item_id", "rating", "timestamp"))
    user_file = _read_atomic(
        root / "ml-100k.user", ("user_id", "age", "gender", "occupation", "zip_code")
    )
    item_file = _read_atomic(root / "ml-100k.item", ("item_id", "release_year", "class"))

    user = _integers(inter["user_id"], "ml-100k.inter", "user_id")
    item = _integers(inter["item_id"], "ml-100k.inter", "item_id")
    timestamp = _integers(inter["timestamp"], "ml-100k.inter", "timestamp")
    try:
        rating = np.array(inter["rating"], dtype=np.float64)
    except ValueError as e:
        raise InvalidArgumentError(f"ml-100k.inter: a rating is not a number ({e})") from None

    order = np.lexsort((item, user, timestamp))  # the last key is the primary one
    user, item, timestamp, rating = user[order], item[order], timestamp[order], rating[order]

    urow = _rows_of(user, _integers(user_file["user_id"], "ml-100k.user", "user_id"), "user")
    irow = _rows_of(item, _integers(item_file["item_id"], "ml-100k.item", "item_id"), "item")

    def side(table: dict[str, list[str]], column: str, rows: np.ndarray) -> np.ndarray:
        return np.array(table[column], dtype=str)[rows]

    first_genre = np.array([(c.split() or [""])[0] for c in item_file["class"]], dtype=str)
    columns: dict[str, np.ndarray] = {}
    columns["user"] = _dense(user)
    columns["item"] = _dense(item)
    columns["age"] = _dense(side(user_file, "age", urow))
    columns["gender"] = _dense(side(user_file, "gender", urow))
    columns["occupation"] = _dense(side(user_file, "occupation", urow))
    columns["zip"] = _dense(side(user_file, "zip_code", urow))
    columns["release_year"] = _dense(side(item_file, "release_year", irow))
    if fields > 7:
        columns["item_x_gender"] = _cross(columns["item"], columns["gender"])
        columns["item_x_occupation"] = _cross(columns["item"], columns["occupation"])
        columns["user_x_genre"] = _cross(columns["user"], _dense(first_genre[irow]))
        columns["user_x_hour"] = _cross(columns["user"], (timestamp // 3600) % 24)

    tables = list(ML_FIELDS[:fields])
    ids = np.stack([columns[t] for t in tables], axis=1).astype(np.int64)
    return Trace(
        keys=qualify(ids),
        tables=tables,
        ids=ids,
        timestamps=timestamp,
        users=user,
        labels=(rating >= 4).astype(np.int8),
    )


def _read_atomic(file: pathlib.Path, columns: tuple[str, ...]) -> dict[str, list[str]]:
    """The named columns of a recbole atomic file (tab-separated, header ``name:type``)."""
    with open(file, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if not lines or not lines[0].strip():
        raise InvalidArgumentError(f"{file.name}: empty file, expected a header line")
    header = [h.split(":", 1)[0] for h in lines[0].rstrip("\r").split("\t")]
    missing = [c for c in columns if c not in header]
    if missing:
        raise InvalidArgumentError(f"{file.name}: no column {missing} in the header {header}")
    at = [header.index(c) for c in columns]
    out: dict[str, list[str]] = {c: [] for c in columns}
    for number, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise InvalidArgumentError(
                f"{file.name}:{number}: {len(cells)} fields, the header has {len(header)}"
            )
        for c, i in zip(columns, at, strict=True):
            out[c].append(cells[i])
    return out


def _integers(tokens: list[str], file: str, column: str) -> np.ndarray:
    """``int64`` values of numeric tokens (``881250949`` or ``881250949.0``)."""
    try:
        values = np.array(tokens, dtype=np.float64)
    except ValueError:
        bad = next(t for t in tokens if not _is_number(t))
        raise InvalidArgumentError(f"{file}: {column} {bad!r} is not a number") from None
    if values.size and not np.all(np.isfinite(values) & (values == np.floor(values))):
        raise InvalidArgumentError(f"{file}: {column} holds a value that is not an integer")
    if values.size and np.abs(values).max() >= 2.0**53:
        raise InvalidArgumentError(f"{file}: {column} holds a value beyond 2**53")
    return values.astype(np.int64)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _rows_of(values: np.ndarray, keys: np.ndarray, what: str) -> np.ndarray:
    """For each of ``values``, its row in a side file keyed by ``keys``."""
    if np.unique(keys).size != keys.size:
        raise InvalidArgumentError(f"ml-100k.{what}: a {what}_id appears twice")
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], values), max(keys.size - 1, 0))
    found = keys[order][pos] == values if keys.size else np.zeros(values.size, dtype=bool)
    if not found.all():
        raise InvalidArgumentError(
            f"{what} {int(values[~found][0])} of ml-100k.inter is missing from ml-100k.{what}"
        )
    return order[pos]


def _dense(values: np.ndarray) -> np.ndarray:
    """``int64`` ids ``0..n-1`` for the distinct values, in order of first appearance."""
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size, dtype=np.int64)
    return rank[inverse.reshape(-1)]


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense ids of the pairs ``(a[n], b[n])`` (both non-negative ints)."""
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    return _dense(a.astype(np.int64) * (int(b.max()) + 1) + b.astype(np.int64))
