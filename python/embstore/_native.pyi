"""Type stubs for the native module built from crates/embstore-python."""

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__version__: str
MAX_PAYLOAD: int
ON_MISS: tuple[str, ...]  # lookup's on_miss modes, defined once in embstore_table::OnMiss
OPTIMIZERS: tuple[str, ...]
INITIALIZERS: tuple[str, ...]
MAX_EMBEDDING_DIM: int
MAX_REPLICA: int
BENCH_HOOKS: bool  # built with the bench-hooks feature (make bench-table)

def simd_available() -> bool: ...
def _error_kinds() -> list[str]: ...
def _raise_error(kind: str, message: str) -> None: ...

class NeighborHash:
    def __init__(
        self, slots: int = 8, max_load_factor: float = 0.8, huge_pages: bool = True
    ) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: int) -> bool: ...
    @property
    def capacity(self) -> int: ...
    def insert(self, key: int, payload: int) -> int | None: ...
    def get(self, key: int) -> int | None: ...
    def remove(self, key: int) -> int | None: ...
    def clear(self) -> None: ...
    def insert_batch(self, keys: list[int], payloads: list[int]) -> None: ...
    def get_batch(self, keys: list[int]) -> list[int | None]: ...
    def stats(self) -> dict[str, float | int | None]: ...
    def check_invariants(self) -> None: ...

# Embedded tables (crates/embstore-python/src/table.rs). Arguments arrive normalised by
# embstore.store: ids uint64[B] C-contiguous, rows float32[B, D] C-contiguous.

_Ids = npt.NDArray[np.uint64]
_Rows = npt.NDArray[np.float32]

class Store:
    def __init__(
        self,
        replica: int = 0,
        path: str | None = None,
        memory_budget_bytes: int | None = None,
        background_eviction: bool = False,
        eviction: str = "lru_lfu",
    ) -> None: ...
    def witness_tables(self, bucket_ms: int, dir: str | os.PathLike[str] | None = None) -> None: ...
    @property
    def memory_budget(self) -> tuple[int, int] | None: ...
    @property
    def pinned_bytes(self) -> int: ...
    def close(self) -> None: ...
    @staticmethod
    def restore(
        checkpoint: str,
        path: str,
        num_shards: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Store: ...
    @property
    def path(self) -> str | None: ...
    def recovery(self) -> dict[str, Any] | None: ...
    def flush(self) -> dict[str, int]: ...
    def compact(self, progress: Callable[[int, int], None] | None = None) -> dict[str, int]: ...
    def checkpoint(
        self,
        path: str,
        since: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]: ...
    def create_table(self, spec: dict[str, Any]) -> Table: ...
    def table(self, name: str) -> Table: ...
    def tables(self) -> list[str]: ...
    def drop_table(self, name: str) -> None: ...
    def load_table(self, path: str | os.PathLike[str], name: str | None = None) -> Table: ...

class Table:
    @property
    def name(self) -> str: ...
    @property
    def tiered(self) -> bool: ...
    def pin(self, ids: npt.NDArray[np.uint64]) -> int: ...
    def unpin(self, ids: npt.NDArray[np.uint64]) -> None: ...
    def prefetch(self, ids: npt.NDArray[np.uint64]) -> int: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def state_dim(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def uid(self) -> int: ...
    def set_step(self, step: int) -> None: ...
    def set_priority(
        self,
        k: float | None = None,
        rule: object | None = None,
        model: int = 0,
        window_s: float = 60.0,
        half_life_s: float = 10.0,
    ) -> None: ...
    def priority_stats(self) -> dict[str, object] | None: ...
    def set_prioritised_sync(self, on: bool) -> None: ...
    def witness_start(
        self, bucket_ms: int, dir: str | os.PathLike[str] | None = None
    ) -> dict[str, int]: ...
    def witness_stats(self) -> dict[str, int] | None: ...
    def witness_flush(
        self, t_healthy_ms: int, corrupted: list[tuple[int, int | None]]
    ) -> int | None: ...
    def witness_diff(
        self, keep_new_rows: bool
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.bool_]]: ...
    def witness_clear_logs(self) -> None: ...
    def pause_writes(self, reason: str | None = None) -> None: ...
    def writes_paused(self) -> str | None: ...
    def significant_versions(self, ids: np.ndarray) -> np.ndarray: ...
    def config(self) -> dict[str, object]: ...
    def __len__(self) -> int: ...
    def lookup(
        self,
        ids: _Ids,
        out: _Rows,
        on_miss: str = "init",
        found: npt.NDArray[np.bool_] | None = None,
    ) -> None: ...
    def apply_gradients(self, ids: _Ids, grads: _Rows, lr: float | None = None) -> int: ...
    def assign(self, ids: _Ids, values: _Rows) -> None: ...
    def import_(
        self,
        ids: _Ids,
        values: _Rows,
        state: _Rows | None = None,
        versions: npt.NDArray[np.uint64] | None = None,
        replicas: npt.NDArray[np.uint32] | None = None,
        update_counts: npt.NDArray[np.uint64] | None = None,
        last_update_ms: npt.NDArray[np.uint64] | None = None,
        optimizer: str | None = None,
        step: int | None = None,
    ) -> None: ...
    def remove(self, ids: _Ids) -> int: ...
    def contains(self, ids: _Ids) -> npt.NDArray[np.bool_]: ...
    def initial_rows(self, ids: _Ids, out: _Rows) -> None: ...
    def meta(self, ids: _Ids) -> tuple[npt.NDArray[np.generic], ...]: ...
    def clear(self) -> None: ...
    def evict_expired(self) -> int: ...
    def evict_older_than(self, cutoff_ms: int) -> int: ...
    def save(self, path: str | os.PathLike[str]) -> int: ...
    def load(self, path: str | os.PathLike[str]) -> int: ...
    def export(self, chunk_rows: int) -> Export: ...
    def stats(self) -> dict[str, object]: ...
    def sync_stats(self) -> dict[str, int] | None: ...
    def sync_parts_of(self, ids: _Ids) -> np.ndarray: ...
    def index_stats(self) -> dict[str, object]: ...
    # Only with the bench-hooks feature (BENCH_HOOKS):
    def _native_lookup_ns(self, ids: _Ids, iters: int) -> float: ...
    def _last_native_ns(self) -> int: ...

class Export:
    def __iter__(self) -> Export: ...
    def __next__(self) -> tuple[npt.NDArray[np.generic], ...]: ...

def inspect_dir(
    path: str, verify: bool = False, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]: ...

class MetricsEndpoint:
    def __init__(
        self,
        listen: str,
        source: Callable[[], str],
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
    ) -> None: ...
    @property
    def address(self) -> str: ...
    def stop(self) -> None: ...

class Server:
    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None,
        listen: str,
        memory_budget_bytes: int | None = None,
        max_batch: int = ...,
        admin: bool = False,
        metrics: str | None = None,
        read_token: str | None = None,
        admin_token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        etcd: list[str] | None = None,
        advertise: str | None = None,
        lease_ttl_s: float = 10.0,
        data_dir: str | os.PathLike[str] | None = None,
        sync_listen: str | None = None,
        sync_token: str | None = None,
        follow: str | None = None,
        replica: int | None = None,
        sync_events: str | None = None,
        sync_etcd: list[str] | None = None,
        dc: str | None = None,
        sync_advertise: str | None = None,
        sync_tls_ca: str | None = None,
        sync_tls_cert: str | None = None,
        sync_tls_key: str | None = None,
        sync_tls_domain: str | None = None,
        sync_cache: bool = True,
        sync_shard_versions: bool = True,
        sync_tombstone_horizon_ms: int = 3_600_000,
        sync_with_state: bool = False,
        sync_priority: bool = True,
        sync_precision: str | None = None,
        catch_up_timeout_s: float = 60.0,
        framed_listen: str | None = "auto",
        framed_unix: str | os.PathLike[str] | None = None,
        **renamed: Any,
    ) -> None:
        """``fast_listen=`` and ``fast_unix=``, the old names of ``framed_listen`` and
        ``framed_unix``, still work as keywords (deprecated: a DeprecationWarning)."""
    @property
    def address(self) -> str: ...
    @property
    def metrics_address(self) -> str | None: ...
    @property
    def framed_address(self) -> str | None: ...
    @property
    def sync_address(self) -> str | None: ...
    def sync_status(self) -> list[dict[str, Any]]: ...
    @property
    def tables(self) -> list[str]: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...

class Client:
    def __init__(
        self,
        addresses: list[str],
        deadline_s: float = 5.0,
        max_restarts: int = 2,
        token: str | None = None,
        tls: tuple[str, str | None, str | None, str | None] | None = None,
        etcd: list[str] | None = None,
        transport: str = "auto",
    ) -> None: ...
    def lookup(
        self, table: str, ids: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], int]: ...
    def transport_to(self, address: str) -> str | None: ...
    def view(self) -> list[tuple[str, list[tuple[str, int, int, int, str]] | None]]: ...

def admin(
    address: str,
    op: str,
    table: str,
    version: int,
    shard: int = 0,
    num_shards: int = 1,
    checkpoint: str | None = None,
    timeout_s: float = 600.0,
    token: str | None = None,
    tls: tuple[str, str | None, str | None, str | None] | None = None,
) -> list[tuple[str, int, int, int, str]]: ...
def roll(
    table: str,
    version: int,
    checkpoint: str,
    columns: list[list[str]],
    spare: list[str],
    old_version: int | None = None,
    drain_quiet_s: float = 2.0,
    drain_max_s: float = 30.0,
    load_timeout_s: float = 600.0,
    token: str | None = None,
    tls: tuple[str, str | None, str | None, str | None] | None = None,
) -> None: ...
def publish(
    etcd: list[str],
    table: str,
    checkpoint: str,
    num_shards: int | None = None,
    max_shard_bytes: int = ...,
    replicas: int | None = None,
    drain_quiet_s: float = 2.0,
    drain_max_s: float = 30.0,
    load_timeout_s: float = 600.0,
    token: str | None = None,
    tls: tuple[str, str | None, str | None, str | None] | None = None,
) -> int: ...
def cluster(etcd: list[str]) -> tuple[list[tuple[str, str]], list[str]]: ...

# The inference cache (crates/embstore-cache through crates/embstore-python/src/cache.rs).
CACHE_POLICIES: tuple[str, ...]
STORE_POLICIES: tuple[str, ...]
CACHE_CODECS: tuple[str, ...]

class Surrogates:
    def __len__(self) -> int: ...
    @property
    def coverage(self) -> float: ...
    @property
    def version(self) -> int: ...
    def get(self, id: int) -> tuple[int, float] | None: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...
    @property
    def path(self) -> str | None: ...
    @staticmethod
    def load(path: str | os.PathLike[str]) -> Surrogates: ...
    @staticmethod
    def open(path: str | os.PathLike[str]) -> Surrogates: ...
    def heap_bytes(self) -> int: ...

def build_surrogates(
    ids: npt.NDArray[np.uint64],
    rows: npt.NDArray[np.float32],
    counts: npt.NDArray[np.uint64] | None = None,
    k: int = 10,
    metric: str = "cosine",
    max_dist: float = 0.5,
    popularity: bool = True,
    version: int = 0,
) -> Surrogates: ...

class InferenceCache:
    def __init__(
        self,
        tables: list[Table],
        memory_budget_bytes: int,
        policy: str,
        tiers: list[tuple[str, float]],
        *,
        policy_params: dict[str, Any] | None = None,
        surrogates: list[Surrogates | None] | None = None,
        surrogate_share: float = 0.04,
        max_approx_per_request: int = 2,
        max_surrogate_dist: float = ...,
        demote: bool = True,
        shards: int = 1,
        on_miss: str = "zeros",
        l3_fill: str = "background",
    ) -> None: ...
    def lookup(
        self,
        tables: npt.NDArray[np.uint16],
        ids: npt.NDArray[np.uint64],
        offsets: npt.NDArray[np.uint64],
        out: npt.NDArray[np.float32],
        sources: npt.NDArray[np.uint8] | None,
    ) -> None: ...
    def lookup_columns(
        self,
        cols: list[npt.NDArray[np.int64]],
        out: npt.NDArray[np.float32],
        sources: npt.NDArray[np.uint8] | None,
    ) -> None: ...
    @staticmethod
    def policy_keys(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]: ...
    @property
    def dim(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def reset_stats(self) -> None: ...
    def sync_l3(self) -> None: ...
    def clear(self) -> None: ...
    def evaluate(
        self,
        keys: npt.NDArray[np.uint64],
        offsets: npt.NDArray[np.uint64],
        mode: str = "prefix",
        warm_frac: float = 0.5,
    ) -> dict[str, Any]: ...

def evaluate(
    keys: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint64],
    policy: Any,
    capacity: int,
    mode: str = "prefix",
    policy_params: dict[str, Any] | None = None,
    max_score: int | None = None,
    warm_frac: float = 0.5,
) -> dict[str, Any]: ...
def synthetic_trace(
    num_requests: int = 200_000,
    num_tables: int = 26,
    num_contexts: int = 200_000,
    zipf_alpha: float = 1.0,
    min_table_size: int = 10,
    max_table_size: int = 200_000,
    rho: float = 0.7,
    drift: float = 0.0,
    seed: int = 0,
) -> npt.NDArray[np.uint64]: ...

class SyncServer:
    def __init__(
        self,
        store: Store,
        listen: str,
        token: str | None = None,
        parts: int | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        use_cache: bool | None = None,
        tombstone_horizon_ms: int | None = None,
        etcd: list[str] | None = None,
        dc: str | None = None,
        advertise: str | None = None,
    ) -> None: ...
    @property
    def address(self) -> str: ...
    def stats(self) -> dict[str, int]: ...
    def stop(self) -> None: ...

class Follower:
    def __init__(
        self,
        store: Store,
        source: str,
        token: str = "",
        tables: list[str] = ...,
        with_state: bool = False,
        wait_ms: int = 1000,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_domain: str | None = None,
        etcd: list[str] | None = None,
        dc: str | None = None,
        priority: bool = True,
    ) -> None: ...
    def status(self) -> list[dict[str, Any]]: ...
    def wait_caught_up(self, timeout_s: float) -> bool: ...
    def stop(self) -> None: ...

def sync_members(etcd: list[str]) -> list[dict[str, Any]]: ...

class ModelMonitor:
    def __init__(
        self,
        model: str,
        etcd: list[str] | None = None,
        baseline: str | None = None,
        window_s: float = 30.0,
        lateness_s: float = 30.0,
        delta_bad: float = 0.05,
        delta_ok: float = 0.02,
        z_bad: float = 3.0,
        n_bad: int = 3,
        n_ok: int = 3,
        min_trials: int = 1,
        latency_p99_s: float = 0.0,
    ) -> None: ...
    def report(self, variant: str, window_start_ms: int, successes: int, trials: int) -> bool: ...
    def advance(self, watermark_ms: int) -> list[dict[str, object]]: ...
    @property
    def state(self) -> str: ...
    @property
    def late_reports(self) -> int: ...
    @property
    def model(self) -> str: ...

def model_state_json(etcd: list[str], model: str) -> str | None: ...
def model_list(etcd: list[str]) -> list[str]: ...
def model_record_t_max(etcd: list[str], model: str, witness: str, t_max_ms: int) -> bool: ...
def model_begin_rollback(etcd: list[str], model: str) -> None: ...
def model_end_rollback(etcd: list[str], model: str) -> bool: ...
def etcd_get(etcd: list[str], key: str) -> tuple[bytes, int] | None: ...
def etcd_range(etcd: list[str], prefix: str) -> list[tuple[str, bytes, int]]: ...
def etcd_put_if(etcd: list[str], key: str, value: bytes, revision: int) -> bool: ...
def etcd_delete(etcd: list[str], key: str) -> None: ...
def sync_rollback(
    source: str,
    op: str,
    table: str = "",
    reason: str = "",
    keys: npt.NDArray[np.uint64] | None = None,
    values: npt.NDArray[np.float32] | None = None,
    removed: npt.NDArray[np.bool_] | None = None,
    token: str = "",
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_domain: str | None = None,
) -> int: ...
