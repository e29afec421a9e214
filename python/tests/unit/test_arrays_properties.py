"""Property tests of the argument normalisers (embstore._arrays), against models in plain
Python: what comes out is what native code may read without a copy, with the values the caller
meant, and everything else is refused with the error class the API documents.

Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob when a property fails;
``pytest --hypothesis-seed=N`` replays a run.
"""

import types

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from embstore._arrays import as_ids, as_rows, check_out, on_device, uint_array  # noqa: E402
from embstore.errors import DTypeError, InvalidArgumentError, ShapeError  # noqa: E402

settings.register_profile("embstore", max_examples=150, deadline=None, print_blob=True)
settings.load_profile("embstore")

MASK = 2**64 - 1
ids_64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
int_dtypes = st.sampled_from(
    [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64]
)


def _normalised(arr: np.ndarray) -> bool:
    return arr.dtype == np.uint64 and arr.ndim == 1 and arr.flags.c_contiguous and arr.flags.aligned


@given(st.lists(ids_64, max_size=40))
def test_python_ints_become_their_64_bit_pattern(ids):
    arr, device = as_ids(ids)
    assert device is None and _normalised(arr)
    assert arr.tolist() == [x & MASK for x in ids]


@given(st.lists(st.integers(), min_size=1, max_size=10))
def test_ids_beyond_64_bits_are_refused(ids):
    if all(-(2**63) <= x < 2**64 for x in ids):
        assert as_ids(ids)[0].tolist() == [x & MASK for x in ids]
    else:
        with pytest.raises((InvalidArgumentError, OverflowError)):
            as_ids(ids)


@given(hnp.arrays(int_dtypes, hnp.array_shapes(max_dims=1, max_side=40)), st.integers(1, 3))
def test_integer_arrays_keep_their_values_through_any_stride(arr, step):
    view = arr[::step]
    out, _ = as_ids(view)
    assert _normalised(out)
    assert out.tolist() == [int(x) & MASK for x in view.tolist()]
    if view.dtype == np.int64 and view.flags.c_contiguous:
        assert np.shares_memory(out, view), "a contiguous int64 array is used without a copy"


@given(
    hnp.arrays(
        hnp.floating_dtypes(endianness="="), hnp.array_shapes(min_dims=1, max_dims=1, min_side=1)
    )
)
def test_float_arrays_are_a_dtype_error(arr):
    with pytest.raises(DTypeError, match="ids must be 1-D int64, got 1-D float"):
        as_ids(arr)


@given(hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=3)))
def test_ids_of_two_or_more_dims_are_a_shape_error(arr):
    with pytest.raises(ShapeError, match=f"ids must be 1-D int64, got {arr.ndim}-D int64"):
        as_ids(arr)


def _table(dim: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(name="t", embedding_dim=dim)


@given(
    st.integers(0, 12),
    st.integers(1, 8),
    st.sampled_from([np.float16, np.float32, np.float64]),
    st.booleans(),
)
def test_rows_become_contiguous_float32_of_the_same_values(n, dim, dtype, fortran):
    rng = np.random.default_rng(n * 31 + dim)
    x = rng.standard_normal((n, dim)).astype(dtype)
    if fortran:
        x = np.asfortranarray(x)
    rows = as_rows(x, n, _table(dim), "grads")
    assert rows.dtype == np.float32 and rows.flags.c_contiguous and rows.shape == (n, dim)
    np.testing.assert_array_equal(rows, x.astype(np.float32))


@given(st.integers(0, 6), st.integers(1, 6), st.integers(0, 6), st.integers(1, 6))
def test_rows_of_another_shape_are_a_shape_error(n, dim, rows_n, rows_dim):
    x = np.zeros((rows_n, rows_dim), np.float32)
    if (rows_n, rows_dim) == (n, dim):
        assert as_rows(x, n, _table(dim), "values").shape == (n, dim)
        return
    message = "embedding_dim mismatch" if rows_dim != dim else "rows for"
    with pytest.raises(ShapeError, match=message):
        as_rows(x, n, _table(dim), "values")


@given(hnp.arrays(int_dtypes, st.tuples(st.integers(1, 4), st.just(3))))
def test_integer_rows_are_a_dtype_error(x):
    with pytest.raises(DTypeError, match="grads must be float32"):
        as_rows(x, len(x), _table(3), "grads")


@given(
    st.integers(0, 6),
    st.integers(1, 4),
    st.sampled_from(["ok", "dtype", "shape", "fortran", "readonly", "aliased"]),
)
def test_an_out_buffer_is_accepted_only_when_it_can_be_written_in_place(n, dim, flaw):
    ids = np.arange(n, dtype=np.uint64)
    out = np.zeros((n, dim), np.float32)
    expected: type[Exception] | None = None
    if flaw == "dtype":
        out, expected = out.astype(np.float64), DTypeError
    elif flaw == "shape":
        out, expected = np.zeros((n + 1, dim), np.float32), ShapeError
    elif flaw == "fortran" and n > 1 and dim > 1:
        out, expected = np.asfortranarray(out), ShapeError
    elif flaw == "readonly":
        out.flags.writeable = False
        expected = InvalidArgumentError
    elif flaw == "aliased" and n > 0:
        buf = np.zeros(n * dim * 2, np.uint64)
        ids, out = buf[:n], buf.view(np.float32)[: n * dim].reshape(n, dim)
        expected = InvalidArgumentError
    if expected is None:
        check_out(out, ids, dim)
    else:
        with pytest.raises(expected):
            check_out(out, ids, dim)


@given(
    st.sampled_from([np.uint32, np.uint64]),
    st.one_of(  # numpy has no integer array of both negatives and values >= 2**63
        st.lists(st.integers(0, 2**64 - 1), max_size=12).map(lambda v: (v, np.uint64)),
        st.lists(st.integers(-(2**40), 2**63 - 1), max_size=12).map(lambda v: (v, np.int64)),
    ),
)
def test_metadata_arrays_fit_their_dtype_or_are_refused(dtype, values_and_dtype):
    values, given_dtype = values_and_dtype
    x = np.array(values, dtype=given_dtype)
    top = np.iinfo(dtype).max
    if all(0 <= v <= top for v in values):
        out = uint_array(x, dtype, "versions", len(values))
        assert out.dtype == dtype and out.flags.c_contiguous and out.tolist() == values
    else:
        with pytest.raises(InvalidArgumentError, match="versions must be"):
            uint_array(x, dtype, "versions", len(values))


@given(st.lists(ids_64, max_size=10))
def test_results_are_numpy_for_numpy_ids(ids):
    arr, device = as_ids(ids)
    assert on_device(arr, device) is arr


def test_tensor_ids_come_back_as_tensors_on_their_device():
    torch = pytest.importorskip("torch")

    @given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20))
    def prop(ids):
        t = torch.tensor(ids, dtype=torch.int64)
        arr, device = as_ids(t)
        assert _normalised(arr) and device == t.device
        assert arr.tolist() == [x & MASK for x in ids]
        back = on_device(arr.view(np.int64), device)
        assert isinstance(back, torch.Tensor) and back.tolist() == ids

    prop()
