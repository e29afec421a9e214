"""The package as a user outside this repository gets it: ``maturin build`` makes a wheel, a
fresh virtualenv (no system site packages, nothing from this checkout) installs it with pip,
which brings its declared runtime dependencies (numpy) from the package index, and an example
runs from a directory outside the repository.

Needs maturin (``python/requirements-dev.txt``) and the package index (or a pip cache holding
numpy). The cargo target directory is reused, so after ``make develop`` the build only links.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest

# Builds a release wheel and installs it into a fresh virtualenv: minutes.
pytestmark = pytest.mark.slow


def maturin() -> str:
    """maturin beside this interpreter, else on PATH; a clear failure when neither exists."""
    here = pathlib.Path(sys.executable).parent / "maturin"
    found = str(here) if here.exists() else shutil.which("maturin")
    if found is None:
        pytest.fail(
            "maturin is needed to build the wheel: install python/requirements-dev.txt "
            "(make develop does)"
        )
    return found


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, f"{cmd[:4]} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def test_wheel_installs_into_a_fresh_virtualenv_and_runs_an_example(repo_root, tmp_path):
    wheels = tmp_path / "wheels"
    env = dict(os.environ, CARGO_TARGET_DIR=str(repo_root / "target"))
    env.pop("VIRTUAL_ENV", None)
    run(
        [maturin(), "build", "--release", "--quiet", "--out", str(wheels)],
        timeout=900,
        cwd=repo_root,
        env=env,
    )
    (wheel,) = wheels.glob("embstore-*.whl")

    # A fresh environment: the base interpreter, no system site packages, its own pip.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([py, "-m", "pip", "install", "--quiet", str(wheel)], timeout=600, env=clean)

    # numpy came as a declared dependency; torch is only the `torch` extra.
    out = run(
        [
            py,
            "-c",
            "import importlib.metadata as m, numpy, embstore; "
            "print(embstore.__file__); print(*m.requires('embstore'), sep='\\n')",
        ],
        timeout=120,
        env=clean,
        cwd=tmp_path,
    )
    where, *requires = out.stdout.splitlines()
    assert pathlib.Path(where).is_relative_to(env_dir), where
    marker = {r.partition(";")[0].strip(): r.partition(";")[2].replace("'", '"') for r in requires}
    numpy_req = [r for r in marker if r.startswith("numpy")]
    assert numpy_req and marker[numpy_req[0]] == "", requires
    torch_req = [r for r in marker if r.startswith("torch")]
    assert torch_req and marker[torch_req[0]].strip() == 'extra == "torch"', requires

    # An example, run as a user would from their own directory.
    work = tmp_path / "user"
    work.mkdir()
    shutil.copy(repo_root / "examples" / "durable_store.py", work)
    out = run([py, "durable_store.py"], timeout=300, env=clean, cwd=work)
    assert "ok: every record and checksum verified" in out.stdout, out.stdout
