//! [`SurrogateFile`]: a build kept on disk (format 2, in [`format`](super::format)) and read a
//! 4 KiB block at a time, so L3 costs the cache's budget a few bytes per 227 rows instead of
//! the 18 bytes per row of a build held in memory (design note `evstore.md` §4.2: "read when
//! L3 is fed").
//!
//! A lookup finds the block by the in-memory fences (8 B a block), reads that one block
//! (`O_DIRECT` where the file system allows it, else a buffered read whose pages are dropped
//! from the page cache right after) and checks its crc32 before it trusts a byte of it.
//!
//! [`SurrogateFile::open`] checks the header and fences only; a damaged block is a Corruption error
//! when it is read (a surrogate naming an id the table lacks is harmless: that id is never
//! resident, so it is never served).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{
    check_magic, parse_block, parse_fences, u32_at, Header, Record, BLOCK, FORMAT_V2,
    RECORDS_PER_BLOCK,
};
use super::{SurrogateConfig, NONE};
use crate::{Error, ErrorKind, Result};

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
    /// Opens a file written by [`Surrogates::save`](super::Surrogates::save), checking its
    /// header, size and fences (blocks are checked when read). Errors: Io (with the path) when
    /// it cannot be read; Corruption when it is damaged, or is a format-1 file (load it and save
    /// it again).
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
        check_magic(&head).map_err(corrupt)?;
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
    /// read. Errors: Io when the read fails, Corruption when the block is damaged.
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::surrogate::testing::*;
    use crate::surrogate::*;

    /// A build over several blocks, with sparse ids: the file on disk answers every id (and
    /// ids between, below and above them) as the build in memory does, one block read per
    /// distinct block.
    #[test]
    fn file_on_disk_answers_like_the_build_in_memory() {
        let seed = 0x5eed_f11e;
        println!("seed {seed:#x}");
        let n = 3 * RECORDS_PER_BLOCK + 17;
        let mut rng = crate::trace::SplitMix64::new(seed);
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 1_000 + rng.next_u64() % 997).collect();
        let counts: Vec<u64> = (0..n as u64).map(|_| rng.next_u64() % 5).collect();
        let cfg = SurrogateConfig { max_dist: 0.12, ..Default::default() };
        let s = build(&ids, &gaussian(seed, n, 8), 8, Some(&counts), &cfg, 9).unwrap();
        assert!(s.coverage() > 0.0 && s.coverage() < 1.0, "coverage {}", s.coverage());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.surr");
        s.save(&path).unwrap();
        assert_eq!(Surrogates::load(&path).unwrap(), s);
        let f = SurrogateFile::open(&path).unwrap();
        assert_eq!((f.len(), f.dim(), f.version(), *f.config()), (n, 8, 9, cfg));
        assert!((f.coverage() - s.coverage()).abs() < 1e-12);
        assert_eq!(
            f.heap_bytes() - std::mem::size_of::<SurrogateFile>(),
            4 * 8 + path.as_os_str().len()
        );
        let mut probe: Vec<u64> =
            ids.iter().flat_map(|&i| [i, i + 1, i.saturating_sub(1)]).collect();
        probe.extend([0, u64::MAX - 1, ids[n - 1] + 10_000]);
        for &id in &probe {
            assert_eq!(f.get(id).unwrap(), s.get(id), "id {id}");
        }
        let mut out = Vec::new();
        let reads = f.get_many(&probe, &mut out).unwrap();
        assert_eq!(out, probe.iter().map(|&i| s.get(i)).collect::<Vec<_>>());
        assert_eq!(reads, 4, "one read per block");
    }
}
