"""TorchRec's shapes over embstore tables: ``EmbeddingBagCollection``, ``EmbeddingCollection``,
``KeyedJaggedTensor`` input, and sessions fed the same input (``features=``)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import embstore
import embstore.torch as et
from embstore import errors

B = 5


def make_kjt(seed: int = 0, weighted: bool = False, keys=("item", "hist", "user")):
    """A batch of B samples: item 0..2 ids, hist 0..4, user exactly 1 (some bags empty),
    ids drawn from a small range so features share ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    for k in keys:
        high = {"item": 3, "hist": 5, "user": 2}.get(k, 3)
        lengths.append(torch.randint(0, high, (B,), generator=g))
    lengths = torch.cat(lengths)
    values = torch.randint(0, 12, (int(lengths.sum()),), generator=g) - 3  # negative ids too
    weights = torch.rand(len(values), generator=g) if weighted else None
    return et.KeyedJaggedTensor.from_lengths_sync(list(keys), values, lengths, weights=weights)


def configs(optimizer=None, item_pooling="sum", user_pooling="mean"):
    kw = {} if optimizer is None else {"optimizer": optimizer}
    return [
        et.EmbeddingBagConfig(
            name="t_item",
            embedding_dim=4,
            feature_names=["item", "hist"],
            pooling=item_pooling,
            initializer=embstore.Uniform(-1, 1),
            **kw,
        ),
        et.EmbeddingBagConfig(
            name="t_user",
            embedding_dim=3,
            feature_names=["user"],
            pooling=user_pooling,
            initializer=embstore.Uniform(-1, 1),
            **kw,
        ),
    ]


def reference_bag(table: embstore.Table, ids: torch.Tensor, mode: str):
    """An nn.EmbeddingBag holding the table's current rows of ``ids``' distinct ids, and the
    indices of ``ids`` into it."""
    uniq, idx = torch.unique(ids, return_inverse=True)
    bag = nn.EmbeddingBag(len(uniq), table.embedding_dim, mode=mode, sparse=True)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(table.lookup(uniq.numpy(), "zeros")))
    return bag, uniq, idx


def test_each_feature_pools_as_nn_embedding_bag() -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs())
    kjt = make_kjt()
    out = ebc(kjt)
    assert out.keys() == ["item", "hist", "user"]
    assert out.length_per_key() == [4, 4, 3]
    assert out.values().shape == (B, 11)
    jt = kjt.to_dict()
    cases = [("item", "t_item", "sum"), ("hist", "t_item", "sum"), ("user", "t_user", "mean")]
    for feature, table, mode in cases:
        ids = jt[feature].values()
        bag, _, idx = reference_bag(store.table(table), ids, mode)
        offsets = jt[feature].offsets()
        want = nn.functional.embedding_bag(
            idx, bag.weight, offsets, mode=mode, include_last_offset=True
        )
        torch.testing.assert_close(out[feature], want)
        torch.testing.assert_close(out.to_dict()[feature], want)
    # Empty bags give zeros (the generator leaves some).
    lengths = kjt.lengths().view(3, B)
    assert (lengths == 0).any()
    for f, feature in enumerate(["item", "hist", "user"]):
        empty = lengths[f] == 0
        assert (out[feature][empty] == 0).all()


def test_a_shared_table_is_one_lookup_and_one_step_per_id() -> None:
    # item and hist share t_item: their ids are one pull, their gradients one Adam step per
    # id and optimizer step (t counts steps, not features), equal to one nn.EmbeddingBag
    # used for both features under SparseAdam.
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs(embstore.Adam(lr=0.1)))
    opt = et.EmbeddingOptimizer(ebc)
    table = store.table("t_item")
    kjt = make_kjt(1)
    jt = kjt.to_dict()
    both = torch.cat([jt["item"].values(), jt["hist"].values()])
    assert len(set(jt["item"].values().tolist()) & set(jt["hist"].values().tolist())) > 0
    table.lookup(both.numpy())  # rows exist before the reference copies them
    bag, _, idx = reference_bag(table, both, "sum")
    ref_opt = torch.optim.SparseAdam(bag.parameters(), lr=0.1)
    n_item = len(jt["item"].values())
    proj = torch.randn(8, generator=torch.Generator().manual_seed(3))
    for step in range(1, 3):
        opt.zero_grad()
        out = ebc(kjt)
        loss = (torch.cat([out["item"], out["hist"]], 1) * proj).sum()
        loss.backward()
        assert len(ebc.embedding_bags["t_item"]._pending) == 1  # one pull for both features
        opt.step()
        assert table.step == step
        ref_opt.zero_grad()
        ref_item = bag(idx[:n_item], jt["item"].offsets()[:-1])
        ref_hist = bag(idx[n_item:], jt["hist"].offsets()[:-1])
        (torch.cat([ref_item, ref_hist], 1) * proj).sum().backward()
        ref_opt.step()
        uniq = torch.unique(both)
        torch.testing.assert_close(torch.from_numpy(table.lookup(uniq.numpy())), bag.weight)
    assert store.table("t_user").step == 2


def test_weighted_features_pool_with_the_weights() -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs(user_pooling="sum"), is_weighted=True)
    assert ebc.is_weighted()
    kjt = make_kjt(2, weighted=True)
    out = ebc(kjt)
    for feature, table in (("item", "t_item"), ("hist", "t_item"), ("user", "t_user")):
        jt = kjt[feature]
        bag, _, idx = reference_bag(store.table(table), jt.values(), "sum")
        want = bag(idx, jt.offsets()[:-1], per_sample_weights=jt.weights())
        torch.testing.assert_close(out[feature], want)
    # An unweighted collection ignores the input's weights, as TorchRec's does.
    plain = et.EmbeddingBagCollection(store, configs(user_pooling="sum"))
    torch.testing.assert_close(plain(kjt).values(), plain(make_kjt(2)).values())
    # Weighted needs weights, and SUM pooling.
    with pytest.raises(errors.InvalidArgumentError, match="no weights"):
        ebc(make_kjt(2))
    with pytest.raises(errors.InvalidArgumentError, match="MEAN"):
        et.EmbeddingBagCollection(embstore.Store(), configs(), is_weighted=True)


class DuckKJT:
    """Anything with keys()/values()/lengths()/weights_or_none(): no checks of its own."""

    def __init__(self, keys, values, lengths, weights=None):
        self._k, self._v, self._l, self._w = keys, values, lengths, weights

    def keys(self):
        return self._k

    def values(self):
        return self._v

    def lengths(self):
        return self._l

    def weights_or_none(self):
        return self._w


KEYS = ["item", "hist", "user"]
BAD_INPUTS = [
    # lengths sum to 4, values has 5
    (DuckKJT(KEYS, torch.arange(5), torch.tensor([1, 1, 1, 0, 1, 0])), errors.ShapeError),
    # lengths not one per key and sample
    (DuckKJT(KEYS, torch.arange(3), torch.tensor([1, 1, 1, 0])), errors.ShapeError),
    # a feature of the configs missing from the input
    (
        DuckKJT(["item", "user"], torch.arange(2), torch.tensor([1, 0, 1, 0])),
        errors.InvalidArgumentError,
    ),
    # float ids
    (DuckKJT(KEYS, torch.arange(3.0), torch.tensor([1, 1, 1, 0, 0, 0])), errors.DTypeError),
    # float lengths
    (DuckKJT(KEYS, torch.arange(3), torch.tensor([1.0, 1, 1, 0, 0, 0])), errors.DTypeError),
    # negative length
    (
        DuckKJT(KEYS, torch.arange(3), torch.tensor([2, -1, 1, 0, 1, 0])),
        errors.InvalidArgumentError,
    ),
    # weights of another length
    (
        DuckKJT(KEYS, torch.arange(3), torch.tensor([1, 1, 1, 0, 0, 0]), torch.ones(2)),
        errors.ShapeError,
    ),
    # integer weights
    (
        DuckKJT(
            KEYS,
            torch.arange(3),
            torch.tensor([1, 1, 1, 0, 0, 0]),
            torch.ones(3, dtype=torch.int64),
        ),
        errors.DTypeError,
    ),
    # not jagged input at all
    (torch.arange(3), errors.DTypeError),
    ({"item": torch.arange(3)}, errors.DTypeError),
]


@pytest.mark.parametrize(("kjt", "error"), BAD_INPUTS)
def test_bad_jagged_input_is_a_typed_error_before_any_lookup(kjt, error) -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs())
    with pytest.raises(error):
        ebc(kjt)
    assert len(store.table("t_item")) == 0 and len(store.table("t_user")) == 0
    # Our KeyedJaggedTensor refuses the same input at construction.
    if isinstance(kjt, DuckKJT) and set(kjt.keys()) == set(KEYS):
        with pytest.raises(error):
            et.KeyedJaggedTensor(kjt.keys(), kjt.values(), kjt.weights_or_none(), kjt.lengths())


def test_keyed_jagged_tensor_follows_torchrec() -> None:
    # TorchRec's docstring example: F0 = [[0, 1], [], [2]], F1 = [[3], [4], [5, 6, 7]].
    values = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    a = et.KeyedJaggedTensor.from_offsets_sync(
        ["f0", "f1"], values, torch.tensor([0, 2, 2, 3, 4, 5, 8])
    )
    b = et.KeyedJaggedTensor.from_lengths_sync(
        ["f0", "f1"], values, torch.tensor([2, 0, 1, 1, 1, 3])
    )
    for kjt in (a, b):
        assert kjt.keys() == ["f0", "f1"] and kjt.stride() == 3 and len(kjt) == 2
        assert kjt.length_per_key() == [3, 5] and kjt.offset_per_key() == [0, 3, 8]
        assert kjt.lengths().tolist() == [2, 0, 1, 1, 1, 3]
        assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 5, 8]
        assert kjt.weights_or_none() is None
        d = kjt.to_dict()
        assert list(d) == ["f0", "f1"]
        assert [t.tolist() for t in d["f1"].to_dense()] == [[3], [4], [5, 6, 7]]
        assert d["f0"].offsets().tolist() == [0, 2, 2, 3]
        with pytest.raises(errors.InvalidArgumentError, match="no weights"):
            kjt.weights()
    jt = et.KeyedJaggedTensor.from_jt_dict(a.to_dict())
    assert jt.values().tolist() == values.tolist() and jt.stride() == 3
    with pytest.raises(errors.InvalidArgumentError, match="batch size per feature"):
        et.KeyedJaggedTensor(
            ["f0"], values, lengths=torch.tensor([8]), stride_per_key_per_rank=[[1]]
        )


def test_duck_typed_input_equals_our_kjt() -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs())
    kjt = make_kjt(4)
    duck = DuckKJT(kjt.keys(), kjt.values(), kjt.lengths().to(torch.int32))
    assert torch.equal(ebc(kjt).values(), ebc(duck).values())
    # The input's key order and extra keys do not matter (TorchRec ignores unused keys).
    d = kjt.to_dict()
    shuffled = et.KeyedJaggedTensor.from_jt_dict(
        {"user": d["user"], "other": d["item"], "hist": d["hist"], "item": d["item"]}
    )
    assert torch.equal(ebc(kjt).values(), ebc(shuffled).values())


def test_tables_are_created_from_configs_or_checked() -> None:
    store = embstore.Store()
    store.create_table("t_user", 3, optimizer=embstore.Adagrad(lr=0.5))
    cfg = [
        et.EmbeddingBagConfig(
            num_embeddings=100,
            embedding_dim=4,
            name="t_item",
            feature_names=["item"],
            optimizer=embstore.Adam(lr=0.01),
            table_args={"seed": 7},
        ),
        et.EmbeddingBagConfig(embedding_dim=3, name="t_user", feature_names=["user"]),
    ]
    et.EmbeddingBagCollection(store, cfg)
    spec = store.table("t_item").config
    assert spec.embedding_dim == 4 and spec.optimizer == embstore.Adam(lr=0.01)
    assert spec.seed == 7
    # TorchRec's default initial values: uniform on +-sqrt(1 / num_embeddings).
    assert spec.initializer == embstore.Uniform(-0.1, 0.1)
    assert store.table("t_user").config.optimizer == embstore.Adagrad(lr=0.5)  # as it was
    # An existing table of another dim, or another optimizer asked for, is refused.
    with pytest.raises(errors.ShapeError, match="embedding_dim"):
        et.EmbeddingBagCollection(store, [et.EmbeddingBagConfig(embedding_dim=8, name="t_user")])
    with pytest.raises(errors.InvalidArgumentError, match="optimizer"):
        et.EmbeddingBagCollection(
            store,
            [et.EmbeddingBagConfig(embedding_dim=3, name="t_user", optimizer=embstore.SGD())],
        )
    # TorchRec's init_fn, when it is a uniform_/normal_ partial; other callables are refused.
    init = functools.partial(torch.nn.init.uniform_, a=-0.5, b=0.5)
    u = et.EmbeddingBagConfig(embedding_dim=2, name="u", init_fn=init)
    ebc_u = et.EmbeddingBagCollection(store, [u])
    # No feature_names: the table's name, written back as TorchRec does (models read it).
    assert u.feature_names == ["u"] and ebc_u.embedding_bag_configs()[0] is u
    assert store.table("u").config.initializer == embstore.Uniform(-0.5, 0.5)
    with pytest.raises(errors.InvalidArgumentError, match="init_fn"):
        et.EmbeddingBagCollection(
            store, [et.EmbeddingBagConfig(embedding_dim=2, name="v", init_fn=lambda w: w)]
        )
    with pytest.raises(errors.InvalidArgumentError, match="FP32, FP16 or BF16"):
        et.EmbeddingBagCollection(
            store, [et.EmbeddingBagConfig(embedding_dim=2, name="w", data_type="INT8")]
        )
    # FP16 / BF16: the table's storage dtype (rows at 2 bytes a value).
    half = et.EmbeddingBagCollection(
        store, [et.EmbeddingBagConfig(embedding_dim=2, name="h", data_type="BF16")]
    )
    assert store.table("h").config.dtype == "bf16" and half.embedding_bags["h"].table.name == "h"
    with pytest.raises(errors.InvalidArgumentError, match="pooling"):
        et.EmbeddingBagCollection(
            store, [et.EmbeddingBagConfig(embedding_dim=2, name="w", pooling=et.PoolingType.NONE)]
        )
    # A TorchRec-shaped config object (duck-typed: TorchRec's own dataclass works alike).
    tr = SimpleNamespace(
        num_embeddings=4,
        embedding_dim=2,
        name="x",
        feature_names=["f"],
        pooling=SimpleNamespace(value="MEAN"),
        data_type=SimpleNamespace(value="FP32"),
        weight_init_min=None,
        weight_init_max=None,
        init_fn=None,
    )
    ebc = et.EmbeddingBagCollection(store, [tr])
    assert ebc.embedding_bags["x"].mode == "mean"
    assert store.table("x").config.initializer == embstore.Uniform(-0.5, 0.5)


def test_a_feature_in_two_tables_is_named_feature_at_table() -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(
        store,
        [
            et.EmbeddingBagConfig(embedding_dim=2, name="a", feature_names=["item", "user"]),
            et.EmbeddingBagConfig(embedding_dim=3, name="b", feature_names=["item"]),
        ],
    )
    out = ebc(make_kjt(5))
    assert out.keys() == ["item@a", "user", "item@b"]
    assert out.length_per_key() == [2, 2, 3] and out.offset_per_key() == [0, 2, 4, 7]


def test_state_dict_round_trips_every_table() -> None:
    src = embstore.Store()
    ebc = et.EmbeddingBagCollection(src, configs(embstore.Adagrad(lr=0.1)))
    opt = et.EmbeddingOptimizer(ebc)
    ebc(make_kjt(6)).values().sum().backward()
    opt.step()
    state = ebc.state_dict()
    assert sorted(state) == [
        "embedding_bags.t_item._extra_state",
        "embedding_bags.t_user._extra_state",
    ]
    dst = et.EmbeddingBagCollection(embstore.Store(), configs(embstore.Adagrad(lr=0.1)))
    dst.load_state_dict(state)
    kjt = make_kjt(6)
    ebc.eval(), dst.eval()
    assert torch.equal(ebc(kjt).values(), dst(kjt).values())


def test_embedding_collection_gives_each_features_rows() -> None:
    store = embstore.Store()
    ec = et.EmbeddingCollection(
        store,
        [
            et.EmbeddingConfig(embedding_dim=4, name="t_item", feature_names=["item", "hist"]),
            # A bag config's pooling does not apply here: its rows come unpooled.
            et.EmbeddingBagConfig(embedding_dim=4, name="t_user", feature_names=["user"]),
        ],
        need_indices=True,
    )
    kjt = make_kjt(7)
    out = ec(kjt)
    assert list(out) == ["item", "hist", "user"]
    for f, t in (("item", "t_item"), ("hist", "t_item"), ("user", "t_user")):
        ids = kjt[f].values()
        want = torch.from_numpy(store.table(t).lookup(ids.numpy()))
        assert torch.equal(out[f].values(), want)
        assert out[f].lengths().tolist() == kjt[f].lengths().tolist()
        assert torch.equal(out[f].weights(), ids)
    opt = et.EmbeddingOptimizer(ec)
    sum(v.values().sum() for v in out.values()).backward()
    item_ids = set(kjt["item"].values().tolist()) | set(kjt["hist"].values().tolist())
    assert opt.step() == len(item_ids) + len(set(kjt["user"].values().tolist()))


def _train_module(batches, opt_factory):
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs(opt_factory()), is_weighted=False)
    torch.manual_seed(0)
    head = nn.Linear(11, 1)
    opt = et.EmbeddingOptimizer(ebc)
    pooled = []
    for kjt in batches:
        out = ebc(kjt)
        pooled.append(out.values().detach().clone())
        head(out.values()).square().sum().backward()
        opt.step()
        opt.zero_grad()
        head.zero_grad()
    return store, pooled


def _train_session(batches, opt_factory, features, prefetch):
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs(opt_factory()))
    torch.manual_seed(0)
    head = nn.Linear(11, 1)
    feats = {"ebc": ebc, "configs": configs(opt_factory())}[features]
    sess = store.session(features=feats, prefetch=prefetch)
    assert sess.tables == ["t_item", "t_user"]
    pooled = []
    for batch in sess.run(batches, ids=lambda kjt: kjt):
        out = batch.pooled()
        assert out.keys() == ["item", "hist", "user"]
        pooled.append(out.values().detach().clone())
        head(out.values()).square().sum().backward()
        batch.push_grads()
        head.zero_grad()
    return store, pooled


@pytest.mark.parametrize("features", ["ebc", "configs"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_session_with_jagged_input_equals_the_module_bit_for_bit(features, prefetch) -> None:
    batches = [make_kjt(10 + i) for i in range(6)]
    make_opt = functools.partial(embstore.Adam, lr=0.05)
    a, pooled_a = _train_module(batches, make_opt)
    b, pooled_b = _train_session(batches, make_opt, features, prefetch)
    for x, y in zip(pooled_a, pooled_b, strict=True):
        assert torch.equal(x, y)
    for name in ("t_item", "t_user"):
        ta, tb = a.table(name), b.table(name)
        assert ta.step == tb.step == len(batches)
        ea = sorted(
            (int(i), v.tobytes(), s.tobytes())
            for c in ta.export()
            for i, v, s in zip(c.ids, c.values, c.state, strict=True)
        )
        eb = sorted(
            (int(i), v.tobytes(), s.tobytes())
            for c in tb.export()
            for i, v, s in zip(c.ids, c.values, c.state, strict=True)
        )
        assert ea == eb


def test_session_features_mapping_and_errors() -> None:
    store = embstore.Store()
    store.create_table("t_item", 4, optimizer=embstore.SGD(lr=0.1))
    store.create_table("t_user", 3, optimizer=embstore.SGD(lr=0.1))
    mapping = {"item": "t_item", "hist": "t_item", "user": "t_user"}
    sess = store.session(features=mapping, prefetch=0)
    kjt = make_kjt(20, weighted=True)
    for batch in sess.run([kjt], ids=lambda k: k):
        out = batch.pooled()  # sum pooling, with the input's weights
        rows = batch.jagged()
        assert rows["hist"].values().shape == (len(kjt["hist"].values()), 4)
        jt = kjt["hist"]
        bag, _, idx = reference_bag(store.table("t_item"), jt.values(), "sum")
        want = bag(idx, jt.offsets()[:-1], per_sample_weights=jt.weights())
        torch.testing.assert_close(out["hist"], want)
        out.values().sum().backward()
        batch.push_grads()
    assert store.table("t_item").step == 1
    # A KJT without features=, and a bad KJT, are typed errors.
    plain = store.session(["t_item", "t_user"], prefetch=0)
    with pytest.raises(errors.InvalidArgumentError, match="features="):
        list(plain.run([kjt], ids=lambda k: k))
    bad = DuckKJT(KEYS, torch.arange(5), torch.tensor([1, 1, 1, 0, 1, 0]))
    with pytest.raises(errors.ShapeError, match="lengths sum"):
        list(sess.run([bad], ids=lambda k: k))
    with pytest.raises(errors.InvalidArgumentError, match="not in the session"):
        store.session(["t_item"], features=mapping)
    ids = lambda k: {"t_item": k.values(), "t_user": k.values()}  # noqa: E731
    for batch in plain.run([kjt], ids=ids, train=False):
        with pytest.raises(errors.InvalidArgumentError, match="features="):
            batch.pooled()


def test_real_torchrec_input_when_installed() -> None:
    jagged = pytest.importorskip("torchrec.sparse.jagged_tensor")
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs())
    ours = make_kjt(30, weighted=True)
    theirs = jagged.KeyedJaggedTensor.from_lengths_sync(
        ours.keys(), ours.values(), ours.lengths(), weights=ours.weights()
    )
    assert torch.equal(ebc(ours).values(), ebc(theirs).values())
    assert np.array_equal(
        ebc(theirs).values().detach().numpy(), ebc(ours).values().detach().numpy()
    )


@pytest.mark.parametrize("lengths", [[], [0] * 6])
def test_a_batch_without_ids_pools_to_zeros(lengths) -> None:
    store = embstore.Store()
    ebc = et.EmbeddingBagCollection(store, configs())
    kjt = et.KeyedJaggedTensor.from_lengths_sync(
        KEYS, torch.empty(0, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int64)
    )
    out = ebc(kjt)
    assert out.values().shape == (len(lengths) // 3, 11)
    assert (out.values() == 0).all()
    out.values().sum().backward()
    assert et.EmbeddingOptimizer(ebc).step() == 0
    assert len(store.table("t_item")) == 0


@pytest.mark.parametrize(("mode", "weighted"), [("sum", False), ("mean", False), ("sum", True)])
def test_bags_of_one_id_pool_and_backprop_as_embedding_bag(mode, weighted):
    """One-hot features skip embedding_bag (a bag of one id is its row, times its weight):
    the same output and row gradients, to the bit."""
    from embstore.torch.jagged import pool

    torch.manual_seed(0)
    rows = torch.randn(50, 7, requires_grad=True)
    w = torch.rand(50) * 3 if weighted else None
    offsets = torch.arange(51)
    fast = pool(rows, offsets, mode, w)
    (g_fast,) = torch.autograd.grad(fast.pow(2).sum(), rows)
    ref = torch.nn.functional.embedding_bag(
        torch.arange(50), rows, offsets, mode=mode, per_sample_weights=w, include_last_offset=True
    )
    (g_ref,) = torch.autograd.grad(ref.pow(2).sum(), rows)
    assert torch.equal(fast, ref) and torch.equal(g_fast, g_ref)


def test_keyed_tensor_to_dict_backprops_through_one_split():
    """``to_dict()`` cuts ``values()`` with one split (as TorchRec's): one backward node for
    every key, where a narrow per key added a gradient of the whole ``values()`` per key."""
    values = torch.randn(4, 6, requires_grad=True)
    kt = et.KeyedTensor(["a", "b", "c"], [2, 3, 1], values * 1.0)
    parts = kt.to_dict()
    assert {type(v.grad_fn).__name__ for v in parts.values()} == {"SplitWithSizesBackward0"}
    assert torch.equal(parts["b"], values[:, 2:5]) and torch.equal(kt["c"], values[:, 5:])
    sum(p.sum() for p in parts.values()).backward()
    assert torch.equal(values.grad, torch.ones(4, 6))


def test_tables_a_collection_creates_start_from_rows_of_their_own() -> None:
    # TorchRec's ids are row indices 0..N-1: with one seed for every table, id 0 would start
    # with the same row in each table the collection creates.
    store = embstore.Store()
    et.EmbeddingBagCollection(
        store,
        [
            et.EmbeddingBagConfig(name="a", embedding_dim=4, feature_names=["fa"]),
            et.EmbeddingBagConfig(name="b", embedding_dim=4, feature_names=["fb"]),
            et.EmbeddingBagConfig(
                name="c", embedding_dim=4, feature_names=["fc"], table_args={"seed": 7}
            ),
        ],
    )
    a, b = (store.table(n).initial_values([0, 1]) for n in "ab")
    assert not np.array_equal(a, b)
    assert store.table("c").config.seed == 7
