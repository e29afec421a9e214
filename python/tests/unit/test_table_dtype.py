"""Per-table storage dtype: ``create_table(..., dtype="bf16" | "fp16" | "fp32")`` stores rows at
2 bytes a value, returns float32 (the rounded values), applies gradients in float32 and rounds
the result, keeps optimizer state float32; the dtype survives export/import, a table file, a
durable reopen and a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embstore
from embstore import InvalidArgumentError, TableSpec

D = 8


def bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (by torch, an independent implementation), as float32."""
    return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def fp16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


ROUND = {"bf16": bf16, "fp16": fp16}


def exported(table: embstore.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row as (ids, values, state), sorted by id."""
    chunks = list(table.export())
    ids = np.concatenate([c.ids for c in chunks])
    order = np.argsort(ids)
    values = np.concatenate([c.values for c in chunks])[order]
    return ids[order], values, np.concatenate([c.state for c in chunks])[order]


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("bf16", "bf16"),
        ("BFloat16", "bf16"),
        (torch.bfloat16, "bf16"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
        (torch.float16, "fp16"),
        (torch.half, "fp16"),
        (np.float16, "fp16"),
        (np.dtype("float16"), "fp16"),
        ("fp32", "fp32"),
        (torch.float32, "fp32"),
        (np.float32, "fp32"),
        (None, "fp32"),
    ],
)
def test_dtype_is_accepted_by_every_name_and_read_back_as_one(given, name) -> None:
    store = embstore.Store()
    table = store.create_table("t", D, dtype=given)
    assert table.config.dtype == name
    assert TableSpec("u", D, dtype=given).dtype == name
    assert store.create_table(TableSpec("u", D, dtype=given)).config == TableSpec(
        "u", D, dtype=name
    )


def test_default_is_fp32() -> None:
    assert embstore.Store().create_table("t", D).config.dtype == "fp32"


@pytest.mark.parametrize("bad", ["int8", "float64", torch.float64, np.int32, 16, True, object()])
def test_bad_dtype_names_what_is_accepted(bad) -> None:
    with pytest.raises(InvalidArgumentError, match="dtype must be 'fp32', 'bf16' or 'fp16'"):
        embstore.Store().create_table("t", D, dtype=bad)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_lookups_return_rounded_float32_and_steps_round_back(dtype: str) -> None:
    store = embstore.Store()
    table = store.create_table("t", D, dtype=dtype, optimizer=embstore.SGD(lr=0.1))
    ids = np.arange(50, dtype=np.uint64)
    before = table.lookup(ids)
    assert before.dtype == np.float32
    np.testing.assert_array_equal(before, ROUND[dtype](before))  # every value is of the dtype
    np.testing.assert_array_equal(table.initial_values(ids), before)
    grads = np.random.default_rng(0).normal(0, 0.3, (50, D)).astype(np.float32)
    table.apply_gradients(ids, grads)
    after = table.lookup(ids, on_miss="error")
    want = ROUND[dtype](before - np.float32(0.1) * grads)
    np.testing.assert_array_equal(after, want)


def test_optimizer_state_stays_float32() -> None:
    store = embstore.Store()
    adagrad = embstore.Adagrad(lr=0.05)
    a = store.create_table("a", D, dtype="bf16", optimizer=adagrad)
    b = store.create_table("b", D, dtype="fp32", optimizer=adagrad)
    ids = np.arange(10, dtype=np.uint64)
    grads = np.random.default_rng(1).normal(0, 0.1, (10, D)).astype(np.float32)
    for t in (a, b):
        t.lookup(ids)
        t.apply_gradients(ids, grads)
    (_, _, sa), (_, _, sb) = exported(a), exported(b)
    np.testing.assert_array_equal(sa, sb)  # the same f32 accumulators
    assert not np.array_equal(sa, bf16(sa))


def test_export_import_and_a_table_file_keep_the_values(tmp_path) -> None:
    store = embstore.Store()
    src = store.create_table("src", D, dtype="bf16", optimizer=embstore.Adam())
    ids = np.arange(100, dtype=np.uint64)
    src.lookup(ids)
    src.apply_gradients(ids, np.full((100, D), 0.37, np.float32))
    got_ids, values, _ = exported(src)
    assert values.dtype == np.float32
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(values, bf16(values))
    # Into an fp16 table: the imported values are rounded to fp16.
    dst = store.create_table("dst", D, dtype="fp16", optimizer=embstore.Adam())
    for chunk in src.export():
        dst.import_(*chunk)
    np.testing.assert_array_equal(dst.lookup(ids, on_miss="error"), fp16(values))
    # A table file carries the dtype.
    src.save(tmp_path / "t.tbl")
    loaded = embstore.Store().load_table(tmp_path / "t.tbl", "copy")
    assert loaded.config.dtype == "bf16"
    np.testing.assert_array_equal(loaded.lookup(ids, on_miss="error"), values)


def test_a_durable_reopen_and_a_checkpoint_keep_the_dtype(tmp_path) -> None:
    ids = np.arange(200, dtype=np.uint64)
    grads = np.random.default_rng(2).normal(0, 0.2, (200, D)).astype(np.float32)
    with embstore.Store(tmp_path / "s") as store:
        t = store.create_table("t", D, dtype="fp16", optimizer=embstore.Adagrad(lr=0.1))
        t.lookup(ids)
        t.apply_gradients(ids, grads)
        want = t.lookup(ids, on_miss="error")
        store.checkpoint(tmp_path / "ckpt")
    with embstore.Store(tmp_path / "s") as store:
        t = store.table("t")
        assert t.config.dtype == "fp16"
        np.testing.assert_array_equal(t.lookup(ids, on_miss="error"), want)
        t.apply_gradients(ids, grads)  # still steps as fp16
        got = t.lookup(ids, on_miss="error")
        np.testing.assert_array_equal(got, fp16(got))
    with embstore.Store.restore(tmp_path / "ckpt", tmp_path / "r") as store:
        assert store.table("t").config.dtype == "fp16"
        np.testing.assert_array_equal(store.table("t").lookup(ids, on_miss="error"), want)


def test_bf16_rows_take_half_the_value_bytes() -> None:
    ids = np.arange(20_000, dtype=np.uint64)

    def used(dtype: str) -> int:
        t = embstore.Store().create_table("t", 64, dtype=dtype)
        t.lookup(ids)
        return t.stats()["bytes_used"]

    assert used("fp32") - used("bf16") == len(ids) * 64 * 2
