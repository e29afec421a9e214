//! One replica of the simulator: rows in parts in `BTreeMap`s, each part's knowledge, cache
//! and floor, and the replica's clock. It runs the protocol's steps of [`crate::steps`] — the
//! ones the production table runs — through the part traits of [`crate::part`]:
//!
//! - [`Replica::local_write`]: tick and write are one step (W1), so versions enter each part
//!   in increasing order and `vv[self]` never passes a write not yet made
//!   ([`steps::note_local`]).
//! - [`Replica::serve_pull`]: [`steps::plan_pull`] reads the VV *before* selecting (R1) and
//!   picks the whole part, the update cache or a scan; [`steps::ships`] filters the rows.
//! - [`Replica::apply_reply`]: the reply is checked whole (a rejected one changes nothing),
//!   then [`steps::apply`] applies rows last-writer-wins and merges the VV only after the
//!   whole reply (R2), with the shard-version rule (S1, S2, S4).
//!
//! Every sv change is recorded in the [`ChangeIndex`], which lists the parts changed since a
//! cursor. Keys are placed by the table's [`PartMap`].
//!
//! Invariant (V3): for each part, origin `o` and write of version `v` from `o` with
//! `v.timestamp <= vv.get(o)`, the row's version is at least `v`.
//! The state machine is pure: no I/O, no threads, no wall clock (callers pass `now_ms`).

use crate::changes::ChangeIndex;
use crate::map::PartMap;
use crate::part::{Complete, Held, PartStore, PartSync, PartView, ReplyRows};
use crate::prioritised::{self, PrioritisedRows, SignificantStore};
use crate::round::Requester;
use crate::steps;
#[cfg(test)]
use crate::steps::Mutant;
use crate::sv::Sv;
use crate::version::{Clock, Version};
use crate::vv::Vv;
use embstore_common::{Error, ErrorKind, Result};
use std::collections::BTreeMap;

/// A row: its version and its values, or a removal's tombstone.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The version of the write that produced the values (or removed the row).
    pub version: Version,
    /// The embedding values (`dim` floats; none for a tombstone).
    pub values: Vec<f32>,
    /// Whether this is a tombstone: the row was removed.
    pub deleted: bool,
    /// The version of the row's newest significant write (`Version::ZERO`: none).
    pub sigv: Version,
}

impl Row {
    /// A row of `values` at `version`, with no significant write.
    pub fn new(version: Version, values: Vec<f32>) -> Self {
        Self { version, values, deleted: false, sigv: Version::ZERO }
    }
}

/// One part: its rows (in key order, so scans are deterministic) and its sync state.
#[derive(Clone, Debug, Default)]
struct Part {
    rows: BTreeMap<u64, Row>,
    /// The significant store: rows taken ahead of normal sync, newer than `rows`' (P2).
    significant: BTreeMap<u64, Row>,
    sync: PartSync,
    /// See [`PartView::floor`].
    floor: Vv,
}

/// A pull's answer: the rows the requester lacks and the responder's VV read before selecting.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The part.
    pub part: u32,
    /// `(key, row)` with `row.version.timestamp > vv_r.get(row.version.replica)`.
    pub rows: Vec<(u64, Row)>,
    /// The responder's knowledge of the part.
    pub vv_s: Vv,
    /// The responder's shard version, read with `vv_s`.
    pub sv_s: Sv,
    /// Whether the update cache answered (no scan).
    pub from_cache: bool,
    /// Set when the requester's VV did not dominate the responder's floor: `rows` is then the
    /// whole part, and this holds the responder's floor.
    pub complete: Option<Complete>,
    /// The responder's significant knowledge, read with `vv_s`.
    pub svv_s: Vv,
}

/// A prioritised pull's answer: the rows with significant writes the requester lacks (each
/// the newest of the responder's row and significant entry) and the responder's TSVV.
#[derive(Clone, Debug, PartialEq)]
pub struct PrioritisedReply {
    /// The part.
    pub part: u32,
    /// `(key, row)`, in key order.
    pub rows: Vec<(u64, Row)>,
    /// The responder's TSVV, read before selecting.
    pub tsvv_s: Vv,
}

impl PrioritisedRows for PrioritisedReply {
    fn part(&self) -> u32 {
        self.part
    }

    fn rows(&self) -> usize {
        self.rows.len()
    }

    fn key(&self, i: usize) -> u64 {
        self.rows[i].0
    }

    fn version(&self, i: usize) -> Version {
        self.rows[i].1.version
    }

    fn sigv(&self, i: usize) -> Version {
        self.rows[i].1.sigv
    }

    fn tsvv(&self) -> &Vv {
        &self.tsvv_s
    }
}

impl ReplyRows for Reply {
    fn part(&self) -> u32 {
        self.part
    }

    fn rows(&self) -> usize {
        self.rows.len()
    }

    fn key(&self, i: usize) -> u64 {
        self.rows[i].0
    }

    fn version(&self, i: usize) -> Version {
        self.rows[i].1.version
    }

    fn vv(&self) -> &Vv {
        &self.vv_s
    }

    fn sv(&self) -> Sv {
        self.sv_s
    }

    fn complete(&self) -> Option<&Complete> {
        self.complete.as_ref()
    }

    fn partial(&self) -> bool {
        false
    }

    fn sigv(&self, i: usize) -> Version {
        self.rows[i].1.sigv
    }

    fn svv(&self) -> Option<&Vv> {
        Some(&self.svv_s)
    }
}

/// A part as the steps see it: read (`P = &Part`) or changed (`P = &mut Part`, with the
/// replica's clock).
struct At<'a, P> {
    part: P,
    clock: Option<&'a mut Clock>,
    id: u32,
    #[cfg(test)]
    mutant: Mutant,
}

impl<P: std::ops::Deref<Target = Part>> PartView for At<'_, P> {
    fn sync(&self) -> &PartSync {
        &self.part.sync
    }

    fn floor(&self) -> &Vv {
        &self.part.floor
    }

    fn keys(&self, out: &mut Vec<u64>) {
        out.extend(self.part.rows.keys());
    }

    #[cfg(test)]
    fn mutant(&self) -> Mutant {
        self.mutant
    }
}

impl<P: std::ops::DerefMut<Target = Part>> SignificantStore for At<'_, P> {
    type Prioritised = PrioritisedReply;

    fn significant(&self, key: u64) -> Option<Version> {
        self.part.significant.get(&key).map(|r| r.version)
    }

    fn put_significant(&mut self, reply: &PrioritisedReply, i: usize, key: u64) -> Result<()> {
        self.part.significant.insert(key, reply.rows[i].1.clone());
        Ok(())
    }
}

impl<P: std::ops::DerefMut<Target = Part>> PartStore for At<'_, P> {
    type Reply = Reply;
    type Slot = ();

    fn sync_mut(&mut self) -> &mut PartSync {
        &mut self.part.sync
    }

    fn floor_mut(&mut self) -> &mut Vv {
        &mut self.part.floor
    }

    fn held(&self, key: u64) -> Option<Held<()>> {
        self.part.rows.get(&key).map(|r| {
            if r.deleted {
                Held::Tombstone(r.version)
            } else {
                Held::Row(r.version, ())
            }
        })
    }

    fn put(&mut self, reply: &Reply, i: usize, key: u64, _at: Option<()>) -> Result<()> {
        self.part.rows.insert(key, reply.rows[i].1.clone());
        Ok(())
    }

    fn drop_key(&mut self, key: u64, _held: Held<()>) {
        self.part.rows.remove(&key);
        self.part.significant.remove(&key);
    }

    fn supersede_significant(&mut self, key: u64, v: Version) {
        if self.part.significant.get(&key).is_some_and(|r| r.version <= v) {
            self.part.significant.remove(&key);
        }
    }

    fn observe(&mut self, v: Version) {
        if let Some(c) = &mut self.clock {
            c.observe(v.timestamp);
        }
    }

    fn fresh_sv(&mut self) -> Sv {
        // The clock runs out only after 2^64 ticks; then the last value is reused rather than
        // failing after rows were written.
        let c = self.clock.as_mut().map_or(u64::MAX, |c| c.tick(0).unwrap_or(u64::MAX));
        Sv::new(c, self.id)
    }
}

/// One replica of a table: sync parts (placed by a [`PartMap`]) of rows of `dim` floats.
#[derive(Clone, Debug)]
pub struct Replica {
    id: u32,
    dim: usize,
    map: PartMap,
    clock: Clock,
    parts: Vec<Part>,
    changes: ChangeIndex,
    /// Whether prioritised sync runs here (off: no significant entry, `tsvv = svv`, P4).
    priority: bool,
    /// Whether training writes are stopped (a rollback runs: step ①).
    stopped: bool,
    #[cfg(test)]
    pub(crate) mutant: Mutant,
    /// [`Mutant::TickOutsideLock`]'s version drawn early.
    #[cfg(test)]
    stash: Option<Version>,
}

impl Replica {
    /// A replica named `id` with the parts of `map`, of rows of `dim` floats.
    pub fn new(id: u32, map: PartMap, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::new(ErrorKind::InvalidArgument, "dim must be positive, got 0"));
        }
        let parts = map.parts();
        Ok(Self {
            id,
            dim,
            map,
            clock: Clock::new(),
            // Each part starts with its own sv, `(0, id)`: no two replicas share one.
            parts: (0..parts)
                .map(|_| Part {
                    sync: PartSync { sv: Sv::new(0, id), ..PartSync::default() },
                    ..Part::default()
                })
                .collect(),
            changes: ChangeIndex::new(parts),
            priority: true,
            stopped: false,
            #[cfg(test)]
            mutant: Mutant::None,
            #[cfg(test)]
            stash: None,
        })
    }

    /// A replica restarted from saved state (a witness's healthy store): `rows` placed in
    /// their parts and each part knowing `vvs[part]`; nothing cached, no floor, fresh svs.
    pub fn restored(
        id: u32,
        map: PartMap,
        dim: usize,
        rows: impl IntoIterator<Item = (u64, Row)>,
        vvs: &[Vv],
    ) -> Result<Self> {
        let mut r = Self::new(id, map, dim)?;
        if vvs.len() != r.parts.len() {
            return Err(Error::new(
                ErrorKind::ShapeMismatch,
                format!("{} parts, {} version vectors", r.parts.len(), vvs.len()),
            ));
        }
        for (key, row) in rows {
            if !row.deleted {
                r.check_dim(&row.values)?;
            }
            r.clock.observe(row.version.timestamp);
            let part = r.part_of(key) as usize;
            r.parts[part].sync.sig.note(key, row.sigv);
            r.parts[part].rows.insert(key, row);
        }
        for (p, vv) in r.parts.iter_mut().zip(vvs) {
            p.sync.cache = crate::cache::UpdateCache::covering(vv.clone());
            p.sync.vv = vv.clone();
        }
        Ok(r)
    }

    /// The replica's id (the origin of its writes).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The number of parts.
    pub fn parts(&self) -> u32 {
        self.parts.len() as u32
    }

    /// The part of `key`.
    pub fn part_of(&self, key: u64) -> u32 {
        self.map.part_of(key)
    }

    /// The clock's last timestamp.
    pub fn clock_last(&self) -> u64 {
        self.clock.last()
    }

    fn part(&self, part: u32) -> Result<&Part> {
        self.parts.get(part as usize).ok_or_else(|| self.bad_part(part))
    }

    fn bad_part(&self, part: u32) -> Error {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("part {part} out of range: the replica has {} parts", self.parts.len()),
        )
    }

    /// Part `part` read by the steps.
    fn view(&self, part: u32) -> Result<At<'_, &Part>> {
        Ok(At {
            part: self.part(part)?,
            clock: None,
            id: self.id,
            #[cfg(test)]
            mutant: self.mutant,
        })
    }

    /// The row of `key`, if stored.
    pub fn row(&self, key: u64) -> Option<&Row> {
        self.parts[self.part_of(key) as usize].rows.get(&key)
    }

    /// The rows of part `part` in key order.
    pub fn rows(&self, part: u32) -> Result<impl Iterator<Item = (u64, &Row)>> {
        Ok(self.part(part)?.rows.iter().map(|(k, r)| (*k, r)))
    }

    /// Part `part`'s sync state.
    pub fn sync(&self, part: u32) -> Result<&PartSync> {
        Ok(&self.part(part)?.sync)
    }

    fn check_dim(&self, values: &[f32]) -> Result<()> {
        if values.len() != self.dim {
            return Err(Error::new(
                ErrorKind::ShapeMismatch,
                format!("values must have {} floats, got {}", self.dim, values.len()),
            ));
        }
        Ok(())
    }

    /// Writes `key` here as origin (W1: the tick and the write are one step). Returns the
    /// write's version.
    pub fn local_write(&mut self, key: u64, values: Vec<f32>, now_ms: u64) -> Result<Version> {
        self.write_scored(key, values, now_ms, false)
    }

    /// Writes `key` here as origin, as [`Replica::local_write`]; a `significant` write (its
    /// priority at or above `p_k`) takes `sigv = v` ([`prioritised::note_significant`]).
    pub fn write_scored(
        &mut self,
        key: u64,
        values: Vec<f32>,
        now_ms: u64,
        significant: bool,
    ) -> Result<Version> {
        if self.stopped {
            return Err(Error::new(
                ErrorKind::RollingBack,
                format!("replica {} is rolling back: its writes are stopped", self.id),
            ));
        }
        self.write_unchecked(key, values, now_ms, significant)
    }

    /// Stops this replica's own writes (rollback step ①: they fail with
    /// [`ErrorKind::RollingBack`]) or resumes them; the rollback's writes
    /// ([`Replica::rollback_write`]) still go through.
    pub fn set_writes_stopped(&mut self, stopped: bool) {
        self.stopped = stopped;
    }

    /// A rollback's write of `key` (step ④): `Some(values)` writes them, `None` removes the
    /// row, at a fresh version above everything this replica has seen (writes stopped or not).
    pub fn rollback_write(
        &mut self,
        key: u64,
        values: Option<Vec<f32>>,
        now_ms: u64,
    ) -> Result<Version> {
        let stopped = std::mem::replace(&mut self.stopped, false);
        let out = match values {
            Some(v) => self.write_unchecked(key, v, now_ms, false),
            None => self.local_delete(key, now_ms),
        };
        self.stopped = stopped;
        out
    }

    fn write_unchecked(
        &mut self,
        key: u64,
        values: Vec<f32>,
        now_ms: u64,
        significant: bool,
    ) -> Result<Version> {
        self.check_dim(&values)?;
        let v = Version::new(self.clock.tick(now_ms)?, self.id);
        #[cfg(test)]
        let v = match (self.mutant, self.stash.take()) {
            (Mutant::TickOutsideLock, Some(early)) => early,
            (Mutant::TickOutsideLock, None) => {
                // Another writer drew `v` and has not written yet; this one draws after it
                // and writes first.
                self.stash = Some(v);
                Version::new(self.clock.tick(now_ms)?, self.id)
            }
            _ => v,
        };
        let part = self.part_of(key);
        let s = &mut self.parts[part as usize];
        let old_sigv = s.rows.get(&key).map_or(Version::ZERO, |r| r.sigv);
        let sigv = if significant { v } else { old_sigv };
        s.rows.insert(key, Row { version: v, values, deleted: false, sigv });
        // The newest write of the key is here: an entry taken ahead is superseded (P2).
        s.significant.remove(&key);
        if significant {
            prioritised::note_significant(&mut s.sync, key, v);
        }
        if steps::note_local(&mut s.sync, key, v, self.id) {
            self.changes.bump(part);
        }
        Ok(v)
    }

    /// Removes `key` here as origin: a tombstone at a fresh version (as a write). Returns its
    /// version.
    pub fn local_delete(&mut self, key: u64, now_ms: u64) -> Result<Version> {
        let v = self.write_scored(key, vec![0.0; self.dim], now_ms, false)?;
        let part = self.part_of(key) as usize;
        let row = self.parts[part].rows.get_mut(&key).expect("just written");
        row.values = Vec::new();
        row.deleted = true;
        Ok(v)
    }

    /// Collects the tombstones written `horizon_ms` or more before `now_ms`, raising their
    /// parts' floors.
    pub fn collect(&mut self, now_ms: u64, horizon_ms: u64) {
        for s in &mut self.parts {
            let (floor, sync, significant) = (&mut s.floor, &mut s.sync, &mut s.significant);
            s.rows.retain(|k, r| {
                let gone = r.deleted && steps::expired(r.version, now_ms, horizon_ms);
                if gone {
                    floor.raise(r.version.replica, r.version.timestamp);
                    // The key leaves the part, as a complete reply's drop.
                    significant.remove(k);
                    sync.sig.forget(*k);
                }
                !gone
            });
        }
    }

    /// Part `part`'s floor (see [`Reply::complete`]).
    pub fn floor(&self, part: u32) -> Result<&Vv> {
        Ok(&self.part(part)?.floor)
    }

    /// Answers a pull of part `part` from a requester knowing `vv_r`: the whole part when
    /// `vv_r` does not dominate the floor, else from the cache on a hit, else by a full scan
    /// (the production steps: [`steps::plan_pull`], [`steps::pull_keys`], [`steps::ships`]).
    pub fn serve_pull(&self, part: u32, vv_r: &Vv) -> Result<Reply> {
        let view = self.view(part)?;
        let pull = steps::plan_pull(&view, vv_r, true);
        let complete = pull.complete.is_some();
        let rows = steps::pull_keys(&view, &pull, vv_r)
            .into_iter()
            .filter_map(|k| view.part.rows.get(&k).map(|r| (k, r)))
            .filter(|(_, r)| steps::ships(r.version, vv_r, complete))
            .map(|(k, r)| (k, r.clone()))
            .collect();
        Ok(Reply {
            part,
            rows,
            vv_s: pull.vv,
            sv_s: pull.sv,
            from_cache: pull.from_cache,
            complete: pull.complete,
            svv_s: view.part.sync.svv.clone(),
        })
    }

    /// Answers a prioritised pull of part `part` from a requester whose TSVV is `tsvv_r`: the
    /// keys the index selects ([`prioritised::prioritised_keys`]), each as the newest of its
    /// row and significant entry. An error when priority is off here.
    pub fn serve_prioritised(&self, part: u32, tsvv_r: &Vv) -> Result<PrioritisedReply> {
        self.check_priority()?;
        let view = self.view(part)?;
        let plan = prioritised::plan_prioritised(&view);
        let entries = view.part.significant.iter().map(|(k, r)| (*k, r.sigv));
        let rows = prioritised::prioritised_keys(&view, tsvv_r, entries)
            .into_iter()
            .filter_map(|k| self.newest(view.part, k).map(|r| (k, r.clone())))
            .collect();
        Ok(PrioritisedReply { part, rows, tsvv_s: plan.tsvv })
    }

    /// The checker's reference for [`Replica::serve_prioritised`] (P5): a scan of every row
    /// and significant entry of the part for a sigv newer than `tsvv_r` knows.
    pub fn scan_prioritised(&self, part: u32, tsvv_r: &Vv) -> Result<Vec<(u64, Row)>> {
        let p = self.part(part)?;
        let keys: std::collections::BTreeSet<u64> =
            p.rows.keys().chain(p.significant.keys()).copied().collect();
        Ok(keys
            .into_iter()
            .filter(|k| {
                let sigv = [p.rows.get(k), p.significant.get(k)]
                    .into_iter()
                    .flatten()
                    .map(|r| r.sigv)
                    .max()
                    .unwrap_or(Version::ZERO);
                sigv != Version::ZERO && sigv.timestamp > tsvv_r.get(sigv.replica)
            })
            .filter_map(|k| self.newest(p, k).map(|r| (k, r.clone())))
            .collect())
    }

    /// The newer of `key`'s row and significant entry in part `p` (P3).
    fn newest<'a>(&self, p: &'a Part, key: u64) -> Option<&'a Row> {
        match (p.rows.get(&key), p.significant.get(&key)) {
            (Some(r), Some(s)) => Some(if s.version > r.version { s } else { r }),
            (r, s) => r.or(s),
        }
    }

    /// What an inference read of `key` returns: the newer of its row and its significant
    /// entry (P3).
    pub fn read(&self, key: u64) -> Option<&Row> {
        self.newest(&self.parts[self.part_of(key) as usize], key)
    }

    /// Part `part`'s significant store, in key order.
    pub fn significant(&self, part: u32) -> Result<impl Iterator<Item = (u64, &Row)>> {
        Ok(self.part(part)?.significant.iter().map(|(k, r)| (*k, r)))
    }

    /// Whether prioritised sync runs here.
    pub fn priority(&self) -> bool {
        self.priority
    }

    fn check_priority(&self) -> Result<()> {
        if self.priority {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("replica {} has prioritised sync off", self.id),
        ))
    }

    /// Turns prioritised sync off (a rollback, or the operator): every significant store
    /// emptied, `tsvv = svv` ([`prioritised::disable`], P4); or back on.
    pub fn set_priority(&mut self, on: bool) {
        self.priority = on;
        if !on {
            for s in &mut self.parts {
                s.significant.clear();
                prioritised::disable(&mut s.sync);
            }
        }
    }

    /// Applies a prioritised reply ([`prioritised::apply_prioritised`]), checked whole first;
    /// refused (nothing changed) when priority is off here. Returns the entries written.
    pub fn apply_prioritised(&mut self, reply: &PrioritisedReply) -> Result<usize> {
        self.check_priority()?;
        let part = reply.part;
        self.part(part)?;
        for (k, r) in &reply.rows {
            if !r.deleted {
                self.check_dim(&r.values)?;
            }
            if self.part_of(*k) != part {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("key {k} is not in part {part}"),
                ));
            }
        }
        let mut at = At {
            part: &mut self.parts[part as usize],
            clock: Some(&mut self.clock),
            id: self.id,
            #[cfg(test)]
            mutant: self.mutant,
        };
        prioritised::apply_prioritised(&mut at, reply)
    }

    /// The full-scan selection of part `part` (what a miss returns): the checker's reference
    /// for the update cache's answers (C3), written apart from the steps.
    pub fn scan_pull(&self, part: u32, vv_r: &Vv) -> Result<Vec<(u64, Row)>> {
        Ok(self
            .part(part)?
            .rows
            .iter()
            .filter(|(_, r)| r.version.timestamp > vv_r.get(r.version.replica))
            .map(|(k, r)| (*k, r.clone()))
            .collect())
    }

    /// Applies a pull's reply with [`steps::apply`]: each row last-writer-wins, then the VV
    /// merge (R2). The reply is checked whole first (part, row shapes, rows in their part), so
    /// a bad reply changes nothing. Returns how many rows were written.
    pub fn apply_reply(&mut self, reply: &Reply) -> Result<usize> {
        let part = reply.part;
        self.part(part)?;
        for (k, r) in &reply.rows {
            if !r.deleted {
                self.check_dim(&r.values)?;
            }
            if self.part_of(*k) != part {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("key {k} is not in part {part}"),
                ));
            }
        }
        let missing = steps::missing(&self.view(part)?, reply);
        let mut at = At {
            part: &mut self.parts[part as usize],
            clock: Some(&mut self.clock),
            id: self.id,
            #[cfg(test)]
            mutant: self.mutant,
        };
        let applied = steps::apply(&mut at, reply, &missing)?;
        if applied.sv_changed {
            self.changes.bump(part);
        }
        Ok(applied.written)
    }

    /// The parts whose sv changed after `cursor` with their svs, and the next cursor.
    pub fn changed_since(&self, cursor: u64) -> (Vec<(u32, Sv)>, u64) {
        let (changed_parts, upto) = self.changes.since(cursor);
        (changed_parts.into_iter().map(|g| (g, self.parts[g as usize].sync.sv)).collect(), upto)
    }

    /// Prunes every part's update cache to `now_ms - d_prop_ms`.
    pub fn prune(&mut self, now_ms: u64, d_prop_ms: u64) {
        for s in &mut self.parts {
            s.sync.cache.prune(now_ms, d_prop_ms);
        }
    }
}

/// The simulator's replica pulls in the production round ([`crate::round`]).
impl Requester for Replica {
    type Reply = Reply;

    fn parts(&self) -> Result<u32> {
        Ok(Replica::parts(self))
    }

    fn knowledge(&self, part: u32) -> Result<(Vv, Sv)> {
        let s = self.sync(part)?;
        Ok((s.vv.clone(), s.sv))
    }

    fn apply(&mut self, reply: &Reply) -> Result<usize> {
        self.apply_reply(reply)
    }

    #[cfg(test)]
    fn mutant(&self) -> Mutant {
        self.mutant
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `parts` parts in one shard.
    fn map(parts: u32) -> PartMap {
        PartMap::new(1, parts).unwrap()
    }

    #[test]
    fn bad_input_is_an_error_and_changes_nothing() {
        assert_eq!(PartMap::new(1, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let e = Replica::new(0, map(4), 0).unwrap_err();
        assert!(e.to_string().contains("dim must be positive, got 0"), "{e}");
        let mut r = Replica::new(1, map(4), 2).unwrap();
        let e = r.local_write(5, vec![1.0], 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        assert!(e.to_string().contains("values must have 2 floats, got 1"), "{e}");
        assert!(r
            .serve_pull(9, &Vv::new())
            .unwrap_err()
            .to_string()
            .contains("part 9 out of range: the replica has 4 parts"));
        let mut src = Replica::new(2, map(4), 2).unwrap();
        src.local_write(5, vec![1.0, 2.0], 10).unwrap();
        let part = src.part_of(5);
        let mut reply = src.serve_pull(part, &Vv::new()).unwrap();
        reply.rows.push((5, Row::new(Version::new(99, 2), vec![0.0])));
        assert_eq!(r.apply_reply(&reply).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        reply.rows.pop();
        reply.part = (part + 1) % 4;
        assert!(r.apply_reply(&reply).unwrap_err().to_string().contains("is not in part"));
        assert!(r.row(5).is_none());
        assert_eq!(r.sync(part).unwrap().vv, Vv::new());
    }

    #[test]
    fn a_pull_ships_only_what_the_requester_lacks() {
        let mut p = Replica::new(0, map(1), 1).unwrap();
        let mut f = Replica::new(1, map(1), 1).unwrap();
        p.local_write(1, vec![1.0], 10).unwrap();
        f.apply_reply(&p.serve_pull(0, &f.sync(0).unwrap().vv).unwrap()).unwrap();
        p.local_write(2, vec![2.0], 11).unwrap();
        let reply = p.serve_pull(0, &f.sync(0).unwrap().vv).unwrap();
        assert_eq!(reply.rows.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2]);
        f.apply_reply(&reply).unwrap();
        assert_eq!(f.sync(0).unwrap().vv, p.sync(0).unwrap().vv);
        assert!(p.serve_pull(0, &f.sync(0).unwrap().vv).unwrap().rows.is_empty());
        // The follower's next own write is above everything it applied (observe).
        assert!(f.local_write(3, vec![3.0], 0).unwrap().timestamp > p.sync(0).unwrap().vv.get(0));
    }

    /// The mutant that merges the VV without all rows leaves knowledge (V3) without the row:
    /// the VV covers a write the part does not hold, so no later pull would resend it.
    #[test]
    fn the_drop_last_row_mutant_breaks_knowledge() {
        let mut p = Replica::new(0, map(1), 1).unwrap();
        let mut f = Replica::new(1, map(1), 1).unwrap();
        f.mutant = Mutant::DropLastRow;
        let v1 = p.local_write(1, vec![1.0], 10).unwrap();
        let v2 = p.local_write(2, vec![2.0], 10).unwrap();
        f.apply_reply(&p.serve_pull(0, &Vv::new()).unwrap()).unwrap();
        assert!(f.sync(0).unwrap().vv.get(0) >= v2.timestamp);
        assert_eq!(f.row(1).map(|r| r.version), Some(v1));
        assert!(f.row(2).is_none());
        assert!(p.serve_pull(0, &f.sync(0).unwrap().vv).unwrap().rows.is_empty());
    }

    /// S4: two replicas with equal VVs and different svs that pull from each other
    /// concurrently end with equal svs after one exchange each.
    #[test]
    fn concurrent_pulls_settle_on_one_sv() {
        let mut a = Replica::new(0, map(1), 1).unwrap();
        let mut b = Replica::new(1, map(1), 1).unwrap();
        a.local_write(1, vec![1.0], 10).unwrap();
        b.local_write(2, vec![2.0], 10).unwrap();
        // Both ask at once, then both apply: each learns the other's write, so each VV changes
        // to one the responder did not have and each names it with a fresh sv.
        let (ra, rb) = (
            b.serve_pull(0, &a.sync(0).unwrap().vv).unwrap(),
            a.serve_pull(0, &b.sync(0).unwrap().vv).unwrap(),
        );
        a.apply_reply(&ra).unwrap();
        b.apply_reply(&rb).unwrap();
        let (sa, sb) = (a.sync(0).unwrap().sv, b.sync(0).unwrap().sv);
        assert_eq!(a.sync(0).unwrap().vv, b.sync(0).unwrap().vv);
        assert_ne!(sa, sb);
        assert!(!sa.succeq(&sb) && !sb.succeq(&sa));
        let (ra, rb) = (
            b.serve_pull(0, &a.sync(0).unwrap().vv).unwrap(),
            a.serve_pull(0, &b.sync(0).unwrap().vv).unwrap(),
        );
        assert!(ra.rows.is_empty() && rb.rows.is_empty());
        a.apply_reply(&ra).unwrap();
        b.apply_reply(&rb).unwrap();
        assert_eq!(a.sync(0).unwrap().sv, b.sync(0).unwrap().sv);
        assert_eq!(a.sync(0).unwrap().sv, sa.max(sb));
        // Each sv change was listed by the change index.
        let (changed, upto) = a.changed_since(0);
        assert_eq!(changed, vec![(0, sa.max(sb))]);
        assert!(a.changed_since(upto).0.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// V2 (LWW): any permutation, with duplicates, of a set of row writes leaves each key's
        /// max-version row.
        #[test]
        fn lww_leaves_the_max(writes in proptest::collection::btree_map((0u64..1000, 0u32..4), (0u64..6, -5i32..5), 1..40),
                              order in proptest::collection::vec(any::<proptest::sample::Index>(), 1..120)) {
            let writes: Vec<(u64, Row)> = writes.into_iter()
                .map(|((ts, o), (k, x))| (k, Row::new(Version::new(ts + 1, o), vec![x as f32])))
                .collect();
            let mut r = Replica::new(9, map(1), 1).unwrap();
            // Every write at least once, then the random duplicates, in a shuffled order.
            let mut seq: Vec<usize> = (0..writes.len()).collect();
            seq.extend(order.iter().map(|i| i.index(writes.len())));
            for (i, j) in order.iter().enumerate() {
                let a = i % seq.len();
                let b = j.index(seq.len());
                seq.swap(a, b);
            }
            for i in seq {
                let reply = Reply { part: 0, rows: vec![writes[i].clone()], vv_s: Vv::new(), sv_s: Sv::default(), from_cache: false, complete: None, svv_s: Vv::new() };
                r.apply_reply(&reply).unwrap();
            }
            let mut best: BTreeMap<u64, &Row> = BTreeMap::new();
            for (k, row) in &writes {
                if best.get(k).is_none_or(|b| row.version > b.version) { best.insert(*k, row); }
            }
            for (k, row) in best {
                prop_assert_eq!(r.row(k), Some(row));
            }
        }
    }
}
