"""The Python API of embedded tables: shapes, dtypes, id forms, typed errors that change
nothing, admission, expiry, export/import, save/load and threads."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import embstore
from embstore import errors


@pytest.fixture
def store() -> embstore.Store:
    return embstore.Store()


@pytest.fixture
def table(store: embstore.Store) -> embstore.Table:
    return store.create_table("user", 4, optimizer=embstore.Adagrad(lr=0.1), seed=3)


def snapshot(t: embstore.Table) -> list[tuple]:
    rows = []
    for c in t.export(1000):
        for i in range(len(c.ids)):
            rows.append(
                (int(c.ids[i]), c.values[i].tobytes(), c.state[i].tobytes(), int(c.versions[i]))
            )
    return sorted(rows)


def test_store_names_tables(store: embstore.Store) -> None:
    store.create_table("b", 2)
    store.create_table("a", 2)
    assert store.tables() == ["a", "b"] and "a" in store and "z" not in store
    with pytest.raises(errors.TableExistsError, match="table 'a' already exists"):
        store.create_table("a", 8)
    with pytest.raises(errors.TableNotFoundError, match="no table named 'z'") as e:
        store.table("z")
    assert isinstance(e.value, KeyError)
    store.drop_table("a")
    with pytest.raises(errors.TableNotFoundError):
        store.drop_table("a")
    assert store["b"].name == "b"


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"embedding_dim": 0}, errors.InvalidArgumentError),
        ({"embedding_dim": 4097}, errors.InvalidArgumentError),
        ({"embedding_dim": 2.5}, errors.InvalidArgumentError),
        ({"num_shards": 3}, errors.InvalidArgumentError),
        ({"optimizer": embstore.Adam(betas=(1.0, 0.9))}, errors.InvalidArgumentError),
        ({"optimizer": torch.optim.SGD}, errors.InvalidArgumentError),
        ({"initializer": embstore.Uniform(1.0, -1.0)}, errors.InvalidArgumentError),
        ({"on_non_finite": "ignore"}, errors.InvalidArgumentError),
        ({"ttl": -1.0}, errors.InvalidArgumentError),
    ],
)
def test_bad_configs_raise(store: embstore.Store, kwargs: dict, exc: type) -> None:
    args = {"embedding_dim": 4} | kwargs
    dim = args.pop("embedding_dim")
    with pytest.raises(exc):
        store.create_table("t", dim, **args)
    assert store.tables() == []


def test_ids_in_every_form_give_the_same_rows(table: embstore.Table) -> None:
    ids = [5, 2**40, -1]
    base = table.lookup(np.array(ids, dtype=np.int64))
    assert base.shape == (3, 4) and base.dtype == np.float32
    np.testing.assert_array_equal(table.lookup(ids), base)
    np.testing.assert_array_equal(table.lookup(np.array(ids, dtype=np.int64).view(np.uint64)), base)
    np.testing.assert_array_equal(table.lookup([5, 2**40, 2**64 - 1]), base)  # -1 is 2**64-1
    small = np.array([5, -1], dtype=np.int32)  # other integer dtypes are widened
    np.testing.assert_array_equal(table.lookup(small), base[[0, 2]])
    strided = np.array([5, 0, 2**40, 0, -1], dtype=np.int64)[::2]
    np.testing.assert_array_equal(table.lookup(strided), base)
    out = table.lookup(torch.tensor(ids))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), base)
    _, found = table.lookup(torch.tensor(ids), return_found=True)
    assert found.dtype == torch.bool and bool(found.all())
    assert len(table) == 3


def test_zero_copy_for_contiguous_int64(table: embstore.Table) -> None:
    from embstore._arrays import as_ids

    a = np.arange(10, dtype=np.int64)
    assert np.shares_memory(as_ids(a)[0], a)
    t = torch.arange(10)
    assert as_ids(t)[0].ctypes.data == t.data_ptr()


@pytest.mark.parametrize(
    ("ids", "exc", "msg"),
    [
        (np.array([1.0, 2.0]), errors.DTypeError, "ids must be 1-D int64, got 1-D float64"),
        (np.zeros((2, 2), np.int64), errors.ShapeError, "ids must be 1-D int64, got 2-D int64"),
        (torch.tensor([1.0]), errors.DTypeError, "got 1-D float32"),
        (torch.tensor([True]), errors.DTypeError, "got 1-D bool"),
        (["a", "b"], errors.DTypeError, "ids must be 1-D int64"),
        (np.int64(3), errors.ShapeError, "got 0-D"),
    ],
)
def test_bad_ids_raise(table: embstore.Table, ids, exc: type, msg: str) -> None:
    with pytest.raises(exc, match=msg):
        table.lookup(ids)
    assert len(table) == 0


def test_bad_gradients_raise_and_change_nothing(table: embstore.Table) -> None:
    table.apply_gradients([1, 2], np.ones((2, 4), np.float32))
    before = snapshot(table)
    step = table.step
    cases = [
        (
            np.ones((2, 3), np.float32),
            errors.ShapeError,
            "embedding_dim mismatch for table 'user': expected 4, got 3",
        ),
        (np.ones((3, 4), np.float32), errors.ShapeError, "grads has 3 rows for 2 ids"),
        (np.ones(8, np.float32), errors.ShapeError, "grads must be 2-D"),
        (np.ones((2, 4), np.int64), errors.DTypeError, "grads must be float32, got int64"),
        (
            np.array([[1, 1, 1, np.nan], [1, 1, 1, 1]], np.float32),
            errors.NonFiniteError,
            "not finite",
        ),
        (np.array([[1, 1, 1, 1], [np.inf, 1, 1, 1]], np.float32), errors.NonFiniteError, "id 2"),
    ]
    for grads, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            table.apply_gradients([1, 2], grads)
    with pytest.raises(errors.InvalidArgumentError):
        table.apply_gradients([1], np.ones((1, 4)), lr=float("nan"))
    with pytest.raises(errors.NonFiniteError):
        table.assign([9], np.full((1, 4), np.nan))
    with pytest.raises(errors.InvalidArgumentError):
        table.lookup([1], on_miss="maybe")
    assert snapshot(table) == before and table.step == step


def test_non_finite_skip_policy(store: embstore.Store) -> None:
    t = store.create_table(
        "t", 2, on_non_finite="skip", initializer=embstore.Zeros(), optimizer=embstore.SGD(lr=1)
    )
    assert t.apply_gradients([1, 2], [[np.nan, 0], [1, 1]]) == 1
    np.testing.assert_array_equal(t.lookup([2], "error"), [[-1, -1]])
    assert t.stats()["skipped_non_finite"] == 1 and not t.contains([1])[0]


def test_float64_gradients_are_converted(table: embstore.Table) -> None:
    assert table.apply_gradients([1], np.ones((1, 4), np.float64)) == 1


def test_empty_batches_are_valid(table: embstore.Table) -> None:
    assert table.lookup([]).shape == (0, 4)
    assert table.lookup(torch.zeros(0, dtype=torch.int64)).shape == (0, 4)
    assert table.apply_gradients([], np.zeros((0, 4), np.float32)) == 0
    assert table.apply_gradients([], []) == 0
    assert table.remove([]) == 0 and table.contains([]).shape == (0,)
    assert table.step == 0 and len(table) == 0


def test_very_large_batch(store: embstore.Store) -> None:
    # 10^7 ids: works (a quadratic path would not finish; speed is the benchmark's business).
    t = store.create_table("big", 1, optimizer=embstore.SGD(lr=1.0), initializer=embstore.Zeros())
    ids = np.arange(10**7, dtype=np.int64) % 3_000_000
    assert t.lookup(ids).shape == (10**7, 1)
    assert t.apply_gradients(ids, np.ones((10**7, 1), np.float32)) == 3_000_000
    assert len(t) == 3_000_000
    np.testing.assert_array_equal(t.lookup([0, 2_999_999], "error"), [[-4.0], [-3.0]])


def test_on_miss_modes(table: embstore.Table) -> None:
    z, found = table.lookup([7, 8], on_miss="zeros", return_found=True)
    assert not z.any() and not found.any() and len(table) == 0
    with pytest.raises(errors.KeyNotFoundError, match="id 7 is not stored in table 'user'"):
        table.lookup([7], on_miss="error")
    init = table.lookup([7])
    np.testing.assert_array_equal(init, table.initial_values([7]))
    np.testing.assert_array_equal(table.lookup([7], on_miss="error"), init)


def test_initial_values_are_a_function_of_seed_and_id() -> None:
    a = embstore.Store().create_table("x", 8, seed=1)
    b = embstore.Store().create_table("y", 8, seed=1)
    c = embstore.Store().create_table("x", 8, seed=2)
    b.lookup([99, 5])  # other ids first: order does not matter
    np.testing.assert_array_equal(a.lookup([5]), b.lookup([5]))
    assert not np.array_equal(a.lookup([5]), c.lookup([5]))


def test_admission(store: embstore.Store) -> None:
    t = store.create_table("t", 2, admission_min_count=3, optimizer=embstore.SGD(lr=1.0))
    for _ in range(2):
        t.lookup([42])
        assert len(t) == 0
        assert t.apply_gradients([42], np.ones((1, 2))) == 0
    t.lookup([42])
    assert len(t) == 1 and t.apply_gradients([42], np.ones((1, 2))) == 1
    assert t.stats()["dropped_unadmitted"] == 2


def test_ttl_expiry(store: embstore.Store) -> None:
    t = store.create_table("t", 2, ttl=0.2)
    t.assign([1, 2], np.ones((2, 2)))
    assert t.evict_expired() == 0
    time.sleep(0.3)
    t.assign([2], np.zeros((1, 2)))
    assert t.evict_expired() == 1
    assert t.contains([1, 2]).tolist() == [False, True]


def test_versions_and_metadata(store: embstore.Store) -> None:
    s = embstore.Store(replica_id=9)
    t = s.create_table("t", 2)
    t.lookup([1])
    m = t.metadata([1, 2])
    assert m["found"].tolist() == [True, False] and m["versions"][0] == 0
    t.apply_gradients([1], np.ones((1, 2)))
    m2 = t.metadata([1])
    assert m2["versions"][0] > 0 and m2["replicas"][0] == 9 and m2["update_counts"][0] == 1
    assert abs(int(m2["versions"][0] >> 16) - time.time() * 1000) < 60_000
    t.apply_gradients([1], np.ones((1, 2)))
    assert t.metadata([1])["versions"][0] > m2["versions"][0]


def test_export_import_round_trip(store: embstore.Store, table: embstore.Table) -> None:
    ids = np.arange(1000, dtype=np.int64) * 7 - 3000
    table.lookup(ids)
    table.apply_gradients(ids[:10], np.ones((10, 4)))
    copy = store.create_table("copy", 4, optimizer=embstore.Adagrad(lr=0.1))
    chunks = list(table.export(chunk_rows=64))
    assert all(len(c.ids) <= 64 for c in chunks) and sum(len(c.ids) for c in chunks) == 1000
    _, values0, state0, versions0 = chunks[0][:4]
    assert values0.shape[1] == 4 and state0.shape[1] == 4 and versions0.dtype == np.uint64
    for c in chunks:
        copy.import_(*c)
    assert snapshot(copy) == snapshot(table)
    with pytest.raises(errors.ShapeError):
        copy.import_(ids[:2], np.ones((2, 4)), state=np.ones((2, 3)))


def test_save_load_and_corrupt_files(
    store: embstore.Store, table: embstore.Table, tmp_path
) -> None:
    table.lookup(np.arange(5000))
    table.apply_gradients([1, 2, 3], np.ones((3, 4)))
    path = tmp_path / "user.embt"
    assert table.save(path) == 5000
    loaded = store.load_table(path, name="restored")
    assert snapshot(loaded) == snapshot(table) and loaded.step == 1
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.embt"
    bad.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptionError) as e:
        loaded.load(bad)
    assert isinstance(e.value, OSError)
    assert snapshot(loaded) == snapshot(table)
    bad.write_bytes(bytes(data[:100]))
    with pytest.raises(errors.CorruptionError):
        store.load_table(bad, name="x")
    assert "x" not in store
    with pytest.raises(errors.StorageError):
        loaded.load(tmp_path / "missing.embt")
    other = store.create_table("other", 8)
    with pytest.raises(errors.ShapeError, match="embedding_dim mismatch for table 'other'"):
        other.load(path)


def test_stats(table: embstore.Table) -> None:
    table.lookup(np.arange(100))
    table.lookup(np.arange(50))
    s = table.stats()
    assert (s["rows"], s["hits"], s["misses"], s["inserts"]) == (100, 50, 100, 100)
    assert sum(s["rows_per_shard"]) == 100 and len(s["rows_per_shard"]) == 8
    assert s["bytes"] > 100 * 4 * 4


def test_threads_share_a_table(store: embstore.Store) -> None:
    t = store.create_table("t", 8, optimizer=embstore.SGD(lr=1.0), initializer=embstore.Zeros())
    ids = np.arange(5000)
    grads = np.ones((5000, 8), np.float32)

    def work() -> None:
        for _ in range(20):
            t.apply_gradients(ids, grads)
            t.lookup(ids)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    np.testing.assert_array_equal(t.lookup(ids, "error"), np.full((5000, 8), -80.0))


def test_lookup_into_a_reused_buffer(table: embstore.Table) -> None:
    buf = np.empty((3, 4), np.float32)
    out = table.lookup([1, 2, 3], out=buf)
    assert out is buf
    np.testing.assert_array_equal(buf, table.lookup([1, 2, 3]))
    with pytest.raises(errors.ShapeError, match=r"out must be \[2, 4\]"):
        table.lookup([1, 2], out=buf)
    with pytest.raises(errors.DTypeError):
        table.lookup([1, 2, 3], out=np.empty((3, 4), np.float64))


def test_out_of_range_ints_and_ttl_are_invalid_arguments(store: embstore.Store) -> None:
    for kwargs in ({"seed": -1}, {"admission_min_count": 2**40}, {"ttl": 1e20}, {"ttl": 0}):
        with pytest.raises(errors.InvalidArgumentError):
            store.create_table("t", 4, **kwargs)
    with pytest.raises(errors.InvalidArgumentError):
        store.create_table("t", 2**70)
    assert store.tables() == []


def test_object_arrays_of_ints_are_ids(table: embstore.Table) -> None:
    ids = np.array([1, 2**63 + 5], dtype=object)
    np.testing.assert_array_equal(table.lookup(ids), table.lookup([1, 2**63 + 5]))


def test_batch_calls_release_the_gil(store: embstore.Store) -> None:
    # A Python thread keeps counting while the main thread is inside long native calls; with
    # the GIL held it could not run at all until each call returned.
    t = store.create_table("t", 16, initializer=embstore.Zeros())
    ids = np.arange(2_000_000, dtype=np.int64)
    grads = np.ones((len(ids), 16), np.float32)
    t.lookup(ids)  # create the rows first
    ticks, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        during = []
        for call in (lambda: t.lookup(ids), lambda: t.apply_gradients(ids, grads)):
            before = ticks[0]
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
            during.append((ticks[0] - before, elapsed))
    finally:
        stop.set()
        counter.join(timeout=10)
    for n, elapsed in during:
        # The counter gets the GIL for most of the call: far more than a handful of switches.
        assert n > 1000, f"only {n} ticks in {elapsed:.3f} s"


def test_half_precision_torch_gradients_are_converted(table: embstore.Table) -> None:
    for dtype in (torch.float16, torch.bfloat16):
        assert table.apply_gradients(torch.tensor([1]), torch.ones(1, 4, dtype=dtype)) == 1
