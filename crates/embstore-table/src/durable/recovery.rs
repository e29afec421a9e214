//! Opening a store directory: lock it, read the manifest, prove the unnamed segments
//! superseded (`orphans`), rebuild every table from its segments, then delete the orphans.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{orphans, random_id, segment_path, Durable, Tiering, SEG_DIR};
use crate::config::parse_config_text;
use crate::disk::manifest::{Manifest, State, TableEntry};
use crate::disk::segment::SegmentReader;
use crate::disk::vfs::Vfs;
use crate::tier::Gate;
use crate::version::Clock;
use crate::{Error, ErrorKind, Result, Table};

/// The lock file's name.
const LOCK: &str = "LOCK";

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

impl Durable {
    /// Opens (or creates) the store in `dir`, locks it, and rebuilds its tables; returns them
    /// with the clock the store's tables share.
    pub(crate) fn open(
        dir: &Path,
        vfs: Arc<dyn Vfs>,
        clock: &Arc<Clock>,
        tiering: Option<&Tiering>,
    ) -> Result<(Self, Vec<Arc<Table>>)> {
        vfs.create_dir_all(&dir.join(SEG_DIR)).map_err(|e| io("create", dir, e))?;
        let lock = lock(dir)?;
        let mut report = RecoveryReport::default();
        let (manifest, state, orphans) = read_manifest(&*vfs, dir, &mut report)?;
        let mut tables = Vec::new();
        for (&id, entry) in &state.tables {
            tables.push(Arc::new(rebuild_table(
                &*vfs,
                dir,
                clock,
                tiering,
                id,
                entry,
                &mut report,
            )?));
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
            spills: Mutex::default(),
        };
        Ok((durable, tables))
    }
}

/// An I/O error on `p`.
fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

/// Opens the manifest of `dir` (or creates one in a directory without a store) and lists the
/// unnamed segments it proves superseded, before anything changes on disk.
fn read_manifest(
    vfs: &dyn Vfs,
    dir: &Path,
    report: &mut RecoveryReport,
) -> Result<(Manifest, State, Vec<String>)> {
    if vfs.open(&dir.join(crate::disk::manifest::MANIFEST)).is_ok() {
        // Prove every unnamed segment superseded before anything changes on disk (the
        // manifest's torn tail included).
        let (state, _) = crate::disk::manifest::read(vfs, dir)?;
        let orphans = orphans::deletable(vfs, dir, &state)?;
        let (m, mut state, r) = Manifest::open(vfs, dir)?;
        report.torn_manifest_bytes = r.torn_bytes;
        // No seq of the spill range is handed out again: the unadopted spills in it are
        // deleted, and a checkpoint may count seqs up to it as its own.
        state.next_seq = state.next_seq.max(state.spill_below);
        return Ok((m, state, orphans));
    }
    let segs = vfs.list(&dir.join(SEG_DIR)).map_err(|e| io("list", dir, e))?;
    if segs.iter().any(|n| n.ends_with(".seg")) {
        return Err(Error::corrupt(format!(
            "{}: MANIFEST is missing but segments exist; refusing to start an empty store over \
             them",
            dir.display()
        )));
    }
    report.created = true;
    let state = State { next_table_id: 1, next_seq: 1, store_id: random_id(), ..State::default() };
    Ok((Manifest::create(vfs, dir, &state)?, state, Vec::new()))
}

/// Rebuilds table `id` from its manifest entry and its segments, in seq order.
fn rebuild_table(
    vfs: &dyn Vfs,
    dir: &Path,
    clock: &Arc<Clock>,
    tiering: Option<&Tiering>,
    id: u64,
    entry: &TableEntry,
    report: &mut RecoveryReport,
) -> Result<Table> {
    let bad = |what: &str| {
        Error::corrupt(format!("{}: table id {id} in the manifest: {what}", dir.display()))
    };
    let (config, _) = parse_config_text(&entry.config, &bad)?;
    let mut table = Table::with_clock(config, clock.clone())?;
    if let Some(t) = tiering {
        table.enable_tier(t.budget.clone(), t.eviction.clone())?;
    }
    for &seq in entry.files.keys() {
        report.records += replay_file(vfs, dir, &table, tiering, id, seq)?;
        report.segments += 1;
    }
    table.set_step(entry.step);
    table.disk_id.store(id, Ordering::Relaxed);
    table.track_changes();
    Ok(table)
}

/// Replays segment `seq` of table `id` into `table` after checking its header against the
/// manifest; returns its records. With a memory budget every row starts on disk: only the
/// footer is read.
fn replay_file(
    vfs: &dyn Vfs,
    dir: &Path,
    table: &Table,
    tiering: Option<&Tiering>,
    id: u64,
    seq: u64,
) -> Result<u64> {
    let path = segment_path(dir, seq);
    let r = match tiering {
        Some(_) => SegmentReader::open_for_reads(vfs, &path)?,
        None => SegmentReader::open(vfs, &path)?,
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
    Ok(match tiering {
        // With a memory budget every row starts on disk: only the footers are read.
        Some(t) if table.is_tiered() => table.replay_cold(seq, r, t.keep)?,
        _ => {
            let (rows, tombstones) = table.replay(&r)?;
            rows + tombstones
        }
    })
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
