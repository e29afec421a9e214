//! A witness's state in a table (Ekko §5.3.2; the calls are in `sync::witness`): it follows
//! like any replica, and besides what it applies it keeps every row it received in logs
//! bucketed by arrival time ([`WitnessLog`]), flushing a bucket into its *healthy store* only once the model was
//! judged healthy past the bucket's end. A rollback then writes only the difference between
//! the healthy store and the rows changed since ([`Table::witness_diff`]).
//!
//! The healthy store is persisted, so a witness that restarts still holds it: the file
//! `DIR/<table>.witness` takes one block per flush (the rows the flush changed, the healthy
//! VV and `t_max`), appended and synced before the flush returns, and is rewritten whole once
//! it is more than twice what it holds. A restarted witness loads it, drops every log (RB4:
//! possibly corrupted rows are never flushed from before a restart) and pulls again; what it
//! pulls that is newer than its healthy store lands in fresh buckets.
//!
//! ```text
//! file  = magic "EMBWIT1\n" | dim u32 | parts u32 | bucket_ms u64 | block*
//! block = len u32 | crc32 u32 | t_max u64 | parts × vv | n u32
//!         | n × (key u64 | ts u64 | replica u32 | removed u8 | (values D × f32 unless removed))
//! vv    = n u16 | n × (origin u32 | ts u64)
//! ```
//! A last block cut short or failing its checksum (a crash while appending, before its flush
//! returned) is moved to `<table>.witness.torn-<offset>` and the file cut back to the block
//! before; damage anywhere else is a `Corruption` error and the file is left as it is.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use embstore_common::bytes::{Reader, Writer};
use embstore_replication::witness::{Logged, WitnessLog};
use parking_lot::Mutex;

use crate::{Error, ErrorKind, Result, Version};
use embstore_replication::Vv;

pub(crate) const MAGIC: &[u8; 8] = b"EMBWIT1\n";
pub(crate) const HEADER: usize = 8 + 4 + 4 + 8;

/// What a witness holds (see [`Table::witness_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WitnessStats {
    /// The time (ms) up to which the healthy store holds what arrived (0: nothing flushed).
    pub t_max_ms: u64,
    /// Unflushed buckets.
    pub buckets: usize,
    /// Distinct keys in the unflushed logs.
    pub logged_keys: usize,
    /// Rows (and removals) in the healthy store.
    pub healthy_rows: usize,
    /// The healthy store's file, bytes (0 when not persisted).
    pub file_bytes: u64,
    /// Rows taken from the file when the witness started.
    pub restored_rows: usize,
}

/// The persisted healthy store of one table.
pub(crate) struct HealthyFile {
    pub(crate) path: PathBuf,
    file: File,
    pub(crate) len: u64,
    /// An append failed: the file holds less than the memory until it is written whole.
    pub(crate) stale: bool,
}

/// A table's witness state: its logs and healthy store, and the file that keeps the latter.
pub(crate) struct TableWitness {
    pub(crate) log: Mutex<WitnessLog>,
    pub(crate) file: Mutex<Option<HealthyFile>>,
    pub(crate) dim: usize,
    pub(crate) restored: usize,
}

pub(crate) fn bad(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corruption,
        format!("witness file {} {why}; it was left as it is", path.display()),
    )
}

pub(crate) fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{what} witness file {}: {e}", path.display()))
}

fn put_vv(w: &mut Writer, vv: &Vv) {
    w.u16(vv.entries().len() as u16);
    for &(o, t) in vv.entries() {
        w.u32(o).u64(t);
    }
}

fn get_vv(r: &mut Reader<'_>) -> Result<Vv> {
    let n = r.u16()? as usize;
    let mut vv = Vv::new();
    for _ in 0..n {
        let (o, t) = (r.u32()?, r.u64()?);
        vv.raise(o, t);
    }
    Ok(vv)
}

/// One block's payload: `t_max`, the VVs and `rows`.
pub(crate) fn block(dim: usize, t_max: u64, vvs: &[Vv], rows: &[(u64, &Logged)]) -> Vec<u8> {
    let mut w = Writer::with_capacity(16 + rows.len() * (21 + 4 * dim));
    w.u64(t_max);
    for vv in vvs {
        put_vv(&mut w, vv);
    }
    w.u32(rows.len() as u32);
    for (k, row) in rows {
        w.u64(*k).u64(row.version.timestamp).u32(row.version.replica);
        match &row.values {
            Some(v) => {
                w.u8(0).f32s(v);
            }
            None => {
                w.u8(1);
            }
        }
    }
    let payload = w.0;
    let mut out = Writer::with_capacity(payload.len() + 8);
    out.u32(payload.len() as u32).u32(crc32fast::hash(&payload)).raw(&payload);
    out.0
}

/// What a file holds: the healthy store, its VVs, `t_max`, and the length of its good part.
pub(crate) struct Loaded {
    pub(crate) healthy: BTreeMap<u64, Logged>,
    pub(crate) vvs: Vec<Vv>,
    pub(crate) t_max: u64,
    pub(crate) good_len: u64,
}

pub(crate) fn load(path: &Path, dim: usize, parts: u32, bucket_ms: u64) -> Result<Loaded> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| io(path, "reading the", e))?;
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(bad(path, "does not start like one"));
    }
    let mut h = Reader::new(&bytes[8..HEADER], "a witness file's header");
    let (fdim, fparts, fbucket) = (h.u32()? as usize, h.u32()?, h.u64()?);
    if fdim != dim || fparts != parts || fbucket != bucket_ms {
        return Err(Error::invalid(format!(
            "witness file {} holds a table of dim {fdim} in {fparts} parts with {fbucket} ms \
             buckets; this witness has dim {dim}, {parts} parts, {bucket_ms} ms buckets: give \
             it another directory or move the file away",
            path.display()
        )));
    }
    let mut out = Loaded {
        healthy: BTreeMap::new(),
        vvs: vec![Vv::new(); parts as usize],
        t_max: 0,
        good_len: HEADER as u64,
    };
    let mut at = HEADER;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < 8 {
            break; // a cut header: the last append did not finish
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if rest.len() < 8 + len {
            break; // a cut block
        }
        let payload = &rest[8..8 + len];
        if crc32fast::hash(payload) != crc {
            if at + 8 + len == bytes.len() {
                break; // the last block, torn
            }
            return Err(bad(path, format!("has a damaged block at byte {at}")));
        }
        let mut r = Reader::new(payload, "a witness file's block");
        let t_max = r.u64()?;
        let vvs = (0..parts).map(|_| get_vv(&mut r)).collect::<Result<Vec<_>>>()?;
        let n = r.count(21)?;
        for _ in 0..n {
            let key = r.u64()?;
            let version = Version { timestamp: r.u64()?, replica: r.u32()? };
            let values = match r.u8()? {
                0 => Some(r.f32s(dim)?),
                _ => None,
            };
            out.healthy.insert(key, Logged { version, values });
        }
        r.end()?;
        out.t_max = t_max;
        out.vvs = vvs;
        at += 8 + len;
        out.good_len = at as u64;
    }
    Ok(out)
}

impl HealthyFile {
    pub(crate) fn create(path: &Path, dim: usize, parts: u32, bucket_ms: u64) -> Result<Self> {
        let mut w = Writer::with_capacity(HEADER);
        w.raw(MAGIC).u32(dim as u32).u32(parts).u64(bucket_ms);
        write_new(path, &w.0)?;
        Self::open(path, HEADER as u64)
    }

    pub(crate) fn open(path: &Path, len: u64) -> Result<Self> {
        let file =
            OpenOptions::new().append(true).open(path).map_err(|e| io(path, "opening the", e))?;
        // A torn last block is cut off, so that the next append follows the good part; its
        // bytes are kept beside the file first (a last block that fails its checksum at full
        // length may be damage rather than a crash, and is not ours to delete).
        let size = file.metadata().map_err(|e| io(path, "reading the size of the", e))?.len();
        if size > len {
            let mut tail = Vec::new();
            File::open(path)
                .and_then(|mut f| {
                    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(len))?;
                    f.read_to_end(&mut tail)
                })
                .map_err(|e| io(path, "reading the torn end of the", e))?;
            let torn = path.with_extension(format!("witness.torn-{len}"));
            write_new(&torn, &tail)?;
            file.set_len(len).map_err(|e| io(path, "cutting the torn end of the", e))?;
        }
        Ok(Self { path: path.to_owned(), file, len, stale: false })
    }

    pub(crate) fn append(&mut self, b: &[u8]) -> Result<()> {
        let done = self.file.write_all(b).and_then(|()| self.file.sync_data());
        if let Err(e) = done {
            self.stale = true;
            // What was written of the block goes, so that a later append follows the good part.
            let _ = self.file.set_len(self.len);
            return Err(io(&self.path, "appending to the", e));
        }
        self.len += b.len() as u64;
        Ok(())
    }
}

/// Writes `bytes` to `path` through a synced temporary file and a rename.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("witness.tmp");
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, path));
    written.map_err(|e| io(path, "writing the", e))?;
    if let Some(dir) = path.parent() {
        // The rename itself, durable.
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

impl TableWitness {
    pub(crate) fn stats(&self) -> WitnessStats {
        let log = self.log.lock();
        WitnessStats {
            t_max_ms: log.t_max(),
            buckets: log.buckets(),
            logged_keys: log.logged_keys().len(),
            healthy_rows: log.healthy().len(),
            file_bytes: self.file.lock().as_ref().map_or(0, |f| f.len),
            restored_rows: self.restored,
        }
    }
}
