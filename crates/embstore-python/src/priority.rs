//! Priority of a table's writes for prioritised sync, from Python (`embstore.Priority`): the
//! paper's rule, or a Python callable that scores a write step's rows in one call.

use std::sync::Arc;

use embstore_replication::{EkkoPriority, PriorityConfig, PriorityFn, Stats, Update};
use embstore_table::sync::Priority;
use numpy::{IntoPyArray, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::to_py_err;
use embstore_table::Table;

/// A Python callable as a priority rule: `rule(u)` with `u` a dict of numpy arrays (`key`,
/// `grad_l1`, `writes`, `freshness`) and floats (`g_mean`, `f_mean`, `p_m`), returning one
/// priority per row. It runs once per write call (after its shards wrote), with no lock of
/// the store held; an error (or a wrong shape) scores the call's rows 0 and is reported once
/// as a warning.
struct PyRule {
    rule: Py<PyAny>,
    warned: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PyRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PyRule")
    }
}

impl PyRule {
    fn call(&self, updates: &[Update], stats: &[Stats]) -> PyResult<Vec<f64>> {
        Python::attach(|py| {
            let d = PyDict::new(py);
            let col = |f: &dyn Fn(&Update) -> u64| updates.iter().map(f).collect::<Vec<u64>>();
            d.set_item("key", col(&|u| u.key).into_pyarray(py))?;
            d.set_item("writes", col(&|u| u.writes).into_pyarray(py))?;
            let g: Vec<f64> = updates.iter().map(|u| u.grad_l1).collect();
            d.set_item("grad_l1", g.into_pyarray(py))?;
            let fr: Vec<f64> = stats.iter().map(|s| s.freshness).collect();
            d.set_item("freshness", fr.into_pyarray(py))?;
            let s0 = stats.first().copied().unwrap_or(Stats {
                g_mean: 0.0,
                f_mean: 0.0,
                p_m: 1.0,
                freshness: 1.0,
            });
            d.set_item("g_mean", s0.g_mean)?;
            d.set_item("f_mean", s0.f_mean)?;
            d.set_item("p_m", s0.p_m)?;
            let out = self.rule.call1(py, (d,))?;
            let np = py.import("numpy")?;
            let arr = np.call_method1("asarray", (out, "float64"))?;
            let arr = arr.cast_into::<numpy::PyArray1<f64>>().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err("a priority rule must return a 1-D array")
            })?;
            if arr.len() != updates.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "a priority rule returned {} priorities for {} rows",
                    arr.len(),
                    updates.len()
                )));
            }
            Ok(arr.to_vec()?)
        })
    }
}

impl PriorityFn for PyRule {
    fn priority(&self, u: &Update, stats: &Stats) -> f64 {
        let mut out = Vec::new();
        self.priorities(std::slice::from_ref(u), std::slice::from_ref(stats), &mut out);
        out.first().copied().unwrap_or(0.0)
    }

    fn priorities(&self, updates: &[Update], stats: &[Stats], out: &mut Vec<f64>) {
        out.clear();
        match self.call(updates, stats) {
            Ok(v) => out.extend(v),
            Err(e) => {
                out.resize(updates.len(), 0.0);
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    Python::attach(|py| {
                        let msg = format!(
                            "embstore: the table's priority rule failed ({e}); its rows score 0 \
                             (reported once)"
                        );
                        let w = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
                        let _ = PyErr::warn(py, &w, &std::ffi::CString::new(msg).unwrap(), 1);
                    });
                }
            }
        }
    }
}

/// `Table.set_priority` (see `PyTable::set_priority`).
pub(crate) fn set_priority(
    t: &Table,
    k: Option<f64>,
    rule: Option<Py<PyAny>>,
    model: u32,
    window_s: f64,
    half_life_s: f64,
) -> PyResult<()> {
    let Some(k) = k else {
        return t.set_priority(None).map_err(to_py_err);
    };
    let ms = |s: f64| if s.is_finite() && s > 0.0 { (s * 1000.0) as u64 } else { 0 };
    let config = PriorityConfig {
        k,
        window_ms: ms(window_s),
        half_life_ms: ms(half_life_s),
        ..PriorityConfig::default()
    };
    let rule: Arc<dyn PriorityFn> = match rule {
        None => Arc::new(EkkoPriority),
        Some(r) => Arc::new(PyRule { rule: r, warned: Default::default() }),
    };
    t.set_priority(Some(Priority { config, rule, model })).map_err(to_py_err)
}

/// `Table.priority_stats` as a dict (None: the table neither scores its writes nor syncs).
pub(crate) fn priority_stats<'py>(
    t: &Table,
    py: Python<'py>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(s) = t.priority_stats() else { return Ok(None) };
    let d = PyDict::new(py);
    d.set_item("k", s.k)?;
    d.set_item("p_k", s.p_k)?;
    d.set_item("scored", s.scored)?;
    d.set_item("significant", s.significant)?;
    d.set_item("significant_entries", s.significant_entries)?;
    d.set_item("young_rows", s.young_rows)?;
    d.set_item("enabled", s.enabled)?;
    Ok(Some(d))
}
