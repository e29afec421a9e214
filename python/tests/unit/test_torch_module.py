"""``embstore.torch`` as a torch module: one step per table, validated bag offsets, state dicts,
copies, dtypes, nn.Embedding's arguments, learning-rate schedulers (issue 7).

Each test is named after the defect it pins down; ``test_torch_parity.py`` checks the numbers.
"""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import embstore
import embstore.torch as et
from embstore import errors

D = 4
IDS = torch.tensor([7, 2**40 + 1, -3, 7])


def make_store(optimizer: embstore.config.Optimizer | None = None) -> embstore.Store:
    store = embstore.Store()
    store.create_table(
        "t", D, optimizer=optimizer or embstore.SGD(lr=0.1), initializer=embstore.Uniform(-1, 1)
    )
    return store


def test_two_handles_of_one_table_step_it_once() -> None:
    # store.table(name) returns a new handle per call; the optimizer must still take one Adam
    # step (t = 1) with both modules' gradients summed, as torch does for one nn.Embedding.
    store = make_store(embstore.Adam(lr=0.1))
    a, b = et.Embedding(store.table("t")), et.Embedding(store.table("t"))
    opt = et.EmbeddingOptimizer([a, b])
    table = store.table("t")
    ref = nn.Embedding(3, D, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(table.initial_values(IDS[:3]))
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    (a(IDS).sum() + 3 * b(IDS).sum()).backward()
    assert opt.step() == 3
    x = torch.tensor([0, 1, 2, 0])
    (ref(x).sum() + 3 * ref(x).sum()).backward()
    ref_opt.step()
    assert table.step == 1
    torch.testing.assert_close(table.lookup(IDS[:3]), ref.weight.detach())


BAD_OFFSETS = [
    # (input, offsets, per_sample_weights, include_last_offset, error)
    (IDS, torch.tensor([1, 2]), None, False, errors.InvalidArgumentError),  # offsets[0] != 0
    (IDS, torch.tensor([0, 3, 2]), None, False, errors.InvalidArgumentError),  # decreasing
    (IDS, torch.tensor([0, 5]), None, False, errors.InvalidArgumentError),  # past the end
    (IDS, torch.tensor([0, 2]), None, True, errors.InvalidArgumentError),  # last != N
    (IDS, torch.tensor([0, 2, 5]), None, True, errors.InvalidArgumentError),
    (IDS, torch.tensor([], dtype=torch.int64), None, False, errors.InvalidArgumentError),
    (IDS, torch.tensor([], dtype=torch.int64), None, True, errors.ShapeError),
    (IDS, torch.tensor([0.0, 2.0]), None, False, errors.DTypeError),
    (IDS, [0, 2], None, False, errors.DTypeError),
    (IDS, torch.tensor([0, 2]), torch.ones(4, dtype=torch.int64), False, errors.DTypeError),
]
# Refused before this fix too; kept so that they stay refused before the lookup.
BAD_SHAPES = [
    (IDS, torch.tensor([[0, 2]]), None, False, errors.ShapeError),
    (IDS, None, None, False, errors.ShapeError),
    (IDS.reshape(2, 2), torch.tensor([0, 2]), None, False, errors.ShapeError),
    (IDS.reshape(1, 1, 4), None, None, False, errors.ShapeError),
    (IDS.float(), torch.tensor([0, 2]), None, False, errors.DTypeError),
    (IDS, torch.tensor([0, 2]), torch.ones(3), False, errors.ShapeError),
]


def _rejected_bag_call_changes_nothing(input, offsets, psw, last, error, mode="sum") -> None:
    table = make_store().table("t")
    table.lookup(IDS[:1])  # one row already there
    before = table.lookup(IDS[:1])
    bag = et.EmbeddingBag(table, mode=mode, include_last_offset=last)
    with pytest.raises(error):
        bag(input, offsets, per_sample_weights=psw)
    assert len(table) == 1
    torch.testing.assert_close(table.lookup(IDS[:1], on_miss="error"), before)


@pytest.mark.parametrize(("input", "offsets", "psw", "last", "error"), BAD_OFFSETS)
def test_bad_bag_offsets_store_no_row(input, offsets, psw, last, error) -> None:
    _rejected_bag_call_changes_nothing(input, offsets, psw, last, error)


@pytest.mark.parametrize(("input", "offsets", "psw", "last", "error"), BAD_SHAPES)
def test_bad_bag_shapes_store_no_row(input, offsets, psw, last, error) -> None:
    _rejected_bag_call_changes_nothing(input, offsets, psw, last, error)
    psw = torch.ones(4)  # weights need mode="sum"
    args = (IDS, torch.tensor([0, 2]), psw, False, errors.InvalidArgumentError, "mean")
    _rejected_bag_call_changes_nothing(*args)


def test_bag_accepts_what_nn_embedding_bag_accepts() -> None:
    # int32 offsets, include_last_offset in CSR form, empty bags, float64 weights, no bag at all.
    table = make_store().table("t")
    raw = torch.tensor([11, 12, 13, 14])
    ref = nn.EmbeddingBag(4, D, mode="sum", include_last_offset=True)
    with torch.no_grad():
        ref.weight.copy_(table.initial_values(raw))
    bag = et.EmbeddingBag(table, mode="sum", include_last_offset=True)
    offsets = torch.tensor([0, 0, 3, 4], dtype=torch.int32)
    psw = torch.rand(4, dtype=torch.float64)
    torch.testing.assert_close(
        bag(raw, offsets, psw), ref(torch.arange(4), offsets.long(), psw.float())
    )
    assert bag(raw[:0], torch.tensor([0])).shape == (0, D)
    plain = et.EmbeddingBag(table, mode="mean")
    assert plain(raw[:0], torch.tensor([], dtype=torch.int64)).shape == (0, D)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_model_half_returns_model_dtype_and_float32_grads(dtype: torch.dtype) -> None:
    table = make_store(embstore.SGD(lr=0.5)).table("t")
    before = table.lookup(IDS)
    model = nn.ModuleDict(
        {"emb": et.Embedding(table), "bag": et.EmbeddingBag(table), "mlp": nn.Linear(D, 1)}
    ).to(dtype)
    opt = et.EmbeddingOptimizer(model)
    out = model["emb"](IDS)
    bag = model["bag"](IDS, torch.tensor([0, 2]))
    assert out.dtype == dtype and bag.dtype == dtype
    assert model["mlp"](out).dtype == dtype  # the model's next layer takes it
    out.sum().backward()
    assert all(g.dtype == torch.float32 for _, g in model["emb"]._pending)
    opt.step()
    # one SGD step of lr 0.5 with gradient 1 per lookup (id 7 twice); exact in float32
    want = before - 0.5 * torch.tensor([2.0, 1.0, 1.0, 2.0]).unsqueeze(1)
    torch.testing.assert_close(table.lookup(IDS), want)
    model.float()
    assert model["emb"](IDS).dtype == torch.float32
    half = et.Embedding(table, dtype=torch.float16)  # as nn.Embedding(..., dtype=)
    assert half(IDS).dtype == torch.float16
    with pytest.raises(errors.DTypeError):
        et.Embedding(table, dtype=torch.int64)


NN_ARGS = [
    ("padding_idx", 0),
    ("max_norm", 1.0),
    ("norm_type", 1.0),
    ("scale_grad_by_freq", True),
    ("_weight", torch.zeros(3, D)),
    ("_freeze", True),
    ("sparse", "yes"),
]


@pytest.mark.parametrize("cls", [et.Embedding, et.EmbeddingBag])
@pytest.mark.parametrize(("name", "value"), NN_ARGS, ids=[a for a, _ in NN_ARGS])
def test_nn_embedding_arguments_name_what_is_not_supported(cls, name: str, value) -> None:
    table = make_store().table("t")
    with pytest.raises(errors.InvalidArgumentError) as e:
        cls(table, **{name: value})
    assert str(e.value).startswith(f"{name} is not supported by embstore.torch.{cls.__name__}: ")


@pytest.mark.parametrize("cls", [et.Embedding, et.EmbeddingBag])
def test_num_embeddings_is_a_capacity_hint(cls) -> None:
    # TorchRec's configs always give num_embeddings: any positive int is taken as a hint
    # (ids past it still get rows); anything else is refused, naming the argument.
    table = make_store().table("t")
    module = cls(table, num_embeddings=10)
    ids = torch.tensor([[5, 1 << 40]])
    assert module(ids).shape[0] == 1
    assert len(table) == 2
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(errors.InvalidArgumentError, match="num_embeddings must be a positive"):
            cls(table, num_embeddings=bad)


@pytest.mark.parametrize("cls", [et.Embedding, et.EmbeddingBag])
def test_a_meta_device_module_is_not_yet_materialised(cls) -> None:
    # device="meta" (as TorchRec builds models before sharding them): nothing happens to the
    # table; ids on the meta device are refused with what to do; to_empty() materialises it.
    store = embstore.Store()
    table = store.create_table("t", D)
    module = cls(table, device="meta", num_embeddings=100)
    assert len(table) == 0
    with pytest.raises(errors.InvalidArgumentError, match=r"meta device.*to_empty"):
        module(torch.zeros((1, 2), dtype=torch.int64, device="meta"))
    assert len(table) == 0
    module = module.to_empty(device="cpu")
    out = module(torch.tensor([[1, 2]]))
    assert out.device.type == "cpu" and out.dtype == torch.float32
    assert len(table) == 2


@pytest.mark.parametrize("cls", [et.Embedding, et.EmbeddingBag])
def test_nn_embedding_arguments_with_harmless_values_are_accepted(cls) -> None:
    table = make_store().table("t")
    harmless = {
        "num_embeddings": None,
        "embedding_dim": D,
        "padding_idx": None,
        "max_norm": None,
        "norm_type": 2,
        "scale_grad_by_freq": False,
        "sparse": True,
        "_weight": None,
        "_freeze": False,
        "device": "cpu",
        "dtype": torch.float32,
    }
    cls(table, **harmless)
    cls(table, sparse=False)
    with pytest.raises(errors.ShapeError, match="embedding_dim mismatch for table 't'"):
        cls(table, embedding_dim=D + 1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'paddingidx'"):
        cls(table, paddingidx=0)


OPTIMIZERS = [
    embstore.SGD(lr=0.1),
    embstore.Adagrad(lr=0.1),
    embstore.RowWiseAdagrad(lr=0.1),
    embstore.Adam(lr=0.1),
    embstore.FTRL(lr=0.1, l1=0.01),
]


class Tower(nn.Module):
    """Two tables, one of them shared by two modules, and a dense layer."""

    def __init__(self, store: embstore.Store):
        super().__init__()
        self.user = et.Embedding(store.table("t"))
        self.user_again = et.Embedding(store.table("t"))  # shares table 't'
        self.genres = et.EmbeddingBag(store.table("g"), mode="sum")
        self.mlp = nn.Linear(D, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.user(ids) + self.user_again(ids.flip(0)) + self.genres(ids.reshape(2, 2)).sum(0)
        return self.mlp(x).sum()


def tower_store(optimizer: embstore.config.Optimizer) -> embstore.Store:
    store = make_store(optimizer)
    store.create_table("g", D, optimizer=optimizer)
    return store


def train(model: nn.Module, steps: int, seed: int) -> None:
    opt = et.EmbeddingOptimizer(model)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 6, (4,), generator=gen) * 1_000_003
        model(ids).backward()
        opt.step()
        opt.zero_grad()


def rows(table: embstore.Table) -> dict[str, np.ndarray]:
    """Every exported row array, sorted by id."""
    chunks = list(table.export())
    keys = ("ids", "values", "state", "versions", "replicas", "update_counts", "last_update_ms")
    out = {k: np.concatenate([getattr(c, k) for c in chunks]) for k in keys}
    order = np.argsort(out["ids"])
    return {k: v[order] for k, v in out.items()}


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_state_dict_carries_rows_state_metadata_and_step(tmp_path, optimizer) -> None:
    store = tower_store(optimizer)
    model = Tower(store)
    train(model, 3, seed=0)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    saved = {name: rows(store.table(name)) for name in ("t", "g")}
    steps = {name: store.table(name).step for name in ("t", "g")}

    fresh_store = tower_store(optimizer)
    fresh_store.table("t").lookup([123456789])  # a row the checkpoint does not hold
    fresh = Tower(fresh_store)
    fresh.load_state_dict(torch.load(path))  # weights_only=True: tensors, ints, strings
    for name in ("t", "g"):
        got = rows(fresh_store.table(name))
        for key, want in saved[name].items():
            np.testing.assert_array_equal(got[key], want, err_msg=f"{name}.{key}")
        assert fresh_store.table(name).step == steps[name]
    # Training goes on identically (Adam's t and FTRL's accumulators came along).
    train(model, 2, seed=1)
    train(fresh, 2, seed=1)
    for name in ("t", "g"):
        a, b = rows(store.table(name)), rows(fresh_store.table(name))
        np.testing.assert_array_equal(a["ids"], b["ids"])
        np.testing.assert_allclose(a["values"], b["values"], rtol=0, atol=0)
        np.testing.assert_allclose(a["state"], b["state"], rtol=0, atol=0)


def test_state_dict_of_another_table_is_refused_and_changes_nothing() -> None:
    store = make_store(embstore.Adam(lr=0.1))
    emb = et.Embedding(store.table("t"))
    emb(IDS).sum().backward()
    et.EmbeddingOptimizer(emb).step()
    state = emb.state_dict()

    def target(optimizer, dim=D) -> tuple[embstore.Table, et.Embedding]:
        table = embstore.Store().create_table("t", dim, optimizer=optimizer)
        table.lookup([1, 2])
        return table, et.Embedding(table)

    cases = [
        (target(embstore.Adam(), dim=D + 1), errors.ShapeError, "embedding_dim mismatch"),
        (target(embstore.Adagrad()), errors.ShapeError, "optimizer state width mismatch"),
        (target(embstore.FTRL()), errors.InvalidArgumentError, "optimizer mismatch"),
    ]
    bad_values = {**state["_extra_state"], "values": state["_extra_state"]["values"] * np.nan}
    cases.append((target(embstore.Adam()), errors.NonFiniteError, "not finite"))
    for i, ((table, module), error, match) in enumerate(cases):
        before = rows(table)
        sd = {"_extra_state": bad_values} if error is errors.NonFiniteError else state
        with pytest.raises(error, match=match):
            module.load_state_dict(sd)
        after = rows(table)
        for key in before:
            np.testing.assert_array_equal(after[key], before[key], err_msg=f"case {i}")
        assert table.step == 0


def test_state_dict_without_rows_checks_the_table_and_leaves_it_alone() -> None:
    store = make_store(embstore.Adagrad())
    emb = et.Embedding(store.table("t"), rows_in_state_dict=False)
    emb(IDS)
    state = emb.state_dict()
    assert set(state["_extra_state"]) == {
        "format", "table", "embedding_dim", "optimizer", "state_dim", "step", "rows"
    }  # fmt: skip
    other = make_store(embstore.Adagrad()).table("t")
    other.lookup([1])
    et.Embedding(other).load_state_dict(state)
    assert len(other) == 1
    with pytest.raises(errors.ShapeError):
        et.Embedding(embstore.Store().create_table("t", D + 1)).load_state_dict(state)


@pytest.mark.parametrize("how", [copy.deepcopy, copy.copy, pickle.dumps, torch.save])
def test_copy_or_pickle_says_what_to_do(how) -> None:
    model = nn.Sequential(et.Embedding(make_store().table("t")), nn.Linear(D, 1))
    # copy.copy is shallow: a copied Sequential shares the module; copying the module refuses
    obj = model[0] if how is copy.copy else model
    args = (obj, io.BytesIO()) if how is torch.save else (obj,)
    with pytest.raises(errors.NotCopyableError, match="table 't' cannot be pickled") as e:
        how(*args)
    assert isinstance(e.value, TypeError)  # what pickle and copy raise for other objects
    assert "state_dict()" in str(e.value)
    copy.deepcopy(model.state_dict())  # the way to take a snapshot


SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1 / (k + 1)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
}


def two_sgd_tables() -> tuple[embstore.Store, nn.ModuleDict]:
    store = make_store(embstore.SGD(lr=0.1))
    store.create_table("g", D, optimizer=embstore.SGD(lr=0.4))
    model = nn.ModuleDict({"t": et.Embedding(store.table("t")), "g": et.Embedding(store["g"])})
    return store, model


@pytest.mark.parametrize("make_scheduler", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_lr_scheduler_schedules_each_tables_lr(make_scheduler) -> None:
    # One param group per table, starting at the table's own lr; the scheduled lr is what
    # apply_gradients gets. SGD with gradient 1 moves a row by exactly -lr.
    store, model = two_sgd_tables()
    opt = et.EmbeddingOptimizer(model)
    assert [(g["table"], g["lr"]) for g in opt.param_groups] == [("t", 0.1), ("g", 0.4)]
    sched = make_scheduler(opt)
    ref_params = [nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))]
    ref = torch.optim.SGD(
        [{"params": [p], "lr": lr} for p, lr in zip(ref_params, (0.1, 0.4), strict=True)]
    )
    ref_sched = make_scheduler(ref)
    x = IDS[:1]
    for _ in range(5):
        before = {n: store.table(n).lookup(x) for n in ("t", "g")}
        (model["t"](x).sum() + model["g"](x).sum()).backward()
        opt.step()
        opt.zero_grad()
        for name, group in zip(("t", "g"), ref.param_groups, strict=True):
            want = before[name] - torch.tensor(group["lr"], dtype=torch.float32)
            torch.testing.assert_close(store.table(name).lookup(x), want, rtol=0, atol=1e-6)
        ref.step()
        sched.step()
        ref_sched.step()
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [g["lr"] for g in ref.param_groups]
        )


def test_optimizer_step_closure_and_state_dict_follow_torch(tmp_path) -> None:
    store, model = two_sgd_tables()
    opt = et.EmbeddingOptimizer(model, lr=0.2)  # one lr for every table
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert opt.lr == 0.2

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model["t"](IDS).sum()
        loss.backward()
        return loss

    with torch.no_grad():  # the closure still gets gradients, as with torch.optim
        loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    assert store.table("t").step == 1
    sched.step()
    sched.step()
    path = tmp_path / "opt.pt"
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, path)

    _, model2 = two_sgd_tables()
    opt2 = et.EmbeddingOptimizer(model2, lr=0.2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    saved = torch.load(path)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert [g["lr"] for g in opt2.param_groups] == [0.05, 0.05]
    sched2.step()
    assert [g["lr"] for g in opt2.param_groups] == [0.025, 0.025]
    opt2.lr = None  # back to each table's own lr
    assert [g["lr"] for g in opt2.param_groups] == [0.1, 0.4] and opt2.lr is None

    only_t = et.EmbeddingOptimizer(model2["t"])
    with pytest.raises(errors.InvalidArgumentError, match="tables"):
        only_t.load_state_dict(saved["opt"])
    with pytest.raises(errors.InvalidArgumentError):
        only_t.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    with pytest.raises(errors.InvalidArgumentError):
        et.EmbeddingOptimizer(model2, lr=-1.0)
    with pytest.raises(errors.NotCopyableError):
        copy.deepcopy(opt2)


def test_training_forwards_pin_their_rows_until_zero_grad(tmp_path) -> None:
    # With a memory budget, a training forward pins the rows it looked up, so eviction cannot
    # drop the step's working set before EmbeddingOptimizer.step(); zero_grad() releases them.
    store = embstore.Store(tmp_path / "s", memory_budget_bytes=256 << 10)
    table = store.create_table("t", D, optimizer=embstore.SGD(lr=0.1))
    emb = et.Embedding(table)
    opt = et.EmbeddingOptimizer(emb)
    ids = torch.arange(1500)
    emb(ids).sum().backward()
    # The 1,500 rows are pinned: pinning as many again passes 60 % of the budget.
    with pytest.raises(errors.CapacityError):
        table.pin(np.arange(10_000, 11_500))
    opt.step()
    opt.zero_grad()
    table.pin(np.arange(10_000, 11_500))  # released: fits now
    table.unpin(np.arange(10_000, 11_500))
    # Eval and no-grad forwards pin nothing.
    emb.eval()
    emb(ids)
    table.pin(np.arange(10_000, 11_500))
