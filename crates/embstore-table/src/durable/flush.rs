//! Flushes: each table's changed rows into a segment, then a compaction step or a rewrite of
//! every row; `Store::compact`'s rewrite of every table; an eviction's segment.

use std::sync::Arc;

use super::compact::Step;
use super::{Durable, FlushStats, COMPACT_MIN_RECORDS, MAX_SEGMENTS};
use crate::disk::manifest::{Manifest, State};
use crate::disk::segment::SegmentKind;
use crate::tier::Gate;
use crate::{Result, Table};

impl Durable {
    /// Writes what changed in `tables` since the last flush; see the module docs.
    pub(crate) fn flush(&self, tables: &[Arc<Table>]) -> Result<FlushStats> {
        self.flush_locked(&mut self.inner.lock(), tables)
    }

    /// [`Durable::flush`] under the manifest lock the caller holds.
    pub(crate) fn flush_locked(
        &self,
        guard: &mut (Manifest, State),
        tables: &[Arc<Table>],
    ) -> Result<FlushStats> {
        let mut stats = FlushStats::default();
        for table in tables {
            if table.dropped() {
                continue;
            }
            let before = stats.records;
            self.flush_table(guard, table, false, &mut stats)?;
            let flushed = stats.records - before;
            let (_, state) = &*guard;
            let Some(id) = state.table_id(table.name()) else { continue };
            let files = &state.tables[&id].files;
            let on_disk: u64 = files.values().map(|f| f.records).sum();
            let too_many = files.len() > MAX_SEGMENTS;
            let stale = on_disk >= COMPACT_MIN_RECORDS && on_disk > 2 * table.len() as u64;
            // A table in memory compacts a bounded step at a time (`compact`); a tiered one
            // (rows on disk only) is rewritten whole.
            let rewrite = too_many
                || (stale && table.is_tiered())
                || self.compact_step(guard, table, flushed, &mut stats)? == Step::Rewrite;
            if rewrite {
                table.mark_all_dirty();
                self.flush_table(guard, table, true, &mut stats)?;
                stats.compactions += 1;
            }
        }
        Ok(stats)
    }

    /// Rewrites every table into one fresh segment each (its live rows, from memory and from
    /// disk) and deletes the older segments: disk use drops to the live rows. `progress` is
    /// called after each table with (done, total).
    pub(crate) fn compact(
        &self,
        tables: &[Arc<Table>],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<FlushStats> {
        let mut guard = self.inner.lock();
        let mut stats = FlushStats::default();
        let live: Vec<&Arc<Table>> = tables.iter().filter(|t| !t.dropped()).collect();
        for (i, table) in live.iter().enumerate() {
            table.mark_all_dirty();
            self.flush_table(&mut guard, table, true, &mut stats)?;
            stats.compactions += 1;
            progress(i + 1, live.len());
        }
        Ok(stats)
    }

    /// One table's part of a flush (or, with `rewrite`, a segment of every row that
    /// supersedes the older ones).
    pub(super) fn flush_table(
        &self,
        guard: &mut (Manifest, State),
        table: &Table,
        rewrite: bool,
        stats: &mut FlushStats,
    ) -> Result<()> {
        let kind = if rewrite { SegmentKind::Compaction } else { SegmentKind::Flush };
        // A rewrite of a tiered table also copies its rows on disk; it holds the gate for
        // reading meanwhile (no `clear` or `load` can interleave).
        let _gate = if rewrite { table.shared_gate() } else { None };
        self.write_segment(guard, table, kind, rewrite, false, stats, |w, file, taken| {
            let n = table.write_changes(w, file, taken)?;
            match (rewrite, file) {
                (true, Some(file)) => {
                    let moved = table.copy_cold(w, file)?;
                    Ok((n + moved.len() as u64, moved))
                }
                _ => Ok((n, Vec::new())),
            }
        })?;
        Ok(())
    }

    /// Writes the dirty rows among `keys` of `table` to a new segment (eviction), their disk
    /// locations set: a spill, durable once the next flush adopts it (`spill`) — or, when the
    /// table's cleared mark is pending, a segment recorded at once.
    pub(crate) fn write_rows_of(&self, table: &Table, keys: &[u64]) -> Result<()> {
        if table.sync.get().is_none() {
            // Changes of a table that does not sync now land here too, not at a flush: what it
            // saved when it synced no longer says what it holds (see `Store::flush`).
            crate::sync::saved::remove(&self.dir, table.name());
        }
        let mut guard = self.inner.lock();
        let mut stats = FlushStats::default();
        let mut by_shard: Vec<Vec<u64>> = vec![Vec::new(); table.shards.len()];
        for &k in keys {
            by_shard[table.shard_of(k)].push(k);
        }
        self.write_segment(
            &mut guard,
            table,
            SegmentKind::Flush,
            false,
            true,
            &mut stats,
            |w, file, taken| {
                Ok((table.write_changes_of(w, file, Some(&by_shard), taken)?, Vec::new()))
            },
        )?;
        Ok(())
    }
}
