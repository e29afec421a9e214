//! A store kept in a directory: open and recover, flush, compaction by rewrite.
//!
//! ```text
//! DIR/LOCK              locked (flock) while a process has the store open
//! DIR/MANIFEST          the edit log (disk::manifest)
//! DIR/seg/<seq>.seg     segments (disk::segment), seq as 16 hex digits
//! ```
//!
//! **What is durable when.** `create_table` and `drop_table` are durable when they return.
//! Row writes (lookups that insert, `apply_gradients`, `assign`, `import`, `remove`,
//! expiry, `clear`, `load`) live in memory until [`Store::flush`] returns: every write
//! acknowledged before the call is then in a sealed, fsynced segment that an fsynced manifest
//! record names. After a crash, reopening gives every row its value at the last completed
//! flush or a value written after it — never a torn row (each record has its own checksum and
//! is written whole) and never a row mixing two writes (a row is copied under its shard's
//! lock). There is no write-ahead log: the work since the last flush can be lost.
//!
//! **Compaction.** Each flush appends only what changed, so the files hold stale copies of
//! rows written more than once. For a table in memory, each flush ends with a bounded
//! compaction step (`compact`): the live rows of the stalest files move to a new segment and
//! the files are deleted, so disk use stays under about 2× the live rows while a flush costs
//! what changed. [`Store::compact`](crate::Store::compact), a table with more than
//! [`MAX_SEGMENTS`] files, and a tiered table whose records on disk pass twice its live rows
//! (and [`COMPACT_MIN_RECORDS`]) are rewritten whole: every row into a fresh segment that
//! supersedes the older files, which are deleted.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::compact::Step;
use crate::config::{config_text, parse_config_text};
use crate::disk::manifest::{Edit, Manifest, State};
use crate::disk::segment::{SegmentHeader, SegmentKind, SegmentReader, SegmentWriter};
use crate::disk::vfs::Vfs;
use crate::tier::Gate;
use crate::version::{now_ms, Clock};
use crate::{Error, ErrorKind, Result, Table};

/// A table is compacted (or rewritten) only once it has at least this many records on disk.
pub const COMPACT_MIN_RECORDS: u64 = 64 * 1024;
/// A table is rewritten once it has more segments than this (each stays open in a tiered
/// table; evictions write small ones), whatever its disk use.
pub const MAX_SEGMENTS: usize = 256;
/// The lock file's name.
const LOCK: &str = "LOCK";
/// The folder of the segments.
pub(crate) const SEG_DIR: &str = "seg";

/// A store's memory budget and the replacement policy its tables use.
#[derive(Clone, Debug)]
pub(crate) struct Tiering {
    pub(crate) budget: Arc<crate::budget::Budget>,
    pub(crate) eviction: crate::evict::EvictionConfig,
    /// `Some((shard, n))`: index only the keys of serving shard `shard` of `n`
    /// ([`crate::shard_of_key`]) — a server's part of a checkpoint whose segments it links.
    pub(crate) keep: Option<(usize, usize)>,
}

/// What opening a store directory found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Whether the directory held no store (one was created).
    pub created: bool,
    /// Tables, segments read and records replayed.
    pub tables: usize,
    pub segments: usize,
    pub records: u64,
    /// Bytes of a torn manifest record dropped (an append a crash cut short).
    pub torn_manifest_bytes: u64,
    /// Segment files the manifest proves superseded (from a flush a crash cut short), deleted
    /// (see `orphans`: a segment it cannot prove superseded makes the open fail instead).
    pub orphan_segments: Vec<String>,
}

/// The disk side of a [`Store`](crate::Store) opened on a directory.
pub(crate) struct Durable {
    dir: PathBuf,
    pub(crate) vfs: Arc<dyn Vfs>,
    /// The directory's lock, held until the store is closed or dropped.
    lock: Mutex<Option<std::fs::File>>,
    /// The manifest and the state it describes; held for a whole flush, so flushes (and
    /// table creation and removal) run one at a time.
    pub(crate) inner: Mutex<(Manifest, State)>,
    pub(crate) report: RecoveryReport,
    /// The tables' liveness indexes for incremental compaction (`compact`); taken under
    /// `inner`.
    pub(crate) compactor: Mutex<crate::compact::Compactor>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// The path of segment `seq` in `dir`.
pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(SEG_DIR).join(format!("{seq:016x}.seg"))
}

impl Durable {
    /// Opens (or creates) the store in `dir`, locks it, and rebuilds its tables; returns them
    /// with the clock the store's tables share.
    pub(crate) fn open(
        dir: &Path,
        vfs: Arc<dyn Vfs>,
        clock: &Arc<Clock>,
        tiering: Option<&Tiering>,
    ) -> Result<(Self, Vec<Arc<Table>>)> {
        let io = |what: &str, p: &Path, e| Error::io(format!("{what} {}", p.display()), e);
        vfs.create_dir_all(&dir.join(SEG_DIR)).map_err(|e| io("create", dir, e))?;
        let lock = lock(dir)?;
        let mut report = RecoveryReport::default();
        let mut orphans = Vec::new();
        let (manifest, state) = if vfs.open(&dir.join(crate::disk::manifest::MANIFEST)).is_ok() {
            // Prove every unnamed segment superseded before anything changes on disk (the
            // manifest's torn tail included).
            let (state, _) = crate::disk::manifest::read(&*vfs, dir)?;
            orphans = crate::orphans::deletable(&*vfs, dir, &state)?;
            let (m, state, r) = Manifest::open(&*vfs, dir)?;
            report.torn_manifest_bytes = r.torn_bytes;
            (m, state)
        } else {
            let segs = vfs.list(&dir.join(SEG_DIR)).map_err(|e| io("list", dir, e))?;
            if segs.iter().any(|n| n.ends_with(".seg")) {
                return Err(Error::corrupt(format!(
                    "{}: MANIFEST is missing but segments exist; refusing to start an empty \
                     store over them",
                    dir.display()
                )));
            }
            report.created = true;
            let state =
                State { next_table_id: 1, next_seq: 1, store_id: random_id(), ..State::default() };
            (Manifest::create(&*vfs, dir, &state)?, state)
        };
        let mut tables = Vec::new();
        for (&id, entry) in &state.tables {
            let bad = |what: &str| {
                Error::corrupt(format!("{}: table id {id} in the manifest: {what}", dir.display()))
            };
            let (config, _) = parse_config_text(&entry.config, &bad)?;
            let mut table = Table::with_clock(config, clock.clone())?;
            if let Some(t) = tiering {
                table.enable_tier(t.budget.clone(), t.eviction.clone())?;
            }
            for &seq in entry.files.keys() {
                let path = segment_path(dir, seq);
                let r = match tiering {
                    Some(_) => SegmentReader::open_for_reads(&*vfs, &path)?,
                    None => SegmentReader::open(&*vfs, &path)?,
                };
                let h = r.header();
                if h.seq != seq
                    || h.table_id != id
                    || h.dim as usize != table.dim()
                    || h.state_dim as usize != table.state_dim()
                {
                    return Err(Error::corrupt(format!(
                        "{}: header does not match the manifest (seq {seq}, table {id})",
                        path.display()
                    )));
                }
                report.records += match tiering {
                    // With a memory budget every row starts on disk: only the footers are read.
                    Some(t) if table.is_tiered() => table.replay_cold(seq, r, t.keep)?,
                    _ => {
                        let (rows, tombstones) = table.replay(&r)?;
                        rows + tombstones
                    }
                };
                report.segments += 1;
            }
            table.set_step(entry.step);
            table.disk_id.store(id, Ordering::Relaxed);
            table.track_changes();
            tables.push(Arc::new(table));
        }
        report.tables = tables.len();
        // Segments the manifest proves superseded (`orphans`) are what a crash left of a
        // flush; a leftover manifest rewrite is dropped too.
        let _ = vfs.remove(&dir.join("MANIFEST.tmp"));
        for name in orphans {
            let path = dir.join(SEG_DIR).join(&name);
            vfs.remove(&path).map_err(|e| io("remove", &path, e))?;
            report.orphan_segments.push(name);
        }
        let durable = Self {
            dir: dir.to_path_buf(),
            vfs,
            lock: Mutex::new(Some(lock)),
            inner: Mutex::new((manifest, state)),
            report,
            compactor: Mutex::default(),
        };
        Ok((durable, tables))
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lets go of the directory's lock (the store was closed): another store may open it.
    /// Under the manifest lock, so a segment write in flight (an eviction) finishes first and
    /// none starts after (`write_segment` checks the lock is still held).
    pub(crate) fn unlock(&self) {
        let _manifest = self.inner.lock();
        self.lock.lock().take();
    }

    /// Records a new table (durable when this returns).
    pub(crate) fn create_table(&self, table: &Table) -> Result<()> {
        let mut guard = self.inner.lock();
        let (manifest, state) = &mut *guard;
        let id = state.next_table_id.max(1);
        let edits = [
            Edit::CreateTable {
                id,
                name: table.name().to_owned(),
                config: config_text(table.config(), 0),
            },
            Edit::Step { table: id, step: table.step() },
        ];
        let mut next = state.clone();
        edits.iter().try_for_each(|e| next.apply(e))?;
        manifest.append(&*self.vfs, &edits, &next)?;
        *state = next;
        table.disk_id.store(id, Ordering::Relaxed);
        table.track_changes();
        // Rows a table brings with it (`load_table`) are written by the next flush.
        table.mark_all_dirty();
        Ok(())
    }

    /// Records that `name` was dropped (durable when this returns) and deletes its files.
    pub(crate) fn drop_table(&self, name: &str) -> Result<()> {
        let mut guard = self.inner.lock();
        let (manifest, state) = &mut *guard;
        let Some(id) = state.table_id(name) else { return Ok(()) };
        let files: Vec<u64> = state.tables[&id].files.keys().copied().collect();
        let edits = [Edit::DropTable { id }];
        let mut next = state.clone();
        next.apply(&edits[0])?;
        manifest.append(&*self.vfs, &edits, &next)?;
        *state = next;
        self.compactor.lock().forget(id);
        self.delete_segments(&files);
        Ok(())
    }

    /// Unlinks segments no longer named; a failure leaves an orphan the next open deletes.
    fn delete_segments(&self, seqs: &[u64]) {
        for &seq in seqs {
            let _ = self.vfs.remove(&segment_path(&self.dir, seq));
        }
    }

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
    fn flush_table(
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
        self.write_segment(guard, table, kind, rewrite, stats, |w, file| {
            let n = table.write_changes(w, file)?;
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

    /// Writes the dirty rows among `keys` of `table` to a new segment (eviction): durable when
    /// this returns, their disk locations set.
    pub(crate) fn write_rows_of(&self, table: &Table, keys: &[u64]) -> Result<()> {
        let mut guard = self.inner.lock();
        let mut stats = FlushStats::default();
        let mut by_shard: Vec<Vec<u64>> = vec![Vec::new(); table.shards.len()];
        for &k in keys {
            by_shard[table.shard_of(k)].push(k);
        }
        self.write_segment(&mut guard, table, SegmentKind::Flush, false, &mut stats, |w, file| {
            Ok((table.write_changes_of(w, file, Some(&by_shard))?, Vec::new()))
        })?;
        Ok(())
    }

    /// Writes one segment of `table` with `body` (given the writer and, for a tiered table,
    /// the file slot its rows' locations point into), then records it — with a `Supersede` of
    /// the older segments when the table was cleared or this is a rewrite — and the step in one
    /// manifest record. Returns the segment's seq if one was kept. On any failure the segment
    /// is deleted and every row is marked dirty again.
    fn write_segment(
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
        let file = table.reserve_file_slot()?;
        let release = || table.release_file_slot(file);
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
        let reader = match (kept, table.is_tiered()) {
            (true, true) => {
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
        if let Some(f) = file {
            table.on_segment_committed(f, seq, reader, cleared, &moved);
        }
        self.delete_segments(&superseded);
        Ok(kept.then_some(seq))
    }
}

/// A row on disk copied by a rewrite: (key, old location, new location).
pub(crate) type Moved = (u64, u64, u64);

/// What one flush wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlushStats {
    pub segments: u64,
    pub records: u64,
    pub bytes: u64,
    /// Tables rewritten whole: by `Store::compact`, or by a flush for a table past
    /// [`MAX_SEGMENTS`] files, a tiered table past twice its live rows, or a table whose keys
    /// without a row (tombstones) pass a quarter of its rows.
    pub compactions: u64,
    /// Segment files whose live rows a compaction step moved out, deleted.
    pub compacted_segments: u64,
}

/// A random non-zero id (store and checkpoint identities).
pub(crate) fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Locks `dir` for this process: one process (and one `Store`) opens a directory at a time.
fn lock(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(
            ErrorKind::Locked,
            format!("{} is open in another process (or another Store in this one)", dir.display()),
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::io(format!("lock {}", path.display()), e))
        }
    }
}
