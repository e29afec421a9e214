//! The memory tier of a durable store with a memory budget: hot rows in memory, cold rows in
//! segments on disk, every key in memory (NeighborKV §2.1.2; Baidu MEM-PS §5, App. D).
//!
//! Each shard of a tiered table keeps, beside its hot index and arenas, a **cold index** (key →
//! where the row's latest record lives: file slot and record number, see [`loc`]), and per hot
//! slot its key, the location of its clean copy on disk ([`NONE`] if it has none) and the
//! replacement policy's state ([`crate::evict`]).
//!
//! **A call** on a tiered table (lookup, contains, apply_gradients, assign, import, remove,
//! meta) first takes the table's gate for reading, then *faults in* its ids: under each
//! shard's read lock it notes an access for every hot id and collects the cold ones; it reads
//! their records from the segments (each checked against its CRC and key) and promotes them
//! under the shard's write lock (unless another call did first). The call then runs exactly as
//! on an in-memory table, and every row it touches is in memory. After the call (gate released)
//! the table reports its memory to the store's [`Budget`] and evicts if the store is over it.
//!
//! **Eviction** of `n` bytes: the policy picks victims per shard, never pinned ones; victims
//! that are dirty are first written to a new segment (as a flush writes them: copied under the
//! shard lock, their dirty bit cleared, their disk location set) and made durable in the
//! manifest; then, under the gate for writing (no call in flight), every victim still clean and
//! unpinned moves to the cold index — no I/O for a clean row. A dirty row is never dropped
//! before its copy is durable; a pinned row is never evicted.
//!
//! **A failed eviction** (a full disk: the dirty victims cannot be written) leaves every row in
//! memory, dirty, and is noted in the table's `stats()` and the [`Budget`]. The budget stays a
//! bound: a call that finds the store over its budget evicts first, on its own thread, and
//! fails with the eviction's error (`NoSpace`) before it changes anything; once space is freed
//! the next call's eviction succeeds and the call goes on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use embstore_index::MISSING;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::batch::Groups;
use crate::budget::{Budget, Reclaim};
use crate::disk::plan::{merged_reads, DirectRange};
use crate::disk::segment::{Record, SegmentReader};
use crate::durable::Durable;
use crate::evict::EvictionConfig;
use crate::meta::PackedMeta;
use crate::shard::cold::{loc, loc_parts, ColdSide, FileTable, NONE};
use crate::{Error, ErrorKind, Result, RowChunk, Table};

/// The most the evictor frees in one round (~50k rows of D 32 with Adagrad): it lets go of
/// the shard locks it takes to choose and copy victims between rounds, so that a call waits for
/// one round at most, not for a whole large eviction (10 % of the room is ~120 MB at 50M rows).
const EVICTOR_ROUND: u64 = 16 << 20;
/// Victims chosen per hold of a shard's write lock.
const VICTIM_CHUNK: usize = 1024;
/// Pinned rows, of all the tables under a budget together, may take at most this share of it
/// (the rest is for the cache).
const MAX_PINNED_FRACTION: f64 = 0.6;
/// Cold rows a call reads and promotes per round: its temporaries (records and their page
/// buffers, ~5 KiB a row) stay near 20 MiB, which the allocator reuses from call to call,
/// however many rows the call brings in (a 300k-row lookup held 1.5 GiB of them at once).
const FAULT_ROUND: usize = 4096;
/// After a call that brought in, or an eviction that moved, at least this many bytes of rows,
/// the C allocator's free memory goes back to the kernel ([`trim_heap`]).
const TRIM_AFTER: u64 = 16 << 20;
/// After eviction a shard keeps arena room for a fifth more rows than it holds (eviction goes
/// down to 85 % of the room, so calls refill it without regrowing), and gives back the rest.
const KEEP_HEADROOM: usize = 5;

/// Gives the C allocator's free memory back to the kernel. glibc keeps freed blocks in its
/// heaps for reuse: after one 300k-row lookup over a 64 MiB budget, 1.56 GiB stayed resident
/// for the rest of the process (96 MiB after `malloc_trim`).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory of the allocator's heaps to the kernel;
    // it takes the allocator's locks and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The process's engine for batched cold reads (io_uring where the kernel has it).
fn engine() -> &'static dyn crate::disk::io::ReadEngine {
    static ENGINE: OnceLock<Box<dyn crate::disk::io::ReadEngine>> = OnceLock::new();
    &**ENGINE.get_or_init(crate::disk::io::default_engine)
}

/// Which part of the store's excess over its low mark a table evicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    /// Its share, by the bytes each table can free.
    Mine,
    /// As much as it can: what a call's own share left over.
    Rest,
}

/// What [`Table::report`] found: the store's bytes, whether this table grew since its last
/// report (a call brought rows in), and the bytes of this table that eviction can free (hot,
/// unpinned rows).
struct Report {
    used: u64,
    grew: bool,
    evictable: u64,
}

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
    durable: OnceLock<Weak<Durable>>,
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
    /// Notes `bytes` of rows brought in or moved out (their temporaries and freed storage).
    fn churned(&self, bytes: u64) {
        self.churn.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Trims the heap ([`trim_heap`]) once [`TRIM_AFTER`] bytes of rows came or went.
    fn trim_if_due(&self) {
        if self.churn.load(Ordering::Relaxed) >= TRIM_AFTER {
            self.churn.store(0, Ordering::Relaxed);
            trim_heap();
        }
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
    pub(crate) evicted_rows: u64,
    pub(crate) eviction_rounds: u64,
    pub(crate) errors: u64,
    pub(crate) last_error: Option<String>,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier").field("budget", &self.budget).finish_non_exhaustive()
    }
}

/// Pin counts by key. Ids are hashed with the index's mixer, not SipHash: a training step pins
/// and unpins every id of its batch, and ids come from the trainer, not from an adversary
/// (a caller that could choose colliding ids could as well pin the whole budget).
type Pins = HashMap<u64, u32, KeyHash>;
type KeyHash = std::hash::BuildHasherDefault<Fmix>;

/// A `Hasher` for `u64` keys: the index's 64-bit finaliser (murmur3's fmix64).
#[derive(Default)]
struct Fmix(u64);

impl std::hash::Hasher for Fmix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = embstore_index::hash::hash(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = embstore_index::hash::hash(self.0 ^ key);
    }
}

/// Takes one pin of each of `ids` (counts that reach 0 leave the map).
fn unpin_locked(pins: &mut Pins, ids: &[u64]) {
    for k in ids {
        if let Some(n) = pins.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                pins.remove(k);
            }
        }
    }
}

/// Who notes a call's accesses to rows already in memory, for the replacement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// `fault_in`, which probes the hot index for them.
    Noted,
    /// The call itself, in its shard pass ([`Table::note_accesses`]).
    ByCaller,
}

/// What the tier did, for `stats()`.
#[derive(Debug, Default)]
pub(crate) struct TierCounters {
    pub(crate) cold_reads: AtomicU64,
    pub(crate) cold_ios: AtomicU64,
    pub(crate) eviction_rounds: AtomicU64,
    pub(crate) evicted_rows: AtomicU64,
    pub(crate) evicted_dirty: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) last_error: Mutex<Option<String>>,
}

/// A call in flight on a table: holds a tiered table's gate for reading; when dropped, reports
/// the table's memory and evicts if the store is over budget.
pub(crate) struct Entered<'a> {
    table: &'a Table,
    gate: Option<RwLockReadGuard<'a, ()>>,
}

impl Drop for Entered<'_> {
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
        self.tier = Some(Box::new(Tier {
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
        }));
        Ok(())
    }

    /// Whether the table has a memory tier (its store has a memory budget).
    pub fn is_tiered(&self) -> bool {
        self.tier.is_some()
    }

    /// Lets a tiered table write evicted rows through its store's `durable` (and its store's
    /// evictor reach it).
    pub(crate) fn attach_durable(self: &Arc<Self>, durable: &Arc<Durable>) {
        if let Some(t) = &self.tier {
            let _ = t.durable.set(Arc::downgrade(durable));
            let me: Weak<dyn Reclaim> = Arc::downgrade(self) as Weak<Table>;
            if t.me.set(me.clone()).is_ok() {
                t.budget.register(me);
            }
        }
    }

    /// Starts a call on `ids`: a tiered table brings their rows into memory first, and notes
    /// an access to each of them.
    pub(crate) fn enter(&self, ids: &[u64]) -> Result<Entered<'_>> {
        let Some(tier) = &self.tier else { return Ok(Entered { table: self, gate: None }) };
        self.make_room(tier)?;
        let gate = tier.gate.read();
        self.fault_in(tier, &self.group(ids)?, Access::Noted)?;
        Ok(Entered { table: self, gate: Some(gate) })
    }

    /// [`Table::enter`] for a call that has grouped its ids already and probes every one of
    /// them in its shard pass, noting the accesses there ([`Table::note_accesses`]): only the
    /// cold index is probed here, and only in shards with rows on disk. Lookups and
    /// `apply_gradients` take this path, so that a table whose rows are all in memory pays one
    /// probe per id, not two.
    pub(crate) fn enter_grouped(&self, groups: &Groups) -> Result<Entered<'_>> {
        let Some(tier) = &self.tier else { return Ok(Entered { table: self, gate: None }) };
        self.make_room(tier)?;
        let gate = tier.gate.read();
        self.fault_in(tier, groups, Access::ByCaller)?;
        Ok(Entered { table: self, gate: Some(gate) })
    }

    /// Holds a tiered table's gate for writing: no call and no eviction runs meanwhile (for
    /// `clear` and `load`, which replace every row).
    pub(crate) fn exclusive(&self) -> Option<parking_lot::RwLockWriteGuard<'_, ()>> {
        self.tier.as_ref().map(|t| t.gate.write())
    }

    /// Holds a tiered table's gate for reading (no `clear`, `load` or demotion meanwhile).
    pub(crate) fn shared_gate(&self) -> Option<RwLockReadGuard<'_, ()>> {
        // Recursive: a flush that rewrites must not queue behind a `clear` waiting for an
        // eviction that waits for this flush's manifest lock.
        self.tier.as_ref().map(|t| t.gate.read_recursive())
    }

    /// A file slot for a segment about to be written, in a tiered table (`None` otherwise).
    pub(crate) fn reserve_file_slot(&self) -> Result<Option<u32>> {
        self.tier.as_ref().map(|t| t.reserve_file()).transpose()
    }

    /// Frees a slot from [`Table::reserve_file_slot`] that no segment took.
    pub(crate) fn release_file_slot(&self, slot: Option<u32>) {
        if let (Some(t), Some(s)) = (&self.tier, slot) {
            t.release_file(s);
        }
    }

    /// A tiered table's file table, held for reading (see [`Tier::files`]).
    pub(crate) fn cold_files(&self) -> Option<parking_lot::RwLockReadGuard<'_, FileTable>> {
        self.tier.as_ref().map(|t| t.files())
    }

    /// What the tier did, for `stats()` (all 0 without a memory budget).
    pub(crate) fn tier_counts(&self) -> TierCounts {
        self.tier.as_ref().map(|t| t.counts()).unwrap_or_default()
    }

    /// Indexes the sealed segment `seq` (read by `r`, at open) as a tiered table's: its
    /// records make their keys cold ([`Table::replay_footer`]) in a new file slot. Returns the
    /// records indexed.
    pub(crate) fn replay_cold(
        &self,
        seq: u64,
        r: SegmentReader,
        keep: Option<(usize, usize)>,
    ) -> Result<u64> {
        let tier = self.tier.as_ref().expect("tiered");
        let slot = tier.files.write().reserve()?;
        let n = self.replay_footer(slot, &r, keep)?;
        tier.files.write().install(slot, seq, Arc::new(r));
        Ok(n)
    }

    /// The hook a durable store calls once the manifest records segment `seq`, written into
    /// file slot `file` of this tiered table: the segment (`reader`, `None` if it kept no row)
    /// takes its slot; after a rewrite or a clear (`cleared`), rows on disk move to their new
    /// records (`moved`) and the older segments' slots go.
    pub(crate) fn on_segment_committed(
        &self,
        file: u32,
        seq: u64,
        reader: Option<Arc<SegmentReader>>,
        cleared: bool,
        moved: &[crate::durable::Moved],
    ) {
        let Some(t) = &self.tier else { return };
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
    pub(crate) fn copy_cold(
        &self,
        w: &mut crate::disk::segment::SegmentWriter,
        file: u32,
    ) -> Result<Vec<crate::durable::Moved>> {
        let Some(tier) = &self.tier else { return Ok(Vec::new()) };
        let old: std::collections::HashSet<u32> =
            tier.files.read().slots_below(w.seq()).into_iter().collect();
        let (d, sd) = (self.dim(), self.state_dim);
        let mut moved = Vec::new();
        for lock in self.shards.iter() {
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
                w.push(key, &meta, &shard.values.row(slot)[..d], &shard.state.row(slot)[..sd])?;
            }
        }
        Ok(moved)
    }

    /// After a rewrite (or a clear) superseded the segments in `old`: rows on disk that did not
    /// move since they were copied point to their new records, and rows in memory whose clean
    /// copy was in an old segment become dirty (the next flush or eviction writes them).
    pub(crate) fn relocate_cold(&self, moved: &[crate::durable::Moved], old: &[u32]) {
        let old: std::collections::HashSet<u32> = old.iter().copied().collect();
        let mut by_shard: Vec<Vec<&crate::durable::Moved>> = vec![Vec::new(); self.shards.len()];
        for m in moved {
            by_shard[self.shard_of(m.0)].push(m);
        }
        for (lock, moved) in self.shards.iter().zip(by_shard) {
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

    /// Promotes the cold ids among `groups` (and with [`Access::Noted`], notes accesses to the
    /// hot ones): one read lock per shard to sort them out, one batch of reads for all of them,
    /// then the shards promote their rows in parallel.
    fn fault_in(&self, tier: &Tier, groups: &Groups, access: Access) -> Result<usize> {
        // Held from capturing locations to reading them: a rewrite cannot release the slots
        // they point into meanwhile (it takes the file table for writing).
        let files = tier.files.read();
        let files = &*files;
        let mut cold: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.shards.len()];
        let (mut slots, mut misses) = (Vec::new(), Vec::new());
        for (s, wanted) in cold.iter_mut().enumerate() {
            let (keys, _) = groups.shard(s);
            if keys.is_empty() {
                continue;
            }
            let shard = self.shards[s].read();
            let t = shard.cold.as_ref().expect("a tiered table's shards are tiered");
            if access == Access::ByCaller {
                // Hot and cold indexes hold disjoint keys: the cold probe alone finds the rows
                // to read (the caller's own probe notes the accesses).
                if !t.index.is_empty() {
                    slots.clear();
                    slots.resize(keys.len(), 0);
                    t.index.get_batch(keys, &mut slots)?;
                    let found = keys.iter().zip(&slots).filter(|(_, &l)| l != MISSING);
                    wanted.extend(found.map(|(&id, &l)| (id, l)));
                }
                continue;
            }
            // Batched probes (the index prefetches ahead) of the hot index, then of the cold
            // index for the misses.
            slots.clear();
            slots.resize(keys.len(), 0);
            shard.index.get_batch(keys, &mut slots)?;
            misses.clear();
            for (&id, &slot) in keys.iter().zip(&slots) {
                match slot {
                    MISSING => misses.push(id),
                    slot => t.policy.on_access(slot as usize),
                }
            }
            if misses.is_empty() || t.index.is_empty() {
                continue;
            }
            slots.clear();
            slots.resize(misses.len(), 0);
            t.index.get_batch(&misses, &mut slots)?;
            for (&id, &l) in misses.iter().zip(&slots) {
                if l != MISSING {
                    wanted.push((id, l));
                }
            }
        }
        // Every shard's cold rows in one batch of reads (so the engine keeps the whole batch in
        // flight, up to its queue depth), then each shard promotes its rows.
        let mut wanted: Vec<(u64, u64)> = Vec::new();
        let mut bounds = vec![0usize];
        for c in &mut cold {
            c.sort_unstable_by_key(|&(_, l)| l);
            c.dedup();
            wanted.extend_from_slice(c);
            bounds.push(wanted.len());
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        // In rounds of FAULT_ROUND rows, so that the records and their page buffers of a large
        // call never pile up.
        for lo in (0..wanted.len()).step_by(FAULT_ROUND) {
            let hi = (lo + FAULT_ROUND).min(wanted.len());
            let records = self.read_records(files, tier, &wanted[lo..hi])?;
            let span = |s: usize| (bounds[s].max(lo), bounds[s + 1].min(hi));
            let busy: Vec<usize> = (0..cold.len())
                .filter(|&s| {
                    let (a, b) = span(s);
                    a < b
                })
                .collect();
            crate::sched::Scheduler::global().run(busy.len(), busy.len() > 1, |i| {
                let (a, b) = span(busy[i]);
                let mut shard = self.shards[busy[i]].write();
                for ((key, l), rec) in wanted[a..b].iter().zip(&records[a - lo..b - lo]) {
                    let t = shard.cold.as_ref().expect("tiered");
                    if shard.index.get(*key).is_some() || t.index.get(*key) != Some(*l) {
                        continue; // another call promoted it (or it moved) meanwhile
                    }
                    shard.promote(*key, *l, rec)?;
                }
                Ok(())
            })?;
        }
        tier.churned(wanted.len() as u64 * self.evict_row_bytes());
        Ok(wanted.len())
    }

    /// Reads the records at `locs` (sorted by location), checking each one's key.
    fn read_records(
        &self,
        files: &FileTable,
        tier: &Tier,
        wanted: &[(u64, u64)],
    ) -> Result<Vec<Record>> {
        // All records whose pages can be read directly go to the I/O engine in one batch, all
        // in flight together: each record's 1–2 aligned pages, merged with its neighbours' in
        // the same file when they share a page or lie close ([`merged_reads`](crate::disk::plan::merged_reads)). The rest are
        // read one by one through the file layer.
        let mut out: Vec<Option<Record>> = vec![None; wanted.len()];
        let mut ranges = Vec::new();
        for (n, &(_, l)) in wanted.iter().enumerate() {
            let (slot, idx) = loc_parts(l);
            if let Some((fd, offset, len, skip)) = files.reader(slot)?.direct_range(idx) {
                ranges.push(DirectRange { fd, offset, len, skip, n });
            }
        }
        if !ranges.is_empty() {
            let (reqs, at) = merged_reads(&mut ranges);
            let mut bufs: Vec<_> =
                reqs.iter().map(|r| crate::disk::io::AlignedBuf::pooled(r.len)).collect();
            engine()
                .read_all(&reqs, &mut bufs)
                .map_err(|e| Error::io("read records of the memory tier", e))?;
            for (n, req, from) in at {
                let (slot, idx) = loc_parts(wanted[n].1);
                out[n] = Some(files.reader(slot)?.decode(&bufs[req][from..], idx)?);
            }
            crate::disk::io::AlignedBuf::recycle(bufs);
            tier.counters.cold_ios.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        }
        let mut records = Vec::with_capacity(wanted.len());
        for (&(key, l), got) in wanted.iter().zip(out) {
            let (slot, idx) = loc_parts(l);
            let reader = files.reader(slot)?;
            let rec = match got {
                Some(rec) => rec,
                None => reader.read(idx)?,
            };
            if rec.key != key || rec.tombstone {
                return Err(Error::corrupt(format!(
                    "record {idx} of segment {} holds key {}, expected {key}",
                    reader.header().seq,
                    rec.key
                )));
            }
            records.push(rec);
        }
        tier.counters.cold_reads.fetch_add(wanted.len() as u64, Ordering::Relaxed);
        Ok(records)
    }

    /// Bytes this table holds in memory, as the budget counts them: per hot row its values,
    /// state, metadata and tier state — freed slots counted as rows —, plus the hot and cold
    /// indexes at their capacity. Eviction leaves no freed slot behind and gives back the arena
    /// room past a fifth more rows than the shard holds (`Shard::compact_tiered`), so resident
    /// memory passes this by that headroom at most (and by a call's temporaries, during it).
    /// Returns them with the number of rows in memory.
    fn memory_and_rows(&self) -> (u64, usize) {
        let row = (self.dim() + self.state_dim) * 4 + std::mem::size_of::<PackedMeta>();
        let (mut b, mut rows) = (0, 0);
        for shard in self.shards.iter() {
            let shard = shard.read();
            // Freed slots count as rows: their memory is still held (eviction moves rows down
            // into them and gives the room back, see `Shard::compact_tiered`).
            let held = shard.slots();
            let t = shard.cold.as_ref().map_or(0, |t| t.index.bytes() + held * t.slot_bytes());
            b += held * row + shard.index.bytes() + t;
            rows += shard.len();
        }
        (b as u64, rows)
    }

    /// Reports this table's memory to the budget (see [`Report`]).
    fn report(&self, tier: &Tier) -> Report {
        let (mine, hot) = self.memory_and_rows();
        let pinned = tier.pins.lock().len().min(hot) as u64;
        let evictable = ((hot as u64 - pinned) * self.evict_row_bytes()).min(mine);
        let before = tier.reported_fixed.swap(mine - evictable, Ordering::Relaxed);
        tier.budget.adjust_fixed(before, mine - evictable);
        let before = tier.reported.swap(mine, Ordering::Relaxed);
        Report { used: tier.budget.adjust_used(before, mine), grew: mine > before, evictable }
    }

    /// After a call: reports this table's memory. A call that brought rows in and left the
    /// store past its budget ([`Budget::marks`]) evicts its table's share of the excess here —
    /// without an evictor, unless an eviction of the table runs already; with one, after
    /// waiting for the evictor's eviction of the table if one runs. A call that added nothing
    /// (its rows were in, read ahead by `prefetch`, say) never evicts: the next call that adds
    /// rows does, or the evictor, which takes over past the background mark.
    fn after_call(&self) {
        let Some(tier) = &self.tier else { return };
        self.evict_after_call(tier);
        tier.trim_if_due();
    }

    /// [`Table::after_call`]'s eviction.
    fn evict_after_call(&self, tier: &Tier) {
        let Report { used, grew, .. } = self.report(tier);
        let (background, over, _) = tier.budget.marks();
        if tier.budget.background() {
            if used <= background {
                return;
            }
            let me = tier.me.get().cloned().unwrap_or_else(|| Weak::<Table>::new());
            if (used <= over || !grew) && tier.budget.queue(me, &tier.queued) {
                return;
            }
            // Over the budget and growing: wait for the evictor's eviction of this table (if
            // one runs), then evict what is still over — backpressure on whoever adds rows.
            // A failure is noted; the next call meets it in `make_room`.
            let _ = self.evict_share(tier, true, u64::MAX, Share::Mine);
            tier.budget.evict_others(self);
        } else if used > over && grew {
            let _ = self.evict_share(tier, false, u64::MAX, Share::Mine);
            tier.budget.evict_others(self);
        }
    }

    /// Before a call: if the store is over its budget (an eviction failed, or the evictor fell
    /// behind), evicts this table's share on this thread first, and fails with the eviction's
    /// error — before the call changes anything — if it cannot. So a store whose evictions
    /// fail (a full disk: `NoSpace`) passes its budget by one call's rows at most, its rows
    /// stay in memory, dirty, and calls go on once space is freed.
    ///
    /// Only a full disk fails the call: another I/O error (a failing device) is noted and the
    /// call goes on in memory, as before, so that a store whose disk went away keeps serving.
    fn make_room(&self, tier: &Tier) -> Result<()> {
        let (_, over, _) = tier.budget.marks();
        if tier.budget.used() <= over {
            return Ok(());
        }
        match self.evict_share(tier, true, u64::MAX, Share::Mine) {
            Err(e) if e.kind() == ErrorKind::NoSpace => Err(e),
            _ => Ok(()),
        }
    }

    /// Evicts this table's share of the store's excess over its low mark ([`Budget::marks`]),
    /// at most `cap` bytes of it; `wait`: behind an eviction of this table in flight, else
    /// none if one is. Whether the cap left some of the share for another round; a failed
    /// eviction (its rows stay in memory) is noted in the table's and the budget's counters and
    /// returned.
    fn evict_share(&self, tier: &Tier, wait: bool, cap: u64, of: Share) -> Result<bool> {
        let _one = if wait {
            tier.evicting.lock()
        } else {
            match tier.evicting.try_lock() {
                Some(g) => g,
                None => return Ok(false),
            }
        };
        let Report { used, evictable: mine, .. } = self.report(tier);
        let (_, _, low) = tier.budget.marks();
        if used <= low || mine == 0 {
            return Ok(false);
        }
        // Shares of the excess by what each table can free (its hot, unpinned rows).
        let all = used.saturating_sub(tier.budget.fixed()).max(mine);
        let share = match of {
            Share::Mine => ((used - low) as f64 * mine as f64 / all as f64).ceil() as u64,
            Share::Rest => (used - low).min(mine),
        };
        if let Err(e) = self.evict_bytes(tier, share.clamp(1, cap), wait) {
            let message = e.to_string();
            tier.counters.errors.fetch_add(1, Ordering::Relaxed);
            *tier.counters.last_error.lock() = Some(message.clone());
            tier.budget.note_error(message);
            self.report(tier);
            return Err(e);
        }
        self.report(tier);
        Ok(share > cap)
    }

    /// What one hot row costs, as eviction (what it frees) and pinning (what it holds) count it.
    fn evict_row_bytes(&self) -> u64 {
        ((self.dim() + self.state_dim) * 4 + 16 + 16 + 16) as u64
    }

    /// Evicts about `bytes` of hot rows (see the module docs).
    /// `yield_to_calls`: take the gate for demotion only between calls
    /// ([`Table::gate_when_idle`]), as the evictor and callers waiting on it do.
    pub(crate) fn evict_bytes(&self, tier: &Tier, bytes: u64, yield_to_calls: bool) -> Result<()> {
        tier.counters.eviction_rounds.fetch_add(1, Ordering::Relaxed);
        let row = self.evict_row_bytes();
        let n = (bytes / row).max(1) as usize;
        // Shares of `n` per shard; what a shard cannot give (its rows are pinned, or few) goes
        // to the shards after it.
        let mut left = n;
        let pins = tier.pins.lock().clone();
        // Steps 1 and 2 hold the gate for reading: `clear` and `load` (which take it for
        // writing) cannot run between choosing victims and writing them.
        let read_gate = tier.gate.read();
        // 1. Victims, and the dirty ones among them.
        let mut victims: Vec<Vec<u64>> = Vec::with_capacity(self.shards.len());
        let mut dirty = Vec::new();
        for (i, lock) in self.shards.iter().enumerate() {
            let per_shard = left.div_ceil(self.shards.len() - i);
            let mut keys = Vec::with_capacity(per_shard);
            let mut slots = Vec::new();
            // Slots chosen by earlier chunks: still in the policy's lists until step 3.
            let mut chosen: std::collections::HashSet<u64, KeyHash> = Default::default();
            // In chunks, each under the shard's write lock: a call on the shard waits for one
            // chunk at most (each draw of a victim is a few cache misses).
            while keys.len() < per_shard {
                let want = (per_shard - keys.len()).min(VICTIM_CHUNK);
                let mut shard = lock.write();
                let shard = &mut *shard;
                let t = shard.cold.as_mut().expect("tiered");
                slots.clear();
                let (tk, ch) = (&t.keys, &chosen);
                let held =
                    |slot: usize| pins.contains_key(&tk[slot]) || ch.contains(&(slot as u64));
                t.policy.victims(want, &held, &mut slots);
                for &s in &slots {
                    chosen.insert(s as u64);
                    keys.push(t.keys[s]);
                    if shard.meta[s].is_dirty() {
                        dirty.push(t.keys[s]);
                    }
                }
                if slots.len() < want {
                    break; // everything left is pinned
                }
            }
            left -= keys.len().min(left);
            victims.push(keys);
        }
        // 2. Dirty victims to a durable segment first.
        if !dirty.is_empty() {
            let durable = tier.durable.get().and_then(Weak::upgrade).ok_or_else(|| {
                Error::new(ErrorKind::Io, "the store of this table is closed; cannot evict")
            })?;
            durable.write_rows_of(self, &dirty)?;
            tier.counters.evicted_dirty.fetch_add(dirty.len() as u64, Ordering::Relaxed);
        }
        // 3. Demote, with no call in flight.
        drop(read_gate);
        let _gate = if yield_to_calls { Self::gate_when_idle(tier) } else { tier.gate.write() };
        let pins = tier.pins.lock();
        // A disk location in a slot not installed yet belongs to a segment a flush is still
        // writing: such a row stays in memory until that segment is durable.
        let files = tier.files.read();
        let mut moved = 0u64;
        for (lock, keys) in self.shards.iter().zip(&victims) {
            let mut shard = lock.write();
            for &key in keys {
                if !pins.contains_key(&key)
                    && shard.demote(key, |l| files.installed(loc_parts(l).0))?
                {
                    moved += 1;
                }
            }
            // The freed slots go (rows move down into them) and so does the arena room past a
            // fifth more rows than are left: resident memory follows the rows out.
            shard.shrink_if_sparse()?;
            let len = shard.len();
            shard.compact_tiered(len + len / KEEP_HEADROOM);
        }
        tier.counters.evicted_rows.fetch_add(moved, Ordering::Relaxed);
        tier.churned(moved * row);
        Ok(())
    }

    /// Brings the rows of `ids` that are on disk into memory, as a call on them would, and
    /// returns how many it read; rows in memory count as used, ids with no row are ignored,
    /// and no value changes. For a pipeline that reads batch n+1's rows while batch n trains
    /// (pin them first, with [`Table::pin`], so that no eviction drops them before their
    /// batch). A no-op (0) on a table without a memory budget.
    pub fn prefetch(&self, ids: &[u64]) -> Result<usize> {
        let Some(tier) = &self.tier else { return Ok(0) };
        let groups = self.group(ids)?;
        self.make_room(tier)?;
        let gate = tier.gate.read();
        let read = self.fault_in(tier, &groups, Access::Noted);
        drop(Entered { table: self, gate: Some(gate) });
        read
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

    /// Pins the rows of `ids` in memory until [`Table::unpin`] (counted: pin twice, unpin
    /// twice). Fails with `Capacity` if the rows pinned in all the tables under the budget
    /// would exceed 60 % of it.
    pub fn pin(&self, ids: &[u64]) -> Result<()> {
        let Some(tier) = &self.tier else { return Ok(()) };
        let mut pins = tier.pins.lock();
        // Optimistic: count every id in (one hash probe each, the common case), and take the
        // counts back out if the pinned rows would pass the limit.
        let before = pins.len();
        for &k in ids {
            *pins.entry(k).or_insert(0) += 1;
        }
        let row = self.evict_row_bytes();
        let limit = (tier.budget.limit() as f64 * MAX_PINNED_FRACTION) as u64;
        let added = (pins.len() - before) as u64 * row;
        // The pins of every table under the budget count (when each table checked only its
        // own, seven tables pinned 1.8 times the budget between them).
        let total = tier.budget.add_pinned(added);
        if added > 0 && total > limit {
            tier.budget.sub_pinned(added);
            let rows = pins.len() - before;
            unpin_locked(&mut pins, ids);
            return Err(Error::new(
                ErrorKind::Capacity,
                format!(
                    "pinning {rows} more rows would take {total} bytes of pinned rows, over 60 % \
                     of the memory budget ({} bytes); raise memory_budget_bytes or use smaller \
                     batches",
                    tier.budget.limit()
                ),
            ));
        }
        tier.pinned_bytes.fetch_add(added, Ordering::Relaxed);
        Ok(())
    }

    /// Releases pins taken by [`Table::pin`]. Where the rows they held leave the store over its
    /// budget (pinned rows may pass it), evicts the excess here, so that a store comes back
    /// under its budget when training stops, with no later call.
    pub fn unpin(&self, ids: &[u64]) {
        let Some(tier) = &self.tier else { return };
        {
            let mut pins = tier.pins.lock();
            let before = pins.len();
            unpin_locked(&mut pins, ids);
            let freed = (before - pins.len()) as u64 * self.evict_row_bytes();
            tier.pinned_bytes.fetch_sub(freed, Ordering::Relaxed);
            tier.budget.sub_pinned(freed);
        }
        let Report { used, .. } = self.report(tier);
        let (_, over, _) = tier.budget.marks();
        if used > over {
            // A failure is noted; the next call meets it in `make_room`.
            let _ = self.evict_share(tier, false, u64::MAX, Share::Mine);
            tier.trim_if_due();
        }
    }

    /// Rows on disk only.
    pub(crate) fn cold_rows(&self) -> usize {
        self.shards.iter().map(|s| s.read().cold_len()).sum()
    }

    /// Indexes the records of a sealed segment in `slot` (at open): a record makes its key
    /// cold at that location, a tombstone removes the key. With `keep = Some((s, n))` only the
    /// keys of serving shard `s` of `n` count.
    pub(crate) fn replay_footer(
        &self,
        slot: u32,
        reader: &SegmentReader,
        keep: Option<(usize, usize)>,
    ) -> Result<u64> {
        let mut n = 0;
        reader.for_each_footer(|i, key, tombstone, version| {
            self.clock.observe(version);
            if keep.is_some_and(|(s, n)| crate::shard_of_key(key, n) != s) {
                return Ok(());
            }
            let mut shard = self.shards[self.shard_of(key)].write();
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

    /// The rows `wanted` (key and disk location, captured with `files` held) read from disk
    /// without promoting them (for export): appended to `chunk`.
    pub(crate) fn export_cold(
        &self,
        files: &FileTable,
        wanted: &[(u64, u64)],
        chunk: &mut RowChunk,
    ) -> Result<()> {
        let Some(tier) = &self.tier else { return Ok(()) };
        for ((key, _), rec) in wanted.iter().zip(self.read_records(files, tier, wanted)?) {
            chunk.ids.push(*key);
            chunk.values.extend_from_slice(&rec.values);
            chunk.state.extend_from_slice(&rec.state);
            chunk.meta.push(rec.meta);
        }
        Ok(())
    }
}

impl Reclaim for Table {
    fn reclaim_rest(&self) {
        if let Some(tier) = &self.tier {
            let _ = self.evict_share(tier, false, u64::MAX, Share::Rest);
        }
    }

    fn reclaim_queued(&self) {
        let Some(tier) = &self.tier else { return };
        tier.queued.store(false, Ordering::Release);
        // Rounds of at most EVICTOR_ROUND bytes, letting go of every lock between them: calls
        // wait for one round at most, never for a whole large eviction.
        for _ in 0..1024 {
            // A failure (a full disk) is noted; the next call over the budget meets it.
            if !self.evict_share(tier, true, EVICTOR_ROUND, Share::Mine).unwrap_or(false) {
                break;
            }
            std::thread::yield_now();
        }
        // The other tables' shares too: no call of theirs may come to evict them.
        tier.budget.evict_others(self);
        tier.trim_if_due();
    }
}
