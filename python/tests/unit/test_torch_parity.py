"""Numerical parity: rows trained through embstore match torch to 1e-5.

Each test trains the same rows twice over several steps with duplicate ids — once through
``embstore.torch`` (the table's server-side optimizer) and once with ``nn.Embedding`` /
``nn.EmbeddingBag`` and the matching torch optimizer — from the same initial values, and
compares every row after every step. Row-wise Adagrad and FTRL have no torch optimizer; they
are checked against their formulas written out in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import embstore
import embstore.torch as et

V, D, STEPS, SEED = 12, 6, 6, 1234
# Raw feature ids: large, sparse, one negative (an int64 id is any 64-bit pattern).
RAW = np.array([(i * 1_000_003) << 20 for i in range(V - 1)] + [-5], dtype=np.int64)


def make_table(optimizer: embstore.config.Optimizer) -> embstore.Table:
    store = embstore.Store()
    return store.create_table(
        "t", D, optimizer=optimizer, initializer=embstore.Uniform(-0.5, 0.5), seed=SEED
    )


def batches(rng: np.random.Generator, cover_all: bool = False) -> list[np.ndarray]:
    """Index batches into 0..V with many duplicates."""
    out = []
    for _ in range(STEPS):
        idx = rng.integers(0, V // 2 + 2, size=20)  # a hot half: duplicates for sure
        if cover_all:
            idx = np.concatenate([np.arange(V), idx])
        out.append(idx)
    return out


def reference(table: embstore.Table, sparse: bool = True) -> nn.Embedding:
    ref = nn.Embedding(V, D, sparse=sparse)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(table.initial_values(RAW)))
    return ref


def compare(table: embstore.Table, ref: nn.Embedding, step: int) -> None:
    got = table.lookup(RAW, on_miss="zeros")
    want = ref.weight.detach().numpy()
    seen = table.contains(RAW)
    # Ids never looked up have no row in the table; torch still holds their initial value.
    np.testing.assert_allclose(got[seen], want[seen], atol=1e-5, rtol=1e-5, err_msg=f"step {step}")


CASES = [
    (embstore.SGD(lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3), True),
    (embstore.Adagrad(lr=0.2), lambda p: torch.optim.Adagrad(p, lr=0.2), True),
    (
        embstore.Adagrad(lr=0.2, eps=1e-6, initial_accumulator_value=0.1),
        lambda p: torch.optim.Adagrad(p, lr=0.2, eps=1e-6, initial_accumulator_value=0.1),
        True,
    ),
    (embstore.Adam(lr=0.05), lambda p: torch.optim.SparseAdam(p, lr=0.05), True),
    (
        embstore.Adam(lr=0.05, betas=(0.8, 0.99)),
        lambda p: torch.optim.SparseAdam(p, lr=0.05, betas=(0.8, 0.99)),
        True,
    ),
]


@pytest.mark.parametrize(("ours", "theirs", "sparse"), CASES, ids=lambda c: repr(c)[:40])
def test_embedding_matches_torch(ours, theirs, sparse) -> None:
    rng = np.random.default_rng(SEED)
    table = make_table(ours)
    emb, ref = et.Embedding(table), reference(table, sparse)
    opt, ref_opt = et.EmbeddingOptimizer(emb), theirs(ref.parameters())
    raw = torch.from_numpy(RAW)
    for step, idx in enumerate(batches(rng)):
        target = torch.from_numpy(rng.standard_normal((len(idx), D)).astype(np.float32))
        ids = torch.from_numpy(idx)
        loss = ((emb(raw[ids]) - target) ** 2 * torch.arange(1.0, D + 1)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = ((ref(ids) - target) ** 2 * torch.arange(1.0, D + 1)).sum()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-4)
        compare(table, ref, step)


def test_dense_adam_matches_when_every_row_is_in_every_batch() -> None:
    # Dense torch.optim.Adam also moves rows without a gradient (their momentum decays); the
    # two agree exactly when every row has a gradient at every step.
    rng = np.random.default_rng(SEED)
    table = make_table(embstore.Adam(lr=0.05))
    emb, ref = et.Embedding(table), reference(table, sparse=False)
    opt, ref_opt = et.EmbeddingOptimizer(emb), torch.optim.Adam(ref.parameters(), lr=0.05)
    raw = torch.from_numpy(RAW)
    for step, idx in enumerate(batches(rng, cover_all=True)):
        ids = torch.from_numpy(idx)
        (emb(raw[ids]).sin().sum()).backward()
        opt.step()
        opt.zero_grad()
        (ref(ids).sin().sum()).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        compare(table, ref, step)


BAG_CASES = [
    ("sum", CASES[1]),
    ("mean", CASES[1]),
    ("sum-weighted", CASES[1]),
    ("sum", CASES[3]),
    ("mean", CASES[3]),
    # torch has no sparse gradient for max; dense Adagrad leaves rows without a gradient as
    # they are, so it is the same update.
    ("max", CASES[1]),
]


@pytest.mark.parametrize(("mode", "ours_theirs"), BAG_CASES, ids=lambda c: str(c)[:20])
def test_embedding_bag_matches_torch(mode: str, ours_theirs) -> None:
    ours, theirs, _ = ours_theirs
    weighted = mode == "sum-weighted"
    mode = "sum" if weighted else mode
    rng = np.random.default_rng(SEED + 1)
    table = make_table(ours)
    bag = et.EmbeddingBag(table, mode=mode)
    ref_bag = nn.EmbeddingBag(V, D, mode=mode, sparse=mode != "max")
    with torch.no_grad():
        ref_bag.weight.copy_(torch.from_numpy(table.initial_values(RAW)))
    opt, ref_opt = et.EmbeddingOptimizer(bag), theirs(ref_bag.parameters())
    raw = torch.from_numpy(RAW)
    for step, idx in enumerate(batches(rng)):
        ids = torch.from_numpy(idx)
        offsets = torch.tensor([0, 3, 3, 9, 14])  # an empty bag included
        psw = torch.from_numpy(rng.random(len(idx)).astype(np.float32)) if weighted else None
        target = torch.from_numpy(rng.standard_normal((5, D)).astype(np.float32))
        out = bag(raw[ids], offsets, per_sample_weights=psw)
        ref_out = ref_bag(ids, offsets, per_sample_weights=psw)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        ((out - target) ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
        ((ref_out - target) ** 2).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        compare(table, ref_bag, step)


def test_embedding_bag_2d_input_matches_offsets_form() -> None:
    table = make_table(embstore.SGD(lr=0.1))
    bag = et.EmbeddingBag(table, mode="mean")
    x = torch.from_numpy(RAW[:8].reshape(2, 4))
    torch.testing.assert_close(bag(x), bag(x.reshape(-1), torch.tensor([0, 4])))


def _sums(idx: np.ndarray, grads: np.ndarray) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for i, g in zip(idx.tolist(), grads, strict=True):
        out[i] = out.get(i, 0) + g
    return out


def _train_numpy_formula(opt, step_fn) -> None:
    """Trains through embstore with random gradients and checks against ``step_fn(w, s, g)``."""
    rng = np.random.default_rng(SEED + 2)
    table = make_table(opt)
    w = table.initial_values(RAW).astype(np.float64)
    state: dict[int, object] = {}
    for step, idx in enumerate(batches(rng)):
        grads = rng.standard_normal((len(idx), D)).astype(np.float32)
        table.apply_gradients(RAW[idx], grads)
        for i, g in _sums(idx, grads).items():
            w[i], state[i] = step_fn(w[i], state.get(i), g.astype(np.float64))
        seen = table.contains(RAW)
        np.testing.assert_allclose(
            table.lookup(RAW, "zeros")[seen], w[seen], atol=1e-5, rtol=1e-5, err_msg=f"{step}"
        )


def test_rowwise_adagrad_matches_its_formula() -> None:
    lr, eps = 0.2, 1e-8

    def step(w, s, g):
        s = (0.0 if s is None else s) + np.mean(g * g)
        return w - lr * g / (np.sqrt(s) + eps), s

    _train_numpy_formula(embstore.RowWiseAdagrad(lr=lr, eps=eps), step)


def test_ftrl_matches_its_formula() -> None:
    lr, beta, l1, l2 = 0.3, 1.0, 0.05, 0.1

    def step(w, s, g):
        z, n = (np.zeros(D), np.zeros(D)) if s is None else s
        n_new = n + g * g
        z = z + g - (np.sqrt(n_new) - np.sqrt(n)) / lr * w
        w = np.where(
            np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / ((beta + np.sqrt(n_new)) / lr + l2)
        )
        return w, (z, n_new)

    _train_numpy_formula(embstore.FTRL(lr=lr, beta=beta, l1=l1, l2=l2), step)


def test_gradients_wait_for_step_and_zero_grad_drops_them() -> None:
    table = make_table(embstore.SGD(lr=1.0))
    emb = et.Embedding(table)
    opt = et.EmbeddingOptimizer(emb)
    ids = torch.from_numpy(RAW[:3])
    before = table.lookup(RAW[:3])
    emb(ids).sum().backward()
    np.testing.assert_array_equal(table.lookup(RAW[:3]), before)  # nothing until step()
    emb(ids).sum().backward()  # accumulate a second pass
    assert opt.step() == 3
    np.testing.assert_allclose(table.lookup(RAW[:3]), before - 2.0, atol=1e-6)
    # As in torch, gradients stay until zero_grad(): a second step uses them again.
    assert opt.step() == 3
    np.testing.assert_allclose(table.lookup(RAW[:3]), before - 4.0, atol=1e-6)
    opt.zero_grad()
    assert opt.step() == 0
    np.testing.assert_allclose(table.lookup(RAW[:3]), before - 4.0, atol=1e-6)


def test_eval_mode_stores_nothing_and_no_grad_needs_no_step() -> None:
    table = make_table(embstore.SGD())
    emb = et.Embedding(table).eval()
    out = emb(torch.from_numpy(RAW[:4]))
    assert len(table) == 0 and not out.requires_grad
    assert torch.count_nonzero(out) == 0
    emb.train()
    with torch.no_grad():
        emb(torch.from_numpy(RAW[:4]))
    assert len(table) == 4 and not emb._pending


def test_shared_table_sums_both_modules_into_one_step() -> None:
    # Two modules over one table: one Adagrad step with the summed gradient, as torch does for
    # one nn.Embedding used twice.
    table = make_table(embstore.Adagrad(lr=0.5))
    a, b = et.Embedding(table), et.Embedding(table)
    opt = et.EmbeddingOptimizer([a, b])
    ref = reference(table)
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=0.5)
    x = torch.tensor([0, 1, 1])
    (a(torch.from_numpy(RAW)[x]).sum() + 2 * b(torch.from_numpy(RAW)[x]).sum()).backward()
    opt.step()
    opt.zero_grad()
    (ref(x).sum() + 2 * ref(x).sum()).backward()
    ref_opt.step()
    compare(table, ref, 0)


def test_ids_are_copied_for_backward() -> None:
    # Reusing the input tensor's memory before step() must not redirect the gradient.
    table = make_table(embstore.SGD(lr=1.0))
    emb = et.Embedding(table)
    opt = et.EmbeddingOptimizer([emb, emb])  # listed twice: still one step
    x = torch.from_numpy(RAW[:2].copy())
    before = table.lookup(RAW[:4])
    emb(x).sum().backward()
    x.copy_(torch.from_numpy(RAW[2:4]))
    assert opt.step() == 2
    after = table.lookup(RAW[:4])
    np.testing.assert_allclose(after[:2], before[:2] - 1.0, atol=1e-6)
    np.testing.assert_array_equal(after[2:], before[2:])


def test_embedding_bag_2d_ignores_include_last_offset() -> None:
    table = make_table(embstore.SGD())
    bag = et.EmbeddingBag(table, mode="sum", include_last_offset=True)
    ref = nn.EmbeddingBag(V, D, mode="sum", include_last_offset=True)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(table.initial_values(RAW)))
    x = torch.tensor([[1, 2], [3, 4]])
    torch.testing.assert_close(bag(torch.from_numpy(RAW)[x]), ref(x))
