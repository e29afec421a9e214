//! [`Table`]: sharded rows, batch operations, admission and expiry.
//!
//! A batch call groups its ids by shard with one counting sort (stable, so the ids of a shard
//! keep their batch order), then runs the shards — in parallel on the rayon pool when the batch
//! is large — each under its own lock: a shared lock for reads, an exclusive one for writes.
//! Every position of the batch belongs to exactly one shard, so the shards write disjoint rows of
//! the output.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use embstore_index::hash::hash as fmix64;
use embstore_index::{NeighborHash, MISSING};
use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};
use rayon::prelude::*;

use crate::arena::Arena;
use crate::config::{NonFinite, TableConfig};
use crate::sketch::CountMin;
use crate::version::{now_ms, Clock, Version};
use crate::{Error, ErrorKind, Result};

/// Batches at least this long run their shards in parallel; shorter ones run on the calling
/// thread, where a hand-off to the pool would cost more than it saves.
const PARALLEL_MIN: usize = 2048;
/// Rows ahead of the copy that are prefetched.
const PREFETCH_AHEAD: usize = 8;
/// Threads a batch call may use, the caller's included: the cores, or `EMBSTORE_THREADS` when
/// that variable is set (1: every call runs on the caller's thread alone).
pub fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("EMBSTORE_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

/// The threads that run shards beside the calling thread: [`threads`] − 1 of them (at least
/// one, unused when [`threads`] is 1). Built on first use.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads().saturating_sub(1).max(1))
            .thread_name(|i| format!("embstore-{i}"))
            .build()
            .expect("the embstore thread pool starts")
    })
}

/// Salt of the shard hash, so that shard bits and the index's home bits are independent.
const SHARD_SALT: u64 = 0x2545_f491_4f6c_dd1d;

/// How far ahead of this store's clock an imported version may be: one day.
const MAX_CLOCK_AHEAD_MS: u64 = 24 * 3600 * 1000;

/// One shard's unique ids and their summed gradients (`[U, D]`, row-major).
type Coalesced = (Vec<u64>, Vec<f32>);

/// The optimizer state that `write_rows` gives each row.
#[derive(Clone, Copy)]
enum StateIn<'a> {
    /// Keep an existing row's state (a new row gets the initial state).
    Keep,
    /// The optimizer's initial state.
    Init,
    /// `[B, S]`, row-major.
    Given(&'a [f32]),
}

/// What `lookup` does for an id that has no row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMiss {
    /// Return the initial value and store it (training). With admission on, the row is stored
    /// only once the id has been seen often enough; until then the initial value is returned.
    #[default]
    Init,
    /// Return zeros; store nothing (serving).
    Zeros,
    /// Fail with [`ErrorKind::KeyNotFound`].
    Error,
}

/// A row's metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowMeta {
    /// Version of the last write (0 for a row that still holds its initial value).
    pub version: Version,
    /// Writes to the row (optimizer steps and assignments).
    pub update_count: u64,
    /// Time of the last write, or of the row's creation, in ms since the Unix epoch.
    pub last_update_ms: u64,
}

/// Counters and sizes of a table (see [`Table::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Rows stored.
    pub rows: usize,
    /// Bytes of memory held: indexes, arenas, metadata, sketch.
    pub bytes: usize,
    /// Looked-up ids that had a row.
    pub hits: u64,
    /// Looked-up ids that had no row.
    pub misses: u64,
    /// Rows created.
    pub inserts: u64,
    /// Row writes: optimizer steps and assignments.
    pub updates: u64,
    /// Rows removed by `remove`.
    pub removed: u64,
    /// Rows removed by `evict_expired`.
    pub evicted: u64,
    /// Gradients dropped because their id was not admitted yet.
    pub dropped_unadmitted: u64,
    /// Ids skipped for a non-finite gradient (with [`NonFinite::Skip`]).
    pub skipped_non_finite: u64,
    /// `apply_gradients` calls so far (Adam's `t`).
    pub step: u64,
    /// Rows per shard.
    pub rows_per_shard: Vec<usize>,
}

/// One chunk of [`Table::export`]: `n` rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowChunk {
    /// `[n]` ids.
    pub ids: Vec<u64>,
    /// `[n, D]` values, row-major.
    pub values: Vec<f32>,
    /// `[n, S]` optimizer state, row-major (`S` = [`Table::state_dim`]).
    pub state: Vec<f32>,
    /// `[n]` metadata.
    pub meta: Vec<RowMeta>,
}

impl RowChunk {
    /// Rows in the chunk.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the chunk holds no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The rows of one shard.
struct Rows {
    index: NeighborHash,
    values: Arena,
    state: Arena,
    meta: Vec<RowMeta>,
    free: Vec<usize>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    updates: AtomicU64,
    removed: AtomicU64,
    evicted: AtomicU64,
    dropped_unadmitted: AtomicU64,
    skipped_non_finite: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: usize) {
        if n > 0 {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Ids grouped by shard: `keys[bounds[s]..bounds[s + 1]]` are shard `s`'s ids, in batch order,
/// and `pos` gives each one's position in the batch.
struct Groups {
    keys: Vec<u64>,
    pos: Vec<u32>,
    bounds: Vec<usize>,
}

/// A raw pointer that shard tasks share to write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
struct SharedOut<T>(*mut T);
// SAFETY: only used to write disjoint elements from different threads (every batch position
// belongs to exactly one shard); the buffer outlives the scoped parallel loop.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The `len` elements starting at `start`.
    ///
    /// # Safety
    /// The range must be inside the buffer and no other live reference may overlap it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: forwarded from this function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// An embedding table: rows of `embedding_dim` f32 values keyed by u64 ids, with their optimizer
/// state and metadata, split over shards. All methods take `&self` and are safe to call from
/// many threads at once.
pub struct Table {
    config: TableConfig,
    state_dim: usize,
    mask: u64,
    shards: Box<[RwLock<Rows>]>,
    counters: Counters,
    sketch: Option<CountMin>,
    clock: Arc<Clock>,
    step: AtomicU64,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Table {
    /// A table on its own (replica 0); a [`Store`](crate::Store) makes them for its tables.
    pub fn new(config: TableConfig) -> Result<Self> {
        Self::with_clock(config, Arc::new(Clock::new(0)))
    }

    pub(crate) fn with_clock(config: TableConfig, clock: Arc<Clock>) -> Result<Self> {
        config.validate()?;
        let state_dim = config.optimizer.state_dim(config.embedding_dim);
        let shards = (0..config.num_shards)
            .map(|_| {
                let index = NeighborHash::with_config(embstore_index::Config {
                    huge_pages: config.huge_pages,
                    ..embstore_index::Config::default()
                })?;
                Ok(RwLock::new(Rows {
                    index,
                    values: Arena::new(config.embedding_dim, config.huge_pages),
                    state: Arena::new(state_dim, config.huge_pages),
                    meta: Vec::new(),
                    free: Vec::new(),
                }))
            })
            .collect::<Result<Box<[_]>>>()?;
        let sketch =
            (config.admission_min_count > 1).then(|| CountMin::new(config.admission_sketch_width));
        Ok(Self {
            mask: config.num_shards as u64 - 1,
            state_dim,
            shards,
            counters: Counters::default(),
            sketch,
            clock,
            step: AtomicU64::new(0),
            config,
        })
    }

    pub(crate) fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    /// The table's configuration.
    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Values per row (`D`).
    pub fn dim(&self) -> usize {
        self.config.embedding_dim
    }

    /// Optimizer state floats per row (`S`).
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// `apply_gradients` calls so far.
    pub fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    /// Rows stored.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().index.len()).sum()
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `key`'s initial values to `out` (`D` floats).
    pub fn initial_row(&self, key: u64, out: &mut [f32]) {
        self.config.initializer.fill(self.config.seed, key, out);
    }

    #[inline]
    fn shard_of(&self, key: u64) -> usize {
        (fmix64(key ^ SHARD_SALT) & self.mask) as usize
    }

    fn group(&self, ids: &[u64]) -> Result<Groups> {
        if ids.len() > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "a batch holds at most 2^32 - 1 ids, got {}",
                ids.len()
            )));
        }
        let n = self.shards.len();
        if n == 1 {
            return Ok(Groups {
                keys: ids.to_vec(),
                pos: (0..ids.len() as u32).collect(),
                bounds: vec![0, ids.len()],
            });
        }
        let shard: Vec<u16> = ids.iter().map(|&k| self.shard_of(k) as u16).collect();
        let mut bounds = vec![0usize; n + 1];
        for &s in &shard {
            bounds[s as usize + 1] += 1;
        }
        for s in 0..n {
            bounds[s + 1] += bounds[s];
        }
        let mut next = bounds[..n].to_vec();
        let mut keys = vec![0u64; ids.len()];
        let mut pos = vec![0u32; ids.len()];
        for (i, (&k, &s)) in ids.iter().zip(&shard).enumerate() {
            let at = &mut next[s as usize];
            keys[*at] = k;
            pos[*at] = i as u32;
            *at += 1;
        }
        Ok(Groups { keys, pos, bounds })
    }

    /// Runs `f(shard, keys, positions)` for every shard with ids in `groups`; the first error
    /// wins. Large batches are run by the calling thread together with the [`pool`]'s threads
    /// (one fewer than [`threads`]), each claiming the next unclaimed shard, so a call never has
    /// more runnable threads than there are cores and the caller is never put to sleep waiting
    /// for a hand-off. (With the caller idle on a full-size pool, a 4096-id lookup paid 21–28 µs
    /// of wake-up and contention on 2 cores; see docs/benchmarks.md.)
    fn run<F>(&self, groups: &Groups, f: F) -> Result<()>
    where
        F: Fn(usize, &[u64], &[u32]) -> Result<()> + Sync,
    {
        let n = self.shards.len();
        let task = |s: usize| {
            let (a, b) = (groups.bounds[s], groups.bounds[s + 1]);
            if a == b {
                return Ok(());
            }
            f(s, &groups.keys[a..b], &groups.pos[a..b])
        };
        let helpers = (threads() - 1).min(n - 1);
        if groups.keys.len() < PARALLEL_MIN || helpers == 0 {
            return (0..n).try_for_each(task);
        }
        let pool = pool();
        if pool.current_thread_index().is_some() {
            return (0..n).try_for_each(task); // called from a pool thread: no nesting
        }
        // Every participant takes the next unclaimed shard until none is left, so a helper that
        // wakes late takes fewer shards rather than holding up the call.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let first_error = Mutex::new(None::<Error>);
        let work = || loop {
            let s = next.fetch_add(1, Ordering::Relaxed);
            if s >= n {
                break;
            }
            if let Err(e) = task(s) {
                first_error.lock().get_or_insert(e);
            }
        };
        pool.in_place_scope(|scope| {
            for _ in 0..helpers {
                let work = &work;
                scope.spawn(move |_| work());
            }
            work();
        });
        first_error.into_inner().map_or(Ok(()), Err)
    }

    fn check_rows(&self, what: &str, ids: usize, floats: usize, width: usize) -> Result<()> {
        if floats != ids * width {
            return Err(Error::shape(format!(
                "{what} must hold {ids} × {width} = {} floats for {ids} ids, got {floats}",
                ids * width
            )));
        }
        Ok(())
    }

    /// Reads the rows of `ids` into `out` (`[B, D]`, row-major) and, when given, whether each id
    /// had a row into `found` (`[B]`). See [`OnMiss`] for ids without a row.
    pub fn lookup(
        &self,
        ids: &[u64],
        on_miss: OnMiss,
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<()> {
        let d = self.dim();
        self.check_rows("the output", ids.len(), out.len(), d)?;
        if let Some(found) = &found {
            if found.len() != ids.len() {
                return Err(Error::shape(format!(
                    "found mask must hold {} entries, got {}",
                    ids.len(),
                    found.len()
                )));
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        let groups = self.group(ids)?;
        let out_ptr = SharedOut(out.as_mut_ptr());
        let found_ptr = found.map(|f| SharedOut(f.as_mut_ptr()));
        // (batch position, id) of the first missing id, for OnMiss::Error.
        let first_missing = Mutex::new(None::<(u32, u64)>);
        self.run(&groups, |s, keys, pos| {
            // `pos` values are distinct batch positions below `ids.len()`, owned by this shard
            // alone, and `out` holds `ids.len()` rows and `found` `ids.len()` entries.
            // SAFETY: see above; each returned row is dropped before the next is made.
            let row = |i: usize| unsafe { out_ptr.slice(pos[i] as usize * d, d) };
            let set_found = |i: usize, v: bool| {
                if let Some(f) = found_ptr {
                    // SAFETY: see above.
                    unsafe { f.slice(pos[i] as usize, 1)[0] = v };
                }
            };
            let mut slots = vec![0u64; keys.len()];
            let mut missing = Vec::new();
            {
                let rows = self.shards[s].read();
                rows.index.get_batch(keys, &mut slots)?;
                for i in 0..keys.len() {
                    if let Some(&ahead) = slots.get(i + PREFETCH_AHEAD) {
                        if ahead != MISSING {
                            rows.values.prefetch(ahead as usize);
                        }
                    }
                    let slot = slots[i];
                    if slot != MISSING {
                        row(i).copy_from_slice(rows.values.row(slot as usize));
                        set_found(i, true);
                        continue;
                    }
                    set_found(i, false);
                    match on_miss {
                        OnMiss::Zeros => row(i).fill(0.0),
                        OnMiss::Init => {
                            self.initial_row(keys[i], row(i));
                            missing.push(i);
                        }
                        OnMiss::Error => {
                            let mut first = first_missing.lock();
                            if first.is_none_or(|(p, _)| pos[i] < p) {
                                *first = Some((pos[i], keys[i]));
                            }
                            row(i).fill(0.0);
                        }
                    }
                }
            }
            let misses = slots.iter().filter(|&&x| x == MISSING).count();
            Counters::add(&self.counters.hits, keys.len() - misses);
            Counters::add(&self.counters.misses, misses);
            if let Some(sketch) = &self.sketch {
                let min = self.config.admission_min_count;
                missing.retain(|&i| sketch.increment(keys[i]) >= min);
            }
            if missing.is_empty() {
                return Ok(());
            }
            let mut rows = self.shards[s].write();
            let now = now_ms();
            for i in missing {
                match rows.index.get(keys[i]) {
                    // Another thread stored the row between our two locks: return its values.
                    Some(slot) => row(i).copy_from_slice(rows.values.row(slot as usize)),
                    None => {
                        let meta = RowMeta { last_update_ms: now, ..RowMeta::default() };
                        let slot = self.insert_row(&mut rows, keys[i], meta)?;
                        rows.values.row_mut(slot).copy_from_slice(row(i));
                    }
                }
            }
            Ok(())
        })?;
        match first_missing.into_inner() {
            Some((_, key)) => Err(Error::new(
                ErrorKind::KeyNotFound,
                format!("id {key} is not stored in table '{}'", self.name()),
            )),
            None => Ok(()),
        }
    }

    /// Allocates a slot for `key` (not stored yet), indexes it and initialises its state and
    /// metadata; returns the slot, whose values the caller writes.
    fn insert_row(&self, rows: &mut Rows, key: u64, meta: RowMeta) -> Result<usize> {
        let slot = match rows.free.last() {
            Some(&slot) => slot,
            None => rows.meta.len(),
        };
        if !rows.values.ensure(slot + 1) || !rows.state.ensure(slot + 1) {
            return Err(Error::new(
                ErrorKind::Capacity,
                format!("out of memory for rows of table '{}'", self.name()),
            ));
        }
        rows.index.insert(key, slot as u64)?;
        if rows.free.pop().is_none() {
            rows.meta.push(meta);
        } else {
            rows.meta[slot] = meta;
        }
        Counters::add(&self.counters.inserts, 1);
        self.config.optimizer.init_state(rows.state.row_mut(slot));
        Ok(slot)
    }

    /// Sums the gradients of duplicate ids, then runs one optimizer step per unique id. `grads`
    /// is `[B, D]`, row-major; `lr` overrides the configured learning rate for this call.
    /// Returns the number of rows stepped.
    ///
    /// An id without a row gets its initial row first, unless admission is on and the id has
    /// not been seen `admission_min_count` times: then its gradient is dropped, as the row the
    /// forward pass used was never stored.
    pub fn apply_gradients(&self, ids: &[u64], grads: &[f32], lr: Option<f32>) -> Result<usize> {
        let d = self.dim();
        self.check_rows("grads", ids.len(), grads.len(), d)?;
        let lr = match lr {
            Some(lr) if !(lr.is_finite() && lr >= 0.0) => {
                return Err(Error::invalid(format!("lr must be finite and >= 0, got {lr}")))
            }
            Some(lr) => lr,
            None => self.config.optimizer.lr(),
        };
        // One pass over the bits (integer max vectorises; f32::max does not): the largest |g|,
        // and a value at or above the infinity pattern means a NaN or infinity is present.
        let max_abs_bits = grads.iter().map(|g| g.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
        if self.config.non_finite == NonFinite::Reject && max_abs_bits >= f32::INFINITY.to_bits() {
            if let Some(i) = grads.iter().position(|g| !g.is_finite()) {
                return Err(Error::new(
                    ErrorKind::NonFinite,
                    format!(
                        "gradient for id {} in table '{}' is not finite ({}); nothing was applied",
                        ids[i / d],
                        self.name(),
                        grads[i]
                    ),
                ));
            }
        }
        if ids.is_empty() {
            return Ok(0);
        }
        let groups = self.group(ids)?;
        let coalesce = |keys: &[u64], pos: &[u32]| {
            // Sum the gradients of duplicate ids, keeping first-seen order.
            let mut at: HashMap<u64, u32> = HashMap::with_capacity(keys.len());
            let mut uniq: Vec<u64> = Vec::with_capacity(keys.len());
            let mut sums: Vec<f32> = Vec::with_capacity(keys.len() * d);
            for (&k, &p) in keys.iter().zip(pos) {
                let g = &grads[p as usize * d..][..d];
                match at.entry(k) {
                    hashbrown::hash_map::Entry::Occupied(e) => {
                        let u = *e.get() as usize;
                        sums[u * d..][..d].iter_mut().zip(g).for_each(|(a, b)| *a += b);
                    }
                    hashbrown::hash_map::Entry::Vacant(e) => {
                        e.insert(uniq.len() as u32);
                        uniq.push(k);
                        sums.extend_from_slice(g);
                    }
                }
            }
            (uniq, sums)
        };
        // Finite gradients can still sum to infinity. When they cannot (|g| · B well below
        // f32::MAX, i.e. always in practice), each shard sums and steps in one pass; otherwise
        // every sum is computed and checked first, so that a rejected call writes nothing.
        let max_abs = f32::from_bits(max_abs_bits.min(f32::MAX.to_bits()));
        let may_overflow = self.config.non_finite == NonFinite::Reject
            && max_abs as f64 * ids.len() as f64 * 2.0 >= f32::MAX as f64;
        let mut summed: Option<Vec<Mutex<Coalesced>>> = None;
        if may_overflow {
            let all: Vec<_> =
                (0..self.shards.len()).map(|_| Mutex::new((Vec::new(), Vec::new()))).collect();
            self.run(&groups, |s, keys, pos| {
                *all[s].lock() = coalesce(keys, pos);
                Ok(())
            })?;
            for c in &all {
                let (uniq, sums) = &*c.lock();
                if let Some(i) = sums.iter().position(|g| !g.is_finite()) {
                    return Err(Error::new(
                        ErrorKind::NonFinite,
                        format!(
                            "summed gradient for id {} in table '{}' is not finite ({}); nothing \
                             was applied",
                            uniq[i / d],
                            self.name(),
                            sums[i]
                        ),
                    ));
                }
            }
            summed = Some(all);
        }
        let t = self.step.fetch_add(1, Ordering::Relaxed) + 1;
        let version = self.clock.tick();
        let now = now_ms();
        let stepped = AtomicU64::new(0);
        let optimizer = self.config.optimizer;
        self.run(&groups, |s, keys, pos| {
            let (uniq, sums) = match &summed {
                Some(all) => std::mem::take(&mut *all[s].lock()),
                None => coalesce(keys, pos),
            };
            let mut slots = vec![0u64; uniq.len()];
            let mut rows = self.shards[s].write();
            let rows = &mut *rows;
            rows.index.get_batch(&uniq, &mut slots)?;
            let (mut n, mut dropped, mut skipped) = (0usize, 0usize, 0usize);
            for (u, &key) in uniq.iter().enumerate() {
                if let Some(&ahead) = slots.get(u + PREFETCH_AHEAD) {
                    if ahead != MISSING {
                        rows.values.prefetch(ahead as usize);
                        rows.state.prefetch(ahead as usize);
                    }
                }
                let g = &sums[u * d..][..d];
                if self.config.non_finite == NonFinite::Skip && !g.iter().all(|x| x.is_finite()) {
                    skipped += 1;
                    continue;
                }
                let slot = if slots[u] != MISSING {
                    slots[u] as usize
                } else {
                    if let Some(sketch) = &self.sketch {
                        if sketch.estimate(key) < self.config.admission_min_count {
                            dropped += 1;
                            continue;
                        }
                    }
                    let slot = self.insert_row(rows, key, RowMeta::default())?;
                    self.initial_row(key, rows.values.row_mut(slot));
                    slot
                };
                let (w, st) = (rows.values.row_mut(slot), rows.state.row_mut(slot));
                optimizer.step(w, st, g, lr, t);
                let meta = &mut rows.meta[slot];
                meta.version = version;
                meta.update_count += 1;
                meta.last_update_ms = now;
                n += 1;
            }
            Counters::add(&self.counters.updates, n);
            Counters::add(&self.counters.dropped_unadmitted, dropped);
            Counters::add(&self.counters.skipped_non_finite, skipped);
            stepped.fetch_add(n as u64, Ordering::Relaxed);
            Ok(())
        })?;
        Ok(stepped.into_inner() as usize)
    }

    /// Sets the values of `ids` (`[B, D]`); ids without a row get one (admission does not
    /// apply). For a repeated id the last row wins. State of existing rows is kept.
    pub fn assign(&self, ids: &[u64], values: &[f32]) -> Result<()> {
        self.write_rows(ids, values, StateIn::Keep, None, true)
    }

    /// Writes rows exported from a table with the same `D` and optimizer: values `[B, D]`,
    /// optimizer state `[B, S]` (or the optimizer's initial state when `None`) and metadata
    /// (or a fresh version when `None`). Imported versions may not be more than a day ahead of
    /// this store's clock.
    pub fn import(
        &self,
        ids: &[u64],
        values: &[f32],
        state: Option<&[f32]>,
        meta: Option<&[RowMeta]>,
    ) -> Result<()> {
        let state = state.map_or(StateIn::Init, StateIn::Given);
        self.write_rows(ids, values, state, meta, true)
    }

    /// [`Table::import`] of rows read back from a checksummed file: whatever the table held
    /// when it was saved (an optimizer can drive state to infinity from finite gradients) is
    /// restored as it was.
    pub(crate) fn import_saved(&self, chunk: &RowChunk) -> Result<()> {
        self.write_rows(
            &chunk.ids,
            &chunk.values,
            StateIn::Given(&chunk.state),
            Some(&chunk.meta),
            false,
        )
    }

    fn write_rows(
        &self,
        ids: &[u64],
        values: &[f32],
        state: StateIn<'_>,
        meta: Option<&[RowMeta]>,
        check_finite: bool,
    ) -> Result<()> {
        let (d, sd) = (self.dim(), self.state_dim);
        self.check_rows("values", ids.len(), values.len(), d)?;
        if let StateIn::Given(state) = state {
            self.check_rows("state", ids.len(), state.len(), sd)?;
        }
        if let Some(meta) = meta {
            if meta.len() != ids.len() {
                return Err(Error::shape(format!(
                    "metadata must hold {} entries, got {}",
                    ids.len(),
                    meta.len()
                )));
            }
            let horizon = (now_ms() + MAX_CLOCK_AHEAD_MS) << 16;
            if let Some(i) = meta.iter().position(|m| m.version.timestamp > horizon) {
                return Err(Error::invalid(format!(
                    "version of id {} is more than a day ahead of this clock ({} ms since the \
                     epoch); nothing was written",
                    ids[i],
                    meta[i].version.millis()
                )));
            }
        }
        if check_finite {
            let bad = values.iter().position(|v| !v.is_finite()).map(|i| (i / d, "values"));
            let bad = bad.or_else(|| match state {
                StateIn::Given(st) => {
                    st.iter().position(|v| !v.is_finite()).map(|i| (i / sd.max(1), "state"))
                }
                _ => None,
            });
            if let Some((row, what)) = bad {
                return Err(Error::new(
                    ErrorKind::NonFinite,
                    format!("{what} for id {} are not finite; nothing was written", ids[row]),
                ));
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        let groups = self.group(ids)?;
        let version = self.clock.tick();
        let now = now_ms();
        if let Some(meta) = meta {
            meta.iter().for_each(|m| self.clock.observe(m.version));
        }
        self.run(&groups, |s, keys, pos| {
            let mut rows = self.shards[s].write();
            let rows = &mut *rows;
            for (&key, &p) in keys.iter().zip(pos) {
                let p = p as usize;
                let slot = match rows.index.get(key) {
                    Some(slot) => slot as usize,
                    None => self.insert_row(rows, key, RowMeta::default())?,
                };
                rows.values.row_mut(slot).copy_from_slice(&values[p * d..][..d]);
                match state {
                    StateIn::Keep => {}
                    StateIn::Init => self.config.optimizer.init_state(rows.state.row_mut(slot)),
                    StateIn::Given(st) => {
                        rows.state.row_mut(slot).copy_from_slice(&st[p * sd..][..sd])
                    }
                }
                let m = &mut rows.meta[slot];
                match meta {
                    Some(given) => *m = given[p],
                    None => {
                        m.version = version;
                        m.update_count += 1;
                        m.last_update_ms = now;
                    }
                }
            }
            Counters::add(&self.counters.updates, keys.len());
            Ok(())
        })
    }

    /// Swaps every row (and the step counter) with `other`, a table of the same config, under
    /// all shard locks of both: readers see all of the old rows or all of the new.
    pub(crate) fn swap_rows(&self, other: &Table) {
        debug_assert_eq!(self.shards.len(), other.shards.len());
        let mut mine: Vec<_> = self.shards.iter().map(|s| s.write()).collect();
        let mut theirs: Vec<_> = other.shards.iter().map(|s| s.write()).collect();
        for (a, b) in mine.iter_mut().zip(theirs.iter_mut()) {
            std::mem::swap(&mut **a, &mut **b);
        }
        let step = other.step.swap(self.step(), Ordering::Relaxed);
        self.step.store(step, Ordering::Relaxed);
    }

    /// Removes the rows of `ids`; returns how many were stored.
    pub fn remove(&self, ids: &[u64]) -> Result<usize> {
        let groups = self.group(ids)?;
        let removed = AtomicU64::new(0);
        self.run(&groups, |s, keys, _| {
            let mut rows = self.shards[s].write();
            let n = keys.iter().filter(|&&k| Self::remove_row(&mut rows, k)).count();
            removed.fetch_add(n as u64, Ordering::Relaxed);
            Ok(())
        })?;
        let n = removed.into_inner() as usize;
        Counters::add(&self.counters.removed, n);
        Ok(n)
    }

    fn remove_row(rows: &mut Rows, key: u64) -> bool {
        match rows.index.remove(key) {
            Some(slot) => {
                rows.meta[slot as usize] = RowMeta::default();
                rows.free.push(slot as usize);
                true
            }
            None => false,
        }
    }

    /// Writes whether each id has a row to `out` (`[B]`).
    pub fn contains(&self, ids: &[u64], out: &mut [bool]) -> Result<()> {
        if out.len() != ids.len() {
            return Err(Error::shape(format!(
                "output must hold {} entries, got {}",
                ids.len(),
                out.len()
            )));
        }
        let groups = self.group(ids)?;
        let out_ptr = SharedOut(out.as_mut_ptr());
        self.run(&groups, |s, keys, pos| {
            let mut hit = vec![false; keys.len()];
            self.shards[s].read().index.contains_batch(keys, &mut hit)?;
            for (&p, h) in pos.iter().zip(hit) {
                // SAFETY: positions are distinct, below `ids.len()` and owned by this shard.
                unsafe { out_ptr.slice(p as usize, 1)[0] = h };
            }
            Ok(())
        })
    }

    /// The metadata of each id's row, `None` for ids without one.
    pub fn meta(&self, ids: &[u64]) -> Vec<Option<RowMeta>> {
        ids.iter()
            .map(|&k| {
                let rows = self.shards[self.shard_of(k)].read();
                rows.index.get(k).map(|slot| rows.meta[slot as usize])
            })
            .collect()
    }

    /// Removes every row, releases the memory, and resets the step counter and the admission
    /// sketch.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut rows = shard.write();
            rows.index.clear();
            rows.values.clear();
            rows.state.clear();
            rows.meta = Vec::new();
            rows.free = Vec::new();
        }
        if let Some(sketch) = &self.sketch {
            sketch.clear();
        }
        self.step.store(0, Ordering::Relaxed);
    }

    /// Removes rows whose last update is older than the table's TTL; returns how many. Without
    /// a TTL nothing expires.
    pub fn evict_expired(&self) -> usize {
        match self.config.ttl {
            Some(ttl) => self.evict_older_than(now_ms().saturating_sub(ttl.as_millis() as u64)),
            None => 0,
        }
    }

    /// Removes rows whose last update (or creation) is before `cutoff_ms` (ms since the Unix
    /// epoch); returns how many.
    pub fn evict_older_than(&self, cutoff_ms: u64) -> usize {
        let evicted: usize = pool().install(|| {
            self.shards
                .par_iter()
                .map(|shard| {
                    let mut rows = shard.write();
                    let old: Vec<u64> = rows
                        .index
                        .iter()
                        .filter(|&(_, slot)| rows.meta[slot as usize].last_update_ms < cutoff_ms)
                        .map(|(k, _)| k)
                        .collect();
                    old.iter().filter(|&&k| Self::remove_row(&mut rows, k)).count()
                })
                .sum()
        });
        Counters::add(&self.counters.evicted, evicted);
        evicted
    }

    /// Counters and sizes.
    pub fn stats(&self) -> TableStats {
        let mut rows_per_shard = Vec::with_capacity(self.shards.len());
        let mut bytes = self.sketch.as_ref().map_or(0, CountMin::bytes);
        for shard in self.shards.iter() {
            let rows = shard.read();
            rows_per_shard.push(rows.index.len());
            bytes += rows.index.stats().bytes
                + rows.values.bytes()
                + rows.state.bytes()
                + rows.meta.capacity() * std::mem::size_of::<RowMeta>()
                + rows.free.capacity() * std::mem::size_of::<usize>();
        }
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TableStats {
            rows: rows_per_shard.iter().sum(),
            bytes,
            hits: get(&c.hits),
            misses: get(&c.misses),
            inserts: get(&c.inserts),
            updates: get(&c.updates),
            removed: get(&c.removed),
            evicted: get(&c.evicted),
            dropped_unadmitted: get(&c.dropped_unadmitted),
            skipped_non_finite: get(&c.skipped_non_finite),
            step: self.step(),
            rows_per_shard,
        }
    }

    /// Sets the step counter (Adam's `t`), e.g. when rows and their state are restored from
    /// another table.
    pub fn set_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// Every row, `chunk_rows` at a time (see [`Export`]).
    pub fn export(&self, chunk_rows: usize) -> Export<&Self> {
        Export::new(self, chunk_rows)
    }
}

/// Iterator over a table's rows in chunks. Each row is copied under its shard's lock, so every
/// row is consistent (values, state and metadata of one moment); the export as a whole is not a
/// point-in-time snapshot: rows written while it runs may appear in their old or new state, rows
/// removed meanwhile are skipped, and rows added to a shard already passed are not seen.
///
/// `T` is `&Table` from [`Table::export`], or an `Arc<Table>` for an export that owns its table.
pub struct Export<T: std::ops::Deref<Target = Table>> {
    table: T,
    chunk_rows: usize,
    shard: usize,
    keys: Vec<u64>,
    next: usize,
}

impl<T: std::ops::Deref<Target = Table>> Export<T> {
    /// An export of `table`'s rows in chunks of up to `chunk_rows` (at least 1).
    pub fn new(table: T, chunk_rows: usize) -> Self {
        Self { table, chunk_rows: chunk_rows.max(1), shard: 0, keys: Vec::new(), next: 0 }
    }
}

impl<T: std::ops::Deref<Target = Table>> std::fmt::Debug for Export<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("shard", &self.shard).field("next", &self.next).finish()
    }
}

impl<T: std::ops::Deref<Target = Table>> Iterator for Export<T> {
    type Item = RowChunk;

    fn next(&mut self) -> Option<RowChunk> {
        let t = &*self.table;
        loop {
            if self.next >= self.keys.len() {
                if self.shard >= t.shards.len() {
                    return None;
                }
                self.keys = t.shards[self.shard].read().index.iter().map(|(k, _)| k).collect();
                self.keys.sort_unstable();
                self.next = 0;
                self.shard += 1;
                continue;
            }
            let end = (self.next + self.chunk_rows).min(self.keys.len());
            let keys = &self.keys[self.next..end];
            self.next = end;
            let mut chunk = RowChunk::default();
            let rows = t.shards[t.shard_of(keys[0])].read();
            for &k in keys {
                if let Some(slot) = rows.index.get(k) {
                    let slot = slot as usize;
                    chunk.ids.push(k);
                    chunk.values.extend_from_slice(rows.values.row(slot));
                    chunk.state.extend_from_slice(rows.state.row(slot));
                    chunk.meta.push(rows.meta[slot]);
                }
            }
            if !chunk.is_empty() {
                return Some(chunk);
            }
        }
    }
}

/// Whether two tables' configs agree on what rows look like.
pub(crate) fn same_layout(t: &Table, dim: usize, state_dim: usize) -> Result<()> {
    if t.dim() != dim {
        return Err(Error::shape(format!(
            "embedding_dim mismatch for table '{}': expected {}, got {dim}",
            t.name(),
            t.dim()
        )));
    }
    if t.state_dim() != state_dim {
        return Err(Error::shape(format!(
            "optimizer state mismatch for table '{}': expected {} floats per row ({}), got {state_dim}",
            t.name(),
            t.state_dim(),
            t.config().optimizer.name()
        )));
    }
    Ok(())
}
