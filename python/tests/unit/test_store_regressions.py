"""Regression tests for issue 7: each defect found when the store was tried as a new user would,
named after the defect; each failed on the code before the fix."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

import embstore
from embstore import (
    FTRL,
    Adam,
    DTypeError,
    InvalidArgumentError,
    NonFiniteError,
    Normal,
    ShapeError,
    TableNotFoundError,
)


@pytest.fixture
def table() -> embstore.Table:
    t = embstore.Store().create_table("t", embedding_dim=4, optimizer=embstore.SGD(lr=0.1))
    t.assign([1, 2, 3], np.arange(12, dtype=np.float32).reshape(3, 4))
    return t


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.zeros((3, 4), np.float32, order="F"),
        lambda: np.zeros((4, 3), np.float32).T,
        lambda: np.zeros((3, 8), np.float32)[:, ::2],
    ],
    ids=["fortran", "transposed", "strided"],
)
def test_lookup_out_that_is_not_c_contiguous_is_refused_not_scrambled(table, make):
    out = make()
    with pytest.raises(ShapeError):
        table.lookup([1, 2, 3], out=out)
    assert not out.any(), "nothing may be written into a refused buffer"


def test_lookup_out_read_only_or_shared_or_wrong_dtype_is_a_typed_error(table):
    out = np.zeros((3, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(InvalidArgumentError):
        table.lookup([1, 2, 3], out=out)
    buf = np.zeros(16, np.int64)
    ids, out = buf[:3], buf.view(np.float32)[2:14].reshape(3, 4)  # overlaps ids[1:]
    ids[:] = [1, 2, 3]
    with pytest.raises(InvalidArgumentError):
        table.lookup(ids, out=out)
    with pytest.raises(DTypeError):
        table.lookup([1, 2, 3], out=np.zeros((3, 4), np.float64))
    with pytest.raises(DTypeError):
        table.lookup([1, 2, 3], out=[[0.0] * 4] * 3)
    with pytest.raises(ShapeError):
        table.lookup([1, 2, 3], out=np.zeros((2, 4), np.float32))


def test_misaligned_ids_are_read_correctly(table):
    raw = np.zeros(3 * 8 + 1, np.uint8)[1:].view(np.int64)  # not 8-byte aligned
    raw[:] = [3, 1, 2]
    assert not raw.flags.aligned
    np.testing.assert_array_equal(table.lookup(raw), table.lookup([3, 1, 2]))


def test_adam_step_counter_past_2_pow_31_writes_finite_rows():
    t = embstore.Store().create_table("a", embedding_dim=2, optimizer=Adam(lr=0.01))
    t.assign([1], [[0.5, 0.5]])
    t.step = 2**31 - 2
    for _ in range(4):
        t.apply_gradients([1], [[1.0, -1.0]])
    row = t.lookup([1])[0]
    assert np.isfinite(row).all() and row[0] < 0.5 < row[1]


def test_ftrl_per_call_lr_zero_is_refused_not_nan():
    t = embstore.Store().create_table("f", embedding_dim=2, optimizer=FTRL(lr=0.1))
    t.assign([1], [[0.5, 0.5]])
    with pytest.raises(InvalidArgumentError, match="ftrl: lr"):
        t.apply_gradients([1], [[1.0, 1.0]], lr=0.0)
    np.testing.assert_array_equal(t.lookup([1]), [[0.5, 0.5]])
    assert t.step == 0


@pytest.mark.parametrize("opt", [FTRL(lr=0.1), embstore.RowWiseAdagrad(), embstore.Adagrad()])
def test_gradient_whose_square_overflows_writes_nothing_non_finite(opt):
    store = embstore.Store()
    t = store.create_table("r", embedding_dim=2, optimizer=opt)
    t.assign([1, 2], [[0.5, 0.5], [0.5, 0.5]])
    before = list(t.export())
    with pytest.raises(NonFiniteError):
        t.apply_gradients([1, 2], [[2e19, 1.0], [1.0, 1.0]])
    after = list(t.export())
    np.testing.assert_array_equal(before[0].values, after[0].values)
    np.testing.assert_array_equal(before[0].state, after[0].state)
    s = store.create_table("s", embedding_dim=2, optimizer=opt, on_non_finite="skip")
    s.assign([1, 2], [[0.5, 0.5], [0.5, 0.5]])
    assert s.apply_gradients([1, 2], [[2e19, 1.0], [1.0, 1.0]]) == 1
    chunk = next(s.export())
    assert np.isfinite(chunk.values).all() and np.isfinite(chunk.state).all()
    assert s.stats()["skipped_non_finite"] == 1


def test_small_tables_cost_memory_in_proportion_to_their_rows():
    store = embstore.Store()
    raw = 0
    reserved = 0
    for i in range(20):
        t = store.create_table(f"t{i}", embedding_dim=64, optimizer=Adam())
        t.lookup(np.arange(1000) * 7919 + i)
        raw += 1000 * (64 + 128) * 4
        reserved += t.stats()["bytes_reserved"]
    assert reserved <= 1.5 * raw, (reserved, raw)
    wide = store.create_table("wide", embedding_dim=4096, optimizer=Adam())
    wide.lookup(np.arange(8))
    s = wide.stats()
    assert s["bytes_used"] <= s["bytes_reserved"] <= 4 * s["bytes_used"], s


def test_stats_is_cheap_and_index_stats_scans(table):
    s = table.stats()
    assert "apcl" not in s and s["rows"] == 3 and s["bytes"] == s["bytes_reserved"]
    i = table.index_stats()
    assert i["len"] == 3 and i["apcl"] >= 1.0


def test_store_replica_id_out_of_range_is_a_typed_error():
    for bad in (-1, 2**31, 2**64):
        with pytest.raises(InvalidArgumentError):
            embstore.Store(replica_id=bad)
        with pytest.raises(InvalidArgumentError, match="keyword-only"):
            embstore.Store(bad)  # the first positional is the path
    with pytest.raises(InvalidArgumentError):
        embstore.Store(replica_id="0")


def test_export_chunk_rows_is_checked_at_the_call(table):
    for bad in (0, -1):
        with pytest.raises(InvalidArgumentError):
            table.export(bad)  # not deferred to the first next()


def test_import_negative_or_float_metadata_is_a_typed_error(table):
    chunk = next(table.export())
    n = len(chunk.ids)
    with pytest.raises(InvalidArgumentError):
        table.import_(
            chunk.ids,
            chunk.values,
            chunk.state,
            -np.ones(n, np.int64),
            chunk.replicas,
            chunk.update_counts,
            chunk.last_update_ms,
        )
    with pytest.raises(DTypeError):
        table.import_(
            chunk.ids,
            chunk.values,
            chunk.state,
            np.ones(n) * 0.5,
            chunk.replicas,
            chunk.update_counts,
            chunk.last_update_ms,
        )
    with pytest.raises(InvalidArgumentError):
        table.import_(
            chunk.ids,
            chunk.values,
            chunk.state,
            chunk.versions,
            np.full(n, 2**31),
            chunk.update_counts,
            chunk.last_update_ms,
        )


def test_import_refuses_state_of_another_optimizer_and_keeps_the_step():
    store = embstore.Store()
    adam = store.create_table("adam", embedding_dim=2, optimizer=Adam(lr=0.1))
    for _ in range(3):
        adam.apply_gradients([1, 2], np.ones((2, 2), np.float32))
    ftrl = store.create_table("ftrl", embedding_dim=2, optimizer=FTRL())
    chunks = list(adam.export())
    with pytest.raises(InvalidArgumentError, match="optimizer mismatch"):
        ftrl.import_(*chunks[0])
    assert len(ftrl) == 0
    copy = store.create_table("copy", embedding_dim=2, optimizer=Adam(lr=0.1))
    for c in chunks:
        copy.import_(*c)
    assert copy.step == 3
    adam.apply_gradients([1], [[1.0, 1.0]])
    copy.apply_gradients([1], [[1.0, 1.0]])
    np.testing.assert_array_equal(adam.lookup([1]), copy.lookup([1]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Adam(betas=(0.9,)),
        lambda: Adam(betas=0.9),
        lambda: embstore.SGD(lr="0.1"),
        lambda: Normal(std=None),
    ],
)
def test_bad_optimizer_and_initializer_arguments_are_typed_errors(make):
    with pytest.raises(InvalidArgumentError):
        make()


def test_validation_names_the_field_and_agrees_between_python_and_rust():
    store = embstore.Store()
    with pytest.raises(InvalidArgumentError, match="name must be a str"):
        store.create_table(None, 4)
    assert store.tables() == []
    for dim in (0, 4097, -1, 2**70):
        with pytest.raises(InvalidArgumentError, match=r"embedding_dim must be in 1\.\.=4096"):
            store.create_table("d", dim)
    with pytest.raises(InvalidArgumentError, match=r"adam: beta1 must be in \[0, 1\)"):
        store.create_table("b", 4, optimizer=Adam(betas=(1.0, 0.9)))
    with pytest.raises(InvalidArgumentError, match="normal"):
        store.create_table("n", 4, initializer=Normal(std=3e38))
    with pytest.raises(InvalidArgumentError, match="on_miss"):
        store.create_table("m", 4).lookup([1], on_miss="create")


def test_config_round_trips_into_create_table():
    store = embstore.Store()
    t = store.create_table(
        "src",
        embedding_dim=8,
        optimizer=Adam(lr=0.01, betas=(0.8, 0.95)),
        initializer=embstore.Uniform(-0.5, 0.5),
        num_shards=4,
        seed=7,
        admission_min_count=2,
        ttl=dt.timedelta(hours=1),
        on_non_finite="skip",
        huge_pages=False,
    )
    copy = store.create_table(**{**t.config, "name": "dst"})
    assert {**copy.config, "name": "src"} == t.config
    assert t.config["optimizer"] == Adam(lr=0.01, betas=(0.8, 0.95))
    np.testing.assert_array_equal(t.initial_values([5, 6]), copy.initial_values([5, 6]))


def test_evict_older_than_is_available_from_python(table):
    assert table.evict_older_than(0) == 0
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert table.evict_older_than(future) == 3
    assert len(table) == 0
    with pytest.raises(InvalidArgumentError):
        table.evict_older_than(dt.datetime(2020, 1, 1))  # naive: ambiguous


def test_a_dropped_table_handle_stops_working(tmp_path):
    store = embstore.Store()
    t = store.create_table("gone", 2)
    t.assign([1], [[1.0, 2.0]])
    store.drop_table("gone")
    with pytest.raises(TableNotFoundError, match="dropped"):
        t.apply_gradients([1], [[1.0, 1.0]])
    with pytest.raises(TableNotFoundError):
        t.lookup([1])
    # Reads that would hand a dropped table's rows on, and step changes, are refused too.
    with pytest.raises(TableNotFoundError):
        t.export(10)
    with pytest.raises(TableNotFoundError):
        t.step = 3
    with pytest.raises(TableNotFoundError):
        t.save(tmp_path / "gone.embt")
    assert not list(tmp_path.iterdir())
