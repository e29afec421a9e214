//! [`Table`]: a table's config, its shards and the calls that do not fit a more specific module
//! (`lookup`, `apply` and `write` hold the batch calls, `export` and `stats` the read-outs).
//!
//! A batch call groups its ids by shard ([`Groups`](crate::batch::Groups)), then runs the
//! shards on the [`Scheduler`] — each under its own lock: a shared lock for reads, an exclusive
//! one for writes. Every position of the batch belongs to exactly one shard, so the shards write
//! disjoint rows of the output.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use embstore_common::fmix64;
use embstore_common::shard::SHARD_SALT;
use parking_lot::RwLock;

use crate::batch::Groups;
use crate::budget::Budget;
use crate::counters::Counters;
use crate::sched::Scheduler;
use crate::shard::cold::ColdSide;
use crate::shard::Shard;
use crate::sketch::CountMin;
use crate::tier::{Fault, Gate, Host, Pinning, Tier};
use crate::version::{now_ms, Clock, Version};
use crate::{Error, ErrorKind, Result, TableConfig};
use embstore_policy::EvictionConfig;

/// Batches at least this long run their shards in parallel; shorter ones run on the calling
/// thread, where a hand-off to the pool would cost more than it saves.
const PARALLEL_MIN: usize = 2048;

/// An embedding table: rows of `embedding_dim` f32 values keyed by u64 ids, with their optimizer
/// state and metadata, split over shards. All methods take `&self` and are safe to call from
/// many threads at once.
pub struct Table {
    pub(crate) config: TableConfig,
    pub(crate) state_dim: usize,
    mask: u64,
    pub(crate) shards: Box<[RwLock<Shard>]>,
    pub(crate) counters: Counters,
    /// The admission sketch, made on first use: a table that never meets a new id, or one
    /// being loaded from a file, pays nothing for it.
    sketch: OnceLock<CountMin>,
    pub(crate) clock: Arc<Clock>,
    step: AtomicU64,
    dropped: AtomicBool,
    /// Its store was closed ([`Store::close`](crate::Store::close)).
    closed: AtomicBool,
    /// In a durable store: shards record removals, and `clear`/`load` set `cleared`.
    pub(crate) durable: AtomicBool,
    /// Every row was replaced (`clear`, `load`) since the last flush.
    pub(crate) cleared: AtomicBool,
    /// In a durable store with a memory budget: the memory tier (`tier`).
    pub(crate) tier: Option<Box<Tier>>,
    /// In a durable store: the table's id in the manifest.
    pub(crate) disk_id: AtomicU64,
    /// Moves on at the start and at the end of every `clear` and `load` (odd while one runs),
    /// so that a flush can tell it overlapped one.
    pub(crate) clear_epoch: AtomicU64,
    /// In a table that syncs: the state its shards share (`sync`).
    pub(crate) sync: OnceLock<Arc<crate::shard::sync::SyncShared>>,
    /// Whether (and how) the table scores its writes for prioritised sync.
    pub(crate) priority: parking_lot::RwLock<Option<Arc<crate::priority::TablePriority>>>,
    /// Prioritised sync switched off (a rollback runs).
    pub(crate) priority_off: AtomicBool,
    /// A witness's logs and healthy store (`sync::witness`).
    pub(crate) witness: OnceLock<Arc<crate::witness::TableWitness>>,
    /// Why writes are refused (a rollback runs): `sync::rollback`.
    pub(crate) paused: parking_lot::RwLock<Option<String>>,
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
                Shard::new(config.embedding_dim, config.dtype, state_dim, config.huge_pages)
                    .map(RwLock::new)
            })
            .collect::<Result<Box<[_]>>>()?;
        Ok(Self {
            mask: config.num_shards as u64 - 1,
            state_dim,
            shards,
            counters: Counters::default(),
            sketch: OnceLock::new(),
            clock,
            step: AtomicU64::new(0),
            dropped: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            durable: AtomicBool::new(false),
            cleared: AtomicBool::new(false),
            tier: None,
            disk_id: AtomicU64::new(0),
            clear_epoch: AtomicU64::new(0),
            sync: OnceLock::new(),
            priority: parking_lot::RwLock::new(None),
            priority_off: AtomicBool::new(false),
            witness: OnceLock::new(),
            paused: parking_lot::RwLock::new(None),
            config,
        })
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

    /// Sets the step counter (Adam's `t`), e.g. when rows and their state are restored from
    /// another table.
    pub fn set_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// Counts one `apply_gradients` call; returns its `t` (1-based).
    pub(crate) fn next_step(&self) -> u64 {
        self.step.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Rows stored.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum::<usize>() + self.cold_rows()
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `key`'s initial values to `out` (`D` floats), rounded to the table's dtype.
    pub fn initial_row(&self, key: u64, out: &mut [f32]) {
        self.config.initializer.fill(self.config.seed, key, out);
        self.config.dtype.round_slice(out);
    }

    /// Groups `ids` by shard (see [`Groups`]).
    pub(crate) fn group(&self, ids: &[u64]) -> Result<Groups> {
        self.check_live()?;
        Groups::new(ids, self.shards.len(), |k| self.shard_of(k))
    }

    #[inline]
    pub(crate) fn shard_of(&self, key: u64) -> usize {
        (fmix64(key ^ SHARD_SALT) & self.mask) as usize
    }
}

/// The sharding contract, kept here for its old path (`embstore_table::shard_of_key`); its home
/// is `embstore-common`, and `Table::shard_of` must place keys exactly as it does.
pub use embstore_common::shard_of_key;

impl Table {
    /// The admission sketch (made on first use), or `None` when admission is off.
    pub(crate) fn sketch(&self) -> Option<&CountMin> {
        (self.config.admission_min_count > 1)
            .then(|| self.sketch.get_or_init(|| CountMin::new(self.config.admission_sketch_width)))
    }

    pub(crate) fn sketch_bytes(&self) -> usize {
        self.sketch.get().map_or(0, CountMin::bytes)
    }

    /// Whether the table has been dropped from its store.
    pub(crate) fn dropped(&self) -> bool {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Marks the table as dropped from its store: later calls fail with `TableNotFound`.
    pub(crate) fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Relaxed);
    }

    /// Whether the table's store was closed.
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the table's store as closed (`open: false`) or open again (a close that could not
    /// flush): calls fail with [`ErrorKind::Closed`] while it is closed.
    pub(crate) fn set_closed(&self, closed: bool) {
        self.closed.store(closed, Ordering::Release);
    }

    /// Fails with `TableNotFound` once the table has been dropped from its store (a handle
    /// kept past `drop_table` must not keep training a table no store holds), and with
    /// `Closed` once its store was closed (its writes could never be flushed). Every call that
    /// reads or writes rows checks it, except [`Table::export`] (an iterator; callers check
    /// first), [`Table::stats`] and [`Table::set_step`].
    pub fn check_live(&self) -> Result<()> {
        if self.closed() {
            return Err(Error::new(
                ErrorKind::Closed,
                format!(
                    "table '{}' belongs to a store that was closed; open the store again and \
                     take a new handle",
                    self.name()
                ),
            ));
        }
        if self.dropped() {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("table '{}' was dropped from its store", self.name()),
            ));
        }
        Ok(())
    }

    /// Runs `f(shard, keys, positions)` for every shard with ids in `groups` on the
    /// [`Scheduler`] (in parallel for large batches); the first error wins.
    pub(crate) fn run<F>(&self, groups: &Groups, f: F) -> Result<()>
    where
        F: Fn(usize, &[u64], &[u32]) -> Result<()> + Sync,
    {
        let parallel = groups.keys.len() >= PARALLEL_MIN;
        Scheduler::global().run(self.shards.len(), parallel, |s| {
            let (keys, pos) = groups.shard(s);
            if keys.is_empty() {
                return Ok(());
            }
            f(s, keys, pos)
        })
    }

    /// Runs `f` on every shard under its write lock, in parallel; the first error wins.
    pub(crate) fn each_shard_mut<F>(&self, f: F) -> Result<()>
    where
        F: Fn(&mut Shard) -> Result<()> + Sync,
    {
        Scheduler::global().run(self.shards.len(), true, |s| f(&mut self.shards[s].write()))
    }

    pub(crate) fn check_rows(
        &self,
        what: &str,
        ids: usize,
        floats: usize,
        width: usize,
    ) -> Result<()> {
        if floats != ids * width {
            return Err(Error::shape(format!(
                "{what} must hold {ids} × {width} = {} floats for {ids} ids, got {floats}",
                ids * width
            )));
        }
        Ok(())
    }

    /// Removes every row, releases the memory, and resets the step counter and the admission
    /// sketch.
    pub fn clear(&self) -> Result<()> {
        self.check_live()?;
        self.check_writable()?;
        let _exclusive = self.exclusive();
        self.clear_epoch.fetch_add(1, Ordering::AcqRel);
        if self.durable.load(Ordering::Relaxed) {
            // Before the shards empty: a flush that runs meanwhile then drops every older file.
            self.cleared.store(true, Ordering::Relaxed);
        }
        let result = self.each_shard_mut(|shard| shard.clear());
        self.clear_epoch.fetch_add(1, Ordering::AcqRel);
        result?;
        if let Some(sketch) = self.sketch.get() {
            sketch.clear();
        }
        self.set_step(0);
        Ok(())
    }

    /// Removes rows whose last update is older than the table's TTL; returns how many. Without
    /// a TTL nothing expires.
    pub fn evict_expired(&self) -> Result<usize> {
        match self.config.ttl {
            Some(ttl) => self.evict_older_than(now_ms().saturating_sub(ttl.as_millis() as u64)),
            None => Ok(0),
        }
    }

    /// Removes rows whose last update (or creation) is before `cutoff_ms` (ms since the Unix
    /// epoch); returns how many. Shards left sparse release memory.
    pub fn evict_older_than(&self, cutoff_ms: u64) -> Result<usize> {
        self.check_live()?;
        let evicted = AtomicU64::new(0);
        self.each_shard_mut(|shard| {
            let old: Vec<u64> = shard
                .index
                .iter()
                .filter(|&(_, slot)| shard.meta[slot as usize].last_update_ms() < cutoff_ms)
                .map(|(k, _)| k)
                .collect();
            let n = old.iter().filter(|&&k| shard.remove(k)).count();
            evicted.fetch_add(n as u64, Ordering::Relaxed);
            shard.shrink_if_sparse().map(drop)
        })?;
        let n = evicted.into_inner() as usize + self.evict_cold_older_than(cutoff_ms)?;
        Counters::add(&self.counters.evicted, n);
        Ok(n)
    }

    /// The rows on disk of [`Table::evict_older_than`] (a table with a memory budget): their
    /// metadata is read from their segments a chunk at a time, without promoting them; the old
    /// ones are then brought in and removed, each only if it is still older than `cutoff_ms`
    /// (a write meanwhile keeps it). Returns how many were removed.
    fn evict_cold_older_than(&self, cutoff_ms: u64) -> Result<usize> {
        const CHUNK: usize = 1024;
        if self.tier().is_none() {
            return Ok(0);
        }
        let mut evicted = 0;
        for s in 0..self.shards.len() {
            let keys: Vec<u64> = self.shards[s].read().cold_entries().map(|(k, _)| k).collect();
            for keys in keys.chunks(CHUNK) {
                let old: Vec<u64> = {
                    // Held from taking each key's location to reading it (no rewrite between).
                    let Some(files) = self.cold_files() else { break };
                    let wanted: Vec<(u64, u64)> = {
                        let shard = self.shards[s].read();
                        keys.iter().filter_map(|&k| shard.cold_loc(k).map(|l| (k, l))).collect()
                    };
                    let records = self.read_cold(&files, &wanted)?;
                    wanted
                        .iter()
                        .zip(records)
                        .filter(|(_, r)| r.meta.last_update_ms < cutoff_ms)
                        .map(|((k, _), _)| *k)
                        .collect()
                };
                if old.is_empty() {
                    continue;
                }
                let entered = self.enter(&old)?;
                {
                    let mut shard = self.shards[s].write();
                    for &k in &old {
                        let expired = match shard.slot(k) {
                            Some(slot) => shard.meta[slot].last_update_ms() < cutoff_ms,
                            None => false,
                        };
                        if expired && shard.remove(k) {
                            evicted += 1;
                        }
                    }
                    shard.shrink_if_sparse()?;
                }
                // The shard's lock is released before the tier's guard, whose drop may make room.
                drop(entered);
            }
        }
        Ok(evicted)
    }

    /// Swaps every row (and the step counter) with `other`, a table of the same config, under
    /// all shard locks of both: readers see all of the old rows or all of the new.
    pub(crate) fn swap_rows(&self, other: &Table) {
        debug_assert_eq!(self.shards.len(), other.shards.len());
        self.clear_epoch.fetch_add(1, Ordering::AcqRel);
        let mut mine: Vec<_> = self.shards.iter().map(|s| s.write()).collect();
        let mut theirs: Vec<_> = other.shards.iter().map(|s| s.write()).collect();
        for (a, b) in mine.iter_mut().zip(theirs.iter_mut()) {
            std::mem::swap(&mut **a, &mut **b);
            // The sync state stays with its table (a table that syncs refuses a load).
            std::mem::swap(&mut a.sync, &mut b.sync);
        }
        let step = other.step.swap(self.step(), Ordering::Relaxed);
        self.set_step(step);
        for (a, b) in mine.iter_mut().zip(theirs.iter()) {
            a.attach_cold_like(b);
        }
        if self.durable.load(Ordering::Relaxed) {
            for shard in mine.iter_mut() {
                shard.track_changes();
                shard.mark_all_dirty(); // the loaded rows are written by the next flush
            }
            self.cleared.store(true, Ordering::Relaxed);
        }
        self.clear_epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// The memory tier, a layer under the table: the table hands it its shards and layout
/// ([`Host`]), and offers the tier's public calls.
impl Table {
    /// Makes this table tiered under `budget` (before any row is stored or replayed).
    pub(crate) fn enable_tier(
        &mut self,
        budget: Arc<Budget>,
        config: EvictionConfig,
    ) -> Result<()> {
        for (i, shard) in self.shards.iter().enumerate() {
            shard.write().attach_cold(ColdSide::new(&config, self.config.seed ^ i as u64)?);
        }
        self.tier = Some(Box::new(Tier::new(budget)));
        Ok(())
    }

    /// Whether the table has a memory tier (its store has a memory budget).
    pub fn is_tiered(&self) -> bool {
        self.tier.is_some()
    }

    /// Brings the rows of `ids` that are on disk into memory, as a call on them would, and
    /// returns how many it read; rows in memory count as used, ids with no row are ignored,
    /// and no value changes. For a pipeline that reads batch n+1's rows while batch n trains
    /// (pin them first, with [`Table::pin`], so that no eviction drops them before their
    /// batch). A no-op (0) on a table without a memory budget.
    pub fn prefetch(&self, ids: &[u64]) -> Result<usize> {
        Fault::prefetch(self, ids)
    }

    /// Pins the rows of `ids` in memory until [`Table::unpin`] (counted: pin twice, unpin
    /// twice). Fails with `Capacity` if the rows pinned in all the tables under the budget
    /// would exceed 60 % of it. Returns the bytes the pins of all the tables under the budget
    /// grew by (rows no pin held before; 0 without a budget).
    pub fn pin(&self, ids: &[u64]) -> Result<u64> {
        Pinning::pin(self, ids)
    }

    /// Releases pins taken by [`Table::pin`]. Where the rows they held leave the store over its
    /// budget (pinned rows may pass it), evicts the excess here, so that a store comes back
    /// under its budget when training stops, with no later call.
    pub fn unpin(&self, ids: &[u64]) {
        Pinning::unpin(self, ids)
    }
}

impl Host for Table {
    #[inline]
    fn shards(&self) -> &[RwLock<Shard>] {
        &self.shards
    }

    #[inline]
    fn shard_of(&self, key: u64) -> usize {
        Table::shard_of(self, key)
    }

    fn serving_shard_of(&self, key: u64, num_shards: usize) -> usize {
        shard_of_key(key, num_shards)
    }

    #[inline]
    fn dim(&self) -> usize {
        self.config.embedding_dim
    }

    #[inline]
    fn state_dim(&self) -> usize {
        self.state_dim
    }

    #[inline]
    fn value_bytes(&self) -> usize {
        self.config.dtype.bytes()
    }

    fn group(&self, ids: &[u64]) -> Result<Groups> {
        Table::group(self, ids)
    }

    fn observe(&self, version: Version) {
        self.clock.observe(version);
    }

    #[inline]
    fn tier(&self) -> Option<&Tier> {
        self.tier.as_deref()
    }
}

/// Whether a table's rows have the layout `dim` values and `state_dim` state floats.
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

#[cfg(test)]
mod tests {
    use crate::{shard_of_key, Store, TableConfig};

    /// A table places keys exactly as the sharding contract does (servers and clients route by
    /// `shard_of_key`, the table by its own mask).
    #[test]
    fn shard_of_agrees_with_shard_of_key() {
        for num_shards in [1, 2, 8, 64] {
            let mut config = TableConfig::new("t", 4);
            config.num_shards = num_shards;
            let t = Store::new().create_table(config).unwrap();
            for key in (0..2000u64).chain([u64::MAX, 1 << 63, 7 << 40 | 3]) {
                assert_eq!(t.shard_of(key), shard_of_key(key, num_shards), "key {key}");
            }
        }
    }
}
