//! A shard's cold side, in a table with a memory budget: the **cold index** (key → where the
//! row's latest record lives on disk, for rows held only there), and per hot slot its key, the
//! location of its clean copy on disk ([`NONE`] if it has none) and the replacement policy's
//! state ([`embstore_policy::eviction`]); the [`FileTable`] of segments those locations point into; and the
//! moves between the two sides, [`Shard::promote`] and [`Shard::demote`].
//!
//! Invariants: the hot index and the cold index hold disjoint keys; a location names a file
//! slot and a record number ([`loc`]); a row is demoted only when it is clean and its disk copy
//! is durable (its segment installed).

use std::sync::Arc;

use embstore_index::{NeighborHash, MISSING};

use super::Shard;
use crate::disk::segment::{Record, SegmentReader};
use crate::meta::PackedMeta;
use crate::{Error, ErrorKind, Result};
use embstore_policy::{Eviction, EvictionConfig};

/// No disk copy.
pub(crate) const NONE: u64 = u64::MAX;
/// Record numbers take the low 31 bits of a location, file slots the 20 above them.
const IDX_BITS: u32 = 31;
const MAX_FILE_SLOTS: usize = 1 << 20;

/// A disk location: file slot and record number.
pub(crate) fn loc(file_slot: u32, record: u64) -> u64 {
    debug_assert!(record < 1 << IDX_BITS);
    (file_slot as u64) << IDX_BITS | record
}

pub(crate) fn loc_parts(loc: u64) -> (u32, u64) {
    ((loc >> IDX_BITS) as u32, loc & ((1 << IDX_BITS) - 1))
}

/// A shard's cold side (see the module docs).
pub(crate) struct ColdSide {
    /// Key → location of the row's latest record, for the rows on disk only.
    pub(crate) index: NeighborHash,
    pub(crate) disk_loc: Vec<u64>,
    pub(crate) keys: Vec<u64>,
    pub(crate) policy: Box<dyn Eviction>,
    config: EvictionConfig,
    seed: u64,
}

impl std::fmt::Debug for ColdSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdSide").field("cold", &self.index.len()).finish_non_exhaustive()
    }
}

impl ColdSide {
    pub(crate) fn new(config: &EvictionConfig, seed: u64) -> Result<Self> {
        Ok(Self {
            index: NeighborHash::new(),
            disk_loc: Vec::new(),
            keys: Vec::new(),
            policy: config.build(seed),
            config: config.clone(),
            seed,
        })
    }

    /// A fresh cold side of the same configuration (no rows, no cold index).
    pub(crate) fn emptied(&self) -> Result<Self> {
        Self::new(&self.config, self.seed)
    }

    /// Bytes beyond the hot rows' own: the cold index, and per hot slot its key, disk location
    /// and policy state.
    pub(crate) fn bytes(&self) -> usize {
        self.index.bytes() + self.keys.capacity() * self.slot_bytes()
    }

    /// Cold-side bytes per hot slot: key, disk location, policy state.
    pub(crate) fn slot_bytes(&self) -> usize {
        16 + self.policy.bytes_per_slot()
    }

    /// Notes `slot` (now holding `key`, with its disk copy at `disk`) as a new hot row.
    pub(crate) fn on_insert(&mut self, slot: usize, key: u64, disk: u64) {
        if slot >= self.keys.len() {
            self.keys.resize(slot + 1, 0);
            self.disk_loc.resize(slot + 1, NONE);
        }
        self.keys[slot] = key;
        self.disk_loc[slot] = disk;
        self.policy.on_insert(slot);
    }
}

/// The segments a tiered table's locations point into, by file slot.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    /// A reserved slot (a segment being written) holds `None` until it is installed.
    slots: Vec<Option<(u64, Arc<SegmentReader>)>>,
    free: Vec<u32>,
}

impl FileTable {
    /// A free slot for a segment about to be written.
    pub(crate) fn reserve(&mut self) -> Result<u32> {
        match self.free.pop() {
            Some(s) => Ok(s),
            None if self.slots.len() < MAX_FILE_SLOTS => {
                self.slots.push(None);
                Ok((self.slots.len() - 1) as u32)
            }
            None => Err(Error::new(
                ErrorKind::Capacity,
                "a table's segments exceed 2^20 files; compaction is behind",
            )),
        }
    }

    /// Puts the sealed segment `seq` in `slot`.
    pub(crate) fn install(&mut self, slot: u32, seq: u64, reader: Arc<SegmentReader>) {
        self.slots[slot as usize] = Some((seq, reader));
    }

    /// Frees `slot` (a reservation that was not used, or a segment no location points into).
    pub(crate) fn release(&mut self, slot: u32) {
        self.slots[slot as usize] = None;
        self.free.push(slot);
    }

    /// The slots of segments with seq below `seq`.
    pub(crate) fn slots_below(&self, seq: u64) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|&s| self.slots[s as usize].as_ref().is_some_and(|(q, _)| *q < seq))
            .collect()
    }

    /// Whether `slot` holds a sealed, recorded segment.
    pub(crate) fn installed(&self, slot: u32) -> bool {
        matches!(self.slots.get(slot as usize), Some(Some(_)))
    }

    pub(crate) fn reader(&self, slot: u32) -> Result<Arc<SegmentReader>> {
        match self.slots.get(slot as usize) {
            Some(Some((_, r))) => Ok(r.clone()),
            _ => Err(Error::corrupt(format!(
                "a row points into file slot {slot}, which holds no segment"
            ))),
        }
    }
}

impl Shard {
    /// Appends to `cold` the ids among `keys` whose rows are on disk, with their locations;
    /// with `note_hot`, notes an access to each id in memory for the replacement policy (else
    /// the caller's own probe does, and only the cold index is probed here). Batched probes:
    /// the index prefetches ahead. `slots` and `misses` are scratch space.
    pub(crate) fn find_cold(
        &self,
        keys: &[u64],
        note_hot: bool,
        slots: &mut Vec<u64>,
        misses: &mut Vec<u64>,
        cold: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let t = self.cold.as_ref().expect("a tiered table's shards are tiered");
        if !note_hot {
            // Hot and cold indexes hold disjoint keys: the cold probe alone finds the rows to
            // read.
            if !t.index.is_empty() {
                slots.clear();
                slots.resize(keys.len(), 0);
                t.index.get_batch(keys, slots)?;
                let found = keys.iter().zip(slots.iter()).filter(|(_, &l)| l != MISSING);
                cold.extend(found.map(|(&id, &l)| (id, l)));
            }
            return Ok(());
        }
        // The hot index, then the cold index for the misses.
        slots.clear();
        slots.resize(keys.len(), 0);
        self.index.get_batch(keys, slots)?;
        misses.clear();
        for (&id, &slot) in keys.iter().zip(slots.iter()) {
            match slot {
                MISSING => misses.push(id),
                slot => t.policy.on_access(slot as usize),
            }
        }
        if misses.is_empty() || t.index.is_empty() {
            return Ok(());
        }
        slots.clear();
        slots.resize(misses.len(), 0);
        t.index.get_batch(misses, slots)?;
        for (&id, &l) in misses.iter().zip(slots.iter()) {
            if l != MISSING {
                cold.push((id, l));
            }
        }
        Ok(())
    }

    /// Promotes `key` from `l` (its record `rec`) unless it is in memory already or its row
    /// moved meanwhile (another call promoted it, or a rewrite relocated it).
    #[inline]
    pub(crate) fn promote_if_cold(&mut self, key: u64, l: u64, rec: &Record) -> Result<()> {
        let t = self.cold.as_ref().expect("tiered");
        if self.index.get(key).is_some() || t.index.get(key) != Some(l) {
            return Ok(());
        }
        self.promote(key, l, rec)
    }

    /// Moves the cold row `key` (read from `l`) into memory, clean.
    pub(crate) fn promote(&mut self, key: u64, l: u64, rec: &Record) -> Result<()> {
        let mut meta = PackedMeta::pack(&rec.meta);
        meta.set_dirty(false);
        let slot = self.insert_clean(key, meta)?;
        self.values.write(slot, &rec.values);
        self.state.row_mut(slot).copy_from_slice(&rec.state);
        let t = self.cold.as_mut().expect("tiered");
        t.index.remove(key);
        t.on_insert(slot, key, l);
        Ok(())
    }

    /// Moves the hot row `key` to the cold index if it is clean with a disk copy; whether it
    /// did.
    pub(crate) fn demote(&mut self, key: u64, durable: impl Fn(u64) -> bool) -> Result<bool> {
        let Some(slot) = self.slot(key) else { return Ok(false) };
        let t = self.cold.as_ref().expect("tiered");
        let disk = t.disk_loc[slot];
        if self.meta[slot].is_dirty() || disk == NONE || !durable(disk) {
            return Ok(false);
        }
        self.cold.as_mut().expect("tiered").index.insert(key, disk)?;
        self.drop_row(key);
        Ok(true)
    }

    /// Gives this shard an empty cold side configured as `other`'s, if `other` has one (its
    /// rows all hot, none on disk): after rows were swapped in from another table.
    pub(crate) fn attach_cold_like(&mut self, other: &Shard) {
        if let Some(t) = &other.cold {
            self.attach_cold(t.emptied().expect("a cold side's empty state"));
        }
    }

    /// Bytes of the cold side: the cold index, and per hot slot its key, disk location and
    /// policy state (0 without a memory budget).
    pub(crate) fn cold_bytes(&self) -> usize {
        self.cold.as_ref().map_or(0, |t| t.bytes())
    }

    /// Rows held only on disk.
    pub(crate) fn cold_len(&self) -> usize {
        self.cold.as_ref().map_or(0, |t| t.index.len())
    }

    /// The keys held only on disk, with their locations.
    pub(crate) fn cold_entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.cold.iter().flat_map(|t| t.index.iter())
    }

    /// Where `key`'s row lies on disk, if it is held only there.
    pub(crate) fn cold_loc(&self, key: u64) -> Option<u64> {
        self.cold.as_ref().and_then(|t| t.index.get(key))
    }

    /// Notes that the row at `slot` has a clean copy at record `record` of the segment in file
    /// slot `file` (a no-op without a cold side).
    pub(crate) fn set_disk_copy(&mut self, slot: usize, file: u32, record: u64) {
        if let Some(t) = self.cold.as_mut() {
            t.disk_loc[slot] = loc(file, record);
        }
    }
}
