//! The surrogate file, format 2, and [`SurrogateFile`]: a build kept on disk and read a 4 KiB
//! block at a time, so L3 costs the cache's budget a few bytes per 227 rows instead of the 18
//! bytes per row of a build held in memory (design note `evstore.md` §4.2: "read when L3 is
//! fed").
//!
//! ```text
//! block 0      header: magic "EMBSURR1" | format 2 | metric, popularity | dim | k | max_dist
//!              | records per block | version | rows | data blocks | rows with a surrogate
//!              | zero | crc32 of the block's first 4092 bytes (at 4092, as in every block)
//! block 1..=B  count u16 | 2 B zero | count x (id u64, alt u64, dist f16) | zero | crc32
//!              ids strictly increasing within and across blocks; 227 records a block
//! fences       the first id of every data block, u64 x B | crc32       (read once at open)
//! ```
//!
//! A lookup finds the block by the in-memory fences (8 B a block), reads that one block
//! (`O_DIRECT` where the file system allows it, else a buffered read whose pages are dropped
//! from the page cache right after) and checks its crc32 before it trusts a byte of it.
//!
//! Invariants: every block's ids lie in `[fence[b], fence[b + 1])`; a record's surrogate is
//! never the row itself and its distance is in `[0, max_dist]` or it has none (`NONE`, +inf).
//! [`SurrogateFile::open`] checks the header and fences only; a damaged block is a Corrupt error
//! when it is read (a surrogate naming an id the table lacks is harmless: that id is never
//! resident, so it is never served).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;

use super::{Metric, SurrogateConfig, Surrogates, MAGIC, NONE};
use crate::{Error, ErrorKind, Result};

/// The unit of the file and of every read.
pub const BLOCK: usize = 4096;
/// Bytes of one record: id, alt (u64 each) and the f16 distance.
const RECORD: usize = 18;
/// Records in a data block: `4 + 227 * 18 = 4090` bytes fit before the crc32 at 4092.
pub const RECORDS_PER_BLOCK: usize = (BLOCK - 8) / RECORD;
/// The format version this module writes and opens.
pub const FORMAT_V2: u32 = 2;

/// The header fields of a format-2 file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Header {
    pub config: SurrogateConfig,
    pub dim: usize,
    pub version: u64,
    pub rows: u64,
    pub blocks: u64,
    pub covered: u64,
}

impl Header {
    fn encode(&self) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&FORMAT_V2.to_le_bytes());
        b[12] = self.config.metric.code();
        b[13] = u8::from(self.config.popularity);
        b[16..20].copy_from_slice(&(self.dim as u32).to_le_bytes());
        b[20..24].copy_from_slice(&(self.config.k as u32).to_le_bytes());
        b[24..28].copy_from_slice(&self.config.max_dist.to_le_bytes());
        b[28..32].copy_from_slice(&(RECORDS_PER_BLOCK as u32).to_le_bytes());
        b[32..40].copy_from_slice(&self.version.to_le_bytes());
        b[40..48].copy_from_slice(&self.rows.to_le_bytes());
        b[48..56].copy_from_slice(&self.blocks.to_le_bytes());
        b[56..64].copy_from_slice(&self.covered.to_le_bytes());
        let crc = crc32fast::hash(&b[..BLOCK - 4]);
        b[BLOCK - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses block 0 (magic and version already checked).
    fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() < BLOCK {
            return Err(format!("too short: {} bytes, the header needs {BLOCK}", b.len()));
        }
        let (stored, computed) = (u32_at(b, BLOCK - 4), crc32fast::hash(&b[..BLOCK - 4]));
        if stored != computed {
            return Err(format!(
                "header checksum mismatch: stored {stored:08x}, computed {computed:08x}"
            ));
        }
        let metric = Metric::from_code(b[12]).ok_or(format!("unknown metric code {}", b[12]))?;
        if b[13] > 1 {
            return Err(format!("bad popularity flag {}", b[13]));
        }
        let config = SurrogateConfig {
            k: u32_at(b, 20) as usize,
            metric,
            max_dist: f32::from_bits(u32_at(b, 24)),
            popularity: b[13] == 1,
        };
        config.validate().map_err(|e| format!("bad config: {e}"))?;
        let dim = u32_at(b, 16) as usize;
        if dim == 0 {
            return Err("dim must be at least 1, got 0".into());
        }
        if u32_at(b, 28) as usize != RECORDS_PER_BLOCK {
            return Err(format!(
                "{} records per block, expected {RECORDS_PER_BLOCK}",
                u32_at(b, 28)
            ));
        }
        let h = Self {
            config,
            dim,
            version: u64_at(b, 32),
            rows: u64_at(b, 40),
            blocks: u64_at(b, 48),
            covered: u64_at(b, 56),
        };
        if h.blocks != h.rows.div_ceil(RECORDS_PER_BLOCK as u64) || h.covered > h.rows {
            return Err(format!(
                "{} rows ({} with a surrogate) in {} blocks",
                h.rows, h.covered, h.blocks
            ));
        }
        Ok(h)
    }

    /// The file's length: header, data blocks, fences and their crc32.
    fn file_len(&self) -> Option<u64> {
        self.blocks.checked_mul(BLOCK as u64 + 8)?.checked_add(BLOCK as u64 + 4)
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from(u32_at(b, o)) | u64::from(u32_at(b, o + 4)) << 32
}

/// One record of a data block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Record {
    pub id: u64,
    pub alt: u64,
    pub dist: f16,
}

/// The whole file of `s`, format 2.
pub(super) fn encode(s: &Surrogates) -> Vec<u8> {
    let n = s.ids.len();
    let blocks = n.div_ceil(RECORDS_PER_BLOCK);
    let header = Header {
        config: s.config,
        dim: s.dim,
        version: s.version,
        rows: n as u64,
        blocks: blocks as u64,
        covered: s.alt.iter().filter(|&&a| a != NONE).count() as u64,
    };
    let mut out = Vec::with_capacity(BLOCK * (blocks + 1) + 8 * blocks + 4);
    out.extend_from_slice(&header.encode());
    let mut fences = Vec::with_capacity(8 * blocks + 4);
    for b in 0..blocks {
        let (lo, hi) = (b * RECORDS_PER_BLOCK, ((b + 1) * RECORDS_PER_BLOCK).min(n));
        let mut blk = [0u8; BLOCK];
        blk[..2].copy_from_slice(&((hi - lo) as u16).to_le_bytes());
        for (j, i) in (lo..hi).enumerate() {
            let o = 4 + j * RECORD;
            blk[o..o + 8].copy_from_slice(&s.ids[i].to_le_bytes());
            blk[o + 8..o + 16].copy_from_slice(&s.alt[i].to_le_bytes());
            blk[o + 16..o + 18].copy_from_slice(&s.dist[i].to_bits().to_le_bytes());
        }
        let crc = crc32fast::hash(&blk[..BLOCK - 4]);
        blk[BLOCK - 4..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&blk);
        fences.extend_from_slice(&s.ids[lo].to_le_bytes());
    }
    let crc = crc32fast::hash(&fences);
    fences.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&fences);
    out
}

/// Parses and checks data block `b` (`[lo, hi)`: the ids its fences allow; `hi` is `None` for
/// the last block) into `out`, which it clears first.
fn parse_block(
    blk: &[u8],
    b: u64,
    lo: u64,
    hi: Option<u64>,
    max_dist: f32,
    out: &mut Vec<Record>,
) -> std::result::Result<(), String> {
    out.clear();
    let (stored, computed) = (u32_at(blk, BLOCK - 4), crc32fast::hash(&blk[..BLOCK - 4]));
    if stored != computed {
        return Err(format!(
            "block {b}: checksum mismatch: stored {stored:08x}, computed {computed:08x}"
        ));
    }
    let count = usize::from(u16::from_le_bytes([blk[0], blk[1]]));
    if count == 0 || count > RECORDS_PER_BLOCK {
        return Err(format!("block {b}: {count} records, expected 1 to {RECORDS_PER_BLOCK}"));
    }
    for j in 0..count {
        let o = 4 + j * RECORD;
        let r = Record {
            id: u64_at(blk, o),
            alt: u64_at(blk, o + 8),
            dist: f16::from_bits(u16::from_le_bytes([blk[o + 16], blk[o + 17]])),
        };
        let prev = out.last().map_or(lo, |p: &Record| p.id.saturating_add(1));
        if r.id < prev || hi.is_some_and(|h| r.id >= h) || (j == 0 && r.id != lo) {
            return Err(format!("block {b}: id {} out of order or outside its fences", r.id));
        }
        let d = r.dist.to_f32();
        if r.alt == NONE {
            if d != f32::INFINITY {
                return Err(format!("block {b}: id {}: no surrogate but distance {d}", r.id));
            }
        } else if r.alt == r.id {
            return Err(format!("block {b}: id {} is its own surrogate", r.id));
        } else if !(d >= 0.0 && d <= max_dist) {
            return Err(format!("block {b}: id {}: distance {d} outside [0, {max_dist}]", r.id));
        }
        out.push(r);
    }
    Ok(())
}

/// Parses the fence section (`8 * blocks + 4` bytes): strictly increasing ids, checksummed.
fn parse_fences(b: &[u8], blocks: usize) -> std::result::Result<Vec<u64>, String> {
    if b.len() != 8 * blocks + 4 {
        return Err(format!("fence section of {} bytes, expected {}", b.len(), 8 * blocks + 4));
    }
    let n = 8 * blocks;
    let (stored, computed) = (u32_at(b, n), crc32fast::hash(&b[..n]));
    if stored != computed {
        return Err(format!(
            "fence checksum mismatch: stored {stored:08x}, computed {computed:08x}"
        ));
    }
    let fences: Vec<u64> = (0..blocks).map(|i| u64_at(b, 8 * i)).collect();
    if let Some(i) = (1..blocks).find(|&i| fences[i - 1] >= fences[i]) {
        return Err(format!("fences are not strictly increasing at block {i}"));
    }
    Ok(fences)
}

/// Decodes a whole format-2 file into memory (what [`Surrogates::load`] does with one),
/// checking every block, and that every surrogate is an id of the file.
pub(super) fn decode(b: &[u8]) -> std::result::Result<Surrogates, String> {
    let h = Header::decode(b)?;
    let want = h.file_len().filter(|&l| l == b.len() as u64);
    if want.is_none() {
        return Err(format!("size mismatch: {} bytes for {} rows", b.len(), h.rows));
    }
    let blocks = h.blocks as usize;
    let fences = parse_fences(&b[BLOCK * (blocks + 1)..], blocks)?;
    let rows = h.rows as usize;
    let (mut ids, mut alt, mut dist) =
        (Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows));
    let mut recs = Vec::with_capacity(RECORDS_PER_BLOCK);
    for (i, &lo) in fences.iter().enumerate() {
        let blk = &b[BLOCK * (i + 1)..BLOCK * (i + 2)];
        parse_block(blk, i as u64, lo, fences.get(i + 1).copied(), h.config.max_dist, &mut recs)?;
        let full = if i + 1 < blocks { RECORDS_PER_BLOCK } else { rows - i * RECORDS_PER_BLOCK };
        if recs.len() != full {
            return Err(format!("block {i}: {} records, expected {full}", recs.len()));
        }
        for r in &recs {
            ids.push(r.id);
            alt.push(r.alt);
            dist.push(r.dist);
        }
    }
    if ids.last() == Some(&NONE) {
        return Err(format!("id {NONE} is reserved for none"));
    }
    if let Some(i) = alt.iter().position(|&a| a != NONE && ids.binary_search(&a).is_err()) {
        return Err(format!("row {i}: surrogate {} is not an id of this table", alt[i]));
    }
    if alt.iter().filter(|&&a| a != NONE).count() as u64 != h.covered {
        return Err(format!("the header says {} rows have a surrogate; they differ", h.covered));
    }
    Ok(Surrogates { ids, alt, dist, dim: h.dim, config: h.config, version: h.version })
}

/// A surrogate build on disk (format 2), read one 4 KiB block per lookup. It holds the header
/// and one fence per block (8 B per 227 rows) in memory; see the module docs.
#[derive(Debug)]
pub struct SurrogateFile {
    path: PathBuf,
    file: File,
    direct: bool,
    header: Header,
    fences: Vec<u64>,
    reads: AtomicU64,
}

impl SurrogateFile {
    /// Opens a file written by [`Surrogates::save`], checking its header, size and fences
    /// (blocks are checked when read). Errors: Io (with the path) when it cannot be read;
    /// Corrupt when it is damaged, or is a format-1 file (load it and save it again).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |e: &dyn std::fmt::Display| {
            Error::new(ErrorKind::Io, format!("cannot read surrogate file {}: {e}", path.display()))
        };
        let corrupt = |m: String| Error::corrupt(format!("surrogate file {}: {m}", path.display()));
        let mut f = File::open(path).map_err(|e| io(&e))?;
        let len = f.metadata().map_err(|e| io(&e))?.len();
        let mut head = vec![0u8; BLOCK.min(len as usize)];
        f.read_exact(&mut head).map_err(|e| io(&e))?;
        super::check_magic(&head).map_err(corrupt)?;
        let version = u32_at(&head, 8);
        if version != FORMAT_V2 {
            return Err(corrupt(format!(
                "format version {version} cannot be read block by block; load it into memory \
                 (Surrogates::load) and save it again to write format {FORMAT_V2}"
            )));
        }
        let header = Header::decode(&head).map_err(corrupt)?;
        if header.file_len() != Some(len) {
            return Err(corrupt(format!("size mismatch: {len} bytes for {} rows", header.rows)));
        }
        let blocks = header.blocks as usize;
        let mut fb = vec![0u8; 8 * blocks + 4];
        f.read_exact_at(&mut fb, (BLOCK * (blocks + 1)) as u64).map_err(|e| io(&e))?;
        let fences = parse_fences(&fb, blocks).map_err(corrupt)?;
        drop_cached(&f, 0, len);
        let (file, direct) =
            match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
                Ok(d) => (d, true),
                // tmpfs and some others refuse O_DIRECT: read through the page cache and drop
                // the pages after each read.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (f, false),
                Err(e) => return Err(io(&e)),
            };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            direct,
            header,
            fences,
            reads: AtomicU64::new(0),
        })
    }

    /// The surrogate of `id` and its distance, or `None` (unknown id, or none): one block
    /// read. Errors: Io when the read fails, Corrupt when the block is damaged.
    pub fn get(&self, id: u64) -> Result<Option<(u64, f32)>> {
        let mut out = Vec::new();
        self.get_many(&[id], &mut out)?;
        Ok(out[0])
    }

    /// [`SurrogateFile::get`] for each of `ids` into `out` (cleared first, same order), one
    /// read per distinct block; returns the blocks read. On an error `out` is left cleared.
    pub fn get_many(&self, ids: &[u64], out: &mut Vec<Option<(u64, f32)>>) -> Result<usize> {
        out.clear();
        let mut order: Vec<(usize, usize)> =
            ids.iter().enumerate().filter_map(|(i, &id)| Some((self.block_of(id)?, i))).collect();
        order.sort_unstable();
        let mut res = vec![None; ids.len()];
        let mut buf = vec![0u8; 2 * BLOCK];
        let mut recs = Vec::with_capacity(RECORDS_PER_BLOCK);
        let (mut current, mut reads) = (usize::MAX, 0);
        for (b, i) in order {
            if b != current {
                self.read_block(b, &mut buf, &mut recs)?;
                current = b;
                reads += 1;
            }
            res[i] = recs
                .binary_search_by_key(&ids[i], |r| r.id)
                .ok()
                .map(|j| recs[j])
                .filter(|r| r.alt != NONE)
                .map(|r| (r.alt, r.dist.to_f32()));
        }
        *out = res;
        Ok(reads)
    }

    fn block_of(&self, id: u64) -> Option<usize> {
        self.fences.partition_point(|&f| f <= id).checked_sub(1)
    }

    /// Reads and checks data block `b` into `recs`; `buf` is `2 * BLOCK` bytes, of which the
    /// aligned `BLOCK` is used.
    fn read_block(&self, b: usize, buf: &mut [u8], recs: &mut Vec<Record>) -> Result<()> {
        let skip = buf.as_ptr().align_offset(BLOCK);
        let blk = &mut buf[skip..skip + BLOCK];
        let off = (BLOCK * (b + 1)) as u64;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.file.read_exact_at(blk, off).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("cannot read surrogate file {} block {b}: {e}", self.path.display()),
            )
        })?;
        if !self.direct {
            drop_cached(&self.file, off, BLOCK as u64);
        }
        let hi = self.fences.get(b + 1).copied();
        parse_block(blk, b as u64, self.fences[b], hi, self.header.config.max_dist, recs)
            .map_err(|m| Error::corrupt(format!("surrogate file {}: {m}", self.path.display())))
    }

    /// Rows covered, with or without a surrogate.
    pub fn len(&self) -> usize {
        self.header.rows as usize
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.header.rows == 0
    }

    /// The share of rows that have a surrogate (0 when empty).
    pub fn coverage(&self) -> f64 {
        if self.header.rows == 0 {
            0.0
        } else {
            self.header.covered as f64 / self.header.rows as f64
        }
    }

    /// Bytes it holds in memory: the fences (8 B per 227 rows) and the struct itself.
    pub fn heap_bytes(&self) -> usize {
        self.fences.capacity() * 8 + std::mem::size_of::<Self>() + self.path.as_os_str().len()
    }

    /// The embedding dimension of the rows it was built from.
    pub fn dim(&self) -> usize {
        self.header.dim
    }

    /// The config it was built with.
    pub fn config(&self) -> &SurrogateConfig {
        &self.header.config
    }

    /// The version (step) of the table checkpoint it was built from.
    pub fn version(&self) -> u64 {
        self.header.version
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads bypass the page cache (`O_DIRECT`); else each read's pages are dropped
    /// from it afterwards.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Blocks read so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// Asks the kernel to drop `[off, off + len)` of `f` from the page cache (best effort).
fn drop_cached(f: &File, off: u64, len: u64) {
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}
