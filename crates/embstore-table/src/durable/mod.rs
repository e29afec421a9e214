//! A store kept in a directory: open and recover, flush, compaction, checkpoints.
//!
//! Parts (the formats themselves live in `disk`: segments, the manifest, the device):
//! - this file: [`Durable`] (the directory, its lock, the manifest and the state it describes),
//!   table creation and removal;
//! - `recovery`: opening a directory — proving orphans superseded, replaying the segments;
//! - `flush`: a flush, table by table, and the rewrite of every row (`Store::compact`);
//! - `segment_write`: one segment written and recorded in the manifest, the step every flush,
//!   rewrite and eviction goes through;
//! - `spill`: evictions' segments, written without fsync and adopted by the next flush;
//! - `changes`: a table's side — tracking, copying out and replaying its changed rows;
//! - `compact`: the bounded compaction step after a flush, and its liveness index;
//! - `orphans`: which unnamed segment files recovery may delete;
//! - `checkpoint`: writing a checkpoint directory, reading its chain, loading a serving shard
//!   into memory (the store-level API — `Store::checkpoint`, `Store::restore`,
//!   `open_checkpoint_shard` — is the crate's top-level `checkpoint.rs`, above the store);
//! - `table_file`: `Table::save`/`Table::load`'s one-table file (the legacy format).
//!
//! ```text
//! DIR/LOCK              locked (flock) while a process has the store open
//! DIR/MANIFEST          the edit log (disk::manifest)
//! DIR/seg/<seq>.seg     segments (disk::segment), seq as 16 hex digits
//! ```
//!
//! **What is durable when.** `create_table` and `drop_table` are durable when they return.
//! Row writes (lookups that insert, `apply_gradients`, `assign`, `import`, `remove`,
//! expiry, `clear`, `load`) live in memory (or, evicted under a memory budget, in a spill no
//! record names yet: `spill`) until [`Store::flush`] returns: every write
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

pub(crate) mod changes;
pub(crate) mod checkpoint;
pub(crate) mod compact;
mod flush;
pub(crate) mod orphans;
mod recovery;
mod segment_write;
mod spill;
mod stats;
pub(crate) mod table_file;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

pub use self::recovery::RecoveryReport;
pub use self::stats::FlushStats;
use crate::config::config_text;
use crate::disk::manifest::{Edit, Manifest, State};
use crate::disk::vfs::Vfs;
use crate::{Result, Table};

/// A table is compacted (or rewritten) only once it has at least this many records on disk.
pub const COMPACT_MIN_RECORDS: u64 = 64 * 1024;
/// A table is rewritten once it has more segments than this (each stays open in a tiered
/// table; evictions write small ones), whatever its disk use.
pub const MAX_SEGMENTS: usize = 256;
/// The folder of the segments.
pub(crate) const SEG_DIR: &str = "seg";

/// A store's memory budget and the replacement policy its tables use.
#[derive(Clone, Debug)]
pub(crate) struct Tiering {
    pub(crate) budget: Arc<crate::budget::Budget>,
    pub(crate) eviction: embstore_policy::EvictionConfig,
    /// `Some((shard, n))`: index only the keys of serving shard `shard` of `n`
    /// ([`crate::shard_of_key`]) — a server's part of a checkpoint whose segments it links.
    pub(crate) keep: Option<(usize, usize)>,
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
    pub(crate) compactor: Mutex<compact::Compactor>,
    /// Spills written since the last flush, which adopts them (`spill`); taken under `inner`.
    pub(crate) spills: Mutex<Vec<spill::Spill>>,
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
        self.drop_spills(id);
        self.delete_segments(&files);
        Ok(())
    }

    /// Unlinks segments no longer named; a failure leaves an orphan the next open deletes.
    pub(super) fn delete_segments(&self, seqs: &[u64]) {
        for &seq in seqs {
            let _ = self.vfs.remove(&segment_path(&self.dir, seq));
        }
    }
}

/// A random non-zero id (store and checkpoint identities).
pub(crate) fn random_id() -> u64 {
    embstore_common::rand::unpredictable_u64().max(1)
}
