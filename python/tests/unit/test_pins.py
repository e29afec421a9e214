"""The one pin lifecycle (:class:`embstore.pins.Pins`) that prefetch, sessions and the torch
modules share: what it pins, what the budget refuses and a retry takes, what it releases."""

from __future__ import annotations

import numpy as np
import pytest

import embstore
from embstore.pins import Pins

D = 16


@pytest.fixture
def store(tmp_path):
    # 64 KiB: the pins may take 60 % of it, ~38 KiB, a few hundred rows of 16 floats.
    s = embstore.Store(tmp_path / "s", memory_budget_bytes=64 << 10)
    s.create_table("t", D).lookup(np.arange(2000))
    yield s
    s.close()


def test_pins_hold_rows_until_released_and_release_once(store):
    t = store["t"]
    with Pins() as pins:
        assert pins.take(t, np.arange(10)) and pins.take(t, np.arange(10, 20))
        assert len(pins) == 2 and pins.ids() == 20 and pins.tables() == {"t"}
        assert pins.bytes > 0 and store.pinned_bytes >= pins.bytes
    assert len(pins) == 0 and store.pinned_bytes == 0
    pins.release()  # twice: nothing left to unpin, no error
    assert store.pinned_bytes == 0


def test_a_refused_pin_is_kept_and_taken_by_a_retry_once_room_is_made(store):
    t = store["t"]
    big, small = Pins(), Pins()
    assert big.take(t, np.arange(1000, 1300))
    assert not small.take(t, np.arange(300)), "the budget's 60 % should refuse these"
    assert small.refused and len(small) == 0
    big.release()
    assert small.retry() == 1 and not small.refused and len(small) == 1
    assert store.pinned_bytes > 0
    small.release()
    assert store.pinned_bytes == 0


def test_tables_that_need_no_pin_are_passed_and_a_closed_store_releases_quietly(tmp_path):
    plain = embstore.Store().create_table("m", D)  # held whole in memory
    pins = Pins()
    assert pins.take(plain, np.arange(5)) and len(pins) == 0 and not Pins.needed(plain)
    s = embstore.Store(tmp_path / "c", memory_budget_bytes=1 << 20)
    t = s.create_table("t", D)
    assert Pins.needed(t) and pins.take(t, [1, 2, 3]) and len(pins) == 1
    s.close()
    pins.release()  # the store is gone: its pins went with it
    assert len(pins) == 0
