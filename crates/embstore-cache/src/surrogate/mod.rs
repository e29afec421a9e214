//! L3 of the cache (EVStore's EVProx, design note `evstore.md` §4): when a key misses L1 and
//! L2, serve the row of a close neighbour, its *surrogate*, if that row is resident, instead
//! of reading the backing store.
//!
//! ## Parts
//! - `build.rs` — [`build`] (offline, at checkpoint export, once per table): exact k-nearest
//!   neighbours within the table, then per row the most-accessed neighbour within `max_dist`
//!   (ties go to the nearest) → [`Surrogates`] (this file, with [`SurrogateConfig`] and
//!   [`SurrogateTable`]).
//! - `format.rs` — the file, both formats: format 2 (written; checksummed 4 KiB blocks,
//!   versioned with the checkpoint) and format 1 (still read); [`Surrogates::save`] and
//!   [`Surrogates::load`].
//! - `file.rs` — [`SurrogateFile`] (runtime): a format-2 file on disk, read one 4 KiB block
//!   per lookup.
//! - `map.rs` — [`ClockMap`] (runtime): the bounded key → (surrogate, distance) map of L3,
//!   replaced by CLOCK (a FIFO ring plus a reference bit).
//!
//! ```text
//! build  rows [N x D] --unit norm (cosine)--> tasks of 256 queries x blocks of 256 candidates
//!        --top-k per row--> exact f64 distance, keep <= max_dist --> max count (ties: nearest)
//! file   header block | blocks of 227 (id, alt, dist) records, sorted, crc32 each | block index
//!        (format.rs): loaded whole ([`Surrogates::load`], 18 B a row) or read a block per
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
use std::sync::Arc;

use half::f16;

use crate::{Error, Result};

mod build;
mod file;
mod format;
mod map;
#[cfg(test)]
mod testing;

pub use build::build;
pub use file::SurrogateFile;
pub use format::{BLOCK, RECORDS_PER_BLOCK};
pub use map::ClockMap;

/// "No surrogate": the `alt` of a row without one. It is reserved, so no id may take it.
pub const NONE: u64 = u64::MAX;

/// The most rows [`build`] accepts (2²⁰): about 25 minutes at D = 36 on 2 cores.
pub const MAX_ROWS: usize = 1 << 20;

/// The largest neighbour count `k`.
pub const MAX_K: usize = 1024;

/// The file format version written by [`Surrogates::save`] (1 is still read).
pub const FORMAT_VERSION: u32 = format::FORMAT_V2;

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
}

/// `d >= 0` rounded up to f16 (never below `d`), so thresholds on it stay conservative.
pub(super) fn f16_up(d: f64) -> f16 {
    let h = f16::from_f64(d);
    if h.to_f64() < d {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
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
