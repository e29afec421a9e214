//! A shard's sync state (the table's sync calls are in `crate::sync`): one [`PartSync`]
//! (version vector, update cache, shard version) per sync part of the shard, the floors, and
//! the tombstones of removed rows. It lives inside the shard, under the shard's lock, so that a
//! row write and its VV, cache and sv changes are one step (`steps::note_local`, the
//! replication crate's, as every protocol step).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use embstore_replication::changes::ChangeIndex;
use embstore_replication::{steps, PartMap, PartSync, Sv, UpdateCache, Vv};
use hashbrown::HashMap;
use parking_lot::{Condvar, Mutex};

use super::young::YoungRows;
use crate::version::{now_ms, Clock};
use crate::Version;

/// How often a shard's update caches are pruned to `now - D_prop` (on a write or a pull).
const PRUNE_EVERY_MS: u64 = 250;
/// How often a table collects old tombstones, at most (after a removal, an applied reply or
/// a change list).
pub(crate) const COLLECT_EVERY_MS: u64 = 5_000;
/// How long a significant write stays in its part's sigv index (ms): past it, the row goes by
/// normal sync only (a requester still behind it is far behind already).
const SIG_HORIZON_MS: u64 = 10 * 60 * 1000;
/// A part's cache never needs to be pruned below this many rows.
const CACHE_MIN_ROWS: usize = 64;

/// The sync state of one table shard.
pub(crate) struct ShardSync {
    pub(crate) shared: Arc<SyncShared>,
    /// The shard's index among the table's shards.
    pub(crate) shard: u32,
    /// One per sync part of this shard.
    pub(crate) parts: Vec<PartSync>,
    /// Removed rows: key → the removal's version. A tombstone is shipped like a row and kept
    /// while the key has no row, until it is older than the tombstone horizon; then it is
    /// collected and its version raises its part's floor.
    pub(crate) tombs: HashMap<u64, Version>,
    /// Per part: the versions of collected tombstones (per origin, the newest). A requester
    /// whose VV does not dominate it may hold rows removed since, which it cannot learn of
    /// row by row: it gets the whole part ([`crate::sync::Complete`]).
    pub(crate) floors: Vec<Vv>,
    /// Per part: the significant store (rows taken ahead of normal sync by prioritised
    /// pulls, each newer than the shard's row of its key: P2). Empty unless priority runs.
    pub(crate) significant: Vec<HashMap<u64, SigRow>>,
    /// Entries over every part's significant store.
    pub(crate) significant_len: usize,
    /// When the rows this shard created lately were created (kept while the table scores
    /// its writes: the freshness term of their priority).
    pub(crate) young: YoungRows,
    last_prune_ms: u64,
}

/// A row taken ahead of normal sync: its version, its significant version and its values
/// (`None`: a removal).
#[derive(Clone, Debug)]
pub(crate) struct SigRow {
    pub(crate) version: Version,
    pub(crate) sigv: Version,
    pub(crate) values: Option<Box<[f32]>>,
}

impl ShardSync {
    /// A shard's sync state whose parts know `vvs` (one per part: the rows it holds).
    /// At most `young_cap` young rows are remembered ([`YoungRows`]).
    pub(crate) fn new(
        shared: Arc<SyncShared>,
        shard: u32,
        vvs: Vec<Vv>,
        floors: Vec<Vv>,
        young_cap: usize,
    ) -> Self {
        let me = shared.clock.replica();
        let parts: Vec<PartSync> = vvs
            .into_iter()
            .map(|vv| PartSync {
                cache: UpdateCache::covering(vv.clone()),
                vv,
                // A new name for every part at every start: a peer that adopted an older one
                // pulls once and adopts this one (the VVs decide what moves).
                sv: Sv::new(shared.clock.tick().timestamp, me),
                ..PartSync::default()
            })
            .collect();
        let significant = vec![HashMap::new(); parts.len()];
        Self {
            shared,
            shard,
            parts,
            tombs: HashMap::new(),
            floors,
            significant,
            significant_len: 0,
            young: YoungRows::new(young_cap),
            last_prune_ms: 0,
        }
    }

    /// The part (within this shard) of `key`.
    #[inline]
    pub(crate) fn sub(&self, key: u64) -> usize {
        self.shared.layout.sub_of(key)
    }

    /// The table-wide id of sub-part `sub` of this shard.
    #[inline]
    pub(crate) fn part_id(&self, sub: usize) -> u32 {
        self.shared.layout.join(self.shard, sub)
    }

    /// A local write of `key` that left its row at version `v` (W1: under the shard lock, with
    /// `v` drawn there): the part knows it, caches it and gets a new sv.
    pub(crate) fn on_local(&mut self, key: u64, v: Version, shard_rows: usize) {
        self.tombs.remove(&key);
        self.supersede_significant(key, Some(v));
        let sub = self.sub(key);
        // The protocol's step; the rows of one batch in one shard share a version: the part's
        // change is recorded once, not once per row (the change index is shared by every
        // shard).
        if steps::note_local(&mut self.parts[sub], key, v, self.shared.clock.replica()) {
            let id = self.part_id(sub);
            self.shared.changed(id);
        }
        self.maybe_prune(false, shard_rows);
    }

    /// A local write of `key` at `v` was significant (its priority at or above `p_k`): the
    /// part's significant knowledge learns it and its key enters the sigv index.
    pub(crate) fn on_significant(&mut self, key: u64, v: Version) {
        self.shared.sig_seq.fetch_add(1, Ordering::Relaxed);
        let sub = self.sub(key);
        embstore_replication::prioritised::note_significant(&mut self.parts[sub], key, v);
    }

    /// Drops `key`'s significant entry when its version is at most `v` (the shard's row now
    /// holds `v`: P2), or whatever its version with `v` None (the key left).
    pub(crate) fn supersede_significant(&mut self, key: u64, v: Option<Version>) {
        if self.significant_len == 0 {
            return;
        }
        let sub = self.sub(key);
        let map = &mut self.significant[sub];
        if map.get(&key).is_some_and(|e| v.is_none_or(|v| e.version <= v)) {
            map.remove(&key);
            self.significant_len -= 1;
        }
    }

    /// `key`'s significant entry, if any.
    #[inline]
    pub(crate) fn significant(&self, key: u64) -> Option<&SigRow> {
        if self.significant_len == 0 {
            return None;
        }
        self.significant[self.sub(key)].get(&key)
    }

    /// Puts `row` as `key`'s significant entry.
    pub(crate) fn put_significant(&mut self, key: u64, row: SigRow) {
        self.shared.sig_seq.fetch_add(1, Ordering::Relaxed);
        let sub = self.sub(key);
        if self.significant[sub].insert(key, row).is_none() {
            self.significant_len += 1;
        }
    }

    /// Priority off (P4): every significant store emptied, `tsvv = svv`.
    pub(crate) fn disable_priority(&mut self) {
        for (p, map) in self.parts.iter_mut().zip(&mut self.significant) {
            map.clear();
            embstore_replication::prioritised::disable(p);
        }
        self.significant_len = 0;
    }

    /// A local removal of `key`: a tombstone at a fresh version.
    pub(crate) fn on_local_remove(&mut self, key: u64, shard_rows: usize) {
        let v = self.shared.clock.tick();
        self.on_local(key, v, shard_rows);
        self.tombs.insert(key, v);
    }

    /// A local clear of the whole shard: one fresh version `v` raises every part's VV and
    /// floor, so every peer that knew less gets each part whole (empty, or what was written
    /// since) and drops the rows it held; no tombstone per row (they would hold memory for the
    /// horizon, and a requester behind a floor needs none). The caches restart from the VVs.
    pub(crate) fn on_local_clear(&mut self) {
        let v = self.shared.clock.tick();
        self.tombs = HashMap::new();
        self.young.clear();
        self.significant.iter_mut().for_each(HashMap::clear);
        self.significant_len = 0;
        let sv = Sv::new(v.timestamp, self.shared.clock.replica());
        for sub in 0..self.parts.len() {
            let p = &mut self.parts[sub];
            p.vv.raise(v.replica, v.timestamp);
            p.cache = UpdateCache::covering(p.vv.clone());
            p.sig = embstore_replication::SigIndex::new();
            p.sv = sv;
            self.floors[sub].raise(v.replica, v.timestamp);
            let id = self.part_id(sub);
            self.shared.changed(id);
        }
    }

    /// Bytes of memory the sync state holds beyond a fixed amount per part: the tombstones
    /// (at their table's capacity) and the update caches' rows (about 32 bytes each).
    pub(crate) fn bytes(&self) -> usize {
        let sig: usize = self
            .significant
            .iter()
            .flat_map(|m| m.values())
            .map(|e| 64 + e.values.as_ref().map_or(0, |v| 4 * v.len()))
            .sum();
        let index: usize = self.parts.iter().map(|p| p.sig.len() * 96).sum();
        self.tombs.capacity() * (std::mem::size_of::<(u64, Version)>() + 1)
            + self.cached() * 32
            + sig
            + index
            + self.young.bytes()
    }

    /// Prunes every part's cache to `now - D_prop`, at most every [`PRUNE_EVERY_MS`] unless
    /// `force`, and each to its cap (a share of the part's rows, of `shard_rows` in all).
    pub(crate) fn maybe_prune(&mut self, force: bool, shard_rows: usize) {
        let now = now_ms();
        if !force && now.saturating_sub(self.last_prune_ms) < PRUNE_EVERY_MS {
            return;
        }
        self.last_prune_ms = now;
        if force {
            self.collect(now);
        }
        let d_prop = self.shared.d_prop_ms();
        let n = self.parts.len();
        let sig_before = now.saturating_sub(SIG_HORIZON_MS);
        self.young.expire(now);
        for p in &mut self.parts {
            p.cache.prune(now, d_prop);
            if !p.sig.is_empty() {
                p.sig.prune(sig_before);
            }
            let part_rows = shard_rows / n.max(1);
            let cap = self.shared.cache_cap(part_rows).max(CACHE_MIN_ROWS);
            if p.cache.len() > cap {
                p.cache.prune_to_cap(cap);
                self.shared.adapt.over_cap.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Collects the tombstones older than the horizon, raising their parts' floors.
    pub(crate) fn collect(&mut self, now: u64) {
        let horizon = self.shared.tombstone_horizon_ms;
        let layout = self.shared.layout;
        let floors = &mut self.floors;
        self.tombs.retain(|&k, v| {
            let gone = steps::expired(*v, now, horizon);
            if gone {
                floors[layout.sub_of(k)].raise(v.replica, v.timestamp);
            }
            !gone
        });
    }

    /// Rows cached, over the parts.
    pub(crate) fn cached(&self) -> usize {
        self.parts.iter().map(|p| p.cache.len()).sum()
    }
}

#[derive(Default)]
pub(crate) struct SyncCounters {
    pub(crate) pulls_cached: AtomicU64,
    pub(crate) pulls_scanned: AtomicU64,
    pub(crate) rows_sent: AtomicU64,
    pub(crate) replies_applied: AtomicU64,
    pub(crate) rows_applied: AtomicU64,
    pub(crate) replies_rejected: AtomicU64,
}

/// How often D_prop adapts, and its bounds.
pub(crate) const ADAPT_EVERY_MS: u64 = 5_000;
const D_PROP_MIN_MS: u64 = 250;
const D_PROP_MAX_MS: u64 = 120_000;

/// The D_prop controller's window: pulls that hit and missed the cache, how far behind the
/// furthest requester was, and whether a cache passed its cap. D_prop = max(2 × behind,
/// hit term), where the hit term grows by half while hits stay under 99.5 %, shrinks by 30 %
/// when caches overflow their cap and by 20 % when hits reach 99.5 % (so the cache holds no
/// more than the requesters need), all within 0.25–120 s.
#[derive(Default)]
pub(crate) struct Adapt {
    pub(crate) window_start_ms: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) max_behind_ms: AtomicU64,
    pub(crate) over_cap: AtomicU64,
    pub(crate) hit_term_ms: AtomicU64,
}

/// Sync state shared by a table's shards: the clock, the change index and its waiters.
pub(crate) struct SyncShared {
    pub(crate) clock: Arc<Clock>,
    pub(crate) layout: PartMap,
    pub(crate) epoch: u64,
    pub(crate) changes: Mutex<ChangeIndex>,
    pub(crate) changed: Condvar,
    pub(crate) d_prop_ms: AtomicU64,
    pub(crate) cache_max_frac: f64,
    /// The D_prop controller's state; it moves D_prop only when `adaptive`.
    pub(crate) adapt: Adapt,
    pub(crate) adaptive: bool,
    pub(crate) use_cache: bool,
    /// Tombstones older than this are collected (ms).
    pub(crate) tombstone_horizon_ms: u64,
    /// When the last collection over every shard began (ms).
    pub(crate) last_collect_ms: AtomicU64,
    pub(crate) counters: SyncCounters,
    /// Moves on with every significant write this table learns (its own, one a normal reply
    /// carries, one taken ahead): a prioritised pull finds nothing new while it stands still.
    pub(crate) sig_seq: AtomicU64,
}

impl SyncShared {
    /// Records that part `part`'s sv changed and wakes long-polls.
    pub(crate) fn changed(&self, part: u32) {
        self.changes.lock().bump(part);
        self.changed.notify_all();
    }

    /// Wakes the prioritised pulls waiting for a significant write ([`Self::wait_significant`])
    /// once `sig_seq` moved on. The change index's lock is taken first, so a waiter that read
    /// `sig_seq` under it is either woken or reads the new value.
    pub(crate) fn significant_learnt(&self) {
        drop(self.changes.lock());
        self.changed.notify_all();
    }

    /// Waits up to `timeout` until `sig_seq` is no longer `seq` (a significant write was
    /// learnt); whether it moved.
    pub(crate) fn wait_significant(&self, seq: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut changes = self.changes.lock();
        loop {
            if self.sig_seq.load(Ordering::Acquire) != seq {
                return true;
            }
            if self.changed.wait_until(&mut changes, deadline).timed_out() {
                return self.sig_seq.load(Ordering::Acquire) != seq;
            }
        }
    }

    /// Notes a pull answered from the cache (`hit`: `behind_ms` is how far back the cache had
    /// to reach, to the oldest write the requester lacked) or by a scan (`behind_ms`: how far
    /// the requester's newest known write is behind the part's; `None`: it knew nothing); every
    /// [`ADAPT_EVERY_MS`] the propagation horizon D_prop is set from what was seen.
    pub(crate) fn note_pull(&self, hit: bool, behind_ms: Option<u64>) {
        let a = &self.adapt;
        (if hit { &a.hits } else { &a.misses }).fetch_add(1, Ordering::Relaxed);
        if let Some(b) = behind_ms {
            a.max_behind_ms.fetch_max(b, Ordering::Relaxed);
        }
        let now = now_ms();
        let start = a.window_start_ms.load(Ordering::Relaxed);
        if !self.adaptive || now.saturating_sub(start) < ADAPT_EVERY_MS {
            return;
        }
        if a.window_start_ms
            .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another pull closes this window
        }
        let hits = a.hits.swap(0, Ordering::Relaxed);
        let misses = a.misses.swap(0, Ordering::Relaxed);
        let behind = a.max_behind_ms.swap(0, Ordering::Relaxed);
        let over_cap = a.over_cap.swap(0, Ordering::Relaxed) > 0;
        let mut hit_term = a.hit_term_ms.load(Ordering::Relaxed);
        if over_cap {
            hit_term = hit_term * 7 / 10;
        } else if hits + misses > 0 && (hits as f64) < 0.995 * (hits + misses) as f64 {
            hit_term = hit_term * 3 / 2;
        } else if hits + misses > 0 {
            hit_term = hit_term * 4 / 5;
        }
        hit_term = hit_term.clamp(D_PROP_MIN_MS, D_PROP_MAX_MS);
        a.hit_term_ms.store(hit_term, Ordering::Relaxed);
        let d = (2 * behind).max(hit_term).clamp(D_PROP_MIN_MS, D_PROP_MAX_MS);
        self.d_prop_ms.store(d, Ordering::Relaxed);
    }

    pub(crate) fn d_prop_ms(&self) -> u64 {
        self.d_prop_ms.load(Ordering::Relaxed)
    }

    /// The most rows a part of `part_rows` rows may cache.
    pub(crate) fn cache_cap(&self, part_rows: usize) -> usize {
        (part_rows as f64 * self.cache_max_frac) as usize
    }
}
