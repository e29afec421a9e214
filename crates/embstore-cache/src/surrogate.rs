//! L3 of the cache (EVStore's EVProx, design note `evstore.md` §4): when a key misses L1 and
//! L2, serve the row of a close neighbour, its *surrogate*, if that row is resident, instead
//! of reading the backing store.
//!
//! ## Parts
//! - [`build`] (offline, at checkpoint export, once per table): exact k-nearest neighbours
//!   within the table, then per row the most-accessed neighbour within `max_dist` (ties go to
//!   the nearest) → [`Surrogates`], saved to a checksummed file versioned with the checkpoint.
//! - [`SurrogateFile`] (runtime): that file on disk, read one 4 KiB block per lookup.
//! - [`ClockMap`] (runtime): the bounded key → (surrogate, distance) map of the L3 tier,
//!   replaced by CLOCK (a FIFO ring plus a reference bit).
//!
//! ```text
//! build  rows [N x D] --unit norm (cosine)--> tasks of 256 queries x blocks of 256 candidates
//!        --top-k per row--> exact f64 distance, keep <= max_dist --> max count (ties: nearest)
//! file   header block | blocks of 227 (id, alt, dist) records, sorted, crc32 each | block index
//!        ([`file`]): loaded whole ([`Surrogates::load`], 18 B a row) or read a block per
//!        lookup ([`SurrogateFile`], 8 B per 227 rows in memory)
//! L3     ring [ key | alt | dist | ref ] 20 B a slot; index key -> slot, 4 B a bucket
//!             ^ hand: referenced -> clear the bit and pass; unreferenced -> the victim
//! ```
//!
//! The exact build costs N²·D multiply-adds: 0.3 s for N = 2·10⁴, D = 16 and 14 s for
//! N = 10⁵, D = 36 on 2 cores (x86-64 baseline, SSE2; `-C target-cpu=native` is about 1.5×
//! faster). It is meant for tables up to about 2·10⁵ rows and refuses more
//! than [`MAX_ROWS`]; larger tables need an approximate (HNSW) index, which is future work.
//! It holds two f32 copies of the rows (unit-norm queries and candidate panels) while it runs.
//!
//! ## Invariants
//! - `alt(id) != id`, and `alt` is an id of the same build or [`NONE`].
//! - A stored distance is at least the true distance (rounded up to f16) and at most
//!   `max_dist`, so a runtime threshold compared against it never admits a farther row.
//! - Under cosine a zero row has no surrogate and is no one's; under L2 (relative to
//!   `||e_i||`) a zero row has none.
//! - [`build`] is deterministic: the same output for any number of threads (top-k ties go to
//!   the lower row).
//! - [`ClockMap`]: `len <= capacity`; an entry referenced since the hand last passed it
//!   survives the next sweep (§4.2 invariant 7); no random hash state.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use crate::index::{SlotIndex, NIL};
use crate::{Error, ErrorKind, Result};

mod file;
pub use file::{SurrogateFile, BLOCK, RECORDS_PER_BLOCK};

/// "No surrogate": the `alt` of a row without one. It is reserved, so no id may take it.
pub const NONE: u64 = u64::MAX;

/// The most rows [`build`] accepts (2²⁰): about 25 minutes at D = 36 on 2 cores.
pub const MAX_ROWS: usize = 1 << 20;

/// The largest neighbour count `k`.
pub const MAX_K: usize = 1024;

/// The file format version written by [`Surrogates::save`] (1 is still read).
pub const FORMAT_VERSION: u32 = file::FORMAT_V2;

const MAGIC: &[u8; 8] = b"EMBSURR1";
const HEADER: usize = 48;
const NO_ROW: u32 = u32::MAX;
/// Queries per rayon task and candidates per block: 256 rows of D = 36 are 36 KiB, so both
/// stay in L2 while every pair is visited.
const QB: usize = 256;
const CB: usize = 256;
/// The register tile: 4 queries x 8 candidates, 32 accumulators (8 SSE registers).
const TQ: usize = 4;
const TC: usize = 8;

/// The distance between rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Metric {
    /// `1 - cos(e_i, e_j)`, in `[0, 2]`.
    #[default]
    Cosine,
    /// Relative Euclidean distance `||e_i - e_j|| / ||e_i||`.
    L2,
}

impl Metric {
    fn code(self) -> u8 {
        match self {
            Self::Cosine => 0,
            Self::L2 => 1,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Cosine),
            1 => Some(Self::L2),
            _ => None,
        }
    }
}

/// How [`build`] picks surrogates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SurrogateConfig {
    /// Neighbours considered per row, `1..=MAX_K` (default 10).
    pub k: usize,
    /// The distance (default cosine).
    pub metric: Metric,
    /// Farthest admissible surrogate, in `[0, 65504]` (f16 max; default 0.5).
    pub max_dist: f32,
    /// Pick the most-accessed admissible neighbour, ties to the nearest (default); else the
    /// nearest. Without counts it is always the nearest.
    pub popularity: bool,
}

impl Default for SurrogateConfig {
    fn default() -> Self {
        Self { k: 10, metric: Metric::Cosine, max_dist: 0.5, popularity: true }
    }
}

impl SurrogateConfig {
    /// Checks `k` and `max_dist` (InvalidArgument).
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_K).contains(&self.k) {
            return Err(Error::invalid(format!("k must be in 1..={MAX_K}, got {}", self.k)));
        }
        if !(self.max_dist >= 0.0 && self.max_dist <= f16::MAX.to_f32()) {
            return Err(Error::invalid(format!(
                "max_dist must be in [0, 65504], got {}",
                self.max_dist
            )));
        }
        Ok(())
    }
}

/// One table's surrogates: per id (sorted) its alternative id or [`NONE`] and an f16
/// distance (infinity where none), with the config and the table checkpoint version.
#[derive(Clone, Debug, PartialEq)]
pub struct Surrogates {
    ids: Vec<u64>,
    alt: Vec<u64>,
    dist: Vec<f16>,
    dim: usize,
    config: SurrogateConfig,
    version: u64,
}

/// Builds the surrogates of one table (see the module docs): `rows` is `[N x dim]` row-major
/// with `N = ids.len()`; `counts[i]` is the access count of `ids[i]` from a window disjoint
/// from the evaluation (`None`: nearest); `version` is the table checkpoint's version (step)
/// the rows come from, kept for the file. Runs on the current rayon pool. Errors: bad `cfg`,
/// `dim` 0, duplicate or reserved ids, non-finite values, more than [`MAX_ROWS`] rows
/// (InvalidArgument); `rows` or `counts` of the wrong length (ShapeMismatch).
pub fn build(
    ids: &[u64],
    rows: &[f32],
    dim: usize,
    counts: Option<&[u64]>,
    cfg: &SurrogateConfig,
    version: u64,
) -> Result<Surrogates> {
    cfg.validate()?;
    let n = ids.len();
    if dim == 0 || dim > u32::MAX as usize {
        return Err(Error::invalid(format!("dim must be in 1..=4294967295, got {dim}")));
    }
    if n.checked_mul(dim) != Some(rows.len()) {
        return Err(Error::shape(format!(
            "rows has {} values, expected ids.len() * dim = {n} * {dim}",
            rows.len()
        )));
    }
    if let Some(c) = counts.filter(|c| c.len() != n) {
        return Err(Error::shape(format!("counts has {} entries, expected {n}", c.len())));
    }
    if n > MAX_ROWS {
        return Err(Error::invalid(format!(
            "{n} rows exceed the exact build's limit of {MAX_ROWS}; an ann index is future work"
        )));
    }
    if let Some(p) = rows.iter().position(|v| !v.is_finite()) {
        let (i, j) = (p / dim, p % dim);
        return Err(Error::invalid(format!(
            "row {i} (id {}) has a non-finite value {} at column {j}",
            ids[i], rows[p]
        )));
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by_key(|&i| ids[i as usize]);
    if let Some(w) = order.windows(2).find(|w| ids[w[0] as usize] == ids[w[1] as usize]) {
        return Err(Error::invalid(format!("duplicate id {}", ids[w[0] as usize])));
    }
    if ids.contains(&NONE) {
        return Err(Error::invalid(format!("id {NONE} is reserved for none")));
    }

    let prep = Prepared::new(rows, n, dim, cfg.metric);
    let mut best = vec![(NO_ROW, f16::INFINITY); n];
    best.par_chunks_mut(QB).enumerate().for_each(|(b, out)| {
        let q0 = b * QB;
        for (r, top) in prep.knn(q0, q0 + out.len(), cfg.k).into_iter().enumerate() {
            out[r] = prep.select(q0 + r, &top.idx, counts.filter(|_| cfg.popularity), cfg);
        }
    });
    let alt_of = |i: usize| match best[i].0 {
        NO_ROW => NONE,
        j => ids[j as usize],
    };
    Ok(Surrogates {
        ids: order.iter().map(|&i| ids[i as usize]).collect(),
        alt: order.iter().map(|&i| alt_of(i as usize)).collect(),
        dist: order.iter().map(|&i| best[i as usize].1).collect(),
        dim,
        config: *cfg,
        version,
    })
}

/// The rows as the kernel reads them (see [`Prepared::new`]).
struct Prepared<'a> {
    rows: &'a [f32],
    dim: usize,
    metric: Metric,
    /// `||e_i||` in f64; rows with norm 0 get no surrogate.
    norms: Vec<f64>,
    /// Query rows (unit norm under cosine), padded with zero rows to a multiple of `TQ`.
    queries: Vec<f32>,
    /// Candidates in panels of `TC` rows, each `dim x TC` (lane fastest), zero padded.
    panels: Vec<f32>,
    /// Ranking key of a pair: `bias[c] - scale * dot` (smaller is nearer); +inf excludes `c`.
    bias: Vec<f32>,
    scale: f32,
}

impl<'a> Prepared<'a> {
    fn new(rows: &'a [f32], n: usize, dim: usize, metric: Metric) -> Self {
        let norms: Vec<f64> = rows
            .chunks_exact(dim)
            .map(|r| r.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt())
            .collect();
        let mut queries = vec![0.0f32; n.div_ceil(TQ) * TQ * dim];
        let mut bias = vec![f32::INFINITY; n.div_ceil(TC) * TC];
        for (i, (q, r)) in queries.chunks_exact_mut(dim).zip(rows.chunks_exact(dim)).enumerate() {
            let s = if metric == Metric::Cosine && norms[i] > 0.0 { 1.0 / norms[i] } else { 1.0 };
            for (q, &v) in q.iter_mut().zip(r) {
                *q = (f64::from(v) * s) as f32;
            }
            bias[i] = match metric {
                Metric::Cosine if norms[i] == 0.0 => f32::INFINITY,
                Metric::Cosine => 0.0,
                Metric::L2 => (norms[i] * norms[i]) as f32,
            };
        }
        let mut panels = vec![0.0f32; n.div_ceil(TC) * TC * dim];
        for (p, panel) in panels.chunks_exact_mut(TC * dim).enumerate() {
            for (l, q) in queries.chunks_exact(dim).skip(p * TC).take(TC).enumerate() {
                for (t, &v) in q.iter().enumerate() {
                    panel[t * TC + l] = v;
                }
            }
        }
        let scale = if metric == Metric::Cosine { 1.0 } else { 2.0 };
        Self { rows, dim, metric, norms, queries, panels, bias, scale }
    }

    /// The top-`k` neighbours of rows `q0..q1`, nearest first, self excluded.
    fn knn(&self, q0: usize, q1: usize, k: usize) -> Vec<TopK> {
        let d = self.dim;
        let mut tops: Vec<TopK> = (q0..q1).map(|_| TopK::new(k)).collect();
        // Query tiles of TQ rows, transposed (`dim x TQ`) so the kernel reads them in order.
        let nt = (q1 - q0).div_ceil(TQ);
        let mut tiles = vec![0.0f32; nt * TQ * d];
        for (t, tile) in tiles.chunks_exact_mut(TQ * d).enumerate() {
            let q = &self.queries[(q0 + t * TQ) * d..(q0 + t * TQ + TQ) * d];
            for (r, row) in q.chunks_exact(d).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    tile[j * TQ + r] = v;
                }
            }
        }
        for (b, block) in self.panels.chunks(CB * d).enumerate() {
            for (t, tile) in tiles.chunks_exact(TQ * d).enumerate() {
                for (p, panel) in block.chunks_exact(TC * d).enumerate() {
                    let c0 = b * CB + p * TC;
                    let acc = kernel(tile, panel);
                    for (r, acc) in acc.iter().enumerate() {
                        let Some(top) = tops.get_mut(t * TQ + r) else { break };
                        for (l, &dot) in acc.iter().enumerate() {
                            let key = self.bias[c0 + l] - self.scale * dot;
                            if key < top.worst && c0 + l != q0 + t * TQ + r {
                                top.push(key, (c0 + l) as u32);
                            }
                        }
                    }
                }
            }
        }
        tops
    }

    /// Row `i`'s surrogate among its neighbours `nbrs` (nearest first) and its distance
    /// rounded up to f16, or `(NO_ROW, inf)`.
    fn select(
        &self,
        i: usize,
        nbrs: &[u32],
        counts: Option<&[u64]>,
        cfg: &SurrogateConfig,
    ) -> (u32, f16) {
        if self.norms[i] == 0.0 {
            return (NO_ROW, f16::INFINITY);
        }
        let mut best: Option<(u32, u64, f64, f16)> = None;
        for &j in nbrs {
            let d = self.dist(i, j as usize);
            let h = f16_up(d);
            if h.to_f32() > cfg.max_dist {
                continue;
            }
            let c = counts.map_or(0, |c| c[j as usize]);
            if best.is_none_or(|(_, bc, bd, _)| c > bc || (c == bc && d < bd)) {
                best = Some((j, c, d, h));
            }
        }
        best.map_or((NO_ROW, f16::INFINITY), |(j, _, _, h)| (j, h))
    }

    /// The exact distance between rows `i` and `j`, in f64.
    fn dist(&self, i: usize, j: usize) -> f64 {
        let (a, b) = (self.row(i), self.row(j));
        match self.metric {
            Metric::Cosine => {
                let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                (1.0 - dot / (self.norms[i] * self.norms[j])).clamp(0.0, 2.0)
            }
            Metric::L2 => {
                let sq: f64 =
                    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
                sq.sqrt() / self.norms[i]
            }
        }
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.dim..(i + 1) * self.dim]
    }
}

/// Dot products of a query tile (`dim x TQ`) with a candidate panel (`dim x TC`).
#[inline]
fn kernel(tile: &[f32], panel: &[f32]) -> [[f32; TC]; TQ] {
    let mut acc = [[0.0f32; TC]; TQ];
    let (qs, _) = tile.as_chunks::<TQ>();
    let (cs, _) = panel.as_chunks::<TC>();
    for (q, c) in qs.iter().zip(cs) {
        for (acc, &s) in acc.iter_mut().zip(q) {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += s * v;
            }
        }
    }
    acc
}

/// The `k` smallest (key, row) pairs offered, ascending; rows arrive in increasing order, so
/// equal keys keep the lower row.
struct TopK {
    keys: Vec<f32>,
    idx: Vec<u32>,
    k: usize,
    /// The largest kept key once full, +inf before.
    worst: f32,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self { keys: Vec::with_capacity(k), idx: Vec::with_capacity(k), k, worst: f32::INFINITY }
    }

    /// Keeps `(key, row)`; the caller checked `key < worst`.
    fn push(&mut self, key: f32, row: u32) {
        let pos = self.keys.partition_point(|&x| x <= key);
        if self.keys.len() == self.k {
            self.keys.pop();
            self.idx.pop();
        }
        self.keys.insert(pos, key);
        self.idx.insert(pos, row);
        if self.keys.len() == self.k {
            self.worst = self.keys[self.k - 1];
        }
    }
}

/// `d >= 0` rounded up to f16 (never below `d`), so thresholds on it stay conservative.
fn f16_up(d: f64) -> f16 {
    let h = f16::from_f64(d);
    if h.to_f64() < d {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

impl Surrogates {
    /// The surrogate of `id` and its distance, or `None` (unknown id or no surrogate).
    pub fn get(&self, id: u64) -> Option<(u64, f32)> {
        let i = self.ids.binary_search(&id).ok()?;
        (self.alt[i] != NONE).then(|| (self.alt[i], self.dist[i].to_f32()))
    }

    /// Rows (ids) covered, with or without a surrogate.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The share of rows that have a surrogate (0 when empty).
    pub fn coverage(&self) -> f64 {
        let with = self.alt.iter().filter(|&&a| a != NONE).count();
        if self.ids.is_empty() {
            0.0
        } else {
            with as f64 / self.ids.len() as f64
        }
    }

    /// Heap bytes held: 18 per row.
    pub fn heap_bytes(&self) -> usize {
        self.ids.capacity() * 8 + self.alt.capacity() * 8 + self.dist.capacity() * 2
    }

    /// The ids, ascending.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// The embedding dimension of the rows it was built from.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The config it was built with.
    pub fn config(&self) -> &SurrogateConfig {
        &self.config
    }

    /// The version (step) of the table checkpoint it was built from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Writes the file (format 2, in [`file`]: 4 KiB blocks that [`SurrogateFile`] reads one
    /// at a time) atomically: to `<path>.tmp`, fsync, rename over `path`. Errors: Io, with the
    /// path in the message.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: &dyn std::fmt::Display| {
            Error::new(
                ErrorKind::Io,
                format!("cannot write surrogate file {}: {e}", path.display()),
            )
        };
        let name = path.file_name().ok_or_else(|| io(&"no file name"))?;
        let mut tmp = PathBuf::from(path);
        tmp.set_file_name(format!("{}.tmp", name.to_string_lossy()));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&file::encode(self))?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io(&e));
        }
        // Make the rename durable; best effort (directories cannot be opened everywhere).
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Reads a whole file written by [`Surrogates::save`] into memory (18 B a row; to keep it
    /// on disk, open it with [`SurrogateFile::open`]). Format 2 is in [`file`]; format 1, the
    /// first one, little-endian:
    ///
    /// ```text
    /// 0  magic "EMBSURR1"    8 B     16 dim u32          32 checkpoint version u64
    /// 8  format version u32  (1)     20 k u32            40 count n u64
    /// 12 metric u8 (0 cosine, 1 l2)  24 max_dist f32     48 ids u64 x n, alt u64 x n,
    /// 13 popularity u8, 2 B zero     28 4 B zero            dist f16 x n, crc32 u32
    /// ```
    ///
    /// Checksums cover every byte. Errors: Io (with the path) when the file cannot be read;
    /// Corrupt when the magic, version, size, checksum or contents are wrong (ids not strictly
    /// increasing, a surrogate that is the row itself or not one of the ids, a distance
    /// outside `[0, max_dist]`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = fs::read(path).map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot read surrogate file {}: {e}", path.display()))
        })?;
        Self::decode(&bytes)
            .map_err(|m| Error::corrupt(format!("surrogate file {}: {m}", path.display())))
    }

    fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        check_magic(b)?;
        match u32::from_le_bytes([b[8], b[9], b[10], b[11]]) {
            1 => Self::decode_v1(b),
            file::FORMAT_V2 => file::decode(b),
            v => Err(format!("unsupported format version {v}, expected 1 or {}", file::FORMAT_V2)),
        }
    }

    /// Format 1, which files are no longer written in (kept to test reading it).
    #[cfg(test)]
    fn encode_v1(&self) -> Vec<u8> {
        let n = self.ids.len();
        let mut b = Vec::with_capacity(HEADER + 18 * n + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[self.config.metric.code(), u8::from(self.config.popularity), 0, 0]);
        b.extend_from_slice(&(self.dim as u32).to_le_bytes());
        b.extend_from_slice(&(self.config.k as u32).to_le_bytes());
        b.extend_from_slice(&self.config.max_dist.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
        self.ids.iter().chain(&self.alt).for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        self.dist.iter().for_each(|d| b.extend_from_slice(&d.to_bits().to_le_bytes()));
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode_v1(b: &[u8]) -> std::result::Result<Self, String> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
        if b.len() < HEADER + 4 {
            return Err(format!(
                "too short: {} bytes, header and checksum need {}",
                b.len(),
                HEADER + 4
            ));
        }
        let n = u64_at(40);
        let want = usize::try_from(n).ok().and_then(|n| n.checked_mul(18)?.checked_add(HEADER + 4));
        if want != Some(b.len()) {
            return Err(format!("size mismatch: {} bytes for {n} rows", b.len()));
        }
        let body = &b[..b.len() - 4];
        let (stored, computed) = (u32_at(body.len()), crc32fast::hash(body));
        if stored != computed {
            return Err(format!("checksum mismatch: stored {stored:08x}, computed {computed:08x}"));
        }
        let metric = Metric::from_code(b[12]).ok_or(format!("unknown metric code {}", b[12]))?;
        if b[13] > 1 {
            return Err(format!("bad popularity flag {}", b[13]));
        }
        let config = SurrogateConfig {
            k: u32_at(20) as usize,
            metric,
            max_dist: f32::from_bits(u32_at(24)),
            popularity: b[13] == 1,
        };
        config.validate().map_err(|e| format!("bad config: {e}"))?;
        let dim = u32_at(16) as usize;
        if dim == 0 {
            return Err("dim must be at least 1, got 0".into());
        }
        let n = n as usize;
        let ids: Vec<u64> = (0..n).map(|i| u64_at(HEADER + 8 * i)).collect();
        let alt: Vec<u64> = (0..n).map(|i| u64_at(HEADER + 8 * (n + i))).collect();
        let dist: Vec<f16> = (0..n)
            .map(|i| {
                let o = HEADER + 16 * n + 2 * i;
                f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]]))
            })
            .collect();
        if let Some(i) = (1..n).find(|&i| ids[i - 1] >= ids[i]) {
            return Err(format!("ids are not strictly increasing at row {i}"));
        }
        if ids.last() == Some(&NONE) {
            return Err(format!("id {NONE} is reserved for none"));
        }
        for i in 0..n {
            let (a, d) = (alt[i], dist[i].to_f32());
            if a == NONE {
                if d != f32::INFINITY {
                    return Err(format!("row {i}: no surrogate but distance {d}"));
                }
            } else if a == ids[i] {
                return Err(format!("row {i}: id {a} is its own surrogate"));
            } else if ids.binary_search(&a).is_err() {
                return Err(format!("row {i}: surrogate {a} is not an id of this table"));
            } else if !(d >= 0.0 && d <= config.max_dist) {
                return Err(format!("row {i}: distance {d} outside [0, {}]", config.max_dist));
            }
        }
        Ok(Self { ids, alt, dist, dim, config, version: u64_at(32) })
    }
}

/// One table's surrogates as the cache holds them: the whole build in memory (18 B a row,
/// counted in the cache's budget) or its file, read one block per lookup (8 B per 227 rows).
#[derive(Clone, Debug)]
pub enum SurrogateTable {
    /// A build in memory ([`build`] or [`Surrogates::load`]).
    Memory(Arc<Surrogates>),
    /// A build on disk ([`SurrogateFile::open`]).
    Disk(Arc<SurrogateFile>),
}

impl SurrogateTable {
    /// Bytes it holds in memory.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::Memory(s) => s.heap_bytes(),
            Self::Disk(f) => f.heap_bytes(),
        }
    }

    /// The embedding dimension of the rows it was built from.
    pub fn dim(&self) -> usize {
        match self {
            Self::Memory(s) => s.dim(),
            Self::Disk(f) => f.dim(),
        }
    }

    /// Rows (ids) in the build.
    pub fn len(&self) -> usize {
        match self {
            Self::Memory(s) => s.len(),
            Self::Disk(f) => f.len(),
        }
    }

    /// Whether the build has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The share of rows that have a surrogate.
    pub fn coverage(&self) -> f64 {
        match self {
            Self::Memory(s) => s.coverage(),
            Self::Disk(f) => f.coverage(),
        }
    }

    /// The table checkpoint version it was built from.
    pub fn version(&self) -> u64 {
        match self {
            Self::Memory(s) => s.version(),
            Self::Disk(f) => f.version(),
        }
    }

    /// Whether two handles share one build (counted once).
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Memory(a), Self::Memory(b)) => Arc::ptr_eq(a, b),
            (Self::Disk(a), Self::Disk(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl From<Arc<Surrogates>> for SurrogateTable {
    fn from(s: Arc<Surrogates>) -> Self {
        Self::Memory(s)
    }
}

impl From<Surrogates> for SurrogateTable {
    fn from(s: Surrogates) -> Self {
        Self::Memory(Arc::new(s))
    }
}

impl From<Arc<SurrogateFile>> for SurrogateTable {
    fn from(f: Arc<SurrogateFile>) -> Self {
        Self::Disk(f)
    }
}

impl From<SurrogateFile> for SurrogateTable {
    fn from(f: SurrogateFile) -> Self {
        Self::Disk(Arc::new(f))
    }
}

/// Checks the magic and that the version field is there (both formats start alike).
fn check_magic(b: &[u8]) -> std::result::Result<(), String> {
    if b.len() < 12 {
        return Err(format!("too short: {} bytes", b.len()));
    }
    if &b[..8] != MAGIC {
        return Err(format!("bad magic \"{}\", expected \"EMBSURR1\"", b[..8].escape_ascii()));
    }
    Ok(())
}

/// A ring slot of [`ClockMap`]: u32 halves give 4-byte alignment, so it packs into 20 bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Slot {
    key_lo: u32,
    key_hi: u32,
    /// The alt id; in a free slot, `alt_lo` is the next free slot.
    alt_lo: u32,
    alt_hi: u32,
    /// The distance as f16 bits; a distance is never negative, so the sign bit is free and
    /// holds the reference bit ([`REFERENCED`]).
    dist: u16,
    /// The caller's tag of the entry (the inference cache: the key's table).
    tag: u16,
}

/// The reference bit, in the sign bit of [`Slot::dist`].
const REFERENCED: u16 = 0x8000;

const _: () = assert!(std::mem::size_of::<Slot>() == 20);

impl Slot {
    fn key(&self) -> u64 {
        u64::from(self.key_hi) << 32 | u64::from(self.key_lo)
    }

    fn value(&self) -> (u64, f32) {
        let dist = f16::from_bits(self.dist & !REFERENCED).to_f32();
        (u64::from(self.alt_hi) << 32 | u64::from(self.alt_lo), dist)
    }

    fn referenced(&self) -> bool {
        self.dist & REFERENCED != 0
    }

    fn set_referenced(&mut self, on: bool) {
        self.dist = if on { self.dist | REFERENCED } else { self.dist & !REFERENCED };
    }

    fn new(key: u64, tag: u16, alt: u64, dist: f32) -> Self {
        Self {
            key_lo: key as u32,
            key_hi: (key >> 32) as u32,
            alt_lo: alt as u32,
            alt_hi: (alt >> 32) as u32,
            // `max(0.0)` also turns NaN into 0: the sign bit stays clear.
            dist: f16_up(f64::from(dist).max(0.0)).to_bits() & !REFERENCED,
            tag,
        }
    }
}

/// The L3 map: key → (alt key, distance), at most `capacity` entries, replaced by CLOCK.
///
/// A new entry takes a free slot, else the victim's slot, with its reference bit clear; the
/// hand then points past it, so it is the last the next sweep reaches. [`ClockMap::get`]
/// sets the bit; a sweep clears set bits as it passes and evicts the first clear one. All
/// slots are allocated up front, so [`ClockMap::heap_bytes`] is exact from the start.
#[derive(Clone, Debug)]
pub struct ClockMap {
    slots: Vec<Slot>,
    index: SlotIndex,
    /// Head of the free-slot list (chained through `alt_lo`), `NIL` if empty.
    free: u32,
    hand: usize,
    len: usize,
    cap: usize,
}

impl ClockMap {
    /// An upper bound on [`ClockMap::bytes_per_entry`] for capacities of 2 or more (a 20-byte
    /// slot plus at most 8/3 index buckets of 4 bytes), for sizing the map from a byte budget.
    pub const BYTES_PER_ENTRY_ESTIMATE: usize = 31;

    /// An empty map for up to `capacity` entries (0 keeps nothing; at most `2^32 - 2`, larger
    /// values are clamped: slots are u32 numbers). Allocates all of it now, about
    /// [`ClockMap::BYTES_PER_ENTRY_ESTIMATE`] bytes an entry.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(NIL as usize - 1);
        Self {
            slots: Vec::with_capacity(capacity),
            index: SlotIndex::with_capacity(capacity),
            free: NIL,
            hand: 0,
            len: 0,
            cap: capacity,
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index.find(key, |s| slots[s as usize].key()).map(|s| s as usize)
    }

    /// The (alt, dist) of `key`, setting its reference bit.
    pub fn get(&mut self, key: u64) -> Option<(u64, f32)> {
        let i = self.find(key)?;
        let s = &mut self.slots[i];
        s.set_referenced(true);
        Some(s.value())
    }

    /// The (alt, dist) of `key`, leaving its reference bit alone.
    pub fn peek(&self, key: u64) -> Option<(u64, f32)> {
        self.find(key).map(|s| self.slots[s].value())
    }

    /// The (tag, alt, dist) of `key`, leaving its reference bit alone.
    pub fn peek_tagged(&self, key: u64) -> Option<(u16, u64, f32)> {
        self.find(key).map(|s| {
            let (alt, dist) = self.slots[s].value();
            (self.slots[s].tag, alt, dist)
        })
    }

    /// Maps `key` to `(alt, dist)` (dist rounded up to f16), tag 0. An existing entry is
    /// updated in place (position and bit unchanged). Returns the key that left the map: the
    /// CLOCK victim, or `key` itself when the capacity is 0.
    pub fn insert(&mut self, key: u64, alt: u64, dist: f32) -> Option<u64> {
        self.insert_tagged(key, 0, alt, dist)
    }

    /// [`insert`](Self::insert) with the caller's `tag` kept beside the entry
    /// ([`peek_tagged`](Self::peek_tagged)).
    pub fn insert_tagged(&mut self, key: u64, tag: u16, alt: u64, dist: f32) -> Option<u64> {
        if let Some(s) = self.find(key) {
            let r = self.slots[s].referenced();
            self.slots[s] = Slot::new(key, tag, alt, dist);
            self.slots[s].set_referenced(r);
            return None;
        }
        if self.cap == 0 {
            return Some(key);
        }
        let (s, evicted) = if self.free != NIL {
            let s = self.free as usize;
            self.free = self.slots[s].alt_lo;
            (s, None)
        } else if self.slots.len() < self.cap {
            self.slots.push(Slot::new(0, 0, 0, 0.0));
            (self.slots.len() - 1, None)
        } else {
            let s = self.sweep();
            let old = self.slots[s].key();
            let slots = &self.slots;
            self.index.remove(old, |s| slots[s as usize].key());
            self.len -= 1;
            (s, Some(old))
        };
        self.slots[s] = Slot::new(key, tag, alt, dist);
        self.index.insert(key, s as u32);
        self.len += 1;
        evicted
    }

    /// Moves the hand to the victim (the map is full, so every slot is live) and past it.
    fn sweep(&mut self) -> usize {
        loop {
            let h = self.hand;
            self.hand = if h + 1 == self.cap { 0 } else { h + 1 };
            let was = self.slots[h].referenced();
            self.slots[h].set_referenced(false);
            if !was {
                return h;
            }
        }
    }

    /// Removes `key`, returning its (alt, dist).
    pub fn remove(&mut self, key: u64) -> Option<(u64, f32)> {
        let slots = &self.slots;
        let s = self.index.remove(key, |s| slots[s as usize].key())? as usize;
        let v = self.slots[s].value();
        self.slots[s] = Slot { alt_lo: self.free, ..Slot::new(0, 0, 0, 0.0) };
        self.free = s as u32;
        self.len -= 1;
        Some(v)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Heap bytes: the 20-byte slots and the index (4 B a bucket, load at most 3/4).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.index.heap_bytes()
    }

    /// [`ClockMap::heap_bytes`] per entry of capacity: 25.3 to 30.7 B for large capacities,
    /// depending on where the capacity falls against the index's power-of-two size.
    pub fn bytes_per_entry(&self) -> f64 {
        self.heap_bytes() as f64 / self.cap.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use proptest::prelude::*;

    fn gaussian(seed: u64, n: usize, dim: usize) -> Vec<f32> {
        let mut rng = crate::trace::SplitMix64::new(seed);
        (0..n * dim).map(|_| rng.normal() as f32).collect()
    }

    /// Descending, non-contiguous ids, so `build` has to sort them.
    fn ids(n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| 3 * (n as u64 - i) + 1).collect()
    }

    fn naive_dist(metric: Metric, a: &[f32], b: &[f32]) -> f64 {
        let norm = |r: &[f32]| r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        match metric {
            Metric::Cosine => {
                let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                (1.0 - dot / (norm(a) * norm(b))).clamp(0.0, 2.0)
            }
            Metric::L2 => {
                let sq: f64 =
                    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
                sq.sqrt() / norm(a)
            }
        }
    }

    /// Sorted distances from row `i` to every admissible other row.
    fn naive_nbrs(metric: Metric, rows: &[f32], dim: usize, i: usize) -> Vec<f64> {
        let row = |j: usize| &rows[j * dim..(j + 1) * dim];
        let zero = |j: usize| row(j).iter().all(|&v| v == 0.0);
        let mut d: Vec<f64> = (0..rows.len() / dim)
            .filter(|&j| j != i && !(metric == Metric::Cosine && zero(j)))
            .map(|j| naive_dist(metric, row(i), row(j)))
            .collect();
        d.sort_by(f64::total_cmp);
        d
    }

    #[test]
    fn knn_agrees_with_naive_reference() {
        for (seed, n, dim) in [(1u64, 37, 5), (2, 300, 16), (3, 601, 9)] {
            println!("seed {seed}, n {n}, dim {dim}");
            let mut rows = gaussian(seed, n, dim);
            rows[5 * dim..6 * dim].fill(0.0); // a zero row
            let (copy, k) = (rows[..dim].to_vec(), 7);
            rows[7 * dim..8 * dim].copy_from_slice(&copy); // a duplicate row (distance 0)
            for metric in [Metric::Cosine, Metric::L2] {
                let prep = Prepared::new(&rows, n, dim, metric);
                let tops: Vec<TopK> =
                    (0..n).step_by(QB).flat_map(|q0| prep.knn(q0, n.min(q0 + QB), k)).collect();
                for (i, top) in tops.iter().enumerate().filter(|&(i, _)| i != 5) {
                    let want = &naive_nbrs(metric, &rows, dim, i)[..k];
                    let mut got: Vec<f64> =
                        top.idx.iter().map(|&j| prep.dist(i, j as usize)).collect();
                    got.sort_by(f64::total_cmp);
                    assert!(
                        !top.idx.contains(&(i as u32)),
                        "{metric:?} row {i} is its own neighbour"
                    );
                    for (g, w) in got.iter().zip(want) {
                        assert!((g - w).abs() < 1e-5, "{metric:?} row {i}: {got:?} vs {want:?}");
                    }
                    assert_eq!(got.len(), k);
                }
            }
        }
    }

    #[test]
    fn nearest_surrogate_agrees_with_naive_and_respects_max_dist() {
        let (seed, n, dim) = (11u64, 400, 8);
        println!("seed {seed}");
        let rows = gaussian(seed, n, dim);
        let ids = ids(n);
        for metric in [Metric::Cosine, Metric::L2] {
            let nearest: Vec<f64> = (0..n).map(|i| naive_nbrs(metric, &rows, dim, i)[0]).collect();
            let mut sorted = nearest.clone();
            sorted.sort_by(f64::total_cmp);
            let max_dist = sorted[n / 2] as f32;
            let cfg = SurrogateConfig { metric, max_dist, popularity: false, ..Default::default() };
            let s = build(&ids, &rows, dim, None, &cfg, 0).unwrap();
            assert_eq!(s.len(), n);
            assert!((0.4..0.6).contains(&s.coverage()), "coverage {}", s.coverage());
            for i in 0..n {
                let got = s.get(ids[i]);
                let slack = 1e-3;
                if nearest[i] > f64::from(max_dist) + slack {
                    assert_eq!(got, None, "{metric:?} row {i}");
                    continue;
                }
                let Some((alt, d)) = got else {
                    assert!(nearest[i] > f64::from(max_dist) - slack, "{metric:?} row {i}");
                    continue;
                };
                assert_ne!(alt, ids[i]);
                let j = ids.iter().position(|&x| x == alt).unwrap();
                let true_d = naive_dist(metric, &rows[i * dim..][..dim], &rows[j * dim..][..dim]);
                assert!((true_d - nearest[i]).abs() < 1e-5, "{metric:?} row {i} not nearest");
                assert!(f64::from(d) >= true_d - 1e-6 && d <= max_dist, "{metric:?} row {i}: {d}");
            }
        }
        let none = SurrogateConfig { max_dist: 0.0, ..Default::default() };
        let s = build(&ids, &rows, dim, None, &none, 0).unwrap();
        assert_eq!(s.coverage(), 0.0);
        assert!(ids.iter().all(|&id| s.get(id).is_none()));
    }

    #[test]
    fn popularity_picks_the_most_counted_then_the_nearest() {
        // Unit vectors at these angles (rad) from id 10; 1.5 rad is 0.93 away under cosine.
        let ids = [10u64, 11, 12, 13, 14];
        let rows: Vec<f32> =
            [0.0f32, 0.1, 0.2, 0.3, 1.5].iter().flat_map(|a| [a.cos(), a.sin()]).collect();
        let counts = [0u64, 5, 9, 9, 100];
        let cfg = SurrogateConfig::default();
        let s = build(&ids, &rows, 2, Some(&counts), &cfg, 0).unwrap();
        assert_eq!(s.get(10).map(|v| v.0), Some(12)); // 12 and 13 tie at 9; 12 is nearer
        assert_eq!(s.get(11).map(|v| v.0), Some(12));
        assert_eq!(s.get(14), None); // nearest is 13 at 1 - cos(1.2) = 0.64 > 0.5
        let (_, d) = s.get(10).unwrap();
        assert!(f64::from(d) >= 1.0 - 0.2f64.cos() && d < 0.0199 + 0.0001, "{d}");
        let nearest = |cfg: &SurrogateConfig, counts: Option<&[u64]>| {
            build(&ids, &rows, 2, counts, cfg, 0).unwrap().get(10).map(|v| v.0)
        };
        assert_eq!(nearest(&SurrogateConfig { popularity: false, ..cfg }, Some(&counts)), Some(11));
        assert_eq!(nearest(&cfg, None), Some(11));
        assert_eq!(nearest(&SurrogateConfig { k: 1, ..cfg }, Some(&counts)), Some(11));
    }

    #[test]
    fn zero_rows_have_no_surrogate_and_are_none_under_cosine() {
        let ids = [1u64, 2, 3];
        let rows = [0.0f32, 0.0, 1.0, 0.0, 1.0, 0.1];
        let s = build(&ids, &rows, 2, None, &SurrogateConfig::default(), 0).unwrap();
        assert_eq!(s.get(1), None);
        assert_eq!(s.get(2).map(|v| v.0), Some(3));
        assert_eq!(s.get(3).map(|v| v.0), Some(2));
        let l2 = SurrogateConfig { metric: Metric::L2, max_dist: 2.0, ..Default::default() };
        let s = build(&ids, &rows, 2, None, &l2, 0).unwrap();
        assert_eq!(s.get(1), None);
        assert_eq!(s.get(42), None);
        assert!(build(&[], &[], 4, None, &l2, 0).unwrap().is_empty());
    }

    #[test]
    fn bad_input_gives_typed_errors() {
        let cfg = SurrogateConfig::default();
        let (inv, shape) = (ErrorKind::InvalidArgument, ErrorKind::ShapeMismatch);
        let (k0, nan) =
            (SurrogateConfig { k: 0, ..cfg }, SurrogateConfig { max_dist: f32::NAN, ..cfg });
        let many: Vec<u64> = (0..=MAX_ROWS as u64).collect();
        let fails = |r: Result<Surrogates>, kind: ErrorKind, msg: &str| {
            let e = r.unwrap_err();
            assert_eq!((e.kind(), e.message()), (kind, msg));
        };
        let msg = "rows has 3 values, expected ids.len() * dim = 2 * 2";
        fails(build(&[1, 2], &[1.0; 3], 2, None, &cfg, 0), shape, msg);
        let msg = "counts has 1 entries, expected 2";
        fails(build(&[1, 2], &[1.0; 2], 1, Some(&[1]), &cfg, 0), shape, msg);
        fails(build(&[1], &[], 0, None, &cfg, 0), inv, "dim must be in 1..=4294967295, got 0");
        fails(build(&[5, 3, 5], &[1.0; 3], 1, None, &cfg, 0), inv, "duplicate id 5");
        let msg = "row 1 (id 2) has a non-finite value NaN at column 0";
        fails(build(&[1, 2], &[1.0, 2.0, f32::NAN, 0.0], 2, None, &cfg, 0), inv, msg);
        let msg = "id 18446744073709551615 is reserved for none";
        fails(build(&[NONE], &[1.0], 1, None, &cfg, 0), inv, msg);
        fails(build(&[1], &[1.0], 1, None, &k0, 0), inv, "k must be in 1..=1024, got 0");
        fails(
            build(&[1], &[1.0], 1, None, &nan, 0),
            inv,
            "max_dist must be in [0, 65504], got NaN",
        );
        let msg =
            "1048577 rows exceed the exact build's limit of 1048576; an ann index is future work";
        fails(build(&many, &vec![0.0; MAX_ROWS + 1], 1, None, &cfg, 0), inv, msg);
    }

    fn sample() -> Surrogates {
        let cfg = SurrogateConfig { metric: Metric::L2, max_dist: 1.2, ..Default::default() };
        let counts: Vec<u64> = (0..40).map(|i| i % 7).collect();
        build(&ids(40), &gaussian(5, 40, 6), 6, Some(&counts), &cfg, 42).unwrap()
    }

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = sample();
        assert!(s.coverage() > 0.0 && s.coverage() < 1.0, "coverage {}", s.coverage());
        let path = dir.path().join("t.surr");
        s.save(&path).unwrap();
        let back = Surrogates::load(&path).unwrap();
        assert_eq!(back, s);
        assert_eq!((back.version(), back.dim(), back.config().k), (42, 6, 10));
        // Format 2: a header block, one data block, 8 B of fence and its crc32.
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * 4096 + 8 + 4);
        assert!(!dir.path().join("t.surr.tmp").exists());
        let empty = build(&[], &[], 3, None, &SurrogateConfig::default(), 0).unwrap();
        empty.save(&path).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), empty);
        let f = SurrogateFile::open(&path).unwrap();
        assert_eq!((f.len(), f.get(7).unwrap()), (0, None));
        // Format 1 files are still read into memory; on disk they are refused, with the way out.
        fs::write(&path, s.encode_v1()).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), s);
        let e = SurrogateFile::open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert!(e.message().contains("format version 1 cannot be read block by block"), "{e}");
    }

    /// A build over several blocks, with sparse ids: the file on disk answers every id (and
    /// ids between, below and above them) as the build in memory does, one block read per
    /// distinct block.
    #[test]
    fn file_on_disk_answers_like_the_build_in_memory() {
        let seed = 0x5eed_f11e;
        println!("seed {seed:#x}");
        let n = 3 * RECORDS_PER_BLOCK + 17;
        let mut rng = crate::trace::SplitMix64::new(seed);
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 1_000 + rng.next_u64() % 997).collect();
        let counts: Vec<u64> = (0..n as u64).map(|_| rng.next_u64() % 5).collect();
        let cfg = SurrogateConfig { max_dist: 0.12, ..Default::default() };
        let s = build(&ids, &gaussian(seed, n, 8), 8, Some(&counts), &cfg, 9).unwrap();
        assert!(s.coverage() > 0.0 && s.coverage() < 1.0, "coverage {}", s.coverage());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.surr");
        s.save(&path).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), s);
        let f = SurrogateFile::open(&path).unwrap();
        assert_eq!((f.len(), f.dim(), f.version(), *f.config()), (n, 8, 9, cfg));
        assert!((f.coverage() - s.coverage()).abs() < 1e-12);
        assert_eq!(
            f.heap_bytes() - std::mem::size_of::<SurrogateFile>(),
            4 * 8 + path.as_os_str().len()
        );
        let mut probe: Vec<u64> =
            ids.iter().flat_map(|&i| [i, i + 1, i.saturating_sub(1)]).collect();
        probe.extend([0, u64::MAX - 1, ids[n - 1] + 10_000]);
        for &id in &probe {
            assert_eq!(f.get(id).unwrap(), s.get(id), "id {id}");
        }
        let mut out = Vec::new();
        let reads = f.get_many(&probe, &mut out).unwrap();
        assert_eq!(out, probe.iter().map(|&i| s.get(i)).collect::<Vec<_>>());
        assert_eq!(reads, 4, "one read per block");
    }

    /// Damage anywhere in a format-2 file: `load` sees it (every byte is checksummed);
    /// `open` sees damage to the header, size or fences, and a damaged block is a Corrupt
    /// error when read.
    #[test]
    fn damaged_format_2_files_are_corrupt() {
        let n = RECORDS_PER_BLOCK + 5;
        let ids: Vec<u64> = (0..n as u64).collect();
        let s = build(&ids, &gaussian(3, n, 3), 3, None, &SurrogateConfig::default(), 1).unwrap();
        let good = file::encode(&s);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.surr");
        let fence_at = BLOCK * 3;
        for i in (0..good.len()).step_by(7).chain([12, 40, 48, fence_at, good.len() - 1]) {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(Surrogates::decode(&b).is_err(), "byte {i}");
            fs::write(&path, &b).unwrap();
            let in_block = (BLOCK..fence_at).contains(&i);
            match SurrogateFile::open(&path) {
                Err(e) => {
                    assert!(!in_block, "byte {i}: {e}");
                    assert_eq!(e.kind(), ErrorKind::Corruption, "byte {i}: {e}");
                }
                Ok(f) => {
                    assert!(in_block, "byte {i} opened");
                    let b = (i / BLOCK - 1) as u64;
                    let e = f.get(b * RECORDS_PER_BLOCK as u64).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::Corruption, "byte {i}: {e}");
                    assert!(e.message().contains(&format!("block {b}")), "{e}");
                }
            }
        }
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        let e = SurrogateFile::open(&path).unwrap_err();
        assert!(e.message().contains("size mismatch"), "{e}");
        let e = SurrogateFile::open(dir.path().join("missing.surr")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
    }

    #[test]
    fn damaged_files_are_corrupt_and_missing_ones_io() {
        let good = sample().encode_v1();
        let corrupt = |b: &[u8]| Surrogates::decode(b).unwrap_err();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            corrupt(&b);
        }
        assert!(corrupt(&good[..good.len() - 1]).starts_with("size mismatch"));
        assert!(corrupt(&good[..20]).starts_with("too short: 20 bytes"));
        let mut b = good.clone();
        b[..8].copy_from_slice(b"EMBSURR2");
        assert_eq!(corrupt(&b), "bad magic \"EMBSURR2\", expected \"EMBSURR1\"");
        // Well-formed checksums over bad contents.
        let recrc = |mut b: Vec<u8>| {
            let n = b.len() - 4;
            let crc = crc32fast::hash(&b[..n]);
            b[n..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut b = good.clone();
        b[HEADER..HEADER + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(corrupt(&recrc(b)), "ids are not strictly increasing at row 1");
        let mut b = good.clone();
        b[12] = 7;
        assert_eq!(corrupt(&recrc(b)), "unknown metric code 7");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.surr");
        let mut b = good.clone();
        b[HEADER + 3] ^= 1;
        fs::write(&path, &b).unwrap();
        let e = Surrogates::load(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert!(e.message().contains("bad.surr: checksum mismatch"), "{e}");
        let missing = dir.path().join("missing.surr");
        let e = Surrogates::load(&missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e
            .message()
            .starts_with(&format!("cannot read surrogate file {}", missing.display())));
        let e = sample().save(dir.path().join("no/such/dir.surr")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
    }

    #[test]
    fn clock_gives_referenced_entries_a_second_chance() {
        let mut m = ClockMap::new(4);
        for k in 1..=4 {
            assert_eq!(m.insert(k, k + 100, 0.25), None);
        }
        assert_eq!(m.get(1), Some((101, 0.25)));
        assert_eq!(m.peek(2), Some((102, 0.25))); // peek sets no bit
        assert_eq!(m.insert(5, 105, 0.0), Some(2)); // 1 was referenced: passed, bit cleared
        assert_eq!(m.insert(6, 106, 0.0), Some(3));
        assert_eq!(m.insert(7, 107, 0.0), Some(4));
        assert_eq!(m.insert(8, 108, 0.0), Some(1)); // the second sweep reaches 1 unreferenced
        assert_eq!(m.remove(6), Some((106, 0.0)));
        assert_eq!(m.insert(9, 109, 0.3), None); // takes the free slot
        assert_eq!(m.peek(9), Some((109, f16_up(0.3).to_f32())));
        assert!(m.peek(9).unwrap().1 >= 0.3);
        assert_eq!((m.len(), m.capacity()), (4, 4));
        let mut z = ClockMap::new(0);
        assert_eq!((z.insert(1, 2, 0.0), z.len()), (Some(1), 0));
    }

    /// A tag rides with its entry; the reference bit (in the distance's sign bit) never shows
    /// in a distance, and a re-insert keeps the bit while replacing the tag.
    #[test]
    fn tags_ride_with_entries_and_the_reference_bit_stays_out_of_distances() {
        let mut m = ClockMap::new(2);
        assert_eq!(m.insert_tagged(1, 65_535, 11, 2.5), None);
        assert_eq!(m.insert_tagged(2, 7, 12, 0.0), None);
        assert_eq!(m.get(1), Some((11, 2.5)));
        assert_eq!(m.peek_tagged(1), Some((65_535, 11, 2.5)));
        assert_eq!(m.insert_tagged(1, 3, 13, 1.0), None); // in place: bit kept, tag replaced
        assert_eq!(m.peek_tagged(1), Some((3, 13, 1.0)));
        assert_eq!(m.insert(3, 14, f32::NAN), Some(2)); // 1 is referenced: 2 goes
        assert_eq!(m.peek_tagged(3), Some((0, 14, 0.0)));
        assert_eq!(m.insert(4, 15, 0.5), Some(1)); // 1's bit was cleared by the last sweep
    }

    #[test]
    fn clock_is_bounded_and_counts_its_bytes() {
        let mut m = ClockMap::new(1000);
        let bytes = m.heap_bytes();
        for k in 0..10_000u64 {
            m.insert(k * 7919, k, 0.1);
            assert!(m.len() <= 1000);
            if k % 3 == 0 {
                m.get(k * 7919 / 2);
            }
        }
        assert_eq!((m.len(), m.heap_bytes()), (1000, bytes));
        assert_eq!(bytes, 1000 * 20 + 2048 * 4);
        assert!((25.0..=31.0).contains(&m.bytes_per_entry()));
        for cap in 2..3000 {
            let b = ClockMap::new(cap).bytes_per_entry();
            assert!(b <= ClockMap::BYTES_PER_ENTRY_ESTIMATE as f64, "cap {cap}: {b} B");
        }
    }

    /// The naive CLOCK the model test compares against: linear scans, a LIFO free list.
    #[derive(Default)]
    struct Model {
        slots: Vec<Option<(u64, u64, f32, bool)>>,
        free: Vec<usize>,
        hand: usize,
        cap: usize,
    }

    impl Model {
        fn pos(&self, key: u64) -> Option<usize> {
            self.slots.iter().position(|s| s.is_some_and(|s| s.0 == key))
        }

        fn peek(&self, key: u64) -> Option<(u64, f32)> {
            self.pos(key).and_then(|p| self.slots[p]).map(|s| (s.1, s.2))
        }

        fn insert(&mut self, key: u64, alt: u64, dist: f32) -> Option<u64> {
            if let Some(p) = self.pos(key) {
                let r = self.slots[p].unwrap().3;
                self.slots[p] = Some((key, alt, dist, r));
                return None;
            }
            if self.cap == 0 {
                return Some(key);
            }
            if let Some(p) = self.free.pop() {
                self.slots[p] = Some((key, alt, dist, false));
                return None;
            }
            if self.slots.len() < self.cap {
                self.slots.push(Some((key, alt, dist, false)));
                return None;
            }
            loop {
                let h = self.hand;
                self.hand = (h + 1) % self.cap;
                let s = self.slots[h].as_mut().unwrap();
                if s.3 {
                    s.3 = false;
                } else {
                    let old = s.0;
                    *s = (key, alt, dist, false);
                    return Some(old);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128, failure_persistence: None, ..ProptestConfig::default()
        })]
        /// Model-based: ClockMap agrees with the naive CLOCK on every result and every entry.
        #[test]
        fn clock_agrees_with_naive_model(
            cap in 0usize..8,
            ops in proptest::collection::vec((0u8..4, 0u64..16, 0u64..8), 1..300),
        ) {
            let mut m = ClockMap::new(cap);
            let mut r = Model { cap, ..Model::default() };
            for (op, key, alt) in ops {
                let dist = alt as f32 * 0.125;
                match op {
                    0 => prop_assert_eq!(m.insert(key, alt, dist), r.insert(key, alt, dist)),
                    1 => {
                        let want = r.pos(key).map(|p| {
                            let s = r.slots[p].as_mut().unwrap();
                            s.3 = true;
                            (s.1, s.2)
                        });
                        prop_assert_eq!(m.get(key), want);
                    }
                    2 => prop_assert_eq!(m.peek(key), r.peek(key)),
                    _ => {
                        let want = r.pos(key).map(|p| {
                            let s = r.slots[p].take().unwrap();
                            r.free.push(p);
                            (s.1, s.2)
                        });
                        prop_assert_eq!(m.remove(key), want);
                    }
                }
                let live = r.slots.iter().flatten().count();
                prop_assert_eq!(m.len(), live);
                prop_assert!(m.len() <= cap);
                for k in 0..16 {
                    prop_assert_eq!(m.peek(k), r.peek(k));
                }
            }
        }
    }

    /// Build time at the sizes of the note (release: `cargo test --release -- --ignored
    /// --nocapture build_time`); prints, asserts nothing about time.
    #[test]
    #[ignore]
    fn build_time() {
        for (n, dim) in [(20_000usize, 16usize), (100_000, 36)] {
            let rows = gaussian(7, n, dim);
            let ids: Vec<u64> = (0..n as u64).collect();
            let counts: Vec<u64> = (0..n as u64).map(|i| i % 97).collect();
            let t = std::time::Instant::now();
            let s = build(&ids, &rows, dim, Some(&counts), &SurrogateConfig::default(), 0).unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "n {n} dim {dim}: {secs:.2} s on {} threads, coverage {:.3}",
                rayon::current_num_threads(),
                s.coverage()
            );
        }
    }
}
