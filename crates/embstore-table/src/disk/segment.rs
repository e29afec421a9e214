//! Parameter files ("segments"): immutable, append-only files of fixed-size row records, the
//! disk tier's unit of writing (Baidu SSD-PS §6; `docs/storage.md` has the format).
//!
//! ```text
//! page 0 (4 KiB)  header: magic "EMBSEG01", format u32, dim u32, state_dim u32,
//!                 record_bytes u32, seq u64, table_id u64, kind u32 (1 flush, 2 compaction,
//!                 3 spill), pad u32, created_ms u64,
//!                 crc32 (of the 56 bytes before it); zeros to 4096
//! records         at 4096 + i × record_bytes, record_bytes = 44 + 4 (dim + state_dim) rounded
//!                 up to 64: key u64, timestamp u64, replica u32, flags u32 (bit 0: tombstone),
//!                 update_count u64, last_update_ms u64, values dim × f32, state state_dim × f32,
//!                 crc32 (of the record before it), zeros
//! footer          n u64, then per record key u64, timestamp u64, replica u32, flags u32;
//!                 crc32 (of the footer before it)
//! trailer (32 B)  footer_offset u64, n u64, magic "EMBSEGND", crc32 (of the 24 bytes before
//!                 it), pad u32
//! ```
//!
//! All integers little-endian. A file is valid only with its trailer: a segment is written
//! front to back and fsynced before the manifest names it, so a file without a valid trailer is
//! the torn tail of a write that never completed. Every record carries its own checksum and
//! key, so a single record read from anywhere in a file is checked on its own.

use std::path::{Path, PathBuf};

use crate::disk::vfs::{ReadFile, Vfs, WriteFile};
use crate::{Error, ErrorKind, Result, RowMeta, Version};

const MAGIC: &[u8; 8] = b"EMBSEG01";
const END_MAGIC: &[u8; 8] = b"EMBSEGND";
/// The segment format this build writes and reads.
pub(crate) const FORMAT: u32 = 1;
/// Bytes of the header page.
pub(crate) const HEADER_BYTES: u64 = 4096;
const HEADER_FIELDS: usize = 56;
/// Fixed part of a record before its floats.
const RECORD_PREFIX: usize = 40;
const FOOTER_ENTRY: usize = 24;
const TRAILER_BYTES: u64 = 32;
/// Records are buffered and written in pieces of about this size.
const WRITE_CHUNK: usize = 1 << 20;
/// Records one segment may hold: a row's disk location keeps the record number in 31 bits.
pub(crate) const MAX_RECORDS: u64 = 1 << 31;
/// Record flag: the row was removed.
pub(crate) const TOMBSTONE: u32 = 1;

/// Why a segment was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentKind {
    /// Rows written by `flush`.
    Flush = 1,
    /// Every live row of a table, rewritten by compaction.
    Compaction = 2,
    /// Dirty rows an eviction wrote, durable once a flush adopts it (names it in a record):
    /// until then recovery may prove it superseded by this mark and its seq.
    Spill = 3,
}

/// What a segment's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub(crate) dim: u32,
    pub(crate) state_dim: u32,
    pub(crate) seq: u64,
    pub(crate) table_id: u64,
    pub(crate) kind: SegmentKind,
    pub(crate) created_ms: u64,
}

impl SegmentHeader {
    pub(crate) fn record_bytes(&self) -> usize {
        record_bytes(self.dim as usize, self.state_dim as usize)
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT.to_le_bytes());
        b.extend_from_slice(&self.dim.to_le_bytes());
        b.extend_from_slice(&self.state_dim.to_le_bytes());
        b.extend_from_slice(&(self.record_bytes() as u32).to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.table_id.to_le_bytes());
        b.extend_from_slice(&(self.kind as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.created_ms.to_le_bytes());
        debug_assert_eq!(b.len(), HEADER_FIELDS);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.resize(HEADER_BYTES as usize, 0);
        b
    }

    fn decode(b: &[u8], path: &Path) -> Result<Self> {
        let bad =
            |what: &str| Error::corrupt(format!("{}: segment header: {what}", path.display()));
        if &b[..8] != MAGIC {
            return Err(bad("bad magic (not a segment file)"));
        }
        if u32_at(b, HEADER_FIELDS) != crc32fast::hash(&b[..HEADER_FIELDS]) {
            return Err(bad("checksum mismatch"));
        }
        let format = u32_at(b, 8);
        if format > FORMAT {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{}: segment format {format} is newer than this build reads ({FORMAT})",
                    path.display()
                ),
            ));
        }
        let kind = match u32_at(b, 40) {
            1 => SegmentKind::Flush,
            2 => SegmentKind::Compaction,
            3 => SegmentKind::Spill,
            k => return Err(bad(&format!("unknown kind {k}"))),
        };
        let h = Self {
            dim: u32_at(b, 12),
            state_dim: u32_at(b, 16),
            seq: u64_at(b, 24),
            table_id: u64_at(b, 32),
            kind,
            created_ms: u64_at(b, 48),
        };
        if h.dim == 0 || u32_at(b, 20) as usize != h.record_bytes() {
            return Err(bad("record size does not match dim and state_dim"));
        }
        Ok(h)
    }
}

/// Bytes of one record of `dim` values and `state_dim` state floats: 64-byte aligned.
pub(crate) fn record_bytes(dim: usize, state_dim: usize) -> usize {
    (RECORD_PREFIX + 4 * (dim + state_dim) + 4).next_multiple_of(64)
}

/// One row read back from a segment.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Record {
    pub(crate) key: u64,
    pub(crate) meta: RowMeta,
    pub(crate) tombstone: bool,
    pub(crate) values: Vec<f32>,
    pub(crate) state: Vec<f32>,
}

/// Where a segment's records and its size stand once written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SegmentInfo {
    /// Records, tombstones included.
    pub(crate) records: u64,
    pub(crate) tombstones: u64,
    pub(crate) bytes: u64,
}

/// Writes one segment front to back; [`SegmentWriter::finish`] seals and fsyncs it.
pub(crate) struct SegmentWriter {
    file: Box<dyn WriteFile>,
    path: PathBuf,
    header: SegmentHeader,
    buf: Vec<u8>,
    footer: Vec<u8>,
    info: SegmentInfo,
}

impl std::fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentWriter").field("path", &self.path).field("info", &self.info).finish()
    }
}

impl SegmentWriter {
    /// Creates `path` (which must not exist) and writes the header.
    pub(crate) fn create(vfs: &dyn Vfs, path: &Path, header: SegmentHeader) -> Result<Self> {
        let file =
            vfs.create(path).map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        let mut w = Self {
            file,
            path: path.to_path_buf(),
            header,
            buf: Vec::with_capacity(WRITE_CHUNK + header.record_bytes()),
            footer: Vec::new(),
            info: SegmentInfo { bytes: HEADER_BYTES, ..SegmentInfo::default() },
        };
        w.buf.extend_from_slice(&header.encode());
        Ok(w)
    }

    /// The segment's seq.
    pub(crate) fn seq(&self) -> u64 {
        self.header.seq
    }

    /// Records so far (the next record's number).
    pub(crate) fn records(&self) -> u64 {
        self.info.records
    }

    /// Appends a row.
    pub(crate) fn push(
        &mut self,
        key: u64,
        meta: &RowMeta,
        values: &[f32],
        state: &[f32],
    ) -> Result<()> {
        debug_assert_eq!(values.len(), self.header.dim as usize);
        debug_assert_eq!(state.len(), self.header.state_dim as usize);
        self.push_record(key, meta, 0, values, state)
    }

    /// Appends the removal of `key` at `version`.
    pub(crate) fn push_tombstone(&mut self, key: u64, version: Version) -> Result<()> {
        let meta = RowMeta { version, update_count: 0, last_update_ms: version.ms() };
        let (d, s) = (self.header.dim as usize, self.header.state_dim as usize);
        self.info.tombstones += 1;
        self.push_record(key, &meta, TOMBSTONE, &vec![0.0; d], &vec![0.0; s])
    }

    fn push_record(
        &mut self,
        key: u64,
        meta: &RowMeta,
        flags: u32,
        values: &[f32],
        state: &[f32],
    ) -> Result<()> {
        if self.info.records >= MAX_RECORDS {
            return Err(Error::new(
                ErrorKind::Capacity,
                format!("a segment holds at most {MAX_RECORDS} records"),
            ));
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(&key.to_le_bytes());
        self.buf.extend_from_slice(&meta.version.timestamp.to_le_bytes());
        self.buf.extend_from_slice(&meta.version.replica.to_le_bytes());
        self.buf.extend_from_slice(&flags.to_le_bytes());
        self.buf.extend_from_slice(&meta.update_count.to_le_bytes());
        self.buf.extend_from_slice(&meta.last_update_ms.to_le_bytes());
        let floats = self.buf.len();
        self.buf.resize(floats + 4 * (values.len() + state.len()), 0);
        for (dst, v) in self.buf[floats..].chunks_exact_mut(4).zip(values.iter().chain(state)) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32fast::hash(&self.buf[start..]);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf.resize(start + self.header.record_bytes(), 0);
        self.footer.extend_from_slice(&self.buf[start..start + 24]);
        self.info.records += 1;
        self.info.bytes += self.header.record_bytes() as u64;
        if self.buf.len() >= WRITE_CHUNK {
            self.write_buf()?;
        }
        Ok(())
    }

    fn write_buf(&mut self) -> Result<()> {
        self.file
            .write_all(&self.buf)
            .map_err(|e| Error::io(format!("write {}", self.path.display()), e))?;
        self.buf.clear();
        Ok(())
    }

    /// Writes the footer and trailer and fsyncs the file: from here on it is immutable.
    pub(crate) fn finish(self) -> Result<SegmentInfo> {
        self.seal(true)
    }

    /// Writes the footer and trailer; with `sync`, fsyncs the file. Unsynced (a spill), the
    /// file is complete for readers but not durable until something fsyncs it.
    pub(crate) fn seal(mut self, sync: bool) -> Result<SegmentInfo> {
        let footer_off = self.info.bytes;
        let n = self.info.records;
        let mut footer = Vec::with_capacity(8 + self.footer.len() + 4);
        footer.extend_from_slice(&n.to_le_bytes());
        footer.extend_from_slice(&self.footer);
        let crc = crc32fast::hash(&footer);
        footer.extend_from_slice(&crc.to_le_bytes());
        self.buf.extend_from_slice(&footer);
        let mut trailer = Vec::with_capacity(TRAILER_BYTES as usize);
        trailer.extend_from_slice(&footer_off.to_le_bytes());
        trailer.extend_from_slice(&n.to_le_bytes());
        trailer.extend_from_slice(END_MAGIC);
        let crc = crc32fast::hash(&trailer);
        trailer.extend_from_slice(&crc.to_le_bytes());
        trailer.extend_from_slice(&0u32.to_le_bytes());
        self.buf.extend_from_slice(&trailer);
        self.write_buf()?;
        if sync {
            self.file.sync().map_err(|e| Error::io(format!("fsync {}", self.path.display()), e))?;
        }
        self.info.bytes += footer.len() as u64 + TRAILER_BYTES;
        Ok(self.info)
    }
}

/// A sealed segment, open for reading.
pub(crate) struct SegmentReader {
    file: Box<dyn ReadFile>,
    /// The same file opened for batched O_DIRECT reads (`disk::io`), where the file layer
    /// offers it, and the alignment its reads take (`disk::io::read_alignment`).
    direct: Option<(std::fs::File, usize)>,
    path: PathBuf,
    header: SegmentHeader,
    records: u64,
    len: u64,
}

impl std::fmt::Debug for SegmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentReader")
            .field("path", &self.path)
            .field("records", &self.records)
            .finish()
    }
}

/// The header of the segment at `path`, or `None` when the file is too short to hold one (a
/// write a crash cut short before its header landed).
pub(crate) fn read_header(vfs: &dyn Vfs, path: &Path) -> Result<Option<SegmentHeader>> {
    let io = |e| Error::io(format!("read {}", path.display()), e);
    let file = vfs.open(path).map_err(io)?;
    if file.size().map_err(io)? < HEADER_BYTES {
        return Ok(None);
    }
    let mut head = vec![0u8; HEADER_BYTES as usize];
    file.read_exact_at(&mut head, 0).map_err(io)?;
    SegmentHeader::decode(&head, path).map(Some)
}

impl SegmentReader {
    /// Opens `path` and checks its header and trailer.
    pub(crate) fn open(vfs: &dyn Vfs, path: &Path) -> Result<Self> {
        let io = |e| Error::io(format!("read {}", path.display()), e);
        let file = vfs.open(path).map_err(io)?;
        let len = file.size().map_err(io)?;
        let bad = |what: &str| Error::corrupt(format!("{}: {what}", path.display()));
        if len < HEADER_BYTES + 8 + 4 + TRAILER_BYTES {
            return Err(bad("segment too short to be sealed (torn write?)"));
        }
        let mut head = vec![0u8; HEADER_BYTES as usize];
        file.read_exact_at(&mut head, 0).map_err(io)?;
        let header = SegmentHeader::decode(&head, path)?;
        let mut t = [0u8; TRAILER_BYTES as usize];
        file.read_exact_at(&mut t, len - TRAILER_BYTES).map_err(io)?;
        if &t[16..24] != END_MAGIC || u32_at(&t, 24) != crc32fast::hash(&t[..24]) {
            return Err(bad("no valid trailer (the segment was never sealed, or is damaged)"));
        }
        let (footer_off, records) = (u64_at(&t, 0), u64_at(&t, 8));
        let rb = header.record_bytes() as u64;
        let expect_footer = records.checked_mul(rb).and_then(|b| b.checked_add(HEADER_BYTES));
        let expect_len = records
            .checked_mul(FOOTER_ENTRY as u64)
            .and_then(|f| f.checked_add(footer_off.checked_add(12 + TRAILER_BYTES)?));
        if expect_footer != Some(footer_off) || expect_len != Some(len) || records > MAX_RECORDS {
            return Err(bad("trailer does not match the file's length"));
        }
        Ok(Self { file, direct: None, path: path.to_path_buf(), header, records, len })
    }

    /// [`SegmentReader::open`], with the file also opened for batched direct reads where `vfs`
    /// offers them (the memory tier's cold reads).
    pub(crate) fn open_for_reads(vfs: &dyn Vfs, path: &Path) -> Result<Self> {
        let mut r = Self::open(vfs, path)?;
        r.direct = vfs
            .open_direct(path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?
            .map(|f| {
                let align = crate::disk::io::read_alignment(&f);
                (f, align)
            });
        Ok(r)
    }

    /// Where record `i` is: the byte range that holds it, aligned to the file's read alignment
    /// (the device's logical block: `plan::aligned_range`), and its offset in that range;
    /// `None` without a direct descriptor, or when the range would pass the end of the file.
    pub(crate) fn direct_range(&self, i: u64) -> Option<(std::os::fd::RawFd, u64, usize, usize)> {
        use std::os::fd::AsRawFd;
        let (file, align) = self.direct.as_ref()?;
        let rb = self.header.record_bytes() as u64;
        if i >= self.records {
            return None;
        }
        let (offset, len, skip) =
            crate::disk::plan::aligned_range(HEADER_BYTES + i * rb, rb, *align as u64, self.len)?;
        Some((file.as_raw_fd(), offset, len, skip))
    }

    /// Decodes record `i` from its bytes `raw` (read by the caller), checked.
    pub(crate) fn decode(&self, raw: &[u8], i: u64) -> Result<Record> {
        let mut rec = Record::default();
        self.decode_record(&raw[..self.header.record_bytes()], i, &mut rec)?;
        Ok(rec)
    }

    pub(crate) fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Records in the file, tombstones included.
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// The file's size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.len
    }

    /// Calls `f(i, key, tombstone)` for every record in file order, from the footer alone
    /// (checked against its CRC): what recovery needs to index a segment without reading rows.
    pub(crate) fn for_each_footer(
        &self,
        mut f: impl FnMut(u64, u64, bool, Version) -> Result<()>,
    ) -> Result<()> {
        let rb = self.header.record_bytes() as u64;
        let off = HEADER_BYTES + self.records * rb;
        let mut footer = vec![0u8; 8 + self.records as usize * FOOTER_ENTRY + 4];
        self.file
            .read_exact_at(&mut footer, off)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        let (body, crc) = footer.split_at(footer.len() - 4);
        if u32_at(crc, 0) != crc32fast::hash(body) || u64_at(body, 0) != self.records {
            return Err(Error::corrupt(format!(
                "{}: footer fails its checksum",
                self.path.display()
            )));
        }
        for (i, e) in body[8..].chunks_exact(FOOTER_ENTRY).enumerate() {
            let version = Version { timestamp: u64_at(e, 8), replica: u32_at(e, 16) };
            f(i as u64, u64_at(e, 0), u32_at(e, 20) & TOMBSTONE != 0, version)?;
        }
        Ok(())
    }

    /// Calls `f` with every record in file order, each checked against its checksum; then
    /// checks the footer against the records.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Record) -> Result<()>) -> Result<()> {
        let rb = self.header.record_bytes();
        let per_read = (WRITE_CHUNK / rb).max(1);
        let mut buf = vec![0u8; per_read * rb];
        let mut rec = Record::default();
        let mut footer_check = crc32fast::Hasher::new();
        footer_check.update(&self.records.to_le_bytes());
        let mut i = 0u64;
        while i < self.records {
            let n = per_read.min((self.records - i) as usize);
            let off = HEADER_BYTES + i * rb as u64;
            self.file
                .read_exact_at(&mut buf[..n * rb], off)
                .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
            for (j, raw) in buf[..n * rb].chunks_exact(rb).enumerate() {
                self.decode_record(raw, i + j as u64, &mut rec)?;
                footer_check.update(&raw[..FOOTER_ENTRY]);
                f(&rec)?;
            }
            i += n as u64;
        }
        let off = HEADER_BYTES + self.records * rb as u64;
        let mut footer = vec![0u8; 8 + self.records as usize * FOOTER_ENTRY + 4];
        self.file
            .read_exact_at(&mut footer, off)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        let (body, crc) = footer.split_at(footer.len() - 4);
        let crc = u32_at(crc, 0);
        if crc != crc32fast::hash(body) || crc != footer_check.finalize() {
            return Err(Error::corrupt(format!(
                "{}: footer does not match the records",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Record `i`, checked (one positioned read of `record_bytes`).
    pub(crate) fn read(&self, i: u64) -> Result<Record> {
        if i >= self.records {
            return Err(Error::corrupt(format!(
                "{}: record {i} asked for, the segment holds {}",
                self.path.display(),
                self.records
            )));
        }
        let rb = self.header.record_bytes();
        let mut raw = vec![0u8; rb];
        self.file
            .read_exact_at(&mut raw, HEADER_BYTES + i * rb as u64)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        let mut rec = Record::default();
        self.decode_record(&raw, i, &mut rec)?;
        Ok(rec)
    }

    fn decode_record(&self, raw: &[u8], i: u64, rec: &mut Record) -> Result<()> {
        let (d, s) = (self.header.dim as usize, self.header.state_dim as usize);
        let end = RECORD_PREFIX + 4 * (d + s);
        if u32_at(raw, end) != crc32fast::hash(&raw[..end]) {
            return Err(Error::corrupt(format!(
                "{}: record {i} fails its checksum",
                self.path.display()
            )));
        }
        let flags = u32_at(raw, 20);
        rec.key = u64_at(raw, 0);
        rec.tombstone = flags & TOMBSTONE != 0;
        rec.meta = RowMeta {
            version: Version { timestamp: u64_at(raw, 8), replica: u32_at(raw, 16) },
            update_count: u64_at(raw, 24),
            last_update_ms: u64_at(raw, 32),
        };
        let floats = |from: usize, n: usize, out: &mut Vec<f32>| {
            out.clear();
            out.extend(
                raw[from..from + 4 * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            );
        };
        floats(RECORD_PREFIX, d, &mut rec.values);
        floats(RECORD_PREFIX + 4 * d, s, &mut rec.state);
        Ok(())
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::vfs::RealFs;

    fn header() -> SegmentHeader {
        SegmentHeader {
            dim: 3,
            state_dim: 2,
            seq: 7,
            table_id: 1,
            kind: SegmentKind::Flush,
            created_ms: 1,
        }
    }

    fn write(path: &Path, n: u64) -> SegmentInfo {
        let mut w = SegmentWriter::create(&RealFs, path, header()).unwrap();
        for k in 0..n {
            let meta = RowMeta {
                version: Version { timestamp: k << 16, replica: 2 },
                update_count: k,
                last_update_ms: k,
            };
            w.push(k, &meta, &[k as f32; 3], &[1.0, 2.0]).unwrap();
        }
        w.push_tombstone(99, Version { timestamp: 5 << 16, replica: 1 }).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn records_come_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.seg");
        // Enough rows to span several write chunks.
        let info = write(&path, 20_000);
        assert_eq!((info.records, info.tombstones), (20_001, 1));
        assert_eq!(info.bytes, std::fs::metadata(&path).unwrap().len());
        let r = SegmentReader::open(&RealFs, &path).unwrap();
        assert_eq!((*r.header(), r.records()), (header(), 20_001));
        let mut seen = 0u64;
        r.for_each(|rec| {
            if seen < 20_000 {
                assert_eq!(
                    (rec.key, rec.values[0], rec.meta.update_count),
                    (seen, seen as f32, seen)
                );
                assert!(!rec.tombstone);
            } else {
                assert!(rec.tombstone && rec.key == 99);
            }
            seen += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, 20_001);
        assert_eq!(r.read(5).unwrap().state, vec![1.0, 2.0]);
    }

    #[test]
    fn a_flipped_byte_anywhere_is_corruption_never_a_wrong_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.seg");
        write(&path, 50);
        let good = std::fs::read(&path).unwrap();
        let step = (good.len() / 997).max(1);
        for at in (0..good.len()).step_by(step) {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            let p = dir.path().join(format!("bad-{at}.seg"));
            std::fs::write(&p, &bad).unwrap();
            let outcome = SegmentReader::open(&RealFs, &p).and_then(|r| r.for_each(|_| Ok(())));
            match outcome {
                Err(e) => assert_eq!(e.kind(), ErrorKind::Corruption, "byte {at}: {e}"),
                // Only the zero padding of the header page and of records is unchecked.
                Ok(()) => assert_eq!(good[at], 0, "a flip at byte {at} went unnoticed"),
            }
        }
    }

    #[test]
    fn a_torn_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.seg");
        write(&path, 10);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 100, 4096, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = SegmentReader::open(&RealFs, &path).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corruption, "cut at {cut}");
        }
    }

    #[test]
    fn a_newer_format_is_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.seg");
        write(&path, 1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&(FORMAT + 1).to_le_bytes());
        let crc = crc32fast::hash(&bytes[..HEADER_FIELDS]);
        bytes[HEADER_FIELDS..HEADER_FIELDS + 4].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(SegmentReader::open(&RealFs, &path).unwrap_err().kind(), ErrorKind::Unsupported);
    }
}
