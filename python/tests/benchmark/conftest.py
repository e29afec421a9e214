"""Shared fixtures of the benchmark scripts' tests."""

import importlib
import sys

import pytest


@pytest.fixture(scope="module")
def bench(request):
    """The benchmark script at the test module's ``BENCH`` path, imported as a module."""
    path = request.module.BENCH
    sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(path.stem)
    finally:
        sys.path.remove(str(path.parent))
