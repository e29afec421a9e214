//! [`Table::sync_apply`]: a peer's reply, checked whole, applied last-writer-wins, and the
//! part's knowledge merged after the last row (R2).

use std::sync::atomic::Ordering;

use embstore_replication::Sv;

use super::{Complete, PartReply};
use crate::meta::PackedMeta;
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
        let written = self.apply_reply(reply)?;
        // With no shard lock held.
        self.maybe_collect_tombstones();
        Ok(written)
    }

    fn apply_reply(&self, reply: &PartReply) -> Result<usize> {
        self.check_live()?;
        let sync = self.sync_shared()?.clone();
        if let Err(e) = self.check_reply(reply) {
            sync.counters.replies_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let (s, sub) = sync.layout.split(reply.part);
        let (d, sd) = (self.dim(), self.state_dim);
        // A complete reply: the rows held here in its range that it lacks (removed at the
        // responder if it saw them; checked again under the write lock).
        let missing = match &reply.complete {
            Some(c) => self.missing_from(s, sub, c, reply),
            None => Vec::new(),
        };
        // A tiered table brings the rows into memory first (and makes room for new ones), so
        // each key's version is at hand.
        let _entered = if missing.is_empty() {
            self.enter(&reply.keys)?
        } else {
            self.enter(&[&reply.keys[..], &missing[..]].concat())?
        };
        if let (Some(step), Some(_)) = (reply.step, &reply.state) {
            // A replica with state may take over training: it continues the step count. A
            // complete reply (the requester was behind a floor: a clear, or removals whose
            // tombstones were collected) takes the responder's count as it is, which a clear
            // set back to 0; otherwise the count only rises.
            if reply.complete.is_some() {
                self.set_step(step);
            } else {
                self.raise_step(step);
            }
        }
        let created = PackedMeta::created(now_ms());
        // The shard's lock is released before the tier's guard (`_entered`): the guard's drop
        // reports memory, which reads every shard.
        let mut guard = self.shards[s].write();
        let shard = &mut *guard;
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
            // Last writer wins: an equal version is the same write. A write the part already
            // knows of is never applied again: it holds that write or a newer one, or a newer
            // removal whose tombstone was collected (a stale reply must not bring it back).
            let known = shard.sync.as_ref().expect("syncing").parts[sub].vv.get(v.replica);
            if v <= held || v.timestamp <= known {
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
                shard.values.write(slot, &reply.values[i * d..][..d]);
                if let Some(st) = &reply.state {
                    shard.state.row_mut(slot).copy_from_slice(&st[i * sd..][..sd]);
                }
                shard.set_meta(slot, key, PackedMeta::pack(&reply.meta[i]));
                shard.sync.as_mut().expect("syncing").tombs.remove(&key);
            }
            shard.sync.as_mut().expect("syncing").parts[sub].cache.on_write(key, v);
            written += 1;
        }
        let covered = |v: Version| v.timestamp <= reply.vv.get(v.replica);
        if let Some(c) = &reply.complete {
            // Every piece raises the floor (floors only ever force complete parts, so early is
            // safe): between pieces, a peer pulling from here is behind what was dropped.
            shard.sync.as_mut().expect("syncing").floors[sub].merge(&c.floor);
        }
        for &key in &missing {
            let sy = shard.sync.as_mut().expect("syncing");
            if let Some(&v) = sy.tombs.get(&key).filter(|&&v| covered(v)) {
                // Dropped as the responder collected it: below this part's floor from now on.
                sy.tombs.remove(&key);
                sy.floors[sub].raise(v.replica, v.timestamp);
            }
            if shard.slot(key).is_some_and(|slot| covered(shard.meta[slot].unpack().version)) {
                shard.remove_row(key);
                written += 1;
            }
        }
        let me = self.clock.replica();
        let sy = shard.sync.as_mut().expect("syncing");
        if reply.partial {
            // R2: a piece's rows are safe to apply; its knowledge waits for the last piece.
            sync.counters.rows_applied.fetch_add(written as u64, Ordering::Relaxed);
            drop(guard);
            drop(_entered);
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
        drop(guard);
        drop(_entered);
        let c = &sync.counters;
        c.replies_applied.fetch_add(1, Ordering::Relaxed);
        c.rows_applied.fetch_add(written as u64, Ordering::Relaxed);
        Ok(written)
    }

    /// The keys of part (`s`, `sub`) held here (rows, in memory or on disk, and tombstones)
    /// in `c`'s key range that `reply` does not carry.
    fn missing_from(&self, s: usize, sub: usize, c: &Complete, reply: &PartReply) -> Vec<u64> {
        let theirs: hashbrown::HashSet<u64> = reply.keys.iter().copied().collect();
        let shard = self.shards[s].read();
        let sy = shard.sync.as_ref().expect("syncing");
        let wanted =
            |k: u64| (c.lo..=c.hi).contains(&k) && sy.sub(k) == sub && !theirs.contains(&k);
        let mut out: Vec<u64> = shard.index.iter().map(|(k, _)| k).filter(|&k| wanted(k)).collect();
        out.extend(shard.cold_entries().map(|(k, _)| k).filter(|&k| wanted(k)));
        out.extend(sy.tombs.keys().copied().filter(|&k| wanted(k)));
        out.sort_unstable();
        out.dedup();
        out
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
        for (i, (k, m)) in r.keys.iter().zip(&r.meta).enumerate() {
            if layout.part_of(*k) != r.part {
                return Err(Error::invalid(format!(
                    "key {k} is not in sync part {}; nothing was applied",
                    r.part
                )));
            }
            // A complete reply from an older build may carry rows created by lookups (version
            // 0): they are no writes, and are skipped below (never newer than what is held).
            let lookup_row = r.complete.is_some() && !r.tombstone[i];
            if m.version == Version::default() && !lookup_row {
                return Err(Error::invalid(format!(
                    "key {k} carries version 0, which no write issues; nothing was applied"
                )));
            }
        }
        let horizon = clock_horizon();
        let floor = r.complete.as_ref().map(|c| c.floor.entries()).unwrap_or_default();
        if r.complete.as_ref().is_some_and(|c| c.lo > c.hi) {
            return Err(Error::invalid(
                "a complete reply's key range is empty; nothing was applied",
            ));
        }
        for &(o, t) in r.vv.entries().iter().chain(floor) {
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
