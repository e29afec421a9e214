"""Witnesses and rollback (Ekko §5.3): undo a bad model in seconds by writing only what
changed since it was last known healthy.

A :class:`Witness` follows a training store's sync port like any replica, but serves nothing:
every row it pulls goes into a log bucketed by arrival time (1 s), and only once the model
monitor (:class:`embstore.ModelMonitor`) judges the model healthy past a bucket's end is the
bucket flushed into the witness's *healthy store*, kept on disk. Each witness records in etcd
how far its healthy store reaches (``t_max``).

:func:`rollback` (``embstore model rollback``) then runs Ekko's five steps: ① pause the
trainer's writes (they fail with :class:`~embstore.RollingBackError`) and prioritised sync, and
wait until the witnesses hold everything the trainer wrote; ② pick for each trainer the witness
whose ``t_max`` agrees with the others; ③ that witness diffs its healthy store against the rows
changed since; ④ writes only the diff to the trainer, with new versions, which sync carries to
every replica, and every witness drops its logs; ⑤ the trainer takes writes again once the
monitor judges the model healthy (a corrupted model's metrics must first come back normal, from
the little traffic :class:`embstore.ModelClient` still sends it; ``resume="now"`` resumes at
once). A rollback cut short (a witness or the command killed, or the wait for a healthy model
timed out) is finished by running the command again.

etcd keys (JSON): ``/embstore/model/<m>/witness/<name>`` (each witness: source, tables,
``t_max_ms``, a heartbeat and its answers to the rollback's steps) and
``/embstore/model/<m>/rollback`` (the rollback in progress: its attempt and step).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from embstore import _native
from embstore import sync as _sync
from embstore.errors import (
    EmbstoreError,
    InvalidArgumentError,
    UnavailableError,
)
from embstore.model import etcd_urls, model_status, trusted

__all__ = ["Witness", "rollback"]

_PREFIX = "/embstore/model/"
#: A witness whose heartbeat is older than this takes no part in a rollback.
STALE_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _key(model: str, *rest: str) -> str:
    if not model or "/" in model:
        raise InvalidArgumentError(f"model name must be non-empty and hold no '/', got {model!r}")
    return _PREFIX + model + "/" + "/".join(rest)


def _get(etcd: list[str], key: str) -> tuple[dict[str, Any] | None, int]:
    got = _native.etcd_get(etcd, key)
    if got is None:
        return None, 0
    return json.loads(bytes(got[0])), got[1]


def _update(
    etcd: list[str], key: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]
) -> dict[str, Any]:
    """Compare-and-swap: ``change`` the record at ``key`` until nobody wrote in between."""
    for _ in range(64):
        cur, rev = _get(etcd, key)
        new = change(cur)
        if _native.etcd_put_if(etcd, key, json.dumps(new).encode(), rev):
            return new
    raise UnavailableError(f"etcd key {key} kept changing under 64 tries")


class Witness:
    """A witness of the tables served at ``source`` (a sync port, ``host:port``) for
    ``model``: follows them, keeps their healthy state in ``data_dir``, records its ``t_max``
    in ``etcd`` and takes part in rollbacks. Serves no lookups.

    Args:
        source: the trainer's sync port.
        model: the model the tables belong to (its state is what the monitor records).
        etcd: etcd URL(s).
        data_dir: where the healthy store is kept (a restart takes it from there).
        name: this witness's name in etcd (default: host name and ``data_dir``'s base name);
            keep it across restarts.
        token: the sync port's token. ``tls_*``: as :meth:`embstore.Store.follow`.
        bucket_s: the logs' bucket length (1 s).
        poll_s: how often etcd is read for the model's state and the rollback's steps (0.1 s).

    :meth:`start` starts it (or use it as a context manager); :meth:`stats` says what it
    holds; :meth:`stop` stops it.
    """

    def __init__(
        self,
        source: str,
        *,
        model: str,
        etcd: str | list[str],
        data_dir: str | os.PathLike[str],
        name: str | None = None,
        token: str | None = None,
        tables: list[str] | None = None,
        bucket_s: float = 1.0,
        poll_s: float = 0.1,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_domain: str | None = None,
    ) -> None:
        _key(model)
        if not isinstance(bucket_s, int | float) or not 0.001 <= bucket_s <= 3600:
            raise InvalidArgumentError(f"bucket_s must be in 0.001..3600, got {bucket_s!r}")
        if not isinstance(poll_s, int | float) or not 0.01 <= poll_s <= 60:
            raise InvalidArgumentError(f"poll_s must be in 0.01..60, got {poll_s!r}")
        self.source = source
        self.model = model
        self.etcd = etcd_urls(etcd) or []
        self.data_dir = os.fspath(data_dir)
        base = os.path.basename(os.path.abspath(self.data_dir))
        self.name = name or f"{socket.gethostname()}-{base}"
        if "/" in self.name or not self.name:
            raise InvalidArgumentError(
                f"witness name must be non-empty and hold no '/', got {self.name!r}"
            )
        self._token = token
        self._tables = tables
        self._tls = (tls_ca, tls_cert, tls_key, tls_domain)
        self.bucket_ms = max(1, round(bucket_s * 1000))
        self.poll_s = float(poll_s)
        self._store: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t_healthy = 0
        self._last_beat = 0.0
        self._answers: dict[str, Any] = {}
        self.errors: list[str] = []

    # -- running -------------------------------------------------------------------------

    def start(self) -> Witness:
        """Starts following and the control loop; returns self."""
        from embstore.store import Store

        os.makedirs(self.data_dir, exist_ok=True)
        ca, cert, key, domain = self._tls
        self._store = Store.follow(
            self.source,
            token=self._token,
            tables=self._tables,
            tls_ca=ca,
            tls_cert=cert,
            tls_key=key,
            tls_domain=domain,
            # Short long-polls: a rollback's waits for convergence end within a round or two.
            wait_ms=200,
            priority=False,
            witness_dir=self.data_dir,
            witness_bucket_s=self.bucket_ms / 1000,
        )
        self._beat(force=True)
        self._thread = threading.Thread(target=self._run, name=f"witness-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the control loop and following (the healthy store stays on disk)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Witness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """Waits until the witness holds what the source had when called."""
        return self._store is not None and self._store.wait_caught_up(timeout)

    def stats(self) -> dict[str, Any]:
        """Per table what the witness holds (``t_max_ms``, unflushed ``buckets`` and
        ``logged_keys``, ``healthy_rows``, ``file_bytes``, ``restored_rows``), and the
        witness's ``t_max_ms`` (the least over its tables)."""
        tables = {}
        if self._store is not None:
            for name in self._store.tables():
                st = self._store[name].native().witness_stats()
                if st is not None:
                    tables[name] = dict(st)
        t_max = min((t["t_max_ms"] for t in tables.values()), default=0)
        return {"name": self.name, "source": self.source, "t_max_ms": t_max, "tables": tables}

    def _tables_native(self) -> list[Any]:
        if self._store is None:
            return []
        # Every table of the store is a witness (`Store.follow(witness_dir=...)`).
        return [self._store[n].native() for n in self._store.tables()]

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except EmbstoreError as e:  # etcd away, a source gone: said, and tried again
                with self._lock:
                    self.errors = [*self.errors, str(e)][-20:]

    # -- one round of the control loop -----------------------------------------------------

    def poll(self) -> None:
        """Reads the model's state and the rollback's step from etcd and acts on them (the
        control loop calls it every ``poll_s``)."""
        state = model_status(self.model, self.etcd)
        if (
            state is not None
            and state.get("t_healthy_ms")
            and state["t_healthy_ms"] > self._t_healthy
        ):
            self.flush(state["t_healthy_ms"], state.get("corrupted") or [])
        rb, _ = _get(self.etcd, _key(self.model, "rollback"))
        if rb is not None:
            self._rollback_step(rb, state or {})
        self._beat()

    def flush(self, t_healthy_ms: int, corrupted: list[dict[str, Any]]) -> int:
        """Flushes every table's logs up to a healthy decision and records ``t_max``."""
        intervals = [(c["start_ms"], c.get("end_ms")) for c in corrupted]
        for t in self._tables_native():
            t.witness_flush(int(t_healthy_ms), intervals)
        self._t_healthy = int(t_healthy_ms)
        t_max = self.stats()["t_max_ms"]
        if t_max > 0:
            try:
                _native.model_record_t_max(self.etcd, self.model, self.name, t_max)
            except EmbstoreError:
                pass  # the model has no state yet: recorded at the next flush
        self._beat(force=True)
        return t_max

    def _beat(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_beat < 1.0:
            return
        st = self.stats()
        with self._lock:
            answers = dict(self._answers)
        record = {
            "source": self.source,
            "tables": sorted(st["tables"]),
            "t_max_ms": st["t_max_ms"],
            "healthy_rows": sum(t["healthy_rows"] for t in st["tables"].values()),
            "logged_keys": sum(t["logged_keys"] for t in st["tables"].values()),
            "bucket_ms": self.bucket_ms,
            "updated_ms": _now_ms(),
            "answers": answers,
        }
        key = _key(self.model, "witness", self.name)
        _update(self.etcd, key, lambda _cur: record)
        self._last_beat = time.monotonic()

    def _answer(self, attempt: str, step: str, **extra: Any) -> None:
        with self._lock:
            self._answers = {attempt: {"step": step, **extra}}
        self._beat(force=True)

    def _rollback_step(self, rb: dict[str, Any], state: dict[str, Any]) -> None:
        attempt, step = rb["attempt"], rb["step"]
        done = self._answers.get(attempt, {}).get("step")
        if step == "converge" and done is None:
            # Writes are paused at the source: everything it holds now is all there is.
            if self.wait_caught_up(timeout=60):
                self._answer(attempt, "converge")
        elif step == "write" and done == "converge":
            target = int(rb["t_target_ms"])
            intervals = [(c["start_ms"], c.get("end_ms")) for c in state.get("corrupted") or []]
            rows = 0
            writer = rb["writers"].get(self.source) == self.name
            for t in self._tables_native():
                # Every witness flushes what lies before the target (healthy), so that all
                # healthy stores agree; the chosen one writes its diff.
                t.witness_flush(target, intervals)
                if writer:
                    keys, values, removed = t.witness_diff(bool(rb.get("keep_new_rows")))
                    if len(keys):
                        rows += _native.sync_rollback(
                            self.source,
                            "write",
                            table=t.name,
                            keys=keys,
                            values=values,
                            removed=removed,
                            token=self._token or "",
                            **_tls_kwargs(self._tls),
                        )
                t.witness_clear_logs()
            self._answer(attempt, "write", rows=rows, writer=writer)
        elif step == "settle" and done == "write":
            if self.wait_caught_up(timeout=60):
                self._answer(attempt, "settle")


def _tls_kwargs(tls: tuple[Any, Any, Any, str | None]) -> dict[str, Any]:
    ca, cert, key, domain = _sync.native_tls(*tls) or (None, None, None, None)
    return {"tls_ca": ca, "tls_cert": cert, "tls_key": key, "tls_domain": domain}


def witnesses(model: str, etcd: str | list[str]) -> list[dict[str, Any]]:
    """The witnesses etcd records for ``model``, each with ``name`` and ``live`` (its
    heartbeat is recent)."""
    urls = etcd_urls(etcd) or []
    out = []
    now = _now_ms()
    for key, value, _rev in _native.etcd_range(urls, _key(model, "witness", "")):
        rec = json.loads(bytes(value))
        rec["name"] = key.rsplit("/", 1)[-1]
        rec["live"] = now - rec.get("updated_ms", 0) <= STALE_S * 1000
        out.append(rec)
    return out


def rollback_in_progress(model: str, etcd: str | list[str]) -> dict[str, Any] | None:
    """The record of ``model``'s rollback in progress (its ``step`` and ``attempt``), or None."""
    return _get(etcd_urls(etcd) or [], _key(model, "rollback"))[0]


def rollback(
    model: str,
    etcd: str | list[str],
    *,
    to: str | float = "healthy",
    keep_new_rows: bool = False,
    token: str | None = None,
    timeout_s: float = 120.0,
    resume: str = "healthy",
    healthy_timeout_s: float = 600.0,
    tls: tuple[Any, Any, Any, str | None] = (None, None, None, None),
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Rolls ``model`` back to its healthy state (``to="healthy"``: the witnesses' agreed
    ``t_max``) or to a time (seconds since the epoch, at or after the witnesses' ``t_max``),
    writing only what changed since; prints each step with ``say``. ``keep_new_rows`` keeps
    rows created after that time (by default they are removed). ``token``/``tls``: the
    trainers' sync ports'.

    ``resume``: when the trainers take writes again. ``"healthy"`` (default; Ekko's step ⑤):
    once the model's state is trusted again (:func:`embstore.model.trusted`: at once if it
    was never corrupted; after a corruption, once the monitor judged it healthy), waiting at
    most ``healthy_timeout_s`` (past it, ``UnavailableError``, and writes stay paused).
    ``"now"``: at once.

    Returns the steps' timings and rows written. Running it again after it was cut short
    finishes the rollback (one that was waiting for a healthy model waits again, or with
    ``resume="now"`` resumes at once); while another rollback of the model runs (its record
    was written in the last 5 s), it is refused with ``UnavailableError`` and changes
    nothing."""
    if resume not in ("healthy", "now"):
        raise InvalidArgumentError(f"resume must be 'healthy' or 'now', got {resume!r}")
    if isinstance(healthy_timeout_s, bool) or not isinstance(healthy_timeout_s, int | float):
        raise InvalidArgumentError(f"healthy_timeout_s must be seconds, got {healthy_timeout_s!r}")
    if not healthy_timeout_s >= 0:
        raise InvalidArgumentError(f"healthy_timeout_s must be >= 0, got {healthy_timeout_s!r}")
    urls = etcd_urls(etcd) or []
    state = model_status(model, urls)
    if state is None:
        raise InvalidArgumentError(f"no state recorded for model '{model}': nothing to roll back")
    rb_key = _key(model, "rollback")
    t0 = time.monotonic()
    previous, _ = _get(urls, rb_key)
    beat = (previous or {}).get("heartbeat_ms")
    if beat is not None and _now_ms() - beat < _RUNNING_MS:
        raise UnavailableError(
            f"a rollback of '{model}' is running (attempt {previous['attempt']}, step "
            f"{previous['step']!r}, heard from {(_now_ms() - beat) / 1000:.1f} s ago): wait for "
            f"it; if its process died, run this again {_RUNNING_MS / 1000:g} s after it was last "
            "heard from, to finish it"
        )
    live = [w for w in witnesses(model, urls) if w["live"]]
    awaiting = (previous or {}).get("step") == "await_healthy"  # only ⑤ is left
    if not live and not awaiting:
        raise UnavailableError(
            f"model '{model}' has no live witness (embstore serve --witness): its healthy state "
            "is nowhere to be found"
        )
    if previous is None:
        _native.model_begin_rollback(urls, model)
        say(f"rollback of '{model}': begun ({len(live)} witnesses)")
    else:
        say(
            f"rollback of '{model}': continuing the one begun at {previous['begun_ms']} ms "
            f"(attempt {previous['attempt']})"
        )
    attempt = f"{_now_ms()}-{os.getpid()}"
    stop = threading.Event()
    beating = threading.Thread(target=_heartbeat, args=(urls, rb_key, attempt, stop), daemon=True)
    try:
        if awaiting:
            assert previous is not None
            rb = {**previous, "attempt": attempt}
            kw = {"token": token or "", **_tls_kwargs(tls)}
            beating.start()  # beats once _resume_when writes the record under this attempt
            return _resume_when(model, urls, rb, kw, resume, healthy_timeout_s, say, t0, {})
        out = _steps(
            model,
            urls,
            previous,
            to,
            keep_new_rows,
            token,
            timeout_s,
            tls,
            say,
            t0,
            live,
            attempt,
            beating,
        )
        rb, kw, timings = out
        return _resume_when(model, urls, rb, kw, resume, healthy_timeout_s, say, t0, timings)
    except EmbstoreError as e:
        if "run the rollback again" in str(e) or "nothing rolled back" in str(e):
            raise
        raise type(e)(
            f"{e}; the rollback of '{model}' is left in progress (writes may be paused): run "
            "it again to finish it"
        ) from e
    finally:
        stop.set()
        if beating.is_alive():
            beating.join()
        try:  # no longer running: a rerun may continue it at once
            _set_heartbeat(urls, rb_key, attempt, None)
        except EmbstoreError:
            pass  # etcd away: a rerun waits until the last heartbeat is old


#: A rollback whose record was written within this long (ms) is running: another is refused.
_RUNNING_MS = 5_000


def _set_heartbeat(urls: list[str], rb_key: str, attempt: str, at_ms: int | None) -> None:
    """Sets the heartbeat of ``attempt``'s rollback record (if the record is still that
    attempt's); a write that loses a race is left to the next beat."""
    cur, rev = _get(urls, rb_key)
    if cur is None or cur.get("attempt") != attempt:
        return
    cur["heartbeat_ms"] = at_ms
    _native.etcd_put_if(urls, rb_key, json.dumps(cur).encode(), rev)


def _heartbeat(urls: list[str], rb_key: str, attempt: str, stop: threading.Event) -> None:
    """Every second until ``stop``: this rollback is running."""
    while not stop.wait(1.0):
        try:
            _set_heartbeat(urls, rb_key, attempt, _now_ms())
        except EmbstoreError:
            pass  # etcd away for a moment: the next beat


def _steps(
    model: str,
    urls: list[str],
    previous: dict[str, Any] | None,
    to: str | float,
    keep_new_rows: bool,
    token: str | None,
    timeout_s: float,
    tls: tuple[Any, Any, Any, str | None],
    say: Callable[[str], None],
    t0: float,
    live: list[dict[str, Any]],
    attempt: str,
    beating: threading.Thread,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    rb_key = _key(model, "rollback")
    timings: dict[str, float] = {}
    sources = sorted({w["source"] for w in live})
    rb: dict[str, Any] = {
        "attempt": attempt,
        "step": "pause",
        "begun_ms": (previous or {}).get("begun_ms", _now_ms()),
        "to": to,
        "keep_new_rows": keep_new_rows,
        "sources": sources,
        "writers": {},
        "t_target_ms": (previous or {}).get("t_target_ms"),
    }

    def save() -> None:
        rb["heartbeat_ms"] = _now_ms()
        _update(urls, rb_key, lambda _cur: rb)

    save()
    beating.start()
    kw = {"token": token or "", **_tls_kwargs(tls)}

    def step(name: str, t: float) -> None:
        timings[name] = time.monotonic() - t
        say(f"  {name}: {timings[name]:.3f} s")

    # ① Writes and prioritised sync off at every trainer; witnesses converge.
    t = time.monotonic()
    for s in sources:
        n = _native.sync_rollback(s, "pause", reason=f"model '{model}' is rolling back", **kw)
        say(f"① paused writes at {s} ({n} tables)")
    rb["step"] = "converge"
    save()
    _wait(model, urls, attempt, "converge", [w["name"] for w in live], timeout_s)
    step("① paused and converged", t)

    # ② The witness per trainer whose t_max agrees with the others.
    t = time.monotonic()
    by_name = {w["name"]: w for w in witnesses(model, urls) if w["live"]}
    t_maxes = [w["t_max_ms"] for w in by_name.values() if w["t_max_ms"] > 0]
    if not t_maxes:
        _abandon(model, urls, sources, kw)
        raise UnavailableError(
            f"no witness of model '{model}' has a healthy state yet (no healthy decision was "
            "recorded since they started): writes resumed, nothing rolled back"
        )
    median = statistics.median(t_maxes)
    window = 2 * max(w.get("bucket_ms", 1000) for w in by_name.values())
    agree = {n: w for n, w in by_name.items() if abs(w["t_max_ms"] - median) <= window}
    writers = {}
    for s in sources:
        mine = [w for w in agree.values() if w["source"] == s]
        if not mine:
            _abandon(model, urls, sources, kw)
            raise UnavailableError(
                f"no witness of {s} agrees on t_max (median {median:.0f} ms): writes resumed, "
                "nothing rolled back"
            )
        writers[s] = max(mine, key=lambda w: w["t_max_ms"])["name"]
    if rb["t_target_ms"] is None:
        t_target = max(by_name[n]["t_max_ms"] for n in writers.values())
        if to != "healthy":
            asked = round(float(to) * 1000)
            if asked < t_target:
                _abandon(model, urls, sources, kw)
                raise InvalidArgumentError(
                    f"the witnesses hold the state from {t_target} ms on; {asked} ms is older "
                    "(a rollback goes back at most to the last healthy time they flushed): "
                    "writes resumed, nothing rolled back"
                )
            t_target = asked
        rb["t_target_ms"] = t_target
    rb["writers"] = writers
    say(
        f"② rolling back to t_max {rb['t_target_ms']} ms; writers: "
        + ", ".join(f"{n} for {s}" for s, n in writers.items())
    )
    step("② witnesses chosen", t)

    # ③ ④ Diffs written to the trainers; every witness drops its logs.
    t = time.monotonic()
    rb["step"] = "write"
    save()
    answers = _wait(model, urls, attempt, "write", list(by_name), timeout_s)
    rows = sum(a.get("rows", 0) for a in answers.values())
    say(f"③④ {rows} rows written back")
    step("③④ diff written", t)

    # The restored rows reach the witnesses (and, by the same sync, every replica).
    t = time.monotonic()
    rb["step"] = "settle"
    save()
    _wait(model, urls, attempt, "settle", list(by_name), timeout_s)
    step("④ converged", t)

    rb["rows"] = rows
    return rb, kw, timings


def _resume_when(
    model: str,
    urls: list[str],
    rb: dict[str, Any],
    kw: dict[str, Any],
    resume: str,
    healthy_timeout_s: float,
    say: Callable[[str], None],
    t0: float,
    timings: dict[str, float],
) -> dict[str, Any]:
    """⑤ Writes again: at once, or once the model is trusted again (its record is kept at
    step ``await_healthy`` meanwhile, so that a rerun waits again)."""
    t = time.monotonic()
    if resume == "healthy":
        rb["step"] = "await_healthy"
        rb["heartbeat_ms"] = _now_ms()
        _update(urls, _key(model, "rollback"), lambda _cur: rb)
        _await_healthy(model, urls, healthy_timeout_s, say)
    _resume(rb["sources"], kw)
    _native.etcd_delete(urls, _key(model, "rollback"))
    _native.model_end_rollback(urls, model)
    timings["⑤ writes resumed"] = time.monotonic() - t
    say(f"  ⑤ writes resumed: {timings['⑤ writes resumed']:.3f} s")
    total = time.monotonic() - t0
    rows = rb.get("rows", 0)
    say(f"rollback of '{model}': done in {total:.3f} s, {rows} rows written")
    return {
        "rows": rows,
        "t_target_ms": rb["t_target_ms"],
        "seconds": total,
        "steps": timings,
        "writers": rb["writers"],
    }


def _await_healthy(
    model: str, urls: list[str], timeout_s: float, say: Callable[[str], None]
) -> None:
    """Waits until the model's state is trusted again, ignoring the rollback's own flag."""
    deadline = time.monotonic() + timeout_s
    told = -1.0
    while True:
        record = model_status(model, urls)
        if trusted(None if record is None else {**record, "rolling_back": False}):
            return
        now = time.monotonic()
        if now - told >= 10.0:
            state = (record or {}).get("state")
            say(
                f"⑤ writes stay paused until the monitor judges '{model}' healthy (now {state}; "
                f"waiting up to {max(0.0, deadline - now):.0f} s)"
            )
            told = now
        if now > deadline:
            raise UnavailableError(
                f"'{model}' was not judged healthy within {timeout_s:g} s of the rollback: "
                "its rows are restored but writes stay paused; run the rollback again to wait "
                "again, or with resume now (`--resume now`) to resume writes"
            )
        time.sleep(0.2)


def _abandon(model: str, urls: list[str], sources: list[str], kw: dict[str, Any]) -> None:
    """A rollback that cannot go on: writes resumed, the rollback's record and flag cleared."""
    _resume(sources, kw)
    _native.etcd_delete(urls, _key(model, "rollback"))
    _native.model_end_rollback(urls, model)


def _resume(sources: list[str], kw: dict[str, Any]) -> None:
    for s in sources:
        _native.sync_rollback(s, "resume", **kw)


def _wait(
    model: str, urls: list[str], attempt: str, step: str, names: list[str], timeout_s: float
) -> dict[str, Any]:
    """Waits until every named witness answered ``step`` of ``attempt``."""
    deadline = time.monotonic() + timeout_s
    while True:
        answers = {}
        for w in witnesses(model, urls):
            a = w.get("answers", {}).get(attempt)
            if w["name"] in names and a and a.get("step") == step:
                answers[w["name"]] = a
        if len(answers) == len(names):
            return answers
        if time.monotonic() > deadline:
            missing = sorted(set(names) - set(answers))
            raise UnavailableError(
                f"rollback step '{step}': witnesses {', '.join(missing)} did not answer within "
                f"{timeout_s:g} s; writes stay paused: run the rollback again to finish it"
            )
        time.sleep(0.05)
