//! # embstore-replication: Ekko-style dissemination as a pure state machine
//!
//! Replicas of a table exchange the *current state* of changed rows, never a log: a requester
//! sends a part's version vector, the responder returns every row newer than it together
//! with its own VV, and the requester applies them last-writer-wins. The parts:
//!
//! - [`version`]: [`Version`] `(timestamp = ms << 16 | ctr, replica)` and the [`Clock`]
//!   (strictly increasing ticks, `observe`).
//! - [`vv`]: [`Vv`], a part's knowledge (get, merge = pointwise max, dominates).
//! - [`cache`]: [`UpdateCache`], the recently written keys and the dominator VV that let a pull
//!   skip the scan.
//! - [`sv`]: [`Sv`], shard versions: a name for a part's knowledge; `succeq` lets a
//!   requester skip a pull that cannot bring anything.
//! - [`changes`]: [`changes::ChangeIndex`], the parts whose sv changed since a cursor.
//! - [`map`]: [`PartMap`], the one key → part map (a table's shards split into parts).
//! - [`part`]: what the steps need of a part, as traits ([`PartView`], [`PartStore`],
//!   [`ReplyRows`]), and a part's [`PartSync`].
//! - [`steps`]: the protocol's steps, once: a local write, answering a pull, applying a reply.
//! - [`priority`]: SLO-aware priority (Ekko §5.2): scoring updates, the `k`-th percentile
//!   over a window, which writes are significant; when a link is congested.
//! - [`sig`], [`prioritised`]: significant versions and prioritised sync (Alg 2): the
//!   significant store, its knowledge (SVV, TSVV) and the steps that keep it.
//! - [`witness`]: a witness (§5.3.2): a replica whose updates wait in time-bucketed logs,
//!   flushed into a healthy store at healthy decisions; the diff a rollback writes.
//!   The production table (`embstore-table`) implements the part traits over its shards and
//!   calls these functions; so does the simulator's replica.
//! - [`link`]: [`Link`], a requester's side of the wire to one responder (list, pull, the
//!   replies); TCP (`embstore-sync`) and the simulator's network implement it.
//! - [`round`]: a follower's pull round, once, over a [`Requester`] (the store that pulls)
//!   and a [`Link`]: the TCP follower and the simulator both run it.
//! - [`replica`]: [`Replica`], the simulator's replica: rows in parts, running [`steps`].
//! - [`sim`]: a deterministic simulated network (drop, duplicate, reorder, delay, partition)
//!   and the checker of the protocol's invariants against a global history of writes. Because
//!   the replicas run the production steps and pull in production rounds over a [`Link`], the
//!   simulator tests the production protocol.
//!
//! Invariants: versions from one replica strictly increase; LWW leaves the max version; a
//! part's VV covers only writes its rows hold (V3); VVs and row versions only grow; after a
//! partition heals and traffic quiesces, all replicas hold identical rows and VVs. Nothing here
//! does I/O or reads a clock, so every run replays from its seed.

pub mod cache;
pub mod changes;
pub mod link;
pub mod map;
pub mod part;
pub mod prioritised;
pub mod priority;
pub mod replica;
pub mod round;
pub mod sig;
pub mod sim;
pub mod steps;
pub mod sv;
pub mod version;
pub mod vv;
pub mod witness;

pub use cache::UpdateCache;
pub use link::{Link, ListAsk};
pub use map::{PartMap, MAX_PARTS};
pub use part::{Complete, Held, PartStore, PartSync, PartView, ReplyRows};
pub use prioritised::{PrioritisedRows, SignificantStore};
pub use priority::{
    Congestion, CongestionConfig, EkkoPriority, Prioritiser, PriorityConfig, PriorityFn, Sample,
    Scored, Snapshot, Stats, Update,
};
pub use replica::{PrioritisedReply, Replica, Reply, Row};
pub use round::{round, Book, Requester, Round, RoundOptions};
pub use sig::SigIndex;
pub use sv::Sv;
pub use version::{next_timestamp, Clock, Version};
pub use vv::Vv;
pub use witness::{choose_t_max, Corrupted, Logged, Witness, WitnessLog};
