//! Prioritised sync (Ekko §5.2.2, Alg 2), as steps over a part: significant writes travel
//! ahead of normal sync on a congested link, into a transient *significant store* that reads
//! consult first, until normal sync brings the row (or a newer one) into the store.
//!
//! - Local write ([`note_significant`]): a significant write's row takes `sigv = v`, the part's
//!   SVV and TSVV learn it, its key enters the [`crate::sig::SigIndex`].
//! - Normal sync ([`crate::steps::apply`]): rows carry their sigv; a row written into the store
//!   supersedes a significant entry at or below its version (P2); the reply's SVV merges into
//!   the part's SVV and TSVV after the last row ([`learn_significant`]).
//! - Prioritised pull ([`plan_prioritised`], [`prioritised_keys`]): the responder reads its
//!   TSVV first, then selects the keys whose sigv the requester's TSVV lacks from its index
//!   (no scan of the part: the index is the sigv column of its rows) and from its significant
//!   store's entries (small and transient, each with its sigv), each shipped as the newest of
//!   its store row and its significant entry.
//! - Prioritised apply ([`apply_prioritised`]): a row newer than both the store's and the
//!   significant store's enters the significant store; the TSVV merges after the last row.
//! - [`disable`]: priority off (a rollback, or the operator): the significant store is
//!   emptied by the caller and `tsvv = svv` (P4).
//!
//! Invariants (spec §5.4): P1 `svv ⊑ vv`, `svv ⊑ tsvv`; P2 no significant entry at or below
//! the store's row; P3 a read returns the newer copy; P4 priority off ⇒ no significant entry,
//! `tsvv = svv`; P5 the index's selection equals a scan of the sigv column.

use crate::part::{PartStore, PartSync, PartView};
use crate::version::Version;
use crate::vv::Vv;
use embstore_common::Result;

/// A local write of `key` at `v` was significant: its row's sigv is `v` (the caller keeps it
/// with the row or in the index only), the part's SVV and TSVV learn it.
pub fn note_significant(s: &mut PartSync, key: u64, v: Version) {
    s.svv.raise(v.replica, v.timestamp);
    s.tsvv.raise(v.replica, v.timestamp);
    s.sig.note(key, v);
}

/// After a normal reply's last row: the part's SVV merges the responder's, and the TSVV the
/// result (`UpdateSVV`).
pub fn learn_significant(s: &mut PartSync, svv_s: &Vv) {
    s.svv.merge(svv_s);
    let svv = s.svv.clone();
    s.tsvv.merge(&svv);
}

/// Priority off for the part: `tsvv = svv` (the caller empties its significant store).
pub fn disable(s: &mut PartSync) {
    s.tsvv = s.svv.clone();
}

/// How a prioritised pull is answered: the responder's TSVV, read before any row.
#[derive(Clone, Debug, PartialEq)]
pub struct PrioritisedPull {
    /// The responder's transient significant knowledge.
    pub tsvv: Vv,
}

/// Reads part `p`'s TSVV for a prioritised pull (before any row is selected).
pub fn plan_prioritised<P: PartView + ?Sized>(p: &P) -> PrioritisedPull {
    PrioritisedPull { tsvv: p.sync().tsvv.clone() }
}

/// The keys a requester knowing `tsvv_r` lacks significant writes of, in key order: those of
/// the part's rows (the index) and those of the significant store's entries (`significant`:
/// each entry's key and sigv; the store is small and transient, so it is scanned). Each key
/// ships as the newest of its row and its entry.
pub fn prioritised_keys<P: PartView + ?Sized>(
    p: &P,
    tsvv_r: &Vv,
    significant: impl Iterator<Item = (u64, Version)>,
) -> Vec<u64> {
    let mut keys = p.sync().sig.select(tsvv_r);
    let before = keys.len();
    keys.extend(
        significant
            .filter(|(_, sigv)| *sigv != Version::ZERO && sigv.timestamp > tsvv_r.get(sigv.replica))
            .map(|(k, _)| k),
    );
    if keys.len() > before {
        keys.sort_unstable();
        keys.dedup();
    }
    keys
}

/// What a prioritised reply holds, as [`apply_prioritised`] reads it.
pub trait PrioritisedRows {
    /// The part the reply is for.
    fn part(&self) -> u32;
    /// Rows carried.
    fn rows(&self) -> usize;
    /// The key of row `i`.
    fn key(&self, i: usize) -> u64;
    /// The version of row `i`.
    fn version(&self, i: usize) -> Version;
    /// The significant version of row `i`.
    fn sigv(&self, i: usize) -> Version;
    /// The responder's TSVV, read before its rows were selected.
    fn tsvv(&self) -> &Vv;
}

/// A part that keeps a significant store beside its rows (each entry with its row's sigv; the
/// part's index covers its rows only, so emptying the store leaves the index true).
pub trait SignificantStore: PartStore {
    /// The prioritised replies this part takes.
    type Prioritised: PrioritisedRows + ?Sized;
    /// The version of `key`'s significant entry, if it has one.
    fn significant(&self, key: u64) -> Option<Version>;
    /// Puts row `i` of `reply` into the significant store as `key`'s entry (the step has
    /// decided it is newer than the store's row and the entry before).
    fn put_significant(&mut self, reply: &Self::Prioritised, i: usize, key: u64) -> Result<()>;
}

/// Applies a prioritised reply (checked whole by the caller): each row newer than both the
/// store's row and the significant entry of its key becomes the entry; then the part's TSVV
/// merges the responder's (after the last row). Returns the entries written.
pub fn apply_prioritised<P: SignificantStore + ?Sized>(
    p: &mut P,
    reply: &P::Prioritised,
) -> Result<usize> {
    let mut written = 0;
    for i in 0..reply.rows() {
        let (key, v) = (reply.key(i), reply.version(i));
        let store = p.held(key).map_or(Version::ZERO, |h| h.version());
        let sig = p.significant(key).unwrap_or(Version::ZERO);
        if v <= store.max(sig) || v.timestamp <= p.sync().vv.get(v.replica) {
            continue;
        }
        p.observe(v);
        p.put_significant(reply, i, key)?;
        written += 1;
    }
    p.sync_mut().tsvv.merge(reply.tsvv());
    Ok(written)
}
