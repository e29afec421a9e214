"""Three ways a ported TorchRec loop went silently wrong, each refused or made right:

1. a store of one process trained by several processes of a ``torch.distributed`` job (DDP over
   a plain ``Store()``): every process trained its own copy of the table, without a word;
2. ``torch.amp.GradScaler``: ``scaler.step(EmbeddingOptimizer)`` failed, and ``step()`` applied
   the *scaled* gradients;
3. a session used for evaluation trained: zero gradients pushed by a loop without ``backward()``
   moved Adam rows and stepped the table.

The multi-process halves run under ``torchrun`` in ``integration/test_distributed.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import embstore
import embstore.torch as et
from embstore import errors

D = 4
IDS = torch.tensor([7, 2**40 + 1, 3, 7])


def make_store(optimizer=None, **kw) -> embstore.Store:
    store = embstore.Store(**kw)
    for name in ("t", "u"):
        store.create_table(
            name,
            D,
            optimizer=optimizer or embstore.SGD(lr=0.1),
            initializer=embstore.Uniform(-1, 1),
        )
    return store


def snapshot(table: embstore.Table) -> tuple[np.ndarray, np.ndarray, int]:
    chunks = list(table.export())
    ids = np.concatenate([c.ids for c in chunks]) if chunks else np.empty(0, np.uint64)
    order = np.argsort(ids)
    values = np.concatenate([c.values for c in chunks])[order] if chunks else np.empty((0, D))
    return ids[order], values, table.step


# -- 1. a store of one process under a multi-process job ------------------------------------


@pytest.fixture
def two_process_job(monkeypatch):
    """This process as one of two of a torchrun job (torchrun sets WORLD_SIZE; the job's
    process group need not be initialised for the guard to know)."""
    monkeypatch.setenv("WORLD_SIZE", "2")


def test_a_training_forward_over_a_store_of_one_process_is_refused_in_a_job(two_process_job):
    store = make_store()
    emb = et.Embedding(store.table("t"))
    with pytest.raises(errors.DistributedError) as e:
        emb(IDS)
    message = str(e.value)
    assert (
        "one of 2" in message and "DistributedStore(path)" in message and "per_process" in message
    )
    assert len(store.table("t")) == 0, "the refused forward stored rows"
    # Evaluation, and a forward without autograd, train nothing: allowed.
    emb.eval()
    assert emb(IDS).shape == (4, D)
    emb.train()
    with torch.no_grad():
        emb(IDS)


def test_a_session_push_over_a_store_of_one_process_is_refused_in_a_job(two_process_job):
    store = make_store()
    before = snapshot(store.table("t"))
    sess = store.session(["t"], prefetch=0)
    for b in sess.run([np.array([1, 2, 3])], lambda i: {"t": i}):
        b.embeddings("t").sum().backward()
        with pytest.raises(errors.DistributedError, match="DistributedStore"):
            b.push_grads()
    after = snapshot(store.table("t"))
    np.testing.assert_array_equal(before[1], after[1][: len(before[1])])
    assert after[2] == before[2] == 0, "the refused push stepped the table"


def test_a_store_opened_per_process_trains_in_a_job(two_process_job):
    store = make_store(per_process=True)
    emb = et.Embedding(store.table("t"))
    opt = et.EmbeddingOptimizer(emb)
    emb(IDS).sum().backward()
    assert opt.step() == 3
    sess = store.session(["u"], prefetch=0)
    for b in sess.run([np.array([1, 2])], lambda i: {"u": i}):
        b.embeddings("u").sum().backward()
        b.push_grads()
    assert store.table("u").step == 1


def test_per_process_and_distributed_are_exclusive(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="DistributedStore"):
        embstore.Store(tmp_path, distributed=True, per_process=True)
    with pytest.raises(errors.InvalidArgumentError, match="per_process must be a bool"):
        embstore.Store(per_process="yes")


def test_one_process_alone_trains_without_a_word(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    store = make_store()
    emb = et.Embedding(store.table("t"))
    emb(IDS).sum().backward()
    assert et.EmbeddingOptimizer(emb).step() == 3


# -- 2. torch.amp.GradScaler -----------------------------------------------------------------


class Model(nn.Module):
    def __init__(self, store: embstore.Store) -> None:
        super().__init__()
        self.emb = et.Embedding(store.table("t"))
        self.bag = et.EmbeddingBag(store.table("u"), mode="sum")
        self.dense = nn.Linear(2 * D, 1)
        with torch.no_grad():
            self.dense.weight.fill_(0.5)
            self.dense.bias.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.emb(ids), self.bag(ids.view(-1, 1))], dim=1)
        return self.dense(x).pow(2).sum()


def train_steps(
    optimizer, *, scale: float | None, steps: tuple[int, ...] = (0, 1, 2), nan_at: int = -1
):
    """Steps of Model over tables of ``optimizer`` (step ``i`` on ids ``IDS + i``); with
    ``scale``, under a GradScaler (its initial scale), the loss made NaN at step ``nan_at``.
    Returns the tables' snapshots, the dense weights and the scaler's final scale."""
    torch.manual_seed(0)
    store = make_store(optimizer)
    model = Model(store)
    sparse = et.EmbeddingOptimizer(model)
    dense = torch.optim.SGD(model.dense.parameters(), lr=0.01)
    scaler = None if scale is None else torch.amp.GradScaler("cpu", init_scale=scale)
    for step in steps:
        loss = model(IDS + step)
        if step == nan_at:
            loss = loss * float("nan")
        if scaler is None:
            loss.backward()
            dense.step()
            sparse.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(dense)
            scaler.step(sparse)
            scaler.update()
        dense.zero_grad()
        sparse.zero_grad()
    return (
        snapshot(store.table("t")),
        snapshot(store.table("u")),
        model.dense.weight.detach().clone(),
        None if scaler is None else scaler.get_scale(),
    )


@pytest.mark.parametrize(
    "optimizer",
    [embstore.SGD(lr=0.1), embstore.Adagrad(lr=0.1), embstore.Adam(lr=0.1)],
    ids=["sgd", "adagrad", "adam"],
)
def test_grad_scaler_steps_the_tables_with_unscaled_gradients(optimizer):
    plain = train_steps(optimizer, scale=None)
    scaled = train_steps(optimizer, scale=2.0**16)
    for a, b in zip(plain[:2], scaled[:2], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])  # a power-of-two scale: exactly equal
        assert a[2] == b[2] == 3
    torch.testing.assert_close(plain[2], scaled[2], rtol=0, atol=0)


def test_an_sgd_row_moves_by_the_learning_rate_not_by_the_scale():
    store = make_store(embstore.SGD(lr=0.1))
    emb = et.Embedding(store.table("t"))
    opt = et.EmbeddingOptimizer(emb)
    before = store.table("t").lookup([5]).copy()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(emb(torch.tensor([5])).sum()).backward()
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(store.table("t").lookup([5]), before - 0.1, rtol=1e-6)


def test_an_overflowed_step_applies_nothing_and_the_scale_backs_off():
    adam = embstore.Adam(lr=0.1)
    scaled = train_steps(adam, scale=2.0**16, nan_at=1)
    plain = train_steps(adam, scale=None, steps=(0, 2))  # the scaled run without step 1
    assert scaled[3] == 2.0**15, "the scaler did not back off"
    assert scaled[0][2] == scaled[1][2] == 2, "the overflowed step stepped a table"
    for a, b in zip(plain[:2], scaled[:2], strict=True):
        # Step 1's forward stored its new rows (as a forward of nn.Embedding's would read
        # them), but trained none: each is its initial row in the scaled run.
        common = np.isin(b[0], a[0])
        np.testing.assert_array_equal(a[1], b[1][common])
    torch.testing.assert_close(plain[2], scaled[2], rtol=0, atol=0)


def test_unscale_before_the_step_unscales_once():
    store = make_store(embstore.SGD(lr=0.1))
    emb = et.Embedding(store.table("t"))
    opt = et.EmbeddingOptimizer(emb)
    before = store.table("t").lookup([5]).copy()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(emb(torch.tensor([5])).sum()).backward()
    scaler.unscale_(opt)
    assert all(torch.equal(p.grad, torch.ones(1, D)) for g in opt.param_groups for p in g["params"])
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(store.table("t").lookup([5]), before - 0.1, rtol=1e-6)


def test_the_optimizer_state_dict_holds_no_pending_gradient():
    store = make_store()
    emb = et.Embedding(store.table("t"))
    opt = et.EmbeddingOptimizer(emb, lr=0.5)
    emb(IDS).sum().backward()
    assert len(opt.param_groups[0]["params"]) == 1
    saved = opt.state_dict()
    assert saved["param_groups"][0]["params"] == [] and saved["param_groups"][0]["lr"] == 0.5
    other = et.EmbeddingOptimizer(et.Embedding(store.table("t")))
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == 0.5
    opt.zero_grad()
    assert len(opt.param_groups[0]["params"]) == 0


def session_steps(optimizer, *, scale: float | None, nan_at: int | None = None):
    store = make_store(optimizer)
    sess = store.session(["t", "u"], prefetch=1)
    scaler = None if scale is None else torch.amp.GradScaler("cpu", init_scale=scale)
    data = [np.array([1, 2, 2, 9]) + i for i in range(3)]
    for n, b in enumerate(sess.run(data, lambda i: {"t": i, "u": i[::-1].copy()})):
        loss = (b.embeddings("t") * b.embeddings("u")).pow(2).sum()
        if n == nan_at:
            loss = loss * float("inf")
        if scaler is None:
            loss.backward()
            b.push_grads()
        else:
            scaler.scale(loss).backward()
            b.push_grads(scaler=scaler)
            scaler.update()
    return snapshot(store.table("t")), snapshot(store.table("u")), scaler


def test_a_session_push_with_a_scaler_equals_an_unscaled_one():
    plain = session_steps(embstore.Adam(lr=0.1), scale=None)
    scaled = session_steps(embstore.Adam(lr=0.1), scale=2.0**16)
    for a, b in zip(plain[:2], scaled[:2], strict=True):
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2] == b[2] == 3


def test_a_session_push_that_overflowed_applies_nothing_and_backs_off():
    full = session_steps(embstore.Adam(lr=0.1), scale=2.0**16, nan_at=2)
    short = session_steps(embstore.Adam(lr=0.1), scale=2.0**16, nan_at=None)
    assert full[2].get_scale() == 2.0**15
    assert full[0][2] == 2 and short[0][2] == 3
    # Rows of ids the last batch alone touched were never stepped in the overflowed run.
    only_last = np.setdiff1d(np.array([3, 4, 4, 11]), np.array([1, 2, 9, 2, 3, 10]))
    t = full[0]
    init = embstore.Store().create_table(
        "t", D, optimizer=embstore.Adam(lr=0.1), initializer=embstore.Uniform(-1, 1)
    )
    for i in only_last:
        np.testing.assert_array_equal(t[1][t[0] == i], init.lookup([i]))


# -- 3. evaluation with a session -----------------------------------------------------------


def test_a_push_without_backward_is_refused_and_moves_nothing():
    store = make_store(embstore.Adam(lr=0.1))
    sess = store.session(["t"], prefetch=0)
    for b in sess.run([np.array([1, 2, 3])] * 3, lambda i: {"t": i}):
        b.embeddings("t").sum().backward()
        b.push_grads()
    before = snapshot(store.table("t"))
    assert before[2] == 3
    eval_sess = store.session(["t"], prefetch=0, on_miss="zeros")
    for b in eval_sess.run([np.array([1, 2, 3])] * 3, lambda i: {"t": i}):
        with torch.no_grad():
            b.embeddings("t").sum()
        with pytest.raises(errors.InvalidArgumentError, match="no row of this batch has a grad"):
            b.push_grads()
    after = snapshot(store.table("t"))
    np.testing.assert_array_equal(before[1], after[1])
    assert after[2] == 3


def test_run_train_false_never_writes():
    store = make_store(embstore.Adam(lr=0.1))
    t = store.table("t")
    t.lookup([1, 2])  # two rows exist; 3 and 4 do not
    before = snapshot(t)
    sess = store.session(["t"], prefetch=2)
    seen = 0
    for b in sess.run([np.array([1, 2, 3, 4])] * 2, lambda i: {"t": i}, train=False):
        rows = b.embeddings("t")
        assert not rows.requires_grad
        np.testing.assert_array_equal(rows[2:].numpy(), np.zeros((2, D), np.float32))
        with pytest.raises(errors.InvalidArgumentError, match="train=False"):
            b.push_grads()
        seen += 1
    assert seen == 2
    after = snapshot(t)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert after[2] == 0
    # The same session trains afterwards.
    for b in sess.run([np.array([1, 2])], lambda i: {"t": i}):
        b.embeddings("t").sum().backward()
        b.push_grads()
    assert t.step == 1
    with pytest.raises(errors.InvalidArgumentError, match="train must be a bool"):
        sess.run([], lambda i: {"t": i}, train="no")


def test_a_table_unused_by_the_loss_is_not_stepped():
    store = make_store(embstore.Adam(lr=0.1))
    u = store.table("u")
    u.lookup([1, 2, 3])
    before = snapshot(u)
    sess = store.session(["t", "u"], prefetch=0)
    for b in sess.run([np.array([1, 2, 3])] * 2, lambda i: {"t": i, "u": i}):
        b.embeddings("t").sum().backward()  # "u" is read but not in the loss
        b.push_grads()
    after = snapshot(u)
    np.testing.assert_array_equal(before[1], after[1])
    assert after[2] == 0 and store.table("t").step == 2
