"""Fixtures of the integration tests that need the emulated WAN."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination.wan import WanUnavailable, check_available, ek_namespaces


@pytest.fixture(scope="module")
def python_with_nfq() -> str:
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
