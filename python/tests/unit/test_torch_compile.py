"""``torch.compile`` over a model with embstore modules: the table calls are ``torch.library``
custom operators (``embstore::pull``, ``embstore::stash``, ``embstore::check_offsets``) with
fake kernels, so the model compiles with ``fullgraph=True`` — no graph break from embstore —
and trains as it does eagerly. The backend here is ``aot_eager`` (AOTAutograd's graphs, run by
eager kernels: what embstore's operators meet, without a C++ compiler or minutes of compile
time); the speed of Inductor's compiled step is a benchmark
(``python/benchmarks/bench_torch_compile.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from torch import nn

import embstore
import embstore.torch as et
from embstore import errors

D = 8


class Model(nn.Module):
    """Four embstore modules: two Embeddings, a bag over offsets with weights, a 2-D bag."""

    def __init__(self, store: embstore.Store) -> None:
        super().__init__()
        mk = lambda n: store.create_table(n, D, optimizer=embstore.Adam(lr=0.05))  # noqa: E731
        self.user = et.Embedding(mk("user"))
        self.item = et.Embedding(mk("item"))
        self.tags = et.EmbeddingBag(mk("tags"), mode="sum")
        self.hist = et.EmbeddingBag(mk("hist"), mode="mean")
        self.mlp = nn.Sequential(nn.Linear(4 * D, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user, item, tags, offsets, weights, hist):
        x = torch.cat(
            [self.user(user), self.item(item), self.tags(tags, offsets, weights), self.hist(hist)],
            dim=1,
        )
        return self.mlp(x).squeeze(-1)


def batch(i: int, b: int = 32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(i)
    tags = torch.randint(0, 500, (3 * b,), generator=g)
    return (
        torch.randint(0, 1000, (b,), generator=g),
        torch.randint(0, 1000, (b,), generator=g),
        tags,
        torch.arange(b) * 3,
        torch.rand(3 * b, generator=g),
        torch.randint(0, 200, (b, 4), generator=g),
    )


def train(model: nn.Module, forward, steps: int) -> list[float]:
    sparse = et.EmbeddingOptimizer(model)
    torch.manual_seed(0)
    dense = torch.optim.SGD(model.mlp.parameters(), lr=0.05)
    losses = []
    for i in range(steps):
        loss = forward(*batch(i)).square().mean()
        loss.backward()
        sparse.step()
        dense.step()
        sparse.zero_grad()
        dense.zero_grad()
        losses.append(loss.item())
    return losses


def make(seed: int = 0) -> tuple[embstore.Store, Model]:
    torch.manual_seed(seed)
    store = embstore.Store()
    return store, Model(store)


def test_a_model_with_four_embstore_modules_has_no_graph_break():
    _, model = make()
    explained = torch._dynamo.explain(model)(*batch(0))
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_fullgraph_compiled_training_equals_eager():
    torch._dynamo.reset()
    eager_store, eager = make()
    compiled_store, model = make()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False)
    a = train(eager, eager, 4)
    b = train(model, compiled, 4)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for name in ("user", "item", "tags", "hist"):
        x, y = eager_store.table(name), compiled_store.table(name)
        assert len(x) == len(y) and x.step == y.step == 4
        ids = np.sort(np.concatenate([c.ids for c in x.export()]))
        np.testing.assert_allclose(x.lookup(ids), y.lookup(ids), rtol=1e-5, atol=1e-7)


def test_compiled_eval_stores_nothing_and_bad_offsets_raise():
    torch._dynamo.reset()
    store, model = make()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    model.eval()
    with torch.no_grad():
        compiled(*batch(0))
    assert all(len(store.table(n)) == 0 for n in ("user", "item", "tags", "hist"))
    user, item, tags, offsets, weights, hist = batch(1)
    bad = offsets.clone()
    bad[1], bad[2] = offsets[2], offsets[1]
    with pytest.raises(errors.InvalidArgumentError, match="non-decreasing"):
        compiled(user, item, tags, bad, weights, hist)
