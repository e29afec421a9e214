//! What a follower in a directory knew at its last flush, kept beside its segments, so that a
//! restart pulls only what changed while it was down.
//!
//! Each part's VV is read *before* a flush starts copying rows. A flush writes every row dirty
//! at that moment (or a newer state of it), so once it completes the rows on disk hold at least
//! everything that VV claims; the VVs are saved only then. A crash mid-flush leaves the
//! previous flush's VVs, which its rows still cover. A file that is missing, damaged or of
//! another layout is ignored: the follower then knows nothing and pulls every part (safe).
//!
//! `sync/<table>.vv` = magic u32 | parts u32 | parts × (n u16 | n × (origin u32 | ts u64))
//! | crc32 u32 of what precedes it (little-endian).

use std::path::{Path, PathBuf};

use embstore_replication::Vv;

use crate::{Error, Result, Table};

const MAGIC: u32 = u32::from_le_bytes(*b"ESVV");
/// The folder, beside the store's segments, that holds the saved knowledge.
pub(crate) const DIR: &str = "sync";

fn path(store_dir: &Path, table: &str) -> PathBuf {
    store_dir.join(DIR).join(format!("{table}.vv"))
}

impl Table {
    /// Every part's VV now (each read under its shard's lock), for a table that syncs.
    pub(crate) fn sync_knowledge_snapshot(&self) -> Option<Vec<Vv>> {
        self.sync.get()?;
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let g = shard.read();
            out.extend(g.sync.as_ref().expect("syncing").parts.iter().map(|p| p.vv.clone()));
        }
        Some(out)
    }
}

/// Saves `vvs` as `table`'s knowledge in `store_dir` (write, sync, rename).
pub(crate) fn save(store_dir: &Path, table: &str, vvs: &[Vv]) -> Result<()> {
    let mut b = Vec::with_capacity(8 + vvs.len() * 16);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&(vvs.len() as u32).to_le_bytes());
    for vv in vvs {
        b.extend_from_slice(&(vv.entries().len() as u16).to_le_bytes());
        for &(o, t) in vv.entries() {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&t.to_le_bytes());
        }
    }
    b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
    let dir = store_dir.join(DIR);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let (tmp, fin) = (dir.join(format!("{table}.vv.tmp")), path(store_dir, table));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&b)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &fin)
    };
    write().map_err(|e| Error::io(format!("save {}", fin.display()), e))
}

/// `table`'s saved knowledge, when a file (for `parts` parts, if given) is there and intact.
pub(crate) fn load(store_dir: &Path, table: &str, parts: Option<u32>) -> Option<Vec<Vv>> {
    let b = std::fs::read(path(store_dir, table)).ok()?;
    let (body, crc) = b.split_at(b.len().checked_sub(4)?);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = body.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
    if u32_of(take(4)?) != MAGIC {
        return None;
    }
    let found = u32_of(take(4)?);
    if parts.is_some_and(|p| p != found) || found as usize > body.len() / 2 {
        return None;
    }
    let mut out = Vec::with_capacity(found as usize);
    for _ in 0..found {
        let n = u16::from_le_bytes(take(2)?.try_into().ok()?);
        let mut vv = Vv::new();
        for _ in 0..n {
            let o = u32_of(take(4)?);
            let t = u64::from_le_bytes(take(8)?.try_into().ok()?);
            vv.raise(o, t);
        }
        out.push(vv);
    }
    (at == body.len()).then_some(out)
}

/// Removes `table`'s saved knowledge (the table was dropped).
pub(crate) fn remove(store_dir: &Path, table: &str) {
    let _ = std::fs::remove_file(path(store_dir, table));
}
