//! Spills: the segments evictions write, durable at the next flush.
//!
//! An eviction writes the dirty rows it takes out of memory to a segment (their only copy once
//! they leave memory), but the durability contract (see the `durable` module docs) only
//! promises what a flush made durable: rows written since the last flush may be lost in a
//! crash. So an eviction's segment — a *spill* — is written without fsync and named by no
//! manifest record. The tier reads the rows back from it as from any segment (the page cache
//! holds them until the kernel writes them back).
//!
//! **Adoption.** The next flush of the table (and `Store::compact`, and a checkpoint, which
//! flushes first) adopts every spill of it written since the last one: it fsyncs each, and the
//! one manifest record of the table's part of the flush names them with the flush's own
//! segment (`write_segment`), so a table's part of a flush stays one atomic record. A rewrite
//! (whose record supersedes them: their rows are copied into it) deletes them instead. A
//! compaction step or a checkpoint only runs after the table's part of the flush, so none
//! consumes a spill no record names. Spills and flushes both run under the manifest lock, so a
//! spill written before a flush began is adopted by it, and one written after holds rows newer
//! than it.
//!
//! **Recovery.** A spill's seq comes from a range of seqs the manifest reserved for spills
//! ([`Edit::SpillRange`]: one fsynced record per [`SPILL_RANGE`] seqs, not per eviction). At
//! open, a segment no record names whose seq lies in that range was never adopted (or is a
//! flush's segment whose record never landed): its rows are newer than the last completed
//! flush, whose segments hold their flushed values, so it is proven superseded and deleted
//! (`orphans`). Every other unnamed segment keeps the usual proof.

use super::{segment_path, Durable};
use crate::disk::manifest::{Edit, Manifest, State};
use crate::Result;

/// Seqs one [`Edit::SpillRange`] record reserves for spills. A flush of a tiered table reserves
/// the next range in its record when less than half of one is left.
pub(crate) const SPILL_RANGE: u64 = 1024;

/// A spill written and not yet adopted: which table's, its seq, and what the record adopting
/// it says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spill {
    pub(crate) table: u64,
    pub(crate) seq: u64,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
}

impl Durable {
    /// Makes sure the next seq lies in the range reserved for spills, recording a new range
    /// (durably) when it does not: called before a spill takes its seq.
    pub(super) fn reserve_spill_seq(&self, log: &mut (Manifest, State)) -> Result<()> {
        let (manifest, state) = log;
        let seq = state.next_seq.max(1);
        if seq < state.spill_below {
            return Ok(());
        }
        let edits = [Edit::SpillRange { below: seq + SPILL_RANGE }];
        let mut next = state.clone();
        next.apply(&edits[0])?;
        manifest.append(&*self.vfs, &edits, &next)?;
        *state = next;
        Ok(())
    }

    /// The spills of table `id` not yet adopted, in seq order.
    pub(super) fn spills_of(&self, id: u64) -> Vec<Spill> {
        self.spills.lock().iter().filter(|s| s.table == id).copied().collect()
    }

    /// Fsyncs `spills` (before a record adopts them).
    pub(super) fn sync_spills(&self, spills: &[Spill]) -> Result<()> {
        for s in spills {
            let path = segment_path(&self.dir, s.seq);
            self.vfs
                .append(&path)
                .and_then(|mut f| f.sync())
                .map_err(|e| crate::Error::io(format!("fsync {}", path.display()), e))?;
        }
        Ok(())
    }

    /// `spills` are adopted, or (`superseded`: a record superseding them landed) deleted.
    pub(super) fn forget_spills(&self, spills: &[Spill], superseded: bool) {
        if spills.is_empty() {
            return;
        }
        self.spills.lock().retain(|s| !spills.contains(s));
        if superseded {
            let seqs: Vec<u64> = spills.iter().map(|s| s.seq).collect();
            self.delete_segments(&seqs);
        }
    }

    /// Forgets the spills of table `id` (dropped: its record is durable) and deletes them.
    pub(super) fn drop_spills(&self, id: u64) {
        let mut pending = self.spills.lock();
        for s in pending.iter().filter(|s| s.table == id) {
            let _ = self.vfs.remove(&segment_path(&self.dir, s.seq));
        }
        pending.retain(|s| s.table != id);
    }
}
