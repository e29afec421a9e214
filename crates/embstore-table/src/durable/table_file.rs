//! A table in one file: [`Table::save`] and [`Table::load`] — the legacy one-table format.
//!
//! What it is for: exporting one table (in memory or in a store) to a single file and loading
//! it back into a table of the same layout, or into a store as a new table
//! ([`Store::load_table`](crate::Store::load_table)); Python's `Table.save`/`Table.load` and
//! `Store.load_table` call it. It predates the store's segments and checkpoints
//! (`durable::checkpoint`), which are what a store is backed up and restored with; it is kept,
//! unchanged and readable, for compatibility with the files users already hold. It is not a
//! one-table checkpoint: it holds one point in time of one table, with no chain and no
//! manifest.
//!
//! A simple, checksummed format:
//!
//! ```text
//! "EMBSTBL1"                                 8-byte magic (format 1)
//! u32 n, n bytes of header, u32 crc32        UTF-8 `key=value` lines: the table's config, step
//! blocks, each:
//!   u32 rows (> 0)
//!   rows × u64 id | rows × 32 B metadata | rows × D f32 | rows × S f32
//!   u32 crc32 of the block after its row count
//! u32 0, u64 total rows, u32 crc32 of the total   end marker
//! ```
//! All integers and floats are little-endian. `save` writes a temporary file next to the target,
//! syncs it and renames it over the target, so a crash leaves the old file or the new one.
//! `load` reads the whole file once to check every checksum and the row count before it touches
//! the table, so a corrupt or truncated file changes nothing.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::config::{config_text, parse_config_text};
use crate::counters::Counters;
use crate::table::same_layout;
use crate::tier::Gate;
use crate::{Error, ErrorKind, Result, RowChunk, RowMeta, Table, TableConfig, Version};

const MAGIC: &[u8; 8] = b"EMBSTBL1";
/// Rows per block.
const BLOCK_ROWS: usize = 1 << 14;
/// Bytes of metadata per row: timestamp u64, replica u32, pad u32, update count u64, last
/// update u64.
const META_BYTES: usize = 32;
/// The largest header accepted.
const MAX_HEADER: usize = 1 << 16;

impl Table {
    /// Writes every row, its optimizer state and metadata, and the config to `path` (replaced
    /// atomically). Rows are copied shard by shard under the shard's lock (see
    /// [`Export`](crate::Export)).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<u64> {
        self.check_live()?;
        let path = path.as_ref();
        let tmp = tmp_path(path);
        let result = self.save_to(&tmp);
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(format!("rename to {}", path.display()), e));
        }
        sync_parent(path)?;
        Ok(rows)
    }

    fn save_to(&self, tmp: &Path) -> Result<u64> {
        let ctx = |e| Error::io(format!("write {}", tmp.display()), e);
        let file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(tmp).map_err(ctx)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let header = header_text(self);
        w.write_all(MAGIC).map_err(ctx)?;
        w.write_all(&(header.len() as u32).to_le_bytes()).map_err(ctx)?;
        w.write_all(header.as_bytes()).map_err(ctx)?;
        w.write_all(&crc32fast::hash(header.as_bytes()).to_le_bytes()).map_err(ctx)?;
        let mut total = 0u64;
        let mut buf = Vec::new();
        let mut export = self.export(BLOCK_ROWS);
        for chunk in &mut export {
            buf.clear();
            encode_block(&chunk, &mut buf);
            w.write_all(&(chunk.len() as u32).to_le_bytes()).map_err(ctx)?;
            w.write_all(&buf).map_err(ctx)?;
            w.write_all(&crc32fast::hash(&buf).to_le_bytes()).map_err(ctx)?;
            total += chunk.len() as u64;
        }
        if let Some(e) = export.take_error() {
            return Err(e);
        }
        w.write_all(&0u32.to_le_bytes()).map_err(ctx)?;
        w.write_all(&total.to_le_bytes()).map_err(ctx)?;
        w.write_all(&crc32fast::hash(&total.to_le_bytes()).to_le_bytes()).map_err(ctx)?;
        let file = w.into_inner().map_err(|e| ctx(e.into_error()))?;
        file.sync_all().map_err(ctx)?;
        Ok(total)
    }

    /// Replaces every row with the rows in `path`, written by [`Table::save`] from a table with
    /// the same `embedding_dim` and optimizer; also restores the step counter. The rows are read
    /// into a new set of shards, checking every checksum and the row count, and swapped in only
    /// when the whole file is good: if it is corrupt, truncated or of another layout, the table
    /// is left as it was, and readers see either all of the old rows or all of the new. Needs
    /// memory for both sets while it runs.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<u64> {
        let path = path.as_ref();
        if self.syncs() {
            return Err(Error::invalid(format!(
                "table '{}' syncs with peers and cannot be replaced from a file: import the \
                 rows instead (they then sync as writes)",
                self.name()
            )));
        }
        let (mut r, file_len) = open(path)?;
        let (config, step) = parse_header(&mut r, path)?;
        same_layout(self, config.embedding_dim, config.optimizer.state_dim(config.embedding_dim))?;
        self.check_optimizer(config.optimizer.name())
            .map_err(|e| Error::invalid(format!("{} in {}", e.message(), path.display())))?;
        self.check_live()?;
        let fresh = Table::with_clock(self.config().clone(), self.clock.clone())?;
        let mut repaired = 0;
        let rows = read_blocks(&mut r, file_len, path, self.dim(), self.state_dim(), |chunk| {
            repaired += fresh.import_saved(&chunk)?;
            Ok(())
        })
        .map_err(|e| match e.kind() {
            ErrorKind::Corruption if !e.message().contains(&*path.to_string_lossy()) => {
                Error::new(ErrorKind::Corruption, format!("{} in {}", e.message(), path.display()))
            }
            _ => e,
        })?;
        fresh.set_step(step);
        self.check_live()?;
        let _exclusive = self.exclusive();
        self.swap_rows(&fresh);
        Counters::add(&self.counters.repaired_on_load, repaired as usize);
        Ok(rows)
    }
}

/// Syncs the directory holding `path`, so that a rename into it survives a crash.
fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("sync directory {}", dir.display()), e))
}

/// The config stored in a table file.
pub(crate) fn read_config(path: &Path) -> Result<TableConfig> {
    parse_header(&mut open(path)?.0, path).map(|(config, _)| config)
}

/// A temporary name next to `path`, unique in this process (pid and a counter) so that two
/// saves to one path never share it.
fn tmp_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

fn open(path: &Path) -> Result<(BufReader<File>, u64)> {
    let ctx = |e| Error::io(format!("open {}", path.display()), e);
    let file = File::open(path).map_err(ctx)?;
    let meta = file.metadata().map_err(ctx)?;
    if meta.is_dir() {
        return Err(ctx(std::io::Error::from(std::io::ErrorKind::IsADirectory)));
    }
    Ok((BufReader::with_capacity(1 << 20, file), meta.len()))
}

fn header_text(t: &Table) -> String {
    config_text(t.config(), t.step())
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], path: &Path) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::corrupt(format!("{} is truncated", path.display()))
        } else {
            Error::io(format!("read {}", path.display()), e)
        }
    })
}

fn read_u32(r: &mut impl Read, path: &Path) -> Result<u32> {
    let mut b = [0u8; 4];
    read_exact(r, &mut b, path)?;
    Ok(u32::from_le_bytes(b))
}

fn parse_header(r: &mut impl Read, path: &Path) -> Result<(TableConfig, u64)> {
    let bad =
        |what: &str| Error::corrupt(format!("{} is not a table file: {what}", path.display()));
    let mut magic = [0u8; 8];
    read_exact(r, &mut magic, path).map_err(|_| bad("too short"))?;
    if &magic != MAGIC {
        return Err(bad("bad magic"));
    }
    let n = read_u32(r, path)? as usize;
    if n > MAX_HEADER {
        return Err(bad("header too long"));
    }
    let mut header = vec![0u8; n];
    read_exact(r, &mut header, path)?;
    if read_u32(r, path)? != crc32fast::hash(&header) {
        return Err(bad("header checksum mismatch"));
    }
    let text = String::from_utf8(header).map_err(|_| bad("header is not UTF-8"))?;
    parse_config_text(&text, &bad)
}

fn encode_block(chunk: &RowChunk, buf: &mut Vec<u8>) {
    buf.extend(chunk.ids.iter().flat_map(|k| k.to_le_bytes()));
    for m in &chunk.meta {
        buf.extend_from_slice(&m.version.timestamp.to_le_bytes());
        buf.extend_from_slice(&m.version.replica.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        buf.extend_from_slice(&m.update_count.to_le_bytes());
        buf.extend_from_slice(&m.last_update_ms.to_le_bytes());
    }
    buf.extend(chunk.values.iter().flat_map(|v| v.to_le_bytes()));
    buf.extend(chunk.state.iter().flat_map(|v| v.to_le_bytes()));
}

fn decode_block(buf: &[u8], rows: usize, d: usize) -> RowChunk {
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let (ids, rest) = buf.split_at(rows * 8);
    let (meta, rest) = rest.split_at(rows * META_BYTES);
    let (values, state) = rest.split_at(rows * d * 4);
    let floats = |b: &[u8]| {
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
    };
    RowChunk {
        ids: (0..rows).map(|i| u64_at(ids, i * 8)).collect(),
        meta: meta
            .chunks_exact(META_BYTES)
            .map(|m| RowMeta {
                version: Version {
                    timestamp: u64_at(m, 0),
                    replica: u32::from_le_bytes(m[8..12].try_into().expect("4 bytes")),
                },
                update_count: u64_at(m, 16),
                last_update_ms: u64_at(m, 24),
            })
            .collect(),
        values: floats(values),
        state: floats(state),
        ..RowChunk::default()
    }
}

/// Reads every block after the header from `r`, checking checksums and sizes, and hands each
/// to `f`; then checks the end marker and that nothing follows. Returns the row count.
fn read_blocks(
    r: &mut BufReader<File>,
    file_len: u64,
    path: &Path,
    d: usize,
    sd: usize,
    mut f: impl FnMut(RowChunk) -> Result<()>,
) -> Result<u64> {
    let row_bytes = 8 + META_BYTES + (d + sd) * 4;
    let mut total = 0u64;
    let mut buf = Vec::new();
    loop {
        let rows = read_u32(r, path)? as usize;
        if rows == 0 {
            break;
        }
        let bytes = rows
            .checked_mul(row_bytes)
            .filter(|&b| rows <= BLOCK_ROWS && (b as u64) <= file_len)
            .ok_or_else(|| Error::corrupt(format!("{}: bad block size", path.display())))?;
        buf.resize(bytes, 0);
        read_exact(r, &mut buf, path)?;
        if read_u32(r, path)? != crc32fast::hash(&buf) {
            return Err(Error::corrupt(format!(
                "{}: checksum mismatch in the block after row {total}",
                path.display()
            )));
        }
        f(decode_block(&buf, rows, d))?;
        total += rows as u64;
    }
    let mut b = [0u8; 8];
    read_exact(r, &mut b, path)?;
    if read_u32(r, path)? != crc32fast::hash(&b) || u64::from_le_bytes(b) != total {
        return Err(Error::corrupt(format!("{}: row count mismatch at the end", path.display())));
    }
    if r.read(&mut [0u8; 1]).map_err(|e| Error::io(format!("read {}", path.display()), e))? != 0 {
        return Err(Error::corrupt(format!("{}: trailing bytes after the end", path.display())));
    }
    Ok(total)
}
