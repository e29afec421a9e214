//! [`Export`]: a table's rows in chunks, with their optimizer state and metadata.

use crate::shard::cold::FileTable;
use crate::tier::Gate;
use crate::{Result, RowMeta, Table};

/// One chunk of [`Table::export`]: `n` rows, and what an import needs to check they fit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowChunk {
    /// `[n]` ids.
    pub ids: Vec<u64>,
    /// `[n, D]` values, row-major.
    pub values: Vec<f32>,
    /// `[n, S]` optimizer state, row-major (`S` = [`Table::state_dim`]).
    pub state: Vec<f32>,
    /// `[n]` metadata.
    pub meta: Vec<RowMeta>,
    /// The exporting table's optimizer (its name), which the state belongs to.
    pub optimizer: &'static str,
    /// The exporting table's step counter when the chunk was read (Adam's `t`).
    pub step: u64,
}

impl RowChunk {
    /// Rows in the chunk.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the chunk holds no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Iterator over a table's rows in chunks. Each row is copied under its shard's lock, so every
/// row is consistent (values, state and metadata of one moment); the export as a whole is not a
/// point-in-time snapshot: rows written while it runs may appear in their old or new state, rows
/// removed meanwhile are skipped, and rows added to a shard already passed are not seen.
///
/// `T` is `&Table` from [`Table::export`], or an `Arc<Table>` for an export that owns its table.
pub struct Export<T: std::ops::Deref<Target = Table>> {
    table: T,
    chunk_rows: usize,
    shard: usize,
    keys: Vec<u64>,
    next: usize,
    error: Option<crate::Error>,
}

impl Table {
    /// Every row, `chunk_rows` at a time (see [`Export`]).
    pub fn export(&self, chunk_rows: usize) -> Export<&Self> {
        Export::new(self, chunk_rows)
    }
}

impl<T: std::ops::Deref<Target = Table>> Export<T> {
    /// An export of `table`'s rows in chunks of up to `chunk_rows` (at least 1).
    pub fn new(table: T, chunk_rows: usize) -> Self {
        Self {
            table,
            chunk_rows: chunk_rows.max(1),
            shard: 0,
            keys: Vec::new(),
            next: 0,
            error: None,
        }
    }
}

impl<T: std::ops::Deref<Target = Table>> Export<T> {
    /// Why the iteration ended early, if it did: a row on disk could not be read (a damaged
    /// segment). Check it after the last chunk.
    pub fn take_error(&mut self) -> Option<crate::Error> {
        self.error.take()
    }
}

impl<T: std::ops::Deref<Target = Table>> std::fmt::Debug for Export<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("shard", &self.shard).field("next", &self.next).finish()
    }
}

impl<T: std::ops::Deref<Target = Table>> Iterator for Export<T> {
    type Item = RowChunk;

    fn next(&mut self) -> Option<RowChunk> {
        let t = &*self.table;
        loop {
            if self.next >= self.keys.len() {
                if self.shard >= t.shards.len() {
                    return None;
                }
                self.keys = {
                    let shard = t.shards[self.shard].read();
                    shard.index.iter().chain(shard.cold_entries()).map(|(k, _)| k).collect()
                };
                self.keys.sort_unstable();
                self.next = 0;
                self.shard += 1;
                continue;
            }
            let end = (self.next + self.chunk_rows).min(self.keys.len());
            let keys = &self.keys[self.next..end];
            self.next = end;
            let mut chunk = RowChunk {
                optimizer: t.config().optimizer.name(),
                step: t.step(),
                ..RowChunk::default()
            };
            let s = t.shard_of(keys[0]);
            // With a memory tier, the file table is held from classifying each key (in memory,
            // or on disk at a location) to reading the rows on disk, so no rewrite moves them
            // in between; each key is classified under one shard lock.
            let files = t.cold_files();
            let mut cold = Vec::new();
            {
                let shard = t.shards[s].read();
                for &k in keys {
                    if let Some(slot) = shard.slot(k) {
                        chunk.ids.push(k);
                        shard.values.extend(slot, &mut chunk.values);
                        chunk.state.extend_from_slice(shard.state.row(slot));
                        chunk.meta.push(shard.meta[slot].unpack());
                    } else if let Some(l) = shard.cold_loc(k) {
                        cold.push((k, l));
                    }
                }
            }
            // Rows on disk are read from their segments, not brought into memory. A read that
            // fails (a damaged segment) ends the export with an error (`take_error`).
            if let (false, Some(files)) = (cold.is_empty(), &files) {
                if let Err(e) = read_cold(t, files, &cold, &mut chunk) {
                    self.error = Some(e);
                    self.next = self.keys.len();
                    self.shard = t.shards.len();
                    return None;
                }
            }
            if !chunk.is_empty() {
                return Some(chunk);
            }
        }
    }
}

/// Appends the rows `wanted` of `t` (key and disk location, captured with `files` held) to
/// `chunk`, read from disk without promoting them.
fn read_cold(
    t: &Table,
    files: &FileTable,
    wanted: &[(u64, u64)],
    chunk: &mut RowChunk,
) -> Result<()> {
    for ((key, _), rec) in wanted.iter().zip(t.read_cold(files, wanted)?) {
        chunk.ids.push(*key);
        chunk.values.extend_from_slice(&rec.values);
        chunk.state.extend_from_slice(&rec.state);
        chunk.meta.push(rec.meta);
    }
    Ok(())
}
