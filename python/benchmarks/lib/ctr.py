"""The CTR model's dense half, shared by the demo (``examples/movielens_ctr.py``'s ``DLRM``) and
``bench_cache_accuracy.py``'s ``CTR``: DLRM's dot interaction — every pair of field vectors'
dot product, concatenated with the vectors — into an MLP that gives one logit.

Shape letters: ``B`` batch, ``F`` fields, ``D`` embedding_dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class DotInteraction(nn.Module):
    """Base of a CTR model whose embeddings come first: a subclass builds its embeddings, then
    calls :meth:`build_head` (so the MLP's weights are drawn after the embeddings', and its
    ``state_dict`` keys stay ``pair_i``, ``pair_j``, ``mlp.*``), and feeds the stacked field
    vectors to :meth:`dense`."""

    def build_head(self, fields: int, dim: int, hidden: Sequence[int]) -> None:
        """The pair indices (``F * (F - 1) / 2`` pairs) and the MLP
        ``F * D + pairs -> hidden... -> 1`` with ReLUs between."""
        pair_i, pair_j = torch.triu_indices(fields, fields, offset=1)
        self.register_buffer("pair_i", pair_i)
        self.register_buffer("pair_j", pair_j)
        layers: list[nn.Module] = []
        width = fields * dim + len(pair_i)
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def dense(self, e: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from the field vectors ``[B, F, D]``."""
        dots = torch.bmm(e, e.transpose(1, 2))[:, self.pair_i, self.pair_j]  # [B, F(F-1)/2]
        return self.mlp(torch.cat([e.flatten(1), dots], dim=1)).squeeze(1)
