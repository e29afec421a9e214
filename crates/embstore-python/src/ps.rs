//! The parameter server (`embstore.ps`): `embstore_ps::Ps` over a store's tables.

use std::sync::Arc;

use embstore_ps::{Cluster, Consistency, Masters, Options, Ps, Replan, TableMasters, Worker};
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::table::{slice, PyTable};
use crate::{detached, errors, to_py_err};

/// A parameter server over tables of one store (see `embstore.ps.ParameterServer`).
#[pyclass(module = "embstore._native", name = "Ps", frozen)]
pub(crate) struct PyPs {
    inner: Ps,
    /// Across processes: this process's part.
    cluster: Option<Arc<Cluster>>,
}

/// One worker's handle.
#[pyclass(module = "embstore._native", name = "PsWorker", frozen)]
pub(crate) struct PyPsWorker {
    inner: Worker,
}

fn stats_dict<'py>(py: Python<'py>, pairs: &[(&str, f64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in pairs {
        if v.fract() == 0.0 && v.abs() < 9e15 && !k.ends_with("_s") {
            d.set_item(k, *v as i64)?;
        } else {
            d.set_item(k, *v)?;
        }
    }
    Ok(d)
}

#[pymethods]
impl PyPs {
    #[new]
    #[pyo3(signature = (tables, workers, slack=None, variant="all", early_ratio=0.1, cpb=0.05,
        thread_cache_rows=None, replan="warn", rank=None, addrs=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tables: Vec<PyRef<'_, PyTable>>,
        workers: usize,
        slack: Option<u32>,
        variant: &str,
        early_ratio: f64,
        cpb: f64,
        thread_cache_rows: Option<usize>,
        replan: &str,
        rank: Option<usize>,
        addrs: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let mut opts = Options::variant(variant).map_err(to_py_err)?;
        opts.consistency = match slack {
            None => Consistency::Bsp,
            Some(slack) => Consistency::Ssp { slack },
        };
        opts.early_ratio = early_ratio;
        opts.cpb = cpb;
        opts.thread_cache_rows = thread_cache_rows;
        opts.replan = Replan::parse(replan).map_err(to_py_err)?;
        let tables = tables.iter().map(|t| t.inner.clone()).collect();
        let local = Arc::new(TableMasters::new(tables).map_err(to_py_err)?);
        let (masters, cluster): (Arc<dyn Masters>, _) = match (rank, addrs) {
            (Some(rank), Some(addrs)) => {
                let addrs = addrs
                    .iter()
                    .map(|a| {
                        a.parse().map_err(|e| {
                            errors::InvalidArgumentError::new_err(format!("address {a:?}: {e}"))
                        })
                    })
                    .collect::<PyResult<Vec<std::net::SocketAddr>>>()?;
                let cluster =
                    detached(py, || Cluster::start(rank, addrs, local)).map_err(to_py_err)?;
                (Arc::new(cluster.masters().map_err(to_py_err)?), Some(cluster))
            }
            (None, None) => (local, None),
            _ => {
                return Err(errors::InvalidArgumentError::new_err(
                    "rank and addrs go together (a parameter server across processes)",
                ))
            }
        };
        let inner = Ps::new(masters, workers, opts).map_err(to_py_err)?;
        Ok(Self { inner, cluster })
    }

    /// Across processes: moves placed rows back where the distributed store looks for them
    /// (every process together) and stops serving. Returns the rows this process handed back.
    fn close(&self, py: Python<'_>) -> PyResult<u64> {
        let Some(c) = &self.cluster else { return Ok(0) };
        let moved = detached(py, || c.unplace()).map_err(to_py_err)?;
        detached(py, || c.sync(u32::MAX)).map_err(to_py_err)?;
        c.stop();
        Ok(moved)
    }

    fn worker(&self, w: usize) -> PyResult<PyPsWorker> {
        Ok(PyPsWorker { inner: self.inner.worker(w).map_err(to_py_err)? })
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }

    fn tables(&self) -> Vec<String> {
        self.inner.tables().to_vec()
    }

    fn dims(&self) -> Vec<usize> {
        self.inner.dims().to_vec()
    }

    fn clocks(&self) -> Vec<u32> {
        self.inner.clocks()
    }

    fn start_gather(&self, py: Python<'_>, virtual_: bool) -> PyResult<()> {
        let ps = &self.inner;
        detached(py, || ps.start_gather(virtual_)).map_err(to_py_err)
    }

    fn finish_gather<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let ps = &self.inner;
        let s = detached(py, || ps.finish_gather()).map_err(to_py_err)?;
        plan_dict(py, &s)
    }

    fn plan_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner.plan_stats().map(|s| plan_dict(py, &s)).transpose()
    }

    /// Worker `w`'s gathered accesses: (table, key, op) with op 0 read, 1 update.
    fn gathered(&self, w: usize) -> Vec<(u32, u64, u8)> {
        self.inner
            .gathered(w)
            .into_iter()
            .map(|(t, k, op)| (t, k, u8::from(op == embstore_ps::Op::Update)))
            .collect()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        stats_dict(
            py,
            &[
                ("clocks", s.clocks as f64),
                ("reads", s.reads as f64),
                ("updates", s.updates as f64),
                ("overflow", s.overflow as f64),
                ("fetches", s.fetches as f64),
                ("prefetch_rows", s.prefetch_rows as f64),
                ("prefetch_requests", s.prefetch_requests as f64),
                ("pushed_rows", s.pushed_rows as f64),
                ("push_requests", s.push_requests as f64),
                ("bytes_read", s.bytes_read as f64),
                ("bytes_pushed", s.bytes_pushed as f64),
                ("wait_s", s.wait_s),
                ("overflow_warnings", s.overflow_warnings as f64),
                ("replans", s.replans as f64),
            ],
        )
    }
}

fn plan_dict<'py>(py: Python<'py>, s: &embstore_ps::PlanStats) -> PyResult<Bound<'py, PyDict>> {
    stats_dict(
        py,
        &[
            ("accesses", s.accesses as f64),
            ("clocks", s.clocks as f64),
            ("rows", s.rows as f64),
            ("bytes", s.bytes as f64),
            ("early_rows", s.early_rows as f64),
            ("prefetch_rows", s.prefetch_rows as f64),
            ("prefetch_frames", s.prefetch_frames as f64),
            ("thread_cache_rows", s.thread_cache_rows as f64),
            ("contention_rows", s.contention_rows as f64),
            ("placement_moves", s.placement_moves as f64),
            ("merge_s", s.merge_s),
            ("thread_cache_s", s.thread_cache_s),
            ("static_s", s.static_s),
        ],
    )
}

#[pymethods]
impl PyPsWorker {
    #[getter]
    fn id(&self) -> usize {
        self.inner.id()
    }

    #[getter]
    fn clock_now(&self) -> u32 {
        self.inner.clock_now()
    }

    #[getter]
    fn in_virtual_gather(&self) -> bool {
        self.inner.in_virtual_gather()
    }

    fn read(
        &self,
        py: Python<'_>,
        table: usize,
        keys: PyReadonlyArray1<'_, u64>,
        mut out: PyReadwriteArray2<'_, f32>,
    ) -> PyResult<()> {
        let keys = slice(&keys, "keys")?;
        if !out.is_c_contiguous() {
            return Err(errors::ShapeError::new_err("out must be C-contiguous"));
        }
        let out = out
            .as_slice_mut()
            .map_err(|_| errors::ShapeError::new_err("out must be C-contiguous"))?;
        let w = &self.inner;
        detached(py, || w.read(table, keys, out)).map_err(to_py_err)
    }

    fn update(
        &self,
        py: Python<'_>,
        table: usize,
        keys: PyReadonlyArray1<'_, u64>,
        deltas: PyReadonlyArray2<'_, f32>,
    ) -> PyResult<()> {
        let keys = slice(&keys, "keys")?;
        let deltas = deltas
            .as_slice()
            .map_err(|_| errors::ShapeError::new_err("deltas must be C-contiguous"))?;
        let w = &self.inner;
        detached(py, || w.update(table, keys, deltas)).map_err(to_py_err)
    }

    fn clock(&self, py: Python<'_>) -> PyResult<()> {
        let w = &self.inner;
        detached(py, || w.clock()).map_err(to_py_err)
    }
}
