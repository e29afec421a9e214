//! Bindings of `embstore-cache`: the inference cache over store tables, surrogate builds, and
//! the one evaluator (our policies, the whole cache, or a Python policy object such as the
//! libCacheSim adapter). `embstore.cache` wraps these.

use std::sync::Arc;

use embstore_cache::{
    cache::{Backing, CacheConfig, CachePolicy, InferenceCache, L3Fill, LevelConfig, Source},
    codec::CodecKind,
    surrogate::{self, Metric, SurrogateConfig, SurrogateFile, SurrogateTable, Surrogates},
    EvalOptions, Mode, Policy, PolicyConfig, Report, RequestOutcome, Trace,
};
use embstore_policy::{EvictionConfig, EvictionPolicy};
use embstore_table::{OnMiss, Table};
use numpy::{
    PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::table::{slice, PyTable};
use crate::{detached, errors};

use crate::to_py_err;

/// Store tables as the cache's backing store.
struct TableBacking {
    tables: Vec<Arc<Table>>,
    on_miss: OnMiss,
}

impl Backing for TableBacking {
    fn read(&self, table: usize, ids: &[u64], out: &mut [f32]) -> Result<(), String> {
        self.tables[table].lookup(ids, self.on_miss, out, None).map_err(|e| e.to_string())
    }
}

fn policy_config(
    name: &str,
    params: Option<&Bound<'_, PyDict>>,
    tables: usize,
) -> PyResult<PolicyConfig> {
    let max_score = tables.clamp(1, 255) as u8;
    let mut cfg = PolicyConfig::parse(name, max_score).map_err(to_py_err)?;
    let Some(params) = params else { return Ok(cfg) };
    for (k, v) in params.iter() {
        let key: String = k.extract()?;
        let bad = || {
            errors::InvalidArgumentError::new_err(format!(
                "policy {name:?} has no parameter {key:?}"
            ))
        };
        match (&mut cfg, key.as_str()) {
            (PolicyConfig::GroupLfu(c), "age_alpha") => c.age_alpha = v.extract()?,
            (PolicyConfig::GroupLfu(c), "pin_request") => c.pin_request = v.extract()?,
            (PolicyConfig::GroupLfu(c), "refresh_equal") => c.refresh_equal = v.extract()?,
            (PolicyConfig::GroupLfu(c), "max_score") => c.max_score = v.extract()?,
            (PolicyConfig::Lfu(c), "age_alpha") => c.age_alpha = v.extract()?,
            (PolicyConfig::EvArc(c), "flush") => c.flush = v.extract()?,
            (PolicyConfig::EvArc(c), "max_score") => c.max_score = v.extract()?,
            (PolicyConfig::EvLfuPaper { max_score }, "max_score") => *max_score = v.extract()?,
            (PolicyConfig::GroupAssoc(c), "age_alpha") => c.age_alpha = v.extract()?,
            (PolicyConfig::GroupAssoc(c), "pin_request") => c.pin_request = v.extract()?,
            (PolicyConfig::GroupAssoc(c), "count_hits") => c.count_hits = v.extract()?,
            (PolicyConfig::GroupAssoc(c), "ways") => c.ways = v.extract()?,
            (PolicyConfig::GroupAssoc(c), "rule") => {
                let name: Option<String> = v.extract()?;
                c.rule = match name.as_deref() {
                    None | Some("adaptive") => None,
                    Some(n) => Some(embstore_policy::Rule::parse(n).ok_or_else(|| {
                        errors::InvalidArgumentError::new_err(format!(
                            "unknown group_assoc rule {n:?}: expected \"adaptive\", \"group\", \
                             \"group_admission\" or \"clock\""
                        ))
                    })?),
                }
            }
            (PolicyConfig::GroupAssoc(c), "max_score") => c.max_score = v.extract()?,
            _ => return Err(bad()),
        }
    }
    Ok(cfg)
}

fn codec(name: &str) -> PyResult<CodecKind> {
    CodecKind::parse(name).ok_or_else(|| {
        errors::InvalidArgumentError::new_err(format!(
            "unknown codec {name:?}: expected one of {:?}",
            CodecKind::NAMES
        ))
    })
}

/// Surrogates of one table (an offline kNN build), in memory or on disk, as
/// `embstore.cache.Surrogates` wraps it.
#[pyclass(module = "embstore._native", name = "Surrogates", frozen)]
pub(crate) struct PySurrogates {
    inner: SurrogateTable,
}

#[pymethods]
impl PySurrogates {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn coverage(&self) -> f64 {
        self.inner.coverage()
    }

    #[getter]
    fn version(&self) -> u64 {
        self.inner.version()
    }

    /// The file it reads, for a build opened on disk.
    #[getter]
    fn path(&self) -> Option<std::path::PathBuf> {
        match &self.inner {
            SurrogateTable::Memory(_) => None,
            SurrogateTable::Disk(f) => Some(f.path().to_path_buf()),
        }
    }

    fn get(&self, py: Python<'_>, id: u64) -> PyResult<Option<(u64, f32)>> {
        match &self.inner {
            SurrogateTable::Memory(s) => Ok(s.get(id)),
            SurrogateTable::Disk(f) => detached(py, || f.get(id)).map_err(to_py_err),
        }
    }

    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let s = &self.inner;
        detached(py, || match s {
            SurrogateTable::Memory(s) => s.save(&path),
            SurrogateTable::Disk(f) => Surrogates::load(f.path())?.save(&path),
        })
        .map_err(to_py_err)
    }

    #[staticmethod]
    fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let s = detached(py, || Surrogates::load(&path)).map_err(to_py_err)?;
        Ok(Self { inner: s.into() })
    }

    #[staticmethod]
    fn open(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let f = detached(py, || SurrogateFile::open(&path)).map_err(to_py_err)?;
        Ok(Self { inner: f.into() })
    }

    fn heap_bytes(&self) -> usize {
        self.inner.heap_bytes()
    }
}

/// Builds one table's surrogates: exact kNN over `rows` (`[N, D]`), same table.
#[pyfunction]
#[pyo3(signature = (ids, rows, counts=None, k=10, metric="cosine", max_dist=0.5, popularity=true, version=0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_surrogates(
    py: Python<'_>,
    ids: PyReadonlyArray1<'_, u64>,
    rows: PyReadonlyArray2<'_, f32>,
    counts: Option<PyReadonlyArray1<'_, u64>>,
    k: usize,
    metric: &str,
    max_dist: f32,
    popularity: bool,
    version: u64,
) -> PyResult<PySurrogates> {
    let metric = match metric {
        "cosine" => Metric::Cosine,
        "l2" => Metric::L2,
        _ => {
            return Err(errors::InvalidArgumentError::new_err(format!(
                "metric must be \"cosine\" or \"l2\", got {metric:?}"
            )))
        }
    };
    let dim = rows.shape()[1];
    let ids = slice(&ids, "ids")?;
    let rows =
        rows.as_slice().map_err(|_| errors::ShapeError::new_err("rows must be C-contiguous"))?;
    let counts = match &counts {
        Some(c) => Some(slice(c, "counts")?),
        None => None,
    };
    let cfg = SurrogateConfig { k, metric, max_dist, popularity };
    let s = detached(py, || surrogate::build(ids, rows, dim, counts, &cfg, version))
        .map_err(to_py_err)?;
    Ok(PySurrogates { inner: s.into() })
}

/// The inference cache over native store tables.
#[pyclass(module = "embstore._native", name = "InferenceCache", frozen)]
pub(crate) struct PyInferenceCache {
    inner: Arc<InferenceCache>,
}

impl PyInferenceCache {
    /// The lookup itself, GIL released: key `j` is row `ids[j]` of table `tables[j]`;
    /// `sources` (one entry per key) receives the sources.
    fn serve(
        &self,
        py: Python<'_>,
        tables: &[u16],
        ids: &[u64],
        offsets: &[usize],
        out: &mut PyReadwriteArray2<'_, f32>,
        mut sources: Option<PyReadwriteArray1<'_, u8>>,
    ) -> PyResult<()> {
        let out = out
            .as_slice_mut()
            .map_err(|_| errors::ShapeError::new_err("out must be C-contiguous float32"))?;
        let dst = match sources.as_mut() {
            Some(s) => Some(
                s.as_slice_mut()
                    .map_err(|_| errors::ShapeError::new_err("sources must be contiguous uint8"))?,
            ),
            None => None,
        };
        if let Some(dst) = &dst {
            if dst.len() != ids.len() {
                return Err(errors::ShapeError::new_err(format!(
                    "sources must hold {} entries, got {}",
                    ids.len(),
                    dst.len()
                )));
            }
        }
        let mut srcs = dst.as_ref().map(|_| vec![Source::Store; ids.len()]);
        let c = &self.inner;
        detached(py, || c.lookup_ids(tables, ids, offsets, out, srcs.as_deref_mut()))
            .map_err(to_py_err)?;
        if let (Some(dst), Some(srcs)) = (dst, srcs) {
            for (d, s) in dst.iter_mut().zip(srcs) {
                *d = s as u8;
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PyInferenceCache {
    #[new]
    #[pyo3(signature = (tables, memory_budget_bytes, policy, tiers, *, policy_params=None,
        surrogates=None, surrogate_share=0.04, max_approx_per_request=2,
        max_surrogate_dist=f32::INFINITY, demote=true, shards=1, on_miss="zeros",
        l3_fill="background"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tables: Vec<PyRef<'_, PyTable>>,
        memory_budget_bytes: usize,
        policy: &str,
        tiers: Vec<(String, f64)>,
        policy_params: Option<&Bound<'_, PyDict>>,
        surrogates: Option<Vec<Option<PyRef<'_, PySurrogates>>>>,
        surrogate_share: f64,
        max_approx_per_request: usize,
        max_surrogate_dist: f32,
        demote: bool,
        shards: usize,
        on_miss: &str,
        l3_fill: &str,
    ) -> PyResult<Self> {
        let tables: Vec<Arc<Table>> = tables.iter().map(|t| t.inner.clone()).collect();
        let Some(dim) = tables.first().map(|t| t.dim()) else {
            return Err(errors::InvalidArgumentError::new_err(
                "the cache needs at least one table",
            ));
        };
        if let Some(t) = tables.iter().find(|t| t.dim() != dim) {
            return Err(errors::ShapeError::new_err(format!(
                "every cached table must have the same embedding_dim: {} has {}, the first has {dim}",
                t.name(),
                t.dim()
            )));
        }
        let on_miss = OnMiss::parse(on_miss).map_err(crate::table::to_py_err)?;
        let mut cfg = CacheConfig::new(tables.len(), dim, memory_budget_bytes);
        cfg.policy = policy_config(policy, policy_params, tables.len())?;
        cfg.levels = tiers
            .iter()
            .map(|(c, share)| Ok(LevelConfig { codec: codec(c)?, share: *share }))
            .collect::<PyResult<_>>()?;
        cfg.surrogate_share = surrogate_share;
        cfg.max_approx_per_request = max_approx_per_request;
        cfg.max_surrogate_dist = max_surrogate_dist;
        cfg.demote = demote;
        cfg.shards = shards;
        cfg.l3_fill = L3Fill::parse(l3_fill).map_err(to_py_err)?;
        let surrogates = surrogates
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.map(|s| s.inner.clone()))
            .collect();
        let backing = Arc::new(TableBacking { tables, on_miss });
        let inner = InferenceCache::new(cfg, backing, surrogates).map_err(to_py_err)?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Serves requests `offsets[r]:offsets[r+1]` of the keys (`tables[j]`, `ids[j]`: any
    /// 64-bit id) into `out` (`[len(ids), D]`).
    fn lookup(
        &self,
        py: Python<'_>,
        tables: PyReadonlyArray1<'_, u16>,
        ids: PyReadonlyArray1<'_, u64>,
        offsets: PyReadonlyArray1<'_, u64>,
        mut out: PyReadwriteArray2<'_, f32>,
        sources: Option<PyReadwriteArray1<'_, u8>>,
    ) -> PyResult<()> {
        let tables = slice(&tables, "tables")?;
        let ids = slice(&ids, "ids")?;
        let offsets: Vec<usize> = slice(&offsets, "offsets")?.iter().map(|&o| o as usize).collect();
        self.serve(py, tables, ids, &offsets, &mut out, sources)
    }

    /// One-hot requests given as columns: `cols[t][r]` is request `r`'s id in table `t`
    /// (every column the same length `B`); rows go to `out` (`[B·T, D]`, request-major), sources
    /// (if given) to `[B·T]`. Any int64 id is taken, a negative one as its two's complement
    /// (as the store takes it), so a request costs no numpy work beyond the columns.
    fn lookup_columns(
        &self,
        py: Python<'_>,
        cols: Vec<PyReadonlyArray1<'_, i64>>,
        mut out: PyReadwriteArray2<'_, f32>,
        sources: Option<PyReadwriteArray1<'_, u8>>,
    ) -> PyResult<()> {
        let t = cols.len();
        let b = cols.first().map_or(0, |c| c.len());
        let d = self.inner.config().dim;
        if t != self.inner.config().num_tables || b == 0 || cols.iter().any(|c| c.len() != b) {
            return Err(errors::ShapeError::new_err(format!(
                "lookup_columns needs {} columns of one positive length",
                self.inner.config().num_tables
            )));
        }
        if out.shape() != [b * t, d] {
            return Err(errors::ShapeError::new_err(format!(
                "out must be [{}, {d}], got {:?}",
                b * t,
                out.shape()
            )));
        }
        // The cache has at most 65,536 tables (checked when it was built), so `i` fits a u16.
        let tables: Vec<u16> = (0..b * t).map(|j| (j % t) as u16).collect();
        let mut ids = vec![0u64; b * t];
        for (i, col) in cols.iter().enumerate() {
            let col = col.as_array(); // any strides: a column of a [B, T] array is fine
            for (r, &id) in col.iter().enumerate() {
                ids[r * t + i] = id as u64;
            }
        }
        let offsets: Vec<usize> = (0..=b).map(|r| r * t).collect();
        self.serve(py, &tables, &ids, &offsets, &mut out, sources)
    }

    /// The keys the cache's policies see for trace keys `keys` (`table << 48 | id`), for
    /// evaluating a bare policy on what this cache's policies see.
    #[staticmethod]
    fn policy_keys<'py>(
        py: Python<'py>,
        keys: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<Bound<'py, numpy::PyArray1<u64>>> {
        let mapped: Vec<u64> = keys
            .as_array()
            .iter()
            .map(|&k| {
                let (t, id) = embstore_cache::split_key(k);
                InferenceCache::policy_key(t, id)
            })
            .collect();
        Ok(numpy::PyArray1::from_vec(py, mapped))
    }

    #[getter]
    fn dim(&self) -> usize {
        self.inner.config().dim
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        let req = s.requests.max(1) as f64;
        d.set_item("requests", s.requests)?;
        d.set_item("perfect_hits", s.perfect)?;
        d.set_item("served_perfect_hits", s.served_perfect)?;
        d.set_item("perfect_hit_rate", s.perfect as f64 / req)?;
        d.set_item("served_perfect_hit_rate", s.served_perfect as f64 / req)?;
        d.set_item("keys", s.keys)?;
        d.set_item("l1_hits", s.l1_hits)?;
        d.set_item("l2_hits", s.l2_hits)?;
        d.set_item("approximated", s.approximated)?;
        d.set_item("misses", s.misses)?;
        d.set_item("individual_hit_rate", (s.l1_hits + s.l2_hits) as f64 / s.keys.max(1) as f64)?;
        d.set_item("misses_per_request", s.misses_per_request)?;
        d.set_item("bypasses", s.bypasses)?;
        d.set_item("l1_evictions", s.l1_evictions)?;
        d.set_item("demotions", s.demotions)?;
        d.set_item("drops", s.drops)?;
        d.set_item("l3_inserts", s.l3_inserts)?;
        d.set_item("l3_reads", s.l3_reads)?;
        d.set_item("l3_read_errors", s.l3_read_errors)?;
        d.set_item("l3_queue_drops", s.l3_queue_drops)?;
        d.set_item("refetches", s.refetches)?;
        d.set_item("backing_reads", s.backing_reads)?;
        let m = self.inner.memory();
        let tiers = pyo3::types::PyList::empty(py);
        for t in &m.levels {
            let td = PyDict::new(py);
            td.set_item("codec", t.codec)?;
            td.set_item("capacity", t.capacity)?;
            td.set_item("len", t.len)?;
            td.set_item("row_bytes", t.row_bytes)?;
            td.set_item("metadata_bytes", t.metadata_bytes)?;
            tiers.append(td)?;
        }
        d.set_item("tiers", tiers)?;
        d.set_item("l3_capacity", m.l3_capacity)?;
        d.set_item("l3_len", m.l3_len)?;
        d.set_item("l3_bytes", m.l3_bytes)?;
        d.set_item("surrogate_table_bytes", m.surrogate_table_bytes)?;
        d.set_item("l3_queue_bytes", m.l3_queue_bytes)?;
        d.set_item("memory_budget_bytes", m.budget_bytes)?;
        d.set_item("bytes", m.total_bytes)?;
        d.set_item("metadata_bytes_per_entry", m.metadata_bytes_per_entry)?;
        Ok(d)
    }

    fn reset_stats(&self) {
        self.inner.reset_stats()
    }

    /// Waits for the L3 filler's reads and moves what it found into L3.
    fn sync_l3(&self, py: Python<'_>) {
        let c = &self.inner;
        detached(py, || c.sync_l3())
    }

    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let c = &self.inner;
        detached(py, || c.clear()).map_err(to_py_err)
    }

    /// Evaluates this cache (as it is: warm or cold) on a trace with the one evaluator.
    #[pyo3(signature = (keys, offsets, mode="prefix", warm_frac=0.5))]
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'_, u64>,
        offsets: PyReadonlyArray1<'_, u64>,
        mode: &str,
        warm_frac: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let trace = trace_of(&keys, &offsets)?;
        let mode = parse_mode(mode)?;
        let c = &self.inner;
        let opts = EvalOptions { warm_frac, ..EvalOptions::default() };
        let report = detached(py, || {
            let mut p = CachePolicy::new(c);
            let r = embstore_cache::evaluate_with(&trace, &mut p, mode, &opts);
            match p.error {
                Some(e) => Err(e),
                None => r,
            }
        })
        .map_err(to_py_err)?;
        report_dict(py, &report)
    }
}

fn parse_mode(mode: &str) -> PyResult<Mode> {
    match mode {
        "online" => Ok(Mode::Online),
        "prefix" => Ok(Mode::Prefix),
        "replay" => Ok(Mode::Replay),
        _ => Err(errors::InvalidArgumentError::new_err(format!(
            "mode must be \"online\", \"prefix\" or \"replay\", got {mode:?}"
        ))),
    }
}

fn trace_of(
    keys: &PyReadonlyArray1<'_, u64>,
    offsets: &PyReadonlyArray1<'_, u64>,
) -> PyResult<Trace> {
    let keys = slice(keys, "keys")?;
    let offsets: Vec<usize> = slice(offsets, "offsets")?.iter().map(|&o| o as usize).collect();
    Trace::from_ragged(keys, &offsets).map_err(to_py_err)
}

fn report_dict<'py>(py: Python<'py>, r: &Report) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("policy", &r.policy)?;
    d.set_item("mode", format!("{:?}", r.mode).to_lowercase())?;
    d.set_item("capacity", r.capacity)?;
    d.set_item("requests", r.requests)?;
    d.set_item("keys", r.keys)?;
    d.set_item("perfect_hit", r.perfect_hit)?;
    d.set_item("served_perfect_hit", r.served_perfect_hit)?;
    d.set_item("individual_hit", r.individual_hit)?;
    d.set_item("compulsory_bound", r.compulsory_bound)?;
    d.set_item("mean_misses", r.mean_misses)?;
    d.set_item("misses_per_request", PyArray1::from_slice(py, &r.misses_per_request))?;
    d.set_item("approximated", r.approximated)?;
    d.set_item("bypasses", r.bypasses)?;
    d.set_item("evictions", r.evictions)?;
    d.set_item("self_evictions", r.self_evictions)?;
    d.set_item("metadata_bytes_per_entry", r.metadata_bytes_per_entry)?;
    Ok(d)
}

/// A policy implemented in Python: `access(keys: np.ndarray[uint64]) -> array of bool`
/// (resident before this request), called once per request with the GIL held.
struct PyPolicy {
    obj: Py<PyAny>,
    capacity: usize,
    error: Option<PyErr>,
}

impl std::fmt::Debug for PyPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyPolicy").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Policy for PyPolicy {
    fn name(&self) -> &'static str {
        "python"
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn len(&self) -> usize {
        0
    }
    fn contains(&self, _key: u64) -> bool {
        false
    }
    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        if self.error.is_some() {
            out.hit.resize(keys.len(), false);
            return;
        }
        let r = Python::attach(|py| -> PyResult<Vec<bool>> {
            let arr = PyArray1::from_slice(py, keys);
            let flags = self.obj.bind(py).call_method1("access", (arr,))?;
            let flags: Vec<bool> = flags.extract()?;
            if flags.len() != keys.len() {
                return Err(errors::ShapeError::new_err(format!(
                    "policy access() returned {} flags for {} keys",
                    flags.len(),
                    keys.len()
                )));
            }
            Ok(flags)
        });
        match r {
            Ok(flags) => out.hit = flags,
            Err(e) => {
                out.hit.resize(keys.len(), false);
                self.error = Some(e);
            }
        }
        out.hits = out.hit.iter().filter(|&&h| h).count();
    }
    fn metadata_bytes(&self) -> usize {
        0
    }
}

/// The one evaluator: `policy` is one of our policy names, or an object with
/// `access(keys) -> flags` (for example a libCacheSim adapter).
#[pyfunction]
#[pyo3(signature = (keys, offsets, policy, capacity, mode="prefix", policy_params=None, max_score=None, warm_frac=0.5))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate<'py>(
    py: Python<'py>,
    keys: PyReadonlyArray1<'_, u64>,
    offsets: PyReadonlyArray1<'_, u64>,
    policy: &Bound<'py, PyAny>,
    capacity: usize,
    mode: &str,
    policy_params: Option<&Bound<'py, PyDict>>,
    max_score: Option<usize>,
    warm_frac: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let trace = trace_of(&keys, &offsets)?;
    let mode = parse_mode(mode)?;
    let opts = EvalOptions { warm_frac, ..EvalOptions::default() };
    if let Ok(name) = policy.extract::<String>() {
        if STORE_POLICIES.contains(&name.to_ascii_lowercase().replace('-', "_").as_str()) {
            return evaluate_store_policy(py, &trace, &name, capacity, mode, policy_params, &opts);
        }
        let s = max_score.unwrap_or_else(|| trace.max_request_len());
        let cfg = policy_config(&name, policy_params, s)?;
        let report = detached(py, || {
            let mut p = cfg.build(capacity)?;
            embstore_cache::evaluate_with(&trace, p.as_mut(), mode, &opts)
        })
        .map_err(to_py_err)?;
        return report_dict(py, &report);
    }
    let mut p = PyPolicy { obj: policy.clone().unbind(), capacity, error: None };
    let report = embstore_cache::evaluate_with(&trace, &mut p, mode, &opts).map_err(to_py_err)?;
    if let Some(e) = p.error {
        return Err(e);
    }
    let d = report_dict(py, &report)?;
    if let Ok(name) = policy.getattr("name") {
        d.set_item("policy", name)?;
    }
    Ok(d)
}

/// The store's own eviction policies the evaluator also scores (per-slot policies run as a
/// cache of `capacity` keys): names only the store has; `lru`, `lfu`, `group_lfu` are the
/// cache's own and evaluated as such.
pub(crate) const STORE_POLICIES: [&str; 1] = ["lru_lfu"];

/// `evaluate` for one of [`STORE_POLICIES`]: the store's per-slot eviction as a request-level
/// policy ([`EvictionPolicy`]), with the defaults a store uses; it takes no parameters.
fn evaluate_store_policy<'py>(
    py: Python<'py>,
    trace: &Trace,
    name: &str,
    capacity: usize,
    mode: Mode,
    params: Option<&Bound<'py, PyDict>>,
    opts: &EvalOptions,
) -> PyResult<Bound<'py, PyDict>> {
    if params.is_some_and(|p| !p.is_empty()) {
        return Err(errors::InvalidArgumentError::new_err(format!(
            "policy {name:?} (the store's eviction) takes no parameters"
        )));
    }
    let config = EvictionConfig::parse(name).map_err(to_py_err)?;
    let report = detached(py, || {
        let mut p = EvictionPolicy::new(&config, capacity, 0)?;
        embstore_cache::evaluate_with(trace, &mut p, mode, opts)
    })
    .map_err(to_py_err)?;
    report_dict(py, &report)
}

/// The synthetic Criteo-like trace of the design note as uint64 `[N, T]` table-qualified keys.
#[pyfunction]
#[pyo3(signature = (num_requests=200_000, num_tables=26, num_contexts=200_000, zipf_alpha=1.0,
    min_table_size=10, max_table_size=200_000, rho=0.7, drift=0.0, seed=0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn synthetic_trace<'py>(
    py: Python<'py>,
    num_requests: usize,
    num_tables: usize,
    num_contexts: u64,
    zipf_alpha: f64,
    min_table_size: u64,
    max_table_size: u64,
    rho: f64,
    drift: f64,
    seed: u64,
) -> PyResult<Bound<'py, numpy::PyArray2<u64>>> {
    let s = embstore_cache::Synthetic {
        num_requests,
        num_tables,
        num_contexts,
        zipf_alpha,
        min_table_size,
        max_table_size,
        rho,
        drift,
        seed,
    };
    let trace = detached(py, || s.generate()).map_err(to_py_err)?;
    let flat = PyArray1::from_slice(py, trace.keys());
    flat.reshape([num_requests, num_tables])
}
