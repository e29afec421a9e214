"""`embstore serve --sync-listen` serves a store that no process trains: its --help says that
a store that trains serves its own sync port (`store.serve_sync()` in the training process),
and the refusal when a trainer holds the directory says so too."""

from __future__ import annotations

import subprocess
import sys

import embstore


def _embstore(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "embstore", *args], capture_output=True, text=True, timeout=timeout
    )


def test_the_help_of_sync_listen_points_a_trainer_to_serve_sync() -> None:
    out = _embstore("serve", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines
    start = text.rindex("--sync-listen HOST:PORT")  # its entry, after the usage line
    sync_listen = text[start : text.index("--follow", start)]
    assert "no process trains" in sync_listen, sync_listen
    assert "store.serve_sync(" in sync_listen and "training process" in sync_listen, sync_listen


def test_sync_listen_on_a_store_a_trainer_holds_says_to_call_serve_sync(tmp_path) -> None:
    trainer = embstore.Store(tmp_path / "ctr")  # the training process holds the directory
    trainer.create_table("item", embedding_dim=4).assign([1], [[1.0] * 4])
    trainer.flush()
    try:
        serve = ["serve", "--store", str(tmp_path / "ctr"), "--listen", "127.0.0.1:0"]
        out = _embstore(*serve, "--sync-listen", "127.0.0.1:0", "--framed-listen", "off")
        assert out.returncode == 2, out
        assert "open in another process" in out.stderr, out.stderr
        assert "from the training process" in out.stderr, out.stderr
        assert "store.serve_sync(" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        # Without --sync-listen the refusal is the plain one: nothing about sync. (The
        # framed path's old flag, --fast-listen, is still taken: deprecated.)
        plain = _embstore(*serve, "--fast-listen", "off")
        assert plain.returncode == 2 and "open in another process" in plain.stderr, plain
        assert "--fast-listen is deprecated; use --framed-listen" in plain.stderr, plain.stderr
        assert "serve_sync" not in plain.stderr, plain.stderr
    finally:
        trainer.close()
