"""The native module imports and the NeighborHash bindings behave (and fail) as documented."""

import pytest

import embstore
from embstore import _native
from embstore.errors import CapacityError, EmbstoreError, InvalidArgumentError, ShapeError


def test_native_module_imports():
    assert _native.__version__ == embstore.__version__
    assert _native.MAX_PAYLOAD == 2**52 - 1
    assert isinstance(embstore.simd_available(), bool)


def test_insert_get_remove_extremes():
    index = embstore.NeighborHash()
    assert index.insert(0, 1) is None
    assert index.insert(2**64 - 1, 2**52 - 1) is None
    assert index.insert(0, 5) == 1
    assert index.get(0) == 5
    assert 2**64 - 1 in index
    assert index.remove(2**64 - 1) == 2**52 - 1
    assert index.remove(2**64 - 1) is None
    assert len(index) == 1
    index.check_invariants()


def test_batches_match_scalar_and_grow():
    index = embstore.NeighborHash(slots=8)
    keys = [k * 0x9E3779B97F4A7C15 % 2**64 for k in range(20_000)]
    index.insert_batch(keys, range(len(keys)))
    assert index.capacity >= 20_000 / 0.8
    got = index.get_batch([*keys, 12345678901])
    assert got == [*list(range(len(keys))), None]
    assert index.get_batch([]) == []
    stats = index.stats()
    assert stats["len"] == 20_000
    assert 1.0 <= stats["apcl"] < 1.3
    index.check_invariants()


def test_payload_out_of_range_is_typed_and_stores_nothing():
    index = embstore.NeighborHash()
    index.insert(1, 1)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        index.insert(1, 2**52)
    with pytest.raises(InvalidArgumentError):
        index.insert_batch([2, 3], [1, 2**60])
    assert index.get(1) == 1
    assert len(index) == 1
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentError, EmbstoreError)


def test_length_mismatch_is_shape_error():
    index = embstore.NeighborHash()
    with pytest.raises(ShapeError, match="2 keys but 1 payloads"):
        index.insert_batch([1, 2], [1])
    assert len(index) == 0


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        embstore.NeighborHash(max_load_factor=1.5)
    with pytest.raises(CapacityError):
        embstore.NeighborHash(slots=2**62)
    index = embstore.NeighborHash()
    with pytest.raises(OverflowError):
        index.insert(-1, 0)
    with pytest.raises(TypeError):
        index.get("7")
    index.insert(3, 3)
    assert index.get(3) == 3, "the index keeps serving after bad calls"
