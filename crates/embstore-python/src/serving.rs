//! The batch-query service from Python: `Server` (what `embstore serve` runs: the arguments
//! translated into an `embstore_server::process::ServeConfig`, run by its `ServerProcess`) and
//! `Client` (what `embstore.connect` returns). Each owns a tokio runtime; every blocking call
//! releases the GIL.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use embstore_client::{Client, ClientOptions};
use embstore_server::process::{Follow, FramedListen, ServeConfig, ServerProcess, SyncConfig};
use embstore_table::{Error, ErrorKind};
use numpy::{IntoPyArray, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::{PyDeprecationWarning, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::detached;
use crate::table::{slice, to_py_err};
use crate::tls::{client_tls, serving_tls, sync_client_tls, TlsPaths};

fn runtime(threads: usize) -> PyResult<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| to_py_err(Error::new(ErrorKind::Io, format!("start a tokio runtime: {e}"))))
}

/// `fast_listen` and `fast_unix`, the old names of `framed_listen` and `framed_unix`: still
/// taken as keywords, with a `DeprecationWarning`; a value given under an old name is the one
/// used. Any other extra keyword is a `TypeError`, as without `**renamed`.
fn old_names(
    py: Python<'_>,
    mut listen: Option<String>,
    mut unix: Option<PathBuf>,
    renamed: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Option<String>, Option<PathBuf>)> {
    for (key, value) in renamed.into_iter().flat_map(|d| d.iter()) {
        let old: String = key.extract()?;
        match old.as_str() {
            "fast_listen" => listen = value.extract()?,
            "fast_unix" => unix = value.extract()?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "Server() got an unexpected keyword argument '{old}'"
                )))
            }
        }
        let new = old.replacen("fast", "framed", 1);
        let message = CString::new(format!("{old} is deprecated; use {new}"))
            .expect("a keyword's name holds no NUL");
        PyErr::warn(py, py.get_type::<PyDeprecationWarning>().as_any(), &message, 1)?;
    }
    Ok((listen, unix))
}

/// A server: of every table of a store directory (static mode: each table is version 1, shard
/// 0 of 1), or empty, to be loaded through admin calls. `run()` serves until SIGINT, SIGTERM or
/// `stop()`. A thin translation onto `embstore_server::process::ServerProcess`.
#[pyclass(module = "embstore._native", name = "Server", frozen)]
pub(crate) struct PyServer {
    inner: ServerProcess,
}

/// `seconds` as a `Duration`, or `otherwise` for what none can hold (NaN, negative, infinite),
/// for the process's checks to refuse.
fn duration_or(seconds: f64, otherwise: Duration) -> Duration {
    Duration::try_from_secs_f64(seconds).unwrap_or(otherwise)
}

#[pymethods]
impl PyServer {
    #[new]
    #[pyo3(signature = (store_dir, listen, memory_budget_bytes=None, max_batch=embstore_server::DEFAULT_MAX_BATCH, admin=false, metrics=None, read_token=None, admin_token=None, tls_cert=None, tls_key=None, tls_client_ca=None, etcd=None, advertise=None, lease_ttl_s=10.0, data_dir=None, sync_listen=None, sync_token=None, follow=None, replica=None, sync_events=None, sync_etcd=None, dc=None, sync_advertise=None, sync_tls_ca=None, sync_tls_cert=None, sync_tls_key=None, sync_tls_domain=None, sync_cache=true, sync_shard_versions=true, sync_tombstone_horizon_ms=3_600_000, sync_with_state=false, sync_priority=true, sync_precision=None, catch_up_timeout_s=60.0, framed_listen=Some("auto".to_string()), framed_unix=None, **renamed))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store_dir: Option<PathBuf>,
        listen: String,
        memory_budget_bytes: Option<u64>,
        max_batch: usize,
        admin: bool,
        metrics: Option<String>,
        read_token: Option<String>,
        admin_token: Option<String>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_client_ca: Option<PathBuf>,
        etcd: Option<Vec<String>>,
        advertise: Option<String>,
        lease_ttl_s: f64,
        data_dir: Option<PathBuf>,
        sync_listen: Option<String>,
        sync_token: Option<String>,
        follow: Option<String>,
        replica: Option<u32>,
        sync_events: Option<PathBuf>,
        sync_etcd: Option<Vec<String>>,
        dc: Option<String>,
        sync_advertise: Option<String>,
        sync_tls_ca: Option<PathBuf>,
        sync_tls_cert: Option<PathBuf>,
        sync_tls_key: Option<PathBuf>,
        sync_tls_domain: Option<String>,
        sync_cache: bool,
        sync_shard_versions: bool,
        sync_tombstone_horizon_ms: u64,
        sync_with_state: bool,
        sync_priority: bool,
        sync_precision: Option<String>,
        catch_up_timeout_s: f64,
        framed_listen: Option<String>,
        framed_unix: Option<PathBuf>,
        renamed: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (framed_listen, framed_unix) = old_names(py, framed_listen, framed_unix, renamed)?;
        let precision = match sync_precision.as_deref() {
            None => None,
            Some("f32") => Some(embstore_sync::wire::Precision::F32),
            Some("f16") => Some(embstore_sync::wire::Precision::F16),
            Some(p) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "sync_precision must be 'f32' or 'f16', not {p:?}"
                )))
            }
        };
        let config = ServeConfig {
            store_dir,
            listen,
            advertise,
            memory_budget_bytes,
            data_dir,
            max_batch,
            admin,
            metrics,
            tokens: embstore_server::Tokens { read: read_token, admin: admin_token },
            tls: serving_tls(tls_cert, tls_key, tls_client_ca)?,
            etcd,
            lease_ttl: duration_or(lease_ttl_s, Duration::ZERO),
            replica,
            framed_listen: framed_listen.as_deref().map_or(FramedListen::Off, FramedListen::parse),
            framed_unix,
            sync: SyncConfig {
                listen: sync_listen,
                advertise: sync_advertise,
                token: sync_token,
                // `follow=""`: find the source in etcd.
                follow: follow.map(|f| if f.is_empty() { Follow::Etcd } else { Follow::Source(f) }),
                events: sync_events,
                etcd: sync_etcd,
                dc,
                tls: sync_client_tls(sync_tls_ca, sync_tls_cert, sync_tls_key, sync_tls_domain)?,
                use_cache: sync_cache,
                shard_versions: sync_shard_versions,
                priority: sync_priority,
                with_state: sync_with_state,
                precision,
                tombstone_horizon_ms: sync_tombstone_horizon_ms,
            },
            catch_up_timeout: duration_or(catch_up_timeout_s, Duration::MAX),
            worker_threads: 2,
        };
        let inner = detached(py, || ServerProcess::start(config)).map_err(to_py_err)?;
        Ok(Self { inner })
    }

    /// `host:port` of the framed lookup path's TCP port (`framed_listen`), if it is offered.
    #[getter]
    fn framed_address(&self) -> Option<String> {
        self.inner.framed_address().map(str::to_string)
    }

    /// `host:port` of the sync port (`sync_listen`), if one runs.
    #[getter]
    fn sync_address(&self) -> Option<String> {
        self.inner.sync_address()
    }

    /// Where each followed table stands (empty when the server follows nothing).
    fn sync_status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner.sync_status().iter().map(|s| crate::sync::status_dict(py, s)).collect()
    }

    /// `host:port` the server listens on (the port the OS chose for port 0).
    #[getter]
    fn address(&self) -> String {
        self.inner.address().to_string()
    }

    /// `host:port` of `GET /metrics`, if asked for.
    #[getter]
    fn metrics_address(&self) -> Option<String> {
        self.inner.metrics_address().map(str::to_string)
    }

    /// Names of the tables served (each as version 1).
    #[getter]
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }

    /// Serves until SIGINT, SIGTERM or `stop()`; then stops accepting, finishes the requests
    /// in flight and returns. Once only.
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, || self.inner.run(embstore_server::process::signals())).map_err(to_py_err)
    }

    /// Asks `run()` to return (from another thread).
    fn stop(&self) {
        self.inner.stop();
    }
}

/// `(table, version, shard, num_shards, state)`, as `Client.view` lists what a server holds.
type HeldRow = (String, u64, u32, u32, String);

/// A client of a fixed set of servers (see `embstore.connect`).
#[pyclass(module = "embstore._native", name = "Client", frozen)]
pub(crate) struct PyClient {
    runtime: tokio::runtime::Runtime,
    inner: Client,
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (addresses, deadline_s=5.0, max_restarts=2, token=None, tls=None, etcd=None, transport="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addresses: Vec<String>,
        deadline_s: f64,
        max_restarts: usize,
        token: Option<String>,
        tls: Option<TlsPaths>,
        etcd: Option<Vec<String>>,
        transport: &str,
    ) -> PyResult<Self> {
        let transport: embstore_client::Transport = transport.parse().map_err(to_py_err)?;
        if !(deadline_s.is_finite() && deadline_s > 0.0) {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                format!("deadline_s must be a positive number of seconds, got {deadline_s}"),
            )));
        }
        let runtime = runtime(1)?;
        let options = ClientOptions {
            deadline: Duration::from_secs_f64(deadline_s),
            max_restarts,
            token,
            tls: client_tls(tls)?,
            transport,
            ..Default::default()
        };
        let inner = detached(py, || match &etcd {
            Some(e) => runtime.block_on(Client::connect_etcd(e, options)),
            None => runtime.block_on(Client::connect(&addresses, options)),
        })
        .map_err(to_py_err)?;
        Ok(Self { runtime, inner })
    }

    /// `(values float32[B, D], found bool[B], version)` for `ids` in `table`.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        ids: PyReadonlyArray1<'py, u64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let keys = slice(&ids, "ids")?;
        let rows = detached(py, || self.runtime.block_on(self.inner.lookup(table, keys)))
            .map_err(to_py_err)?;
        let (b, d) = (rows.found.len(), rows.embedding_dim);
        let values = rows.values.into_pyarray(py).reshape([b, d])?;
        PyTuple::new(
            py,
            [
                values.into_any(),
                rows.found.into_pyarray(py).into_any(),
                rows.version.into_pyobject(py)?.into_any(),
            ],
        )
    }

    /// The transport lookups take to the server at `address` now: "framed" (the framed path over
    /// TCP), "framed-unix" (over its Unix socket) or "grpc"; `None` for an unknown address.
    fn transport_to(&self, address: &str) -> Option<&'static str> {
        self.inner.transport_to(address)
    }

    /// Per server: `(address, [(table, version, shard, num_shards, state), ...])` as last seen,
    /// or `None` for a server that has not answered.
    fn view(&self) -> Vec<(String, Option<Vec<HeldRow>>)> {
        self.inner.view().into_iter().map(|(addr, info)| (addr, info.map(held_rows))).collect()
    }
}

/// Makes an admin call (`op`: "load", "drain" or "unload") to the server at `address`; returns
/// what it holds afterwards, as `Client.view` lists it.
#[pyfunction]
#[pyo3(signature = (address, op, table, version, shard=0, num_shards=1, checkpoint=None, timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn admin(
    py: Python<'_>,
    address: String,
    op: &str,
    table: String,
    version: u64,
    shard: u32,
    num_shards: u32,
    checkpoint: Option<String>,
    timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<Vec<HeldRow>> {
    let tls = client_tls(tls)?;
    use embstore_cluster::AdminCall;
    let call = match (op, checkpoint) {
        ("load", Some(checkpoint)) => {
            AdminCall::Load { table, version, shard, num_shards, checkpoint }
        }
        ("load", None) => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "load needs a checkpoint",
            )))
        }
        ("drain", _) => AdminCall::Drain { table, version, shard: None },
        ("unload", _) => AdminCall::Unload { table, version, shard: None },
        (other, _) => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown admin call '{other}': load, drain or unload"),
            )))
        }
    };
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        return Err(to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("timeout_s must be a positive number of seconds, got {timeout_s}"),
        )));
    }
    let rt = runtime(1)?;
    let timeout = Duration::from_secs_f64(timeout_s);
    let info = detached(py, || {
        rt.block_on(embstore_cluster::admin(
            &address,
            call,
            timeout,
            token.as_deref(),
            tls.as_ref(),
        ))
    })
    .map_err(to_py_err)?;
    Ok(held_rows(info))
}

fn held_rows(info: embstore_proto::v1::ServerInfo) -> Vec<HeldRow> {
    info.held
        .into_iter()
        .map(|h| {
            let state = h.state().as_str_name().to_lowercase();
            (h.table, h.version, h.shard, h.num_shards, state)
        })
        .collect()
}

/// Rolls `table` to `version` over a fixed cluster (`embstore_cluster::roll`), printing a line
/// per step.
#[pyfunction]
#[pyo3(signature = (table, version, checkpoint, columns, spare, old_version=None, drain_quiet_s=2.0, drain_max_s=30.0, load_timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn roll(
    py: Python<'_>,
    table: String,
    version: u64,
    checkpoint: String,
    columns: Vec<Vec<String>>,
    spare: Vec<String>,
    old_version: Option<u64>,
    drain_quiet_s: f64,
    drain_max_s: f64,
    load_timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<()> {
    let (drain_quiet, drain_max, load_timeout) =
        roll_timing(drain_quiet_s, drain_max_s, load_timeout_s)?;
    let plan = embstore_cluster::RollPlan {
        table,
        version,
        checkpoint,
        old_version,
        old_num_shards: None,
        columns,
        spare,
        drain_quiet,
        drain_max,
        load_timeout,
        token,
        tls: client_tls(tls)?,
    };
    let rt = runtime(1)?;
    detached(py, || rt.block_on(embstore_cluster::roll(&plan, print_step))).map_err(to_py_err)
}

/// Publishes `checkpoint` as the next version of `table` over the cluster in etcd at `etcd`
/// (`embstore_cluster::publish`), printing a line per step; returns the version now served.
#[pyfunction]
#[pyo3(signature = (etcd, table, checkpoint, num_shards=None, max_shard_bytes=1 << 30, replicas=None, drain_quiet_s=2.0, drain_max_s=30.0, load_timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn publish(
    py: Python<'_>,
    etcd: Vec<String>,
    table: String,
    checkpoint: String,
    num_shards: Option<u32>,
    max_shard_bytes: u64,
    replicas: Option<u32>,
    drain_quiet_s: f64,
    drain_max_s: f64,
    load_timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<u64> {
    if replicas == Some(0) {
        return Err(to_py_err(Error::new(ErrorKind::InvalidArgument, "replicas must be >= 1")));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let (drain_quiet, drain_max, load_timeout) =
        roll_timing(drain_quiet_s, drain_max_s, load_timeout_s)?;
    // Without a shard count, the checkpoint's size picks one: measured here, where the table
    // crate is linked (the control plane does not read checkpoints).
    let checkpoint_bytes = match num_shards {
        Some(_) => None,
        None => Some(embstore_table::checkpoint_table_bytes(Path::new(&checkpoint), &table)),
    };
    let p = embstore_cluster::Publish {
        table,
        checkpoint,
        num_shards,
        checkpoint_bytes,
        max_shard_bytes,
        replicas,
        coordinator: format!("{}:{}", host.trim(), std::process::id()),
        drain_quiet,
        drain_max,
        load_timeout,
        token,
        tls: client_tls(tls)?,
    };
    let rt = runtime(1)?;
    detached(py, || {
        rt.block_on(async {
            let etcd = Arc::new(embstore_cluster::Etcd::connect(&etcd, Duration::from_secs(3))?);
            embstore_cluster::publish(etcd, &p, print_step).await
        })
    })
    .map_err(to_py_err)
}

/// A cluster as etcd holds it: `[(instance, address)]` registered, and the control records as
/// JSON strings.
type ClusterRows = (Vec<(String, String)>, Vec<String>);

/// The members and control records of the cluster in etcd at `etcd`.
#[pyfunction]
pub(crate) fn cluster(py: Python<'_>, etcd: Vec<String>) -> PyResult<ClusterRows> {
    let rt = runtime(1)?;
    detached(py, || {
        rt.block_on(async {
            let etcd = embstore_cluster::Etcd::connect(&etcd, Duration::from_secs(3))?;
            let members = embstore_cluster::members(&etcd).await?;
            let controls = embstore_cluster::controls(&etcd).await?;
            let json = controls
                .into_iter()
                .map(|(c, _)| String::from_utf8_lossy(&c.to_json()).into_owned())
                .collect();
            Ok::<_, Error>((members, json))
        })
    })
    .map_err(to_py_err)
}

fn print_step(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "embstore publish: {line}");
    let _ = out.flush();
}

/// A roll's drain-quiet, drain-max and load timeout, checked.
fn roll_timing(quiet: f64, max: f64, load: f64) -> PyResult<(Duration, Duration, Duration)> {
    Ok((
        seconds("drain_quiet_s", quiet)?,
        seconds("drain_max_s", max)?,
        seconds("load_timeout_s", load)?,
    ))
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{what} must be a number of seconds >= 0, got {s}"),
        )))
    }
}
