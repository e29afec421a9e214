"""embstore.prefetch: the training pipeline for tables larger than memory."""

import numpy as np
import pytest

import embstore


def _train(tmp_path, name, pipeline, background=False, eviction="lru_lfu"):
    store = embstore.Store(
        tmp_path / name,
        memory_budget_bytes=96 << 10,
        background_eviction=background,
        eviction=eviction,
    )
    t = store.create_table("t", embedding_dim=8, optimizer=embstore.Adagrad(lr=0.1), seed=3)
    rng = np.random.default_rng(7)
    batches = [rng.integers(0, 3000, 150) for _ in range(60)]
    it = embstore.prefetch(batches, lambda ids: {t: ids}) if pipeline else iter(batches)
    for ids in it:
        rows = t.lookup(ids)
        t.apply_gradients(ids, rows * 0.5 + 0.1)
    return store, t


def _stored(tmp_path, size, count):
    """A table under a 64 KiB budget (SGD, D 8) holding ``count`` batches of ``size`` ids."""
    store = embstore.Store(tmp_path / "s", memory_budget_bytes=64 << 10)
    t = store.create_table("t", embedding_dim=8)
    batches = [np.arange(i * size, (i + 1) * size) for i in range(count)]
    for ids in batches:
        t.lookup(ids)
    return t, batches


def test_prefetch_trains_to_the_same_rows_and_reads_ahead(tmp_path):
    _, plain = _train(tmp_path, "plain", False)
    _store, piped = _train(tmp_path, "piped", True)
    _, evictor = _train(tmp_path, "evictor", True, background=True)
    ids = np.arange(3000)
    assert np.array_equal(plain.lookup(ids), piped.lookup(ids))
    assert np.array_equal(plain.lookup(ids), evictor.lookup(ids))
    assert piped.stats()["cold_reads"] > 0
    # Every pin taken for the batches in flight is released at the end: 500 more rows fit
    # under the 60 % of the budget that pins may take (112 B each: ~526) only if none is left.
    fresh = np.arange(10_000, 10_500)
    piped.pin(fresh)
    piped.unpin(fresh)
    with pytest.raises(embstore.CapacityError):
        piped.pin(np.arange(10_000, 10_600))


def test_breaking_out_releases_pins_and_bad_arguments_are_refused(tmp_path):
    t, batches = _stored(tmp_path, size=100, count=10)
    gen = embstore.prefetch(batches, lambda ids: {t: ids}, depth=2)
    next(gen)
    gen.close()
    # 3 batches of 100 were pinned; 450 fresh pins (80 B each, ~480 allowed) fit only if
    # closing released them.
    t.pin(np.arange(5000, 5450))
    t.unpin(np.arange(5000, 5450))
    with pytest.raises(embstore.InvalidArgumentError):
        embstore.prefetch(batches, lambda ids: {t: ids}, depth=0)
    with pytest.raises(embstore.InvalidArgumentError):
        list(embstore.prefetch(batches, lambda ids: {"t": ids}))
    # A table without a memory budget: batches pass through unchanged.
    mem = embstore.Store().create_table("m", embedding_dim=4)
    assert [len(b) for b in embstore.prefetch(batches, lambda ids: {mem: ids})] == [100] * 10
    assert mem.prefetch(np.arange(5)) == 0
    with pytest.raises(embstore.InvalidArgumentError, match="background_eviction"):
        embstore.Store(tmp_path / "b", memory_budget_bytes=1 << 20, background_eviction="yes")


def test_batches_too_large_to_pin_are_read_ahead_unpinned_with_a_warning(tmp_path):
    # 80 B a pinned row: 60 % of the budget is ~490 rows; two batches of 400 in flight are not.
    t, batches = _stored(tmp_path, size=400, count=4)
    seen = []
    with pytest.warns(RuntimeWarning, match="without a pin"):
        for ids in embstore.prefetch(batches, lambda ids: {t: ids}):
            seen.append(len(ids))
            t.lookup(ids)
    assert seen == [400] * 4
    t.pin(np.arange(10_000, 10_450))  # no pin of the pipeline is left


@pytest.mark.parametrize("eviction", ["lru", "lfu", "group_lfu", "none"])
def test_every_eviction_policy_trains_to_the_same_rows(tmp_path, eviction):
    _, plain = _train(tmp_path, "plain", False)
    _, other = _train(tmp_path, eviction, True, eviction=eviction)
    ids = np.arange(3000)
    assert np.array_equal(plain.lookup(ids), other.lookup(ids))
    stats = other.stats()
    if eviction == "none":
        assert stats["evicted_to_disk"] == 0
    else:
        assert stats["evicted_to_disk"] > 0 and stats["cold_reads"] > 0


def test_an_unknown_or_unfit_eviction_policy_is_a_clear_error(tmp_path):
    with pytest.raises(embstore.InvalidArgumentError, match=r"unknown eviction policy \"mru\""):
        embstore.Store(tmp_path / "a", memory_budget_bytes=1 << 20, eviction="mru")
    with pytest.raises(embstore.InvalidArgumentError, match="cannot run a store's hot-row"):
        embstore.Store(tmp_path / "b", memory_budget_bytes=1 << 20, eviction="group_assoc")
    with pytest.raises(embstore.InvalidArgumentError, match="eviction must be"):
        embstore.Store(tmp_path / "c", memory_budget_bytes=1 << 20, eviction=3)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
