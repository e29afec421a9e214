//! A table's side of durability: writing the rows changed since the last flush (and the
//! removals) into a segment, and replaying segments at open.
//!
//! Every change to a row sets its dirty bit (`meta`); in a durable store each shard also lists
//! the rows removed since the last flush and the keys whose rows turned dirty (each once, on
//! the clean → dirty change), so a flush costs what changed, not the table's size. A flush
//! writes, shard by shard, first the removals (as tombstones) and then the dirty rows,
//! clearing each row's bit as it copies the row. So
//! replaying the segments in seq order, and each segment front to back, reproduces every row
//! as it was copied: a later record of a key is always a later state of it (a row removed and
//! written again within one flush has its tombstone before its record).

use std::sync::atomic::Ordering;

use crate::disk::segment::{SegmentReader, SegmentWriter};
use crate::{Result, RowMeta, Table, Version};

/// Rows copied per shard lock while flushing: short enough that lookups barely wait.
const FLUSH_CHUNK: usize = 4096;
/// Rows per import batch while replaying.
const REPLAY_BATCH: usize = 16 * 1024;

/// Removals taken out of the shards for a segment: (shard, its removed keys and versions).
pub(crate) type Removals = Vec<(usize, Vec<(u64, Version)>)>;

/// Rows copied out of a shard, reused between chunks.
pub(crate) struct CopyBuf {
    values: Vec<f32>,
    state: Vec<f32>,
    rows: Vec<(u64, RowMeta)>,
}

impl CopyBuf {
    pub(crate) fn new(t: &Table) -> Self {
        Self {
            values: Vec::with_capacity(FLUSH_CHUNK * t.dim()),
            state: Vec::with_capacity(FLUSH_CHUNK * t.state_dim()),
            rows: Vec::with_capacity(FLUSH_CHUNK),
        }
    }

    fn clear(&mut self) {
        self.values.clear();
        self.state.clear();
        self.rows.clear();
    }
}

impl Table {
    /// Makes the table track its changes for a durable store: shards list their removals,
    /// `clear` and `load` mark the table cleared. Every row present now counts as flushed.
    pub(crate) fn track_changes(&self) {
        self.durable.store(true, Ordering::Relaxed);
        for shard in self.shards.iter() {
            shard.write().track_changes();
        }
    }

    /// Whether every row was replaced (`clear`, `load`) since the last call; resets it.
    pub(crate) fn take_cleared(&self) -> bool {
        self.cleared.swap(false, Ordering::Relaxed)
    }

    /// Sets it again (after a flush that failed).
    pub(crate) fn set_cleared(&self) {
        self.cleared.store(true, Ordering::Relaxed);
    }

    /// Marks every row as changed, so that the next flush writes it (after a failed flush, or
    /// to rewrite every row).
    pub(crate) fn mark_all_dirty(&self) {
        for shard in self.shards.iter() {
            shard.write().mark_all_dirty();
        }
    }

    /// Appends the removals and the dirty rows to `w`, clearing the rows' dirty bits; returns
    /// the rows written (tombstones included). The removals taken out of the shards go to
    /// `taken`: unless the segment's record lands, the caller must give them back
    /// ([`Table::put_back_removals`]) and [`Table::mark_all_dirty`], as some rows' bits were
    /// cleared for a segment that will never count.
    pub(crate) fn write_changes(
        &self,
        w: &mut SegmentWriter,
        file: Option<u32>,
        taken: &mut Removals,
    ) -> Result<u64> {
        self.write_changes_of(w, file, None, taken)
    }

    /// [`Table::write_changes`], writing of the dirty rows only those of `only` (keys by
    /// shard; an eviction's victims) when given. The removals are always written first, all
    /// of them: a row removed and then written again must have its tombstone before its record
    /// on disk, whichever segment the record goes to.
    pub(crate) fn write_changes_of(
        &self,
        w: &mut SegmentWriter,
        file: Option<u32>,
        only: Option<&[Vec<u64>]>,
        taken: &mut Removals,
    ) -> Result<u64> {
        let mut written = 0u64;
        let mut buf = CopyBuf::new(self);
        for (s, lock) in self.shards.iter().enumerate() {
            let (removed, dirty) = {
                let mut shard = lock.write();
                let removed = shard.removed.as_mut().map(std::mem::take).unwrap_or_default();
                let dirty = match only {
                    Some(_) => Vec::new(),
                    None => shard.dirty_keys.as_mut().map(std::mem::take).unwrap_or_default(),
                };
                (removed, dirty)
            };
            let dirty = only.map_or(&dirty[..], |o| &o[s][..]);
            taken.push((s, removed));
            let removed = &taken.last().expect("just pushed").1;
            for &(key, version) in removed {
                w.push_tombstone(key, version)?;
            }
            written += removed.len() as u64;
            written += self.copy_dirty(s, dirty, w, file, &mut buf)?;
        }
        Ok(written)
    }

    /// Gives the removals a segment took ([`Table::write_changes`]) back to their shards, so
    /// that the next flush writes them: the segment's record did not land.
    pub(crate) fn put_back_removals(&self, taken: Removals) {
        for (s, removed) in taken {
            if removed.is_empty() {
                continue;
            }
            if let Some(list) = self.shards[s].write().removed.as_mut() {
                list.extend(removed);
            }
        }
    }

    /// Appends the rows of `keys` (all in shard `s`) that are dirty to `w`, FLUSH_CHUNK at a
    /// time under the shard's write lock, clearing their dirty bits and — with `file`, the
    /// slot of the segment `w` writes in a tiered table — setting their disk location.
    /// Returns the rows written. On an error the caller must [`Table::mark_all_dirty`].
    pub(crate) fn copy_dirty(
        &self,
        s: usize,
        keys: &[u64],
        w: &mut SegmentWriter,
        file: Option<u32>,
        buf: &mut CopyBuf,
    ) -> Result<u64> {
        let (d, sd) = (self.dim(), self.state_dim);
        let mut written = 0;
        for keys in keys.chunks(FLUSH_CHUNK) {
            buf.clear();
            let base = w.records();
            {
                let mut shard = self.shards[s].write();
                let shard = &mut *shard;
                for &key in keys {
                    let Some(slot) = shard.slot(key) else { continue };
                    if !shard.meta[slot].is_dirty() {
                        continue;
                    }
                    shard.values.extend(slot, &mut buf.values);
                    buf.state.extend_from_slice(shard.state.row(slot));
                    if let Some(f) = file {
                        shard.set_disk_copy(slot, f, base + buf.rows.len() as u64);
                    }
                    buf.rows.push((key, shard.meta[slot].unpack()));
                    shard.meta[slot].set_dirty(false);
                }
            }
            for (i, (key, meta)) in buf.rows.iter().enumerate() {
                w.push(*key, meta, &buf.values[i * d..][..d], &buf.state[i * sd..][..sd])?;
            }
            written += buf.rows.len() as u64;
        }
        Ok(written)
    }

    /// Applies one segment's records in order: rows are written as stored (repairing
    /// non-finite ones, as `load` does), tombstones remove. Returns (rows, tombstones).
    pub(crate) fn replay(&self, r: &SegmentReader) -> Result<(u64, u64)> {
        let (d, sd) = (self.dim(), self.state_dim);
        let mut batch = crate::RowChunk::default();
        let (mut rows, mut tombstones) = (0u64, 0u64);
        let flush = |batch: &mut crate::RowChunk| -> Result<()> {
            if !batch.is_empty() {
                self.import_saved(batch)?;
                *batch = crate::RowChunk::default();
            }
            Ok(())
        };
        r.for_each(|rec| {
            if rec.tombstone {
                flush(&mut batch)?;
                self.remove(&[rec.key])?;
                tombstones += 1;
            } else {
                batch.ids.push(rec.key);
                batch.values.extend_from_slice(&rec.values[..d]);
                batch.state.extend_from_slice(&rec.state[..sd]);
                batch.meta.push(rec.meta);
                rows += 1;
                if batch.len() >= REPLAY_BATCH {
                    flush(&mut batch)?;
                }
            }
            Ok(())
        })?;
        flush(&mut batch)?;
        Ok((rows, tombstones))
    }
}
