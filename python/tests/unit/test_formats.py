"""Files of the Python package's own format, checked in at their first version and loaded here,
so that a change that makes an old file unreadable (or read differently) fails the tests.

- ``torch-state-v1/embedding.pt``: ``torch.save(module.state_dict())`` of an
  ``embstore.torch.Embedding`` (format 1 of its extra state: every row with its optimizer state
  and metadata, and the table's step counter), with ``expected.json`` beside it (what the table
  held when it was saved).

The on-disk formats of the Rust crates have their fixtures under ``crates/*/tests/fixtures``.
Write the fixtures (for a new version only: never rewrite a ``-v1`` file)::

    .venv/bin/python python/tests/unit/test_formats.py DIR
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

import embstore
import embstore.torch as et

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
STATE_V1 = FIXTURES / "torch-state-v1"
IDS = [1, 2, 2**40 + 7, -3, 123_456_789]


def exported(table: embstore.Table) -> dict[int, tuple[list, list, int, int]]:
    """Every row by id: values, optimizer state, version and update count."""
    out = {}
    for c in table.export():
        for i, id_ in enumerate(c.ids.tolist()):
            v = (c.values[i].tolist(), c.state[i].tolist(), int(c.versions[i]))
            out[id_] = (*v, int(c.update_counts[i]))
    return out


def make_table(store: embstore.Store) -> embstore.Table:
    return store.create_table(
        "user", embedding_dim=4, optimizer=embstore.Adagrad(lr=0.1), num_shards=2, seed=7
    )


def write_state_fixture(where: pathlib.Path) -> None:
    """Writes ``embedding.pt`` and ``expected.json`` into ``where`` (the generator)."""
    where.mkdir(parents=True, exist_ok=True)
    table = make_table(embstore.Store())
    module = et.Embedding(table)
    rows = table.lookup(IDS)
    table.apply_gradients(IDS, np.arange(rows.size, dtype=np.float32).reshape(rows.shape) / 10)
    torch.save(module.state_dict(), where / "embedding.pt")
    expected = {
        "ids": IDS,
        "rows": table.lookup(IDS, on_miss="error").tolist(),
        "step": table.step,
        "exported": {str(k): v for k, v in sorted(exported(table).items())},
    }
    (where / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def test_a_torch_state_dict_of_format_1_loads_into_a_fresh_table():
    expected = json.loads((STATE_V1 / "expected.json").read_text())
    state = torch.load(STATE_V1 / "embedding.pt", weights_only=True)
    table = make_table(embstore.Store())
    module = et.Embedding(table)
    module.load_state_dict(state)
    assert len(table) == len(expected["ids"])
    assert table.step == expected["step"]
    got = table.lookup(expected["ids"], on_miss="error")
    np.testing.assert_array_equal(got, np.asarray(expected["rows"], np.float32))
    # Values, optimizer state, versions and update counts, row by row.
    want = {int(k): tuple(v) for k, v in expected["exported"].items()}
    assert {k: list(v) for k, v in exported(table).items()} == {k: list(v) for k, v in want.items()}


def test_a_state_of_another_format_is_refused_and_changes_nothing():
    state = torch.load(STATE_V1 / "embedding.pt", weights_only=True)
    key = next(k for k in state if k.endswith("_extra_state"))
    state[key] = {**state[key], "format": 2}
    table = make_table(embstore.Store())
    table.lookup([5])
    module = et.Embedding(table)
    with pytest.raises(embstore.InvalidArgumentError, match=r"not from an embstore\.torch module"):
        module.load_state_dict(state)
    assert len(table) == 1


if __name__ == "__main__":
    write_state_fixture(pathlib.Path(sys.argv[1]))
