//! Writing one segment of a table and recording it in the manifest.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{segment_path, Durable, FlushStats};
use crate::disk::manifest::{Edit, Manifest, State};
use crate::disk::segment::{SegmentHeader, SegmentKind, SegmentReader, SegmentWriter};
use crate::version::now_ms;
use crate::{Error, Result, Table};

impl Durable {
    /// Writes one segment of `table` with `body` (given the writer and, for a tiered table,
    /// the file slot its rows' locations point into), then records it — with a `Supersede` of
    /// the older segments when the table was cleared or this is a rewrite — and the step in one
    /// manifest record. Returns the segment's seq if one was kept. On any failure the segment
    /// is deleted and every row is marked dirty again.
    pub(super) fn write_segment(
        &self,
        guard: &mut (Manifest, State),
        table: &Table,
        kind: SegmentKind,
        rewrite: bool,
        stats: &mut FlushStats,
        body: impl FnOnce(&mut SegmentWriter, Option<u32>) -> Result<(u64, Vec<Moved>)>,
    ) -> Result<Option<u64>> {
        let (manifest, state) = guard;
        // The table this handle was created as: a handle of a dropped table (an eviction still
        // in flight) must never write into a new table of the same name.
        let id = table.disk_id.load(Ordering::Relaxed);
        if table.dropped() || !state.tables.contains_key(&id) || self.lock.lock().is_none() {
            return Ok(None);
        }
        let seq = state.next_seq.max(1);
        // A `clear` or `load` that overlaps this segment (the epoch is odd while one runs, and
        // moves on each) leaves it holding rows from both sides: see below.
        let epoch = table.clear_epoch.load(Ordering::Acquire);
        let cleared = table.take_cleared() || rewrite;
        let header = SegmentHeader {
            dim: table.dim() as u32,
            state_dim: table.state_dim() as u32,
            seq,
            table_id: id,
            kind,
            created_ms: now_ms(),
        };
        let path = segment_path(&self.dir, seq);
        let file = table.tier.as_ref().map(|t| t.files.write().reserve()).transpose()?;
        let release = || {
            if let (Some(t), Some(f)) = (&table.tier, file) {
                t.files.write().release(f);
            }
        };
        // Before the manifest record: the segment goes, and every row is written again later.
        let fail = |e: Error| {
            table.mark_all_dirty();
            if cleared && !rewrite {
                table.set_cleared();
            }
            let _ = self.vfs.remove(&path);
            release();
            e
        };
        let mut w = SegmentWriter::create(&*self.vfs, &path, header).map_err(fail)?;
        let (written, moved) = body(&mut w, file).map_err(fail)?;
        if written == 0 && !cleared && state.tables[&id].step == table.step() {
            drop(w);
            let _ = self.vfs.remove(&path);
            release();
            return Ok(None); // nothing changed
        }
        let superseded: Vec<u64> = match cleared {
            true => state.tables[&id].files.keys().copied().filter(|&s| s < seq).collect(),
            false => Vec::new(),
        };
        let mut edits = Vec::new();
        if cleared {
            edits.push(Edit::Supersede { table: id, below: seq });
        }
        let kept = written > 0;
        if kept {
            let info = w.finish().map_err(fail)?;
            edits.push(Edit::AddFile { table: id, seq, records: info.records, bytes: info.bytes });
            stats.records += info.records;
            stats.bytes += info.bytes;
            stats.segments += 1;
        } else {
            drop(w);
            let _ = self.vfs.remove(&path);
        }
        edits.push(Edit::Step { table: id, step: table.step() });
        edits.push(Edit::Rows { table: id, rows: table.len() as u64 });
        let mut next = state.clone();
        edits.iter().try_for_each(|e| next.apply(e)).map_err(fail)?;
        let reader = match (kept, &table.tier) {
            (true, Some(_)) => {
                Some(Arc::new(SegmentReader::open_for_reads(&*self.vfs, &path).map_err(fail)?))
            }
            _ => None,
        };
        // The commit: no `clear`, `load` or demotion of this table runs from here to the end.
        let _gate = table.shared_gate();
        if epoch % 2 == 1 || table.clear_epoch.load(Ordering::Acquire) != epoch {
            // Rows copied before the clear and rows written after it share this segment: keep
            // every row dirty (so none is evicted pointing into it) and make the next segment
            // supersede it.
            table.mark_all_dirty();
            table.set_cleared();
        }
        if let Err(e) = manifest.append(&*self.vfs, &edits, &next) {
            // The record may have reached the disk in part or whole: keep the segment (an
            // orphan the next open deletes if the record did not make it) and never reuse its
            // seq, write every row again later, and let the manifest rewrite itself before its
            // next append.
            state.next_seq = state.next_seq.max(seq + 1);
            table.mark_all_dirty();
            if cleared && !rewrite {
                table.set_cleared();
            }
            release();
            return Err(e);
        }
        *state = next;
        if let (Some(t), Some(f)) = (&table.tier, file) {
            match reader {
                Some(r) => t.files.write().install(f, seq, r),
                None => t.files.write().release(f),
            }
            if cleared {
                // Rows on disk move to the new segment before the old ones' slots go; rows in
                // memory whose clean copy was in an old segment become dirty.
                let old = t.files.read().slots_below(seq);
                table.relocate_cold(&moved, &old);
                let mut files = t.files.write();
                old.into_iter().for_each(|s| files.release(s));
            }
        }
        self.delete_segments(&superseded);
        Ok(kept.then_some(seq))
    }
}

/// A row on disk copied by a rewrite: (key, old location, new location).
pub(crate) type Moved = (u64, u64, u64);
