"""``torch.distributed.checkpoint`` in one process through
:class:`embstore.torch.checkpoint.StoreState`: a model's rows (with optimizer state, metadata and
the step), its dense parameters, a store's tables, what a load replaces, and what it refuses.
(Across process counts: ``integration/test_dist_checkpoint_dcp.py``.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import embstore
import embstore.torch as et
from embstore.torch.checkpoint import StoreState


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process"
        warnings.simplefilter("ignore", UserWarning)
        yield


class Model(nn.Module):
    def __init__(self, store: embstore.Store) -> None:
        super().__init__()
        self.user = et.Embedding(store["user"])
        self.item = et.EmbeddingBag(store["item"], mode="sum")
        self.head = nn.Linear(8, 1)

    def forward(self, user, items):
        return self.head(torch.cat([self.user(user), self.item(items)], 1)).squeeze(-1)


def make_store(user_dim: int = 4, item_opt=None) -> embstore.Store:
    store = embstore.Store()
    store.create_table("user", user_dim, optimizer=embstore.Adam(lr=0.01))
    store.create_table("item", 4, optimizer=item_opt or embstore.RowWiseAdagrad(lr=0.1))
    return store


def train(model: Model, steps: int = 3) -> None:
    rng = np.random.default_rng(0)
    opts = [et.EmbeddingOptimizer(model), torch.optim.SGD(model.head.parameters(), lr=0.1)]
    for _ in range(steps):
        user = torch.from_numpy(rng.integers(0, 500, 16))
        items = torch.from_numpy(rng.integers(0, 5000, (16, 3)))
        model(user, items).square().mean().backward()
        for o in opts:
            o.step()
            o.zero_grad()


def rows(table: embstore.Table) -> dict[str, np.ndarray]:
    chunks = list(table.export())
    ids = np.concatenate([c.ids for c in chunks])
    order = np.argsort(ids)
    return {
        k: np.concatenate([getattr(c, k) for c in chunks])[order]
        for k in ("ids", "values", "state", "versions", "update_counts")
    }


def test_a_model_round_trips_through_dcp_rows_state_step_and_dense(tmp_path):
    store = make_store()
    model = Model(store)
    train(model)
    dcp.save({"model": StoreState(model)}, checkpoint_id=tmp_path / "ckpt")
    fresh_store = make_store()
    fresh = Model(fresh_store)
    _ = fresh(torch.tensor([100_000]), torch.tensor([[100_001, 1, 2]]))  # rows to be replaced
    dcp.load({"model": StoreState(fresh)}, checkpoint_id=tmp_path / "ckpt")
    for name in ("user", "item"):
        a, b = rows(store[name]), rows(fresh_store[name])
        assert len(a["ids"]) > 40
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}.{k}")
        assert fresh_store[name].step == store[name].step == 3
    assert not fresh_store["user"].contains([100_000])[0]
    for k, v in model.head.state_dict().items():
        assert torch.equal(v, fresh.head.state_dict()[k]), k
    # Both go on alike.
    train(model, 1)
    train(fresh, 1)
    np.testing.assert_array_equal(
        rows(store["user"])["values"], rows(fresh_store["user"])["values"]
    )


def test_a_store_trained_by_a_session_round_trips(tmp_path):
    store = make_store()
    sess = store.session(["item"], prefetch=0)
    batches = [np.arange(i, i + 40) for i in range(3)]
    for b in sess.run(batches, ids=lambda b: {"item": b}):
        b.embeddings("item").square().sum().backward()
        b.push_grads()
    dcp.save({"tables": StoreState(store)}, checkpoint_id=tmp_path / "c")
    other = make_store()
    dcp.load({"tables": StoreState(other)}, checkpoint_id=tmp_path / "c")
    a, b = rows(store["item"]), rows(other["item"])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert other["item"].step == store["item"].step == 3
    assert len(other["user"]) == 0


def test_building_the_state_for_a_load_copies_no_row(monkeypatch):
    store = make_store()
    train(Model(store))

    def no_export(*a, **k):
        raise AssertionError("state_dict() exported rows")

    monkeypatch.setattr(embstore.Table, "export", no_export)
    state = StoreState(store).state_dict()
    assert set(state["rows"]) == {"user", "item"}


def test_a_load_that_cannot_map_is_refused_before_any_row_is_written(tmp_path):
    store = make_store()
    train(Model(store))
    dcp.save({"t": StoreState(store)}, checkpoint_id=tmp_path / "c")

    def load_into(target, **kw):
        dcp.load({"t": StoreState(target, **kw)}, checkpoint_id=tmp_path / "c")

    with pytest.raises(embstore.ShapeError, match="embedding_dim mismatch for table 'user'"):
        load_into(make_store(user_dim=8))
    other = make_store(item_opt=embstore.Adagrad())
    with pytest.raises(embstore.InvalidArgumentError, match="optimizer mismatch for table 'item'"):
        load_into(other)
    assert len(other["user"]) == 0  # the user table, checked fine, was not written either
    smaller = embstore.Store()
    smaller.create_table("user", 4, optimizer=embstore.Adam(lr=0.01))
    with pytest.raises(embstore.InvalidArgumentError, match=r"holds table\(s\) \['item'\]"):
        load_into(smaller)
    # Loaded with fewer parts than saved with (with more, DCP misses the extra parts' keys).
    with pytest.raises(embstore.InvalidArgumentError, match="pass parts=256"):
        load_into(make_store(), parts=8)
    with pytest.raises(embstore.InvalidArgumentError, match="StoreState takes"):
        StoreState(42)
