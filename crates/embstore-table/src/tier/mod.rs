//! The memory tier of a durable store with a memory budget: hot rows in memory, cold rows in
//! segments on disk, every key in memory (NeighborKV §2.1.2; Baidu MEM-PS §5, App. D).
//!
//! The tier is a layer under the table, over the shards' cold sides
//! ([`crate::shard::cold`]: cold index, disk locations, file slots, promote and demote):
//! - the **gate** (here): a call on a tiered table (lookup, contains, apply_gradients, assign,
//!   import, remove, meta) holds it for reading ([`Gate::enter`]), `clear`, `load` and
//!   demotion for writing; and the hooks a durable store calls ([`Gate::replay_cold`] at open,
//!   [`Gate::on_segment_committed`] after each segment, [`Gate::copy_cold`] in a rewrite);
//! - **fault-in** (`fault`): the call's cold ids are read from the segments and promoted before
//!   it runs, so it runs exactly as on an in-memory table and every row it touches is in memory;
//! - **reclaim** (`reclaim`): after the call (gate released) the table reports its memory to the
//!   store's [`Budget`] and evicts if the store is over it;
//! - **pins** (`pins`): rows a caller keeps in memory until it lets go.
//!
//! **A failed eviction** (a full disk: the dirty victims cannot be written) leaves every row in
//! memory, dirty, and is noted in the table's `stats()` and the [`Budget`]. The budget stays a
//! bound: a call that finds the store over its budget evicts first, on its own thread, and
//! fails with the eviction's error (`NoSpace`) before it changes anything; once space is freed
//! the next call's eviction succeeds and the call goes on.

mod fault;
mod keys;
mod pins;
mod reclaim;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::batch::Groups;
use crate::budget::{Budget, Reclaim};
use crate::disk::segment::{Record, SegmentReader};
use crate::shard::cold::{loc, loc_parts, FileTable, NONE};
use crate::shard::Shard;
use crate::version::Version;
use crate::Result;

pub(crate) use self::fault::Fault;
pub(crate) use self::pins::Pinning;
pub(crate) use self::reclaim::Evict;

use self::fault::Access;
use self::keys::Pins;

/// What the tier needs of the table above it: its shards, their layout and the tier it holds.
/// The tier's calls ([`Gate`], [`Fault`], [`Evict`], [`Pinning`]) are generic over it, so they
/// are compiled for the table itself: no dynamic call on the fault-in or lookup path.
pub(crate) trait Host: Send + Sync + Sized + 'static {
    /// The shards, each behind its lock.
    fn shards(&self) -> &[RwLock<Shard>];
    /// The shard of `key`.
    fn shard_of(&self, key: u64) -> usize;
    /// The shard of `key` among `num_shards` serving shards (the sharding contract).
    fn serving_shard_of(&self, key: u64, num_shards: usize) -> usize;
    /// Values per row.
    fn dim(&self) -> usize;
    /// Optimizer state floats per row.
    fn state_dim(&self) -> usize;
    /// Bytes per stored value (4, or 2 in a table of 16-bit rows).
    fn value_bytes(&self) -> usize;
    /// `ids` grouped by shard (checks that the table is live).
    fn group(&self, ids: &[u64]) -> Result<Groups>;
    /// Notes a version read from disk, so that later writes get greater ones.
    fn observe(&self, version: Version);
    /// The tier, in a table with a memory budget.
    fn tier(&self) -> Option<&Tier>;
}

/// Where a tiered table writes the dirty rows an eviction chose, durably, before it drops them:
/// its store. A trait, so that the tier names no store; called once per eviction round.
pub(crate) trait Spill<H>: Send + Sync + 'static {
    /// Writes the rows of `keys` of `table` that are dirty to a new segment, recorded in the
    /// manifest, and sets their disk locations (they are clean after it).
    fn write_rows_of(&self, table: &H, keys: &[u64]) -> Result<()>;
}

/// A table's [`Spill`] bound to it ([`Gate::attach_durable`]): fails once the store is gone.
type SpillFn = dyn Fn(&[u64]) -> Result<()> + Send + Sync;

/// The error of an eviction whose store is closed.
fn store_closed() -> crate::Error {
    crate::Error::new(crate::ErrorKind::Io, "the store of this table is closed; cannot evict")
}

/// A row on disk copied by a rewrite: (key, old location, new location).
pub(crate) type Moved = (u64, u64, u64);

/// A tiered table's state (see the module docs).
pub(crate) struct Tier {
    gate: RwLock<()>,
    files: RwLock<FileTable>,
    pins: Mutex<Pins>,
    budget: Arc<Budget>,
    /// This table's bytes, and of those the ones no eviction can free, as last added to the
    /// budget.
    reported: AtomicU64,
    reported_fixed: AtomicU64,
    /// Bytes of this table's pinned rows, as added to [`Budget::pinned`].
    pinned_bytes: AtomicU64,
    durable: OnceLock<Box<SpillFn>>,
    /// This table, for the evictor (set when its store attaches it).
    me: OnceLock<Weak<dyn Reclaim>>,
    /// Whether the table waits in the evictor's queue.
    queued: std::sync::atomic::AtomicBool,
    evicting: Mutex<()>,
    /// Bytes of rows brought in or moved out since the heap was last trimmed ([`TRIM_AFTER`]).
    churn: AtomicU64,
    counters: TierCounters,
}

impl Tier {
    /// The memory budget this table's tier is under (bytes).
    pub(crate) fn budget_limit(&self) -> u64 {
        self.budget.limit()
    }
}

impl Tier {
    /// The file table, held for reading: no rewrite releases a slot meanwhile (an export holds
    /// it from classifying keys to reading the rows on disk).
    pub(crate) fn files(&self) -> parking_lot::RwLockReadGuard<'_, FileTable> {
        self.files.read()
    }

    /// A file slot for a segment about to be written.
    pub(crate) fn reserve_file(&self) -> Result<u32> {
        self.files.write().reserve()
    }

    /// Frees a reserved file slot that no segment took.
    pub(crate) fn release_file(&self, slot: u32) {
        self.files.write().release(slot);
    }

    /// What the tier did, for `stats()`.
    pub(crate) fn counts(&self) -> TierCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        TierCounts {
            cold_reads: get(&c.cold_reads),
            cold_ios: get(&c.cold_ios),
            cold_bytes: get(&c.cold_bytes),
            evicted_rows: get(&c.evicted_rows),
            eviction_rounds: get(&c.eviction_rounds),
            errors: get(&c.errors),
            last_error: c.last_error.lock().clone(),
        }
    }
}

/// A copy of [`TierCounters`] (see [`Tier::counts`]).
#[derive(Debug, Default)]
pub(crate) struct TierCounts {
    pub(crate) cold_reads: u64,
    pub(crate) cold_ios: u64,
    pub(crate) cold_bytes: u64,
    pub(crate) evicted_rows: u64,
    pub(crate) eviction_rounds: u64,
    pub(crate) errors: u64,
    pub(crate) last_error: Option<String>,
}

impl Tier {
    /// A tier under `budget` for a table whose shards were just given their cold sides.
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Tier {
            gate: RwLock::new(()),
            files: RwLock::new(FileTable::default()),
            pins: Mutex::new(Pins::default()),
            budget,
            reported: AtomicU64::new(0),
            reported_fixed: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            durable: OnceLock::new(),
            me: OnceLock::new(),
            queued: std::sync::atomic::AtomicBool::new(false),
            evicting: Mutex::new(()),
            churn: AtomicU64::new(0),
            counters: TierCounters::default(),
        }
    }
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier").field("budget", &self.budget).finish_non_exhaustive()
    }
}

/// What the tier did, for `stats()`.
#[derive(Debug, Default)]
pub(crate) struct TierCounters {
    pub(crate) cold_reads: AtomicU64,
    pub(crate) cold_ios: AtomicU64,
    /// Bytes the direct reads of `cold_ios` moved (records read through the file layer, where
    /// no direct read is possible, are not counted).
    pub(crate) cold_bytes: AtomicU64,
    pub(crate) eviction_rounds: AtomicU64,
    pub(crate) evicted_rows: AtomicU64,
    pub(crate) evicted_dirty: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) last_error: Mutex<Option<String>>,
}

/// A call in flight on a table: holds a tiered table's gate for reading; when dropped, reports
/// the table's memory and evicts if the store is over budget.
pub(crate) struct Entered<'a, H: Host> {
    table: &'a H,
    gate: Option<RwLockReadGuard<'a, ()>>,
}

impl<H: Host> Drop for Entered<'_, H> {
    fn drop(&mut self) {
        if self.gate.take().is_some() {
            self.table.after_call();
        }
    }
}

impl Drop for Tier {
    /// Gives the table's bytes back to the budget (which may outlive it: a shared one).
    fn drop(&mut self) {
        self.budget.adjust_used(*self.reported.get_mut(), 0);
        self.budget.adjust_fixed(*self.reported_fixed.get_mut(), 0);
        self.budget.sub_pinned(*self.pinned_bytes.get_mut());
    }
}

/// The gate and the hooks, for the table above the tier ([`Host`]).
pub(crate) trait Gate: Host {
    /// Lets a tiered table write evicted rows through its store's `durable` (and its store's
    /// evictor reach it).
    fn attach_durable<D: Spill<Self>>(self: &Arc<Self>, durable: &Arc<D>) {
        if let Some(t) = self.tier() {
            let (store, table) = (Arc::downgrade(durable), Arc::downgrade(self));
            let spill = move |keys: &[u64]| match (store.upgrade(), table.upgrade()) {
                (Some(store), Some(table)) => store.write_rows_of(&table, keys),
                _ => Err(store_closed()),
            };
            let _ = t.durable.set(Box::new(spill));
            let me: Weak<dyn Reclaim> = Arc::downgrade(self) as Weak<Self>;
            if t.me.set(me.clone()).is_ok() {
                t.budget.register(me);
            }
        }
    }

    /// Starts a call on `ids`: a tiered table brings their rows into memory first, and notes
    /// an access to each of them.
    fn enter(&self, ids: &[u64]) -> Result<Entered<'_, Self>> {
        let Some(tier) = self.tier() else { return Ok(Entered { table: self, gate: None }) };
        self.make_room(tier)?;
        let gate = tier.gate.read();
        self.fault_in(tier, &self.group(ids)?, Access::Noted)?;
        Ok(Entered { table: self, gate: Some(gate) })
    }

    /// [`Gate::enter`] for a call that has grouped its ids already and probes every one of
    /// them in its shard pass, noting the accesses there
    /// ([`Shard::note_accesses`](crate::shard::Shard::note_accesses)): only the cold index is
    /// probed here, and only in shards with rows on disk. Lookups and `apply_gradients` take this
    /// path, so that a table whose rows are all in memory pays one probe per id, not two.
    fn enter_grouped(&self, groups: &Groups) -> Result<Entered<'_, Self>> {
        let Some(tier) = self.tier() else { return Ok(Entered { table: self, gate: None }) };
        self.make_room(tier)?;
        let gate = tier.gate.read();
        self.fault_in(tier, groups, Access::ByCaller)?;
        Ok(Entered { table: self, gate: Some(gate) })
    }

    /// Holds a tiered table's gate for writing: no call and no eviction runs meanwhile (for
    /// `clear` and `load`, which replace every row).
    fn exclusive(&self) -> Option<parking_lot::RwLockWriteGuard<'_, ()>> {
        self.tier().map(|t| t.gate.write())
    }

    /// Holds a tiered table's gate for reading (no `clear`, `load` or demotion meanwhile).
    fn shared_gate(&self) -> Option<RwLockReadGuard<'_, ()>> {
        // Recursive: a flush that rewrites must not queue behind a `clear` waiting for an
        // eviction that waits for this flush's manifest lock.
        self.tier().map(|t| t.gate.read_recursive())
    }

    /// A file slot for a segment about to be written, in a tiered table (`None` otherwise).
    fn reserve_file_slot(&self) -> Result<Option<u32>> {
        self.tier().map(|t| t.reserve_file()).transpose()
    }

    /// Frees a slot from [`Gate::reserve_file_slot`] that no segment took.
    fn release_file_slot(&self, slot: u32) {
        if let Some(t) = self.tier() {
            t.release_file(slot);
        }
    }

    /// A tiered table's file table, held for reading (see [`Tier::files`]).
    fn cold_files(&self) -> Option<parking_lot::RwLockReadGuard<'_, FileTable>> {
        self.tier().map(|t| t.files())
    }

    /// What the tier did, for `stats()` (all 0 without a memory budget).
    fn tier_counts(&self) -> TierCounts {
        self.tier().map(|t| t.counts()).unwrap_or_default()
    }

    /// Indexes the sealed segment `seq` (read by `r`, at open) as a tiered table's: its
    /// records make their keys cold ([`Gate::replay_footer`]) in a new file slot. Returns the
    /// records indexed.
    fn replay_cold(&self, seq: u64, r: SegmentReader, keep: Option<(usize, usize)>) -> Result<u64> {
        let tier = self.tier().expect("tiered");
        let slot = tier.files.write().reserve()?;
        let n = self.replay_footer(slot, &r, keep)?;
        tier.files.write().install(slot, seq, Arc::new(r));
        Ok(n)
    }

    /// The hook a durable store calls once the manifest records segment `seq`, written into
    /// file slot `file` of this tiered table: the segment (`reader`, `None` if it kept no row)
    /// takes its slot; after a rewrite or a clear (`cleared`), rows on disk move to their new
    /// records (`moved`) and the older segments' slots go.
    fn on_segment_committed(
        &self,
        file: u32,
        seq: u64,
        reader: Option<Arc<SegmentReader>>,
        cleared: bool,
        moved: &[Moved],
    ) {
        let Some(t) = self.tier() else { return };
        match reader {
            Some(r) => t.files.write().install(file, seq, r),
            None => t.files.write().release(file),
        }
        if cleared {
            // Rows on disk move to the new segment before the old ones' slots go; rows in
            // memory whose clean copy was in an old segment become dirty.
            let old = t.files.read().slots_below(seq);
            self.relocate_cold(moved, &old);
            let mut files = t.files.write();
            old.into_iter().for_each(|s| files.release(s));
        }
    }

    /// Appends every row on disk to `w` (a rewrite into file slot `file`): returns each one's
    /// key with its old and new location.
    fn copy_cold(
        &self,
        w: &mut crate::disk::segment::SegmentWriter,
        file: u32,
    ) -> Result<Vec<Moved>> {
        let Some(tier) = self.tier() else { return Ok(Vec::new()) };
        let old: std::collections::HashSet<u32> =
            tier.files.read().slots_below(w.seq()).into_iter().collect();
        let (d, sd) = (self.dim(), self.state_dim());
        let mut moved = Vec::new();
        for lock in self.shards().iter() {
            let mut cold: Vec<(u64, u64)> = {
                let shard = lock.read();
                shard.cold.as_ref().expect("tiered").index.iter().collect()
            };
            cold.sort_unstable_by_key(|&(_, l)| l);
            for part in cold.chunks(4096) {
                let records = self.read_records(&tier.files.read(), tier, part)?;
                for (&(key, old), rec) in part.iter().zip(records) {
                    let new = loc(file, w.records());
                    w.push(key, &rec.meta, &rec.values, &rec.state)?;
                    moved.push((key, old, new));
                }
            }
            // Rows read back since the rows in memory were written (they are clean, with their
            // only copy in a segment this rewrite drops): from memory, under the shard's lock.
            let mut shard = lock.write();
            let shard = &mut *shard;
            let keys: Vec<(u64, usize)> =
                shard.index.iter().map(|(k, s)| (k, s as usize)).collect();
            for (key, slot) in keys {
                let t = shard.cold.as_mut().expect("tiered");
                let disk = t.disk_loc[slot];
                if shard.meta[slot].is_dirty() || disk == NONE || !old.contains(&loc_parts(disk).0)
                {
                    continue;
                }
                t.disk_loc[slot] = loc(file, w.records());
                let meta = shard.meta[slot].unpack();
                shard.values.with_row(slot, |values| {
                    w.push(key, &meta, &values[..d], &shard.state.row(slot)[..sd])
                })?;
            }
        }
        Ok(moved)
    }

    /// After a rewrite (or a clear) superseded the segments in `old`: rows on disk that did not
    /// move since they were copied point to their new records, and rows in memory whose clean
    /// copy was in an old segment become dirty (the next flush or eviction writes them).
    fn relocate_cold(&self, moved: &[Moved], old: &[u32]) {
        let old: std::collections::HashSet<u32> = old.iter().copied().collect();
        let mut by_shard: Vec<Vec<&Moved>> = vec![Vec::new(); self.shards().len()];
        for m in moved {
            by_shard[self.shard_of(m.0)].push(m);
        }
        for (lock, moved) in self.shards().iter().zip(by_shard) {
            let mut shard = lock.write();
            let shard = &mut *shard;
            let Some(t) = shard.cold.as_mut() else { continue };
            for &&(key, from, to) in &moved {
                if t.index.get(key) == Some(from) {
                    // Replacing a key's payload cannot fail for lack of room.
                    let _ = t.index.insert(key, to);
                }
            }
            let stale: Vec<(u64, usize)> = shard
                .index
                .iter()
                .map(|(k, s)| (k, s as usize))
                .filter(|&(_, s)| {
                    t.disk_loc[s] != NONE && old.contains(&loc_parts(t.disk_loc[s]).0)
                })
                .collect();
            for (key, slot) in stale {
                shard.cold.as_mut().expect("tiered").disk_loc[slot] = NONE;
                shard.mark_dirty(slot, key);
            }
        }
    }

    /// The gate for writing, for the evictor: taken only while no call holds it, so that a
    /// waiting evictor never holds up the calls behind it (a writer waiting on a fair lock
    /// would); after ~5 ms of calls back to back it queues like any writer.
    fn gate_when_idle(tier: &Tier) -> parking_lot::RwLockWriteGuard<'_, ()> {
        for i in 0..200u32 {
            if let Some(g) = tier.gate.try_write() {
                return g;
            }
            if i < 20 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(25));
            }
        }
        tier.gate.write()
    }

    /// Rows on disk only.
    fn cold_rows(&self) -> usize {
        self.shards().iter().map(|s| s.read().cold_len()).sum()
    }

    /// Indexes the records of a sealed segment in `slot` (at open): a record makes its key
    /// cold at that location, a tombstone removes the key. With `keep = Some((s, n))` only the
    /// keys of serving shard `s` of `n` count.
    fn replay_footer(
        &self,
        slot: u32,
        reader: &SegmentReader,
        keep: Option<(usize, usize)>,
    ) -> Result<u64> {
        let mut n = 0;
        reader.for_each_footer(|i, key, tombstone, version| {
            self.observe(version);
            if keep.is_some_and(|(s, n)| self.serving_shard_of(key, n) != s) {
                return Ok(());
            }
            let mut shard = self.shards()[self.shard_of(key)].write();
            let t = shard.cold.as_mut().expect("tiered");
            if tombstone {
                t.index.remove(key);
            } else {
                t.index.insert(key, loc(slot, i))?;
            }
            n += 1;
            Ok(())
        })?;
        Ok(n)
    }

    /// The records of the rows `wanted` (key and disk location, captured with `files` held),
    /// read from disk without promoting them (for export); none without a memory tier.
    fn read_cold(&self, files: &FileTable, wanted: &[(u64, u64)]) -> Result<Vec<Record>> {
        let Some(tier) = self.tier() else { return Ok(Vec::new()) };
        self.read_records(files, tier, wanted)
    }
}

impl<H: Host> Gate for H {}
