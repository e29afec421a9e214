//! A follower's pull round (Ekko's four steps), once: [`round`] runs it for any store that
//! pulls ([`Requester`]) over any [`Link`].
//!
//! 1. List: ask the responder which parts changed since the cursor (a long-poll, without
//!    waiting while parts are pending); a new epoch (the responder restarted, or the first
//!    round) starts the book over. Rows of small changes may come with the list.
//! 2. Choose: of the pending parts, keep those whose shard version here does not already
//!    succeed the responder's (S1: then this replica knows all the responder knows).
//! 3. Pull: every pull goes out at once, each with this replica's VV of its parts.
//! 4. Apply: each reply through the requester (which runs [`crate::steps::apply`]); a part
//!    stays pending until a whole reply with the shard version the responder listed (or a
//!    newer one) is applied, so a lost reply, a broken connection or a refused reply is
//!    pulled again without the responder listing it again, and a late reply of an earlier
//!    pull (a link that reorders) does not stand for the change listed since.
//!
//! The production follower (`embstore-sync`, over TCP into a table) and the simulator
//! ([`crate::sim`], over its faulty network into a [`crate::Replica`]) both call [`round`], so
//! the simulator's drops, duplicates, reorders and partitions exercise this code.

use std::collections::{BTreeSet, HashMap};

use crate::link::{Link, ListAsk};
use crate::part::ReplyRows;
use crate::sv::Sv;
use crate::vv::Vv;
use embstore_common::Result;

/// The side of a round that pulls: a store's parts as the round reads and changes them.
pub trait Requester {
    /// The replies this store applies.
    type Reply: ReplyRows;
    /// The number of parts.
    fn parts(&self) -> Result<u32>;
    /// Part `part`'s VV and shard version.
    fn knowledge(&self, part: u32) -> Result<(Vv, Sv)>;
    /// Checks `reply` whole and applies it ([`crate::steps::apply`]); returns the rows
    /// written. A refused reply changes nothing.
    fn apply(&mut self, reply: &Self::Reply) -> Result<usize>;
    /// The simulator's way to break the round (tests only).
    #[cfg(test)]
    fn mutant(&self) -> crate::steps::Mutant {
        crate::steps::Mutant::None
    }
}

/// What a requester knows of one responder's parts (the neighbour book), kept across rounds
/// and across reconnections to the same responder.
#[derive(Clone, Debug, Default)]
pub struct Book {
    /// The responder's epoch of `cursor`.
    pub epoch: u64,
    /// The cursor of the responder's change list.
    pub cursor: u64,
    /// The responder's shard version of each part it listed.
    pub their_sv: HashMap<u32, Sv>,
    /// The parts listed (or all, without the skip) that no applied reply has answered yet.
    pub pending: BTreeSet<u32>,
}

/// How a round runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundOptions {
    /// How long the list may wait at the responder for a change, in ms.
    pub wait_ms: u32,
    /// Whether parts whose shard version here succeeds the responder's are skipped (`false`
    /// pulls every part every round: only for measuring what shard versions gain).
    pub skip_by_sv: bool,
    /// Parts asked for in one pull.
    pub parts_per_pull: usize,
}

impl Default for RoundOptions {
    fn default() -> Self {
        Self { wait_ms: 0, skip_by_sv: true, parts_per_pull: 256 }
    }
}

/// Called after each reply a round applies, with the rows it wrote and whether it came with
/// the change list (a follower's status and events).
pub type Seen<'a, T> = dyn FnMut(&T, usize, bool) -> Result<()> + 'a;

/// What a round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Pull requests sent.
    pub pulls: u64,
    /// Pending parts skipped because this replica's sv succeeds the responder's.
    pub skipped: u64,
    /// Parts still pending after the round (0: caught up with the responder's list).
    pub pending: usize,
    /// Rows (and tombstones) written, and rows dropped, by the replies applied.
    pub written: usize,
}

/// One pull round of `local` from the responder at the other end of `link` (see the module
/// docs). `seen` is called after each reply is applied, with the rows it wrote and whether it
/// came with the list. An error of the link or of a reply ends the round; the book keeps what
/// is pending, so the next round (on this link or a new one) pulls it again.
pub fn round<R, L>(
    local: &mut R,
    link: &mut L,
    book: &mut Book,
    options: &RoundOptions,
    seen: &mut Seen<'_, R::Reply>,
) -> Result<Round>
where
    R: Requester + ?Sized,
    L: Link<Reply = R::Reply> + ?Sized,
{
    let ask = ListAsk {
        epoch: book.epoch,
        cursor: book.cursor,
        // With parts pending (a lost reply), ask without waiting.
        wait_ms: if book.pending.is_empty() { options.wait_ms } else { 0 },
    };
    let changes = link.list(&ask)?;
    if changes.epoch != book.epoch {
        // The responder restarted (or this is the first round): its list is complete.
        book.their_sv.clear();
        book.pending.clear();
    }
    for &(p, sv) in &changes.parts {
        book.their_sv.insert(p, sv);
        book.pending.insert(p);
    }
    let mut done = Round::default();
    // The rows of small changes come with the list: those parts are done.
    done.written += drain(local, link, book, true, seen)?;
    let inlined: BTreeSet<u32> =
        changes.parts.iter().map(|&(p, _)| p).filter(|p| !book.pending.contains(p)).collect();
    (book.epoch, book.cursor) = (changes.epoch, changes.upto);
    if !options.skip_by_sv {
        // Every part, every round: what a replica without shard versions must do (but those
        // that just came with the list).
        book.pending.extend((0..local.parts()?).filter(|p| !inlined.contains(p)));
        book.their_sv.clear();
    }
    let mut todo = Vec::new();
    for &p in &book.pending {
        let mine = local.knowledge(p)?.1;
        if !book.their_sv.get(&p).is_some_and(|sv| mine.succeq(sv)) {
            todo.push(p);
        }
    }
    done.skipped = (book.pending.len() - todo.len()) as u64;
    book.pending = todo.iter().copied().collect();
    // Every pull goes out at once, then the replies are read in order.
    let batches: Vec<&[u32]> = todo.chunks(options.parts_per_pull.max(1)).collect();
    for batch in &batches {
        let parts =
            batch.iter().map(|&p| Ok((p, local.knowledge(p)?.0))).collect::<Result<Vec<_>>>()?;
        link.pull(&parts)?;
        done.pulls += 1;
    }
    for _ in &batches {
        done.written += drain(local, link, book, false, seen)?;
    }
    done.pending = book.pending.len();
    Ok(done)
}

/// Applies the replies of the oldest open exchange of `link`; returns the rows written.
fn drain<R, L>(
    local: &mut R,
    link: &mut L,
    book: &mut Book,
    inline: bool,
    seen: &mut Seen<'_, R::Reply>,
) -> Result<usize>
where
    R: Requester + ?Sized,
    L: Link<Reply = R::Reply> + ?Sized,
{
    let mut written = 0;
    while let Some(reply) = link.next()? {
        let n = local.apply(&reply)?;
        // A part is answered by a whole reply (R2: its last piece carries the knowledge) whose
        // knowledge holds what the responder listed (its shard version succeeds the listed
        // one): an older reply (a link that reorders, or a reply of an earlier round) does
        // not stand for the change listed since, and a newer one (the part written again
        // between the list and the pull) holds it, so a hot part is not pulled twice.
        let p = reply.part();
        #[cfg(test)]
        let any = local.mutant() == crate::steps::Mutant::UnpendOnAnyReply;
        #[cfg(not(test))]
        let any = false;
        if !reply.partial() && (any || book.their_sv.get(&p).is_none_or(|sv| reply.sv().succeq(sv)))
        {
            book.pending.remove(&p);
        }
        seen(&reply, n, inline)?;
        written += n;
    }
    Ok(written)
}
