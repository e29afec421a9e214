"""Inference-side modules: rows read at serving time, never trained.

:class:`RemoteEmbedding` reads rows from batch-query servers (``embstore serve``), every row of a
forward pass at one table version; :class:`CachedEmbeddingBagCollection` reads them through an
:class:`~embstore.InferenceCache` and pools bags.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from embstore.errors import InvalidArgumentError, NotCopyableError
from embstore.torch.sparse import check_input


class RemoteEmbedding(nn.Module):
    """An inference-side ``nn.Embedding`` whose rows live on batch-query servers
    (``embstore serve``): ``forward(input)`` (int64 ids of any shape ``[*]``) returns
    ``[*, D]`` rows, every one read at the same table version; ids without a row give zeros.
    It has no parameters and trains nothing (the servers' tables are read-only); the output is
    on ``input``'s device, with the module's ``dtype`` (float32 unless given).

    Args:
        client: an :func:`embstore.connect` client.
        table: the table's name on the servers.
        dtype: the output dtype (default float32).

    ``last_version`` is the table version of the last forward pass."""

    def __init__(self, client: Any, table: str, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not isinstance(table, str) or not table:
            raise InvalidArgumentError(f"table must be a non-empty str, got {table!r}")
        if not hasattr(client, "lookup"):
            raise InvalidArgumentError(
                f"client must come from embstore.connect(), got {type(client).__name__}"
            )
        self.client = client
        self.table = table
        self.dtype = dtype
        self.last_version: int | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        check_input(input)
        rows, version = self.client.lookup(self.table, input.reshape(-1), return_version=True)
        self.last_version = version
        out = torch.from_numpy(rows).reshape(*input.shape, rows.shape[1])
        return out.to(device=input.device, dtype=self.dtype)

    def extra_repr(self) -> str:
        return f"table={self.table!r}"

    def __reduce__(self) -> Any:
        raise NotCopyableError(
            "RemoteEmbedding holds a connection; build one per process with embstore.connect()"
        )


class CachedEmbeddingBagCollection(nn.Module):
    """Inference embeddings through an :class:`~embstore.InferenceCache`: a drop-in for the
    lookup half of an embedding-bag collection at serving time.

    ``forward(features)`` takes ``{table: ids}`` — a 1-D int tensor of ``B`` ids per table,
    or ``(values, offsets)`` bags — and returns ``{table: Tensor[B, D]}`` (bags pooled by
    ``mode``, ``mean`` or ``sum``) on ``device``. No gradients: the cache serves a fixed
    checkpoint (train with :class:`EmbeddingBag`). ``last_sources`` holds, after each call,
    where each id's row came from (indices into ``embstore.cache.SOURCES``).

    Example::

        >>> import embstore, embstore.torch, numpy as np, torch
        >>> store = embstore.Store()
        >>> for n in ("user", "item"):
        ...     _ = store.create_table(n, embedding_dim=4).lookup(np.arange(100))
        >>> cache = embstore.InferenceCache(store, ["user", "item"], memory_budget_bytes=8 << 10)
        >>> ebc = embstore.torch.CachedEmbeddingBagCollection(cache)
        >>> out = ebc({"user": torch.tensor([1, 2]), "item": torch.tensor([5, 6])})
        >>> out["item"].shape
        torch.Size([2, 4])
    """

    def __init__(self, cache: Any, *, mode: str = "mean", device: Any = None):
        super().__init__()
        if mode not in ("mean", "sum"):
            raise InvalidArgumentError(f"mode must be 'mean' or 'sum', got {mode!r}")
        self.cache = cache
        self.mode = mode
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.last_sources: dict[str, np.ndarray] = {}

    @property
    def tables(self) -> list[str]:
        return list(self.cache.tables)

    @property
    def embedding_dim(self) -> int:
        return int(self.cache.embedding_dim)

    def forward(self, features: dict[str, Any]) -> dict[str, torch.Tensor]:
        rows, self.last_sources = self.cache.lookup(
            features, bag_mode=self.mode, return_sources=True
        )
        return {k: torch.from_numpy(v).to(self.device) for k, v in rows.items()}


__all__ = ["CachedEmbeddingBagCollection", "RemoteEmbedding"]
