//! What a follower in a directory knew at its last flush, kept beside its segments, so that a
//! restart pulls only what changed while it was down.
//!
//! Each part's VV is read *before* a flush starts copying rows. A flush writes every row dirty
//! at that moment (or a newer state of it), so once it completes the rows on disk hold at least
//! everything that VV claims; the VVs are saved only then. A crash mid-flush leaves the
//! previous flush's VVs, which its rows still cover. A file that is missing, damaged or of
//! another layout is ignored: the follower then knows nothing and pulls every part (safe).
//!
//! `sync/<table>.vv` = magic "ESV2" u32 | parts u32 | parts × vv (what each part knew)
//! | parts × vv (each part's floor: below it, removals' tombstones were collected)
//! | crc32 u32 of what precedes it (little-endian), with vv = n u16 | n × (origin u32 | ts u64).
//! A file of the first layout (magic "ESVV", no floors) reads with empty floors.

use std::path::{Path, PathBuf};

use embstore_replication::Vv;

use crate::{Error, Result, Table};

const MAGIC_V1: u32 = u32::from_le_bytes(*b"ESVV");
const MAGIC: u32 = u32::from_le_bytes(*b"ESV2");
/// The folder, beside the store's segments, that holds the saved knowledge.
pub(crate) const DIR: &str = "sync";

/// What a table's parts know: one VV per part, and one floor per part (the removals below it
/// are known only by their effect: their tombstones were collected).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Knowledge {
    pub(crate) vvs: Vec<Vv>,
    pub(crate) floors: Vec<Vv>,
}

fn path(store_dir: &Path, table: &str) -> PathBuf {
    store_dir.join(DIR).join(format!("{table}.vv"))
}

impl Table {
    /// Every part's VV and floor now (each read under its shard's lock), for a table that
    /// syncs. Tombstones are not saved: a restart loses them, so each one held now raises its
    /// part's saved floor (after a restart it counts as collected, and a peer behind it gets
    /// the part complete).
    pub(crate) fn sync_knowledge_snapshot(&self) -> Option<Knowledge> {
        self.sync.get()?;
        let mut out = Knowledge::default();
        for shard in self.shards.iter() {
            let g = shard.read();
            let sy = g.sync.as_ref().expect("syncing");
            out.vvs.extend(sy.parts.iter().map(|p| p.vv.clone()));
            let mut floors = sy.floors.clone();
            for (&k, v) in &sy.tombs {
                floors[sy.sub(k)].raise(v.replica, v.timestamp);
            }
            out.floors.extend(floors);
        }
        Some(out)
    }
}

impl Table {
    /// Whether a flush would write anything for this table (rows changed or removed since
    /// the last flush, or a clear or load).
    pub(crate) fn has_unflushed_changes(&self) -> bool {
        self.cleared.load(std::sync::atomic::Ordering::Relaxed)
            || self.shards.iter().any(|s| {
                let s = s.read();
                s.dirty_keys.as_ref().is_some_and(|d| !d.is_empty())
                    || s.removed.as_ref().is_some_and(|r| !r.is_empty())
            })
    }

    /// Raises every part's VV and floor by one fresh version (as a clear does, keeping the
    /// rows): every peer that knew this table before gets each part complete once, takes its
    /// rows and drops those it lacks. For a table whose history is not known (its saved
    /// knowledge is missing, or was invalidated by changes made while the store did not sync).
    pub(crate) fn raise_sync_floors(&self) {
        for shard in self.shards.iter() {
            if let Some(sy) = shard.write().sync.as_mut() {
                sy.on_local_clear();
            }
        }
    }
}

fn put_vv(b: &mut Vec<u8>, vv: &Vv) {
    b.extend_from_slice(&(vv.entries().len() as u16).to_le_bytes());
    for &(o, t) in vv.entries() {
        b.extend_from_slice(&o.to_le_bytes());
        b.extend_from_slice(&t.to_le_bytes());
    }
}

/// Saves `known` as `table`'s knowledge in `store_dir` (write, sync, rename).
pub(crate) fn save(store_dir: &Path, table: &str, known: &Knowledge) -> Result<()> {
    let mut b = Vec::with_capacity(8 + known.vvs.len() * 32);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&(known.vvs.len() as u32).to_le_bytes());
    for vv in known.vvs.iter().chain(&known.floors) {
        put_vv(&mut b, vv);
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
pub(crate) fn load(store_dir: &Path, table: &str, parts: Option<u32>) -> Option<Knowledge> {
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
    let magic = u32_of(take(4)?);
    if magic != MAGIC && magic != MAGIC_V1 {
        return None;
    }
    let found = u32_of(take(4)?);
    if parts.is_some_and(|p| p != found) || found as usize > body.len() / 2 {
        return None;
    }
    let mut vv = || -> Option<Vv> {
        let n = u16::from_le_bytes(take(2)?.try_into().ok()?);
        let mut vv = Vv::new();
        for _ in 0..n {
            let o = u32_of(take(4)?);
            let t = u64::from_le_bytes(take(8)?.try_into().ok()?);
            vv.raise(o, t);
        }
        Some(vv)
    };
    let vvs = (0..found).map(|_| vv()).collect::<Option<Vec<_>>>()?;
    let floors = if magic == MAGIC {
        (0..found).map(|_| vv()).collect::<Option<Vec<_>>>()?
    } else {
        vec![Vv::new(); found as usize]
    };
    (at == body.len()).then_some(Knowledge { vvs, floors })
}

/// Removes `table`'s saved knowledge (the table was dropped).
pub(crate) fn remove(store_dir: &Path, table: &str) {
    let _ = std::fs::remove_file(path(store_dir, table));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vv(pairs: &[(u32, u64)]) -> Vv {
        let mut v = Vv::new();
        pairs.iter().for_each(|&(o, t)| v.raise(o, t));
        v
    }

    #[test]
    fn knowledge_with_floors_reads_back_and_the_first_layout_reads_with_empty_floors() {
        let dir = tempfile::tempdir().unwrap();
        let known = Knowledge {
            vvs: vec![vv(&[(1, 50), (2, 7)]), vv(&[])],
            floors: vec![vv(&[(1, 20)]), vv(&[(3, 9)])],
        };
        save(dir.path(), "t", &known).unwrap();
        assert_eq!(load(dir.path(), "t", Some(2)), Some(known.clone()));
        assert_eq!(load(dir.path(), "t", None), Some(known.clone()));
        assert_eq!(load(dir.path(), "t", Some(4)), None, "another part count");
        // A damaged byte: ignored.
        let p = path(dir.path(), "t");
        let mut b = std::fs::read(&p).unwrap();
        b[9] ^= 1;
        std::fs::write(&p, &b).unwrap();
        assert_eq!(load(dir.path(), "t", None), None);
        // The first layout: magic "ESVV", the VVs only.
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC_V1.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        known.vvs.iter().for_each(|v| put_vv(&mut b, v));
        b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        let old = load(dir.path(), "t", Some(2)).unwrap();
        assert_eq!(old.vvs, known.vvs);
        assert_eq!(old.floors, vec![Vv::new(); 2]);
    }
}
