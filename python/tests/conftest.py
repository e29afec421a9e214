import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARK_TESTS = pathlib.Path(__file__).resolve().parent / "benchmark"


def pytest_collection_modifyitems(config, items):
    """Every test under benchmark/ runs a benchmark script: mark it ``benchmark`` (so
    ``make test-fast`` can leave them out) without a marker line in each file."""
    for item in items:
        if BENCHMARK_TESTS in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.benchmark)


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


@pytest.fixture(scope="module")
def run_bench(request):
    """Runs the benchmark script at the test module's ``BENCH`` path with the given arguments
    (``timeout`` seconds at most, 300 unless given); returns the completed process."""
    path = request.module.BENCH

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout
        )

    return run
