"""``embstore.torch.from_torchrec``: a TorchRec checkpoint's tables and fused optimizer state
imported into embstore tables, without TorchRec installed.

The fixtures are plain state dicts with TorchRec's key names and tensor shapes, as read from
TorchRec's source (pytorch/torchrec):

- ``torchrec/modules/embedding_modules.py``: ``EmbeddingBagCollection`` holds one
  ``nn.EmbeddingBag`` per table in ``self.embedding_bags`` (a ``ModuleDict`` keyed by table
  name), so its ``state_dict()`` has ``embedding_bags.<table>.weight``
  ``[num_embeddings, embedding_dim]``; ``EmbeddingCollection`` has ``embeddings.<table>.weight``.
  Inside a model the keys carry the module's prefix.
- ``torchrec/distributed/batched_embedding_kernel.py`` (``EmbeddingFusedOptimizer``): the fused
  (FBGEMM) optimizer's state per weight is ``<table>.momentum1`` and, for two-moment
  optimizers, ``<table>.momentum2``; a 1-D ``momentum1`` is row-wise (one float per row).
  FBGEMM's EXACT_ADAGRAD: momentum1 ``[N, D]`` sum of squares; EXACT_ROWWISE_ADAGRAD:
  momentum1 ``[N]``; ADAM: momentum1 ``exp_avg`` and momentum2 ``exp_avg_sq``, both ``[N, D]``
  (its iteration count is a module buffer, not in this state); PARTIAL_ROWWISE_ADAM:
  momentum2 ``[N]``.
- ``torchrec/optim/keyed.py`` (``KeyedOptimizer.state_dict``): ``{"state": {<parameter key>:
  {<state key>: tensor}}, "param_groups": [{"params": [<parameter keys>], "lr": ...}]}``;
  ``KeyedOptimizerWrapper`` over a ``torch.optim`` optimizer keeps torch's state names
  (``sum``; ``exp_avg``, ``exp_avg_sq``, ``step``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embstore
from embstore.torch import from_torchrec

N, D = 50, 4


def weights(seed: int = 0, n: int = N, d: int = D) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0, 0.1, (n, d)).astype(np.float32))


def keyed(state: dict[str, dict[str, torch.Tensor]], lr: float) -> dict:
    """A KeyedOptimizer.state_dict()."""
    return {"state": state, "param_groups": [{"params": sorted(state), "lr": lr}]}


def rows(table: embstore.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunks = list(table.export())
    ids = np.concatenate([c.ids for c in chunks])
    order = np.argsort(ids)
    return (
        ids[order],
        np.concatenate([c.values for c in chunks])[order],
        np.concatenate([c.state for c in chunks])[order],
    )


def test_fused_adagrad_imports_weights_and_sums_and_trains_on_as_adagrad():
    w = weights()
    s = torch.rand(N, D) * 0.5
    key = "sparse.ebc.embedding_bags.t_item.weight"
    store = embstore.Store()
    out = from_torchrec(
        store,
        {key: w, "dense.0.weight": torch.zeros(3, 3)},
        keyed({key: {"t_item.momentum1": s}}, lr=0.05),
    )
    table = out["t_item"]
    assert store.tables() == ["t_item"]
    assert table.config.optimizer == embstore.Adagrad(lr=0.05)
    ids, values, state = rows(table)
    np.testing.assert_array_equal(ids, np.arange(N))  # row i is id i
    np.testing.assert_array_equal(values, w.numpy())
    np.testing.assert_array_equal(state, s.numpy())
    # It goes on as Adagrad from the imported sums.
    g = np.full((1, D), 0.3, np.float32)
    table.apply_gradients([7], g)
    s7 = s[7].numpy() + g[0] ** 2
    want = w[7].numpy() - 0.05 * g[0] / (np.sqrt(s7) + 1e-10)
    np.testing.assert_allclose(table.lookup([7])[0], want, rtol=1e-5, atol=1e-7)


def test_fused_rowwise_adagrad_imports_one_float_per_row():
    w = weights(1)
    s = torch.rand(N)
    key = "embedding_bags.t_user.weight"
    store = embstore.Store()
    table = from_torchrec(store, {key: w}, keyed({key: {"t_user.momentum1": s}}, lr=0.1))["t_user"]
    assert table.config.optimizer._kind == "rowwise_adagrad" and table.state_dim == 1
    _, _, state = rows(table)
    np.testing.assert_array_equal(state[:, 0], s.numpy())
    g = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    table.apply_gradients([3], g)
    s3 = s[3].item() + float((g**2).mean())
    np.testing.assert_allclose(
        table.lookup([3])[0], w[3].numpy() - 0.1 * g[0] / (np.sqrt(s3) + 1e-8), rtol=1e-5
    )


@pytest.mark.parametrize("names", ["fused", "torch"])
def test_adam_imports_both_moments_and_the_step_and_goes_on_as_torch_adam(names):
    w = weights(2)
    m, v = torch.randn(N, D) * 0.01, torch.rand(N, D) * 1e-4
    key = "embeddings.t_ec.weight"  # an EmbeddingCollection's
    if names == "fused":
        state = {"t_ec.momentum1": m, "t_ec.momentum2": v}
        kw = {"step": 5}  # FBGEMM keeps its iteration count outside the state dict
    else:  # KeyedOptimizerWrapper over torch.optim.Adam
        state = {"exp_avg": m, "exp_avg_sq": v, "step": torch.tensor(5.0)}
        kw = {}
    store = embstore.Store()
    table = from_torchrec(store, {key: w}, keyed({key: state}, lr=0.01), **kw)["t_ec"]
    assert table.config.optimizer == embstore.Adam(lr=0.01)
    assert table.step == 5
    _, _, st = rows(table)
    np.testing.assert_array_equal(st, torch.cat([m, v], 1).numpy())
    # One more step, as torch.optim.Adam at t = 6.
    g = torch.full((1, D), 0.2)
    ref = torch.nn.Parameter(w[9:10].clone())
    opt = torch.optim.Adam([ref], lr=0.01)
    opt.state[ref] = {"step": torch.tensor(5.0), "exp_avg": m[9:10].clone(),
                      "exp_avg_sq": v[9:10].clone()}  # fmt: skip
    ref.grad = g.clone()
    opt.step()
    table.apply_gradients([9], g.numpy())
    np.testing.assert_allclose(table.lookup([9]), ref.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_weights_alone_and_renamed_tables_into_existing_ones():
    store = embstore.Store()
    store.create_table("item", D, optimizer=embstore.Adagrad(lr=0.1))
    sd = {
        "embedding_bags.t_item.weight": weights(3),
        "embedding_bags.t_skip.weight": weights(4),
    }
    out = from_torchrec(store, sd, tables={"t_item": "item"})
    assert list(out) == ["item"] and store.tables() == ["item"]
    _, values, state = rows(store["item"])
    np.testing.assert_array_equal(values, sd["embedding_bags.t_item.weight"].numpy())
    assert not state.any()  # fresh Adagrad state
    # Weights alone into a new table: SGD by default, or the optimizer given.
    out = from_torchrec(
        store, {"embedding_bags.t_skip.weight": weights(4)}, optimizer=embstore.Adam(lr=0.02)
    )
    assert out["t_skip"].config.optimizer == embstore.Adam(lr=0.02)


def test_what_cannot_map_is_refused_before_anything_is_written():
    key = "embedding_bags.t.weight"
    w = weights()
    store = embstore.Store()
    # FBGEMM's partial row-wise Adam: a per-row second moment.
    with pytest.raises(embstore.InvalidArgumentError, match="partial row-wise Adam"):
        from_torchrec(
            store,
            {key: w},
            keyed({key: {"t.momentum1": torch.zeros(N, D), "t.momentum2": torch.zeros(N)}}, 0.1),
            step=1,
        )
    # An optimizer embstore lacks (LAMB-like state names).
    with pytest.raises(embstore.InvalidArgumentError, match="no equivalent"):
        from_torchrec(store, {key: w}, keyed({key: {"t.exp_avg": w, "t.trust": w}}, 0.1))
    # Adam without a step.
    with pytest.raises(embstore.InvalidArgumentError, match="step="):
        from_torchrec(
            store, {key: w}, keyed({key: {"t.momentum1": w, "t.momentum2": w.abs()}}, 0.1)
        )
    # State of the wrong shape.
    with pytest.raises(embstore.ShapeError, match="momentum1"):
        from_torchrec(store, {key: w}, keyed({key: {"t.momentum1": torch.zeros(N, D + 1)}}, 0.1))
    # Optimizer state keyed by parameter index (a plain torch optimizer's state_dict()).
    with pytest.raises(embstore.InvalidArgumentError, match="keyed by parameter index"):
        from_torchrec(store, {key: w}, {"state": {0: {"sum": w}}, "param_groups": []})
    # A sharded weight (anything but a dense tensor).
    with pytest.raises(embstore.InvalidArgumentError, match="unsharded"):
        from_torchrec(store, {key: object()})
    with pytest.raises(embstore.InvalidArgumentError, match="no TorchRec table"):
        from_torchrec(store, {"dense.weight": w})
    assert store.tables() == []
    # Existing tables: another embedding_dim, another optimizer.
    store.create_table("t", D + 1, optimizer=embstore.Adagrad())
    with pytest.raises(embstore.ShapeError, match="embedding_dim mismatch"):
        from_torchrec(store, {key: w})
    store.drop_table("t")
    store.create_table("t", D, optimizer=embstore.Adam())
    with pytest.raises(embstore.InvalidArgumentError, match="optimizer mismatch"):
        from_torchrec(store, {key: w}, keyed({key: {"t.momentum1": torch.zeros(N)}}, 0.1))
    assert len(store["t"]) == 0


@pytest.mark.parametrize(
    ("torch_dtype", "name"), [(torch.float16, "fp16"), (torch.bfloat16, "bf16")]
)
def test_half_weights_make_tables_of_their_dtype_that_a_collection_config_accepts(
    torch_dtype, name
) -> None:
    # A TorchRec table of data_type FP16/BF16 imported first, then the ported model's
    # collection with the same data_type over it: the table has the config's dtype.
    import embstore.torch as et

    w = weights(3).to(torch_dtype)
    store = embstore.Store()
    tables = from_torchrec(store, {"ebc.embedding_bags.t.weight": w})
    assert tables["t"].config["dtype"] == name
    np.testing.assert_array_equal(tables["t"].lookup(np.arange(N)), w.float().numpy())
    config = et.EmbeddingBagConfig(name="t", embedding_dim=D, data_type=name.upper())
    et.EmbeddingBagCollection(store, [config])  # no "exists with other dtype"
    # float32 weights still make a float32 table; an existing table keeps its dtype.
    assert (
        from_torchrec(embstore.Store(), {"embeddings.u.weight": weights(4)})["u"].config["dtype"]
        == "fp32"
    )
    other = embstore.Store()
    other.create_table("t", D)
    assert from_torchrec(other, {"embedding_bags.t.weight": w})["t"].config["dtype"] == "fp32"
