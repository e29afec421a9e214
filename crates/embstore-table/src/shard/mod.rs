//! [`Shard`]: one shard's rows — its NeighborHash index from id to slot, the value and state
//! arenas, the packed metadata and the free list — and the row-level operations every batch
//! call is built from. A shard lives behind its own lock in the [`Table`](crate::Table).
//!
//! Memory follows the rows both ways: the arenas grow gradually (see `arena`), and when
//! removals leave a shard at under half of its slots, [`Shard::shrink_if_sparse`] moves the
//! live rows into storage sized for them and releases the rest.

use embstore_index::NeighborHash;

use self::cold::{ColdSide, NONE};

use self::sync::ShardSync;
use crate::arena::Arena;
use crate::meta::PackedMeta;
use crate::values::Values;
use crate::{Dtype, Error, ErrorKind, Optimizer, Result};

pub(crate) mod cold;
pub(crate) mod sync;
pub(crate) mod young;

/// A shard is compacted when its live rows fall below `slots / SHRINK_BELOW`: then its memory
/// is at most about twice what its rows need, and each compaction (O(live rows)) is paid for by
/// at least as many removals since the last one.
const SHRINK_BELOW: usize = 2;
/// ... and only when its slots hold at least this many bytes (values, state and metadata), or
/// when no row is left at all. A floor in bytes, not slots, so that a table of many small
/// shards still gives memory back: at most this much per shard stays sparse (64 MiB for a
/// 1,024-shard table), whatever the row width.
const SHRINK_MIN_BYTES: usize = 64 << 10;

/// The rows of one shard.
pub(crate) struct Shard {
    pub(crate) index: NeighborHash,
    pub(crate) values: Values,
    pub(crate) state: Arena,
    pub(crate) meta: Vec<PackedMeta>,
    free: Vec<usize>,
    huge_pages: bool,
    /// In a durable store: the rows removed since the last flush (key and the row's version),
    /// written as tombstones by the next one. `None` in a store held only in memory.
    pub(crate) removed: Option<Vec<(u64, crate::Version)>>,
    /// In a durable store: the keys whose rows turned dirty since the last flush (each once,
    /// when its row goes from clean to dirty), so that a flush needs no scan of the shard.
    pub(crate) dirty_keys: Option<Vec<u64>>,
    /// In a table with a memory budget: the cold index and per-slot cold-side state (`cold`).
    pub(crate) cold: Option<Box<ColdSide>>,
    /// In a table that syncs: the sync state of the shard's parts (`sync`).
    pub(crate) sync: Option<Box<ShardSync>>,
}

impl Shard {
    pub(crate) fn new(
        dim: usize,
        dtype: Dtype,
        state_dim: usize,
        huge_pages: bool,
    ) -> Result<Self> {
        Self::with_rows(dim, dtype, state_dim, huge_pages, 0)
    }

    /// A shard with room for `rows` rows.
    fn with_rows(
        dim: usize,
        dtype: Dtype,
        state_dim: usize,
        huge_pages: bool,
        rows: usize,
    ) -> Result<Self> {
        let mut index = NeighborHash::with_config(embstore_index::Config {
            huge_pages,
            ..embstore_index::Config::default()
        })?;
        index.reserve(rows)?;
        let mut shard = Self {
            index,
            values: Values::new(dim, dtype, huge_pages),
            state: Arena::new(state_dim, huge_pages),
            meta: Vec::new(),
            free: Vec::new(),
            huge_pages,
            removed: None,
            dirty_keys: None,
            cold: None,
            sync: None,
        };
        if rows > 0 {
            shard.reserve_slots(rows)?;
            shard.meta.reserve_exact(rows);
        }
        Ok(shard)
    }

    /// Rows stored.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `key`'s row.
    #[inline]
    pub(crate) fn slot(&self, key: u64) -> Option<usize> {
        self.index.get(key).map(|s| s as usize)
    }

    /// Tells a tiered shard's replacement policy that the rows at `slots` (as an index probe
    /// returned them: `MISSING` for no row) were used; a no-op without a memory tier.
    #[inline]
    pub(crate) fn note_accesses(&self, slots: &[u64]) {
        if let Some(t) = &self.cold {
            for &s in slots.iter().filter(|&&s| s != embstore_index::MISSING) {
                t.policy.on_access(s as usize);
            }
        }
    }

    fn reserve_slots(&mut self, slots: usize) -> Result<()> {
        if self.values.ensure(slots) && self.state.ensure(slots) {
            return Ok(());
        }
        Err(Error::new(ErrorKind::Capacity, "out of memory for rows"))
    }

    /// Stores a new row for `key` (which has none): allocates a slot, indexes it, writes the
    /// optimizer's initial state and `meta`; returns the slot, whose values the caller writes.
    pub(crate) fn insert(&mut self, key: u64, meta: PackedMeta, opt: &Optimizer) -> Result<usize> {
        let slot = self.insert_clean(key, meta)?;
        opt.init_state(self.state.row_mut(slot));
        if let Some(dirty) = &mut self.dirty_keys {
            dirty.push(key);
        }
        if let Some(t) = &mut self.cold {
            t.index.remove(key); // a cold copy is older than this new row
            t.on_insert(slot, key, NONE);
        }
        Ok(slot)
    }

    /// Allocates a slot for `key` (which has no row), indexes it and stores `meta`; the caller
    /// writes the values and state.
    pub(crate) fn insert_clean(&mut self, key: u64, meta: PackedMeta) -> Result<usize> {
        let slot = self.free.last().copied().unwrap_or(self.meta.len());
        self.reserve_slots(slot + 1)?;
        self.index.insert(key, slot as u64)?;
        if self.free.pop().is_none() {
            self.meta.push(meta);
        } else {
            self.meta[slot] = meta;
        }
        Ok(slot)
    }

    /// Gives the shard a cold side, registering every row it holds (all hot, none on disk).
    pub(crate) fn attach_cold(&mut self, mut t: ColdSide) {
        for (key, slot) in self.index.iter() {
            t.on_insert(slot as usize, key, NONE);
        }
        self.cold = Some(Box::new(t));
    }

    /// Records a write of `key`'s row (at `slot`) with `version`.
    #[inline]
    pub(crate) fn record_write(&mut self, slot: usize, key: u64, version: crate::Version) {
        self.note_dirty(slot, key);
        self.meta[slot].write(version);
        if let Some(sync) = &mut self.sync {
            // The row's version as stored (one past a newer imported one, see `write`).
            sync.on_local(key, self.meta[slot].unpack().version, self.index.len());
        }
    }

    /// The table's sync state shared by its shards, if it syncs.
    pub(crate) fn sync_shared(&self) -> Option<std::sync::Arc<crate::shard::sync::SyncShared>> {
        self.sync.as_ref().map(|s| s.shared.clone())
    }

    /// Marks `key`'s write at `version` (the row's version as that write stored it)
    /// significant, if the row still holds that write.
    pub(crate) fn note_significant(&mut self, key: u64, version: crate::Version) {
        if let (Some(slot), Some(sync)) = (self.index.get(key), self.sync.as_mut()) {
            if self.meta[slot as usize].unpack().version == version {
                sync.on_significant(key, version);
            }
        }
    }

    /// Replaces the metadata of `key`'s row (at `slot`) with `meta` (an import).
    #[inline]
    pub(crate) fn set_meta(&mut self, slot: usize, key: u64, meta: PackedMeta) {
        self.note_dirty(slot, key);
        self.meta[slot] = meta;
    }

    /// Marks `key`'s row (at `slot`) dirty.
    pub(crate) fn mark_dirty(&mut self, slot: usize, key: u64) {
        self.note_dirty(slot, key);
        self.meta[slot].set_dirty(true);
    }

    /// Lists `key` as dirty if its row is clean now (it is about to change).
    #[inline]
    fn note_dirty(&mut self, slot: usize, key: u64) {
        if let Some(dirty) = &mut self.dirty_keys {
            if !self.meta[slot].is_dirty() {
                // Rows that evictions wrote out (clean again) and that changed once more are
                // listed twice: keep the list within twice the rows (amortised O(1) a push).
                // Trimmed before `key` joins: its dirty bit is set only after this returns, so
                // a trim after the push would drop it, and the next flush would miss its row.
                if dirty.len() >= 2 * self.index.len() + 4096 {
                    let (index, meta) = (&self.index, &self.meta);
                    dirty.retain(|&k| index.get(k).is_some_and(|s| meta[s as usize].is_dirty()));
                    dirty.sort_unstable();
                    dirty.dedup();
                }
                dirty.push(key);
            }
        }
    }

    /// Marks every row dirty (and lists them all, in a durable store).
    pub(crate) fn mark_all_dirty(&mut self) {
        self.meta.iter_mut().for_each(|m| m.set_dirty(true));
        if let Some(dirty) = &mut self.dirty_keys {
            dirty.clear();
            dirty.extend(self.index.iter().map(|(k, _)| k));
        }
    }

    /// Turns on change tracking; every row present counts as flushed.
    pub(crate) fn track_changes(&mut self) {
        self.removed = Some(Vec::new());
        self.dirty_keys = Some(Vec::new());
        self.meta.iter_mut().for_each(|m| m.set_dirty(false));
    }

    /// Removes `key`'s row; whether it had one. Call [`Shard::shrink_if_sparse`] after a batch.
    pub(crate) fn remove(&mut self, key: u64) -> bool {
        let removed = self.remove_row(key);
        if removed {
            if let Some(sync) = &mut self.sync {
                sync.on_local_remove(key, self.index.len());
            }
        }
        removed
    }

    /// [`Shard::remove`] without a sync tombstone (a synced removal records its own).
    pub(crate) fn remove_row(&mut self, key: u64) -> bool {
        if let Some(t) = &mut self.cold {
            t.index.remove(key);
        }
        let Some(slot) = self.slot(key) else { return false };
        if let Some(removed) = &mut self.removed {
            removed.push((key, self.meta[slot].unpack().version));
        }
        self.drop_row(key);
        true
    }

    /// Takes `key`'s row out of memory (no tombstone): the slot is freed.
    pub(crate) fn drop_row(&mut self, key: u64) {
        if let Some(slot) = self.index.remove(key) {
            let slot = slot as usize;
            self.meta[slot] = PackedMeta::default();
            self.free.push(slot);
            if let Some(t) = &mut self.cold {
                t.policy.on_remove(slot);
                t.disk_loc[slot] = NONE;
            }
        }
    }

    /// Slots in use or freed: the high-water mark of the rows (the index, which grows at load
    /// 0.8, has at most 2.5 buckets per slot).
    pub(crate) fn slots(&self) -> usize {
        self.meta.len()
    }

    /// When the live rows are under half of the slots, moves them into a shard sized for
    /// them and drops the old storage; returns whether it did. The rows keep their values,
    /// state and metadata; their slots change (no slot is held across a lock).
    pub(crate) fn shrink_if_sparse(&mut self) -> Result<bool> {
        let slots = self.slots();
        let slot_bytes = self.slot_bytes();
        let worth_it = slots * slot_bytes >= SHRINK_MIN_BYTES || (self.len() == 0 && slots > 0);
        if !worth_it || self.len() * SHRINK_BELOW >= slots {
            return Ok(false);
        }
        let (dim, dtype, state_dim) =
            (self.values.stride(), self.values.dtype(), self.state.stride());
        let mut next = Self::with_rows(dim, dtype, state_dim, self.huge_pages, self.len())?;
        // The policy starts over for the moved rows (their access history is lost: compaction
        // is rare, and every row re-enters the recency segment).
        next.cold = match &mut self.cold {
            Some(t) => Some(Box::new(t.emptied()?)),
            None => None,
        };
        for (key, slot) in self.index.iter() {
            let (old, new) = (slot as usize, next.meta.len());
            next.index.insert(key, new as u64)?;
            next.meta.push(self.meta[old]);
            next.values.copy_row_from(&self.values, old, new);
            next.state.row_mut(new).copy_from_slice(self.state.row(old));
            if let (Some(t), Some(old_t)) = (&mut next.cold, &self.cold) {
                t.on_insert(new, key, old_t.disk_loc[old]);
            }
        }
        if let (Some(t), Some(old_t)) = (&mut next.cold, &mut self.cold) {
            std::mem::swap(&mut t.index, &mut old_t.index);
        }
        next.removed = self.removed.take();
        next.dirty_keys = self.dirty_keys.take();
        next.sync = self.sync.take();
        *self = next;
        Ok(true)
    }

    /// In a tiered shard, after eviction: moves the rows of the highest slots into the free
    /// slots below `len()` (the replacement policy follows each one, so no access history is
    /// lost), so that the rows fill slots `0..len()`; then, when the arenas hold more than
    /// `keep_rows` slots (at least `len()`) by a quarter and [`SHRINK_MIN_BYTES`], gives the
    /// room past `keep_rows` back. O(rows moved), plus a copy of the rows when the first chunk
    /// is reallocated. Without it the slots a large call or a fill left behind stay allocated
    /// (only a shard under half full was compacted): 114 MiB held for a 64 MiB budget.
    pub(crate) fn compact_tiered(&mut self, keep_rows: usize) {
        let len = self.len();
        let slot_bytes = self.slot_bytes();
        let Some(t) = self.cold.as_mut() else { return };
        if !self.free.is_empty() {
            let high = self.meta.len();
            let mut free_slot = vec![false; high];
            for &f in &self.free {
                free_slot[f] = true;
            }
            let mut targets = (0..len).filter(|&s| free_slot[s]);
            for from in (len..high).filter(|&s| !free_slot[s]) {
                let to = targets.next().expect("as many free slots below len as rows above");
                let key = t.keys[from];
                self.values.copy_row(from, to);
                self.state.copy_row(from, to);
                self.meta[to] = self.meta[from];
                // Replacing a key's payload cannot fail for lack of room.
                let _ = self.index.insert(key, to as u64);
                t.keys[to] = key;
                t.disk_loc[to] = t.disk_loc[from];
                t.policy.on_move(from, to);
            }
            self.meta.truncate(len);
            self.free.clear();
            t.keys.truncate(len);
            t.disk_loc.truncate(len);
        }
        let keep = keep_rows.max(len);
        let capacity = self.values.capacity().min(self.state.capacity());
        let spare = capacity.saturating_sub(keep);
        if capacity != usize::MAX && spare * 4 > keep && spare * slot_bytes >= SHRINK_MIN_BYTES {
            self.values.truncate(keep);
            self.state.truncate(keep);
            self.meta.shrink_to(keep);
            self.free.shrink_to_fit();
            t.keys.shrink_to(keep);
            t.disk_loc.shrink_to(keep);
        }
    }

    /// Drops every row and releases the memory.
    pub(crate) fn clear(&mut self) -> Result<()> {
        let tracking = self.removed.is_some();
        let cold = match &mut self.cold {
            Some(t) => Some(Box::new(t.emptied()?)),
            None => None,
        };
        let fresh = Self::new(
            self.values.stride(),
            self.values.dtype(),
            self.state.stride(),
            self.huge_pages,
        )?;
        let sync = self.sync.take();
        *self = fresh;
        self.cold = cold;
        self.sync = sync;
        // A shard that syncs raises its parts' floors: peers drop the rows they held.
        if let Some(sync) = &mut self.sync {
            sync.on_local_clear();
        }
        if tracking {
            self.track_changes();
        }
        Ok(())
    }

    /// Bytes of one slot: its values (in the table's dtype), state and metadata.
    fn slot_bytes(&self) -> usize {
        self.values.row_bytes() + self.state.stride() * 4 + std::mem::size_of::<PackedMeta>()
    }

    /// Bytes allocated for this shard: index, arenas, metadata and free list.
    pub(crate) fn bytes_reserved(&self) -> usize {
        self.index.bytes()
            + self.values.bytes()
            + self.state.bytes()
            + self.meta.capacity() * std::mem::size_of::<PackedMeta>()
            + self.free.capacity() * std::mem::size_of::<usize>()
            + self.sync.as_ref().map_or(0, |s| s.bytes())
    }

    /// Bytes that hold live rows: their values, state, metadata and index buckets.
    pub(crate) fn bytes_used(&self) -> usize {
        let row = self.slot_bytes() + embstore_index::BUCKET_BYTES;
        self.len() * row
    }
}
