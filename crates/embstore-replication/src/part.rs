//! What the protocol's steps ([`crate::steps`]) need of a part, as traits: the seam between
//! the steps and the stores that run them.
//!
//! - [`PartView`]: what answering a pull reads — the part's [`PartSync`] (VV, update cache,
//!   shard version), its floor and the keys it holds.
//! - [`PartStore`]: what applying a reply changes — the version a key holds, a row written,
//!   a key dropped, the clock observing a version or issuing a fresh shard version.
//! - [`ReplyRows`]: what the apply step reads of a reply — per row its key and version, and
//!   the responder's knowledge.
//!
//! The production table implements them over a shard under its lock (`embstore-table`'s
//! `sync/part.rs`), the simulator's [`crate::Replica`] over its rows in a `BTreeMap`; both run
//! the same steps. The steps are generic over these traits, so each store's calls are
//! monomorphised: no dynamic dispatch and no allocation per row.

use crate::cache::UpdateCache;
use crate::sig::SigIndex;
use crate::sv::Sv;
use crate::version::Version;
use crate::vv::Vv;
use embstore_common::Result;

/// The sync bookkeeping of one part.
#[derive(Clone, Debug, Default)]
pub struct PartSync {
    /// The part's knowledge.
    pub vv: Vv,
    /// Recently written keys and the dominator VV.
    pub cache: UpdateCache,
    /// The shard version: names `vv` (equal svs, equal VVs).
    pub sv: Sv,
    /// Significant knowledge (Ekko Alg 2's SVV): per origin, the newest significant write
    /// the part's rows hold (`svv ⊑ vv`, P1).
    pub svv: Vv,
    /// Transient significant knowledge (TSVV): `svv` and the significant writes taken ahead
    /// of normal sync by prioritised pulls (`svv ⊑ tsvv`, P1).
    pub tsvv: Vv,
    /// The keys of significant writes, by their significant version.
    pub sig: SigIndex,
}

/// A reply (or a piece of one) that holds every row of its part in a key range: the requester
/// drops its rows in that range that the reply lacks and that the reply's VV covers (the
/// responder saw them, and no longer has them: they were removed), then raises its floor to
/// `floor`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Complete {
    /// The key range, inclusive.
    pub lo: u64,
    pub hi: u64,
    /// The responder's floor of the part.
    pub floor: Vv,
}

impl Complete {
    /// The whole part, with the responder's `floor`.
    pub fn whole(floor: Vv) -> Self {
        Self { lo: 0, hi: u64::MAX, floor }
    }

    /// Whether `key` is in the range.
    pub fn covers(&self, key: u64) -> bool {
        (self.lo..=self.hi).contains(&key)
    }
}

/// What a key holds in a part: a row (with where it is, for [`PartStore::put`]) or a
/// removal's tombstone, at a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held<S> {
    /// A row at a version (a row created by a lookup and never written is at
    /// [`Version::ZERO`]).
    Row(Version, S),
    /// A removal's tombstone.
    Tombstone(Version),
}

impl<S> Held<S> {
    /// The version held.
    pub fn version(&self) -> Version {
        match self {
            Held::Row(v, _) | Held::Tombstone(v) => *v,
        }
    }
}

/// The rows of a reply, as the apply step reads them (the payloads stay the store's).
pub trait ReplyRows {
    /// The part the reply is for.
    fn part(&self) -> u32;
    /// Rows (and tombstones) carried.
    fn rows(&self) -> usize;
    /// The key of row `i`.
    fn key(&self, i: usize) -> u64;
    /// The version of row `i`.
    fn version(&self, i: usize) -> Version;
    /// The responder's knowledge of the part, read before its rows were selected (R1).
    fn vv(&self) -> &Vv;
    /// The responder's shard version, read with [`ReplyRows::vv`].
    fn sv(&self) -> Sv;
    /// Set when the reply holds every row of the part in a key range (the requester was
    /// behind the responder's floor).
    fn complete(&self) -> Option<&Complete>;
    /// Whether more pieces of the reply follow: its rows are applied, its knowledge waits for
    /// the last piece (R2).
    fn partial(&self) -> bool;
    /// The significant version of row `i` (`Version::ZERO`: none known; a store that does
    /// not prioritise sends none).
    fn sigv(&self, _i: usize) -> Version {
        Version::ZERO
    }
    /// The responder's significant knowledge, read with [`ReplyRows::vv`] (none: the
    /// responder does not prioritise).
    fn svv(&self) -> Option<&Vv> {
        None
    }
}

/// What answering a pull reads of a part.
pub trait PartView {
    /// The part's VV, update cache and shard version.
    fn sync(&self) -> &PartSync;
    /// Per origin, the newest tombstone collected here or at a responder this part took a
    /// complete reply from: a requester whose VV does not dominate it gets the part whole.
    fn floor(&self) -> &Vv;
    /// Appends every key the part holds, rows (wherever they live) and tombstones, in any
    /// order.
    fn keys(&self, out: &mut Vec<u64>);
    /// The simulator's way to break a step (tests only).
    #[cfg(test)]
    fn mutant(&self) -> crate::steps::Mutant {
        crate::steps::Mutant::None
    }
}

/// What applying a reply changes in a part.
pub trait PartStore: PartView {
    /// The replies this part takes.
    type Reply: ReplyRows + ?Sized;
    /// Where a held row is (the table's slot), so that a row is looked up once.
    type Slot: Copy;
    /// The part's VV, update cache and shard version, to change.
    fn sync_mut(&mut self) -> &mut PartSync;
    /// The part's floor, to raise.
    fn floor_mut(&mut self) -> &mut Vv;
    /// What `key` holds, if anything.
    fn held(&self, key: u64) -> Option<Held<Self::Slot>>;
    /// Writes row `i` of `reply` (a row or a tombstone) over what `key` holds (`at`: where
    /// its row is, if it has one). The step has decided that the row is newer.
    fn put(
        &mut self,
        reply: &Self::Reply,
        i: usize,
        key: u64,
        at: Option<Self::Slot>,
    ) -> Result<()>;
    /// Drops `key`'s row or tombstone, and its significant entry if the store keeps one (an
    /// entry only ever arrives early: normal sync brings what it held).
    fn drop_key(&mut self, key: u64, held: Held<Self::Slot>);
    /// Makes the clock's later versions exceed `v` (a version applied from a peer).
    fn observe(&mut self, v: Version);
    /// Drops `key`'s entry of the significant store when its version is at most `v` (the
    /// store's row now holds `v`: P2). A store that keeps no significant rows does nothing.
    fn supersede_significant(&mut self, _key: u64, _v: Version) {}
    /// A shard version never issued before (from this replica's clock).
    fn fresh_sv(&mut self) -> Sv;
}
