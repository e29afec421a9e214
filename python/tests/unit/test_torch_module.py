"""``embstore.torch`` as a torch module: one step per table, validated bag offsets, state dicts,
copies, dtypes, nn.Embedding's arguments, learning-rate schedulers (issue 7).

Each test is named after the defect it pins down; ``test_torch_parity.py`` checks the numbers.
"""

from __future__ import annotations

import torch
from torch import nn

import embstore
import embstore.torch as et

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
