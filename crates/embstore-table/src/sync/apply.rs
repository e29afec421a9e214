//! [`Table::sync_apply`]: a peer's reply, checked whole here, then applied by the protocol's
//! step (`embstore_replication::steps::apply`: last-writer-wins, and the part's knowledge
//! merged after the last row, R2) over the locked shard.

use std::sync::atomic::Ordering;

use embstore_replication::steps;

use super::part::TablePart;
use super::PartReply;
use crate::tier::Gate;
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
        // A complete reply: the keys held here in its range that it lacks (removed at the
        // responder if it saw them; the step checks that under the write lock).
        let missing = match &reply.complete {
            Some(_) => {
                let shard = self.shards[s].read();
                steps::missing(&TablePart::view(self, &shard, sub), reply)
            }
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
        // The shard's lock is released before the tier's guard (`_entered`): the guard's drop
        // reports memory, which reads every shard.
        let mut guard = self.shards[s].write();
        // The protocol's step: rows last-writer-wins, a complete reply's floor and dropped
        // keys, then (after the last piece) the VV merge and the sv rule.
        let applied = steps::apply(&mut TablePart::store(self, &mut guard, sub), reply, &missing)?;
        let written = applied.written;
        if self.witness.get().is_some() {
            // Under the shard's lock, so that the logs see this part's replies in order.
            self.witness_record(reply, &missing);
        }
        if reply.partial {
            // R2: a piece's rows are safe to apply; its knowledge waits for the last piece.
            sync.counters.rows_applied.fetch_add(written as u64, Ordering::Relaxed);
            drop(guard);
            drop(_entered);
            return Ok(written);
        }
        if applied.sv_changed {
            sync.changed(reply.part);
        }
        let shard = &mut *guard;
        let rows = shard.len();
        shard.sync.as_mut().expect("syncing").maybe_prune(false, rows);
        if written > 0 {
            shard.shrink_if_sparse()?;
        }
        drop(guard);
        drop(_entered);
        self.witness_knew(reply.part);
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
