//! Segment files the manifest does not name, and which of them recovery may delete.
//!
//! Recovery proves before it deletes. A segment the manifest does not name is deleted only when
//! the manifest shows it can hold nothing acknowledged:
//! - its seq is below the manifest's next seq: the manifest handed that seq out and no longer
//!   names it (its table was dropped, a rewrite superseded it, or the flush that wrote it
//!   failed and wrote its rows again later); or
//! - its seq lies in the range the manifest reserved for spills ([`Edit::SpillRange`]) and its
//!   header marks it a spill (or a crash cut it before its header): a segment an eviction wrote
//!   without fsync that no flush adopted (`durable::spill`). Its rows were
//!   written after the last completed flush (a flush adopts every spill written before it),
//!   whose segments hold their flushed values, and the durability contract lets them go; or
//! - it is the one segment newer than every manifest record — the flush a crash cut short
//!   before its record landed (flushes write one segment at a time) — and its header names a
//!   table the manifest holds, or the crash came before its header was written.
//!
//! Anything else (several segments newer than the manifest, one of a table the manifest does
//! not know, a file that is not a segment) is *unaccounted*: the manifest has lost records, or
//! an older build left more than one segment behind failed manifest writes. Opening refuses
//! with [`ErrorKind::Corruption`](crate::ErrorKind::Corruption), naming the files, and
//! `verify` reports them apart from the superseded ones (which are safe to remove).
//!
//! The store keeps "at most one" true through failed manifest writes too: after an append
//! fails, the manifest is rewritten — recording the seq of the segment whose record failed as
//! handed out — before the next segment is created (`SegmentTx::begin`), so a flush that cannot
//! write the manifest writes no segment either. Spills take their seqs inside a reserved range
//! only (a seq past it is reserved by a record first), so they never count against it.
//!
//! [`Edit::SpillRange`]: crate::disk::manifest::Edit::SpillRange

use std::path::Path;

use super::SEG_DIR;
use crate::disk::manifest::State;
use crate::disk::segment;
use crate::disk::vfs::Vfs;
use crate::{Error, Result};

/// The segment files of a directory that its manifest does not name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Unnamed {
    /// Files the manifest proves superseded: safe to remove, and the next open deletes them.
    pub(crate) superseded: Vec<String>,
    /// Files it cannot prove superseded: while one is there the store is not opened.
    pub(crate) unaccounted: Vec<String>,
    /// Why the unaccounted ones cannot be proven superseded (empty when there are none).
    pub(crate) why: String,
}

impl Unnamed {
    /// The refusal to open `dir` while unaccounted segments are there (`None`: there are none).
    pub(crate) fn refusal(&self, dir: &Path) -> Option<Error> {
        if self.unaccounted.is_empty() {
            return None;
        }
        let safe = match self.superseded.as_slice() {
            [] => String::new(),
            files => {
                format!("; {} the manifest proves superseded and safe to remove", files.join(", "))
            }
        };
        Some(Error::corrupt(format!(
            "{}: {}; the manifest cannot account for them, so the store is not opened (nothing \
             was deleted){safe}. Run `embstore verify` on it. Moving the unaccounted files \
             aside opens the store at the state its manifest records: rows that only they hold \
             are lost (none that a flush acknowledged, when they were left by flushes that \
             failed, e.g. on a full disk)",
            dir.display(),
            self.why,
        )))
    }
}

/// The names of the segment files in `dir` that `state` does not name and recovery may
/// delete; an error (corruption) when any unnamed segment cannot be proven superseded.
pub(crate) fn deletable(vfs: &dyn Vfs, dir: &Path, state: &State) -> Result<Vec<String>> {
    let unnamed = unnamed(vfs, dir, state)?;
    match unnamed.refusal(dir) {
        Some(e) => Err(e),
        None => Ok(unnamed.superseded),
    }
}

/// The segment files in `dir` that `state` does not name, split into those it proves
/// superseded and those it cannot account for; an error only when the folder cannot be listed.
/// Whether the segment `name` (seq `seq`) is a spill: its header says so (or a crash cut its
/// write before the header landed, when nothing in it was ever acknowledged). Any other file in
/// the spill range keeps the proof of a segment newer than the manifest.
fn is_spill(vfs: &dyn Vfs, seg_dir: &Path, name: &str, seq: u64) -> bool {
    match segment::read_header(vfs, &seg_dir.join(name)) {
        Ok(None) => true,
        Ok(Some(h)) => h.kind == segment::SegmentKind::Spill && h.seq == seq,
        Err(_) => false,
    }
}

pub(crate) fn unnamed(vfs: &dyn Vfs, dir: &Path, state: &State) -> Result<Unnamed> {
    let seg_dir = dir.join(SEG_DIR);
    let names =
        vfs.list(&seg_dir).map_err(|e| Error::io(format!("list {}", seg_dir.display()), e))?;
    let named: std::collections::HashSet<u64> =
        state.tables.values().flat_map(|t| t.files.keys().copied()).collect();
    let mut out = Unnamed::default();
    let mut newer = Vec::new();
    for name in names {
        let Some(seq) = name.strip_suffix(".seg").and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        if named.contains(&seq) {
            continue;
        }
        if seq < state.next_seq || seq < state.spill_below && is_spill(vfs, &seg_dir, &name, seq) {
            out.superseded.push(name);
        } else {
            newer.push((seq, name));
        }
    }
    match newer.as_slice() {
        [] => {}
        [(seq, name)] => {
            let path = seg_dir.join(name);
            match segment::read_header(vfs, &path) {
                Ok(None) => out.superseded.push(name.clone()),
                Ok(Some(h)) if h.seq == *seq && state.tables.contains_key(&h.table_id) => {
                    out.superseded.push(name.clone())
                }
                Ok(Some(h)) => {
                    out.why = format!(
                        "segment {name} (table id {}) is newer than the manifest and belongs to \
                         no table it holds",
                        h.table_id
                    );
                    out.unaccounted.push(name.clone());
                }
                Err(e) => {
                    out.why =
                        format!("segment {name} is newer than the manifest and unreadable ({e})");
                    out.unaccounted.push(name.clone());
                }
            }
        }
        many => {
            out.unaccounted = many.iter().map(|(_, n)| n.clone()).collect();
            out.why = format!(
                "{} segments ({}) are newer than every manifest record, where a crash leaves at \
                 most one",
                many.len(),
                out.unaccounted.join(", ")
            );
        }
    }
    out.superseded.sort();
    Ok(out)
}
