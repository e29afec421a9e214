//! Dissemination bindings: a store's sync port (`embstore.Store.serve_sync`), a follower that
//! keeps a store current from one (`embstore.Store.follow`), and a table's sync counters.

use std::time::Duration;

use std::sync::Arc;

use embstore_sync::{FollowOptions, Follower, ServeOptions, Source, SyncServer, TableSync};
use embstore_table::sync::SyncOptions;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::table::PyStore;
use crate::{detached, to_py_err};

/// A running sync port (see `embstore.SyncPort`).
#[pyclass(module = "embstore._native", name = "SyncServer", frozen)]
pub(crate) struct PySyncServer {
    inner: Mutex<Option<SyncServer>>,
    addr: String,
    /// The registration in etcd as a primary of a data centre, when asked for.
    directory: Mutex<Option<Arc<embstore_sync::Directory>>>,
}

#[pymethods]
impl PySyncServer {
    #[new]
    #[pyo3(signature = (store, listen, token=None, parts=None, tls_cert=None, tls_key=None, tls_client_ca=None, use_cache=None, tombstone_horizon_ms=None, etcd=None, dc=None, advertise=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: &PyStore,
        listen: &str,
        token: Option<String>,
        parts: Option<u32>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_client_ca: Option<std::path::PathBuf>,
        use_cache: Option<bool>,
        tombstone_horizon_ms: Option<u64>,
        etcd: Option<Vec<String>>,
        dc: Option<String>,
        advertise: Option<String>,
    ) -> PyResult<Self> {
        let tls = crate::tls::serving_tls(tls_cert, tls_key, tls_client_ca)?;
        let options = ServeOptions {
            token,
            sync: serve_options(&store.inner, parts, use_cache, tombstone_horizon_ms)?,
            tls,
        };
        let s = detached(py, || SyncServer::start(store.inner.clone(), listen, options))
            .map_err(to_py_err)?;
        let addr = s.addr().to_string();
        // A primary of `dc` in etcd: replicas there and elsewhere find this port (the trainer
        // serves its own sync port, and registers it, from the training process).
        let directory = match (etcd, dc) {
            (Some(etcd), Some(dc)) => {
                let advertised = match advertise {
                    Some(a) => a,
                    None if s.addr().ip().is_unspecified() => {
                        detached(py, || s.stop());
                        return Err(to_py_err(embstore_table::Error::invalid(format!(
                            "the sync port listens on {addr}, which replicas cannot dial: pass \
                             advertise='HOST:PORT' (the address they reach it at) to register it \
                             in etcd"
                        ))));
                    }
                    None => addr.clone(),
                };
                let me = embstore_sync::Member {
                    dc,
                    replica: store.inner.replica(),
                    addr: advertised,
                    primary: true,
                    status: String::new(),
                };
                let ttl = embstore_sync::discovery::DEFAULT_TTL;
                let dir = match detached(py, || embstore_sync::Directory::start(&etcd, me, ttl)) {
                    Ok(d) => d,
                    Err(e) => {
                        detached(py, || s.stop());
                        return Err(to_py_err(e));
                    }
                };
                let held = store.inner.clone();
                dir.set_report(Box::new(move || {
                    format!("primary tables={}", held.tables().join(","))
                }));
                Some(dir)
            }
            _ => None,
        };
        Ok(Self { addr, inner: Mutex::new(Some(s)), directory: Mutex::new(directory) })
    }

    #[getter]
    fn address(&self) -> String {
        self.addr.clone()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.lock().as_ref().map(|s| s.stats()).unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("connections", s.connections)?;
        d.set_item("refused", s.refused)?;
        d.set_item("bytes_in", s.bytes_in)?;
        d.set_item("bytes_out", s.bytes_out)?;
        d.set_item("pulls", s.pulls)?;
        d.set_item("parts", s.parts)?;
        d.set_item("prioritised_pulls", s.prioritised_pulls)?;
        d.set_item("prioritised_rows", s.prioritised_rows)?;
        d.set_item("parts_inline", s.parts_inline)?;
        d.set_item("bytes_out_raw", s.bytes_out_raw)?;
        d.set_item("frames_out", s.frames_out)?;
        d.set_item("packed_out", s.packed_out)?;
        d.set_item("changed_bytes", s.changed_bytes)?;
        d.set_item("part_bytes", s.part_bytes)?;
        d.set_item("part_rows", s.part_rows)?;
        d.set_item("value_bytes", s.value_bytes)?;
        Ok(d)
    }

    fn stop(&self, py: Python<'_>) {
        // Deregistered first: replicas stop choosing this port before it closes.
        if let Some(d) = self.directory.lock().take() {
            detached(py, || d.stop());
        }
        if let Some(s) = self.inner.lock().take() {
            detached(py, || s.stop());
        }
    }
}

/// The sync options a port serves with: a store that syncs already (it follows a source, or
/// followed one, or serves a port) keeps its own, and an option asked for that differs from
/// them is an error; otherwise the defaults with what was asked.
fn serve_options(
    store: &embstore_table::Store,
    parts: Option<u32>,
    use_cache: Option<bool>,
    tombstone_horizon_ms: Option<u64>,
) -> PyResult<SyncOptions> {
    let base = store.sync_options();
    let mut asked = base.clone().unwrap_or_default();
    asked.parts = parts.unwrap_or(asked.parts);
    asked.use_cache = use_cache.unwrap_or(asked.use_cache);
    asked.tombstone_horizon_ms = tombstone_horizon_ms.unwrap_or(asked.tombstone_horizon_ms);
    match base {
        Some(have) if have != asked => Err(to_py_err(embstore_table::Error::invalid(format!(
            "this store syncs already (it follows or followed a source, or serves a sync port) \
             with {have}; serve_sync asked for {asked}: leave parts, use_cache and \
             tombstone_horizon_s out to serve with the store's"
        )))),
        _ => Ok(asked),
    }
}

/// A running follower (see `embstore.Store.follow`).
#[pyclass(module = "embstore._native", name = "Follower", frozen)]
pub(crate) struct PyFollower {
    inner: Mutex<Option<Follower>>,
    /// The registration in etcd, when the source is found there.
    directory: Mutex<Option<Arc<embstore_sync::Directory>>>,
}

pub(crate) fn status_dict<'py>(py: Python<'py>, s: &TableSync) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("table", &s.table)?;
    d.set_item("source", &s.source)?;
    d.set_item("connected", s.connected)?;
    d.set_item("caught_up", s.caught_up)?;
    d.set_item("parts_pending", s.parts_pending)?;
    d.set_item("lag_ms_p50", s.lag_ms_p50)?;
    d.set_item("lag_ms_p99", s.lag_ms_p99)?;
    d.set_item("last_round_ms", s.last_round_ms)?;
    d.set_item("rounds", s.rounds)?;
    d.set_item("pulls", s.pulls)?;
    d.set_item("parts", s.parts)?;
    d.set_item("parts_from_cache", s.parts_from_cache)?;
    d.set_item("parts_skipped", s.parts_skipped)?;
    d.set_item("parts_inline", s.parts_inline)?;
    d.set_item("rows_applied", s.rows_applied)?;
    d.set_item("bytes_in", s.bytes_in)?;
    d.set_item("bytes_out", s.bytes_out)?;
    d.set_item("errors", s.errors)?;
    d.set_item("last_error", &s.last_error)?;
    d.set_item("reply_lag_ms", s.reply_lag_ms)?;
    d.set_item("congested", s.congested)?;
    d.set_item("congestions", s.congestions)?;
    d.set_item("prioritised_pulls", s.prioritised_pulls)?;
    d.set_item("prioritised_rows", s.prioritised_rows)?;
    Ok(d)
}

#[pymethods]
impl PyFollower {
    #[new]
    #[pyo3(signature = (store, source, token=String::new(), tables=Vec::new(), with_state=false, wait_ms=1000, tls_ca=None, tls_cert=None, tls_key=None, tls_domain=None, etcd=None, dc=None, priority=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: &PyStore,
        source: &str,
        token: String,
        tables: Vec<String>,
        with_state: bool,
        wait_ms: u32,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_domain: Option<String>,
        etcd: Option<Vec<String>>,
        dc: Option<String>,
        priority: bool,
    ) -> PyResult<Self> {
        let tls = crate::tls::sync_client_tls(tls_ca, tls_cert, tls_key, tls_domain)?;
        let mut options =
            FollowOptions { token, tables, with_state, wait_ms, tls, ..FollowOptions::default() };
        if !priority {
            options.priority = None;
        }
        let inner = store.inner.clone();
        let (f, directory) = detached(py, || match (etcd, dc) {
            // Registered in etcd without a sync port: it pulls from its data centre's leader
            // (or a primary while there is none) and is never a leader itself.
            (Some(etcd), Some(dc)) => {
                let me = embstore_sync::Member {
                    dc,
                    replica: inner.replica(),
                    addr: String::new(),
                    primary: false,
                    status: String::new(),
                };
                let ttl = embstore_sync::discovery::DEFAULT_TTL;
                let dir = embstore_sync::Directory::start(&etcd, me, ttl)?;
                let source = Source::Directory(dir.clone());
                let f = Follower::start_with(inner, source, options);
                if f.is_err() {
                    dir.stop();
                }
                Ok((f?, Some(dir)))
            }
            _ => Ok((Follower::start(inner, source, options)?, None)),
        })
        .map_err(to_py_err)?;
        Ok(Self { inner: Mutex::new(Some(f)), directory: Mutex::new(directory) })
    }

    // The follower's mutex is only ever taken with the GIL released, and not held while
    // waiting: a thread that waits for it while holding the GIL would deadlock with one that
    // holds it and waits for the GIL.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let all = detached(py, || self.view().map(|v| v.status()).unwrap_or_default());
        all.iter().map(|s| status_dict(py, s)).collect()
    }

    fn wait_caught_up(&self, py: Python<'_>, timeout_s: f64) -> bool {
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        detached(py, || self.view().is_some_and(|v| v.wait_caught_up(timeout)))
    }

    fn stop(&self, py: Python<'_>) {
        detached(py, || {
            let f = self.inner.lock().take();
            if let Some(f) = f {
                f.stop();
            }
            let d = self.directory.lock().take();
            if let Some(d) = d {
                d.stop();
            }
        });
    }
}

impl PyFollower {
    fn view(&self) -> Option<embstore_sync::StatusView> {
        self.inner.lock().as_ref().map(|f| f.status_view())
    }
}

/// The sync members registered in etcd (for `embstore status --etcd`).
#[pyfunction]
pub(crate) fn sync_members<'py>(
    py: Python<'py>,
    etcd: Vec<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let members = detached(py, || embstore_sync::discovery::members(&etcd)).map_err(to_py_err)?;
    members
        .iter()
        .map(|m| {
            let d = PyDict::new(py);
            d.set_item("dc", &m.dc)?;
            d.set_item("replica", m.replica)?;
            d.set_item("addr", &m.addr)?;
            d.set_item("primary", m.primary)?;
            d.set_item("status", &m.status)?;
            Ok(d)
        })
        .collect()
}

/// A rollback's request to the sync port at `source` (Ekko Fig 5): `op` "pause" (with
/// `reason`), "resume", or "write" (`keys`, `values` `[n, D]` and `removed` `[n]`: a removed
/// key's values are ignored) on `table` ("" for every table, pause and resume only). Returns
/// the tables or rows it changed.
#[pyfunction]
#[pyo3(signature = (source, op, table="", reason="", keys=None, values=None, removed=None, token=String::new(), tls_ca=None, tls_cert=None, tls_key=None, tls_domain=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn sync_rollback(
    py: Python<'_>,
    source: &str,
    op: &str,
    table: &str,
    reason: &str,
    keys: Option<numpy::PyReadonlyArray1<'_, u64>>,
    values: Option<numpy::PyReadonlyArray2<'_, f32>>,
    removed: Option<numpy::PyReadonlyArray1<'_, bool>>,
    token: String,
    tls_ca: Option<std::path::PathBuf>,
    tls_cert: Option<std::path::PathBuf>,
    tls_key: Option<std::path::PathBuf>,
    tls_domain: Option<String>,
) -> PyResult<u64> {
    use embstore_sync::wire::Rollback;
    let table = table.to_owned();
    let request = match op {
        "pause" => Rollback::Pause { table, reason: reason.to_owned() },
        "resume" => Rollback::Resume { table },
        "write" => {
            let (Some(keys), Some(values), Some(removed)) = (keys, values, removed) else {
                return Err(crate::errors::InvalidArgumentError::new_err(
                    "a rollback write needs keys, values and removed",
                ));
            };
            let (keys, values, removed) = (keys.as_array(), values.as_array(), removed.as_array());
            if values.nrows() != keys.len() || removed.len() != keys.len() {
                return Err(crate::errors::ShapeError::new_err(format!(
                    "a rollback write of {} keys needs {0} rows of values and {0} removed flags, \
                     got {} and {}",
                    keys.len(),
                    values.nrows(),
                    removed.len()
                )));
            }
            let rows = keys
                .iter()
                .zip(values.rows())
                .zip(removed.iter())
                .map(|((&k, v), &gone)| (k, (!gone).then(|| v.to_vec())))
                .collect();
            Rollback::Write { table, rows }
        }
        other => {
            return Err(crate::errors::InvalidArgumentError::new_err(format!(
                "op must be 'pause', 'resume' or 'write', got {other:?}"
            )))
        }
    };
    let tls = crate::tls::sync_client_tls(tls_ca, tls_cert, tls_key, tls_domain)?;
    let options = FollowOptions { token, tls, ..FollowOptions::default() };
    detached(py, || embstore_sync::follower::rollback(source, &options, &request))
        .map_err(to_py_err)
}
