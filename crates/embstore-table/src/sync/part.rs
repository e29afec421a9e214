//! A table's sync part as the protocol's steps see it: [`TablePart`] implements
//! `embstore_replication`'s part traits ([`PartView`], [`PartStore`]) over one shard, held
//! under its lock, so that [`Table::sync_pull`] and [`Table::sync_apply`] run the steps of
//! `embstore_replication::steps`, the same functions the simulator checks.
//!
//! Its rows are the shard's rows of the part (in memory, and on disk for a pull's keys) and
//! its tombstones; its clock is the table's. The steps are generic over the traits, so these
//! calls are monomorphised and inlined: the hot paths pay no dispatch and no allocation per
//! row.

use std::ops::{Deref, DerefMut};

use embstore_replication::{
    Held, PartStore, PartSync, PartView, PrioritisedRows, ReplyRows, Requester, SignificantStore,
};

use super::{Complete, PartReply, PrioritisedReply, Sv, Vv};
use crate::meta::PackedMeta;
use crate::shard::sync::{ShardSync, SigRow};
use crate::shard::Shard;
use crate::{Result, Table, Version};

/// A table pulls in the protocol's round (`embstore_replication::round`): its parts' knowledge
/// and [`Table::sync_apply`]. Implemented for `&Table` since the table applies under its
/// shards' locks, shared with readers and writers.
impl Requester for &Table {
    type Reply = PartReply;

    fn parts(&self) -> Result<u32> {
        self.sync_parts()
    }

    fn knowledge(&self, part: u32) -> Result<(Vv, Sv)> {
        self.sync_knowledge(part)
    }

    fn apply(&mut self, reply: &PartReply) -> Result<usize> {
        self.sync_apply(reply)
    }
}

impl ReplyRows for PartReply {
    fn part(&self) -> u32 {
        self.part
    }

    #[inline]
    fn rows(&self) -> usize {
        self.keys.len()
    }

    #[inline]
    fn key(&self, i: usize) -> u64 {
        self.keys[i]
    }

    #[inline]
    fn version(&self, i: usize) -> Version {
        self.meta[i].version
    }

    fn vv(&self) -> &Vv {
        &self.vv
    }

    fn sv(&self) -> Sv {
        self.sv
    }

    fn complete(&self) -> Option<&Complete> {
        self.complete.as_ref()
    }

    fn partial(&self) -> bool {
        self.partial
    }

    #[inline]
    fn sigv(&self, i: usize) -> Version {
        self.sigv.get(i).copied().unwrap_or_default()
    }

    fn svv(&self) -> Option<&Vv> {
        self.svv.as_ref()
    }
}

/// Part `sub` of a shard that syncs: `S` is the shard read (`&Shard`, to answer a pull) or
/// written (`&mut Shard`, to apply a reply), under its lock.
pub(crate) struct TablePart<'t, S> {
    table: &'t Table,
    shard: S,
    sub: usize,
    /// The metadata of a row a reply creates (its values and meta are then written over).
    created: PackedMeta,
}

impl<'t, 's> TablePart<'t, &'s Shard> {
    /// Part `sub` of `shard` (read-locked), to answer a pull.
    pub(crate) fn view(table: &'t Table, shard: &'s Shard, sub: usize) -> Self {
        Self { table, shard, sub, created: PackedMeta::default() }
    }
}

impl<'t, 's> TablePart<'t, &'s mut Shard> {
    /// Part `sub` of `shard` (write-locked), to apply a reply.
    pub(crate) fn store(table: &'t Table, shard: &'s mut Shard, sub: usize) -> Self {
        let created = PackedMeta::created(crate::version::now_ms());
        Self { table, shard, sub, created }
    }
}

impl<S: Deref<Target = Shard>> TablePart<'_, S> {
    #[inline]
    fn sy(&self) -> &ShardSync {
        self.shard.sync.as_ref().expect("a syncing table's shards sync")
    }
}

impl<S: DerefMut<Target = Shard>> TablePart<'_, S> {
    #[inline]
    fn sy_mut(&mut self) -> &mut ShardSync {
        self.shard.sync.as_mut().expect("a syncing table's shards sync")
    }
}

impl<S: Deref<Target = Shard>> PartView for TablePart<'_, S> {
    #[inline]
    fn sync(&self) -> &PartSync {
        &self.sy().parts[self.sub]
    }

    #[inline]
    fn floor(&self) -> &Vv {
        &self.sy().floors[self.sub]
    }

    fn keys(&self, out: &mut Vec<u64>) {
        let (shard, sy, sub) = (&*self.shard, self.sy(), self.sub);
        let mine = |&(k, _): &(u64, u64)| sy.sub(k) == sub;
        out.extend(shard.index.iter().filter(mine).map(|(k, _)| k));
        out.extend(shard.cold_entries().filter(mine).map(|(k, _)| k));
        out.extend(sy.tombs.keys().filter(|&&k| sy.sub(k) == sub));
    }
}

impl<S: DerefMut<Target = Shard>> PartStore for TablePart<'_, S> {
    type Reply = PartReply;
    type Slot = usize;

    #[inline]
    fn sync_mut(&mut self) -> &mut PartSync {
        let sub = self.sub;
        &mut self.sy_mut().parts[sub]
    }

    #[inline]
    fn floor_mut(&mut self) -> &mut Vv {
        let sub = self.sub;
        &mut self.sy_mut().floors[sub]
    }

    #[inline]
    fn held(&self, key: u64) -> Option<Held<usize>> {
        match self.shard.slot(key) {
            Some(slot) => Some(Held::Row(self.shard.meta[slot].unpack().version, slot)),
            None => self.sy().tombs.get(&key).map(|&v| Held::Tombstone(v)),
        }
    }

    fn put(&mut self, reply: &PartReply, i: usize, key: u64, at: Option<usize>) -> Result<()> {
        if reply.tombstone[i] {
            self.shard.remove_row(key);
            self.sy_mut().tombs.insert(key, reply.meta[i].version);
            return Ok(());
        }
        let (d, sd) = (self.table.dim(), self.table.state_dim);
        let slot = match at {
            Some(slot) => slot,
            None => self.shard.insert(key, self.created, &self.table.config.optimizer)?,
        };
        let shard = &mut *self.shard;
        shard.values.write(slot, &reply.values[i * d..][..d]);
        if let Some(st) = &reply.state {
            shard.state.row_mut(slot).copy_from_slice(&st[i * sd..][..sd]);
        }
        shard.set_meta(slot, key, PackedMeta::pack(&reply.meta[i]));
        let sy = self.sy_mut();
        sy.tombs.remove(&key);
        if reply.sigv.get(i).is_some_and(|v| *v != Version::default()) {
            sy.shared.sig_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    fn drop_key(&mut self, key: u64, held: Held<usize>) {
        self.sy_mut().supersede_significant(key, None);
        match held {
            Held::Tombstone(_) => {
                self.sy_mut().tombs.remove(&key);
            }
            Held::Row(..) => {
                self.shard.remove_row(key);
            }
        }
    }

    #[inline]
    fn observe(&mut self, v: Version) {
        self.table.clock.observe(v);
    }

    fn fresh_sv(&mut self) -> Sv {
        Sv::new(self.table.clock.tick().timestamp, self.table.clock.replica())
    }

    #[inline]
    fn supersede_significant(&mut self, key: u64, v: Version) {
        self.sy_mut().supersede_significant(key, Some(v));
    }
}

impl<S: DerefMut<Target = Shard>> SignificantStore for TablePart<'_, S> {
    type Prioritised = PrioritisedReply;

    fn significant(&self, key: u64) -> Option<Version> {
        self.sy().significant(key).map(|e| e.version)
    }

    fn put_significant(&mut self, reply: &PrioritisedReply, i: usize, key: u64) -> Result<()> {
        let d = self.table.dim();
        let values = (!reply.tombstone[i]).then(|| reply.values[i * d..][..d].into());
        let row = SigRow { version: reply.meta[i].version, sigv: reply.sigv[i], values };
        self.sy_mut().put_significant(key, row);
        Ok(())
    }
}

impl PrioritisedRows for PrioritisedReply {
    fn part(&self) -> u32 {
        self.part
    }

    fn rows(&self) -> usize {
        self.keys.len()
    }

    fn key(&self, i: usize) -> u64 {
        self.keys[i]
    }

    fn version(&self, i: usize) -> Version {
        self.meta[i].version
    }

    fn sigv(&self, i: usize) -> Version {
        self.sigv[i]
    }

    fn tsvv(&self) -> &Vv {
        &self.tsvv
    }
}
