//! # embstore-python: the native module `embstore._native`
//!
//! All PyO3 code lives here. Python is the API: the classes in `python/embstore` wrap these
//! native objects and normalise arguments; this module converts, releases the GIL around long
//! native calls ([`detached`]), and maps every Rust error to one Python exception class from
//! `embstore.errors` ([`to_py_err`]).

use embstore_common::{Error, ErrorKind};
use embstore_index::{Config, NeighborHash};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod cache;
mod metrics;
mod model;
mod priority;
mod ps;
mod serving;
mod sync;
mod table;
mod tls;

mod errors {
    pyo3::import_exception!(embstore.errors, EmbstoreError);
    pyo3::import_exception!(embstore.errors, InvalidArgumentError);
    pyo3::import_exception!(embstore.errors, ShapeError);
    pyo3::import_exception!(embstore.errors, CapacityError);
    pyo3::import_exception!(embstore.errors, TableNotFoundError);
    pyo3::import_exception!(embstore.errors, TableExistsError);
    pyo3::import_exception!(embstore.errors, KeyNotFoundError);
    pyo3::import_exception!(embstore.errors, NonFiniteError);
    pyo3::import_exception!(embstore.errors, StorageError);
    pyo3::import_exception!(embstore.errors, CorruptionError);
    pyo3::import_exception!(embstore.errors, NoSpaceError);
    pyo3::import_exception!(embstore.errors, StoreLockedError);
    pyo3::import_exception!(embstore.errors, StoreClosedError);
    pyo3::import_exception!(embstore.errors, NotFoundError);
    pyo3::import_exception!(embstore.errors, UnsupportedFormatError);
    pyo3::import_exception!(embstore.errors, UnavailableError);
    pyo3::import_exception!(embstore.errors, RollingBackError);
    pyo3::import_exception!(embstore.errors, PermissionDeniedError);
}

/// The one mapping from error kinds to Python exception classes (index, table, cache and
/// serving errors alike). Each class also derives from the built-in that fits (see
/// `embstore/errors.py`); `python/tests/test_errors.py` raises every kind through here.
pub(crate) fn to_py_err(err: Error) -> PyErr {
    let msg = err.to_string();
    match err.kind() {
        ErrorKind::InvalidArgument => errors::InvalidArgumentError::new_err(msg),
        ErrorKind::ShapeMismatch => errors::ShapeError::new_err(msg),
        ErrorKind::TableNotFound => errors::TableNotFoundError::new_err(msg),
        ErrorKind::TableExists => errors::TableExistsError::new_err(msg),
        ErrorKind::KeyNotFound => errors::KeyNotFoundError::new_err(msg),
        ErrorKind::NonFinite => errors::NonFiniteError::new_err(msg),
        ErrorKind::Corruption => errors::CorruptionError::new_err(msg),
        ErrorKind::Io => errors::StorageError::new_err(msg),
        ErrorKind::Capacity => errors::CapacityError::new_err(msg),
        ErrorKind::NoSpace => errors::NoSpaceError::new_err(msg),
        ErrorKind::Locked => errors::StoreLockedError::new_err(msg),
        ErrorKind::Closed => errors::StoreClosedError::new_err(msg),
        ErrorKind::NotFound => errors::NotFoundError::new_err(msg),
        ErrorKind::Unsupported => errors::UnsupportedFormatError::new_err(msg),
        ErrorKind::Unavailable => errors::UnavailableError::new_err(msg),
        ErrorKind::PermissionDenied => errors::PermissionDeniedError::new_err(msg),
        // An unknown policy, codec or table id is a bad argument to the caller.
        ErrorKind::UnknownName => errors::InvalidArgumentError::new_err(msg),
        ErrorKind::Backing => errors::StorageError::new_err(msg),
        ErrorKind::RollingBack => errors::RollingBackError::new_err(msg),
        _ => errors::EmbstoreError::new_err(msg),
    }
}

/// The names of every error kind, for the test of [`to_py_err`] (a kind added in Rust fails
/// that test until the test's table, and so this mapping, names its class).
#[pyfunction]
fn _error_kinds() -> Vec<String> {
    ErrorKind::ALL.iter().map(|k| format!("{k:?}")).collect()
}

/// Raises the Python exception that an error of the kind named `kind` (as [`_error_kinds`]
/// names it) with `message` raises: the test seam of [`to_py_err`].
#[pyfunction]
fn _raise_error(kind: &str, message: &str) -> PyResult<()> {
    let Some(&kind) = ErrorKind::ALL.iter().find(|k| format!("{k:?}") == kind) else {
        return Err(errors::InvalidArgumentError::new_err(format!("unknown error kind {kind:?}")));
    };
    Err(to_py_err(Error::new(kind, message)))
}

/// Runs `f` with the GIL released: every native call over a batch goes through here.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    py.detach(f)
}

/// A NeighborHash index from u64 keys to payloads below 2**52 (see `embstore.NeighborHash`).
#[pyclass(module = "embstore._native", name = "NeighborHash")]
struct PyNeighborHash {
    inner: NeighborHash,
}

#[pymethods]
impl PyNeighborHash {
    #[new]
    #[pyo3(signature = (slots=8, max_load_factor=0.8, huge_pages=true))]
    fn new(slots: usize, max_load_factor: f64, huge_pages: bool) -> PyResult<Self> {
        if !(max_load_factor > 0.0 && max_load_factor < 1.0) {
            return Err(errors::InvalidArgumentError::new_err(format!(
                "max_load_factor must be in (0, 1), got {max_load_factor}"
            )));
        }
        let config = Config { slots, max_load_factor, huge_pages };
        NeighborHash::with_config(config).map(|inner| Self { inner }).map_err(to_py_err)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, key: u64) -> bool {
        self.inner.contains_key(key)
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn insert(&mut self, key: u64, payload: u64) -> PyResult<Option<u64>> {
        self.inner.insert(key, payload).map_err(to_py_err)
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.inner.get(key)
    }

    fn remove(&mut self, key: u64) -> Option<u64> {
        self.inner.remove(key)
    }

    fn clear(&mut self) {
        self.inner.clear()
    }

    fn insert_batch(&mut self, py: Python<'_>, keys: Vec<u64>, payloads: Vec<u64>) -> PyResult<()> {
        let inner = &mut self.inner;
        detached(py, || inner.insert_batch(&keys, &payloads)).map_err(to_py_err)
    }

    fn get_batch(&self, py: Python<'_>, keys: Vec<u64>) -> PyResult<Vec<Option<u64>>> {
        let inner = &self.inner;
        let out = detached(py, || {
            let mut out = vec![0; keys.len()];
            inner.get_batch(&keys, &mut out).map(|_| out)
        })
        .map_err(to_py_err)?;
        Ok(out.into_iter().map(|p| (p != embstore_index::MISSING).then_some(p)).collect())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = &self.inner;
        let s = detached(py, || inner.stats());
        let d = PyDict::new(py);
        d.set_item("len", s.len)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("load_factor", s.load_factor)?;
        d.set_item("apcl", s.apcl)?;
        d.set_item("longest_chain", s.longest_chain)?;
        d.set_item("displaced", s.displaced)?;
        d.set_item("bytes", s.bytes)?;
        Ok(d)
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        detached(py, || inner.check_invariants()).map_err(PyTypeError::new_err)
    }

    fn __repr__(&self) -> String {
        format!("NeighborHash(len={}, capacity={})", self.inner.len(), self.inner.capacity())
    }
}

/// Whether batch hashing uses AVX2 on this CPU.
#[pyfunction]
fn simd_available() -> bool {
    embstore_index::hash::simd_available()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_PAYLOAD", embstore_index::MAX_PAYLOAD)?;
    m.add_class::<PyNeighborHash>()?;
    m.add_class::<table::PyStore>()?;
    m.add_class::<ps::PyPs>()?;
    m.add_class::<ps::PyPsWorker>()?;
    m.add_class::<table::PyTable>()?;
    m.add_class::<table::PyExport>()?;
    m.add_class::<metrics::PyMetricsEndpoint>()?;
    m.add_class::<serving::PyServer>()?;
    m.add_class::<sync::PySyncServer>()?;
    m.add_class::<sync::PyFollower>()?;
    m.add_class::<model::PyModelMonitor>()?;
    m.add_class::<serving::PyClient>()?;
    m.add_class::<cache::PyInferenceCache>()?;
    m.add_class::<cache::PySurrogates>()?;
    m.add_function(wrap_pyfunction!(cache::evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(cache::build_surrogates, m)?)?;
    m.add_function(wrap_pyfunction!(cache::synthetic_trace, m)?)?;
    m.add("CACHE_POLICIES", embstore_cache::PolicyConfig::NAMES)?;
    m.add("STORE_POLICIES", cache::STORE_POLICIES)?;
    m.add("CACHE_CODECS", embstore_cache::codec::CodecKind::NAMES)?;
    m.add_function(wrap_pyfunction!(simd_available, m)?)?;
    m.add_function(wrap_pyfunction!(_error_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(_raise_error, m)?)?;
    m.add_function(wrap_pyfunction!(table::inspect_dir, m)?)?;
    m.add_function(wrap_pyfunction!(serving::admin, m)?)?;
    m.add_function(wrap_pyfunction!(serving::roll, m)?)?;
    m.add_function(wrap_pyfunction!(serving::publish, m)?)?;
    m.add_function(wrap_pyfunction!(serving::cluster, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_members, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_state_json, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_list, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_record_t_max, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_begin_rollback, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_end_rollback, m)?)?;
    m.add_function(wrap_pyfunction!(model::etcd_get, m)?)?;
    m.add_function(wrap_pyfunction!(model::etcd_range, m)?)?;
    m.add_function(wrap_pyfunction!(model::etcd_put_if, m)?)?;
    m.add_function(wrap_pyfunction!(model::etcd_delete, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_rollback, m)?)?;
    m.add("ON_MISS", embstore_table::OnMiss::NAMES)?;
    m.add("OPTIMIZERS", embstore_table::Optimizer::NAMES)?;
    m.add("INITIALIZERS", embstore_table::Initializer::NAMES)?;
    m.add("MAX_EMBEDDING_DIM", embstore_table::MAX_EMBEDDING_DIM)?;
    m.add("MAX_REPLICA", embstore_table::MAX_REPLICA)?;
    m.add("BENCH_HOOKS", cfg!(feature = "bench-hooks"))?;
    Ok(())
}
