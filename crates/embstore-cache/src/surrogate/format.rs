//! The surrogate file, both formats: format 2 (written) and format 1 (still read).
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
//! Format 1, the first one, is one checksummed run of every row ([`Surrogates::load`] shows
//! its layout); it is read into memory only.
//!
//! Invariants: every block's ids lie in `[fence[b], fence[b + 1])`; a record's surrogate is
//! never the row itself and its distance is in `[0, max_dist]` or it has none (`NONE`, +inf).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use half::f16;

use super::{Metric, SurrogateConfig, Surrogates, NONE};
use crate::{Error, ErrorKind, Result};

pub(super) const MAGIC: &[u8; 8] = b"EMBSURR1";
const HEADER: usize = 48;

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
    pub(super) fn encode(&self) -> [u8; BLOCK] {
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
    pub(super) fn decode(b: &[u8]) -> std::result::Result<Self, String> {
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
    pub(super) fn file_len(&self) -> Option<u64> {
        self.blocks.checked_mul(BLOCK as u64 + 8)?.checked_add(BLOCK as u64 + 4)
    }
}

pub(super) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

pub(super) fn u64_at(b: &[u8], o: usize) -> u64 {
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
pub(super) fn parse_block(
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
pub(super) fn parse_fences(b: &[u8], blocks: usize) -> std::result::Result<Vec<u64>, String> {
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

impl Surrogates {
    /// Writes the file (format 2, see the module docs: 4 KiB blocks that
    /// [`SurrogateFile`](super::SurrogateFile) reads one at a time) atomically: to `<path>.tmp`,
    /// fsync, rename over `path`. Errors: Io, with the path in the message.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: &dyn std::fmt::Display| {
            Error::new(
                ErrorKind::Io,
                format!("cannot write surrogate file {}: {e}", path.display()),
            )
        };
        let name = path.file_name().ok_or_else(|| io(&"no file name"))?;
        let mut tmp = PathBuf::from(path);
        tmp.set_file_name(format!("{}.tmp", name.to_string_lossy()));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&encode(self))?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io(&e));
        }
        // Make the rename durable; best effort (directories cannot be opened everywhere).
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Reads a whole file written by [`Surrogates::save`] into memory (18 B a row; to keep it
    /// on disk, open it with [`SurrogateFile::open`](super::SurrogateFile::open)). Format 2 is
    /// in the module docs; format 1, the first one, little-endian:
    ///
    /// ```text
    /// 0  magic "EMBSURR1"    8 B     16 dim u32          32 checkpoint version u64
    /// 8  format version u32  (1)     20 k u32            40 count n u64
    /// 12 metric u8 (0 cosine, 1 l2)  24 max_dist f32     48 ids u64 x n, alt u64 x n,
    /// 13 popularity u8, 2 B zero     28 4 B zero            dist f16 x n, crc32 u32
    /// ```
    ///
    /// Checksums cover every byte. Errors: Io (with the path) when the file cannot be read;
    /// Corruption when the magic, version, size, checksum or contents are wrong (ids not strictly
    /// increasing, a surrogate that is the row itself or not one of the ids, a distance
    /// outside `[0, max_dist]`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = fs::read(path).map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot read surrogate file {}: {e}", path.display()))
        })?;
        Self::decode(&bytes)
            .map_err(|m| Error::corrupt(format!("surrogate file {}: {m}", path.display())))
    }

    pub(super) fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        check_magic(b)?;
        match u32::from_le_bytes([b[8], b[9], b[10], b[11]]) {
            1 => Self::decode_v1(b),
            FORMAT_V2 => decode(b),
            v => Err(format!("unsupported format version {v}, expected 1 or {}", FORMAT_V2)),
        }
    }

    /// Format 1, which files are no longer written in (kept to test reading it).
    #[cfg(test)]
    fn encode_v1(&self) -> Vec<u8> {
        let n = self.ids.len();
        let mut b = Vec::with_capacity(HEADER + 18 * n + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[self.config.metric.code(), u8::from(self.config.popularity), 0, 0]);
        b.extend_from_slice(&(self.dim as u32).to_le_bytes());
        b.extend_from_slice(&(self.config.k as u32).to_le_bytes());
        b.extend_from_slice(&self.config.max_dist.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
        self.ids.iter().chain(&self.alt).for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        self.dist.iter().for_each(|d| b.extend_from_slice(&d.to_bits().to_le_bytes()));
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode_v1(b: &[u8]) -> std::result::Result<Self, String> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
        if b.len() < HEADER + 4 {
            return Err(format!(
                "too short: {} bytes, header and checksum need {}",
                b.len(),
                HEADER + 4
            ));
        }
        let n = u64_at(40);
        let want = usize::try_from(n).ok().and_then(|n| n.checked_mul(18)?.checked_add(HEADER + 4));
        if want != Some(b.len()) {
            return Err(format!("size mismatch: {} bytes for {n} rows", b.len()));
        }
        let body = &b[..b.len() - 4];
        let (stored, computed) = (u32_at(body.len()), crc32fast::hash(body));
        if stored != computed {
            return Err(format!("checksum mismatch: stored {stored:08x}, computed {computed:08x}"));
        }
        let metric = Metric::from_code(b[12]).ok_or(format!("unknown metric code {}", b[12]))?;
        if b[13] > 1 {
            return Err(format!("bad popularity flag {}", b[13]));
        }
        let config = SurrogateConfig {
            k: u32_at(20) as usize,
            metric,
            max_dist: f32::from_bits(u32_at(24)),
            popularity: b[13] == 1,
        };
        config.validate().map_err(|e| format!("bad config: {e}"))?;
        let dim = u32_at(16) as usize;
        if dim == 0 {
            return Err("dim must be at least 1, got 0".into());
        }
        let n = n as usize;
        let ids: Vec<u64> = (0..n).map(|i| u64_at(HEADER + 8 * i)).collect();
        let alt: Vec<u64> = (0..n).map(|i| u64_at(HEADER + 8 * (n + i))).collect();
        let dist: Vec<f16> = (0..n)
            .map(|i| {
                let o = HEADER + 16 * n + 2 * i;
                f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]]))
            })
            .collect();
        if let Some(i) = (1..n).find(|&i| ids[i - 1] >= ids[i]) {
            return Err(format!("ids are not strictly increasing at row {i}"));
        }
        if ids.last() == Some(&NONE) {
            return Err(format!("id {NONE} is reserved for none"));
        }
        for i in 0..n {
            let (a, d) = (alt[i], dist[i].to_f32());
            if a == NONE {
                if d != f32::INFINITY {
                    return Err(format!("row {i}: no surrogate but distance {d}"));
                }
            } else if a == ids[i] {
                return Err(format!("row {i}: id {a} is its own surrogate"));
            } else if ids.binary_search(&a).is_err() {
                return Err(format!("row {i}: surrogate {a} is not an id of this table"));
            } else if !(d >= 0.0 && d <= config.max_dist) {
                return Err(format!("row {i}: distance {d} outside [0, {}]", config.max_dist));
            }
        }
        Ok(Self { ids, alt, dist, dim, config, version: u64_at(32) })
    }
}

/// Checks the magic and that the version field is there (both formats start alike).
pub(super) fn check_magic(b: &[u8]) -> std::result::Result<(), String> {
    if b.len() < 12 {
        return Err(format!("too short: {} bytes", b.len()));
    }
    if &b[..8] != MAGIC {
        return Err(format!("bad magic \"{}\", expected \"EMBSURR1\"", b[..8].escape_ascii()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::surrogate::testing::*;
    use crate::surrogate::*;
    use crate::ErrorKind;

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = sample();
        assert!(s.coverage() > 0.0 && s.coverage() < 1.0, "coverage {}", s.coverage());
        let path = dir.path().join("t.surr");
        s.save(&path).unwrap();
        let back = Surrogates::load(&path).unwrap();
        assert_eq!(back, s);
        assert_eq!((back.version(), back.dim(), back.config().k), (42, 6, 10));
        // Format 2: a header block, one data block, 8 B of fence and its crc32.
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * 4096 + 8 + 4);
        assert!(!dir.path().join("t.surr.tmp").exists());
        let empty = build(&[], &[], 3, None, &SurrogateConfig::default(), 0).unwrap();
        empty.save(&path).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), empty);
        let f = SurrogateFile::open(&path).unwrap();
        assert_eq!((f.len(), f.get(7).unwrap()), (0, None));
        // Format 1 files are still read into memory; on disk they are refused, with the way out.
        fs::write(&path, s.encode_v1()).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), s);
        let e = SurrogateFile::open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert!(e.message().contains("format version 1 cannot be read block by block"), "{e}");
    }

    /// Damage anywhere in a format-2 file: `load` sees it (every byte is checksummed);
    /// `open` sees damage to the header, size or fences, and a damaged block is a Corrupt
    /// error when read.
    #[test]
    fn damaged_format_2_files_are_corrupt() {
        let n = RECORDS_PER_BLOCK + 5;
        let ids: Vec<u64> = (0..n as u64).collect();
        let s = build(&ids, &gaussian(3, n, 3), 3, None, &SurrogateConfig::default(), 1).unwrap();
        let good = encode(&s);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.surr");
        let fence_at = BLOCK * 3;
        for i in (0..good.len()).step_by(7).chain([12, 40, 48, fence_at, good.len() - 1]) {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(Surrogates::decode(&b).is_err(), "byte {i}");
            fs::write(&path, &b).unwrap();
            let in_block = (BLOCK..fence_at).contains(&i);
            match SurrogateFile::open(&path) {
                Err(e) => {
                    assert!(!in_block, "byte {i}: {e}");
                    assert_eq!(e.kind(), ErrorKind::Corruption, "byte {i}: {e}");
                }
                Ok(f) => {
                    assert!(in_block, "byte {i} opened");
                    let b = (i / BLOCK - 1) as u64;
                    let e = f.get(b * RECORDS_PER_BLOCK as u64).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::Corruption, "byte {i}: {e}");
                    assert!(e.message().contains(&format!("block {b}")), "{e}");
                }
            }
        }
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        let e = SurrogateFile::open(&path).unwrap_err();
        assert!(e.message().contains("size mismatch"), "{e}");
        let e = SurrogateFile::open(dir.path().join("missing.surr")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
    }

    #[test]
    fn damaged_files_are_corrupt_and_missing_ones_io() {
        let good = sample().encode_v1();
        let corrupt = |b: &[u8]| Surrogates::decode(b).unwrap_err();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            corrupt(&b);
        }
        assert!(corrupt(&good[..good.len() - 1]).starts_with("size mismatch"));
        assert!(corrupt(&good[..20]).starts_with("too short: 20 bytes"));
        let mut b = good.clone();
        b[..8].copy_from_slice(b"EMBSURR2");
        assert_eq!(corrupt(&b), "bad magic \"EMBSURR2\", expected \"EMBSURR1\"");
        // Well-formed checksums over bad contents.
        let recrc = |mut b: Vec<u8>| {
            let n = b.len() - 4;
            let crc = crc32fast::hash(&b[..n]);
            b[n..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut b = good.clone();
        b[HEADER..HEADER + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(corrupt(&recrc(b)), "ids are not strictly increasing at row 1");
        let mut b = good.clone();
        b[12] = 7;
        assert_eq!(corrupt(&recrc(b)), "unknown metric code 7");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.surr");
        let mut b = good.clone();
        b[HEADER + 3] ^= 1;
        fs::write(&path, &b).unwrap();
        let e = Surrogates::load(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert!(e.message().contains("bad.surr: checksum mismatch"), "{e}");
        let missing = dir.path().join("missing.surr");
        let e = Surrogates::load(&missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e
            .message()
            .starts_with(&format!("cannot read surrogate file {}", missing.display())));
        let e = sample().save(dir.path().join("no/such/dir.surr")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
    }
}
