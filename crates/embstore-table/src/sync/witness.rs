//! A table as a witness: [`Table::witness_start`] and the rest (the state and its file are
//! in `crate::witness`).

use std::fs;
use std::path::Path;
use std::sync::Arc;

use embstore_common::bytes::Writer;
use embstore_common::clock::now_ms;
use embstore_replication::witness::{Corrupted, Logged, WitnessLog};
use parking_lot::Mutex;

use super::PartReply;
use crate::witness::{
    block, io, load, write_new, HealthyFile, TableWitness, WitnessStats, HEADER, MAGIC,
};
use crate::{Error, Result, Table};

impl Table {
    /// Makes this (syncing) table a witness: from now on each row a reply brings that is newer
    /// than what the witness held goes into the bucket of its arrival time (`bucket_ms`
    /// wide), and stays out of the healthy store until [`Table::witness_flush`]. With `dir`
    /// the healthy store is kept in `dir/<table>.witness` and taken from there when the file
    /// exists (a restart). Call it before the table pulls anything. `InvalidArgument` when the
    /// table does not sync or already witnesses.
    pub fn witness_start(&self, bucket_ms: u64, dir: Option<&Path>) -> Result<WitnessStats> {
        self.check_live()?;
        let parts = self.sync_parts()?;
        let (log, file, restored) = match dir {
            None => (WitnessLog::new(parts, bucket_ms)?, None, 0),
            Some(dir) => {
                fs::create_dir_all(dir).map_err(|e| io(dir, "making the directory of the", e))?;
                let path = dir.join(format!("{}.witness", self.name()));
                if path.exists() {
                    let l = load(&path, self.dim(), parts, bucket_ms)?;
                    let restored = l.healthy.len();
                    let file = HealthyFile::open(&path, l.good_len)?;
                    (
                        WitnessLog::from_healthy(bucket_ms, l.healthy, l.vvs, l.t_max)?,
                        Some(file),
                        restored,
                    )
                } else {
                    let file = HealthyFile::create(&path, self.dim(), parts, bucket_ms)?;
                    (WitnessLog::new(parts, bucket_ms)?, Some(file), 0)
                }
            }
        };
        let w = TableWitness {
            log: Mutex::new(log),
            file: Mutex::new(file),
            dim: self.dim(),
            restored,
        };
        self.witness
            .set(Arc::new(w))
            .map_err(|_| Error::invalid(format!("table '{}' is a witness already", self.name())))?;
        self.witness_stats()
    }

    /// Whether the table is a witness.
    pub fn witnesses(&self) -> bool {
        self.witness.get().is_some()
    }

    fn witness_state(&self) -> Result<&Arc<TableWitness>> {
        self.witness.get().ok_or_else(|| {
            Error::invalid(format!(
                "table '{}' is not a witness (Table::witness_start makes it one)",
                self.name()
            ))
        })
    }

    /// What the witness holds.
    pub fn witness_stats(&self) -> Result<WitnessStats> {
        Ok(self.witness_state()?.stats())
    }

    /// At a healthy decision `t_healthy_ms` (with the model's corrupted intervals): flushes
    /// the buckets that end by `t_max` (the latest bucket end by `t_healthy_ms` that meets no
    /// corrupted interval) into the healthy store, persisting what changed before it returns.
    /// Returns the new `t_max`, or `None` when nothing new could be flushed.
    pub fn witness_flush(&self, t_healthy_ms: u64, corrupted: &[Corrupted]) -> Result<Option<u64>> {
        let w = self.witness_state()?;
        let mut file = w.file.lock();
        let mut log = w.log.lock();
        let flushed = log.flush_changed(t_healthy_ms, corrupted);
        let stale = file.as_ref().is_some_and(|f| f.stale);
        let (t_max, changed) = match flushed {
            Some(f) => f,
            // A file behind the memory (an append failed): written whole below.
            None if stale => (log.t_max(), Vec::new()),
            None => return Ok(None),
        };
        if let Some(f) = file.as_mut() {
            if !f.stale {
                let rows: Vec<(u64, &Logged)> =
                    changed.iter().filter_map(|k| log.healthy().get(k).map(|r| (*k, r))).collect();
                // On failure the file is cut back and marked stale: the next flush writes it
                // whole (until then a restart finds the healthy store of the last good flush).
                f.append(&block(w.dim, t_max, log.vv_healthy(), &rows))?;
            }
            let held = log.healthy().len() as u64 * (21 + 4 * w.dim as u64) + HEADER as u64;
            if f.stale || f.len > 2 * held + (1 << 20) {
                let all: Vec<(u64, &Logged)> = log.healthy().iter().map(|(k, r)| (*k, r)).collect();
                let mut whole = Writer::with_capacity(HEADER);
                whole.raw(MAGIC).u32(w.dim as u32).u32(log.vv_healthy().len() as u32);
                whole.u64(log.bucket_ms()).raw(&block(w.dim, t_max, log.vv_healthy(), &all));
                write_new(&f.path, &whole.0)?;
                *f = HealthyFile::open(&f.path.clone(), whole.0.len() as u64)?;
            }
        }
        Ok(Some(t_max))
    }

    /// What a rollback to the witness's `t_max` writes: per key of the unflushed logs (rows
    /// that arrived after `t_max`), its healthy values, or `None` (remove it) for a key the
    /// healthy store lacks or holds removed; with `keep_new_rows` keys the healthy store never
    /// held are left out. In key order.
    pub fn witness_diff(&self, keep_new_rows: bool) -> Result<Vec<(u64, Option<Vec<f32>>)>> {
        Ok(self.witness_state()?.log.lock().diff(keep_new_rows))
    }

    /// Drops the unflushed logs (a rollback's writes supersede them).
    pub fn witness_clear_logs(&self) -> Result<()> {
        self.witness_state()?.log.lock().clear_logs();
        Ok(())
    }

    /// Logs what an applied reply brought: rows newer than the witness held, and for a
    /// complete reply the keys it dropped, as removals.
    pub(crate) fn witness_record(&self, reply: &PartReply, dropped: &[u64]) {
        let Some(w) = self.witness.get() else { return };
        let now = now_ms();
        let d = w.dim;
        let mut log = w.log.lock();
        for (i, (&k, m)) in reply.keys.iter().zip(&reply.meta).enumerate() {
            if log.newest(k).is_some_and(|v| v >= m.version) {
                continue;
            }
            let values = (!reply.tombstone[i]).then(|| reply.values[i * d..][..d].to_vec());
            log.log(now, k, Logged { version: m.version, values });
        }
        for &k in dropped {
            if let Some(version) = log.newest(k) {
                log.log(now, k, Logged { version, values: None });
            }
        }
    }

    /// After a reply's last piece is applied (no shard lock held): the part's knowledge now,
    /// for the bucket of this time.
    pub(crate) fn witness_knew(&self, part: u32) {
        let Some(w) = self.witness.get() else { return };
        if let Ok((vv, _)) = self.sync_knowledge(part) {
            w.log.lock().knew(now_ms(), part, &vv);
        }
    }
}
