//! A shard's sync state: one [`SegSync`] (version vector, update cache, shard version) per
//! sync part of the shard, and the tombstones of removed rows. It lives inside the shard, under
//! the shard's lock, so that a row write and its VV, cache and sv changes are one step.

use std::sync::Arc;

use embstore_replication::{SegSync, Sv, UpdateCache, Vv};
use hashbrown::HashMap;

use super::{rv, SyncShared};
use crate::version::now_ms;
use crate::Version;

/// How often a shard's update caches are pruned to `now - D_prop` (on a write or a pull).
const PRUNE_EVERY_MS: u64 = 250;
/// A part's cache never needs to be pruned below this many rows.
const CACHE_MIN_ROWS: usize = 64;

/// The sync state of one table shard.
pub(crate) struct ShardSync {
    pub(crate) shared: Arc<SyncShared>,
    /// The shard's index among the table's shards.
    pub(crate) shard: u32,
    /// One per sync part of this shard.
    pub(crate) parts: Vec<SegSync>,
    /// Removed rows: key → the removal's version. A tombstone is shipped like a row and kept
    /// while the key has no row (see `docs/dissemination.md` on their lifetime).
    pub(crate) tombs: HashMap<u64, Version>,
    last_prune_ms: u64,
}

impl ShardSync {
    /// A shard's sync state whose parts know `vvs` (one per part: the rows it holds).
    pub(crate) fn new(shared: Arc<SyncShared>, shard: u32, vvs: Vec<Vv>) -> Self {
        let me = shared.clock.replica();
        let parts = vvs
            .into_iter()
            .map(|vv| SegSync {
                cache: UpdateCache::covering(vv.clone()),
                vv,
                // A new name for every part at every start: a peer that adopted an older one
                // pulls once and adopts this one (the VVs decide what moves).
                sv: Sv::new(shared.clock.tick().timestamp, me),
            })
            .collect();
        Self { shared, shard, parts, tombs: HashMap::new(), last_prune_ms: 0 }
    }

    /// The part (within this shard) of `key`.
    #[inline]
    pub(crate) fn sub(&self, key: u64) -> usize {
        self.shared.layout.sub_of(key)
    }

    /// The table-wide id of sub-part `sub` of this shard.
    #[inline]
    pub(crate) fn part_id(&self, sub: usize) -> u32 {
        self.shard * self.shared.layout.per_shard + sub as u32
    }

    /// A local write of `key` that left its row at version `v` (W1: under the shard lock, with
    /// `v` drawn there): the part knows it, caches it and gets a new sv.
    pub(crate) fn on_local(&mut self, key: u64, v: Version, shard_rows: usize) {
        self.tombs.remove(&key);
        let sub = self.sub(key);
        let p = &mut self.parts[sub];
        p.vv.raise(v.replica, v.timestamp);
        p.cache.on_write(key, rv(v));
        p.sv = Sv::new(v.timestamp, self.shared.clock.replica());
        let id = self.part_id(sub);
        self.shared.changed(id);
        self.maybe_prune(false, shard_rows);
    }

    /// A local removal of `key`: a tombstone at a fresh version.
    pub(crate) fn on_local_remove(&mut self, key: u64, shard_rows: usize) {
        let v = self.shared.clock.tick();
        self.on_local(key, v, shard_rows);
        self.tombs.insert(key, v);
    }

    /// Prunes every part's cache to `now - D_prop`, at most every [`PRUNE_EVERY_MS`] unless
    /// `force`, and each to its cap (a share of the part's rows, of `shard_rows` in all).
    pub(crate) fn maybe_prune(&mut self, force: bool, shard_rows: usize) {
        let now = now_ms();
        if !force && now.saturating_sub(self.last_prune_ms) < PRUNE_EVERY_MS {
            return;
        }
        self.last_prune_ms = now;
        let d_prop = self.shared.d_prop_ms();
        let n = self.parts.len();
        for p in &mut self.parts {
            p.cache.prune(now, d_prop);
            let part_rows = shard_rows / n.max(1);
            p.cache.prune_to_cap(self.shared.cache_cap(part_rows).max(CACHE_MIN_ROWS));
        }
    }

    /// Rows cached, over the parts.
    pub(crate) fn cached(&self) -> usize {
        self.parts.iter().map(|p| p.cache.len()).sum()
    }
}
