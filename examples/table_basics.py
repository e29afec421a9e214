"""Embedding tables from numpy and PyTorch: create, look up, train, save, load.

Run: ``.venv/bin/python examples/table_basics.py`` (after ``make develop``).
"""

import pathlib
import tempfile

import numpy as np
import torch
from torch import nn

import embstore
import embstore.torch as et

store = embstore.Store()
user = store.create_table(
    "user",
    embedding_dim=8,
    optimizer=embstore.Adagrad(lr=0.05),
    initializer=embstore.Normal(std=0.01),
)

# Raw 64-bit feature ids: no vocabulary to build. New ids get their initial row.
ids = np.array([3, 2**40 + 7, -12, 3])
rows = user.lookup(ids)  # float32 [B, D] = [4, 8]
print("rows", rows.shape, "stored", len(user))

# Server-side optimizer step: duplicate ids (3 here) are summed first.
user.apply_gradients(ids, np.ones_like(rows))
print("after one Adagrad step:", user.lookup([3])[0, :3])

# Serving: unknown ids come back as zeros and are not stored.
values, found = user.lookup([3, 999], on_miss="zeros", return_found=True)
print("found", found)

# PyTorch: the table behind an nn.EmbeddingBag-like module, trained with the rest of a model.
genre = store.create_table("genre", embedding_dim=8, optimizer=embstore.Adam(lr=0.01))
bag = et.EmbeddingBag(genre, mode="mean")
head = nn.Linear(8, 1)
dense_opt = torch.optim.Adam(head.parameters(), lr=0.01)
sparse_opt = et.EmbeddingOptimizer([bag])
x, offsets = torch.tensor([10, 11, 12, 10, 13]), torch.tensor([0, 2])
y = torch.tensor([[1.0], [0.0]])
for _ in range(20):
    loss = nn.functional.binary_cross_entropy_with_logits(head(bag(x, offsets)), y)
    loss.backward()
    dense_opt.step()
    sparse_opt.step()  # hands the rows' gradients to the table's own optimizer
    dense_opt.zero_grad()
    sparse_opt.zero_grad()
print(f"loss {loss.item():.4f}, genre rows {len(genre)}, step {genre.step}")

# Save one table to a file and load it back into a new table.
with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "user.embt"
    user.save(path)
    copy = store.load_table(path, name="user_copy")
    assert np.array_equal(copy.lookup(ids, on_miss="error"), user.lookup(ids, on_miss="error"))
print(user.stats())
