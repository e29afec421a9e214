"""The MovieLens-100k CTR example (``examples/movielens_ctr.py``) trains, beats the item-popularity
baseline, stores exactly the training ids and is reproducible.

Needs the data: ``make data`` fetches it into ``.data/ml-100k``; ``EMBSTORE_DATA`` names the
``.data`` directory (``make test-python`` sets it). Missing data fails the tests, not skips them.
"""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest

import embstore

pytestmark = pytest.mark.data

# Over 2 epochs, seeds 0-7 gave test AUC 0.7816-0.7833 against a popularity AUC of 0.7090
# (margin 0.0726-0.0743); the bounds leave room for other CPUs' floating-point differences.
MIN_AUC = 0.76
MIN_MARGIN = 0.04


@pytest.fixture
def ctr(repo_root: pathlib.Path) -> ModuleType:
    """The example, imported as a module."""
    spec = importlib.util.spec_from_file_location(
        "movielens_ctr", repo_root / "examples" / "movielens_ctr.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_beats_popularity_and_stores_the_training_ids(
    ctr: ModuleType, data_dir: pathlib.Path
) -> None:
    result = ctr.run(data_dir, epochs=2, seed=0, quiet=True)

    assert result["test_auc"] > MIN_AUC
    assert result["test_auc"] - result["popularity_auc"] > MIN_MARGIN
    assert [e["epoch"] for e in result["epochs"]] == [1, 2]
    assert result["epochs"][1]["train_logloss"] < result["epochs"][0]["train_logloss"]

    # Training lookups store every id they see; eval lookups (on_miss="zeros") store none, and
    # the test split has ids that training never saw.
    assert result["rows_per_table"] == result["distinct_train_ids"]
    assert result["rows"] == sum(result["distinct_train_ids"].values())
    everything = ctr.load_movielens(data_dir).distinct_ids()
    assert sum(everything.values()) > result["rows"]


def test_same_seed_same_result(ctr: ModuleType, data_dir: pathlib.Path) -> None:
    first, second = (ctr.run(data_dir, epochs=1, seed=3, quiet=True) for _ in range(2))
    assert first["test_auc"] == second["test_auc"]
    assert first["epochs"][0]["train_logloss"] == second["epochs"][0]["train_logloss"]


def test_a_durable_store_gives_the_same_numbers_and_keeps_the_tables(
    ctr: ModuleType, data_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    memory = ctr.run(data_dir, epochs=1, seed=3, quiet=True)
    durable = ctr.run(data_dir, epochs=1, seed=3, quiet=True, store_dir=tmp_path / "s")
    assert durable["test_auc"] == memory["test_auc"]
    assert durable["epochs"][0]["flush"]["records"] == durable["rows"]
    reopened = embstore.Store(tmp_path / "s")
    assert {t: len(reopened[t]) for t in reopened.tables()} == durable["rows_per_table"]
    with pytest.raises(FileExistsError):
        ctr.run(data_dir, epochs=1, seed=3, quiet=True, store_dir=tmp_path / "s")


def test_missing_data_asks_for_make_data(
    ctr: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctr.main(["--data-dir", str(tmp_path), "--quiet"]) == 2
    assert "make data" in capsys.readouterr().err
