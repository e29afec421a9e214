//! One replica's sync state machine: rows in parts, each part's knowledge and cache, and
//! the three steps of pull-based sync (Ekko §4.3).
//!
//! - [`Replica::local_write`]: tick and write are one step (W1), so versions enter each part
//!   in increasing order and `vv[self]` never passes a write not yet made.
//! - [`Replica::serve_pull`]: the responder reads its VV *before* selecting (R1); a row that
//!   changes after the read only gets newer, so it still passes the filter.
//! - [`Replica::apply_reply`]: the requester applies rows last-writer-wins and merges the VV
//!   only after the whole reply (R2). A reply that is rejected changes nothing.
//!
//! Each part also carries a shard version ([`Sv`]): a new one on every local write, and on
//! apply either the responder's (when the merged VV equals its VV) or a new one (when the VV
//! changed otherwise), so that equal svs mean equal VVs (S1, S2). Every sv change is recorded
//! in the [`ChangeIndex`], which lists the parts changed since a cursor.
//!
//! Invariant (V3): for each part, origin `o` and write of version `v` from `o` with
//! `v.timestamp <= vv.get(o)`, the row's version is at least `v`.
//! The state machine is pure: no I/O, no threads, no wall clock (callers pass `now_ms`).

use crate::cache::UpdateCache;
use crate::changes::ChangeIndex;
use crate::sv::Sv;
use crate::version::{Clock, Version};
use crate::vv::Vv;
use embstore_common::{fmix64, Error, ErrorKind, Result};
use std::collections::BTreeMap;

/// The most sync parts a replica may have (2^20, as the spec clamps them).
pub const MAX_PARTS: u32 = 1 << 20;

/// A row: its version and its values, or a removal's tombstone.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The version of the write that produced the values (or removed the row).
    pub version: Version,
    /// The embedding values (`dim` floats; none for a tombstone).
    pub values: Vec<f32>,
    /// Whether this is a tombstone: the row was removed.
    pub deleted: bool,
}

/// The sync bookkeeping of one part.
#[derive(Clone, Debug, Default)]
pub struct PartSync {
    /// The part's knowledge.
    pub vv: Vv,
    /// Recently written keys and the dominator VV.
    pub cache: UpdateCache,
    /// The shard version: names `vv` (equal svs, equal VVs).
    pub sv: Sv,
}

/// One part: its rows (in key order, so scans are deterministic) and its sync state.
#[derive(Clone, Debug, Default)]
struct Part {
    rows: BTreeMap<u64, Row>,
    sync: PartSync,
    /// Per origin, the newest tombstone collected here or at a responder this part took a
    /// complete reply from: a requester whose VV does not dominate it gets the part whole.
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
    /// whole part, and this is the responder's floor.
    pub complete: Option<Vv>,
}

/// A way for [`Replica::apply_reply`] to break R2, so tests can show the checker catches it.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// The correct protocol.
    #[default]
    None,
    /// Apply a reply's row even when the part already knows of its write (a stale reply
    /// then brings back a row whose removal's tombstone was collected).
    ReapplyKnown,
    /// Answer every pull incrementally, ignoring the floor (collected tombstones are then
    /// never learnt by a requester that was behind them).
    IgnoreFloor,
    /// Merge the VV but drop the reply's last row (a merge before all rows were applied).
    DropLastRow,
    /// Adopt the responder's sv even when the merged VV differs from its VV.
    AlwaysAdoptSv,
    /// Answer every pull from the update cache, without checking the requester's VV against
    /// the DVV (the hit rule).
    SkipDvvCheck,
    /// Draw versions before the write step (as a call that ticks outside the shard lock): every
    /// other write takes a version drawn earlier than one already written.
    TickOutsideLock,
}

/// One replica of a table: `parts` sync parts of rows of `dim` floats.
#[derive(Clone, Debug)]
pub struct Replica {
    id: u32,
    dim: usize,
    clock: Clock,
    parts: Vec<Part>,
    changes: ChangeIndex,
    #[cfg(test)]
    pub(crate) mutant: Mutant,
    /// [`Mutant::TickOutsideLock`]'s version drawn early.
    #[cfg(test)]
    stash: Option<Version>,
}

/// The part of `key` among `parts` (the upper hash bits, so that it stays independent of
/// a table shard chosen by the lower ones).
pub fn part_of(key: u64, parts: u32) -> u32 {
    ((fmix64(key) >> 32) % u64::from(parts.max(1))) as u32
}

impl Replica {
    /// A replica named `id` with `parts` parts of rows of `dim` floats.
    pub fn new(id: u32, parts: u32, dim: usize) -> Result<Self> {
        if parts == 0 || parts > MAX_PARTS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("parts must be in 1..={MAX_PARTS}, got {parts}"),
            ));
        }
        if dim == 0 {
            return Err(Error::new(ErrorKind::InvalidArgument, "dim must be positive, got 0"));
        }
        Ok(Self {
            id,
            dim,
            clock: Clock::new(),
            // Each part starts with its own sv, `(0, id)`: no two replicas share one.
            parts: (0..parts)
                .map(|_| Part {
                    sync: PartSync { sv: Sv::new(0, id), ..PartSync::default() },
                    ..Part::default()
                })
                .collect(),
            changes: ChangeIndex::new(parts),
            #[cfg(test)]
            mutant: Mutant::None,
            #[cfg(test)]
            stash: None,
        })
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
        part_of(key, self.parts())
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
        let part = self.part_of(key) as usize;
        let s = &mut self.parts[part];
        s.rows.insert(key, Row { version: v, values, deleted: false });
        s.sync.vv.raise(self.id, v.timestamp);
        s.sync.cache.on_write(key, v);
        // The write's own timestamp is a fresh tick of this replica: a new sv without a tick.
        s.sync.sv = Sv::new(v.timestamp, self.id);
        self.changes.bump(part as u32);
        Ok(v)
    }

    /// Removes `key` here as origin: a tombstone at a fresh version (as a write). Returns its
    /// version.
    pub fn local_delete(&mut self, key: u64, now_ms: u64) -> Result<Version> {
        let v = self.local_write(key, vec![0.0; self.dim], now_ms)?;
        let part = self.part_of(key) as usize;
        self.parts[part].rows.insert(key, Row { version: v, values: Vec::new(), deleted: true });
        Ok(v)
    }

    /// Collects the tombstones written `horizon_ms` or more before `now_ms`, raising their
    /// parts' floors.
    pub fn collect(&mut self, now_ms: u64, horizon_ms: u64) {
        for s in &mut self.parts {
            let floor = &mut s.floor;
            s.rows.retain(|_, r| {
                let keep = !r.deleted || r.version.ms().saturating_add(horizon_ms) > now_ms;
                if !keep {
                    floor.raise(r.version.replica, r.version.timestamp);
                }
                keep
            });
        }
    }

    /// Part `part`'s floor (see [`Reply::complete`]).
    pub fn floor(&self, part: u32) -> Result<&Vv> {
        Ok(&self.part(part)?.floor)
    }

    /// Answers a pull of part `part` from a requester knowing `vv_r`: the whole part when
    /// `vv_r` does not dominate the floor, else from the cache on a hit, else by a full scan.
    pub fn serve_pull(&self, part: u32, vv_r: &Vv) -> Result<Reply> {
        let s = self.part(part)?;
        // R1: the knowledge is read before the selection starts.
        let vv_s = s.sync.vv.clone();
        let sv_s = s.sync.sv;
        #[cfg(test)]
        let ignore_floor = self.mutant == Mutant::IgnoreFloor;
        #[cfg(not(test))]
        let ignore_floor = false;
        if !ignore_floor && !vv_r.dominates(&s.floor) {
            let rows = s.rows.iter().map(|(k, r)| (*k, r.clone())).collect();
            let complete = Some(s.floor.clone());
            return Ok(Reply { part, rows, vv_s, sv_s, from_cache: false, complete });
        }
        #[cfg(test)]
        let hit = self.mutant == Mutant::SkipDvvCheck || s.sync.cache.hits(vv_r);
        #[cfg(not(test))]
        let hit = s.sync.cache.hits(vv_r);
        if hit {
            let rows = s
                .sync
                .cache
                .select(vv_r)
                .into_iter()
                .filter_map(|k| s.rows.get(&k).map(|r| (k, r.clone())))
                .collect();
            return Ok(Reply { part, rows, vv_s, sv_s, from_cache: true, complete: None });
        }
        let rows = Self::scan(s, vv_r);
        Ok(Reply { part, rows, vv_s, sv_s, from_cache: false, complete: None })
    }

    /// The full-scan selection of part `part` (what a miss returns), for comparisons.
    pub fn scan_pull(&self, part: u32, vv_r: &Vv) -> Result<Vec<(u64, Row)>> {
        Ok(Self::scan(self.part(part)?, vv_r))
    }

    fn scan(s: &Part, vv_r: &Vv) -> Vec<(u64, Row)> {
        s.rows
            .iter()
            .filter(|(_, r)| r.version.timestamp > vv_r.get(r.version.replica))
            .map(|(k, r)| (*k, r.clone()))
            .collect()
    }

    /// Applies a pull's reply: each row last-writer-wins, then the VV merge (R2). The reply is
    /// checked whole first (part, row shapes, rows in their part), so a bad reply changes
    /// nothing. Returns how many rows were written.
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
        #[cfg(test)]
        let (rows, adopt_anyway): (&[(u64, Row)], bool) = match self.mutant {
            Mutant::None => (&reply.rows, false),
            Mutant::DropLastRow => (&reply.rows[..reply.rows.len().saturating_sub(1)], false),
            Mutant::AlwaysAdoptSv => (&reply.rows, true),
            _ => (&reply.rows, false),
        };
        #[cfg(not(test))]
        let (rows, adopt_anyway): (&[(u64, Row)], bool) = (&reply.rows, false);
        let s = &mut self.parts[part as usize];
        let mut written = 0;
        for (k, r) in rows {
            // A write this part already knows of is never applied again: it holds that
            // write or a newer one, or a newer removal whose tombstone it has collected (a
            // stale reply must not bring the row back).
            #[cfg(test)]
            let guard = self.mutant != Mutant::ReapplyKnown;
            #[cfg(not(test))]
            let guard = true;
            if guard && r.version.timestamp <= s.sync.vv.get(r.version.replica) {
                continue;
            }
            // LWW: an equal version is the same write, so only a strictly newer one is applied.
            if s.rows.get(k).is_none_or(|old| r.version > old.version) {
                s.rows.insert(*k, r.clone());
                s.sync.cache.on_write(*k, r.version);
                self.clock.observe(r.version.timestamp);
                written += 1;
            }
        }
        if let Some(floor) = &reply.complete {
            // The whole part: a row held here that the responder saw (its VV covers it)
            // and no longer has was removed there, its tombstone collected.
            let theirs: std::collections::BTreeSet<u64> =
                reply.rows.iter().map(|(k, _)| *k).collect();
            let vv_s = &reply.vv_s;
            let before = s.rows.len();
            s.rows.retain(|k, r| {
                theirs.contains(k) || r.version.timestamp > vv_s.get(r.version.replica)
            });
            written += before - s.rows.len();
            s.floor.merge(floor);
        }
        let before = s.sync.vv.clone();
        s.sync.vv.merge(&reply.vv_s);
        let old_sv = s.sync.sv;
        if adopt_anyway || s.sync.vv == reply.vv_s {
            // Same knowledge as the responder: take its name. When it was already the same,
            // keep the numerically larger, so two replicas that pull from each other settle
            // on one sv instead of swapping forever (S4).
            s.sync.sv = if before == reply.vv_s { old_sv.max(reply.sv_s) } else { reply.sv_s };
        } else if s.sync.vv != before {
            // New knowledge no one has named: a fresh sv. The clock runs out only after 2^64
            // ticks; then the last value is reused rather than failing after rows were written.
            let c = self.clock.tick(0).unwrap_or(u64::MAX);
            s.sync.sv = Sv::new(c, self.id);
        }
        if s.sync.sv != old_sv {
            self.changes.bump(part);
        }
        Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_input_is_an_error_and_changes_nothing() {
        assert_eq!(Replica::new(0, 0, 4).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let e = Replica::new(0, 4, 0).unwrap_err();
        assert!(e.to_string().contains("dim must be positive, got 0"), "{e}");
        let mut r = Replica::new(1, 4, 2).unwrap();
        let e = r.local_write(5, vec![1.0], 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        assert!(e.to_string().contains("values must have 2 floats, got 1"), "{e}");
        assert!(r
            .serve_pull(9, &Vv::new())
            .unwrap_err()
            .to_string()
            .contains("part 9 out of range: the replica has 4 parts"));
        let mut src = Replica::new(2, 4, 2).unwrap();
        src.local_write(5, vec![1.0, 2.0], 10).unwrap();
        let part = src.part_of(5);
        let mut reply = src.serve_pull(part, &Vv::new()).unwrap();
        reply
            .rows
            .push((5, Row { version: Version::new(99, 2), values: vec![0.0], deleted: false }));
        assert_eq!(r.apply_reply(&reply).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        reply.rows.pop();
        reply.part = (part + 1) % 4;
        assert!(r.apply_reply(&reply).unwrap_err().to_string().contains("is not in part"));
        assert!(r.row(5).is_none());
        assert_eq!(r.sync(part).unwrap().vv, Vv::new());
    }

    #[test]
    fn a_pull_ships_only_what_the_requester_lacks() {
        let mut p = Replica::new(0, 1, 1).unwrap();
        let mut f = Replica::new(1, 1, 1).unwrap();
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
        let mut p = Replica::new(0, 1, 1).unwrap();
        let mut f = Replica::new(1, 1, 1).unwrap();
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
        let mut a = Replica::new(0, 1, 1).unwrap();
        let mut b = Replica::new(1, 1, 1).unwrap();
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
                .map(|((ts, o), (k, x))| (k, Row { version: Version::new(ts + 1, o), values: vec![x as f32], deleted: false }))
                .collect();
            let mut r = Replica::new(9, 1, 1).unwrap();
            // Every write at least once, then the random duplicates, in a shuffled order.
            let mut seq: Vec<usize> = (0..writes.len()).collect();
            seq.extend(order.iter().map(|i| i.index(writes.len())));
            for (i, j) in order.iter().enumerate() {
                let a = i % seq.len();
                let b = j.index(seq.len());
                seq.swap(a, b);
            }
            for i in seq {
                let reply = Reply { part: 0, rows: vec![writes[i].clone()], vv_s: Vv::new(), sv_s: Sv::default(), from_cache: false, complete: None };
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
