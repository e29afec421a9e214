//! Checkpoints: self-contained snapshots of a durable store, full or incremental, and restore
//! (onto any number of shards).
//!
//! A checkpoint is a directory laid out as a store (`MANIFEST`, `seg/`), whose manifest also
//! holds a `Checkpoint` edit: its id, the newest segment seq it covers, and — for an
//! incremental one — its parent's id, newest seq and path. Taking one flushes the store and
//! then, under the manifest lock (no flush can run meanwhile), hard-links the segments into
//! the new directory (segments are immutable, so a link is a copy that costs nothing; across
//! file systems the files are copied) and writes the manifest. A full checkpoint links every
//! live segment; an incremental one only those newer than its parent's newest seq, plus each
//! table's "superseded below" mark, so that a table cleared or rewritten since the parent
//! drops the parent's files when the chain is restored.
//!
//! Each table is captured at the flush's moment, table by table: a checkpoint taken while
//! other threads write is consistent per table; take it between training steps for one
//! point in time across tables.
//!
//! A store in memory has no segments to link: [`checkpoint_memory`] writes each table's rows
//! (with optimizer state and metadata) into fresh segments, streamed chunk by chunk from the
//! table, and then the same manifest — so restore, inspect, verify and serving read it as any
//! other checkpoint. Such a checkpoint is always full (a store in memory tracks no changes
//! since an earlier one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{random_id, segment_path, Durable, SEG_DIR};
use crate::config::{config_text, parse_config_text};
use crate::disk::manifest::{self, CheckpointInfo, FileEntry, Manifest, State, TableEntry};
use crate::disk::segment::{SegmentHeader, SegmentKind, SegmentReader, SegmentWriter, MAX_RECORDS};
use crate::disk::vfs::{RealFs, Vfs};
use crate::{Error, ErrorKind, Result, Table};

/// What `Store::checkpoint` wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointReport {
    pub path: PathBuf,
    pub id: u64,
    /// The checkpoint this one is an increment on (0: a full checkpoint).
    pub parent_id: u64,
    pub tables: usize,
    /// Segments linked (or copied) into the checkpoint, and their bytes.
    pub segments: usize,
    pub bytes: u64,
}

impl Durable {
    /// Flushes `tables` and writes a checkpoint of them into `dest` (see the module docs).
    /// `progress` is called after each table's segments are linked with (rows done, rows in
    /// all), the rows as the manifest counts them.
    pub(crate) fn checkpoint(
        &self,
        tables: &[Arc<Table>],
        dest: &Path,
        since: Option<&Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CheckpointReport> {
        let vfs = &*self.vfs;
        let parent = since.map(read_checkpoint).transpose()?;
        let mut guard = self.inner.lock();
        self.flush_locked(&mut guard, tables)?;
        let state = &guard.1;
        let parent_info = match &parent {
            Some((path, p)) => {
                let info = p.checkpoint.clone().expect("read_checkpoint checks it");
                if p.store_id != state.store_id || p.store_id == 0 {
                    return Err(Error::invalid(format!(
                        "{} is a checkpoint of another store; an incremental checkpoint builds on \
                         one of the same store",
                        path.display()
                    )));
                }
                Some((path.clone(), info))
            }
            None => None,
        };
        let base_seq = parent_info.as_ref().map_or(0, |(_, p)| p.max_seq);
        prepare_empty_dir(vfs, dest)?;
        let mut out = State {
            next_table_id: state.next_table_id,
            next_seq: state.next_seq,
            store_id: state.store_id,
            ..State::default()
        };
        let mut report = CheckpointReport {
            path: dest.to_path_buf(),
            id: random_id(),
            parent_id: parent_info.as_ref().map_or(0, |(_, p)| p.id),
            tables: state.tables.len(),
            ..CheckpointReport::default()
        };
        let total: u64 = state.tables.values().map(|t| t.rows).sum();
        let mut done = 0;
        for (&id, t) in &state.tables {
            let mut entry = t.clone();
            entry.files = t
                .files
                .iter()
                .filter(|(&seq, _)| seq > base_seq)
                .map(|(&seq, f)| (seq, *f))
                .collect::<BTreeMap<u64, FileEntry>>();
            for (&seq, f) in &entry.files {
                let (from, to) = (segment_path(self.dir(), seq), segment_path(dest, seq));
                vfs.link(&from, &to).map_err(|e| {
                    Error::io(format!("link {} to {}", from.display(), to.display()), e)
                })?;
                report.segments += 1;
                report.bytes += f.bytes;
            }
            out.tables.insert(id, entry);
            done += t.rows;
            progress(done, total);
        }
        out.checkpoint = Some(CheckpointInfo {
            id: report.id,
            max_seq: state.next_seq.saturating_sub(1),
            parent_id: report.parent_id,
            parent_max_seq: base_seq,
            parent_path: parent_info
                .as_ref()
                .map(|(p, _)| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
                .map_or(String::new(), |p| p.to_string_lossy().into_owned()),
        });
        let seg = dest.join(SEG_DIR);
        vfs.sync_dir(&seg)
            .map_err(|e| Error::io(format!("sync directory {}", seg.display()), e))?;
        // The manifest last: a directory without one is not a checkpoint.
        Manifest::create(vfs, dest, &out)?;
        Ok(report)
    }
}

/// Rows read from a table per chunk while a store in memory is checkpointed.
const MEMORY_CHUNK: usize = 4096;

/// Writes a full checkpoint of `tables` — the tables of a store held in memory — into `dest`,
/// a new or empty directory, through `vfs`: per table, its rows with their optimizer state and
/// metadata in segments (a new one after every `max_records` records), then one manifest that
/// names them, with each table's config and step. The rows are streamed from the table a
/// chunk at a time (each row copied whole under its shard's lock, as [`Table::export`] does),
/// so the memory the checkpoint takes beyond the table is a chunk, one shard's keys and a
/// segment's footer (24 bytes a row). The manifest comes last: on any failure the files
/// written are removed (and `dest`, if this created it), and a directory without a manifest
/// is never taken for a checkpoint. `progress` is called after each chunk with (rows done,
/// rows in all when the checkpoint began).
pub(crate) fn checkpoint_memory(
    vfs: &dyn Vfs,
    tables: &[Arc<Table>],
    dest: &Path,
    max_records: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CheckpointReport> {
    let existed = dest.exists();
    prepare_empty_dir(vfs, dest)?;
    let mut written = Vec::new();
    let result = write_memory_checkpoint(vfs, tables, dest, max_records, progress, &mut written);
    if result.is_err() {
        // Best effort: what is left is no checkpoint (no manifest), and removing it lets the
        // same directory take the next try.
        for path in &written {
            let _ = vfs.remove(path);
        }
        let _ = vfs.remove(&dest.join(manifest::MANIFEST_TMP));
        let _ = vfs.remove(&dest.join(manifest::MANIFEST));
        let _ = std::fs::remove_dir(dest.join(SEG_DIR));
        if !existed {
            let _ = std::fs::remove_dir(dest);
        }
    }
    result
}

/// [`checkpoint_memory`]'s work; every file it creates is pushed to `written` first.
fn write_memory_checkpoint(
    vfs: &dyn Vfs,
    tables: &[Arc<Table>],
    dest: &Path,
    max_records: u64,
    progress: &mut dyn FnMut(u64, u64),
    written: &mut Vec<PathBuf>,
) -> Result<CheckpointReport> {
    let tables: Vec<&Arc<Table>> = tables.iter().filter(|t| !t.dropped()).collect();
    let total: u64 = tables.iter().map(|t| t.len() as u64).sum();
    let mut report = CheckpointReport {
        path: dest.to_path_buf(),
        id: random_id(),
        tables: tables.len(),
        ..CheckpointReport::default()
    };
    let mut out = State { store_id: random_id(), next_seq: 1, ..State::default() };
    let mut done = 0u64;
    for (i, table) in tables.iter().enumerate() {
        let id = i as u64 + 1;
        let mut entry = TableEntry {
            name: table.name().to_owned(),
            config: config_text(table.config(), 0),
            ..TableEntry::default()
        };
        let mut w: Option<SegmentWriter> = None;
        let mut export = table.export(MEMORY_CHUNK);
        for chunk in &mut export {
            let (d, sd) = (table.dim(), table.state_dim());
            for r in 0..chunk.len() {
                if w.as_ref().is_some_and(|w| w.records() >= max_records) {
                    let full = w.take().expect("checked");
                    seal_into(&mut entry, &mut report, full)?;
                }
                let seg = match &mut w {
                    Some(seg) => seg,
                    None => {
                        let seq = out.next_seq;
                        out.next_seq += 1;
                        let path = segment_path(dest, seq);
                        let header = SegmentHeader {
                            dim: d as u32,
                            state_dim: sd as u32,
                            seq,
                            table_id: id,
                            kind: SegmentKind::Compaction,
                            created_ms: crate::version::now_ms(),
                        };
                        written.push(path.clone());
                        w.insert(SegmentWriter::create(vfs, &path, header)?)
                    }
                };
                let (values, state) = (&chunk.values[r * d..][..d], &chunk.state[r * sd..][..sd]);
                seg.push(chunk.ids[r], &chunk.meta[r], values, state)?;
            }
            entry.rows += chunk.len() as u64;
            done += chunk.len() as u64;
            progress(done, total.max(done));
        }
        if let Some(e) = export.take_error() {
            return Err(e);
        }
        if let Some(last) = w.take() {
            seal_into(&mut entry, &mut report, last)?;
        }
        // The step as the rows were copied (a checkpoint between training steps holds both of
        // one moment).
        entry.step = table.step();
        out.tables.insert(id, entry);
    }
    out.next_table_id = tables.len() as u64 + 1;
    out.checkpoint = Some(CheckpointInfo {
        id: report.id,
        max_seq: out.next_seq - 1,
        ..CheckpointInfo::default()
    });
    let seg = dest.join(SEG_DIR);
    vfs.sync_dir(&seg).map_err(|e| Error::io(format!("sync directory {}", seg.display()), e))?;
    // The manifest last: a directory without one is not a checkpoint.
    drop(Manifest::create(vfs, dest, &out)?);
    Ok(report)
}

/// Seals (and fsyncs) a segment of a checkpoint of a store in memory and names it in `entry`.
fn seal_into(
    entry: &mut TableEntry,
    report: &mut CheckpointReport,
    w: SegmentWriter,
) -> Result<()> {
    let seq = w.seq();
    let info = w.finish()?;
    entry.files.insert(seq, FileEntry { records: info.records, bytes: info.bytes });
    report.segments += 1;
    report.bytes += info.bytes;
    Ok(())
}

/// The most records one segment of a checkpoint of a store in memory holds.
pub(crate) const MEMORY_SEGMENT_RECORDS: u64 = MAX_RECORDS;

/// Creates `dir` (and `dir/seg`), which must not exist or be empty.
pub(crate) fn prepare_empty_dir(vfs: &dyn Vfs, dir: &Path) -> Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        if entries.count() > 0 {
            return Err(Error::invalid(format!(
                "{} is not empty; a checkpoint or a restore needs a new or empty directory",
                dir.display()
            )));
        }
    }
    let seg = dir.join(SEG_DIR);
    vfs.create_dir_all(&seg).map_err(|e| Error::io(format!("create {}", seg.display()), e))
}

/// The manifest of the checkpoint in `path`; fails if it is not a checkpoint.
fn read_checkpoint(path: &Path) -> Result<(PathBuf, State)> {
    if !path.is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no checkpoint at {}: no such directory", path.display()),
        ));
    }
    let (state, _) = manifest::read(&RealFs, path)?;
    if state.checkpoint.is_none() {
        return Err(Error::invalid(format!(
            "{} is a store directory, not a checkpoint (take one with the store's checkpoint())",
            path.display()
        )));
    }
    Ok((path.to_path_buf(), state))
}

/// The chain of checkpoints that ends at `path`, oldest first: each one's parent found at its
/// recorded path or, failing that, beside the child (a folder of backups copied elsewhere).
pub(crate) fn chain(path: &Path) -> Result<Vec<(PathBuf, State)>> {
    let mut out = vec![read_checkpoint(path)?];
    loop {
        let (child_path, child) = out.last().expect("not empty");
        let info = child.checkpoint.clone().expect("read_checkpoint checks it");
        if info.parent_id == 0 {
            break;
        }
        let recorded = PathBuf::from(&info.parent_path);
        let beside = recorded.file_name().and_then(|n| child_path.parent().map(|d| d.join(n)));
        let found = [Some(recorded.clone()), beside]
            .into_iter()
            .flatten()
            .filter_map(|p| read_checkpoint(&p).ok())
            .find(|(_, s)| s.checkpoint.as_ref().is_some_and(|c| c.id == info.parent_id));
        let Some(parent) = found else {
            return Err(Error::new(
                ErrorKind::Corruption,
                format!(
                    "checkpoint chain has a gap: {} builds on checkpoint {:016x}, which is not at \
                     {} (nor beside it)",
                    child_path.display(),
                    info.parent_id,
                    recorded.display()
                ),
            ));
        };
        let pinfo = parent.1.checkpoint.as_ref().expect("checked");
        if pinfo.max_seq != info.parent_max_seq || parent.1.store_id != child.store_id {
            return Err(Error::corrupt(format!(
                "checkpoint chain has a gap: {} does not match the parent {} expects",
                parent.0.display(),
                child_path.display()
            )));
        }
        out.push(parent);
    }
    out.reverse();
    Ok(out)
}

/// Per table id, the segments of a checkpoint chain that hold its rows (by seq): each
/// checkpoint adds its files and drops those its table superseded.
pub(crate) fn chain_files(chain: &[(PathBuf, State)]) -> BTreeMap<u64, BTreeMap<u64, PathBuf>> {
    chain_entries(chain)
        .into_iter()
        .map(|(id, set)| (id, set.into_iter().map(|(seq, (p, _))| (seq, p)).collect()))
        .collect()
}

/// [`chain_files`] with each segment's manifest entry.
fn chain_entries(chain: &[(PathBuf, State)]) -> BTreeMap<u64, SegmentsOf> {
    let mut files: BTreeMap<u64, SegmentsOf> = BTreeMap::new();
    for (path, state) in chain {
        for (&id, t) in &state.tables {
            let set = files.entry(id).or_default();
            set.retain(|&seq, _| seq >= t.superseded_below);
            for (&seq, &f) in &t.files {
                set.insert(seq, (segment_path(path, seq), f));
            }
        }
    }
    files
}

/// A table's segments in a checkpoint chain, by seq: path and manifest entry.
type SegmentsOf = BTreeMap<u64, (PathBuf, FileEntry)>;

/// The config a checkpoint's manifest records for table `t`.
pub(crate) fn table_config(t: &manifest::TableEntry) -> Result<crate::TableConfig> {
    let bad = |w: &str| Error::corrupt(format!("table '{}' in the checkpoint: {w}", t.name));
    parse_config_text(&t.config, &bad).map(|(config, _)| config)
}

/// Replays the segment at `path` into `table`, after checking that it belongs to table `id`.
pub(crate) fn replay_segment(table: &Table, id: u64, path: &Path) -> Result<()> {
    let r = SegmentReader::open(&RealFs, path)?;
    if r.header().table_id != id || r.header().dim as usize != table.dim() {
        return Err(Error::corrupt(format!(
            "{}: header does not match the checkpoint's manifest",
            path.display()
        )));
    }
    table.replay(&r).map(drop)
}

/// Table `name` of the checkpoint at `ckpt`: its id, its manifest entry and the segments of the
/// chain that hold its rows (by seq); `TableNotFound` if the checkpoint has no such table.
fn table_in_chain(
    ckpt: &Path,
    name: &str,
) -> Result<(u64, manifest::TableEntry, BTreeMap<u64, PathBuf>)> {
    let (id, t, _, files) = table_and_chain(ckpt, name)?;
    Ok((id, t, files.into_iter().map(|(seq, (p, _))| (seq, p)).collect()))
}

/// [`table_in_chain`] with the chain's newest state and each segment's manifest entry.
pub(crate) fn table_and_chain(
    ckpt: &Path,
    name: &str,
) -> Result<(u64, manifest::TableEntry, State, SegmentsOf)> {
    let chain = chain(ckpt)?;
    let newest = &chain.last().expect("not empty").1;
    let Some((&id, t)) = newest.tables.iter().find(|(_, t)| t.name == name) else {
        return Err(Error::new(
            ErrorKind::TableNotFound,
            format!("no table '{name}' in the checkpoint {}", ckpt.display()),
        ));
    };
    let t = t.clone();
    let files = chain_entries(&chain).remove(&id).unwrap_or_default();
    let newest = chain.into_iter().next_back().expect("not empty").1;
    Ok((id, t, newest, files))
}

/// The bytes of table `name`'s segments in the checkpoint at `ckpt` and the chain it builds on
/// (rows and optimizer state as stored; rows rewritten along the chain count once per
/// segment): the size serving's automatic shard count is computed from.
pub fn checkpoint_table_bytes(ckpt: &Path, name: &str) -> Result<u64> {
    let (_, _, files) = table_in_chain(ckpt, name)?;
    files.values().try_fold(0u64, |sum, path| {
        let len = std::fs::metadata(path)
            .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", path.display())))?;
        Ok(sum + len.len())
    })
}

/// Reads table `name` of the checkpoint in `ckpt` (with the chain it builds on) into a new
/// table in memory that holds only the rows of serving shard `shard` of `num_shards` (a power
/// of two; [`crate::shard_of_key`]), with their optimizer state, metadata and the table's
/// step: what a server of one shard of a table version loads. The whole table passes through
/// memory once, chunk by chunk after the replay (a budgeted load is not done yet).
pub fn load_checkpoint_shard(
    ckpt: &Path,
    name: &str,
    shard: usize,
    num_shards: usize,
) -> Result<Arc<Table>> {
    load_checkpoint_shard_as(ckpt, name, shard, num_shards, 0)
}

/// [`load_checkpoint_shard`] into a table whose own writes carry replica id `replica` (a
/// follower's id, when the loaded version is to be kept current by sync).
pub fn load_checkpoint_shard_as(
    ckpt: &Path,
    name: &str,
    shard: usize,
    num_shards: usize,
    replica: u32,
) -> Result<Arc<Table>> {
    if !num_shards.is_power_of_two() || shard >= num_shards {
        return Err(Error::invalid(format!(
            "shard {shard} of {num_shards}: the shard count must be a power of two above the shard"
        )));
    }
    let (id, t, files) = table_in_chain(ckpt, name)?;
    if replica > crate::MAX_REPLICA {
        return Err(Error::invalid(format!("replica_id must be in 0..=2^31 - 1, got {replica}")));
    }
    let clock = Arc::new(crate::version::Clock::new(replica));
    let whole = Table::with_clock(table_config(&t)?, clock.clone())?;
    for path in files.values() {
        replay_segment(&whole, id, path)?;
    }
    whole.set_step(t.step);
    if num_shards == 1 {
        return Ok(Arc::new(whole));
    }
    let part = Table::with_clock(whole.config().clone(), clock)?;
    let mut export = whole.export(1 << 14);
    for chunk in &mut export {
        let keep: Vec<usize> = (0..chunk.len())
            .filter(|&i| crate::shard_of_key(chunk.ids[i], num_shards) == shard)
            .collect();
        let (d, sd) = (whole.dim(), whole.state_dim());
        let mine = crate::RowChunk {
            ids: keep.iter().map(|&i| chunk.ids[i]).collect(),
            values: keep.iter().flat_map(|&i| chunk.values[i * d..][..d].iter().copied()).collect(),
            state: keep.iter().flat_map(|&i| chunk.state[i * sd..][..sd].iter().copied()).collect(),
            meta: keep.iter().map(|&i| chunk.meta[i]).collect(),
            ..chunk
        };
        part.import_chunk(&mine)?;
    }
    if let Some(e) = export.take_error() {
        return Err(e);
    }
    part.set_step(t.step);
    Ok(Arc::new(part))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TableConfig;

    #[test]
    fn a_table_in_memory_past_a_segments_records_goes_into_several() {
        let root = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::new(TableConfig::new("t", 2)).unwrap());
        let ids: Vec<u64> = (0..25).collect();
        table.assign(&ids, &(0..50).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        table.set_step(7);
        let dest = root.path().join("c");
        let r = checkpoint_memory(&RealFs, std::slice::from_ref(&table), &dest, 10, &mut |_, _| {})
            .unwrap();
        assert_eq!(r.segments, 3, "{r:?}");
        let files = chain_files(&chain(&dest).unwrap());
        assert_eq!(files[&1].len(), 3);
        let back = load_checkpoint_shard(&dest, "t", 0, 1).unwrap();
        assert_eq!(back.step(), 7);
        let mut out = vec![0.0; 50];
        back.lookup(&ids, crate::OnMiss::Zeros, &mut out, None).unwrap();
        assert_eq!(out, (0..50).map(|i| i as f32).collect::<Vec<_>>());
    }
}
