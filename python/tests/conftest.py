import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return ROOT
