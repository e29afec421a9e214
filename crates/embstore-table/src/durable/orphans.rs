//! Segment files the manifest does not name, and which of them recovery may delete.
//!
//! Recovery proves before it deletes. A segment the manifest does not name is deleted only when
//! the manifest shows it can hold nothing acknowledged:
//! - its seq is below the manifest's next seq: the manifest handed that seq out and no longer
//!   names it (its table was dropped, a rewrite superseded it, or the flush that wrote it
//!   failed and wrote its rows again later); or
//! - it is the one segment newer than every manifest record — the flush a crash cut short
//!   before its record landed (flushes write one segment at a time) — and its header names a
//!   table the manifest holds, or the crash came before its header was written.
//!
//! Anything else (several segments newer than the manifest, one of a table the manifest does
//! not know, a file that is not a segment) means the manifest has lost records: opening
//! refuses with [`ErrorKind::Corruption`](crate::ErrorKind::Corruption), naming the files, and
//! `verify` reports it.

use std::path::Path;

use super::SEG_DIR;
use crate::disk::manifest::State;
use crate::disk::segment;
use crate::disk::vfs::Vfs;
use crate::{Error, Result};

/// The names of the segment files in `dir` that `state` does not name and recovery may
/// delete; an error (corruption) when any unnamed segment cannot be proven superseded.
pub(crate) fn deletable(vfs: &dyn Vfs, dir: &Path, state: &State) -> Result<Vec<String>> {
    let seg_dir = dir.join(SEG_DIR);
    let names =
        vfs.list(&seg_dir).map_err(|e| Error::io(format!("list {}", seg_dir.display()), e))?;
    let named: std::collections::HashSet<u64> =
        state.tables.values().flat_map(|t| t.files.keys().copied()).collect();
    let mut out = Vec::new();
    let mut newer = Vec::new();
    for name in names {
        let Some(seq) = name.strip_suffix(".seg").and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        if named.contains(&seq) {
            continue;
        }
        if seq < state.next_seq {
            out.push(name);
        } else {
            newer.push((seq, name));
        }
    }
    let refuse = |why: String| {
        Error::corrupt(format!(
            "{}: {why}; the manifest has lost records, so the store is not opened (nothing was \
             deleted). Run `embstore verify` on it; move the files aside only if their rows may \
             be lost",
            dir.display()
        ))
    };
    match newer.as_slice() {
        [] => {}
        [(seq, name)] => {
            let path = seg_dir.join(name);
            match segment::read_header(vfs, &path) {
                Ok(None) => out.push(name.clone()),
                Ok(Some(h)) if h.seq == *seq && state.tables.contains_key(&h.table_id) => {
                    out.push(name.clone())
                }
                Ok(Some(h)) => {
                    return Err(refuse(format!(
                        "segment {name} (table id {}) is newer than the manifest and belongs to \
                         no table it holds",
                        h.table_id
                    )))
                }
                Err(e) => {
                    return Err(refuse(format!(
                        "segment {name} is newer than the manifest and unreadable ({e})"
                    )))
                }
            }
        }
        many => {
            let list: Vec<&str> = many.iter().map(|(_, n)| n.as_str()).collect();
            return Err(refuse(format!(
                "{} segments ({}) are newer than every manifest record, where a crash leaves at \
                 most one",
                many.len(),
                list.join(", ")
            )));
        }
    }
    Ok(out)
}
