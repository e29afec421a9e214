import importlib
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return ROOT


@pytest.fixture(scope="module")
def bench(request):
    """The benchmark script at the test module's ``BENCH`` path, imported as a module."""
    path = request.module.BENCH
    sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(path.stem)
    finally:
        sys.path.remove(str(path.parent))
