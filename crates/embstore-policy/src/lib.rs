//! # embstore-policy: what to keep, for the store and for the inference cache
//!
//! Both layers that hold rows in memory must choose what leaves when memory is full. They
//! choose differently, so this crate holds **two roles, not one trait**:
//!
//! | role | trait | unit | who calls it, and how |
//! |---|---|---|---|
//! | store eviction | [`Eviction`] | a slot (a row in a shard's memory) | a shard: `on_access` concurrently under the shard's *read* lock (`&self`, atomics), everything else under its write lock; the *store* decides when rows leave (`victims`) |
//! | cache policy | [`Policy`] | a request (all keys of one lookup) | one thread at a time (`&mut self` for every call, the caller shards and locks); the *policy* decides, inside each commit, what to evict |
//!
//! The concurrency contracts are why they stay apart: an `Eviction` must take accesses from many
//! readers at once and names victims only when asked, while a `Policy` sees a whole request
//! (probe first, then commit) and evicts as part of admitting it. Two adapters cross between
//! the roles: [`PolicyEviction`] runs a cache policy ([`Evictable`]: `lru`, `lfu`,
//! `group_lfu`) as a shard's `Eviction`, and [`EvictionPolicy`] runs a store `Eviction` (the
//! store's default [`LruLfu`]) as a request-level `Policy`, so the cache's perfect-hit
//! evaluator can score the store's own choice.
//!
//! ## Parts
//! - [`eviction`] — the store's per-slot side: the [`Eviction`] trait and [`EvictionConfig`]
//!   (`eviction/mod.rs`); [`Noop`] (`eviction/noop.rs`); [`LruLfu`], a CLOCK recency segment in front
//!   of a sampled-LFU frequency segment (`eviction/lru_lfu.rs`); [`PolicyEviction`], a cache
//!   policy as an `Eviction` (`eviction/adapter.rs`); [`EvictionPolicy`], an `Eviction` as a
//!   request-level `Policy` (`eviction/as_policy.rs`).
//! - [`request`] — the request-level side: the [`Policy`] trait, [`RequestOutcome`], [`Group`],
//!   [`PolicyConfig`] (`request/mod.rs`) and the policies [`GroupLfu`] / [`EvLfuPaper`],
//!   [`GroupAssoc`], [`EvArc`], [`Lru`], [`Lfu`], one file each; [`Evictable`], the slot-level
//!   side of a policy that lets it run under `PolicyEviction`.
//! - [`index`] — the key → slot index the list-based policies are built on (4 B a bucket), with
//!   the `fmix64` hasher and a deterministic [`KeySet`](index::KeySet); the cache's surrogate map
//!   and evaluator use it too.
//! - `request/lists.rs` (private) — the slot arena with intrusive doubly linked lists that
//!   gives the list-based policies O(1) moves and a deterministic eviction order.
//!
//! Layers inside the crate: `index` ← `request` ← `eviction` (the store's side names the
//! request-level side for its adapters and `EvictionConfig::Policy`; never the other way).
//!
//! ## One config namespace
//! [`EvictionConfig`] (store) and [`PolicyConfig`] (cache) both live here and parse the same
//! way: a name, `-` and `_` alike, any case, default parameters, `NAMES` listing what is
//! accepted. `EvictionConfig::parse` takes `lru_lfu`, `none` and the evictable cache policies
//! (`lru`, `lfu`, `group_lfu`); `PolicyConfig::parse` takes the six cache policies.
//!
//! ## Invariants
//! - Store eviction: `victims` names only live, unpinned slots, each once, at most `n`, and as
//!   many as there are up to `n` (`Noop` names none); the same calls on policies built with
//!   the same seed give the same victims.
//! - Cache policies: hit flags are taken before the request changes anything (probe-first);
//!   never more than `capacity` keys resident; a request that cannot be kept whole is served
//!   partially and reported as bypassed; deterministic in (configuration, key sequence).
//! - Nothing here panics on any input; errors are [`Error`] with an [`ErrorKind`]. The cache
//!   policies never block; the store side blocks only on `PolicyEviction`'s short stripe locks.

mod error;
pub mod eviction;
pub mod index;
pub mod request;
#[cfg(test)]
mod rng;

pub use error::{Error, ErrorKind, Result};
pub use eviction::{Eviction, EvictionConfig, EvictionPolicy, LruLfu, Noop, PolicyEviction};
pub use request::{
    EvArc, EvArcConfig, EvLfuPaper, Evictable, Flush, Group, GroupAssoc, GroupAssocConfig,
    GroupAssocStats, GroupLfu, GroupLfuConfig, GroupLfuStats, Lfu, LfuConfig, Lru, Policy,
    PolicyConfig, RequestOutcome, Rule, NO_SLOT,
};
