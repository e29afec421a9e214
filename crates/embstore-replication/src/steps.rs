//! The protocol's steps, once: how a responder answers a pull and how a requester applies the
//! reply (Ekko §4.3, §4.4), generic over the part traits of [`crate::part`].
//!
//! The production table (`embstore-table`'s `sync_pull` / `sync_apply`) and the simulator's
//! [`crate::Replica`] both call these functions, so the simulator's checks run against the
//! production steps, not a model of them.
//!
//! - Local write ([`note_local`]): the part knows the write, caches it, and takes the write's
//!   timestamp as its new shard version (W1: in the same locked step as the row).
//! - Pull ([`plan_pull`], [`pull_keys`], [`ships`]): the part's VV and sv are read before any
//!   row (R1); a requester whose VV does not dominate the floor gets the part whole
//!   ([`Complete`]), one whose VV dominates the update cache's DVV gets the cache's selection
//!   (C3), any other a scan's; a row ships when its version is newer than what the requester
//!   knows of its origin.
//! - Apply ([`missing`], [`apply`]): rows last-writer-wins, never a write the part already
//!   knows of; a complete reply's floor and the rows it lacks that its VV covers (removed at
//!   the responder); then, after the last row (R2), the VV merge and the sv rule (S1, S2, S4).
//! - Collection ([`expired`]): when a tombstone is old enough to be collected.

use crate::part::{Complete, Held, PartStore, PartSync, PartView, ReplyRows};
use crate::sv::Sv;
use crate::version::Version;
use crate::vv::Vv;
use embstore_common::Result;

/// A way to break a step, so the simulator's tests show its checker catches it.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mutant {
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
    /// End a part's pull in a round on any whole reply for it, even one whose knowledge is
    /// not the listed one (a late reply of an earlier pull): the listed change is then never
    /// pulled (the round's rule, [`crate::round`]).
    UnpendOnAnyReply,
    /// Draw versions before the write step (as a call that ticks outside the shard lock): every
    /// other write takes a version drawn earlier than one already written (the replica's
    /// local write, not a shared step).
    TickOutsideLock,
}

/// `mutant!(p, M)`: whether part `p` breaks the protocol as the `Mutant` `M` (never outside
/// tests, where the expression is `false`).
#[cfg(test)]
macro_rules! mutant {
    ($p:expr, $m:ident) => {
        $p.mutant() == Mutant::$m
    };
}
#[cfg(not(test))]
macro_rules! mutant {
    ($p:expr, $m:ident) => {
        false
    };
}

/// A local write of `key` at version `v` (drawn under the part's lock) by replica `writer`:
/// the part knows it, caches it and takes a new shard version, `(v.timestamp, writer)` (a
/// fresh tick of the writer's clock). Returns whether the sv changed (the rows of one batch
/// share a version: the part's change is then recorded once).
pub fn note_local(s: &mut PartSync, key: u64, v: Version, writer: u32) -> bool {
    s.vv.raise(v.replica, v.timestamp);
    s.cache.on_write(key, v);
    let sv = Sv::new(v.timestamp, writer);
    let changed = s.sv != sv;
    s.sv = sv;
    changed
}

/// Whether a tombstone of version `v` is collected at `now_ms` under a horizon of
/// `horizon_ms` (its removal is that old).
#[inline]
pub fn expired(v: Version, now_ms: u64, horizon_ms: u64) -> bool {
    v.ms().saturating_add(horizon_ms) <= now_ms
}

/// How a pull is answered: the part's knowledge, read before any row (R1), and which rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Pull {
    /// The responder's VV of the part.
    pub vv: Vv,
    /// The responder's shard version, read with `vv`.
    pub sv: Sv,
    /// Set when the requester is behind the floor: every row of the part is shipped.
    pub complete: Option<Complete>,
    /// Whether the update cache answers (no scan).
    pub from_cache: bool,
}

/// How part `p` answers a requester knowing `vv_r`: the whole part when `vv_r` does not
/// dominate the floor, else from the update cache when `vv_r` dominates its DVV (and
/// `use_cache`), else by a scan. The knowledge is read here, before the rows (R1).
pub fn plan_pull<P: PartView + ?Sized>(p: &P, vv_r: &Vv, use_cache: bool) -> Pull {
    let s = p.sync();
    let (vv, sv) = (s.vv.clone(), s.sv);
    if !mutant!(p, IgnoreFloor) && !vv_r.dominates(p.floor()) {
        // Behind removals whose tombstones are gone: every row, in key order.
        let complete = Some(Complete::whole(p.floor().clone()));
        return Pull { vv, sv, complete, from_cache: false };
    }
    let from_cache = use_cache && (mutant!(p, SkipDvvCheck) || s.cache.hits(vv_r));
    Pull { vv, sv, complete: None, from_cache }
}

/// The keys to read for `pull` (planned by [`plan_pull`] for `vv_r`): the cache's selection,
/// or every key of the part (in key order for a complete reply). Each key's row ships when
/// [`ships`] says so.
pub fn pull_keys<P: PartView + ?Sized>(p: &P, pull: &Pull, vv_r: &Vv) -> Vec<u64> {
    if pull.from_cache {
        return p.sync().cache.select(vv_r);
    }
    let mut keys = Vec::new();
    p.keys(&mut keys);
    if pull.complete.is_some() {
        keys.sort_unstable();
    }
    keys
}

/// Whether a row (or tombstone) at version `v` goes to a requester knowing `vv_r`: when it is
/// newer than what `vv_r` knows of its origin, or always in a `complete` reply. A row created
/// by a lookup and never written (version 0) is no write and never ships (the requester's
/// lookups compute its initial values alike).
#[inline]
pub fn ships(v: Version, vv_r: &Vv, complete: bool) -> bool {
    v != Version::ZERO && (complete || v.timestamp > vv_r.get(v.replica))
}

/// The keys part `p` holds in the range of `reply`'s [`Complete`] that the reply lacks, in
/// key order (none for a reply that is not complete). [`apply`] drops those that the reply's
/// VV covers; a store that must prepare the keys it touches (bring rows from disk) lists them
/// first.
pub fn missing<P, R>(p: &P, reply: &R) -> Vec<u64>
where
    P: PartView + ?Sized,
    R: ReplyRows + ?Sized,
{
    let Some(c) = reply.complete() else {
        return Vec::new();
    };
    let mut theirs: Vec<u64> = (0..reply.rows()).map(|i| reply.key(i)).collect();
    theirs.sort_unstable();
    let mut out = Vec::new();
    p.keys(&mut out);
    out.retain(|&k| c.covers(k) && theirs.binary_search(&k).is_err());
    out.sort_unstable();
    out.dedup();
    out
}

/// What [`apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Rows and tombstones written, and rows dropped.
    pub written: usize,
    /// Whether the part's shard version changed (the change index records it).
    pub sv_changed: bool,
}

/// Applies `reply` (checked whole by the caller) to part `p`; `missing` is [`missing`]`(p,
/// reply)`. Each row whose version is newer than what its key holds, and whose write the part
/// does not know of yet, is written (last writer wins; a known write is never applied again,
/// so a stale reply cannot bring back a row whose removal's tombstone was collected). A
/// complete reply raises the floor and drops the missing keys its VV covers. Then, unless the
/// reply is partial, the part learns the responder's knowledge (R2: after the last row).
pub fn apply<P: PartStore + ?Sized>(
    p: &mut P,
    reply: &P::Reply,
    missing: &[u64],
) -> Result<Applied> {
    let mut n = reply.rows();
    if mutant!(p, DropLastRow) {
        n = n.saturating_sub(1);
    }
    let reapply = mutant!(p, ReapplyKnown);
    let mut written = 0;
    for i in 0..n {
        let (key, v) = (reply.key(i), reply.version(i));
        let held = p.held(key);
        // Last writer wins: an equal version is the same write.
        if v <= held.map_or(Version::ZERO, |h| h.version()) {
            continue;
        }
        if !reapply && v.timestamp <= p.sync().vv.get(v.replica) {
            continue;
        }
        p.observe(v);
        let at = match held {
            Some(Held::Row(_, at)) => Some(at),
            _ => None,
        };
        p.put(reply, i, key, at)?;
        p.supersede_significant(key, v);
        let sigv = reply.sigv(i);
        let s = p.sync_mut();
        s.cache.on_write(key, v);
        s.sig.note(key, sigv);
        written += 1;
    }
    if let Some(c) = reply.complete() {
        // Every piece raises the floor (floors only ever force complete parts, so early is
        // safe): between pieces, a peer pulling from here is behind what was dropped.
        p.floor_mut().merge(&c.floor);
        let vv_s = reply.vv();
        for &key in missing {
            let Some(h) = p.held(key) else { continue };
            let v = h.version();
            if v.timestamp > vv_s.get(v.replica) {
                // Written after the responder's knowledge: not removed there.
                continue;
            }
            match h {
                // Dropped as the responder collected it: below this part's floor from now on.
                Held::Tombstone(v) => p.floor_mut().raise(v.replica, v.timestamp),
                Held::Row(..) => written += 1,
            }
            p.drop_key(key, h);
            p.sync_mut().sig.forget(key);
        }
    }
    if reply.partial() {
        return Ok(Applied { written, sv_changed: false });
    }
    let sv_changed = learn(p, reply.vv(), reply.sv());
    if let Some(svv_s) = reply.svv() {
        crate::prioritised::learn_significant(p.sync_mut(), svv_s);
    }
    Ok(Applied { written, sv_changed })
}

/// R2's last step: the part's VV merges the responder's `vv_s`; the sv becomes the responder's
/// `sv_s` when the VVs are now equal (the larger of the two when they already were, so that
/// two peers pulling from each other settle on one, S4), a fresh one when the VV changed to
/// knowledge no one has named, and stays otherwise. Returns whether the sv changed.
fn learn<P: PartStore + ?Sized>(p: &mut P, vv_s: &Vv, sv_s: Sv) -> bool {
    let adopt_anyway = mutant!(p, AlwaysAdoptSv);
    let s = p.sync_mut();
    let (was_same, grows) = (s.vv == *vv_s, !s.vv.dominates(vv_s));
    s.vv.merge(vv_s);
    let old = s.sv;
    if adopt_anyway || s.vv == *vv_s {
        s.sv = if was_same { old.max(sv_s) } else { sv_s };
    } else if grows {
        let sv = p.fresh_sv();
        p.sync_mut().sv = sv;
    }
    p.sync().sv != old
}
