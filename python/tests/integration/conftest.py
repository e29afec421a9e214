"""Fixtures of the integration tests: MovieLens-100k, and the emulated WAN."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination.wan import WanUnavailable, check_available, ek_namespaces


def _wan_or_skip() -> str:
    """The interpreter the WAN's delay daemon runs under; skips, with the reason, where
    network namespaces or the WAN's dependencies (`make wan-deps`) are unavailable, or where
    `ek-*` namespaces exist already (another run)."""
    try:
        check_available(sys.executable)
    except WanUnavailable as e:
        pytest.skip(f"emulated WAN unavailable: {e}")
    if ek_namespaces():
        pytest.skip(f"ek-* namespaces exist already (another run?): {ek_namespaces()}")
    return sys.executable


@pytest.fixture(scope="module")
def python_with_nfq() -> str:
    """The emulated WAN is usable (checked once per module); see `_wan_or_skip`."""
    return _wan_or_skip()


@pytest.fixture
def wan_free() -> None:
    """The emulated WAN is usable now (checked before each test); see `_wan_or_skip`."""
    _wan_or_skip()


@pytest.fixture
def data_dir() -> pathlib.Path:
    """``$EMBSTORE_DATA/ml-100k``; fails the test when the data is not there."""
    root = os.environ.get("EMBSTORE_DATA")
    if not root:
        pytest.fail("EMBSTORE_DATA is not set: run `make data`, then EMBSTORE_DATA=$PWD/.data")
    path = pathlib.Path(root) / "ml-100k"
    if not (path / "ml-100k.inter").is_file():
        pytest.fail(f"MovieLens-100k not found in {path}: run `make data`")
    return path
