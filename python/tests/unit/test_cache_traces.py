"""embstore.cache.traces (MovieLens traces, key qualification) and the libCacheSim baselines."""

import pathlib
from collections import OrderedDict

import numpy as np
import pytest

import embstore
from embstore.cache import traces

ML100K = pathlib.Path(__file__).resolve().parents[3] / ".data" / "ml-100k"

# A tiny ML-100k in recbole's atomic format: 3 users, 4 items, 6 ratings in file order
# a..f, deliberately out of time order. Sorted by (timestamp, user, item) they are
# f, d, b, c, a, e (d and b tie on time and user; c and a tie on time).
_INTER = [
    ("3", "10", "4", "7260"),  # a  02:01 UTC
    ("1", "20", "2", "3600"),  # b  01:00
    ("2", "10", "5", "7260"),  # c  02:01
    ("1", "10", "3", "3600"),  # d  01:00
    ("1", "30", "1", "90000"),  # e  next day, 01:00
    ("3", "40", "4", "0"),  # f  00:00
]
_USERS = [
    ("1", "24", "M", "technician", "85711"),
    ("2", "53", "F", "other", "94043"),
    ("3", "24", "M", "technician", "32067"),
]
_ITEMS = [
    ("10", "Toy Story", "1995", "Comedy Drama"),
    ("20", "Get Shorty", "1995", "Comedy Action"),
    ("30", "unkonwn", "unkonwn", "unknown"),  # ML-100k's item 267 looks like this
    ("40", "Star Wars", "1977", "Drama"),
]

# Expected, in time order f d b c a e. Dense ids follow first appearance.
_USERS_RAW = [3, 1, 1, 2, 3, 1]
_ML11_IDS = {
    "user": [0, 1, 1, 2, 0, 1],  # 3, 1, 1, 2, 3, 1
    "item": [0, 1, 2, 1, 1, 3],  # 40, 10, 20, 10, 10, 30
    "age": [0, 0, 0, 1, 0, 0],  # 24, 24, 24, 53, 24, 24
    "gender": [0, 0, 0, 1, 0, 0],
    "occupation": [0, 0, 0, 1, 0, 0],
    "zip": [0, 1, 1, 2, 0, 1],  # 32067, 85711, 85711, 94043, 32067, 85711
    "release_year": [0, 1, 1, 1, 1, 2],  # 1977, 1995 x4, unkonwn
    "item_x_gender": [0, 1, 2, 3, 1, 4],  # (i0,M) (i1,M) (i2,M) (i1,F) (i1,M) (i3,M)
    "item_x_occupation": [0, 1, 2, 3, 1, 4],
    # (u0,Drama) (u1,Comedy) (u1,Comedy) (u2,Comedy) (u0,Comedy) (u1,unknown): first genres
    "user_x_genre": [0, 1, 1, 2, 3, 4],
    "user_x_hour": [0, 1, 1, 2, 3, 1],  # (u0,0) (u1,1) (u1,1) (u2,2) (u0,2) (u1,1)
}


def _write_tiny(root: pathlib.Path) -> pathlib.Path:
    def write(name, header, rows):
        text = "\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows)
        (root / name).write_text(text, encoding="utf-8")

    write(
        "ml-100k.inter",
        ["user_id:token", "item_id:token", "rating:float", "timestamp:float"],
        _INTER,
    )
    write(
        "ml-100k.user",
        ["user_id:token", "age:token", "gender:token", "occupation:token", "zip_code:token"],
        _USERS,
    )
    write(
        "ml-100k.item",
        ["item_id:token", "movie_title:token_seq", "release_year:token", "class:token_seq"],
        _ITEMS,
    )
    return root


@pytest.fixture
def tiny(tmp_path):
    return _write_tiny(tmp_path)


# --- traces.movielens ---------------------------------------------------------------------


def test_movielens_orders_requests_by_time_then_user_then_item(tiny):
    t = traces.movielens(tiny, fields=7)
    assert len(t) == 6
    assert t.timestamps.tolist() == [0, 3600, 3600, 7260, 7260, 90000]
    assert t.users.tolist() == _USERS_RAW
    assert t.ids[:, 1].tolist() == _ML11_IDS["item"]
    assert t.timestamps.dtype == np.int64 and t.users.dtype == np.int64


def test_movielens_ml11_dense_ids_and_crosses(tiny):
    t = traces.movielens(tiny, fields=11)
    assert t.tables == list(traces.ML_FIELDS)
    assert t.ids.dtype == np.int64 and t.ids.shape == (6, 11)
    for g, name in enumerate(t.tables):
        assert t.ids[:, g].tolist() == _ML11_IDS[name], name
    assert t.num_embeddings() == [max(v) + 1 for v in _ML11_IDS.values()]


def test_movielens_keys_are_qualified_ids(tiny):
    t = traces.movielens(tiny, fields=11)
    assert t.keys.dtype == np.uint64 and t.keys.shape == (6, 11)
    assert np.array_equal(t.keys, traces.qualify(t.ids))
    assert np.array_equal(t.keys >> np.uint64(48), np.tile(np.arange(11, dtype=np.uint64), (6, 1)))
    per_table = sum(len(set(v)) for v in _ML11_IDS.values())
    assert t.unique_keys().size == per_table  # no key is shared between tables
    assert np.all(np.diff(t.unique_keys().astype(np.float64)) > 0)


def test_movielens_labels_are_rating_at_least_4(tiny):
    t = traces.movielens(tiny)
    assert t.labels.dtype == np.int8
    assert t.labels.tolist() == [1, 0, 0, 1, 1, 0]  # ratings 4 3 2 5 4 1


def test_movielens_fields_nest(tiny):
    ml11 = traces.movielens(tiny, fields=11)
    for fields in (1, 3, 7):
        t = traces.movielens(tiny, fields=fields)
        assert t.tables == list(traces.ML_FIELDS[:fields])
        assert np.array_equal(t.keys, ml11.keys[:, :fields])


def test_movielens_refuses_bad_fields_and_paths(tiny, tmp_path):
    for bad in (0, 12):
        with pytest.raises(embstore.InvalidArgumentError, match=r"fields must be in 1\.\.11"):
            traces.movielens(tiny, fields=bad)
    with pytest.raises(embstore.DTypeError):
        traces.movielens(tiny, fields=7.0)
    with pytest.raises(FileNotFoundError):
        traces.movielens(tmp_path / "absent")


def test_movielens_reports_a_user_missing_from_the_user_file(tiny):
    users = (tiny / "ml-100k.user").read_text().splitlines()
    (tiny / "ml-100k.user").write_text("\n".join(users[:-1]) + "\n")  # drop user 3
    with pytest.raises(embstore.InvalidArgumentError, match=r"user 3 .* missing"):
        traces.movielens(tiny)


def test_movielens_reports_a_missing_column(tiny):
    text = (tiny / "ml-100k.inter").read_text().replace("timestamp:float", "time:float")
    (tiny / "ml-100k.inter").write_text(text)
    with pytest.raises(embstore.InvalidArgumentError, match="timestamp"):
        traces.movielens(tiny)


@pytest.mark.data
@pytest.mark.skipif(not (ML100K / "ml-100k.inter").exists(), reason="ML-100k not downloaded")
def test_movielens_100k_sizes():
    ml7 = traces.movielens(ML100K, fields=7)
    ml11 = traces.movielens(ML100K, fields=11)
    assert len(ml7) == len(ml11) == 100_000
    assert ml7.unique_keys().size == 3_577
    assert ml11.unique_keys().size == 37_685
    assert ml7.num_embeddings() == [943, 1682, 61, 2, 21, 795, 73]
    assert np.all(np.diff(ml7.timestamps) >= 0)
    assert np.array_equal(ml11.keys[:, :7], ml7.keys)
    assert ml7.labels.sum() == 55_375  # rating >= 4


# --- traces.qualify ------------------------------------------------------------------------


def test_qualify_tags_each_column_with_its_table():
    keys = traces.qualify(np.array([[0, 5, 2**48 - 1]], dtype=np.int64))
    assert keys.dtype == np.uint64
    assert keys.tolist() == [[0, (1 << 48) | 5, (2 << 48) | (2**48 - 1)]]
    assert traces.qualify(np.zeros((0, 3), dtype=np.uint32)).shape == (0, 3)


def test_qualify_refuses_out_of_range_ids():
    with pytest.raises(embstore.InvalidArgumentError, match=">= 0"):
        traces.qualify(np.array([[1, -1]]))
    with pytest.raises(embstore.InvalidArgumentError, match="below 2\\*\\*48"):
        traces.qualify(np.array([[2**48]], dtype=np.uint64))
    with pytest.raises(embstore.InvalidArgumentError, match="65536 tables"):
        traces.qualify(np.zeros((1, 65537), dtype=np.int64))
    assert traces.qualify(np.zeros((1, 65536), dtype=np.int64))[0, -1] == 65535 << 48


def test_qualify_refuses_bad_shapes_and_dtypes():
    with pytest.raises(embstore.ShapeError):
        traces.qualify(np.array([1, 2]))
    with pytest.raises(embstore.DTypeError):
        traces.qualify(np.array([[1.0, 2.0]]))
    with pytest.raises(embstore.DTypeError):
        traces.qualify(np.array([[True]]))


def test_trace_checks_its_arrays():
    keys = np.zeros((2, 3), dtype=np.uint64)
    ids = np.zeros((2, 3), dtype=np.int64)
    with pytest.raises(embstore.ShapeError):
        traces.Trace(keys, ["a", "b"], ids, np.zeros(2), np.zeros(2))
    with pytest.raises(embstore.ShapeError):
        traces.Trace(keys, ["a", "b", "c"], ids[:1], np.zeros(2), np.zeros(2))
    with pytest.raises(embstore.ShapeError):
        traces.Trace(keys, ["a", "b", "c"], ids, np.zeros(3, dtype=np.int64), np.zeros(2))
    t = traces.Trace(keys, ["a", "b", "c"], ids, np.zeros(2, dtype=np.int64), [7, 8])
    assert t.users.dtype == np.int64 and t.labels is None and len(t) == 2


# --- the libCacheSim baselines -------------------------------------------------------------


def _policy(name, capacity, **params):
    pytest.importorskip("libcachesim")
    from embstore.cache._libcachesim import LibCacheSimPolicy

    return LibCacheSimPolicy(name, capacity, **params)


def test_lru_probe_flags_by_hand():
    p = _policy("LRU", 2)
    requests = [[1, 2], [1, 3], [2, 1], [3, 2], [2, 2], [4]]
    # [2, 1]: 1 was resident when the request arrived, though inserting 2 evicts it before
    # its own get(); the flag is taken first. [2, 2]: a repeated key gets one flag.
    expected = [[False, False], [True, False], [False, True], [False, True], [True, True], [False]]
    got = [p.access(np.array(r, dtype=np.uint64)).tolist() for r in requests]
    assert got == expected
    assert len(p) == 2
    assert p.requests == len(requests)


def test_lru_matches_a_model_on_random_requests():
    p = _policy("lru", 7)
    rng = np.random.default_rng(5)
    model: OrderedDict[int, None] = OrderedDict()
    for _ in range(2000):
        keys = rng.integers(0, 25, size=3).astype(np.uint64)
        expected = [int(k) in model for k in keys]
        for k in keys.tolist():
            if k in model:
                model.move_to_end(k)
            else:
                model[k] = None
                if len(model) > 7:
                    model.popitem(last=False)
        assert p.access(keys).tolist() == expected


def test_every_policy_keeps_what_it_just_admitted():
    pytest.importorskip("libcachesim")
    from embstore.cache._libcachesim import available

    names = available()
    assert {"LRU", "LFU", "Clock", "ARC", "LIRS", "TwoQ", "S3FIFO", "Sieve", "WTinyLFU"} <= set(
        names
    )
    assert {"LeCaR", "Cacheus"} <= set(names)
    keys = np.random.default_rng(1).integers(0, 20, size=600).astype(np.uint64)
    for name in names:
        p = _policy(name, 8)
        for i, k in enumerate(keys):
            flag = p.access(keys[i : i + 1])
            assert flag.dtype == bool and flag.shape == (1,)
            if i and k == keys[i - 1]:
                assert flag[0], f"{name}: key {k} missed right after its access"
            assert len(p) <= 8, name


def test_small_capacities_get_workable_sizes():
    assert _policy("WTinyLFU", 20).params["window_size"] * 20 >= 1
    assert _policy("S3FIFO", 10).params["small_size_ratio"] * 10 >= 2
    assert _policy("S3FIFO", 100).params["small_size_ratio"] == 0.1
    with pytest.raises(embstore.InvalidArgumentError, match="capacity >= 6"):
        _policy("WTinyLFU", 5)
    with pytest.raises(embstore.InvalidArgumentError, match="small FIFO"):
        _policy("S3FIFO", 50, small_size_ratio=0.02)


def test_policy_names_are_case_and_dash_insensitive():
    assert _policy("w-tinylfu", 100).name == "WTinyLFU"
    assert _policy("s3_fifo", 100).name == "S3FIFO"
    assert _policy("2Q", 100).name == "TwoQ"


def test_unknown_and_unoffered_policies_are_refused():
    with pytest.raises(embstore.InvalidArgumentError, match=r"available: .*'LRU'"):
        _policy("MRU", 10)
    for name in ("ClockPro", "Belady", "CAR"):
        with pytest.raises(embstore.InvalidArgumentError, match="not offered"):
            _policy(name, 10)
    with pytest.raises(embstore.DTypeError):
        _policy("LRU", True)


def test_access_takes_uint64_or_int64_keys():
    p = _policy("LRU", 4)
    assert p.access(np.array([-1], dtype=np.int64)).tolist() == [False]
    assert p.access(np.array([2**64 - 1], dtype=np.uint64)).tolist() == [True]
    assert p.access([7]).tolist() == [False]
    with pytest.raises(embstore.DTypeError):
        p.access(np.array([1.0]))
    with pytest.raises(embstore.ShapeError):
        p.access(np.zeros((2, 2), dtype=np.uint64))
