//! Looking at a store directory without opening it: [`inspect`] (the manifest and the
//! segments' trailers) and [`verify`] (every record and checksum). Both only read, so they
//! also work on a directory another process has open, or on a checkpoint.

use std::collections::HashSet;
use std::path::Path;

use crate::disk::manifest::{self, FileEntry};
use crate::disk::segment::{self, SegmentReader};
use crate::disk::vfs::{RealFs, Vfs};
use crate::durable::{segment_path, SEG_DIR};
use crate::file::parse_config_text;
use crate::{Error, Result};

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
    /// counted from every record ([`verify`]).
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
    /// Segment files no table names (recovery deletes them).
    pub orphan_segments: Vec<String>,
    /// Damage found: one line per damaged file or record ([`verify`] only).
    pub damage: Vec<String>,
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
    let mut report = StoreReport {
        manifest_format: manifest::FORMAT,
        segment_format: segment::FORMAT,
        checkpoint: state.checkpoint.as_ref().map(|c| (c.id, c.parent_id)),
        torn_manifest_bytes: opened.torn_bytes,
        ..StoreReport::default()
    };
    let mut named = HashSet::new();
    for (&id, t) in &state.tables {
        let bad = |w: &str| Error::corrupt(format!("table id {id} in the manifest: {w}"));
        let (config, _) = parse_config_text(&t.config, &bad)?;
        let sum = |f: fn(&FileEntry) -> u64| t.files.values().map(f).sum::<u64>();
        named.extend(t.files.keys().copied());
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
    if let Ok(names) = RealFs.list(&dir.join(SEG_DIR)) {
        for name in names {
            let seq = name.strip_suffix(".seg").and_then(|h| u64::from_str_radix(h, 16).ok());
            if seq.is_some_and(|s| !named.contains(&s)) {
                report.orphan_segments.push(name);
            }
        }
    }
    Ok(report)
}

/// [`inspect`], then reads every record of every segment the manifest names, checking each
/// checksum and each header against the manifest, and counts the live rows. Damage is listed
/// in [`StoreReport::damage`] (the walk goes on past it), not returned as an error; `progress`
/// is called after each segment with (segments done, segments in all).
pub fn verify(
    dir: impl AsRef<Path>,
    mut progress: impl FnMut(usize, usize),
) -> Result<StoreReport> {
    let dir = dir.as_ref();
    let mut report = inspect(dir)?;
    let (state, _) = manifest::read(&RealFs, dir)?;
    let total: usize = state.tables.values().map(|t| t.files.len()).sum();
    let mut done = 0;
    for ((&id, t), out) in state.tables.iter().zip(report.tables.iter_mut()) {
        let bad = |w: &str| Error::corrupt(format!("table id {id}: {w}"));
        let (config, _) = parse_config_text(&t.config, &bad)?;
        let state_dim = config.optimizer.state_dim(config.embedding_dim);
        let mut live: HashSet<u64> = HashSet::new();
        for (&seq, entry) in &t.files {
            let path = segment_path(dir, seq);
            let checked = SegmentReader::open(&RealFs, &path).and_then(|r| {
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
                        path.display()
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
            }
            done += 1;
            progress(done, total);
        }
        let rows = live.len() as u64;
        out.rows = Some(rows);
        out.memory_bytes = Some(memory_bytes(&config, rows));
    }
    Ok(report)
}
