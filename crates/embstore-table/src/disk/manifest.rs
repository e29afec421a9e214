//! The manifest: a store directory's log of edits — which tables exist with which config and
//! step, and which segment files hold their rows.
//!
//! ```text
//! MANIFEST   header: magic "EMBMAN01", format u32, crc32 (of the 12 bytes before it)
//!            records: len u32, crc32 u32 (of len), crc32 u32 (of the payload),
//!            payload = count u32, edits
//! edit       tag u8, then the fields of that edit (u64 little-endian; strings as len u32 + UTF-8)
//! ```
//!
//! A record is one atomic batch of edits: appended, then fsynced; an edit that names a segment
//! is written only after that segment is sealed and fsynced. On open, the edits are replayed;
//! a last record that runs past the end of the file (or, complete, fails its checksum at the
//! very end) is the torn tail of an append that never completed and is dropped (and
//! reported); a damaged length, or a damaged record followed by more data, is corruption —
//! the length has its own checksum so that a flipped bit there never passes for a torn tail.
//! A tail is only torn when the records before it describe a store: a manifest without one
//! complete record (every manifest starts with a snapshot) is corruption. When the log grows past [`REWRITE_BYTES`] it is rewritten as a
//! snapshot of the state into `MANIFEST.tmp`, fsynced, and renamed over `MANIFEST`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embstore_common::bytes::{Reader, Writer};

use crate::disk::vfs::{Vfs, WriteFile};
use crate::{Error, ErrorKind, Result};

const MAGIC: &[u8; 8] = b"EMBMAN01";
/// The newest manifest format this build writes and reads: 2 once the store has reserved seqs
/// for spills ([`Edit::SpillRange`]), which builds reading only format 1 do not know; 1 before.
pub(crate) const FORMAT: u32 = 2;
/// The format of a manifest that records no spill range (read by every build).
const FORMAT_NO_SPILLS: u32 = 1;
const HEADER_BYTES: usize = 16;
/// The log is rewritten as a snapshot once it is this long.
const REWRITE_BYTES: u64 = 4 << 20;
/// The manifest's file name in a store directory.
pub(crate) const MANIFEST: &str = "MANIFEST";
pub(crate) const MANIFEST_TMP: &str = "MANIFEST.tmp";

/// One change to the store's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Edit {
    /// A table and its config (`config::config_text`).
    CreateTable {
        id: u64,
        name: String,
        config: String,
    },
    DropTable {
        id: u64,
    },
    /// A sealed segment of `table`.
    AddFile {
        table: u64,
        seq: u64,
        records: u64,
        bytes: u64,
    },
    DeleteFile {
        table: u64,
        seq: u64,
    },
    /// The table's files below `seq` hold nothing live any more (after `clear` or a rewrite
    /// of every row): they leave the table's file set.
    Supersede {
        table: u64,
        below: u64,
    },
    /// The table's step counter.
    Step {
        table: u64,
        step: u64,
    },
    /// The table's live rows as of this record (for `inspect`; recovery counts them itself).
    Rows {
        table: u64,
        rows: u64,
    },
    /// This directory is a checkpoint: its id, the newest segment seq it holds, and the
    /// checkpoint it is an increment on (`parent_id` 0: a full checkpoint).
    Checkpoint {
        id: u64,
        max_seq: u64,
        parent_id: u64,
        parent_max_seq: u64,
        parent_path: String,
    },
    /// The store's identity (random, made at creation): an incremental checkpoint must build on
    /// a checkpoint of the same store, whose seqs it shares.
    StoreId {
        id: u64,
    },
    /// Ids and seqs below these were handed out (kept in snapshots, so that a seq is never
    /// reused after its file is deleted).
    Counters {
        next_table_id: u64,
        next_seq: u64,
    },
    /// Seqs below `below` may name spills: segments an eviction wrote without fsync, which no
    /// record names until a flush adopts them (`durable::spill`). One record reserves a range
    /// of seqs for many evictions; recovery deletes an unnamed segment in it as an unadopted
    /// spill (`durable::orphans`).
    SpillRange {
        below: u64,
    },
}

/// A segment file of a table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileEntry {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
}

/// A table as the manifest knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableEntry {
    pub(crate) name: String,
    pub(crate) config: String,
    pub(crate) step: u64,
    /// Live rows at the last record that said (`Edit::Rows`).
    pub(crate) rows: u64,
    /// Files by seq; replayed in this order.
    pub(crate) files: BTreeMap<u64, FileEntry>,
    /// Files below this seq were superseded (0: none).
    pub(crate) superseded_below: u64,
}

/// A checkpoint's identity (see [`Edit::Checkpoint`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CheckpointInfo {
    pub(crate) id: u64,
    pub(crate) max_seq: u64,
    pub(crate) parent_id: u64,
    pub(crate) parent_max_seq: u64,
    pub(crate) parent_path: String,
}

/// The state the edits add up to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) tables: BTreeMap<u64, TableEntry>,
    /// The next table id and segment seq to hand out.
    pub(crate) next_table_id: u64,
    pub(crate) next_seq: u64,
    pub(crate) checkpoint: Option<CheckpointInfo>,
    pub(crate) store_id: u64,
    /// Seqs below this were reserved for spills ([`Edit::SpillRange`]; 0: none ever were).
    /// `next_seq` is the seq handed out next; while it is below this, an eviction's segment
    /// needs no record to reserve its seq.
    pub(crate) spill_below: u64,
}

impl State {
    /// Applies `e`; fails on an edit that does not fit the state (a damaged log).
    pub(crate) fn apply(&mut self, e: &Edit) -> Result<()> {
        let missing = |id: u64| Error::corrupt(format!("manifest names unknown table id {id}"));
        match e {
            Edit::CreateTable { id, name, config } => {
                let entry = TableEntry {
                    name: name.clone(),
                    config: config.clone(),
                    ..TableEntry::default()
                };
                if self.tables.insert(*id, entry).is_some() {
                    return Err(Error::corrupt(format!("manifest creates table id {id} twice")));
                }
                self.next_table_id = self.next_table_id.max(id + 1);
            }
            Edit::DropTable { id } => {
                self.tables.remove(id).ok_or_else(|| missing(*id))?;
            }
            Edit::AddFile { table, seq, records, bytes } => {
                let t = self.tables.get_mut(table).ok_or_else(|| missing(*table))?;
                t.files.insert(*seq, FileEntry { records: *records, bytes: *bytes });
                self.next_seq = self.next_seq.max(seq + 1);
            }
            Edit::DeleteFile { table, seq } => {
                let t = self.tables.get_mut(table).ok_or_else(|| missing(*table))?;
                t.files.remove(seq);
            }
            Edit::Supersede { table, below } => {
                let t = self.tables.get_mut(table).ok_or_else(|| missing(*table))?;
                t.files.retain(|&seq, _| seq >= *below);
                t.superseded_below = t.superseded_below.max(*below);
                self.next_seq = self.next_seq.max(*below);
            }
            Edit::Step { table, step } => {
                self.tables.get_mut(table).ok_or_else(|| missing(*table))?.step = *step;
            }
            Edit::Rows { table, rows } => {
                self.tables.get_mut(table).ok_or_else(|| missing(*table))?.rows = *rows;
            }
            Edit::StoreId { id } => self.store_id = *id,
            Edit::Counters { next_table_id, next_seq } => {
                self.next_table_id = self.next_table_id.max(*next_table_id);
                self.next_seq = self.next_seq.max(*next_seq);
            }
            Edit::SpillRange { below } => self.spill_below = self.spill_below.max(*below),
            Edit::Checkpoint { id, max_seq, parent_id, parent_max_seq, parent_path } => {
                self.checkpoint = Some(CheckpointInfo {
                    id: *id,
                    max_seq: *max_seq,
                    parent_id: *parent_id,
                    parent_max_seq: *parent_max_seq,
                    parent_path: parent_path.clone(),
                });
            }
        }
        Ok(())
    }

    /// The edits that rebuild this state from nothing.
    pub(crate) fn snapshot(&self) -> Vec<Edit> {
        let mut edits =
            vec![Edit::Counters { next_table_id: self.next_table_id, next_seq: self.next_seq }];
        if self.store_id != 0 {
            edits.push(Edit::StoreId { id: self.store_id });
        }
        if self.spill_below != 0 {
            edits.push(Edit::SpillRange { below: self.spill_below });
        }
        if let Some(c) = &self.checkpoint {
            edits.push(Edit::Checkpoint {
                id: c.id,
                max_seq: c.max_seq,
                parent_id: c.parent_id,
                parent_max_seq: c.parent_max_seq,
                parent_path: c.parent_path.clone(),
            });
        }
        for (&id, t) in &self.tables {
            edits.push(Edit::CreateTable { id, name: t.name.clone(), config: t.config.clone() });
            edits.push(Edit::Step { table: id, step: t.step });
            edits.push(Edit::Rows { table: id, rows: t.rows });
            if t.superseded_below > 0 {
                edits.push(Edit::Supersede { table: id, below: t.superseded_below });
            }
            for (&seq, f) in &t.files {
                edits.push(Edit::AddFile { table: id, seq, records: f.records, bytes: f.bytes });
            }
        }
        edits
    }

    /// The table called `name`.
    pub(crate) fn table_id(&self, name: &str) -> Option<u64> {
        self.tables.iter().find(|(_, t)| t.name == name).map(|(&id, _)| id)
    }
}

/// What opening a manifest found besides the state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OpenReport {
    /// Bytes of a torn last record, dropped.
    pub(crate) torn_bytes: u64,
    /// Records replayed.
    pub(crate) records: u64,
    /// The format in the file's header.
    pub(crate) format: u32,
}

/// The open manifest of a store directory, for appending.
pub(crate) struct Manifest {
    dir: PathBuf,
    file: Box<dyn WriteFile>,
    len: u64,
    /// The format in the file's header: a format-1 manifest is rewritten (as format 2) before
    /// a spill range is recorded in it.
    format: u32,
    /// An append failed part-way (a full disk): the file may end in part of a record, so the
    /// next append rewrites the whole manifest instead of adding to it.
    poisoned: bool,
}

impl std::fmt::Debug for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manifest").field("dir", &self.dir).field("len", &self.len).finish()
    }
}

impl Manifest {
    /// Writes a manifest holding `state` into `dir` (replacing any), durably.
    pub(crate) fn create(vfs: &dyn Vfs, dir: &Path, state: &State) -> Result<Self> {
        let tmp = dir.join(MANIFEST_TMP);
        let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
        let _ = vfs.remove(&tmp);
        let mut file = vfs.create(&tmp).map_err(|e| io("create", e))?;
        let format = if state.spill_below != 0 { FORMAT } else { FORMAT_NO_SPILLS };
        let mut bytes = header(format);
        bytes.extend_from_slice(&encode_record(&state.snapshot()));
        file.write_all(&bytes).map_err(|e| io("write", e))?;
        file.sync().map_err(|e| io("fsync", e))?;
        drop(file);
        let path = dir.join(MANIFEST);
        vfs.rename(&tmp, &path)
            .map_err(|e| Error::io(format!("rename to {}", path.display()), e))?;
        vfs.sync_dir(dir).map_err(|e| Error::io(format!("sync directory {}", dir.display()), e))?;
        let file =
            vfs.append(&path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        Ok(Self { dir: dir.to_path_buf(), file, len: bytes.len() as u64, format, poisoned: false })
    }

    /// Reads the manifest in `dir`; with a torn tail, rewrites it without the tail.
    pub(crate) fn open(vfs: &dyn Vfs, dir: &Path) -> Result<(Self, State, OpenReport)> {
        let (state, report) = read(vfs, dir)?;
        let path = dir.join(MANIFEST);
        if report.torn_bytes > 0 {
            let m = Self::create(vfs, dir, &state)?;
            return Ok((m, state, report));
        }
        let file =
            vfs.append(&path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let len = vfs
            .open(&path)
            .and_then(|f| f.size())
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let format = report.format;
        Ok((Self { dir: dir.to_path_buf(), file, len, format, poisoned: false }, state, report))
    }

    /// Rewrites the manifest from `state` if an append failed since the last write (the file
    /// may end in part of a record), so that it records every seq handed out — those of
    /// segments whose record failed included — before another segment is written. Without
    /// this, a second segment could land while no manifest record accounts for the first, and
    /// a crash would leave two segments recovery cannot prove superseded.
    pub(crate) fn heal(&mut self, vfs: &dyn Vfs, state: &State) -> Result<()> {
        if self.poisoned {
            *self = Self::create(vfs, &self.dir, state)?;
        }
        Ok(())
    }

    /// Appends `edits` as one record and fsyncs it; they are durable when this returns.
    /// `state` (with the edits applied) is written out as a fresh snapshot instead when the
    /// log has grown long.
    pub(crate) fn append(&mut self, vfs: &dyn Vfs, edits: &[Edit], state: &State) -> Result<()> {
        let new_format = self.format < FORMAT && state.spill_below != 0;
        if self.len > REWRITE_BYTES || self.poisoned || new_format {
            *self = Self::create(vfs, &self.dir, state)?;
            return Ok(());
        }
        let rec = encode_record(edits);
        let path = self.dir.join(MANIFEST);
        let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        let written = self.file.write_all(&rec).map_err(|e| io("write", e));
        let synced = written.and_then(|()| self.file.sync().map_err(|e| io("fsync", e)));
        if let Err(e) = synced {
            self.poisoned = true;
            return Err(e);
        }
        self.len += rec.len() as u64;
        Ok(())
    }
}

/// Replays the manifest in `dir` (read only).
pub(crate) fn read(vfs: &dyn Vfs, dir: &Path) -> Result<(State, OpenReport)> {
    let path = dir.join(MANIFEST);
    let io = |e| Error::io(format!("read {}", path.display()), e);
    let file = vfs.open(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound && !dir.is_dir() {
            Error::new(
                ErrorKind::NotFound,
                format!("no store or checkpoint at {}: no such directory", dir.display()),
            )
        } else if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(format!("{} is missing", path.display()))
        } else {
            io(e)
        }
    })?;
    let len = file.size().map_err(io)? as usize;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0).map_err(io)?;
    let bad = |what: String| Error::corrupt(format!("{}: {what}", path.display()));
    if len < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err(bad("not a manifest (bad magic)".into()));
    }
    if u32_at(&bytes, 12) != crc32fast::hash(&bytes[..12]) {
        return Err(bad("header checksum mismatch".into()));
    }
    let format = u32_at(&bytes, 8);
    if format > FORMAT {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{}: manifest format {format} is newer than this build reads ({FORMAT})",
                path.display()
            ),
        ));
    }
    let mut state = State::default();
    let mut report = OpenReport { format, ..OpenReport::default() };
    let mut at = HEADER_BYTES;
    while at < len {
        let torn = |report: &mut OpenReport| report.torn_bytes = (len - at) as u64;
        if len - at < 12 {
            torn(&mut report);
            break;
        }
        if u32_at(&bytes, at + 4) != crc32fast::hash(&bytes[at..at + 4]) {
            return Err(bad(format!("record length at byte {at} fails its checksum")));
        }
        let n = u32_at(&bytes, at) as usize;
        let Some(end) = at.checked_add(12 + n).filter(|&e| e <= len) else {
            torn(&mut report);
            break;
        };
        let payload = &bytes[at + 12..end];
        if u32_at(&bytes, at + 8) != crc32fast::hash(payload) {
            if end == len {
                torn(&mut report);
                break;
            }
            return Err(bad(format!("record at byte {at} fails its checksum")));
        }
        for e in decode_record(payload)
            .map_err(|w| bad(format!("record at byte {at}: {}", w.message())))?
        {
            state.apply(&e).map_err(|e| bad(e.message().to_owned()))?;
        }
        report.records += 1;
        at = end;
    }
    if report.records == 0 {
        // Every manifest starts with a complete snapshot record (`Manifest::create`): without
        // one it cannot say which segments hold the store, so it is damage, not a torn tail.
        return Err(bad(format!(
            "no complete record ({len} bytes: truncated?); it cannot name the store's segments"
        )));
    }
    Ok((state, report))
}

fn header(format: u32) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&format.to_le_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn encode_record(edits: &[Edit]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(edits.len() as u32);
    for e in edits {
        match e {
            Edit::CreateTable { id, name, config } => {
                w.u8(1);
                w.u64(*id);
                w.str(name);
                w.str(config);
            }
            Edit::DropTable { id } => {
                w.u8(2);
                w.u64(*id);
            }
            Edit::AddFile { table, seq, records, bytes } => {
                w.u8(3);
                w.u64(*table).u64(*seq).u64(*records).u64(*bytes);
            }
            Edit::DeleteFile { table, seq } => {
                w.u8(4);
                w.u64(*table).u64(*seq);
            }
            Edit::Supersede { table, below } => {
                w.u8(5);
                w.u64(*table).u64(*below);
            }
            Edit::Step { table, step } => {
                w.u8(6);
                w.u64(*table).u64(*step);
            }
            Edit::Rows { table, rows } => {
                w.u8(10);
                w.u64(*table).u64(*rows);
            }
            Edit::Checkpoint { id, max_seq, parent_id, parent_max_seq, parent_path } => {
                w.u8(7);
                w.u64(*id).u64(*max_seq).u64(*parent_id).u64(*parent_max_seq);
                w.str(parent_path);
            }
            Edit::StoreId { id } => {
                w.u8(9);
                w.u64(*id);
            }
            Edit::Counters { next_table_id, next_seq } => {
                w.u8(8);
                w.u64(*next_table_id).u64(*next_seq);
            }
            Edit::SpillRange { below } => {
                w.u8(11);
                w.u64(*below);
            }
        }
    }
    let p = w.0;
    let mut rec = (p.len() as u32).to_le_bytes().to_vec();
    rec.extend_from_slice(&crc32fast::hash(&rec).to_le_bytes());
    rec.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    rec.extend_from_slice(&p);
    rec
}

fn decode_record(p: &[u8]) -> Result<Vec<Edit>> {
    let mut r = Reader::new(p, "the record");
    let n = r.u32()?;
    let mut edits = Vec::with_capacity(n.min(1 << 16) as usize);
    for _ in 0..n {
        let e = match r.u8()? {
            1 => Edit::CreateTable { id: r.u64()?, name: r.str()?, config: r.str()? },
            2 => Edit::DropTable { id: r.u64()? },
            3 => {
                Edit::AddFile { table: r.u64()?, seq: r.u64()?, records: r.u64()?, bytes: r.u64()? }
            }
            4 => Edit::DeleteFile { table: r.u64()?, seq: r.u64()? },
            5 => Edit::Supersede { table: r.u64()?, below: r.u64()? },
            6 => Edit::Step { table: r.u64()?, step: r.u64()? },
            7 => Edit::Checkpoint {
                id: r.u64()?,
                max_seq: r.u64()?,
                parent_id: r.u64()?,
                parent_max_seq: r.u64()?,
                parent_path: r.str()?,
            },
            8 => Edit::Counters { next_table_id: r.u64()?, next_seq: r.u64()? },
            9 => Edit::StoreId { id: r.u64()? },
            10 => Edit::Rows { table: r.u64()?, rows: r.u64()? },
            11 => Edit::SpillRange { below: r.u64()? },
            t => return Err(r.error(format!("holds an unknown edit tag {t}"))),
        };
        edits.push(e);
    }
    r.end()?;
    Ok(edits)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::vfs::RealFs;

    fn edits() -> Vec<Edit> {
        vec![
            Edit::CreateTable { id: 1, name: "user".into(), config: "name=user\n".into() },
            Edit::AddFile { table: 1, seq: 3, records: 10, bytes: 9000 },
            Edit::Step { table: 1, step: 42 },
        ]
    }

    #[test]
    fn edits_replay_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::create(&RealFs, dir.path(), &State::default()).unwrap();
        let mut want = State::default();
        edits().iter().for_each(|e| want.apply(e).unwrap());
        m.append(&RealFs, &edits(), &want).unwrap();
        let more = [Edit::AddFile { table: 1, seq: 4, records: 1, bytes: 10 }];
        m.append(&RealFs, &more, &want).unwrap();
        drop(m);
        let path = dir.path().join(MANIFEST);
        let full = std::fs::read(&path).unwrap();
        let (state, report) = read(&RealFs, dir.path()).unwrap();
        assert_eq!(report.torn_bytes, 0);
        assert_eq!(state.tables[&1].files.len(), 2);
        assert_eq!((state.next_seq, state.next_table_id, state.tables[&1].step), (5, 2, 42));
        // Every cut inside the last record loses that record only.
        let last = encode_record(&more).len();
        for cut in full.len() - last + 1..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            let (m, s, r) = Manifest::open(&RealFs, dir.path()).unwrap();
            drop(m);
            assert_eq!((s, r.torn_bytes), (want.clone(), (cut - (full.len() - last)) as u64));
            // The rewrite dropped the tail: the next open finds none.
            assert_eq!(read(&RealFs, dir.path()).unwrap().1.torn_bytes, 0);
        }
    }

    #[test]
    fn a_damaged_record_before_the_end_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::create(&RealFs, dir.path(), &State::default()).unwrap();
        let mut st = State::default();
        edits().iter().for_each(|e| st.apply(e).unwrap());
        m.append(&RealFs, &edits(), &st).unwrap();
        m.append(&RealFs, &[Edit::Step { table: 1, step: 1 }], &st).unwrap();
        let path = dir.path().join(MANIFEST);
        let mut bytes = std::fs::read(&path).unwrap();
        // A flip anywhere before the last record: in a length, a checksum or a payload.
        for at in
            HEADER_BYTES..bytes.len() - encode_record(&[Edit::Step { table: 1, step: 1 }]).len()
        {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            let err = read(&RealFs, dir.path()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corruption, "flip at {at}: {err}");
        }
        bytes[0] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&RealFs, dir.path()).unwrap_err().kind(), ErrorKind::Corruption);
        std::fs::remove_file(&path).unwrap();
        let err = read(&RealFs, dir.path()).unwrap_err();
        assert!(err.message().contains("missing"), "{err}");
    }

    #[test]
    fn supersede_and_snapshot_round_trip() {
        let mut s = State::default();
        edits().iter().for_each(|e| s.apply(e).unwrap());
        s.apply(&Edit::AddFile { table: 1, seq: 9, records: 1, bytes: 1 }).unwrap();
        s.apply(&Edit::Supersede { table: 1, below: 9 }).unwrap();
        s.apply(&Edit::StoreId { id: 77 }).unwrap();
        assert_eq!(s.tables[&1].files.keys().copied().collect::<Vec<_>>(), vec![9]);
        let mut again = State::default();
        s.snapshot().iter().for_each(|e| again.apply(e).unwrap());
        assert_eq!(again, s);
        assert!(s.apply(&Edit::DropTable { id: 5 }).is_err());
    }
}
