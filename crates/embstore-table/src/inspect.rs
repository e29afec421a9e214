//! Looking at a store directory without opening it: [`inspect`] (the manifest and the
//! segments' trailers) and [`verify`] (every record and checksum). Both only read, so they
//! also work on a directory another process has open, or on a checkpoint.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::config::parse_config_text;
use crate::disk::manifest::{self, FileEntry, State};
use crate::disk::segment::{self, SegmentReader};
use crate::disk::vfs::RealFs;
use crate::durable::{orphans, segment_path};
use crate::{Error, ErrorKind, Result};

/// One table of a store directory.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TableReport {
    pub name: String,
    pub embedding_dim: usize,
    pub optimizer: String,
    pub step: u64,
    /// Segments, their records (tombstones included) and bytes on disk.
    pub segments: usize,
    pub records: u64,
    pub disk_bytes: u64,
    /// Live rows: as the manifest recorded them at the table's last segment ([`inspect`]), or
    /// counted from every record ([`verify`]; `None` when a segment of the table is damaged).
    pub rows: Option<u64>,
    /// Bytes the rows take with every row in memory: values, optimizer state, 16 B of
    /// metadata and about 27 B of index each.
    pub memory_bytes: Option<u64>,
}

/// What [`inspect`] or [`verify`] found.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StoreReport {
    pub manifest_format: u32,
    pub segment_format: u32,
    pub tables: Vec<TableReport>,
    /// The checkpoint this directory is, if it is one: (id, parent id or 0).
    pub checkpoint: Option<(u64, u64)>,
    /// Bytes of a torn last manifest record (recovery drops them).
    pub torn_manifest_bytes: u64,
    /// Segment files no table names that the manifest proves superseded (evictions' spills no
    /// flush adopted included): safe to remove while no process has the store open (recovery
    /// deletes them).
    pub orphan_segments: Vec<String>,
    /// Segment files no table names that the manifest cannot prove superseded: the store is
    /// not opened while they are there (see [`verify`], which reports them as damage). Moving
    /// them aside opens the store at the state its manifest records, without their rows.
    pub unaccounted_segments: Vec<String>,
    /// Damage found: one line per damaged file or record ([`verify`] only).
    pub damage: Vec<String>,
    /// How often [`verify`] took a table's segments from a fresh manifest because a live
    /// store's flush or compaction replaced one before it could open it.
    pub restarts: u32,
}

/// Bytes `rows` rows of a table of `config` take with every row in memory.
fn memory_bytes(config: &crate::TableConfig, rows: u64) -> u64 {
    let state_dim = config.optimizer.state_dim(config.embedding_dim);
    rows * (4 * (config.embedding_dim + state_dim) as u64 + 16 + 27)
}

/// Reads the manifest of `dir` and sums its files.
pub fn inspect(dir: impl AsRef<Path>) -> Result<StoreReport> {
    let dir = dir.as_ref();
    let (state, opened) = manifest::read(&RealFs, dir)?;
    report_of(dir, &state, opened)
}

/// The report of the manifest state `state` of `dir`, its files summed.
fn report_of(dir: &Path, state: &State, opened: manifest::OpenReport) -> Result<StoreReport> {
    let mut report = StoreReport {
        manifest_format: opened.format,
        segment_format: segment::FORMAT,
        checkpoint: state.checkpoint.as_ref().map(|c| (c.id, c.parent_id)),
        torn_manifest_bytes: opened.torn_bytes,
        ..StoreReport::default()
    };
    for (&id, t) in &state.tables {
        let bad = |w: &str| Error::corrupt(format!("table id {id} in the manifest: {w}"));
        let (config, _) = parse_config_text(&t.config, &bad)?;
        let sum = |f: fn(&FileEntry) -> u64| t.files.values().map(f).sum::<u64>();
        report.tables.push(TableReport {
            name: t.name.clone(),
            embedding_dim: config.embedding_dim,
            optimizer: config.optimizer.name().to_owned(),
            step: t.step,
            segments: t.files.len(),
            records: sum(|f| f.records),
            disk_bytes: sum(|f| f.bytes),
            rows: Some(t.rows),
            memory_bytes: Some(memory_bytes(&config, t.rows)),
        });
    }
    if let Ok(unnamed) = orphans::unnamed(&RealFs, dir, state) {
        report.orphan_segments = unnamed.superseded;
        report.unaccounted_segments = unnamed.unaccounted;
    }
    Ok(report)
}

/// How many times [`verify`] takes a fresh manifest for one table's segments before it gives
/// up on a store that keeps replacing them (opening a table's segments takes milliseconds).
const VERIFY_ATTEMPTS: u32 = 64;

/// [`inspect`], then reads every record of every segment the manifest names, checking each
/// checksum and each header against the manifest, and counts the live rows. Damage is listed
/// in [`StoreReport::damage`] (the walk goes on past it), not returned as an error: a manifest
/// that fails its checks, or that cannot account for the segments on disk (see `orphans`), is
/// damage too. `progress` is called after each segment with (segments done, segments in all).
///
/// On a store another process has open, flushes and compactions replace segments meanwhile:
/// each table's segments are first all opened, as one manifest state names them, and then read
/// through the open files (segments never change, and an unlinked file stays readable while
/// open). A segment missing at that point is damage only if a fresh read of the manifest
/// still names it; otherwise the table's segments are taken from the fresh manifest (counted
/// in [`StoreReport::restarts`]).
pub fn verify(
    dir: impl AsRef<Path>,
    mut progress: impl FnMut(usize, usize),
) -> Result<StoreReport> {
    let dir = dir.as_ref();
    let (state, opened) = match manifest::read(&RealFs, dir) {
        Ok(read) => read,
        Err(e) if matches!(e.kind(), ErrorKind::Corruption) => {
            return Ok(StoreReport {
                manifest_format: manifest::FORMAT,
                segment_format: segment::FORMAT,
                damage: vec![format!("manifest: {e}")],
                ..StoreReport::default()
            })
        }
        Err(e) => return Err(e),
    };
    let mut report = report_of(dir, &state, opened)?;
    let total: usize = state.tables.values().map(|t| t.files.len()).sum();
    let mut done = 0;
    for ((&id, t), out) in state.tables.iter().zip(report.tables.iter_mut()) {
        let bad = |w: &str| Error::corrupt(format!("table id {id}: {w}"));
        let (config, _) = parse_config_text(&t.config, &bad)?;
        let state_dim = config.optimizer.state_dim(config.embedding_dim);
        let (files, held, restarts) = hold_segments(dir, id, t.files.clone())?;
        report.restarts += restarts;
        out.segments = files.len();
        out.records = files.values().map(|f| f.records).sum();
        out.disk_bytes = files.values().map(|f| f.bytes).sum();
        let mut live: HashSet<u64> = HashSet::new();
        let mut damaged = false;
        for (seq, reader) in held {
            let entry = files[&seq];
            let checked = reader.and_then(|r| {
                let h = r.header();
                if h.seq != seq
                    || h.table_id != id
                    || h.dim as usize != config.embedding_dim
                    || h.state_dim as usize != state_dim
                    || r.records() != entry.records
                    || r.bytes() != entry.bytes
                {
                    return Err(Error::corrupt(format!(
                        "{}: header or size does not match the manifest",
                        segment_path(dir, seq).display()
                    )));
                }
                r.for_each(|rec| {
                    if rec.tombstone {
                        live.remove(&rec.key);
                    } else {
                        live.insert(rec.key);
                    }
                    Ok(())
                })
            });
            if let Err(e) = checked {
                report.damage.push(format!("table '{}': {e}", t.name));
                damaged = true;
            }
            done += 1;
            progress(done, total.max(done));
        }
        // A damaged segment's rows cannot be counted: say so rather than count some.
        let rows = (!damaged).then_some(live.len() as u64);
        out.rows = rows;
        out.memory_bytes = rows.map(|rows| memory_bytes(&config, rows));
    }
    // Segments the manifest cannot account for; on a live store only if a second read of the
    // manifest finds the same state (a flush may have been writing its segment meanwhile).
    let mut last = state;
    for _ in 0..VERIFY_ATTEMPTS {
        let unnamed = match orphans::unnamed(&RealFs, dir, &last) {
            Ok(unnamed) => unnamed,
            Err(e) => {
                report.damage.push(format!("segments: {e}"));
                break;
            }
        };
        if !unnamed.unaccounted.is_empty() {
            match manifest::read(&RealFs, dir) {
                Ok((now, _)) if now != last => {
                    last = now;
                    continue;
                }
                _ => report.damage.push(unaccounted_damage(&unnamed)),
            }
        }
        report.orphan_segments = unnamed.superseded;
        report.unaccounted_segments = unnamed.unaccounted;
        break;
    }
    Ok(report)
}

/// The damage line for segments the manifest cannot account for: which files are safe to
/// remove, and what moving the others aside costs.
fn unaccounted_damage(unnamed: &orphans::Unnamed) -> String {
    let safe = match unnamed.superseded.as_slice() {
        [] => "none".to_owned(),
        files => files.join(", "),
    };
    format!(
        "manifest: {}; it cannot account for them, so the store is not opened. Safe to remove \
         (superseded): {safe}. Unaccounted, not safe to delete: {}; moving them aside opens \
         the store at the state its manifest records, and rows only they hold are lost (none \
         that a flush acknowledged, when they were left by flushes that failed, e.g. on a full \
         disk)",
        unnamed.why,
        unnamed.unaccounted.join(", ")
    )
}

/// A segment of a table opened for [`verify`] (or why it could not be).
type Held = (u64, Result<SegmentReader>);

/// Opens every segment in `files` (table `id`'s, as one manifest state names them). When one
/// is missing and a fresh manifest no longer names it, starts over with the table's files in
/// the fresh manifest. Returns the files held, the readers, and how often it started over.
fn hold_segments(
    dir: &Path,
    id: u64,
    mut files: BTreeMap<u64, FileEntry>,
) -> Result<(BTreeMap<u64, FileEntry>, Vec<Held>, u32)> {
    for attempt in 0..VERIFY_ATTEMPTS {
        let mut held = Vec::with_capacity(files.len());
        let mut replaced = None;
        for &seq in files.keys() {
            match SegmentReader::open(&RealFs, &segment_path(dir, seq)) {
                Ok(r) => held.push((seq, Ok(r))),
                Err(e) => match manifest::read(&RealFs, dir) {
                    Ok((now, _))
                        if !now.tables.get(&id).is_some_and(|t| t.files.contains_key(&seq)) =>
                    {
                        replaced =
                            Some(now.tables.get(&id).map(|t| t.files.clone()).unwrap_or_default());
                        break;
                    }
                    _ => held.push((seq, Err(e))),
                },
            }
        }
        match replaced {
            None => return Ok((files, held, attempt)),
            Some(now) => files = now,
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!(
            "{}: table id {id}'s segments were replaced under each of {VERIFY_ATTEMPTS} attempts \
             to open them; verify the store when it is idle (or verify a checkpoint of it)",
            dir.display()
        ),
    ))
}
