//! Dissemination support inside the table: the sync state of Ekko-style pull replication
//! (`docs/dissemination.md` holds the whole design). The protocol's steps are not here: they
//! live once in `embstore_replication::steps`, and [`Table::sync_pull`] / [`Table::sync_apply`]
//! run them over a shard through `part.rs`'s `TablePart` (the part traits of
//! `embstore_replication::part`), so the replication crate's simulator checks the very steps
//! the table runs. Keys are placed by `embstore_replication::PartMap`, the simulator's map too.
//!
//! A table that syncs splits every shard into *sync parts* (a part lives inside one shard, so
//! its state sits under the shard's lock). Each part keeps a version vector (what it knows), an
//! update cache (recently written keys, so that a pull from a nearly current peer needs no
//! scan) and a shard version (a name for its knowledge). Every write updates them in the same
//! locked step as the row (W1), every removal leaves a tombstone, and the table answers:
//!
//! - [`Table::sync_changes`]: which parts changed since a cursor (long-poll with
//!   [`Table::sync_wait`]);
//! - [`Table::sync_pull`]: the rows of a part newer than a requester's VV, with the part's VV
//!   read before selecting (R1);
//! - [`Table::sync_apply`]: a peer's reply, checked whole, applied last-writer-wins, with the
//!   VV merged after the last row (R2).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embstore_common::fmix64;
use embstore_replication::changes::ChangeIndex;
use embstore_replication::PartMap;
use parking_lot::{Condvar, Mutex};

pub use embstore_replication::changes::Changes;
pub use embstore_replication::{Complete, Sv, Vv, MAX_PARTS};

use crate::shard::sync::{Adapt, ShardSync, SyncCounters, SyncShared, COLLECT_EVERY_MS};
use crate::{Error, ErrorKind, Result, RowMeta, Table, Version};

/// At most this many rows of a table are remembered as young (their creation times, for the
/// freshness of their writes' priority; about 40 MB at the cap): a table creating more rows
/// than this in ten minutes takes its oldest young rows as old.
const YOUNG_ROWS_PER_TABLE: usize = 1 << 20;

mod apply;
mod part;
pub(crate) mod prioritised;
mod pull;
mod rollback;
pub(crate) mod saved;
mod target;
mod witness;

pub use crate::witness::WitnessStats;
pub use prioritised::{PrioritisedSent, Priority, PriorityStats};
pub use target::{check_parts, TableInfo, Target};

/// The default number of sync parts of a table (at least one per shard): about 0.4 MB of rows
/// each for a table of a million 64-float rows, the size Ekko's test-bed used.
pub const DEFAULT_PARTS: u32 = 1024;

/// How a table syncs.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncOptions {
    /// Sync parts in the table: a power of two, at least the number of shards (rounded up to
    /// it). Peers of one table must use the same number.
    pub parts: u32,
    /// How long a write stays in the update cache (the expected propagation time): a peer
    /// that is at most this far behind is answered from the cache. The starting value when
    /// `adaptive`.
    pub d_prop_ms: u64,
    /// Whether D_prop follows what pulls see (every 5 s: at least twice how far behind the
    /// furthest requester was, raised while hits stay under 99.5 %, lowered while caches
    /// overflow their cap or hits reach 99.5 %; 0.25–120 s).
    pub adaptive: bool,
    /// The most rows a part's update cache keeps, as a share of its rows (at least 64).
    pub cache_max_frac: f64,
    /// Whether the rows a table holds when sync starts count as known (each part's VV is the
    /// newest version per origin among them) when nothing was saved at a last flush (saved
    /// knowledge is exact, and always taken): right for a store whose rows are its own
    /// writes. A follower whose rows came from an earlier run's flushes cannot prove which of
    /// its source's writes a flush caught (a flush copies a shard in chunks): it starts from
    /// what it saved at its last flush (`sync/<table>.vv`, see `Store::flush`), or knowing
    /// nothing, pulling every part again (rows it already holds are skipped).
    pub knowledge_from_rows: bool,
    /// Whether pulls are answered from the update cache when they can be (`false` scans every
    /// pull: only for measuring what the cache gains).
    pub use_cache: bool,
    /// How long a removal's tombstone is kept (ms). Older ones are collected; a peer that was
    /// behind them (offline longer than this) then gets whole parts, and drops the rows the
    /// responder no longer has, instead of the removals one by one.
    pub tombstone_horizon_ms: u64,
}

impl std::fmt::Display for SyncOptions {
    /// The options a user chooses, as a user names them (for error messages).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} parts, tombstone horizon {} s, update cache {}",
            self.parts,
            self.tombstone_horizon_ms as f64 / 1000.0,
            if self.use_cache { "on" } else { "off" }
        )
    }
}

impl SyncOptions {
    /// Every option, as words (for an error where the ones a user names agree).
    pub fn in_full(&self) -> String {
        format!(
            "{self}, update cache time {} s{}, cache cap {} of a part's rows, knowledge {}",
            self.d_prop_ms as f64 / 1000.0,
            if self.adaptive { " (adaptive)" } else { "" },
            self.cache_max_frac,
            if self.knowledge_from_rows {
                "from rows (a source)"
            } else {
                "never from rows (a follower)"
            }
        )
    }
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self {
            parts: DEFAULT_PARTS,
            d_prop_ms: 10_000,
            adaptive: true,
            cache_max_frac: 0.01,
            knowledge_from_rows: true,
            use_cache: true,
            tombstone_horizon_ms: 3_600_000,
        }
    }
}

/// What a table's sync did (counters since sync was enabled).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncStats {
    /// Sync parts.
    pub parts: u32,
    /// This process's epoch: changes when the process restarts (peers then list every part).
    pub epoch: u64,
    /// Rows held in the update caches.
    pub cached_rows: usize,
    /// Tombstones held (removed rows whose removal may still have to be shipped).
    pub tombstones: usize,
    /// Pulls answered from the update cache.
    pub pulls_cached: u64,
    /// Pulls answered by a scan of the part.
    pub pulls_scanned: u64,
    /// Rows (and tombstones) sent in replies.
    pub rows_sent: u64,
    /// Replies applied.
    pub replies_applied: u64,
    /// Rows (and tombstones) of applied replies that were newer and written.
    pub rows_applied: u64,
    /// Replies refused whole (bad shape, wrong part, non-finite values, a version too far
    /// ahead).
    pub replies_rejected: u64,
    /// The update cache's propagation horizon, in ms.
    pub d_prop_ms: u64,
}

/// One reply to a pull of a part: the rows the requester lacks (columnar), and the part's
/// knowledge read before they were selected.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PartReply {
    /// The part.
    pub part: u32,
    /// `[n]` keys.
    pub keys: Vec<u64>,
    /// `[n]` metadata (versions decide, last writer wins).
    pub meta: Vec<RowMeta>,
    /// `[n]` whether the row was removed (its values are zeros).
    pub tombstone: Vec<bool>,
    /// `[n, D]` values.
    pub values: Vec<f32>,
    /// `[n, S]` optimizer state, only to peers that may train (`None` for inference peers).
    pub state: Option<Vec<f32>>,
    /// The responder's knowledge of the part.
    pub vv: Vv,
    /// The responder's shard version of the part, read with `vv`.
    pub sv: Sv,
    /// Whether the update cache answered (no scan).
    pub from_cache: bool,
    /// A leading piece of a reply split for the wire: its rows are applied, and the knowledge
    /// (`vv`, `sv`) is merged only from the last piece (R2).
    pub partial: bool,
    /// Set when the requester was behind tombstones the responder has collected: the reply
    /// holds *every* row of the part with a key in the range (not only the newer ones).
    pub complete: Option<Complete>,
    /// The responder's step counter (Adam's `t`), with optimizer state: a replica that takes
    /// over training continues the count (`None` without state, or from an older build).
    pub step: Option<u64>,
    /// `[n]` each row's significant version (`Version::default()`: none), or empty when the
    /// responder sends none (it does not prioritise, or the requester's protocol predates it).
    pub sigv: Vec<Version>,
    /// The responder's significant knowledge of the part (SVV), read with `vv`; `None` when it
    /// sends none.
    pub svv: Option<Vv>,
}

/// A prioritised pull's answer ([`Table::sync_pull_prioritised`]): the rows with significant
/// writes the requester lacks (each the newest of the responder's row and its significant
/// entry), with their significant versions, and the responder's TSVV read before selecting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrioritisedReply {
    /// The part.
    pub part: u32,
    /// `[n]` keys, in key order.
    pub keys: Vec<u64>,
    /// `[n]` metadata.
    pub meta: Vec<RowMeta>,
    /// `[n]` significant versions.
    pub sigv: Vec<Version>,
    /// `[n]` whether the row was removed (its values are zeros).
    pub tombstone: Vec<bool>,
    /// `[n, D]` values.
    pub values: Vec<f32>,
    /// The responder's transient significant knowledge of the part.
    pub tsvv: Vv,
}

impl PartReply {
    /// Rows (and tombstones) in the reply.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the reply carries no row.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Puts the rows in key order (a complete reply's pieces are key ranges).
    pub(crate) fn sort_by_key(&mut self) {
        let n = self.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| self.keys[i]);
        let (d, sd) =
            (self.values.len() / n.max(1), self.state.as_ref().map(|s| s.len() / n.max(1)));
        let pick =
            |v: &[f32], w: usize| order.iter().flat_map(|&i| v[i * w..][..w].to_vec()).collect();
        self.values = pick(&self.values, d);
        if let (Some(st), Some(sd)) = (&mut self.state, sd) {
            *st = pick(st, sd);
        }
        self.keys = order.iter().map(|&i| self.keys[i]).collect();
        self.meta = order.iter().map(|&i| self.meta[i]).collect();
        self.tombstone = order.iter().map(|&i| self.tombstone[i]).collect();
        if !self.sigv.is_empty() {
            self.sigv = order.iter().map(|&i| self.sigv[i]).collect();
        }
    }

    /// Splits the reply into pieces of at most `rows` rows each (at least one piece); every
    /// piece but the last is `partial`.
    pub fn split(self, rows: usize) -> Vec<PartReply> {
        let rows = rows.max(1);
        if self.len() <= rows {
            return vec![self];
        }
        let (d, sd) =
            (self.values.len() / self.len(), self.state.as_ref().map(|s| s.len() / self.len()));
        let pieces = self.len().div_ceil(rows);
        (0..pieces)
            .map(|i| {
                let (a, b) = (i * rows, ((i + 1) * rows).min(self.len()));
                // A complete reply is in key order: each piece covers the keys after the
                // previous piece's last, up to its own last (the last piece: to the end).
                let complete = self.complete.as_ref().map(|c| Complete {
                    lo: if i == 0 { c.lo } else { self.keys[a - 1] + 1 },
                    hi: if i + 1 == pieces { c.hi } else { self.keys[b - 1] },
                    floor: c.floor.clone(),
                });
                PartReply {
                    part: self.part,
                    keys: self.keys[a..b].to_vec(),
                    meta: self.meta[a..b].to_vec(),
                    tombstone: self.tombstone[a..b].to_vec(),
                    values: self.values[a * d..b * d].to_vec(),
                    state: self.state.as_ref().zip(sd).map(|(s, sd)| s[a * sd..b * sd].to_vec()),
                    vv: self.vv.clone(),
                    sv: self.sv,
                    from_cache: self.from_cache,
                    partial: i + 1 < pieces,
                    complete,
                    step: self.step,
                    sigv: if self.sigv.is_empty() { Vec::new() } else { self.sigv[a..b].to_vec() },
                    svv: self.svv.clone(),
                }
            })
            .collect()
    }
}

fn not_syncing(t: &Table) -> Error {
    Error::invalid(format!("table '{}' does not sync: enable sync on it first", t.name()))
}

impl Table {
    /// Starts keeping sync state for this table: every row it holds now counts as known.
    /// Call it before the table takes writes from other threads (a store does it when it
    /// opens with sync on). Enabling again with the same options is a no-op.
    pub fn enable_sync(&self, options: &SyncOptions) -> Result<()> {
        self.enable_sync_knowing(options, None)
    }

    /// [`Table::enable_sync`] with each part's knowledge given (`known`, one VV per part:
    /// what a follower saved at its last flush) instead of taken from the rows.
    pub(crate) fn enable_sync_knowing(
        &self,
        options: &SyncOptions,
        known: Option<saved::Knowledge>,
    ) -> Result<()> {
        self.check_live()?;
        let shards = self.shards.len() as u32;
        // The one key -> part map, the simulator's too (it checks "a power of two up to
        // MAX_PARTS").
        let layout = PartMap::new(shards, options.parts)?;
        if !(options.cache_max_frac > 0.0 && options.cache_max_frac <= 1.0) {
            return Err(Error::invalid(format!(
                "cache_max_frac must be in (0, 1], got {}",
                options.cache_max_frac
            )));
        }
        let parts = layout.parts();
        if let Some(s) = self.sync.get() {
            if s.layout.parts() == parts {
                return Ok(());
            }
            return Err(Error::invalid(format!(
                "table '{}' already syncs with {} parts, not {parts}",
                self.name(),
                s.layout.parts()
            )));
        }
        // Each part knows the rows it holds: per origin, the newest version among them.
        let given =
            known.filter(|k| k.vvs.len() == parts as usize && k.floors.len() == k.vvs.len());
        // What was saved at the last flush is exact (read before the flush copied a row), so
        // it is taken whenever it is there; rows alone are trusted only by a store whose rows
        // are its own writes and which saved nothing (a follower promoted to primary holds
        // rows of other origins that a chunked flush may have caught only in part).
        let from_rows = options.knowledge_from_rows && given.is_none();
        let empty = || vec![Vv::new(); parts as usize];
        let (mut vvs, floors) = given.map_or_else(|| (empty(), empty()), |k| (k.vvs, k.floors));
        if from_rows {
            let mut export = self.export(4096);
            for chunk in export.by_ref() {
                for (k, m) in chunk.ids.iter().zip(&chunk.meta) {
                    if m.version != Version::default() {
                        let part = layout.part_of(*k) as usize;
                        vvs[part].raise(m.version.replica, m.version.timestamp);
                    }
                }
            }
            if let Some(e) = export.take_error() {
                return Err(e);
            }
        }
        let shared = Arc::new(SyncShared {
            clock: self.clock.clone(),
            layout,
            epoch: fmix64(crate::version::now_ms() ^ u64::from(std::process::id()) << 40) | 1,
            changes: Mutex::new(ChangeIndex::new(parts)),
            changed: Condvar::new(),
            d_prop_ms: AtomicU64::new(options.d_prop_ms),
            cache_max_frac: options.cache_max_frac,
            adapt: Adapt {
                hit_term_ms: AtomicU64::new(options.d_prop_ms),
                window_start_ms: AtomicU64::new(crate::version::now_ms()),
                ..Adapt::default()
            },
            adaptive: options.adaptive,
            use_cache: options.use_cache,
            tombstone_horizon_ms: options.tombstone_horizon_ms,
            last_collect_ms: AtomicU64::new(crate::version::now_ms()),
            counters: SyncCounters::default(),
            sig_seq: AtomicU64::new(0),
        });
        if self.sync.set(shared.clone()).is_err() {
            return Err(Error::invalid("sync was enabled concurrently"));
        }
        let (mut vvs, mut floors) = (vvs.into_iter(), floors.into_iter());
        // The young rows a table remembers (for its writes' freshness), over its shards.
        let young_cap = (YOUNG_ROWS_PER_TABLE / self.shards.len().max(1)).max(1);
        for (s, shard) in self.shards.iter().enumerate() {
            let per = layout.per_shard() as usize;
            let mine: Vec<Vv> = vvs.by_ref().take(per).collect();
            let floor: Vec<Vv> = floors.by_ref().take(per).collect();
            let sy = ShardSync::new(shared.clone(), s as u32, mine, floor, young_cap);
            shard.write().sync = Some(Box::new(sy));
        }
        let mut changes = shared.changes.lock();
        (0..parts).for_each(|p| changes.bump(p));
        Ok(())
    }

    fn sync_shared(&self) -> Result<&Arc<SyncShared>> {
        self.sync.get().ok_or_else(|| not_syncing(self))
    }

    /// Whether the table keeps sync state.
    pub fn syncs(&self) -> bool {
        self.sync.get().is_some()
    }

    /// Sync parts of the table.
    pub fn sync_parts(&self) -> Result<u32> {
        let s = self.sync_shared()?;
        Ok(s.layout.parts())
    }

    /// The sync part of `key`.
    pub fn sync_part_of(&self, key: u64) -> Result<u32> {
        Ok(self.sync_shared()?.layout.part_of(key))
    }

    /// The parts whose sv changed after `cursor` of `epoch` (every part for another epoch).
    pub fn sync_changes(&self, epoch: u64, cursor: u64) -> Result<Changes> {
        let s = self.sync_shared()?;
        self.maybe_collect_tombstones();
        let since = if epoch == s.epoch { cursor } else { 0 };
        // The index is read first and the svs after, each under its shard's lock (never both
        // locks at once: writers take the index under a shard lock). An sv that changes in
        // between is newer, and it is listed again under the next cursor.
        let (parts, upto) = s.changes.lock().since(since);
        let parts = parts
            .into_iter()
            .map(|p| {
                let (shard, sub) = s.layout.split(p);
                let g = self.shards[shard].read();
                (p, g.sync.as_ref().expect("a syncing table's shards sync").parts[sub].sv)
            })
            .collect();
        Ok(Changes { epoch: s.epoch, upto, parts })
    }

    /// Waits up to `timeout` for a change after `cursor` of `epoch`; whether there is one.
    pub fn sync_wait(&self, epoch: u64, cursor: u64, timeout: Duration) -> Result<bool> {
        let s = self.sync_shared()?;
        if epoch != s.epoch {
            return Ok(true);
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut changes = s.changes.lock();
        loop {
            if changes.since(cursor).1 > cursor {
                return Ok(true);
            }
            if s.changed.wait_until(&mut changes, deadline).timed_out() {
                return Ok(changes.since(cursor).1 > cursor);
            }
        }
    }

    /// This replica's knowledge of `part`: its VV and shard version.
    pub fn sync_knowledge(&self, part: u32) -> Result<(Vv, Sv)> {
        let (shard, sub) = self.check_part(part)?;
        let g = self.shards[shard].read();
        let p = &g.sync.as_ref().expect("syncing").parts[sub];
        Ok((p.vv.clone(), p.sv))
    }

    fn check_part(&self, part: u32) -> Result<(usize, usize)> {
        let s = self.sync_shared()?;
        let parts = s.layout.parts();
        if part >= parts {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("sync part {part} out of range: table '{}' has {parts}", self.name()),
            ));
        }
        Ok(s.layout.split(part))
    }

    /// Collects the tombstones older than the horizon in every shard, at most every
    /// [`COLLECT_EVERY_MS`] (one caller does it; the others go on). Call it holding no shard
    /// lock.
    pub(crate) fn maybe_collect_tombstones(&self) {
        let Some(s) = self.sync.get() else { return };
        let now = crate::version::now_ms();
        let last = s.last_collect_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < COLLECT_EVERY_MS
            || s.last_collect_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for shard in self.shards.iter() {
            if let Some(sy) = shard.write().sync.as_mut() {
                sy.collect(now);
            }
        }
    }

    /// Prunes every part's update cache now (writes and pulls do it every 250 ms), and
    /// collects the tombstones older than the horizon (removals, applied replies and change
    /// lists do it every 5 s).
    pub fn sync_prune(&self) -> Result<()> {
        self.sync_shared()?;
        for shard in self.shards.iter() {
            let mut g = shard.write();
            let rows = g.len();
            g.sync.as_mut().expect("syncing").maybe_prune(true, rows);
        }
        Ok(())
    }

    /// Sets the update cache's propagation horizon (ms).
    pub fn set_sync_d_prop(&self, d_prop_ms: u64) -> Result<()> {
        self.sync_shared()?.d_prop_ms.store(d_prop_ms, Ordering::Relaxed);
        Ok(())
    }

    /// What sync did so far.
    pub fn sync_stats(&self) -> Result<SyncStats> {
        let s = self.sync_shared()?;
        let c = &s.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mut cached_rows, mut tombstones) = (0, 0);
        for shard in self.shards.iter() {
            let g = shard.read();
            let sy = g.sync.as_ref().expect("syncing");
            cached_rows += sy.cached();
            tombstones += sy.tombs.len();
        }
        Ok(SyncStats {
            parts: s.layout.parts(),
            epoch: s.epoch,
            cached_rows,
            tombstones,
            pulls_cached: get(&c.pulls_cached),
            pulls_scanned: get(&c.pulls_scanned),
            rows_sent: get(&c.rows_sent),
            replies_applied: get(&c.replies_applied),
            rows_applied: get(&c.rows_applied),
            replies_rejected: get(&c.replies_rejected),
            d_prop_ms: s.d_prop_ms(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::sync::ADAPT_EVERY_MS;
    use crate::TableConfig;

    /// Runs one controller window of `hits`/`misses` pulls whose furthest requester was
    /// `behind` ms behind; returns D_prop after it.
    fn window(s: &SyncShared, hits: u64, misses: u64, behind: u64) -> u64 {
        (0..hits).for_each(|_| s.note_pull(true, Some(behind)));
        (0..misses).for_each(|_| s.note_pull(false, None));
        let past = crate::version::now_ms() - ADAPT_EVERY_MS - 1;
        s.adapt.window_start_ms.store(past, Ordering::Relaxed);
        s.note_pull(true, None);
        s.d_prop_ms()
    }

    #[test]
    fn d_prop_follows_the_lag_and_the_hit_rate_within_its_bounds() {
        let t = Table::new(TableConfig::new("t", 2)).unwrap();
        t.enable_sync(&SyncOptions { parts: 8, ..SyncOptions::default() }).unwrap();
        let s = t.sync.get().unwrap();
        assert_eq!(s.d_prop_ms(), 10_000);
        // All hits, requesters 1 s behind: the hit term shrinks by a fifth (10 -> 8 s).
        assert_eq!(window(s, 100, 0, 1_000), 8_000);
        // Requesters 30 s behind: twice that (the hit term goes on shrinking, to 6.4 s).
        assert_eq!(window(s, 100, 0, 30_000), 60_000);
        // Misses over 0.5 %: the hit term grows by half, each window, up to 120 s.
        assert_eq!(window(s, 90, 10, 0), 9_600);
        assert_eq!(window(s, 90, 10, 0), 14_400);
        for _ in 0..20 {
            window(s, 0, 10, 0);
        }
        assert_eq!(s.d_prop_ms(), 120_000);
        // Caches over their cap: it shrinks by 30 % a window, down to 0.25 s.
        for _ in 0..40 {
            s.adapt.over_cap.fetch_add(1, Ordering::Relaxed);
            window(s, 1, 0, 0);
        }
        assert_eq!(s.d_prop_ms(), 250);
        // With every pull a hit, it stays at the floor; followers 2 s behind raise it to 4 s.
        assert_eq!(window(s, 100, 0, 0), 250);
        assert_eq!(window(s, 100, 0, 2_000), 4_000);
        // Fixed when not adaptive.
        let f = Table::new(TableConfig::new("f", 2)).unwrap();
        let fixed =
            SyncOptions { parts: 8, adaptive: false, d_prop_ms: 4_000, ..SyncOptions::default() };
        f.enable_sync(&fixed).unwrap();
        assert_eq!(window(f.sync.get().unwrap(), 0, 100, 90_000), 4_000);
    }
}
