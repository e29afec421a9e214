//! Row metadata: the public [`RowMeta`] and the 16-byte form a shard stores per slot.
//!
//! A row's metadata is its version (hybrid timestamp and replica id), its write count and the
//! time of its last write. Stored naively that is 32 bytes a row — as much as the values of an
//! 8-float row. [`PackedMeta`] keeps it in 16:
//!
//! ```text
//! stamp: u64    the version's timestamp (ms << 16 | counter); for a row never written, the
//!               creation time in the same form
//! replica: u32  bit 31: the row has been written (its version is not 0); bits 0..31: replica
//! writes: u32   bit 31: dirty (changed since the last flush of a durable store);
//!               bits 0..31: update count, saturating at 2^31 - 1
//! ```
//!
//! So the last-update time is not stored on its own: it is the millisecond part of the stamp —
//! of the version for a written row, of the creation time otherwise. Replica ids are below
//! 2^31 ([`MAX_REPLICA`]).

use crate::{Error, Result, Version};

/// The largest replica id (bit 31 of the stored replica marks a written row).
pub const MAX_REPLICA: u32 = (1 << 31) - 1;

const WRITTEN: u32 = 1 << 31;
const DIRTY: u32 = 1 << 31;
const MAX_WRITES: u32 = DIRTY - 1;

/// A row's metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowMeta {
    /// Version of the last write (0 for a row that still holds its initial value).
    pub version: Version,
    /// Writes to the row (optimizer steps and assignments), saturating at 2^31 − 1 when stored.
    pub update_count: u64,
    /// Time of the last write (the version's milliseconds), or of the row's creation for a row
    /// never written, in ms since the Unix epoch.
    pub last_update_ms: u64,
}

/// [`RowMeta`] in 16 bytes (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct PackedMeta {
    stamp: u64,
    replica: u32,
    writes: u32,
}

const _: () = assert!(std::mem::size_of::<PackedMeta>() == 16);

impl PackedMeta {
    /// A new row created at `now_ms`, never written.
    #[inline]
    pub(crate) fn created(now_ms: u64) -> Self {
        Self { stamp: now_ms << 16, replica: 0, writes: DIRTY }
    }

    /// Records a write with `version` — or, when the row already holds a version at least as
    /// new (one imported from a clock that runs ahead of ours), with one just past it, so that a
    /// row's versions only ever increase (last writer wins stays right per row).
    #[inline]
    pub(crate) fn write(&mut self, version: Version) {
        let held = (self.stamp, self.replica & !WRITTEN);
        self.stamp = if self.replica & WRITTEN != 0 && held >= (version.timestamp, version.replica)
        {
            self.stamp.saturating_add(1)
        } else {
            version.timestamp
        };
        self.replica = version.replica | WRITTEN;
        self.writes = ((self.writes & MAX_WRITES) + 1).min(MAX_WRITES) | DIRTY;
    }

    /// Whether the row changed since the last flush (every change sets it).
    #[inline]
    pub(crate) fn is_dirty(&self) -> bool {
        self.writes & DIRTY != 0
    }

    /// Marks the row as flushed (or as changed).
    #[inline]
    pub(crate) fn set_dirty(&mut self, dirty: bool) {
        self.writes = (self.writes & MAX_WRITES) | if dirty { DIRTY } else { 0 };
    }

    /// Milliseconds of the last write, or of the creation.
    #[inline]
    pub(crate) fn last_update_ms(&self) -> u64 {
        self.stamp >> 16
    }

    /// Checks that `m` can be stored: its replica fits in 31 bits.
    pub(crate) fn check(m: &RowMeta) -> Result<()> {
        if m.version.replica > MAX_REPLICA {
            return Err(Error::invalid(format!(
                "replica ids must be at most 2^31 - 1, got {}",
                m.version.replica
            )));
        }
        Ok(())
    }

    /// The stored form of `m` (checked with [`PackedMeta::check`]).
    pub(crate) fn pack(m: &RowMeta) -> Self {
        let writes = m.update_count.min(MAX_WRITES as u64) as u32 | DIRTY;
        if m.version == Version::default() {
            Self { stamp: m.last_update_ms.min(u64::MAX >> 16) << 16, replica: 0, writes }
        } else {
            Self { stamp: m.version.timestamp, replica: m.version.replica | WRITTEN, writes }
        }
    }

    pub(crate) fn unpack(&self) -> RowMeta {
        let version = if self.replica & WRITTEN != 0 {
            Version { timestamp: self.stamp, replica: self.replica & !WRITTEN }
        } else {
            Version::default()
        };
        RowMeta {
            version,
            update_count: (self.writes & MAX_WRITES) as u64,
            last_update_ms: self.last_update_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks() {
        let mut m = PackedMeta::created(1_700_000_000_000);
        assert_eq!(
            m.unpack(),
            RowMeta {
                version: Version::default(),
                update_count: 0,
                last_update_ms: 1_700_000_000_000
            }
        );
        let v = Version { timestamp: (1_700_000_000_005 << 16) | 3, replica: MAX_REPLICA };
        m.write(v);
        assert_eq!(m.unpack(), RowMeta { version: v, update_count: 1, last_update_ms: v.ms() });
        let given = RowMeta { version: v, update_count: 1 << 40, last_update_ms: 0 };
        assert_eq!(PackedMeta::pack(&given).unpack().update_count, MAX_WRITES as u64);
        let mut clean = PackedMeta::pack(&given);
        assert!(clean.is_dirty());
        clean.set_dirty(false);
        assert!(!clean.is_dirty() && clean.unpack() == PackedMeta::pack(&given).unpack());
        clean.write(v);
        assert!(clean.is_dirty());
        assert_eq!(PackedMeta::pack(&given).unpack().version, v);
        let bad = RowMeta { version: Version { timestamp: 1, replica: 1 << 31 }, ..given };
        assert!(PackedMeta::check(&bad).is_err());
    }

    #[test]
    fn a_write_never_lowers_a_rows_version() {
        let ahead = Version { timestamp: 5_000 << 16, replica: 7 };
        let mut m =
            PackedMeta::pack(&RowMeta { version: ahead, update_count: 1, last_update_ms: 0 });
        let local = Version { timestamp: 1_000 << 16, replica: 2 };
        m.write(local);
        let v = m.unpack().version;
        assert!(v > ahead && v.replica == 2, "{v:?}");
        let later = Version { timestamp: 9_000 << 16, replica: 2 };
        m.write(later);
        assert_eq!(m.unpack().version, later);
    }
}
