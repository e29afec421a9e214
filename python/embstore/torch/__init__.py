"""PyTorch modules over embstore tables.

:class:`Embedding` and :class:`EmbeddingBag` (:mod:`embstore.torch.sparse`) take the arguments
``nn.Embedding`` and ``nn.EmbeddingBag`` take, but their rows live in an embstore
:class:`~embstore.Table` and are trained by the table's own optimizer, which
:class:`EmbeddingOptimizer` (:mod:`embstore.torch.optim`) steps; dense layers keep
``torch.optim``::

    loss.backward()
    dense_opt.step(); sparse_opt.step()
    dense_opt.zero_grad(); sparse_opt.zero_grad()

:class:`RemoteEmbedding` and :class:`CachedEmbeddingBagCollection`
(:mod:`embstore.torch.inference`) read rows at serving time, from batch-query servers or
through an :class:`~embstore.InferenceCache`. :class:`EmbeddingBagCollection` and
:class:`EmbeddingCollection` (:mod:`embstore.torch.collection`) take TorchRec's configs and
jagged input (:class:`KeyedJaggedTensor`, TorchRec's or ours). Training and eval modes,
dtypes, checkpoints and copies are described in :mod:`embstore.torch.sparse`;
:class:`StoreState` (:mod:`embstore.torch.checkpoint`) checkpoints tables with
``torch.distributed.checkpoint`` onto any process count, and :func:`from_torchrec`
(:mod:`embstore.torch.torchrec`) imports a TorchRec checkpoint's tables and fused optimizer
state.

Shape letters: ``B`` bags (or the input's shape for :class:`Embedding`), ``N`` ids, ``D``
``embedding_dim``.
"""

from embstore.torch.checkpoint import StoreState
from embstore.torch.collection import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
    PoolingType,
)
from embstore.torch.inference import CachedEmbeddingBagCollection, RemoteEmbedding
from embstore.torch.optim import EmbeddingOptimizer
from embstore.torch.sparse import Embedding, EmbeddingBag
from embstore.torch.torchrec import from_torchrec

__all__ = [
    "CachedEmbeddingBagCollection",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "EmbeddingOptimizer",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PoolingType",
    "RemoteEmbedding",
    "StoreState",
    "from_torchrec",
]
