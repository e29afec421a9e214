//! Native `Store` and `Table`: thin wrappers over `embstore_table`, used by `embstore.store` and
//! `embstore.table`.
//!
//! Arguments arrive normalised by the Python layer: ids as C-contiguous `uint64[B]`, rows as
//! C-contiguous `float32[B, D]`. Every batch call releases the GIL while it runs.

use std::sync::Arc;
use std::time::Duration;

use embstore_table::{
    Dtype, Export, Initializer, NonFinite, OnMiss, Optimizer, RowChunk, RowMeta, Store, Table,
    TableConfig, Version,
};
use numpy::{
    IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
#[cfg(feature = "bench-hooks")]
use std::sync::atomic::{AtomicU64, Ordering};

use crate::detached;
use crate::errors;

pub(crate) use crate::to_py_err;

fn invalid(msg: String) -> PyErr {
    errors::InvalidArgumentError::new_err(msg)
}

/// A table's configuration as it crosses from Python: the dict `TableSpec._native_spec()` builds
/// (types and integer ranges already checked there). Its fields' meaning (dims, powers of two,
/// optimizer parameters) is checked once, by `TableConfig`'s own validation in the core, so a
/// message names the field the same way wherever a table is created.
#[derive(FromPyObject)]
struct TableSpecArg {
    #[pyo3(item)]
    name: String,
    #[pyo3(item)]
    embedding_dim: usize,
    #[pyo3(item)]
    init_kind: String,
    #[pyo3(item)]
    init_params: Py<PyDict>,
    #[pyo3(item)]
    opt_kind: String,
    #[pyo3(item)]
    opt_params: Py<PyDict>,
    #[pyo3(item)]
    num_shards: usize,
    #[pyo3(item)]
    seed: u64,
    #[pyo3(item)]
    admission_min_count: u32,
    #[pyo3(item)]
    admission_sketch_width: usize,
    #[pyo3(item)]
    ttl_seconds: Option<f64>,
    #[pyo3(item)]
    skip_non_finite: bool,
    #[pyo3(item)]
    huge_pages: bool,
    /// `"fp32"`, `"bf16"` or `"fp16"` (the Python layer maps torch and numpy dtypes to these).
    #[pyo3(item)]
    dtype: String,
}

impl TableSpecArg {
    fn into_config(self, py: Python<'_>) -> PyResult<TableConfig> {
        let ttl = match self.ttl_seconds {
            Some(s) => {
                Some(Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(
                    || invalid(format!("ttl must be a positive number of seconds, got {s}")),
                )?)
            }
            None => None,
        };
        Ok(TableConfig {
            name: self.name,
            embedding_dim: self.embedding_dim,
            initializer: from_dict(&self.init_kind, self.init_params.bind(py), |n, g, f| {
                Initializer::from_params(n, g, f)
            })?,
            optimizer: from_dict(&self.opt_kind, self.opt_params.bind(py), |n, g, f| {
                Optimizer::from_params(n, g, f)
            })?,
            num_shards: self.num_shards,
            seed: self.seed,
            admission_min_count: self.admission_min_count,
            admission_sketch_width: self.admission_sketch_width,
            ttl,
            non_finite: if self.skip_non_finite { NonFinite::Skip } else { NonFinite::Reject },
            huge_pages: self.huge_pages,
            dtype: Dtype::from_name(&self.dtype).map_err(crate::to_py_err)?,
        })
    }
}

pub(crate) fn slice<'a, T: numpy::Element>(
    a: &'a PyReadonlyArray1<'_, T>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| errors::ShapeError::new_err(format!("{what} must be contiguous")))
}

fn rows<'a>(a: &'a PyReadonlyArray2<'_, f32>, what: &str) -> PyResult<&'a [f32]> {
    a.as_slice().map_err(|_| errors::ShapeError::new_err(format!("{what} must be C-contiguous")))
}

/// The config of `kind` (an optimizer or initializer) from a dict of named parameters, through
/// the one definition of their names in `embstore_table`.
fn from_dict<T>(
    kind: &str,
    p: &Bound<'_, PyDict>,
    build: impl Fn(&str, &[&str], &dyn Fn(&str) -> Option<f32>) -> embstore_table::Result<T>,
) -> PyResult<T> {
    let mut given: Vec<(String, f32)> = Vec::new();
    for (k, v) in p.iter() {
        given.push((k.extract()?, v.extract()?));
    }
    let names: Vec<&str> = given.iter().map(|(k, _)| k.as_str()).collect();
    let get = |name: &str| given.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    build(kind, &names, &get).map_err(to_py_err)
}

/// `x` as the shortest decimal that reads back as the same f32 (0.1, not 0.10000000149).
fn short(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// `{"name": ..., param: value, ...}`.
fn params_dict<'py>(
    py: Python<'py>,
    name: &str,
    params: &[(&str, f32)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", name)?;
    for (k, v) in params {
        d.set_item(*k, short(*v))?;
    }
    Ok(d)
}

/// The data of `out`, which must be a C-contiguous `float32[b, d]` array.
fn out_rows<'a>(
    out: &'a mut PyReadwriteArray2<'_, f32>,
    b: usize,
    d: usize,
) -> PyResult<&'a mut [f32]> {
    let shape = out.shape();
    if shape != [b, d] {
        return Err(errors::ShapeError::new_err(format!(
            "out must be [{b}, {d}] for {b} ids, got {shape:?}"
        )));
    }
    // `as_slice_mut` also takes a Fortran-ordered array, whose rows it would scramble.
    if !out.is_c_contiguous() {
        return Err(errors::ShapeError::new_err("out must be a C-contiguous float32 [B, D] array"));
    }
    out.as_slice_mut().map_err(|_| errors::ShapeError::new_err("out must be C-contiguous"))
}

/// Native store (see `embstore.Store`).
#[pyclass(module = "embstore._native", name = "Store", frozen)]
pub(crate) struct PyStore {
    pub(crate) inner: Arc<Store>,
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (replica=0, path=None, memory_budget_bytes=None, background_eviction=false, eviction="lru_lfu"))]
    fn new(
        py: Python<'_>,
        replica: u32,
        path: Option<std::path::PathBuf>,
        memory_budget_bytes: Option<u64>,
        background_eviction: bool,
        eviction: &str,
    ) -> PyResult<Self> {
        let eviction = embstore_table::EvictionConfig::parse(eviction).map_err(to_py_err)?;
        let store = match path {
            None => Store::with_replica(replica),
            Some(path) => detached(py, || {
                let mut options = embstore_table::StoreOptions::default()
                    .with_replica(replica)
                    .with_background_eviction(background_eviction)
                    .with_eviction(eviction);
                if let Some(b) = memory_budget_bytes {
                    options = options.with_memory_budget(b);
                }
                Store::open_with_options(
                    &path,
                    &options,
                    Arc::new(embstore_table::disk::vfs::RealFs),
                )
            }),
        };
        Ok(Self { inner: Arc::new(store.map_err(to_py_err)?) })
    }

    #[staticmethod]
    #[pyo3(signature = (checkpoint, path, num_shards=None, progress=None))]
    fn restore(
        py: Python<'_>,
        checkpoint: std::path::PathBuf,
        path: std::path::PathBuf,
        num_shards: Option<usize>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let store = detached(py, || {
            Store::restore(&checkpoint, &path, num_shards, |done, total| {
                report(&progress, done, total)
            })
        });
        Ok(Self { inner: Arc::new(store.map_err(to_py_err)?) })
    }

    /// (limit, bytes in use) of a store with a memory budget.
    #[getter]
    fn memory_budget(&self) -> Option<(u64, u64)> {
        self.inner.memory_budget().map(|b| (b.limit(), b.used()))
    }

    /// Bytes of the rows pinned in all the tables of a store with a memory budget (0 without).
    #[getter]
    fn pinned_bytes(&self) -> u64 {
        self.inner.memory_budget().map_or(0, |b| b.pinned())
    }

    #[getter]
    fn path(&self) -> Option<std::path::PathBuf> {
        self.inner.path().map(|p| p.to_path_buf())
    }

    fn recovery<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(r) = self.inner.recovery() else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("created", r.created)?;
        d.set_item("tables", r.tables)?;
        d.set_item("segments", r.segments)?;
        d.set_item("records", r.records)?;
        d.set_item("torn_manifest_bytes", r.torn_manifest_bytes)?;
        d.set_item("orphan_segments", r.orphan_segments.clone())?;
        Ok(Some(d))
    }

    /// Flushes and closes (see `Store::close`); on an error the store stays open.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        detached(py, || inner.close()).map_err(to_py_err)
    }

    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = &self.inner;
        flush_dict(py, detached(py, || inner.flush()).map_err(to_py_err)?)
    }

    #[pyo3(signature = (progress=None))]
    fn compact<'py>(
        &self,
        py: Python<'py>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inner = &self.inner;
        let s = detached(py, || inner.compact(|d, t| report(&progress, d, t)));
        flush_dict(py, s.map_err(to_py_err)?)
    }

    #[pyo3(signature = (path, since=None, progress=None))]
    fn checkpoint<'py>(
        &self,
        py: Python<'py>,
        path: std::path::PathBuf,
        since: Option<std::path::PathBuf>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inner = &self.inner;
        let r = detached(py, || {
            inner.checkpoint_with_progress(&path, since.as_deref(), |d, t| {
                report(&progress, d as usize, t as usize)
            })
        })
        .map_err(to_py_err)?;
        let d = PyDict::new(py);
        d.set_item("path", r.path)?;
        d.set_item("id", r.id)?;
        d.set_item("parent_id", r.parent_id)?;
        d.set_item("tables", r.tables)?;
        d.set_item("segments", r.segments)?;
        d.set_item("bytes", r.bytes)?;
        Ok(d)
    }

    /// Creates the table `spec` describes: `embstore.TableSpec`'s native dict, one value.
    /// Every table a follower readies from now on becomes a witness (`embstore.Witness`).
    #[pyo3(signature = (bucket_ms, dir=None))]
    fn witness_tables(&self, bucket_ms: u64, dir: Option<std::path::PathBuf>) -> PyResult<()> {
        self.inner.witness_tables(bucket_ms, dir.as_deref()).map_err(to_py_err)
    }

    fn create_table(&self, py: Python<'_>, spec: TableSpecArg) -> PyResult<PyTable> {
        let config = spec.into_config(py)?;
        self.inner.create_table(config).map(PyTable::new).map_err(to_py_err)
    }

    fn table(&self, name: &str) -> PyResult<PyTable> {
        self.inner.table(name).map(PyTable::new).map_err(to_py_err)
    }

    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }

    fn drop_table(&self, name: &str) -> PyResult<()> {
        self.inner.drop_table(name).map_err(to_py_err)
    }

    #[pyo3(signature = (path, name=None))]
    fn load_table(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        name: Option<String>,
    ) -> PyResult<PyTable> {
        let inner = &self.inner;
        detached(py, || inner.load_table(&path, name.as_deref()))
            .map(PyTable::new)
            .map_err(to_py_err)
    }
}

/// What a flush or a compaction wrote, as the dict `Store.flush`/`Store.compact` return.
fn flush_dict(py: Python<'_>, s: embstore_table::FlushStats) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("segments", s.segments)?;
    d.set_item("records", s.records)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("compactions", s.compactions)?;
    d.set_item("compacted_segments", s.compacted_segments)?;
    d.set_item("spills_adopted", s.spills_adopted)?;
    Ok(d)
}

/// Calls the Python `progress(done, total)` callback, if any, with the GIL; an exception in it
/// is printed and otherwise ignored (progress output must not fail the work).
fn report(progress: &Option<Py<PyAny>>, done: usize, total: usize) {
    if let Some(cb) = progress {
        Python::attach(|py| {
            if let Err(e) = cb.call1(py, (done, total)) {
                e.print(py);
            }
        });
    }
}

/// Reads a store directory or checkpoint without opening it: `verify=False` reads the manifest,
/// `verify=True` every record and checksum (see `embstore.inspect` / `embstore.verify`).
#[pyfunction]
#[pyo3(signature = (path, verify=false, progress=None))]
pub(crate) fn inspect_dir<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
    verify: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let r = detached(py, || match verify {
        true => embstore_table::verify(&path, |d, t| report(&progress, d, t)),
        false => embstore_table::inspect(&path),
    })
    .map_err(to_py_err)?;
    let d = PyDict::new(py);
    d.set_item("manifest_format", r.manifest_format)?;
    d.set_item("segment_format", r.segment_format)?;
    d.set_item("checkpoint", r.checkpoint)?;
    d.set_item("torn_manifest_bytes", r.torn_manifest_bytes)?;
    d.set_item("orphan_segments", r.orphan_segments)?;
    d.set_item("unaccounted_segments", r.unaccounted_segments)?;
    d.set_item("damage", r.damage)?;
    d.set_item("restarts", r.restarts)?;
    let tables = pyo3::types::PyList::empty(py);
    for t in r.tables {
        let td = PyDict::new(py);
        td.set_item("name", t.name)?;
        td.set_item("embedding_dim", t.embedding_dim)?;
        td.set_item("optimizer", t.optimizer)?;
        td.set_item("step", t.step)?;
        td.set_item("segments", t.segments)?;
        td.set_item("records", t.records)?;
        td.set_item("disk_bytes", t.disk_bytes)?;
        td.set_item("rows", t.rows)?;
        td.set_item("memory_bytes", t.memory_bytes)?;
        tables.append(td)?;
    }
    d.set_item("tables", tables)?;
    Ok(d)
}

/// Native table (see `embstore.Table`).
#[pyclass(module = "embstore._native", name = "Table", frozen)]
pub(crate) struct PyTable {
    pub(crate) inner: Arc<Table>,
    /// Nanoseconds the last `lookup` spent inside `Table::lookup` (GIL released), so that a
    /// benchmark can split a Python call into the native work and the call's own overhead.
    /// Only in builds with the `bench-hooks` feature (`make bench-table`).
    #[cfg(feature = "bench-hooks")]
    last_native_ns: AtomicU64,
}

impl PyTable {
    fn new(inner: Arc<Table>) -> Self {
        Self {
            inner,
            #[cfg(feature = "bench-hooks")]
            last_native_ns: AtomicU64::new(0),
        }
    }
}

fn meta_arrays<'py>(py: Python<'py>, meta: &[RowMeta]) -> [Bound<'py, PyAny>; 4] {
    let col = |f: &dyn Fn(&RowMeta) -> u64| meta.iter().map(f).collect::<Vec<u64>>();
    [
        col(&|m| m.version.timestamp).into_pyarray(py).into_any(),
        meta.iter().map(|m| m.version.replica).collect::<Vec<u32>>().into_pyarray(py).into_any(),
        col(&|m| m.update_count).into_pyarray(py).into_any(),
        col(&|m| m.last_update_ms).into_pyarray(py).into_any(),
    ]
}

fn chunk_tuple<'py>(
    py: Python<'py>,
    d: usize,
    sd: usize,
    c: RowChunk,
) -> PyResult<Bound<'py, PyTuple>> {
    let n = c.len();
    let (optimizer, step) = (c.optimizer, c.step);
    let ids: Vec<i64> = c.ids.iter().map(|&k| k as i64).collect();
    let values = c.values.into_pyarray(py).reshape([n, d])?;
    let state = c.state.into_pyarray(py).reshape([n, sd])?;
    let [version, replica, count, last] = meta_arrays(py, &c.meta);
    PyTuple::new(
        py,
        [
            ids.into_pyarray(py).into_any(),
            values.into_any(),
            state.into_any(),
            version,
            replica,
            count,
            last,
            optimizer.into_pyobject(py)?.into_any(),
            step.into_pyobject(py)?.into_any(),
        ],
    )
}

#[pymethods]
impl PyTable {
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_owned()
    }

    #[getter]
    fn embedding_dim(&self) -> usize {
        self.inner.dim()
    }

    #[getter]
    fn state_dim(&self) -> usize {
        self.inner.state_dim()
    }

    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// Scores this table's writes for prioritised sync (`k`: the percentile at or above which
    /// a write is significant; `rule`: None for the paper's, or a callable scoring a write
    /// step's rows in one call), or stops (`k` None).
    #[pyo3(signature = (k=None, rule=None, model=0, window_s=60.0, half_life_s=10.0))]
    fn set_priority(
        &self,
        k: Option<f64>,
        rule: Option<Py<PyAny>>,
        model: u32,
        window_s: f64,
        half_life_s: f64,
    ) -> PyResult<()> {
        crate::priority::set_priority(&self.inner, k, rule, model, window_s, half_life_s)
    }

    /// What the table's prioritiser has seen and its significant stores hold.
    fn priority_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        crate::priority::priority_stats(&self.inner, py)
    }

    /// Makes this syncing table a witness (see `embstore.Witness`).
    #[pyo3(signature = (bucket_ms, dir=None))]
    fn witness_start<'py>(
        &self,
        py: Python<'py>,
        bucket_ms: u64,
        dir: Option<std::path::PathBuf>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = detached(py, || self.inner.witness_start(bucket_ms, dir.as_deref()))
            .map_err(to_py_err)?;
        witness_dict(py, &s)
    }

    /// What the witness holds, or None when the table is not one.
    fn witness_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if !self.inner.witnesses() {
            return Ok(None);
        }
        let s = self.inner.witness_stats().map_err(to_py_err)?;
        witness_dict(py, &s).map(Some)
    }

    /// Flushes the logs up to a healthy decision at `t_healthy_ms` (corrupted intervals as
    /// `(start_ms, end_ms or None)`); the new t_max or None.
    fn witness_flush(
        &self,
        py: Python<'_>,
        t_healthy_ms: u64,
        corrupted: Vec<(u64, Option<u64>)>,
    ) -> PyResult<Option<u64>> {
        let corrupted: Vec<_> = corrupted
            .into_iter()
            .map(|(start_ms, end_ms)| embstore_replication::witness::Corrupted { start_ms, end_ms })
            .collect();
        detached(py, || self.inner.witness_flush(t_healthy_ms, &corrupted)).map_err(to_py_err)
    }

    /// The rollback's diff: (keys [n], values [n, D], removed [n]).
    #[allow(clippy::type_complexity)]
    fn witness_diff<'py>(
        &self,
        py: Python<'py>,
        keep_new_rows: bool,
    ) -> PyResult<(
        Bound<'py, PyArray1<u64>>,
        Bound<'py, numpy::PyArray2<f32>>,
        Bound<'py, PyArray1<bool>>,
    )> {
        let d = self.inner.dim();
        let diff = detached(py, || self.inner.witness_diff(keep_new_rows)).map_err(to_py_err)?;
        let keys: Vec<u64> = diff.iter().map(|(k, _)| *k).collect();
        let removed: Vec<bool> = diff.iter().map(|(_, v)| v.is_none()).collect();
        let mut values = vec![0f32; diff.len() * d];
        for (i, (_, v)) in diff.iter().enumerate() {
            if let Some(v) = v {
                values[i * d..][..d].copy_from_slice(v);
            }
        }
        let values = numpy::ndarray::Array2::from_shape_vec((diff.len(), d), values)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        Ok((keys.into_pyarray(py), values.into_pyarray(py), removed.into_pyarray(py)))
    }

    /// Drops the witness's unflushed logs.
    fn witness_clear_logs(&self) -> PyResult<()> {
        self.inner.witness_clear_logs().map_err(to_py_err)
    }

    /// Refuses writes with RollingBackError (`reason`), or takes them again (None).
    #[pyo3(signature = (reason=None))]
    fn pause_writes(&self, reason: Option<&str>) {
        self.inner.pause_writes(reason);
    }

    /// Why writes are refused, or None.
    fn writes_paused(&self) -> Option<String> {
        self.inner.writes_paused()
    }

    /// Prioritised sync on or off (off: the significant stores emptied, prioritised pulls
    /// refused: a rollback).
    fn set_prioritised_sync(&self, on: bool) -> PyResult<()> {
        self.inner.set_prioritised_sync(on).map_err(to_py_err)
    }

    /// Per id, the version timestamp of its newest significant write here (0: none).
    fn significant_versions<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let ids = ids.as_slice()?.to_vec();
        let v = detached(py, || self.inner.significant_versions(&ids)).map_err(to_py_err)?;
        Ok(v.into_iter()
            .map(|v| v.map_or(0, |v| v.timestamp))
            .collect::<Vec<u64>>()
            .into_pyarray(py))
    }

    fn set_step(&self, step: u64) -> PyResult<()> {
        self.inner.check_live().map_err(to_py_err)?;
        self.inner.set_step(step);
        Ok(())
    }

    /// Identity of the underlying table: equal for every handle to one table, so that Python
    /// can tell two wrappers of the same table apart from two tables.
    #[getter]
    fn uid(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.config();
        let d = PyDict::new(py);
        d.set_item("name", &c.name)?;
        d.set_item("embedding_dim", c.embedding_dim)?;
        d.set_item("num_shards", c.num_shards)?;
        d.set_item("seed", c.seed)?;
        d.set_item("initializer", params_dict(py, c.initializer.name(), &c.initializer.params())?)?;
        d.set_item("optimizer", params_dict(py, c.optimizer.name(), &c.optimizer.params())?)?;
        d.set_item("admission_min_count", c.admission_min_count)?;
        d.set_item("admission_sketch_width", c.admission_sketch_width)?;
        d.set_item("ttl_seconds", c.ttl.map(|t| t.as_secs_f64()))?;
        d.set_item("skip_non_finite", c.non_finite == NonFinite::Skip)?;
        d.set_item("huge_pages", c.huge_pages)?;
        d.set_item("dtype", c.dtype.name())?;
        Ok(d)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        let t = &self.inner;
        detached(py, || t.len())
    }

    /// Writes the rows of `ids` into `out` (`float32[B, D]`, C-contiguous) and, when given,
    /// whether each id had a row into `found` (`bool[B]`). The caller allocates: a failed
    /// allocation is then Python's `MemoryError`, and a serving loop can reuse one buffer.
    #[pyo3(signature = (ids, out, on_miss="init", found=None))]
    fn lookup(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        mut out: PyReadwriteArray2<'_, f32>,
        on_miss: &str,
        found: Option<PyReadwriteArray1<'_, bool>>,
    ) -> PyResult<()> {
        let mode = OnMiss::parse(on_miss).map_err(to_py_err)?;
        let keys = slice(&ids, "ids")?;
        let out = out_rows(&mut out, keys.len(), self.inner.dim())?;
        let mut found = found;
        let found = match found.as_mut() {
            Some(f) => Some(f.as_slice_mut().map_err(|_| {
                errors::ShapeError::new_err("found must be a contiguous bool array")
            })?),
            None => None,
        };
        let t = &self.inner;
        #[cfg(feature = "bench-hooks")]
        {
            let (result, ns) = detached(py, || {
                let start = std::time::Instant::now();
                let result = t.lookup(keys, mode, out, found);
                (result, start.elapsed().as_nanos() as u64)
            });
            self.last_native_ns.store(ns, Ordering::Relaxed);
            result.map_err(to_py_err)
        }
        #[cfg(not(feature = "bench-hooks"))]
        detached(py, || t.lookup(keys, mode, out, found)).map_err(to_py_err)
    }

    #[pyo3(signature = (ids, grads, lr=None))]
    fn apply_gradients(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        grads: PyReadonlyArray2<'_, f32>,
        lr: Option<f32>,
    ) -> PyResult<usize> {
        let (keys, g) = (slice(&ids, "ids")?, rows(&grads, "grads")?);
        let t = &self.inner;
        detached(py, || t.apply_gradients(keys, g, lr)).map_err(to_py_err)
    }

    fn assign(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        values: PyReadonlyArray2<'_, f32>,
    ) -> PyResult<()> {
        let (keys, v) = (slice(&ids, "ids")?, rows(&values, "values")?);
        let t = &self.inner;
        detached(py, || t.assign(keys, v)).map_err(to_py_err)
    }

    #[pyo3(signature = (ids, values, state=None, versions=None, replicas=None, update_counts=None,
        last_update_ms=None, optimizer=None, step=None))]
    #[allow(clippy::too_many_arguments)]
    fn import_(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        values: PyReadonlyArray2<'_, f32>,
        state: Option<PyReadonlyArray2<'_, f32>>,
        versions: Option<PyReadonlyArray1<'_, u64>>,
        replicas: Option<PyReadonlyArray1<'_, u32>>,
        update_counts: Option<PyReadonlyArray1<'_, u64>>,
        last_update_ms: Option<PyReadonlyArray1<'_, u64>>,
        optimizer: Option<&str>,
        step: Option<u64>,
    ) -> PyResult<()> {
        if let Some(name) = optimizer {
            self.inner.check_optimizer(name).map_err(to_py_err)?;
        }
        let (keys, v) = (slice(&ids, "ids")?, rows(&values, "values")?);
        let s = state.as_ref().map(|s| rows(s, "state")).transpose()?;
        let meta = match (&versions, &replicas, &update_counts, &last_update_ms) {
            (None, None, None, None) => None,
            (Some(ver), Some(rep), Some(cnt), Some(last)) => {
                let (ver, rep) = (slice(ver, "versions")?, slice(rep, "replicas")?);
                let (cnt, last) = (slice(cnt, "update_counts")?, slice(last, "last_update_ms")?);
                if [ver.len(), rep.len(), cnt.len(), last.len()].iter().any(|&n| n != keys.len()) {
                    return Err(errors::ShapeError::new_err(format!(
                        "metadata arrays must each hold {} entries",
                        keys.len()
                    )));
                }
                Some(
                    (0..keys.len())
                        .map(|i| RowMeta {
                            version: Version { timestamp: ver[i], replica: rep[i] },
                            update_count: cnt[i],
                            last_update_ms: last[i],
                        })
                        .collect::<Vec<_>>(),
                )
            }
            _ => {
                return Err(invalid(
                    "give all of versions, replicas, update_counts and last_update_ms, or none"
                        .into(),
                ))
            }
        };
        let t = &self.inner;
        detached(py, || t.import(keys, v, s, meta.as_deref())).map_err(to_py_err)?;
        if let Some(step) = step {
            t.raise_step(step);
        }
        Ok(())
    }

    fn pin(&self, py: Python<'_>, ids: PyReadonlyArray1<'_, u64>) -> PyResult<u64> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        detached(py, || t.pin(keys)).map_err(to_py_err)
    }

    fn prefetch(&self, py: Python<'_>, ids: PyReadonlyArray1<'_, u64>) -> PyResult<usize> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        detached(py, || t.prefetch(keys)).map_err(to_py_err)
    }

    fn unpin(&self, py: Python<'_>, ids: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        detached(py, || t.unpin(keys));
        Ok(())
    }

    /// Whether the table has a memory tier (its store has a memory budget).
    #[getter]
    fn tiered(&self) -> bool {
        self.inner.is_tiered()
    }

    fn remove(&self, py: Python<'_>, ids: PyReadonlyArray1<'_, u64>) -> PyResult<usize> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        detached(py, || t.remove(keys)).map_err(to_py_err)
    }

    fn contains<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, u64>,
    ) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        let out = detached(py, || {
            let mut out = vec![false; keys.len()];
            t.contains(keys, &mut out).map(|_| out)
        })
        .map_err(to_py_err)?;
        Ok(out.into_pyarray(py))
    }

    /// Writes the initial values of `ids` into `out` (`float32[B, D]`).
    fn initial_rows(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        mut out: PyReadwriteArray2<'_, f32>,
    ) -> PyResult<()> {
        let keys = slice(&ids, "ids")?;
        let d = self.inner.dim();
        let out = out_rows(&mut out, keys.len(), d)?;
        let t = &self.inner;
        detached(py, || {
            for (k, row) in keys.iter().zip(out.chunks_exact_mut(d)) {
                t.initial_row(*k, row);
            }
        });
        Ok(())
    }

    /// `(found, versions, replicas, update_counts, last_update_ms)` for each id.
    fn meta<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, u64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        let metas = detached(py, || t.meta(keys)).map_err(to_py_err)?;
        let found: Vec<bool> = metas.iter().map(Option::is_some).collect();
        let metas: Vec<RowMeta> = metas.into_iter().map(Option::unwrap_or_default).collect();
        let [v, r, c, l] = meta_arrays(py, &metas);
        PyTuple::new(py, [found.into_pyarray(py).into_any(), v, r, c, l])
    }

    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let t = &self.inner;
        detached(py, || t.clear()).map_err(to_py_err)
    }

    fn evict_expired(&self, py: Python<'_>) -> PyResult<usize> {
        let t = &self.inner;
        detached(py, || t.evict_expired()).map_err(to_py_err)
    }

    fn evict_older_than(&self, py: Python<'_>, cutoff_ms: u64) -> PyResult<usize> {
        let t = &self.inner;
        detached(py, || t.evict_older_than(cutoff_ms)).map_err(to_py_err)
    }

    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<u64> {
        let t = &self.inner;
        detached(py, || t.save(&path)).map_err(to_py_err)
    }

    fn load(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<u64> {
        let t = &self.inner;
        detached(py, || t.load(&path)).map_err(to_py_err)
    }

    fn export(&self, chunk_rows: usize) -> PyResult<PyExport> {
        if chunk_rows == 0 {
            return Err(invalid("chunk_rows must be at least 1".into()));
        }
        self.inner.check_live().map_err(to_py_err)?;
        Ok(PyExport { inner: parking_lot::Mutex::new(Export::new(self.inner.clone(), chunk_rows)) })
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.inner;
        let s = detached(py, || t.stats());
        let d = PyDict::new(py);
        d.set_item("rows", s.rows)?;
        d.set_item("bytes", s.bytes_reserved)?;
        d.set_item("bytes_reserved", s.bytes_reserved)?;
        d.set_item("bytes_used", s.bytes_used)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("inserts", s.inserts)?;
        d.set_item("updates", s.updates)?;
        d.set_item("removed", s.removed)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("dropped_unadmitted", s.dropped_unadmitted)?;
        d.set_item("skipped_non_finite", s.skipped_non_finite)?;
        d.set_item("repaired_on_load", s.repaired_on_load)?;
        d.set_item("rows_on_disk", s.rows_on_disk)?;
        d.set_item("cold_reads", s.cold_reads)?;
        d.set_item("cold_read_ios", s.cold_read_ios)?;
        d.set_item("cold_read_bytes", s.cold_read_bytes)?;
        d.set_item("evicted_to_disk", s.evicted_to_disk)?;
        d.set_item("eviction_rounds", s.eviction_rounds)?;
        d.set_item("eviction_errors", s.eviction_errors)?;
        d.set_item("last_eviction_error", s.last_eviction_error)?;
        d.set_item("step", s.step)?;
        d.set_item("rows_per_shard", s.rows_per_shard)?;
        Ok(d)
    }

    /// The sync part of each id (`uint32[B]`), for a table that syncs.
    fn sync_parts_of<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
        let ids = slice(&ids, "ids")?;
        let parts =
            ids.iter().map(|&k| self.inner.sync_part_of(k)).collect::<Result<Vec<u32>, _>>();
        Ok(numpy::PyArray1::from_vec(py, parts.map_err(to_py_err)?))
    }

    fn sync_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        table_sync_stats(py, &self.inner)
    }

    fn index_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.inner;
        let s = detached(py, || t.index_stats());
        let d = PyDict::new(py);
        d.set_item("len", s.len)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("apcl", s.apcl)?;
        d.set_item("longest_chain", s.longest_chain)?;
        d.set_item("displaced", s.displaced)?;
        Ok(d)
    }

    /// Runs `iters` lookups of `ids` (`on_miss="zeros"`) inside Rust and returns the median
    /// nanoseconds per call: the native share of a Python call, for the overhead benchmark.
    #[cfg(feature = "bench-hooks")]
    fn _native_lookup_ns(
        &self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, u64>,
        iters: usize,
    ) -> PyResult<f64> {
        let keys = slice(&ids, "ids")?;
        let t = &self.inner;
        detached(py, || {
            let mut out = vec![0f32; keys.len() * t.dim()];
            let mut times = Vec::with_capacity(iters.max(1));
            for _ in 0..iters.max(1) {
                let start = std::time::Instant::now();
                t.lookup(keys, OnMiss::Zeros, &mut out, None)?;
                times.push(start.elapsed().as_nanos() as f64);
            }
            times.sort_by(f64::total_cmp);
            Ok(times[times.len() / 2])
        })
        .map_err(to_py_err)
    }

    /// Nanoseconds the last `lookup` through this object spent in native code.
    #[cfg(feature = "bench-hooks")]
    fn _last_native_ns(&self) -> u64 {
        self.last_native_ns.load(Ordering::Relaxed)
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "Table(name={:?}, embedding_dim={}, optimizer={}, num_shards={})",
            c.name,
            c.embedding_dim,
            c.optimizer.name(),
            c.num_shards
        )
    }
}

/// Iterator over a table's rows: tuples `(ids, values, state, versions, replicas,
/// update_counts, last_update_ms)`.
#[pyclass(module = "embstore._native", name = "Export", frozen)]
pub(crate) struct PyExport {
    inner: parking_lot::Mutex<Export<Arc<Table>>>,
}

#[pymethods]
impl PyExport {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let inner = &self.inner;
        let chunk = detached(py, || inner.lock().next());
        // Chunks are never empty, so the widths divide exactly.
        chunk
            .map(|c| chunk_tuple(py, c.values.len() / c.len(), c.state.len() / c.len(), c))
            .transpose()
    }
}

/// A table's sync counters as a dict, `None` for a table that does not sync.
pub(crate) fn table_sync_stats<'py>(
    py: Python<'py>,
    t: &embstore_table::Table,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    {
        if !t.syncs() {
            return Ok(None);
        }
        let s = t.sync_stats().map_err(to_py_err)?;
        let d = PyDict::new(py);
        d.set_item("parts", s.parts)?;
        d.set_item("epoch", s.epoch)?;
        d.set_item("cached_rows", s.cached_rows)?;
        d.set_item("tombstones", s.tombstones)?;
        d.set_item("pulls_cached", s.pulls_cached)?;
        d.set_item("pulls_scanned", s.pulls_scanned)?;
        d.set_item("rows_sent", s.rows_sent)?;
        d.set_item("replies_applied", s.replies_applied)?;
        d.set_item("rows_applied", s.rows_applied)?;
        d.set_item("replies_rejected", s.replies_rejected)?;
        d.set_item("d_prop_ms", s.d_prop_ms)?;
        Ok(Some(d))
    }
}

fn witness_dict<'py>(
    py: Python<'py>,
    s: &embstore_table::sync::WitnessStats,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("t_max_ms", s.t_max_ms)?;
    d.set_item("buckets", s.buckets)?;
    d.set_item("logged_keys", s.logged_keys)?;
    d.set_item("healthy_rows", s.healthy_rows)?;
    d.set_item("file_bytes", s.file_bytes)?;
    d.set_item("restored_rows", s.restored_rows)?;
    Ok(d)
}
