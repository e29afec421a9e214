//! [`Link`]: a requester's side of the wire to one responder, as the round of
//! [`crate::round`] uses it.
//!
//! A follower's round is the same wherever its messages travel: ask the responder which parts
//! changed since a cursor, pull the parts this replica lacks with its VVs, apply the replies.
//! Only the carrying differs, so it is a trait with two implementations: the TCP connection
//! to a sync port (`embstore-sync`'s follower) and the simulator's network ([`crate::sim`]),
//! whose drops, duplicates, reorders, delays and partitions happen inside its implementation.
//! The round that both run is the production round, so the simulator's faults exercise it.
//!
//! The exchange is split into sends and receives, not one call per pull, because the TCP
//! follower pipelines: every pull of a round goes out at once (they are small), then the
//! replies are read in order, so a round costs two round trips whatever its number of pulls.

use crate::changes::Changes;
use crate::vv::Vv;
use embstore_common::Result;

/// A change list asked of a responder: the parts whose shard version changed after `cursor`
/// of `epoch` (every part for another epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListAsk {
    /// The responder's epoch the cursor belongs to (0: none yet).
    pub epoch: u64,
    /// The cursor the last list returned (0: from the beginning).
    pub cursor: u64,
    /// How long the responder may wait for a change before it answers (a long-poll), in ms.
    pub wait_ms: u32,
}

/// A requester's side of the wire to one responder.
///
/// Replies come back in exchanges: the one a [`Link::list`] opens (rows of small changes that
/// the responder sends with its list) and one per [`Link::pull`], in the order they were
/// opened; [`Link::next`] reads the next reply of the oldest open exchange, `None` at its end.
/// A link may lose, repeat or reorder replies (the simulator's does): the round keeps a part
/// pending until a reply for it is applied, and applying is idempotent.
pub trait Link {
    /// A reply to a pull of one part (or a piece of one).
    type Reply;

    /// Asks which parts changed (see [`ListAsk`]) and opens the exchange of the rows the
    /// responder sends with its answer. An error (a broken connection, a timeout, a refusal)
    /// ends the round; the caller retries later.
    fn list(&mut self, ask: &ListAsk) -> Result<Changes>;

    /// Sends one pull of `parts`, each with the requester's VV of it, and opens its exchange.
    fn pull(&mut self, parts: &[(u32, Vv)]) -> Result<()>;

    /// The next reply of the oldest open exchange; `None` when it has ended (TCP: the
    /// responder's end-of-pull frame; the simulator: nothing more has arrived).
    fn next(&mut self) -> Result<Option<Self::Reply>>;
}
