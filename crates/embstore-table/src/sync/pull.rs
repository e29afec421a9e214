//! [`Table::sync_pull`]: the rows of a part that a requester lacks, chosen by the protocol's
//! steps (`embstore_replication::steps::{plan_pull, pull_keys, ships}`) and read here, in
//! pieces, from memory and disk.

use std::sync::atomic::Ordering;

use embstore_replication::{steps, PartView};

use super::part::TablePart;
use super::{PartReply, Vv};
use crate::tier::{Gate, Host};
use crate::{Result, RowMeta, Table, Version};

impl Table {
    /// The rows (and tombstones) of `part` whose version is newer than what `vv_r` knows of
    /// their origin, with the part's VV and sv read *before* the selection (R1: a row that
    /// changes meanwhile only gets newer, so it is still selected or shipped next time). From
    /// the update cache when `vv_r` dominates the part's DVV, else by a scan of the part (rows
    /// on disk included, read without promoting them). `with_state` adds optimizer state (for
    /// peers that may take over training).
    pub fn sync_pull(&self, part: u32, vv_r: &Vv, with_state: bool) -> Result<PartReply> {
        let mut out = None;
        self.pull_part(part, vv_r, with_state, None, usize::MAX, &mut |r| {
            out = Some(r);
            Ok(())
        })?;
        Ok(out.expect("one piece of usize::MAX rows answers"))
    }

    /// [`Table::sync_pull`] when the update cache can answer it with at most `max_rows` rows
    /// (no scan, not a complete part); `None` otherwise, and nothing counted. For answering a
    /// change list with the rows of small changes.
    pub fn sync_pull_cached(
        &self,
        part: u32,
        vv_r: &Vv,
        with_state: bool,
        max_rows: usize,
    ) -> Result<Option<PartReply>> {
        let mut out = None;
        let answered =
            self.pull_part(part, vv_r, with_state, Some(max_rows), usize::MAX, &mut |r| {
                out = Some(r);
                Ok(())
            })?;
        Ok(if answered { out } else { None })
    }

    /// [`Table::sync_pull`] in pieces of at most `piece_rows` rows (fewer in a table with a
    /// memory budget: a piece, with a 4 KiB read buffer per row on disk, stays within an
    /// eighth of it, or 256 rows), each handed to `emit` as it is
    /// read: a part of any size costs the responder its keys (8 bytes each) and one piece,
    /// not the whole reply. Every piece but the last is `partial`; the pieces of a complete
    /// reply cover consecutive key ranges, together every key.
    pub fn sync_pull_pieces(
        &self,
        part: u32,
        vv_r: &Vv,
        with_state: bool,
        piece_rows: usize,
        emit: &mut dyn FnMut(PartReply) -> Result<()>,
    ) -> Result<()> {
        self.pull_part(part, vv_r, with_state, None, piece_rows, emit).map(drop)
    }

    /// A part's reply, in pieces; with `cached_only` (a row limit), only from the update
    /// cache (whether it answered).
    fn pull_part(
        &self,
        part: u32,
        vv_r: &Vv,
        with_state: bool,
        cached_only: Option<usize>,
        piece_rows: usize,
        emit: &mut dyn FnMut(PartReply) -> Result<()>,
    ) -> Result<bool> {
        self.check_live()?;
        let (s, sub) = self.check_part(part)?;
        let sync = self.sync_shared()?.clone();
        let mut head = PartReply {
            part,
            state: with_state.then(Vec::new),
            // Read before the rows: a row's state is never older than the count sent with it.
            step: with_state.then(|| self.step()),
            ..PartReply::default()
        };
        let (d, sd) = (self.dim(), self.state_dim);
        let piece_rows = match self.tier() {
            Some(tier) => {
                // A row read from disk costs a block of the read's buffer besides its bytes.
                let row_bytes = 48 + 4 * (d + if with_state { sd } else { 0 }) + 4096;
                piece_rows.min(((tier.budget_limit() / 8) as usize / row_bytes).max(256))
            }
            None => piece_rows,
        }
        .max(1);
        // The protocol's step: the part's knowledge, read before any row (R1: a row that
        // changes meanwhile only gets newer, so it is still selected or shipped next time),
        // whether the requester gets the part whole, the cache's answer or a scan's, and the
        // keys to read.
        let keys: Vec<u64> = {
            let shard = self.shards[s].read();
            let part = TablePart::view(self, &shard, sub);
            let pull = steps::plan_pull(&part, vv_r, sync.use_cache);
            if !pull.from_cache && cached_only.is_some() {
                return Ok(false);
            }
            let keys = steps::pull_keys(&part, &pull, vv_r);
            if pull.from_cache {
                if cached_only.is_some_and(|max| keys.len() > max) {
                    return Ok(false);
                }
                // What the cache had to hold for this requester: back to the oldest write it
                // lacked (a part written rarely is not "behind" for it).
                let cache = &part.sync().cache;
                let oldest = keys.iter().filter_map(|&k| cache.get(k)).map(|v| v.ms()).min();
                let now = crate::version::now_ms();
                sync.note_pull(true, Some(oldest.map_or(0, |ms| now.saturating_sub(ms))));
            } else {
                let known = vv_r.max_timestamp();
                let behind = (known > 0)
                    .then(|| (pull.vv.max_timestamp() >> 16).saturating_sub(known >> 16));
                sync.note_pull(false, behind);
            }
            (head.vv, head.sv, head.complete, head.from_cache) =
                (pull.vv, pull.sv, pull.complete, pull.from_cache);
            // Read with the VV (R1): the significant knowledge the rows selected now cover.
            head.svv = Some(part.sync().svv.clone());
            keys
        };
        let c = &sync.counters;
        let which = if head.from_cache { &c.pulls_cached } else { &c.pulls_scanned };
        which.fetch_add(1, Ordering::Relaxed);
        let pieces = keys.len().div_ceil(piece_rows).max(1);
        for i in 0..pieces {
            let chunk =
                &keys[(i * piece_rows).min(keys.len())..((i + 1) * piece_rows).min(keys.len())];
            let mut r = head.clone();
            self.read_piece(s, vv_r, chunk, &mut r)?;
            r.partial = i + 1 < pieces;
            if r.complete.is_some() {
                r.sort_by_key();
            }
            if let Some(c) = &mut r.complete {
                // Each piece covers the keys after the previous piece's last, up to its own
                // last (the first from the start, the last to the end).
                if i > 0 {
                    c.lo = keys[i * piece_rows - 1] + 1;
                }
                if r.partial {
                    c.hi = chunk[chunk.len() - 1];
                }
            }
            c.rows_sent.fetch_add(r.len() as u64, Ordering::Relaxed);
            emit(r)?;
        }
        Ok(true)
    }

    /// Appends to `r` the rows and tombstones of `keys` (all of shard `s`) that are newer than
    /// `vv_r` (every one for a complete reply); rows on disk are read without promoting them.
    fn read_piece(&self, s: usize, vv_r: &Vv, keys: &[u64], r: &mut PartReply) -> Result<()> {
        // The protocol's row filter (a row created by a lookup and never written, version 0,
        // is no write and never ships, a complete reply included: the requester keeps, or
        // drops, its own such row).
        let complete = r.complete.is_some();
        let newer = |v: Version| steps::ships(v, vv_r, complete);
        let (d, sd) = (self.dim(), self.state_dim);
        // A row: its values and, when the reply carries state, its state; a tombstone
        // (`None`) takes zeros of both widths.
        let push = |r: &mut PartReply,
                    key: u64,
                    meta: RowMeta,
                    sigv: Version,
                    row: Option<(&[f32], &[f32])>| {
            r.keys.push(key);
            r.sigv.push(sigv);
            r.meta.push(meta);
            r.tombstone.push(row.is_none());
            match row {
                Some((values, state)) => {
                    r.values.extend_from_slice(values);
                    if let Some(st) = &mut r.state {
                        st.extend_from_slice(state);
                    }
                }
                None => {
                    r.values.resize(r.values.len() + d, 0.0);
                    if let Some(st) = &mut r.state {
                        st.resize(st.len() + sd, 0.0);
                    }
                }
            }
        };
        // A tiered table's file table is held from classifying keys to reading those on
        // disk, so no rewrite moves them in between (as an export does).
        let files = self.cold_files();
        let mut cold = Vec::new();
        let mut cold_sigv = Vec::new();
        {
            let shard = self.shards[s].read();
            let sy = shard.sync.as_ref().expect("a syncing table's shards sync");
            let sigv = |k: u64| sy.parts[sy.sub(k)].sig.get(k).unwrap_or_default();
            for &k in keys {
                if let Some(slot) = shard.slot(k) {
                    let meta = shard.meta[slot].unpack();
                    if newer(meta.version) {
                        shard.values.with_row(slot, |values| {
                            push(r, k, meta, sigv(k), Some((values, shard.state.row(slot))))
                        });
                    }
                } else if let Some(l) = shard.cold_loc(k) {
                    cold.push((k, l));
                    cold_sigv.push(sigv(k));
                } else if let Some(&v) = sy.tombs.get(&k) {
                    if newer(v) {
                        let meta = RowMeta { version: v, update_count: 0, last_update_ms: v.ms() };
                        push(r, k, meta, sigv(k), None);
                    }
                }
            }
        }
        if let (false, Some(files)) = (cold.is_empty(), &files) {
            let recs = self.read_cold(files, &cold)?;
            for (((k, _), rec), sigv) in cold.iter().zip(recs).zip(cold_sigv) {
                if newer(rec.meta.version) {
                    push(r, *k, rec.meta, sigv, Some((&rec.values, &rec.state)));
                }
            }
        }
        Ok(())
    }
}
