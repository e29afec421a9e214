//! A store's checkpoints as the store's API: [`Store::checkpoint`], [`Store::restore`], and a
//! serving shard opened from a checkpoint as a budgeted store ([`open_checkpoint_shard`]).
//! The engine below them — writing a checkpoint's directory, reading its chain, loading a shard
//! into memory — is `durable::checkpoint`; this file sits above both the store and it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::disk::manifest::{Manifest, State};
use crate::disk::vfs::{RealFs, Vfs};
use crate::durable::checkpoint::{
    chain, chain_files, checkpoint_memory, prepare_empty_dir, replay_segment, table_and_chain,
    table_config, CheckpointReport, MEMORY_SEGMENT_RECORDS,
};
use crate::durable::{random_id, segment_path, SEG_DIR};
use crate::sync::SyncOptions;
use crate::{Error, Result, Store, Table};

/// Opens shard `shard` of `num_shards` of table `name` of the checkpoint in `ckpt` (with the
/// chain it builds on) as a store in `dir` (a new or empty directory) under the memory budget
/// of `options`: the budgeted load of a serving shard, which may be larger than memory.
///
/// The table's segments are hard-linked into `dir` (segments are immutable; across file
/// systems they are copied), and the store indexes only this shard's keys from their footers:
/// every row starts on disk, no row is read, and rows come into memory as lookups use them
/// (the memory tier, `tier`). The other shards' records stay in the linked files, unread.
/// Returns the store and the table; dropping the store releases `dir`, which the caller
/// removes. Fails with `InvalidArgument` without a memory budget in `options` (use
/// [`load_checkpoint_shard`] to hold a shard in memory).
pub fn open_checkpoint_shard(
    ckpt: &Path,
    name: &str,
    shard: usize,
    num_shards: usize,
    dir: &Path,
    options: &crate::StoreOptions,
) -> Result<(Store, Arc<Table>)> {
    if !num_shards.is_power_of_two() || shard >= num_shards {
        return Err(Error::invalid(format!(
            "shard {shard} of {num_shards}: the shard count must be a power of two above the shard"
        )));
    }
    if options.memory_budget_bytes.is_none() && options.shared_budget.is_none() {
        return Err(Error::invalid(
            "a budgeted shard load needs a memory budget (StoreOptions::with_memory_budget)",
        ));
    }
    let (id, mut entry, newest, files) = table_and_chain(ckpt, name)?;
    let vfs = RealFs;
    prepare_empty_dir(&vfs, dir)?;
    for (&seq, (from, _)) in &files {
        let to = segment_path(dir, seq);
        vfs.link(from, &to)
            .map_err(|e| Error::io(format!("link {} to {}", from.display(), to.display()), e))?;
    }
    let seg = dir.join(SEG_DIR);
    vfs.sync_dir(&seg).map_err(|e| Error::io(format!("sync directory {}", seg.display()), e))?;
    entry.files = files.iter().map(|(&seq, &(_, f))| (seq, f)).collect();
    entry.superseded_below = 0;
    let state = State {
        next_table_id: newest.next_table_id.max(id + 1),
        next_seq: newest.next_seq.max(files.keys().next_back().map_or(1, |s| s + 1)),
        store_id: random_id(),
        tables: BTreeMap::from([(id, entry)]),
        ..State::default()
    };
    drop(Manifest::create(&vfs, dir, &state)?);
    let store = Store::open_part(dir, options, Arc::new(RealFs), Some((shard, num_shards)))?;
    let table = store.table(name)?;
    Ok((store, table))
}

impl Table {
    /// Starts sync on a table loaded from the checkpoint in `ckpt` (a version a roll loaded,
    /// which a follower then keeps current): each part knows what the checkpointed store knew
    /// when the checkpoint began, which its rows cover, so the follower pulls only what is
    /// newer. A checkpoint of a store that did not sync (or whose saved knowledge is missing,
    /// damaged) gives no knowledge: every part is pulled once (rows already held are not
    /// rewritten), with `options.parts` parts; saved knowledge brings its part count (the
    /// source's). Returns whether knowledge was found.
    /// `options.knowledge_from_rows` is ignored: rows alone never prove what a copy knows.
    pub fn follow_from_checkpoint(&self, ckpt: &Path, options: &SyncOptions) -> Result<bool> {
        // The saved part count is the source's: peers must agree on it.
        let known = crate::sync::saved::load(ckpt, self.name(), None);
        let found = known.is_some();
        let parts = known.as_ref().map_or(options.parts, |k| k.vvs.len() as u32);
        let options = SyncOptions { parts, knowledge_from_rows: false, ..options.clone() };
        self.enable_sync_knowing(&options, known)?;
        Ok(found)
    }
}

impl Store {
    /// Writes a self-contained snapshot of every table (rows, optimizer state, metadata, step
    /// counters, configs) into `dest`, a new or empty directory; [`Store::restore`], serving
    /// and `inspect`/`verify` read it whether the store is kept in a directory or in memory.
    ///
    /// A store in a directory flushes and then hard-links its segments (each table as of the
    /// flush); with `since` (an earlier checkpoint of this store) it writes only the segments
    /// newer than it, and restoring then needs the whole chain. A store in memory writes every
    /// row into new segments, streamed a chunk at a time (it costs a write of every row); its
    /// checkpoints are always full, so `since` fails with `InvalidArgument`. Rows written
    /// while a store in memory is checkpointed may be in it or not, each row whole (values,
    /// state and metadata of one moment); take the checkpoint between training steps for one
    /// point in time. On a failure (a full disk: `NoSpace`) what was written is removed: a
    /// directory without a manifest is never a checkpoint.
    pub fn checkpoint(
        &self,
        dest: impl AsRef<Path>,
        since: Option<&Path>,
    ) -> Result<CheckpointReport> {
        self.checkpoint_with_progress(dest, since, |_, _| {})
    }

    /// [`Store::checkpoint`], calling `progress` with (rows done, rows in all) as it goes:
    /// after each chunk of rows written for a store in memory, after each table's segments
    /// are linked for a store in a directory.
    pub fn checkpoint_with_progress(
        &self,
        dest: impl AsRef<Path>,
        since: Option<&Path>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<CheckpointReport> {
        self.check_open()?;
        let dest = dest.as_ref();
        if self.durable().is_none() {
            return self.checkpoint_memory_on(&RealFs, dest, since, &mut progress);
        }
        let durable = self.durable().expect("checked");
        let tables: Vec<Arc<Table>> = self.all_tables();
        // What each syncing table knows, read before the checkpoint copies a row: the rows it
        // writes cover it (as a follower's flush does, `sync::saved`), so a follower that loads
        // this checkpoint pulls only what is newer.
        let known = self.knowledge(&tables);
        let report = durable.checkpoint(&tables, dest, since, &mut progress)?;
        for (name, vvs) in known {
            crate::sync::saved::save(dest, &name, &vvs)?;
        }
        Ok(report)
    }

    /// The checkpoint of a store in memory ([`Store::checkpoint`]) written through `vfs` (a
    /// fault-injecting file layer in tests); fails for a store in a directory.
    #[doc(hidden)]
    pub fn checkpoint_memory_on(
        &self,
        vfs: &dyn Vfs,
        dest: &Path,
        since: Option<&Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CheckpointReport> {
        self.check_open()?;
        if self.durable().is_some() {
            return Err(Error::invalid("checkpoint_memory_on is for a store held in memory"));
        }
        if let Some(since) = since {
            return Err(Error::invalid(format!(
                "a store held in memory takes only full checkpoints: leave out since= ({}), or \
                 keep the store in a directory (open it with a path) for incremental ones",
                since.display()
            )));
        }
        let tables = self.all_tables();
        let known = self.knowledge(&tables);
        let report = checkpoint_memory(vfs, &tables, dest, MEMORY_SEGMENT_RECORDS, progress)?;
        for (name, vvs) in known {
            crate::sync::saved::save(dest, &name, &vvs)?;
        }
        Ok(report)
    }

    /// What each syncing table of `tables` knows now (see `sync::saved`).
    fn knowledge(&self, tables: &[Arc<Table>]) -> Vec<(String, crate::sync::saved::Knowledge)> {
        tables
            .iter()
            .filter_map(|t| Some((t.name().to_owned(), t.sync_knowledge_snapshot()?)))
            .collect()
    }

    /// Creates a store in `dest` (a new or empty directory) from the checkpoint in `ckpt` and
    /// the chain of checkpoints it builds on, with every table on `num_shards` shards (or its
    /// own), and opens it. `progress` is called after each segment read with (done, total).
    pub fn restore(
        ckpt: impl AsRef<Path>,
        dest: impl AsRef<Path>,
        num_shards: Option<usize>,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Store> {
        let chain = chain(ckpt.as_ref())?;
        // The tables of the newest checkpoint, with the files of the whole chain.
        let newest = &chain.last().expect("not empty").1;
        let files = chain_files(&chain);
        let dest = dest.as_ref();
        prepare_empty_dir(&RealFs, dest)?;
        let store = Store::open(dest)?;
        let total: usize =
            newest.tables.keys().map(|id| files.get(id).map_or(0, |f| f.len())).sum();
        let mut done = 0;
        for (&id, t) in &newest.tables {
            let mut config = table_config(t)?;
            if let Some(n) = num_shards {
                config.num_shards = n;
            }
            let table = Arc::new(Table::with_clock(config, store.clock().clone())?);
            for path in files.get(&id).map(|f| f.values().collect::<Vec<_>>()).unwrap_or_default() {
                replay_segment(&table, id, path)?;
                done += 1;
                progress(done, total);
            }
            table.set_step(t.step);
            store.adopt_table(table)?;
        }
        store.flush()?;
        Ok(store)
    }
}
