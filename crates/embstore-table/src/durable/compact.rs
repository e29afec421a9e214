//! Incremental compaction of a durable table whose rows are all in memory: after each flush, a
//! bounded step moves the live rows out of the stalest segment files and deletes the files, so
//! that no flush ever rewrites a whole table.
//!
//! **Liveness.** Per table, an index in memory maps every key on disk to the seq of the
//! segment holding its newest record (row or tombstone), and counts per segment the keys whose
//! newest record it holds: a segment's *staleness* is 1 − live / records. The index takes the
//! larger seq when two files name a key, so files can be indexed in any order: the files a
//! flush writes are indexed by the step after it (their footers alone are read), and the files
//! of a store opened from disk a few at a time (at most [`INDEX_PER_RECORD`] footer entries per
//! record a step may write, and at least one file) — a table compacts only once all its files
//! are indexed. A file the index counts that leaves the manifest otherwise (`clear`, `load`, a
//! rewrite of every row) makes the index start over.
//!
//! **A step** runs under the manifest lock right after the table's part of a flush, while the
//! table's records on disk exceed [`START`] times its live rows (and
//! [`crate::COMPACT_MIN_RECORDS`]), or while a file is being drained. It writes at most
//! max([`STEP_MIN_RECORDS`], [`STEP_FLUSH_MULTIPLE`] × the records its flush wrote) records —
//! so a flush costs at most about three times its dirty rows — into one new segment:
//!
//! - it picks the stalest files (most stale records per record), one after the other while
//!   budget is left, and lists their live keys (from the file's footer, a cost in its records);
//!   a file drained over several steps is finished in one (up to [`FINISH_MULTIPLE`] budgets)
//!   when the steps to come would take disk use past 2× the live rows;
//! - for each of them it copies the row's **current** state from memory (read under its
//!   shard's read lock; the dirty bit is left alone, so the next flush still writes a row that
//!   changed since the last one, after its pending tombstone), or — the key has no row now — a
//!   tombstone. Tombstones are never left out: an incremental checkpoint's chain brings back
//!   the parent's files, deleted here or not, and a tombstone must still hide their rows. Once
//!   the keys without a row pass a quarter of the rows, the table is rewritten whole instead
//!   (a `Supersede` that the chain honours);
//! - it seals the segment and appends one manifest record: `AddFile` of the new segment and
//!   `DeleteFile` of each file whose last live key has moved; a file is unlinked only after
//!   that record is durable.
//!
//! Replaying segments in seq order stays correct: the new segment's seq is above every file,
//! and each row it holds is the row's state at or after its newest record on disk (a value
//! written after the last flush, which a crash may keep). A row's newest record is always in a
//! file the manifest names: a file leaves the manifest only in the record that names the
//! segment holding the newer copies of its live keys. A `clear` or `load` that overlaps a step
//! makes it throw its segment away (the next flush supersedes every file anyway).
//!
//! Tiered tables (rows on disk only, file slots in the tier) keep the rewrite of every row
//! ([`crate::durable`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use hashbrown::HashMap;

use super::segment_write::SegmentTx;
use super::{segment_path, Durable, FlushStats};
use crate::disk::manifest::{Edit, Manifest, State};
use crate::disk::segment::{SegmentKind, SegmentReader, SegmentWriter};
use crate::disk::vfs::Vfs;
use crate::{Result, Table, Version};

/// Compaction runs while a table's records on disk exceed this multiple of its live rows
/// (numerator, denominator): 1.5, so that a step that lags a few flushes behind still keeps
/// disk use under 2× the live rows.
pub(crate) const START: (u64, u64) = (3, 2);
/// A step may write at least this many records, whatever its flush wrote (1 MiB at D 32 with
/// Adagrad): small flushes still drain the stale files.
pub(crate) const STEP_MIN_RECORDS: u64 = 4096;
/// A step may write this many records per record its flush wrote: two, so that it frees
/// more than the flush adds even when the stalest file is only half stale.
pub(crate) const STEP_FLUSH_MULTIPLE: u64 = 2;
/// A file whose drain would take disk use past twice the rows is finished in one step when
/// its remaining live keys are at most this many step budgets (see `compact_step`).
const FINISH_MULTIPLE: u64 = 4;
/// Footer entries (24 bytes each) a step may index per record (~256 bytes) it may write,
/// while it builds the index of a store opened from disk.
const INDEX_PER_RECORD: u64 = 16;
/// Rows copied per hold of a shard's read lock.
const COPY_CHUNK: usize = 4096;

/// The liveness indexes of a store's tables (see the module docs), by table id.
#[derive(Debug, Default)]
pub(crate) struct Compactor {
    tables: HashMap<u64, Liveness>,
}

/// A step's plan for one file: (file, keys to move, whether they are its last).
type Planned = (u64, Vec<u64>, bool);

/// One table's liveness index.
#[derive(Debug, Default)]
struct Liveness {
    /// Key → seq of the file holding its newest record.
    newest: HashMap<u64, u64>,
    /// Seq → keys whose newest record it holds (0 for a file with none).
    live: BTreeMap<u64, u64>,
    /// The file being drained and its live keys not yet moved.
    draining: Option<(u64, Vec<u64>)>,
}

impl Liveness {
    /// Notes that `seq` holds a record of `key`.
    fn note(&mut self, key: u64, seq: u64) {
        match self.newest.insert(key, seq) {
            Some(old) if old > seq => {
                self.newest.insert(key, old);
                return;
            }
            Some(old) => *self.live.get_mut(&old).expect("an indexed file") -= 1,
            None => {}
        }
        *self.live.get_mut(&seq).expect("an indexed file") += 1;
    }

    /// Indexes the segment `seq` at `path` from its footer.
    fn index(&mut self, vfs: &dyn Vfs, path: &Path, seq: u64) -> Result<()> {
        let r = SegmentReader::open(vfs, path)?;
        self.live.entry(seq).or_insert(0);
        r.for_each_footer(|_, key, _, _| {
            self.note(key, seq);
            Ok(())
        })
    }

    /// The keys whose newest record is in the segment `seq` at `path`, from its footer (a
    /// cost in the file's records, not the table's).
    fn live_keys(&self, vfs: &dyn Vfs, path: &Path, seq: u64) -> Result<Vec<u64>> {
        let mut keys = Vec::new();
        SegmentReader::open(vfs, path)?.for_each_footer(|_, key, _, _| {
            if self.newest.get(&key) == Some(&seq) {
                keys.push(key);
            }
            Ok(())
        })?;
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// The stalest file among `files` (seq, records), if any holds a stale record.
    fn stalest(&self, files: &BTreeMap<u64, u64>) -> Option<u64> {
        let mut best: Option<(u64, u64, u64)> = None; // (seq, live, records)
        for (&seq, &records) in files {
            let live = self.live.get(&seq).copied().unwrap_or(0);
            if live >= records {
                continue;
            }
            // Staleness (records - live) / records, compared without division.
            let better = best.is_none_or(|(_, bl, br)| {
                (records - live) as u128 * br as u128 > (br - bl) as u128 * records as u128
            });
            if better {
                best = Some((seq, live, records));
            }
        }
        best.map(|(seq, _, _)| seq)
    }

    /// Indexes the files among `files` (seq, records) not yet counted: those of the last
    /// flush, or a few of a store opened from disk (up to `budget` × [`INDEX_PER_RECORD`]
    /// footer entries, and at least one file). Returns whether every file is indexed.
    fn index_new(
        &mut self,
        vfs: &dyn Vfs,
        dir: &Path,
        files: &BTreeMap<u64, u64>,
        budget: u64,
    ) -> Result<bool> {
        let mut read = 0u64;
        for (&seq, &records) in files {
            if self.live.contains_key(&seq) {
                continue;
            }
            if read > 0 && read + records > budget * INDEX_PER_RECORD {
                return Ok(false);
            }
            if let Err(e) = self.index(vfs, &segment_path(dir, seq), seq) {
                *self = Liveness::default(); // a file counted in part
                return Err(e);
            }
            read += records;
        }
        Ok(true)
    }

    /// Plans a step: the live keys of the stalest files, up to `budget` records, while the
    /// table (`rows` live rows, `files` seq → records) stays over its mark or a file is half
    /// drained. Each entry is (file, keys to move, whether they are its last).
    fn plan(
        &mut self,
        vfs: &dyn Vfs,
        dir: &Path,
        files: &BTreeMap<u64, u64>,
        rows: u64,
        budget: u64,
    ) -> Result<Vec<Planned>> {
        let over = |on_disk: u64| {
            on_disk >= crate::COMPACT_MIN_RECORDS && on_disk * START.1 > rows * START.0
        };
        let mut on_disk: u64 = files.values().sum();
        let mut plan: Vec<Planned> = Vec::new();
        let mut left = budget as usize;
        while left > 0 {
            if self.draining.is_none() {
                if !over(on_disk) {
                    break;
                }
                let mut candidates = files.clone();
                candidates.retain(|s, _| !plan.iter().any(|(f, _, _)| f == s));
                let Some(seq) = self.stalest(&candidates) else { break };
                let keys = match self.live_keys(vfs, &segment_path(dir, seq), seq) {
                    Ok(keys) => keys,
                    Err(e) => {
                        *self = Liveness::default();
                        return Err(e);
                    }
                };
                self.draining = Some((seq, keys));
            }
            let (from, mut keys) = self.draining.take().expect("a file to drain");
            // A file drained over several steps stays on disk until its last key moves: when
            // the next steps would take disk use past twice the rows, finish it now (at most
            // FINISH_MULTIPLE budgets, so that no flush turns into a rewrite of the table).
            let finish = keys.len() > left
                && on_disk + left as u64 > 2 * rows
                && keys.len() as u64 <= FINISH_MULTIPLE * budget;
            if finish {
                left = keys.len();
            }
            let mut batch = keys.split_off(keys.len().saturating_sub(left));
            batch.retain(|k| self.newest.get(k) == Some(&from));
            left -= batch.len().min(left);
            let last = keys.is_empty();
            if last {
                on_disk -= files[&from];
            } else {
                self.draining = Some((from, keys));
            }
            on_disk += batch.len() as u64;
            plan.push((from, batch, last));
        }
        Ok(plan)
    }

    /// Notes that the rows of `plan` moved to segment `seq` (`None`: it held nothing) and
    /// forgets the files they drained.
    fn moved(&mut self, plan: &[Planned], seq: Option<u64>) {
        if let Some(seq) = seq {
            self.live.insert(seq, 0);
        }
        for (from, batch, last) in plan {
            if let Some(seq) = seq {
                batch.iter().for_each(|&k| self.note(k, seq));
            }
            if *last {
                debug_assert_eq!(self.live.get(from), Some(&0), "file {from} drained");
                self.live.remove(from);
            }
        }
    }
}

impl Compactor {
    /// Forgets a dropped table.
    pub(crate) fn forget(&mut self, table_id: u64) {
        self.tables.remove(&table_id);
    }
}

impl Durable {
    /// One compaction step of `table` after its part of a flush wrote `flushed` records (see
    /// the module docs); adds what it wrote to `stats`.
    pub(crate) fn compact_step(
        &self,
        guard: &mut (Manifest, State),
        table: &Table,
        flushed: u64,
        stats: &mut FlushStats,
    ) -> Result<Step> {
        let id = table.disk_id.load(Ordering::Relaxed);
        let budget = (STEP_FLUSH_MULTIPLE * flushed).max(STEP_MIN_RECORDS);
        let mut all = self.compactor.lock();
        let Some(entry) = guard.1.tables.get(&id) else {
            all.forget(id);
            return Ok(Step::Done);
        };
        if table.dropped() || table.is_tiered() {
            return Ok(Step::Done);
        }
        let files: BTreeMap<u64, u64> = entry.files.iter().map(|(&s, f)| (s, f.records)).collect();
        let l = all.tables.entry(id).or_default();
        if l.live.keys().any(|s| !files.contains_key(s)) {
            *l = Liveness::default();
        }
        if !l.index_new(&*self.vfs, self.dir(), &files, budget)? {
            return Ok(Step::Done); // the index is not complete: no compaction yet
        }
        if table.cleared.load(Ordering::Relaxed) {
            l.draining = None;
            return Ok(Step::Done); // the next flush supersedes every file; the index starts over
        }
        // Keys on disk without a row (tombstones, or removals the next flush writes): never
        // reclaimed by moving files, so past a quarter of the rows the table is rewritten whole.
        let rows = table.len() as u64;
        let gone = (l.newest.len() as u64).saturating_sub(rows);
        if files.values().sum::<u64>() >= crate::COMPACT_MIN_RECORDS && gone * 4 > rows {
            l.draining = None;
            return Ok(Step::Rewrite);
        }
        let plan = l.plan(&*self.vfs, self.dir(), &files, rows, budget)?;
        if plan.is_empty() {
            return Ok(Step::Done);
        }
        match self.move_rows(guard, table, id, &plan, stats) {
            Ok(None) => l.draining = None,
            Ok(Some(seq)) => l.moved(&plan, seq),
            // The index may no longer match the manifest: rebuild it.
            Err(e) => {
                *l = Liveness::default();
                return Err(e);
            }
        }
        Ok(Step::Done)
    }

    /// Writes the current rows of the keys of `plan` (file, its live keys, whether they are
    /// its last) to a new segment and records it — with `DeleteFile` of each file whose last
    /// keys it holds — in one manifest record; unlinks those files once that record is durable.
    /// Keys without a row get a tombstone. Returns the new segment's seq (`None` if it held
    /// nothing), or `None` if a `clear` or `load` overlapped the copy and nothing was recorded.
    fn move_rows(
        &self,
        guard: &mut (Manifest, State),
        table: &Table,
        id: u64,
        plan: &[Planned],
        stats: &mut FlushStats,
    ) -> Result<Option<Option<u64>>> {
        let epoch = table.clear_epoch.load(Ordering::Acquire);
        // Rolls back on any early return: the segment goes unless its record may have landed.
        let mut tx = SegmentTx::begin_copy(self, guard, table)?;
        let seq = tx.seq();
        let mut written = None;
        let mut edits = Vec::new();
        if plan.iter().any(|(_, keys, _)| !keys.is_empty()) {
            let mut w = tx.create(id, SegmentKind::Compaction)?;
            for (_, keys, _) in plan {
                table.copy_current(keys, &mut w)?;
            }
            if w.records() > 0 {
                let info = w.finish()?;
                edits.push(Edit::AddFile {
                    table: id,
                    seq,
                    records: info.records,
                    bytes: info.bytes,
                });
                stats.records += info.records;
                stats.bytes += info.bytes;
                stats.segments += 1;
                written = Some(seq);
            } else {
                drop(w);
                tx.remove_file();
            }
        }
        // A `clear` or `load` overlapped the copy: the segment mixes both sides; throw it away.
        if epoch % 2 == 1 || table.clear_epoch.load(Ordering::Acquire) != epoch {
            return Ok(None);
        }
        let deleted: Vec<u64> = plan.iter().filter(|p| p.2).map(|p| p.0).collect();
        for &from in &deleted {
            edits.push(Edit::DeleteFile { table: id, seq: from });
            stats.compacted_segments += 1;
        }
        if edits.is_empty() {
            return Ok(Some(None));
        }
        let mut next = tx.state().clone();
        edits.iter().try_for_each(|e| next.apply(e))?;
        // A failed append keeps the segment and never reuses its seq; `from` stays.
        tx.append(&edits, &next)?;
        tx.commit(next);
        for from in deleted {
            let _ = self.vfs.remove(&segment_path(self.dir(), from));
        }
        Ok(Some(written))
    }
}

/// What a compaction step asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing more this flush.
    Done,
    /// Rewrite the table whole: its tombstones pass a quarter of its rows.
    Rewrite,
}

impl Table {
    /// Appends the current row of each of `keys` to `w` (copied under its shard's read lock;
    /// dirty bits untouched), or a tombstone for a key without a row.
    fn copy_current(&self, keys: &[u64], w: &mut SegmentWriter) -> Result<()> {
        let (d, sd) = (self.dim(), self.state_dim());
        let mut by_shard: Vec<Vec<u64>> = vec![Vec::new(); self.shards.len()];
        for &k in keys {
            by_shard[self.shard_of(k)].push(k);
        }
        let mut values = Vec::with_capacity(COPY_CHUNK * d);
        let mut state = Vec::with_capacity(COPY_CHUNK * sd);
        let mut rows = Vec::with_capacity(COPY_CHUNK);
        let mut absent = Vec::new();
        for (s, keys) in by_shard.iter().enumerate() {
            for keys in keys.chunks(COPY_CHUNK) {
                values.clear();
                state.clear();
                rows.clear();
                absent.clear();
                {
                    let shard = self.shards[s].read();
                    for &key in keys {
                        match shard.slot(key) {
                            Some(slot) => {
                                shard.values.extend(slot, &mut values);
                                state.extend_from_slice(shard.state.row(slot));
                                rows.push((key, shard.meta[slot].unpack()));
                            }
                            None => absent.push(key),
                        }
                    }
                }
                for (i, (key, meta)) in rows.iter().enumerate() {
                    w.push(*key, meta, &values[i * d..][..d], &state[i * sd..][..sd])?;
                }
                for &key in &absent {
                    w.push_tombstone(key, Version::default())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny xorshift for the property test below (the seed is in every message).
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn liveness_matches_a_model_whatever_order_files_are_indexed_in() {
        for seed in 1..=20u64 {
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            // Files 1..=8 of random keys; indexed in a random order.
            let files: Vec<(u64, Vec<u64>)> = (1..=8)
                .map(|seq| (seq, (0..next(&mut x) % 50).map(|_| next(&mut x) % 64).collect()))
                .collect();
            let mut order: Vec<usize> = (0..files.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, next(&mut x) as usize % (i + 1));
            }
            let mut l = Liveness::default();
            for &i in &order {
                let (seq, keys) = &files[i];
                l.live.entry(*seq).or_insert(0);
                keys.iter().for_each(|&k| l.note(k, *seq));
            }
            let mut model: BTreeMap<u64, u64> = BTreeMap::new(); // key -> newest seq
            for (seq, keys) in &files {
                for &k in keys {
                    model.insert(k, *seq);
                }
            }
            assert_eq!(l.newest.len(), model.len(), "seed {seed}");
            for (k, s) in &model {
                assert_eq!(l.newest.get(k), Some(s), "seed {seed}: key {k}");
            }
            for (seq, _) in &files {
                let want = model.values().filter(|&s| s == seq).count() as u64;
                assert_eq!(l.live[seq], want, "seed {seed}: live keys of file {seq}");
            }
            // The stalest file has the largest share of records that are no key's newest.
            let records: BTreeMap<u64, u64> =
                files.iter().map(|(s, k)| (*s, k.len() as u64)).collect();
            if let Some(pick) = l.stalest(&records) {
                let share = |s: &u64| 1.0 - l.live[s] as f64 / records[s] as f64;
                assert!(records.keys().all(|s| records[s] == 0 || share(s) <= share(&pick)));
            } else {
                assert!(records.iter().all(|(s, &n)| l.live[s] >= n), "seed {seed}");
            }
        }
    }
}
