//! Writing one segment of a table and recording it in the manifest: the step every flush,
//! rewrite and eviction goes through, as a transaction.
//!
//! [`Durable::write_segment`] reads as the happy path. Each change it makes on the way is
//! recorded in a [`SegmentTx`] as it is made — a file slot reserved in the tier, rows taken out
//! of the table (dirty bits cleared as they are copied, removals and the cleared mark taken),
//! the segment file created, the manifest record tried — and dropping the transaction before
//! [`SegmentTx::commit`] undoes each of them: the slot is released, every row is marked dirty
//! and the removals taken go back to their shards (and the cleared mark is set again) so the
//! next flush writes them again, and the file is deleted.
//!
//! Invariant: once the manifest append has been tried, its record may be on disk in part or
//! whole, so the segment is kept (an orphan the next open deletes if the record did not make it,
//! see `orphans`) and its seq is never handed out again; the manifest is rewritten — recording
//! that seq as handed out — before the next segment is created ([`SegmentTx::begin`]), so at
//! most one segment is ever newer than the manifest on disk, spills aside: their seqs lie in the
//! range the manifest reserved for them (`spill`). Rolling back runs under the table's gate
//! when the commit had taken it, so no `clear`, `load` or demotion sees rows that point into a
//! segment no record names.
//!
//! A compaction step's segment (`compact`) goes through the same guard
//! ([`SegmentTx::begin_copy`]): it takes no rows out of the table, so its rollback only deletes
//! the file or, once the append was tried, keeps it and spends its seq.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLockReadGuard;

use super::changes::Removals;
use super::spill::{Spill, SPILL_RANGE};
use super::{segment_path, Durable, FlushStats};
use crate::disk::manifest::{Edit, Manifest, State};
use crate::disk::segment::{SegmentHeader, SegmentKind, SegmentReader, SegmentWriter};
use crate::tier::Gate;
use crate::version::now_ms;
use crate::{Result, Table};

impl Durable {
    /// Writes one segment of `table` with `body` (given the writer and, for a tiered table,
    /// the file slot its rows' locations point into), then records it — with a `Supersede` of
    /// the older segments when the table was cleared or this is a rewrite — and the step in one
    /// manifest record. Returns the segment's seq if one was kept. On any failure the segment
    /// is deleted (unless its record may have landed) and every row is marked dirty again
    /// ([`SegmentTx`]).
    ///
    /// With `spill` (an eviction) the segment is sealed without fsync and no record names it:
    /// it is listed for the next flush to adopt (`spill`), its seq taken from the range the
    /// manifest reserved for spills. A table whose cleared mark is pending gets a recorded
    /// segment instead (it must supersede the older ones).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_segment(
        &self,
        log: &mut (Manifest, State),
        table: &Table,
        kind: SegmentKind,
        rewrite: bool,
        spill: bool,
        stats: &mut FlushStats,
        body: impl FnOnce(&mut SegmentWriter, Option<u32>, &mut Removals) -> Result<(u64, Vec<Moved>)>,
    ) -> Result<Option<u64>> {
        // The table this handle was created as: a handle of a dropped table (an eviction still
        // in flight) must never write into a new table of the same name.
        let id = table.disk_id.load(Ordering::Relaxed);
        if table.dropped() || !log.1.tables.contains_key(&id) || self.lock.lock().is_none() {
            return Ok(None);
        }
        // A `clear` or `load` that overlaps this segment (the epoch is odd while one runs, and
        // moves on each) leaves it holding rows from both sides: see below.
        let epoch = table.clear_epoch.load(Ordering::Acquire);
        if spill {
            // Heals the manifest first if an append failed, as `begin` does.
            log.0.heal(&*self.vfs, &log.1)?;
            self.reserve_spill_seq(log)?;
        }
        let mut tx = SegmentTx::begin(self, log, table, rewrite)?;
        let (seq, cleared) = (tx.seq, tx.cleared);
        // A spill, unless the table's cleared mark was pending (then a recorded segment).
        let spill = spill && !cleared;
        tx.spill = spill;
        // A spill says so in its header: recovery takes only such a file for an unadopted one.
        let mut w = tx.create(id, if spill { SegmentKind::Spill } else { kind })?;
        let slot = tx.slot;
        let (written, moved) = body(&mut w, slot, &mut tx.removals)?;
        if spill {
            return self.commit_spill(tx, w, id, written, epoch);
        }
        // The table's spills: adopted by this record, or superseded by it when it supersedes
        // the older segments (their rows were copied into it, or cleared).
        let spills = self.spills_of(id);
        // The next range of seqs for spills, reserved in this record when little is left.
        let extend = table.is_tiered() && tx.state().spill_below < seq + 1 + SPILL_RANGE / 2;
        if written == 0
            && !cleared
            && spills.is_empty()
            && !extend
            && tx.state().tables[&id].step == table.step()
        {
            drop(w);
            tx.discard_unchanged();
            return Ok(None); // nothing changed
        }
        let superseded: Vec<u64> = match cleared {
            true => tx.state().tables[&id].files.keys().copied().filter(|&s| s < seq).collect(),
            false => Vec::new(),
        };
        let mut edits = Vec::new();
        if cleared {
            edits.push(Edit::Supersede { table: id, below: seq });
        } else {
            self.sync_spills(&spills)?;
            for s in &spills {
                let (seq, records, bytes) = (s.seq, s.records, s.bytes);
                edits.push(Edit::AddFile { table: id, seq, records, bytes });
            }
            stats.spills_adopted += spills.len() as u64;
        }
        let kept = written > 0;
        if kept {
            let info = w.finish()?;
            edits.push(Edit::AddFile { table: id, seq, records: info.records, bytes: info.bytes });
            stats.records += info.records;
            stats.bytes += info.bytes;
            stats.segments += 1;
        } else {
            drop(w);
            tx.remove_file();
        }
        edits.push(Edit::Step { table: id, step: table.step() });
        edits.push(Edit::Rows { table: id, rows: table.len() as u64 });
        if extend {
            edits.push(Edit::SpillRange { below: seq + 1 + SPILL_RANGE });
        }
        let mut next = tx.state().clone();
        edits.iter().try_for_each(|e| next.apply(e))?;
        let reader = match (kept, table.is_tiered()) {
            (true, true) => Some(Arc::new(SegmentReader::open_for_reads(&*self.vfs, &tx.path)?)),
            _ => None,
        };
        // The commit: no `clear`, `load` or demotion of this table runs from here to the end.
        tx.hold_gate();
        if epoch % 2 == 1 || table.clear_epoch.load(Ordering::Acquire) != epoch {
            // Rows copied before the clear and rows written after it share this segment: keep
            // every row dirty (so none is evicted pointing into it) and make the next segment
            // supersede it.
            table.mark_all_dirty();
            table.set_cleared();
        }
        tx.append(&edits, &next)?;
        let (slot, _gate) = tx.commit(next);
        if let Some(slot) = slot {
            // The segment's part in the tier: its reader in the slot, rows moved on a rewrite.
            table.on_segment_committed(slot, seq, reader, cleared, &moved);
        }
        self.delete_segments(&superseded);
        self.forget_spills(&spills, cleared);
        Ok(kept.then_some(seq))
    }

    /// The end of [`Durable::write_segment`] for a spill: seals the segment without fsync,
    /// installs it in the tier and lists it for the next flush to adopt; no record.
    fn commit_spill(
        &self,
        mut tx: SegmentTx<'_>,
        w: SegmentWriter,
        id: u64,
        written: u64,
        epoch: u64,
    ) -> Result<Option<u64>> {
        let (table, seq) = (tx.table, tx.seq);
        if written == 0 {
            drop(w);
            tx.discard_unchanged();
            return Ok(None);
        }
        let info = w.seal(false)?;
        let reader = match table.is_tiered() {
            true => Some(Arc::new(SegmentReader::open_for_reads(&*self.vfs, &tx.path)?)),
            false => None,
        };
        tx.hold_gate();
        if epoch % 2 == 1 || table.clear_epoch.load(Ordering::Acquire) != epoch {
            // As in `write_segment`: a clear overlapped; the next flush's segment supersedes
            // this one (adopted first).
            table.mark_all_dirty();
            table.set_cleared();
        }
        let mut next = tx.state().clone();
        next.next_seq = next.next_seq.max(seq + 1);
        self.spills.lock().push(Spill { table: id, seq, records: info.records, bytes: info.bytes });
        let (slot, _gate) = tx.commit(next);
        if let Some(slot) = slot {
            table.on_segment_committed(slot, seq, reader, false, &[]);
        }
        Ok(Some(seq))
    }
}

/// One segment write in progress: each step done is recorded, and dropping it before
/// [`SegmentTx::commit`] undoes them (see the module docs).
pub(super) struct SegmentTx<'a> {
    durable: &'a Durable,
    table: &'a Table,
    log: &'a mut (Manifest, State),
    /// The segment's seq and path.
    seq: u64,
    path: PathBuf,
    /// Whether the segment supersedes the table's older ones (a clear or a rewrite).
    cleared: bool,
    /// The tier file slot reserved for the segment: released on rollback.
    slot: Option<u32>,
    /// Rows were taken out of the table: on rollback every row is marked dirty.
    rows_taken: bool,
    /// The removals taken out of the table's shards for the segment: given back on rollback,
    /// so the next flush writes them (the tombstones in this segment may never count).
    removals: Removals,
    /// The table's cleared mark was taken (and this is no rewrite): set again on rollback, so
    /// that the next segment still supersedes the older ones.
    restore_cleared: bool,
    /// A segment file may exist at `path`: deleted on rollback.
    file: bool,
    /// The manifest append was tried: on rollback the seq is never handed out again (and the
    /// file stays).
    record_tried: bool,
    /// The table's gate, held from the commit's start (through a rollback).
    gate: Option<RwLockReadGuard<'a, ()>>,
    /// A spill: on rollback, if its file cannot be removed, its seq (in the spill range) is
    /// never handed out again, so the file left behind never blocks the next segment.
    spill: bool,
    committed: bool,
}

impl<'a> SegmentTx<'a> {
    /// Starts a segment of `table` at the log's next seq: reserves its file slot and takes the
    /// table's cleared mark (a rewrite always supersedes). From here the rows the caller takes
    /// out of the table are rolled back.
    fn begin(
        durable: &'a Durable,
        log: &'a mut (Manifest, State),
        table: &'a Table,
        rewrite: bool,
    ) -> Result<Self> {
        // A manifest whose last append failed is rewritten first (see `orphans`).
        log.0.heal(&*durable.vfs, &log.1)?;
        let seq = log.1.next_seq.max(1);
        let slot = table.reserve_file_slot()?;
        let took = table.take_cleared();
        Ok(Self {
            durable,
            table,
            path: segment_path(&durable.dir, seq),
            log,
            seq,
            cleared: took || rewrite,
            slot,
            rows_taken: true,
            removals: Removals::new(),
            restore_cleared: took && !rewrite,
            file: false,
            record_tried: false,
            gate: None,
            spill: false,
            committed: false,
        })
    }

    /// Starts a segment at the log's next seq that takes no rows out of `table` (a compaction
    /// step copies rows, their dirty bits untouched): a rollback only deletes the file, or —
    /// once the append was tried — keeps it and never hands its seq out again.
    pub(super) fn begin_copy(
        durable: &'a Durable,
        log: &'a mut (Manifest, State),
        table: &'a Table,
    ) -> Result<Self> {
        log.0.heal(&*durable.vfs, &log.1)?;
        let seq = log.1.next_seq.max(1);
        Ok(Self {
            durable,
            table,
            path: segment_path(&durable.dir, seq),
            log,
            seq,
            cleared: false,
            slot: None,
            rows_taken: false,
            removals: Removals::new(),
            restore_cleared: false,
            file: false,
            record_tried: false,
            gate: None,
            spill: false,
            committed: false,
        })
    }

    /// The segment's seq.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// The state the manifest describes (before this segment).
    pub(super) fn state(&self) -> &State {
        &self.log.1
    }

    /// Creates the segment file of table `id`.
    pub(super) fn create(&mut self, id: u64, kind: SegmentKind) -> Result<SegmentWriter> {
        let header = SegmentHeader {
            dim: self.table.dim() as u32,
            state_dim: self.table.state_dim() as u32,
            seq: self.seq,
            table_id: id,
            kind,
            created_ms: now_ms(),
        };
        // Recorded first: a create that fails midway may leave a file.
        self.file = true;
        SegmentWriter::create(&*self.durable.vfs, &self.path, header)
    }

    /// Deletes the segment file (it held nothing; the record still goes on).
    pub(super) fn remove_file(&mut self) {
        let _ = self.durable.vfs.remove(&self.path);
        self.file = false;
    }

    /// Ends a segment that found nothing changed: the file and the slot go, and no row needs
    /// writing again.
    fn discard_unchanged(mut self) {
        self.rows_taken = false;
        self.restore_cleared = false;
    }

    /// Takes the table's gate for reading until the end (commit or rollback).
    fn hold_gate(&mut self) {
        self.gate = self.table.shared_gate();
    }

    /// Appends `edits` to the manifest (`next`: the state after them).
    pub(super) fn append(&mut self, edits: &[Edit], next: &State) -> Result<()> {
        // The record may reach the disk in part or whole even if the append fails.
        self.file = false;
        self.record_tried = true;
        self.log.0.append(&*self.durable.vfs, edits, next)
    }

    /// The record is durable: `next` becomes the state, and every step stays. Returns the
    /// reserved file slot (now the caller's) and the gate, if held.
    pub(super) fn commit(mut self, next: State) -> (Option<u32>, Option<RwLockReadGuard<'a, ()>>) {
        self.log.1 = next;
        self.committed = true;
        (self.slot.take(), self.gate.take())
    }
}

impl Drop for SegmentTx<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Runs before the fields drop: the gate, if taken, is still held.
        if self.record_tried {
            let state = &mut self.log.1;
            state.next_seq = state.next_seq.max(self.seq + 1);
        }
        if self.rows_taken {
            self.table.put_back_removals(std::mem::take(&mut self.removals));
            self.table.mark_all_dirty();
        }
        if self.restore_cleared {
            self.table.set_cleared();
        }
        if self.file && self.durable.vfs.remove(&self.path).is_err() && self.spill {
            // A spill's file left behind: its seq (in the spill range, so recovery deletes the
            // file) is never handed out again, or the next spill's create would fail on it.
            let state = &mut self.log.1;
            state.next_seq = state.next_seq.max(self.seq + 1);
        }
        if let Some(slot) = self.slot.take() {
            self.table.release_file_slot(slot);
        }
    }
}

/// A row on disk copied by a rewrite: (key, old location, new location).
pub(crate) type Moved = (u64, u64, u64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::vfs::RealFs;
    use crate::version::Clock;
    use crate::TableConfig;

    /// A store in `dir` with a table of three rows, not yet flushed.
    fn store(dir: &std::path::Path) -> (Durable, Arc<Table>) {
        let clock = Arc::new(Clock::new(0));
        let (durable, _) = Durable::open(dir, Arc::new(RealFs), &clock, None).unwrap();
        let table = Arc::new(Table::with_clock(TableConfig::new("t", 4), clock).unwrap());
        durable.create_table(&table).unwrap();
        table.assign(&[1, 2, 3], &[0.5; 12]).unwrap();
        (durable, table)
    }

    /// Starts a segment of `table`, copies its changed rows into it and seals it; returns the
    /// transaction and the edits that would record it, with the state after them.
    fn write<'a>(
        durable: &'a Durable,
        log: &'a mut (Manifest, State),
        table: &'a Table,
    ) -> (SegmentTx<'a>, Vec<Edit>, State) {
        let id = table.disk_id.load(Ordering::Relaxed);
        let mut tx = SegmentTx::begin(durable, log, table, false).unwrap();
        let mut w = tx.create(id, SegmentKind::Flush).unwrap();
        let slot = tx.slot;
        assert_eq!(table.write_changes(&mut w, slot, &mut tx.removals).unwrap(), 3);
        let info = w.finish().unwrap();
        let (seq, records, bytes) = (tx.seq, info.records, info.bytes);
        let edits = vec![
            Edit::Supersede { table: id, below: seq },
            Edit::AddFile { table: id, seq, records, bytes },
        ];
        let mut next = tx.state().clone();
        edits.iter().for_each(|e| next.apply(e).unwrap());
        (tx, edits, next)
    }

    /// The records a flush writes now: 3 when every row is dirty again, 0 when none is.
    fn flushed(durable: &Durable, table: &Arc<Table>) -> u64 {
        durable.flush(std::slice::from_ref(table)).unwrap().records
    }

    #[test]
    fn dropping_before_the_record_deletes_the_file_and_gives_every_row_back() {
        let dir = tempfile::tempdir().unwrap();
        let (durable, table) = store(dir.path());
        table.set_cleared();
        let (seq, path) = {
            let mut log = durable.inner.lock();
            let (tx, _, _) = write(&durable, &mut log, &table);
            let (seq, path) = (tx.seq, tx.path.clone());
            assert!(path.exists());
            assert!(!table.take_cleared(), "begin took the cleared mark");
            drop(tx);
            assert_eq!(log.1.next_seq, seq, "a seq no record named is handed out again");
            (seq, path)
        };
        assert!(!path.exists(), "the segment file was deleted");
        assert!(table.take_cleared(), "the cleared mark was set again");
        table.set_cleared();
        assert_eq!(flushed(&durable, &table), 3, "every row was marked dirty again");
        assert!(durable.inner.lock().1.tables.values().any(|t| t.files.contains_key(&seq)));
    }

    #[test]
    fn dropping_after_the_append_was_tried_keeps_the_file_and_never_reuses_its_seq() {
        let dir = tempfile::tempdir().unwrap();
        let (durable, table) = store(dir.path());
        let path = {
            let mut log = durable.inner.lock();
            let (mut tx, edits, next) = write(&durable, &mut log, &table);
            let (seq, path) = (tx.seq, tx.path.clone());
            tx.append(&edits, &next).unwrap();
            drop(tx);
            assert_eq!(log.1.next_seq, seq + 1);
            path
        };
        assert!(path.exists(), "a segment its record may name stays");
        assert_eq!(flushed(&durable, &table), 3, "every row was marked dirty again");
    }

    #[test]
    fn commit_keeps_every_step() {
        let dir = tempfile::tempdir().unwrap();
        let (durable, table) = store(dir.path());
        table.set_cleared();
        let (seq, path) = {
            let mut log = durable.inner.lock();
            let (mut tx, edits, next) = write(&durable, &mut log, &table);
            let (seq, path) = (tx.seq, tx.path.clone());
            tx.append(&edits, &next).unwrap();
            let (slot, gate) = tx.commit(next);
            assert_eq!((slot.is_none(), gate.is_none()), (true, true), "not tiered");
            drop(gate);
            assert_eq!(log.1.next_seq, seq + 1);
            (seq, path)
        };
        assert!(path.exists());
        assert!(!table.take_cleared(), "the cleared mark stays taken");
        assert!(durable.inner.lock().1.tables.values().any(|t| t.files.contains_key(&seq)));
        assert_eq!(flushed(&durable, &table), 0, "the rows stay written");
        drop(durable);
        let clock = Arc::new(Clock::new(0));
        let (_, tables) = Durable::open(dir.path(), Arc::new(RealFs), &clock, None).unwrap();
        assert_eq!(tables[0].len(), 3, "the committed segment is what reopening finds");
    }

    #[test]
    fn a_copy_dropped_before_its_record_deletes_its_file_and_leaves_the_rows_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (durable, table) = store(dir.path());
        assert_eq!(flushed(&durable, &table), 3);
        let id = table.disk_id.load(Ordering::Relaxed);
        let path = {
            let mut log = durable.inner.lock();
            let mut tx = SegmentTx::begin_copy(&durable, &mut log, &table).unwrap();
            let seq = tx.seq();
            let w = tx.create(id, SegmentKind::Compaction).unwrap();
            let path = tx.path.clone();
            assert!(path.exists());
            drop(w);
            drop(tx);
            assert_eq!(log.1.next_seq, seq, "a seq no record named is handed out again");
            path
        };
        assert!(!path.exists(), "the segment file was deleted");
        assert_eq!(flushed(&durable, &table), 0, "no row was marked dirty");
    }
}
