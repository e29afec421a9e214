//! The inference cache: L1 (group-aware replacement) + L2 (lower-precision rows) + L3
//! (surrogate keys) in one byte budget, over a backing store, sharded for concurrency.
//!
//! ```text
//!  lookup(batch of requests; one request = the keys of its tables: (table, any u64 id))
//!    P1 probe    per shard, read lock: L1? exact : L2? exact(low precision) : miss
//!                misses, per request up to `max_approx`: L3 surrogate resident? approx
//!    P2 fetch    the batch's distinct full misses, one backing read per table, no lock
//!    P3 commit   per request, per shard in ascending order, write lock:
//!                  L2 hits: scores max-updated        L1 hits + misses: GroupLfu commit
//!                  L1 victims -> demoted into L2 (decode, re-encode: no I/O)
//!                  last-level victims with a surrogate -> L3 (CLOCK map); from a build on
//!                  disk, its block is read inline or by the background filler thread
//!    P4 copy     every key's row (decoded) into `out`, its source into `sources`
//! ```
//!
//! Budget: every byte is counted — each level's rows (`capacity × codec bytes per row`) and
//! its policy metadata (slots, index, lists), L3's map, surrogate builds held in memory (18 B a
//! row; a build on disk holds 8 B per 227 rows) and the filler's queues. Level `i` gets
//! `C_i = ⌊share_i · B / (row_i + meta)⌋` entries, then is shrunk until its measured bytes fit.
//!
//! Keys: a key is a table number and a raw 64-bit id (hashed, negative as int64: any bits).
//! The policies see a u64 per key, the id XOR a constant of its table ([`policy_key`]):
//! within a table distinct ids stay distinct, so no id bit is given up for the table. Two keys
//! of different tables share a policy key only when their ids differ by exactly their tables'
//! constants (a 2^-64 chance for hashed ids); every slot also holds its key's table (a tag:
//! none for one table, 1 B for up to 256, else 2 B, counted as metadata), a probe checks it,
//! so such a pair is never served the other's row: while one holds the entry, the other is a
//! miss served from the backing store.
//!
//! Invariants: a key is in at most one of L1/L2 (exclusive levels); an L1/L2 hit returns
//! exactly `decode(encode(row))` of its level; a full miss returns the backing store's row
//! exactly; a surrogate is served only if resident at probe time, at most `max_approx` per
//! request, never inserts the missing key and changes no score; a request that cannot be
//! kept whole (every slot pinned) is served uncached and counted as a bypass, never blocked.
//! Requests of one batch are probed against the state before the batch (they are concurrent)
//! and committed in order; with one shard and one caller the cache is deterministic.
//!
//! ## Parts
//! - this file — [`InferenceCache`]: construction (the budget's plan, the shards), memory,
//!   `clear`, `sync_l3`, [`Backing`] and [`Source`].
//! - `config.rs` — [`CacheConfig`], [`LevelConfig`] (a codec and a share of the budget),
//!   [`L3Fill`].
//! - `key.rs` — a key (table, raw id) and the policy key the levels know it by.
//! - `level.rs` — one level: the policy's slots holding coded rows and table tags, sized to
//!   its share.
//! - `lookup.rs` — the pipeline above (P1–P4) and L3's feed from evicted keys.
//! - `filler.rs` — the L3 filler thread (builds on disk, [`L3Fill::Background`]).
//! - `stats.rs` — [`CacheStats`], [`CacheMemory`], [`LevelMemory`].
//! - `adapter.rs` — [`CachePolicy`]: the whole cache as a [`Policy`](crate::Policy), for the
//!   perfect-hit evaluator.

use std::fmt;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::surrogate::{ClockMap, SurrogateFile, SurrogateTable};
use crate::trace::split_key;
use crate::{Error, Result};
use embstore_policy::index::fmix64;
use embstore_policy::RequestOutcome;

mod adapter;
mod config;
mod filler;
mod key;
mod level;
mod lookup;
mod stats;
#[cfg(test)]
mod testing;

pub use adapter::CachePolicy;
pub use config::{CacheConfig, L3Fill, LevelConfig};
pub use stats::{CacheMemory, CacheStats, LevelMemory};

use filler::Filler;
use key::{key_of, policy_key, table_of, Key};
use level::{entries_for, Level};

/// The rows behind the cache (a store on disk, a remote client, …).
pub trait Backing: Send + Sync {
    /// Reads the rows of `ids` in table number `table` into `out` (`[ids.len() × dim]`).
    fn read(&self, table: usize, ids: &[u64], out: &mut [f32]) -> std::result::Result<(), String>;
}

/// Where a key's row came from, per key of a lookup (`sources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Source {
    /// L1, the first level (exact for an f32 level).
    L1 = 0,
    /// L2, the second level (its codec's precision).
    L2 = 1,
    /// A surrogate's row (L3): an approximation.
    Surrogate = 2,
    /// The backing store (a full miss; exact).
    Store = 3,
}

impl Source {
    /// The names of the sources, by discriminant.
    pub const NAMES: [&'static str; 4] = ["l1", "l2", "surrogate", "store"];
}

struct Shard {
    levels: Vec<Level>,
    l3: Option<ClockMap>,
    out: RequestOutcome,
    out2: RequestOutcome,
    tmp: Vec<f32>,
}

/// The inference cache (see the module docs).
pub struct InferenceCache {
    cfg: CacheConfig,
    backing: Arc<dyn Backing>,
    surrogates: Vec<Option<SurrogateTable>>,
    shards: Vec<RwLock<Shard>>,
    stats: Mutex<CacheStats>,
    /// Reads surrogate blocks off the request path ([`L3Fill::Background`] with a build on
    /// disk).
    filler: Option<Filler>,
}

impl fmt::Debug for InferenceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InferenceCache").field("config", &self.cfg).finish_non_exhaustive()
    }
}

/// Bytes the distinct surrogate builds hold in memory (one shared by two tables counts once).
fn surrogate_table_bytes(surrogates: &[Option<SurrogateTable>]) -> usize {
    let mut seen: Vec<&SurrogateTable> = Vec::new();
    let mut bytes = 0;
    for s in surrogates.iter().flatten() {
        if !seen.iter().any(|o| o.same(s)) {
            seen.push(s);
            bytes += s.heap_bytes();
        }
    }
    bytes
}

/// Checks that `surrogates` (empty: none) name every table and were built from rows of the
/// cache's dim (ShapeMismatch).
fn check_surrogates(cfg: &CacheConfig, surrogates: &[Option<SurrogateTable>]) -> Result<()> {
    if !surrogates.is_empty() && surrogates.len() != cfg.num_tables {
        return Err(Error::shape(format!(
            "surrogates must be given for {} tables, got {}",
            cfg.num_tables,
            surrogates.len()
        )));
    }
    if let Some((t, s)) = surrogates
        .iter()
        .enumerate()
        .filter_map(|(t, s)| Some((t, s.as_ref()?)))
        .find(|(_, s)| s.dim() != cfg.dim)
    {
        return Err(Error::shape(format!(
            "the surrogates of table {t} were built from rows of dim {}, the cache's is {}",
            s.dim(),
            cfg.dim
        )));
    }
    Ok(())
}

/// Table `t`'s build on disk, or `None` (held in memory, or no build).
fn disk_files(surrogates: &[Option<SurrogateTable>]) -> Vec<Option<Arc<SurrogateFile>>> {
    surrogates
        .iter()
        .map(|s| match s {
            Some(SurrogateTable::Disk(f)) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// Where the budget goes, per shard: what [`InferenceCache::new`] builds every shard with.
struct Plan {
    /// Whether any table has a surrogate build (then the shards get an L3 map).
    with_l3: bool,
    /// The L3 filler's queue length, when builds on disk are fed in the background.
    queue_cap: Option<usize>,
    /// Entries of each shard's L3 map.
    l3_cap: usize,
    /// Bytes of each shard's levels together (each takes its share of them).
    rest: f64,
}

impl Plan {
    /// The builds' bytes in memory and the filler's queues first, then L3's share of what is
    /// left, then the levels' (InvalidArgument when the first do not fit the budget).
    fn new(cfg: &CacheConfig, surrogates: &[Option<SurrogateTable>]) -> Result<Self> {
        let with_l3 = surrogates.iter().any(Option::is_some);
        let on_disk = surrogates.iter().any(|s| matches!(s, Some(SurrogateTable::Disk(_))));
        let background = cfg.l3_fill == L3Fill::Background && on_disk;
        // The filler's queues: about a quarter of the entries L3's share holds, 4 to 1,024
        // (at 4 %, a budget of 11 KB gives 4 keys: 128 B).
        let queue_cap = background.then(|| {
            ((cfg.memory_budget_bytes as f64 * cfg.surrogate_share
                / ClockMap::BYTES_PER_ENTRY_ESTIMATE as f64
                / 4.0) as usize)
                .clamp(4, 1024)
        });
        let fixed = surrogate_table_bytes(surrogates) + queue_cap.map_or(0, Filler::bytes_for);
        if with_l3 && fixed >= cfg.memory_budget_bytes {
            return Err(Error::invalid(format!(
                "the surrogate builds and the L3 filler's queues hold {fixed} B in memory, not \
                 less than the {} B budget: open the builds from disk (SurrogateFile::open, \
                 Python Surrogates.open) so that L3 reads a block when it is fed",
                cfg.memory_budget_bytes
            )));
        }
        let n = cfg.shards as f64;
        // Without surrogates `fixed` is 0.
        let avail = (cfg.memory_budget_bytes - fixed) as f64;
        let l3_total = if with_l3 { avail * cfg.surrogate_share } else { 0.0 };
        let l3_cap = entries_for(l3_total / n, 0, ClockMap::BYTES_PER_ENTRY_ESTIMATE);
        Ok(Self { with_l3, queue_cap, l3_cap, rest: (avail - l3_total) / n })
    }

    /// One shard: its levels sized to their shares, its L3 map, its scratch.
    fn shard(&self, cfg: &CacheConfig) -> Result<Shard> {
        let levels = cfg
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| Level::sized(cfg, i, l, self.rest * l.share));
        Ok(Shard {
            levels: levels.collect::<Result<_>>()?,
            l3: (self.with_l3 && self.l3_cap > 0).then(|| ClockMap::new(self.l3_cap)),
            out: RequestOutcome::default(),
            out2: RequestOutcome::default(),
            tmp: vec![0.0; cfg.dim],
        })
    }
}

impl InferenceCache {
    /// A cache over `backing` per `cfg`; `surrogates[t]` is table `t`'s surrogate build (or
    /// `None`; an empty vector means none at all), in memory or on disk. The builds' bytes in
    /// memory come out of the budget first, then L3's share (its map and, for builds on disk
    /// fed in the background, the filler's queues), then the levels'. Errors: bad
    /// configuration, a budget too small for one request in every shard (fewer L1 entries
    /// than tables) or for the builds held in memory, surrogates of a different count or
    /// dimension.
    pub fn new(
        cfg: CacheConfig,
        backing: Arc<dyn Backing>,
        surrogates: Vec<Option<SurrogateTable>>,
    ) -> Result<Self> {
        cfg.validate()?;
        check_surrogates(&cfg, &surrogates)?;
        let plan = Plan::new(&cfg, &surrogates)?;
        let shards =
            (0..cfg.shards).map(|_| plan.shard(&cfg).map(RwLock::new)).collect::<Result<_>>()?;
        // Started last, once nothing else can fail.
        let filler = match plan.queue_cap {
            Some(cap) => Some(Filler::start(disk_files(&surrogates), cap)?),
            None => None,
        };
        Ok(Self {
            surrogates: if surrogates.is_empty() { vec![None; cfg.num_tables] } else { surrogates },
            cfg,
            backing,
            shards,
            stats: Mutex::new(CacheStats::default()),
            filler,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Counters since construction or the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> CacheStats {
        self.stats.lock().clone()
    }

    /// Zeroes the counters (the cached rows stay).
    pub fn reset_stats(&self) {
        *self.stats.lock() = CacheStats::default();
    }

    /// Entries L1 and L2 can hold, all shards together.
    pub fn capacity(&self) -> usize {
        self.memory().levels.iter().map(|t| t.capacity).sum()
    }

    /// Where the budget went.
    pub fn memory(&self) -> CacheMemory {
        let mut levels: Vec<LevelMemory> = self
            .cfg
            .levels
            .iter()
            .map(|t| LevelMemory {
                codec: t.codec.name(),
                capacity: 0,
                len: 0,
                row_bytes: 0,
                metadata_bytes: 0,
            })
            .collect();
        let (mut l3_capacity, mut l3_len, mut l3_bytes) = (0, 0, 0);
        for s in &self.shards {
            let s = s.read();
            for (m, t) in levels.iter_mut().zip(&s.levels) {
                m.capacity += t.policy.capacity();
                m.len += t.policy.len();
                m.row_bytes += t.row_bytes();
                m.metadata_bytes += t.metadata_bytes();
            }
            if let Some(l3) = &s.l3 {
                l3_capacity += l3.capacity();
                l3_len += l3.len();
                l3_bytes += l3.heap_bytes();
            }
        }
        let meta: usize = levels.iter().map(|t| t.metadata_bytes).sum();
        let cap: usize = levels.iter().map(|t| t.capacity).sum();
        let surrogate_table_bytes = surrogate_table_bytes(&self.surrogates);
        let l3_queue_bytes = self.filler.as_ref().map_or(0, Filler::bytes);
        let total = levels.iter().map(|t| t.row_bytes + t.metadata_bytes).sum::<usize>()
            + l3_bytes
            + surrogate_table_bytes
            + l3_queue_bytes;
        CacheMemory {
            budget_bytes: self.cfg.memory_budget_bytes,
            levels,
            l3_capacity,
            l3_len,
            l3_bytes,
            surrogate_table_bytes,
            l3_queue_bytes,
            total_bytes: total,
            metadata_bytes_per_entry: meta as f64 / cap.max(1) as f64,
        }
    }

    /// Drops every cached row and L3 entry (after the backing table changed). Counters stay.
    pub fn clear(&self) -> Result<()> {
        for s in &self.shards {
            let mut s = s.write();
            for (i, t) in s.levels.iter_mut().enumerate() {
                let cap = t.policy.capacity();
                t.policy = self.cfg.policy_of(i).build(cap)?;
            }
            if let Some(l3) = &mut s.l3 {
                *l3 = ClockMap::new(l3.capacity());
            }
        }
        if let Some(f) = &self.filler {
            self.sync_l3();
            f.shared.state.lock().ready.clear();
        }
        Ok(())
    }

    /// Waits until the L3 filler has read every key queued so far, then moves what it found
    /// into L3. A no-op without a filler. After `sync_l3` following every lookup, a cache fed
    /// in the background is in the state [`L3Fill::Inline`] gives.
    pub fn sync_l3(&self) {
        if let Some(f) = &self.filler {
            let mut st = f.shared.state.lock();
            while !st.pending.is_empty() || st.busy {
                f.shared.idle.wait(&mut st);
            }
        }
        self.apply_ready();
    }

    /// Moves the filler's findings into L3 (under each shard's write lock) and its counters
    /// into the stats.
    fn apply_ready(&self) {
        let Some(f) = &self.filler else { return };
        let (ready, reads, errors, drops) = {
            let mut st = f.shared.state.lock();
            if st.ready.is_empty() && st.reads + st.errors + st.drops == 0 {
                return;
            }
            let ready: Vec<(Key, u64, f32)> = st.ready.drain(..).collect();
            let counters = (std::mem::take(&mut st.reads), std::mem::take(&mut st.errors));
            (ready, counters.0, counters.1, std::mem::take(&mut st.drops))
        };
        let mut inserts = 0;
        for (key, alt, dist) in ready {
            if let Some(l3) = &mut self.shards[self.shard_of(key)].write().l3 {
                l3.insert_tagged(policy_key(key), table_of(key), alt, dist);
                inserts += 1;
            }
        }
        let mut st = self.stats.lock();
        st.l3_inserts += inserts;
        st.l3_reads += reads;
        st.l3_read_errors += errors;
        st.l3_queue_drops += drops;
    }

    fn shard_of(&self, key: Key) -> usize {
        self.shard_of_pk(policy_key(key))
    }

    fn shard_of_pk(&self, pk: u64) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            (fmix64(pk) % self.shards.len() as u64) as usize
        }
    }

    /// The u64 this cache's policies know row `id` of table `table` by: the id XOR a constant
    /// of its table (the module docs). A bare policy evaluated on keys mapped through this
    /// sees what the cache's policies see ([`crate::GroupAssoc`] places a key by a hash of it).
    pub fn policy_key(table: u16, id: u64) -> u64 {
        policy_key(key_of(table, id))
    }
}

impl InferenceCache {
    /// Checks invariants: L1 ∩ L2 = ∅, every level within its capacity, total bytes within
    /// the budget. O(C) with `keys` (trace keys, `table << 48 | id`) the keys to check
    /// exclusivity for; for tests.
    pub fn check_invariants(&self, keys: &[u64]) -> std::result::Result<(), String> {
        let pks: Vec<u64> = keys
            .iter()
            .map(|&k| {
                let (t, id) = split_key(k);
                policy_key(key_of(t, id))
            })
            .collect();
        let m = self.memory();
        if m.total_bytes > m.budget_bytes {
            return Err(format!(
                "{} bytes counted over a budget of {}",
                m.total_bytes, m.budget_bytes
            ));
        }
        for s in &self.shards {
            let s = s.read();
            for t in &s.levels {
                if t.policy.len() > t.policy.capacity() {
                    return Err(format!(
                        "tier over capacity: {} > {}",
                        t.policy.len(),
                        t.policy.capacity()
                    ));
                }
            }
            if s.levels.len() == 2 {
                if let Some(j) = pks
                    .iter()
                    .position(|&k| s.levels[0].policy.contains(k) && s.levels[1].policy.contains(k))
                {
                    return Err(format!("key {:#x} is in L1 and L2", keys[j]));
                }
            }
        }
        Ok(())
    }
}
