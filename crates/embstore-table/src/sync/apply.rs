//! [`Table::sync_apply`]: a peer's reply, checked whole, applied last-writer-wins, and the
//! part's knowledge merged after the last row (R2).

use std::sync::atomic::Ordering;

use embstore_replication::Sv;

use super::PartReply;
use crate::meta::PackedMeta;
use crate::shard::sync::rv;
use crate::tier::Gate;
use crate::version::now_ms;
use crate::write::{clock_horizon, StateIn};
use crate::{Error, Result, Table, Version, MAX_REPLICA};

impl Table {
    /// Applies `reply` (from [`Table::sync_pull`] at a peer): each row or tombstone whose
    /// version is newer than this table's for its key is written (values, the optimizer state
    /// when the reply carries it, metadata); then the part's VV merges the responder's and its
    /// shard version follows (the responder's when the VVs are now equal). A reply that fails
    /// a check (shapes, a key outside the part, non-finite values, a version more than a day
    /// ahead of this clock or from a replica id over 2^31 − 1) changes nothing. Returns the
    /// rows written.
    pub fn sync_apply(&self, reply: &PartReply) -> Result<usize> {
        self.check_live()?;
        let sync = self.sync_shared()?.clone();
        if let Err(e) = self.check_reply(reply) {
            sync.counters.replies_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let (s, sub) = sync.layout.split(reply.part);
        let (d, sd) = (self.dim(), self.state_dim);
        // A tiered table brings the rows into memory first (and makes room for new ones), so
        // each key's version is at hand.
        let _entered = self.enter(&reply.keys)?;
        let created = PackedMeta::created(now_ms());
        let mut shard = self.shards[s].write();
        let shard = &mut *shard;
        let mut written = 0;
        for (i, &key) in reply.keys.iter().enumerate() {
            let v = reply.meta[i].version;
            let slot = shard.slot(key);
            let held = match slot {
                Some(slot) => shard.meta[slot].unpack().version,
                None => shard
                    .sync
                    .as_ref()
                    .expect("syncing")
                    .tombs
                    .get(&key)
                    .copied()
                    .unwrap_or_default(),
            };
            // Last writer wins: an equal version is the same write.
            if v <= held {
                continue;
            }
            self.clock.observe(v);
            if reply.tombstone[i] {
                shard.remove_row(key);
                shard.sync.as_mut().expect("syncing").tombs.insert(key, v);
            } else {
                let slot = match slot {
                    Some(slot) => slot,
                    None => shard.insert(key, created, &self.config.optimizer)?,
                };
                shard.values.row_mut(slot).copy_from_slice(&reply.values[i * d..][..d]);
                if let Some(st) = &reply.state {
                    shard.state.row_mut(slot).copy_from_slice(&st[i * sd..][..sd]);
                }
                shard.set_meta(slot, key, PackedMeta::pack(&reply.meta[i]));
                shard.sync.as_mut().expect("syncing").tombs.remove(&key);
            }
            shard.sync.as_mut().expect("syncing").parts[sub].cache.on_write(key, rv(v));
            written += 1;
        }
        let me = self.clock.replica();
        let sy = shard.sync.as_mut().expect("syncing");
        if reply.partial {
            // R2: a piece's rows are safe to apply; its knowledge waits for the last piece.
            sync.counters.rows_applied.fetch_add(written as u64, Ordering::Relaxed);
            return Ok(written);
        }
        let p = &mut sy.parts[sub];
        let before = p.vv.clone();
        p.vv.merge(&reply.vv);
        let old_sv = p.sv;
        if p.vv == reply.vv {
            // Same knowledge as the responder: take its name (the larger of the two when it was
            // already the same, so two peers pulling from each other settle on one).
            p.sv = if before == reply.vv { old_sv.max(reply.sv) } else { reply.sv };
        } else if p.vv != before {
            p.sv = Sv::new(self.clock.tick().timestamp, me);
        }
        if p.sv != old_sv {
            let id = sy.part_id(sub);
            sy.shared.changed(id);
        }
        let rows = shard.len();
        shard.sync.as_mut().expect("syncing").maybe_prune(false, rows);
        if written > 0 {
            shard.shrink_if_sparse()?;
        }
        drop(_entered);
        let c = &sync.counters;
        c.replies_applied.fetch_add(1, Ordering::Relaxed);
        c.rows_applied.fetch_add(written as u64, Ordering::Relaxed);
        Ok(written)
    }

    /// The checks of an import (shapes, finite values and state, versions at most a day
    /// ahead, replica ids), and those of sync: every key in the reply's part, no version 0, a
    /// VV within the same horizon.
    fn check_reply(&self, r: &PartReply) -> Result<()> {
        let layout = self.sync_shared()?.layout;
        self.check_part(r.part)?;
        let n = r.keys.len();
        if r.tombstone.len() != n {
            return Err(Error::shape(format!(
                "a reply of {n} keys carries {} tombstone flags",
                r.tombstone.len()
            )));
        }
        self.check_rows("values", n, r.values.len(), self.dim())?;
        let state = match &r.state {
            Some(st) => {
                self.check_rows("state", n, st.len(), self.state_dim)?;
                StateIn::Given(st)
            }
            None => StateIn::Init,
        };
        self.check_meta(&r.keys, &r.meta)?;
        self.check_finite(&r.keys, &r.values, state)?;
        for (k, m) in r.keys.iter().zip(&r.meta) {
            if layout.part_of(*k) != r.part {
                return Err(Error::invalid(format!(
                    "key {k} is not in sync part {}; nothing was applied",
                    r.part
                )));
            }
            if m.version == Version::default() {
                return Err(Error::invalid(format!(
                    "key {k} carries version 0, which no write issues; nothing was applied"
                )));
            }
        }
        let horizon = clock_horizon();
        for &(o, t) in r.vv.entries() {
            if t > horizon || o > MAX_REPLICA {
                return Err(Error::invalid(format!(
                    "the reply's version vector holds ({o}, {t}), past this clock by more than \
                     a day or from a replica id over 2^31 - 1; nothing was applied"
                )));
            }
        }
        Ok(())
    }
}
