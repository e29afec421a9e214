//! The model monitor (`embstore.ModelMonitor`): a model's health judged from the metrics its
//! live and baseline variants report, and its state recorded in etcd at each confident
//! decision (`embstore_cluster::health`, `embstore_cluster::model_state`).

use std::time::Duration;

use embstore_cluster::{
    begin_rollback, end_rollback, get_state, list_models, put_state, record_t_max, Detector,
    DetectorConfig, Etcd, Health, ModelState, RatioDetector, Report, Variant,
};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{detached, to_py_err};

fn health_name(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Uncertain => "uncertain",
        Health::Corrupted => "corrupted",
    }
}

/// A model's monitor: reports in, decisions out; with etcd, each confident decision (and each
/// healthy window, for the witnesses) is recorded there.
#[pyclass(module = "embstore._native", name = "ModelMonitor", frozen)]
pub(crate) struct PyModelMonitor {
    model: String,
    baseline: Option<String>,
    detector: Mutex<RatioDetector>,
    etcd: Option<(Etcd, tokio::runtime::Runtime)>,
}

#[pymethods]
impl PyModelMonitor {
    #[new]
    #[pyo3(signature = (model, etcd=None, baseline=None, window_s=30.0, lateness_s=30.0, delta_bad=0.05, delta_ok=0.02, z_bad=3.0, n_bad=3, n_ok=3, min_trials=1, latency_p99_s=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: String,
        etcd: Option<Vec<String>>,
        baseline: Option<String>,
        window_s: f64,
        lateness_s: f64,
        delta_bad: f64,
        delta_ok: f64,
        z_bad: f64,
        n_bad: u32,
        n_ok: u32,
        min_trials: u64,
        latency_p99_s: f64,
    ) -> PyResult<Self> {
        let ms = |s: f64| if s.is_finite() && s > 0.0 { (s * 1000.0).round() as u64 } else { 0 };
        let cfg = DetectorConfig {
            window_ms: ms(window_s),
            lateness_ms: if lateness_s == 0.0 { 0 } else { ms(lateness_s) },
            delta_bad,
            z_bad,
            delta_ok,
            n_bad,
            n_ok,
            min_trials,
        };
        let mut detector = RatioDetector::new(cfg).map_err(to_py_err)?;
        detector.set_latency_p99_ms(ms(latency_p99_s));
        let etcd = match etcd {
            None => None,
            Some(e) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
                let client = detached(py, || {
                    rt.block_on(async { Etcd::connect(&e, Duration::from_secs(3)) })
                })
                .map_err(to_py_err)?;
                Some((client, rt))
            }
        };
        // The model name is checked where the record would be written, at once.
        if let Some((client, rt)) = &etcd {
            detached(py, || rt.block_on(get_state(client, &model))).map_err(to_py_err)?;
        }
        Ok(Self { model, baseline, detector: Mutex::new(detector), etcd })
    }

    /// Adds `successes` of `trials` for `variant` ("live" or "baseline") to the window
    /// starting at `window_start_ms`; False when that window had fired already (late: ignored).
    fn report(
        &self,
        variant: &str,
        window_start_ms: u64,
        successes: u64,
        trials: u64,
    ) -> PyResult<bool> {
        let v: Variant = variant.parse().map_err(to_py_err)?;
        let r = self.detector.lock().report(v, window_start_ms, successes, trials);
        Ok(r.map_err(to_py_err)? == Report::Counted)
    }

    /// Fires the windows the watermark has passed; one dict per fired window with a report.
    /// With etcd, a decision that changes the state, and every healthy window (its
    /// `t_healthy_ms`), is recorded in the model's state.
    fn advance<'py>(
        &self,
        py: Python<'py>,
        watermark_ms: u64,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let (decisions, corrupted) = {
            let mut d = self.detector.lock();
            let out = d.advance(watermark_ms);
            (out, d.corrupted().to_vec())
        };
        let mut out = Vec::new();
        for x in &decisions {
            if let Some((client, rt)) = &self.etcd {
                if x.changed || x.t_healthy_ms.is_some() {
                    let rec = ModelState {
                        state: x.state,
                        t_ms: x.t_ms,
                        corrupted: corrupted.clone(),
                        alternative: self.baseline.clone(),
                        t_healthy_ms: x.t_healthy_ms,
                        ..ModelState::default()
                    };
                    detached(py, || rt.block_on(put_state(client, &self.model, &rec)))
                        .map_err(to_py_err)?;
                }
            }
            let d = PyDict::new(py);
            d.set_item("window_start_ms", x.window_start_ms)?;
            d.set_item("t_ms", x.t_ms)?;
            d.set_item("verdict", format!("{:?}", x.verdict).to_lowercase())?;
            d.set_item("ratio", x.ratio)?;
            d.set_item("z", x.z)?;
            d.set_item("state", health_name(x.state))?;
            d.set_item("changed", x.changed)?;
            d.set_item("t_healthy_ms", x.t_healthy_ms)?;
            d.set_item("corrupted_since_ms", x.corrupted_since_ms)?;
            out.push(d);
        }
        Ok(out)
    }

    /// The monitor's current state ("healthy", "uncertain" or "corrupted").
    #[getter]
    fn state(&self) -> &'static str {
        health_name(self.detector.lock().state())
    }

    /// Reports for windows that had fired already.
    #[getter]
    fn late_reports(&self) -> u64 {
        self.detector.lock().late_reports()
    }

    /// The model's name.
    #[getter]
    fn model(&self) -> String {
        self.model.clone()
    }
}

/// The state of `model` recorded in the etcd at `etcd` (JSON), or None.
#[pyfunction]
pub(crate) fn model_state_json(
    py: Python<'_>,
    etcd: Vec<String>,
    model: &str,
) -> PyResult<Option<String>> {
    with_etcd(py, etcd, async |c| {
        let s = get_state(c, model).await?;
        Ok(s.map(|s| String::from_utf8_lossy(&s.to_json()).into_owned()))
    })
}

/// The models with a state in the etcd at `etcd`.
#[pyfunction]
pub(crate) fn model_list(py: Python<'_>, etcd: Vec<String>) -> PyResult<Vec<String>> {
    with_etcd(py, etcd, async |c| list_models(c).await)
}

/// Runs `f` against the etcd at `etcd` on a runtime of its own, with the GIL released.
fn with_etcd<T: Send>(
    py: Python<'_>,
    etcd: Vec<String>,
    f: impl AsyncFnOnce(&Etcd) -> embstore_common::Result<T> + Send,
) -> PyResult<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    detached(py, || {
        rt.block_on(async {
            let client = Etcd::connect(&etcd, Duration::from_secs(3))?;
            f(&client).await
        })
    })
    .map_err(to_py_err)
}

/// Raises witness `witness`'s t_max for `model`; whether it rose.
#[pyfunction]
pub(crate) fn model_record_t_max(
    py: Python<'_>,
    etcd: Vec<String>,
    model: String,
    witness: String,
    t_max_ms: u64,
) -> PyResult<bool> {
    with_etcd(py, etcd, async |c| record_t_max(c, &model, &witness, t_max_ms).await)
}

/// Marks a rollback of `model` under way (LockedError if one is).
#[pyfunction]
pub(crate) fn model_begin_rollback(
    py: Python<'_>,
    etcd: Vec<String>,
    model: String,
) -> PyResult<()> {
    with_etcd(py, etcd, async |c| begin_rollback(c, &model).await)
}

/// Marks `model`'s rollback over; whether one was under way.
#[pyfunction]
pub(crate) fn model_end_rollback(
    py: Python<'_>,
    etcd: Vec<String>,
    model: String,
) -> PyResult<bool> {
    with_etcd(py, etcd, async |c| end_rollback(c, &model).await)
}

/// The value and modification revision at `key`, or None.
#[pyfunction]
pub(crate) fn etcd_get(
    py: Python<'_>,
    etcd: Vec<String>,
    key: String,
) -> PyResult<Option<(Vec<u8>, i64)>> {
    with_etcd(py, etcd, async |c| Ok(c.get(&key).await?.map(|kv| (kv.value, kv.mod_revision))))
}

/// Every key under `prefix`: (key, value, revision).
#[pyfunction]
pub(crate) fn etcd_range(
    py: Python<'_>,
    etcd: Vec<String>,
    prefix: String,
) -> PyResult<Vec<(String, Vec<u8>, i64)>> {
    with_etcd(py, etcd, async |c| {
        Ok(c.range_prefix(&prefix)
            .await?
            .into_iter()
            .map(|kv| (kv.key, kv.value, kv.mod_revision))
            .collect())
    })
}

/// Sets `key` only if its last change was at `revision` (0: only if absent); whether it did.
#[pyfunction]
pub(crate) fn etcd_put_if(
    py: Python<'_>,
    etcd: Vec<String>,
    key: String,
    value: Vec<u8>,
    revision: i64,
) -> PyResult<bool> {
    with_etcd(py, etcd, async |c| c.put_if(&key, &value, revision, 0).await)
}

/// Removes `key`.
#[pyfunction]
pub(crate) fn etcd_delete(py: Python<'_>, etcd: Vec<String>, key: String) -> PyResult<()> {
    with_etcd(py, etcd, async |c| c.delete(&key).await)
}
