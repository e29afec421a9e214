//! Request-level L1 replacement policies over u64 keys, with a capacity in entries.
//!
//! ## Parts
//! - [`Policy`] — the trait: [`Policy::access_request`] probes all keys of one request
//!   (read-only), then commits it (updates hits, admits misses, evicts as needed) and reports
//!   per-key hit flags *as of the probe*, plus bypass and evictions ([`RequestOutcome`]).
//! - [`Lru`], [`Lfu`] — per-key baselines (key by key, like libCacheSim's `get`).
//! - [`GroupLfu`] — the design note's L1: EV-LFU's group score with request pinning and O(S)
//!   aging; [`EvLfuPaper`] — the faithful EV-LFU of the paper/artifact, for ablations.
//! - [`EvArc`] — the paper's EV-ARC (§2.5 of the note), an ablation.
//! - [`GroupAssoc`] — the group score plus a hit counter in a set-associative arena (no
//!   index, no list links: 10 B of metadata per entry), for tiers where bytes are scarce.
//! - [`PolicyConfig`] — picks a policy and its parameters; [`PolicyConfig::build`] makes one.
//! - `lists` (private) — the slot arena and intrusive lists the list-based policies share.
//! - [`Evictable`] — the slot-level side (remove, rename, victims in eviction order, grow) that
//!   lets [`Lru`], [`Lfu`] and [`GroupLfu`] also run a store's hot-row cache, under the store's
//!   [`Eviction`](crate::Eviction) trait ([`PolicyConfig::build_evictable`]).
//!
//! ## Contract every policy keeps
//! - `hit[j]` is "key `j` was resident before this request changed anything" (probe-first, §1
//!   of the note), so a request is perfect iff all its keys were resident at probe time.
//! - Never more than `capacity` keys resident; never panics, never blocks. A request that
//!   cannot be kept whole (more distinct keys than the capacity, or no unpinned victim) is
//!   served partially and reported as `bypassed`.
//! - Keys should be distinct (the evaluator deduplicates); a repeated key is tolerated: the
//!   probe flags it by the state before the request, the commit treats the repeat as a hit.
//! - Deterministic: the same configuration and key sequence give the same outcomes. No
//!   decision depends on hash order (eviction order lives in linked lists, not in the index),
//!   except in [`GroupAssoc`], whose set of a key is a fixed hash of it (deterministic, but
//!   relabelling the keys changes its outcomes).
//!
//! ## Metadata accounting
//! [`Policy::metadata_bytes`] counts every byte the policy owns — the struct, the slot arena at
//! its preallocated capacity, the index, list heads and the request's marks — and
//! [`Policy::metadata_bytes_per_entry`] divides by the capacity. There is no payload here (rows
//! live in the tiers above): these are the bytes the note's ≤ 48 B/entry target is about.

mod ev_arc;
mod group_assoc;
mod group_lfu;
mod lfu;
mod lists;
mod lru;
#[cfg(test)]
pub(crate) mod reference;

pub use ev_arc::{EvArc, EvArcConfig};
pub use group_assoc::{GroupAssoc, GroupAssocConfig, GroupAssocStats, Rule, MAX_WAYS};
pub use group_lfu::{EvLfuPaper, Flush, GroupLfu, GroupLfuConfig, GroupLfuStats};
pub use lfu::{Lfu, LfuConfig};
pub use lru::Lru;

use std::fmt;

use crate::{Error, Result};

/// Largest capacity a policy accepts: slots are numbered by u32 and `u32::MAX` means "none";
/// EV-ARC keeps twice its capacity in slots (ghosts).
pub const MAX_CAPACITY: usize = (u32::MAX / 2 - 1) as usize;

/// What one request did, as seen by the caller. Reused across requests by
/// [`Policy::access_into`] so the hot path does not allocate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOutcome {
    /// `hit[j]`: key `j` was resident at probe time (before the request changed anything).
    pub hit: Vec<bool>,
    /// Number of `true` in `hit` (the request's exact hits).
    pub hits: usize,
    /// Missed keys that were served approximately (an L3 surrogate), so the request may be a
    /// *served* perfect hit without being an exact one. Plain policies leave it 0.
    pub approximated: usize,
    /// Missed keys that were admitted.
    pub admitted: usize,
    /// The request could not be kept whole: more distinct keys than the capacity, or no
    /// unpinned victim for a miss. Its misses were served from the backing store and not all
    /// were kept.
    pub bypassed: bool,
    /// Keys evicted while committing this request, in eviction order.
    pub evicted: Vec<u64>,
    /// The slot each of `evicted` held ([`Policy::slot_of`]), same order: a row store keyed
    /// by slot reads the victim's row from here before the slot is written again.
    pub evicted_slots: Vec<u32>,
    /// How many of `evicted` were keys of this very request (self-eviction, note §2.2 \[M2\]).
    pub self_evicted: usize,
    /// Policies with slots ([`Policy::has_slots`]) that report them: the slot each key of the
    /// request holds after the commit ([`NO_SLOT`]: not resident), so the caller writes
    /// admitted rows without looking each key up again. Empty when a policy does not report
    /// them ([`Policy::slot_of`] then answers).
    pub slots: Vec<u32>,
}

/// [`RequestOutcome::slots`]: the key is not resident.
pub const NO_SLOT: u32 = u32::MAX;

impl RequestOutcome {
    /// Empties the outcome for a request of `g` keys.
    pub fn reset(&mut self, g: usize) {
        self.hit.clear();
        self.hit.reserve(g);
        self.hits = 0;
        self.approximated = 0;
        self.admitted = 0;
        self.bypassed = false;
        self.evicted.clear();
        self.evicted_slots.clear();
        self.self_evicted = 0;
        self.slots.clear();
    }

    /// All keys were resident at probe time (a perfect hit). True for an empty request.
    pub fn is_perfect(&self) -> bool {
        self.hits == self.hit.len()
    }

    /// Keys that missed.
    pub fn misses(&self) -> usize {
        self.hit.len() - self.hits
    }
}

/// A request-level cache replacement policy over u64 keys with a capacity in entries.
pub trait Policy: fmt::Debug + Send + Sync {
    /// A short name for reports (`"lru"`, `"group-lfu"`, …).
    fn name(&self) -> &'static str;
    /// Maximum number of resident keys.
    fn capacity(&self) -> usize;
    /// Resident keys now.
    fn len(&self) -> usize;
    /// Whether no key is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `key` is resident. Pure: changes nothing.
    fn contains(&self, key: u64) -> bool;
    /// Serves one request: probe every key, then commit (see the module docs). `out` is reset
    /// first and then describes this request.
    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome);
    /// Every byte this policy owns (struct, arena at capacity, index, lists, the request's marks).
    fn metadata_bytes(&self) -> usize;

    /// [`access_into`](Self::access_into) for a request whose keys are only part of a larger
    /// group: the rest of the request lives in other shards or tiers, where `group.other_hits`
    /// of its keys hit, and the whole request has `group.size` keys. Group-aware policies
    /// score with `h = own hits + other_hits` out of `group.size`; per-key policies ignore
    /// `group` (the default).
    fn access_group_into(&mut self, keys: &[u64], group: Group, out: &mut RequestOutcome) {
        let _ = group;
        self.access_into(keys, out)
    }

    /// Inserts `key` (not resident) with group score `score` (group-aware policies; others
    /// treat it as a one-key request), evicting if full; for demoting another tier's victim.
    /// `out` is reset first and reports the eviction.
    fn admit(&mut self, key: u64, score: u8, out: &mut RequestOutcome) {
        let _ = score;
        self.access_into(&[key], out)
    }

    /// The slot (`0..capacity`) holding `key`, stable while it stays resident, or `None`.
    /// Policies that can back a row store ([`Policy::has_slots`]) implement it.
    fn slot_of(&self, key: u64) -> Option<u32> {
        let _ = key;
        None
    }

    /// Whether [`slot_of`](Self::slot_of) gives every resident key a slot below the capacity
    /// (so rows can live in an arena of `capacity` rows). EV-ARC's ghosts take slots too: no.
    fn has_slots(&self) -> bool {
        false
    }

    /// [`access_into`](Self::access_into) with a fresh outcome.
    fn access_request(&mut self, keys: &[u64]) -> RequestOutcome {
        let mut out = RequestOutcome::default();
        self.access_into(keys, &mut out);
        out
    }

    /// The probe alone: `out[j] = contains(keys[j])`. Pure.
    fn probe(&self, keys: &[u64], out: &mut Vec<bool>) {
        out.clear();
        out.extend(keys.iter().map(|&k| self.contains(k)));
    }

    /// [`metadata_bytes`](Self::metadata_bytes) divided by the capacity.
    fn metadata_bytes_per_entry(&self) -> f64 {
        self.metadata_bytes() as f64 / self.capacity().max(1) as f64
    }
}

/// A policy that can also run a store's hot-row cache ([`Eviction`](crate::Eviction), through
/// the [`PolicyEviction`](crate::PolicyEviction) adapter): there the store, not the policy,
/// decides when a key leaves, keys are the store's slot numbers, and the number of keys is not
/// known up front.
///
/// Between requests no key is pinned, so [`victims`](Self::victims) names keys in the exact
/// order the policy's own commits would evict them. [`PolicyConfig::build_evictable`] builds
/// one; a policy that places keys itself ([`GroupAssoc`]: a key's set is a hash of it) or
/// evicts on its own schedule (EV-ARC's ghosts, the artifact's flush) is refused there.
pub trait Evictable: Policy {
    /// Drops `key`; whether it was resident.
    fn remove(&mut self, key: u64) -> bool;
    /// Gives resident `from` the key `to` (not resident), keeping its place and score;
    /// whether `from` was resident (`to` resident: nothing changes, `false`).
    fn rename(&mut self, from: u64, to: u64) -> bool;
    /// Appends up to `n` resident keys that `skip` does not exclude, least valuable first:
    /// the order the policy would evict them in. Pure; appends `min(n, resident keys not
    /// skipped)` keys.
    fn victims(&self, n: usize, skip: &dyn Fn(u64) -> bool, out: &mut Vec<u64>);
    /// Raises the capacity to `capacity` (never lowers it), keeping every key and its state.
    /// Capacity-relative parameters (the aging period α·C) follow. Errors: above
    /// [`MAX_CAPACITY`].
    fn grow(&mut self, capacity: usize) -> Result<()>;
}

/// Where the rest of a request is, for [`Policy::access_group_into`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// Keys of the request that hit outside this policy (other shards, other tiers,
    /// surrogates).
    pub other_hits: usize,
    /// Keys in the whole request (`G`); at least the keys given to this policy.
    pub size: usize,
}

/// Which policy to build, with its parameters.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyConfig {
    /// [`Lru`].
    Lru,
    /// [`Lfu`].
    Lfu(LfuConfig),
    /// [`GroupLfu`] (the design note's L1; the evaluator's default).
    GroupLfu(GroupLfuConfig),
    /// [`EvLfuPaper`]: [`GroupLfu`] with [`GroupLfuConfig::paper`] semantics, `max_score` S.
    EvLfuPaper {
        /// Maximum group score `S` (`T`, the number of tables, for one-hot requests).
        max_score: u8,
    },
    /// [`EvArc`].
    EvArc(EvArcConfig),
    /// [`GroupAssoc`] (the cache's default: more perfect hits per byte).
    GroupAssoc(GroupAssocConfig),
}

impl PolicyConfig {
    /// The names [`PolicyConfig::parse`] accepts.
    pub const NAMES: [&'static str; 6] =
        ["lru", "lfu", "group_lfu", "ev_lfu_paper", "ev_arc", "group_assoc"];

    /// The policy called `name` (`-` and `_` alike, any case) with default parameters and
    /// maximum group score `max_score` (the number of tables for one-hot requests).
    pub fn parse(name: &str, max_score: u8) -> Result<Self> {
        let max_score = max_score.max(1);
        Ok(match name.to_ascii_lowercase().replace('-', "_").as_str() {
            "lru" => Self::Lru,
            "lfu" => Self::Lfu(LfuConfig::default()),
            "group_lfu" => Self::GroupLfu(GroupLfuConfig { max_score, ..Default::default() }),
            "ev_lfu_paper" => Self::EvLfuPaper { max_score },
            "ev_arc" => Self::EvArc(EvArcConfig { max_score, ..Default::default() }),
            "group_assoc" => Self::GroupAssoc(GroupAssocConfig { max_score, ..Default::default() }),
            _ => {
                return Err(Error::unknown_name(format!(
                    "unknown policy {name:?}: expected one of {:?}",
                    Self::NAMES
                )))
            }
        })
    }

    /// Builds the policy with room for `capacity` keys. Errors: capacity 0 or above
    /// [`MAX_CAPACITY`]; parameters out of range.
    pub fn build(&self, capacity: usize) -> Result<Box<dyn Policy>> {
        Ok(match self {
            Self::Lru => Box::new(Lru::new(capacity)?),
            Self::Lfu(c) => Box::new(Lfu::new(capacity, c.clone())?),
            Self::GroupLfu(c) => Box::new(GroupLfu::new(capacity, c.clone())?),
            Self::EvLfuPaper { max_score } => Box::new(EvLfuPaper::new(capacity, *max_score)?),
            Self::EvArc(c) => Box::new(EvArc::new(capacity, c.clone())?),
            Self::GroupAssoc(c) => Box::new(GroupAssoc::new(capacity, c.clone())?),
        })
    }

    /// Builds the policy as an [`Evictable`] with room for `capacity` keys, for a store's
    /// hot-row cache. Errors: the policy cannot run there (`group_assoc`, `ev_arc`,
    /// `ev_lfu_paper`, or `group_lfu` with a flush: they evict or place keys on their own),
    /// and whatever [`build`](Self::build) refuses.
    pub fn build_evictable(&self, capacity: usize) -> Result<Box<dyn Evictable>> {
        let refuse = |why: &str| {
            Err(Error::invalid(format!(
                "policy {} cannot run a store's hot-row cache: {why}; use lru, lfu or group_lfu",
                self.name()
            )))
        };
        Ok(match self {
            Self::Lru => Box::new(Lru::new(capacity)?),
            Self::Lfu(c) => Box::new(Lfu::new(capacity, c.clone())?),
            Self::GroupLfu(c) if c.flush == Flush::Off => {
                Box::new(GroupLfu::new(capacity, c.clone())?)
            }
            Self::GroupLfu(_) | Self::EvLfuPaper { .. } => {
                return refuse("its flush evicts keys the store still holds")
            }
            Self::EvArc(_) => {
                return refuse("its ghost entries take slots and it evicts on its own")
            }
            Self::GroupAssoc(_) => {
                return refuse(
                    "it places each key in a set chosen by hashing it, not in the store's slot",
                )
            }
        })
    }

    /// A short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu(_) => "lfu",
            Self::GroupLfu(_) => "group-lfu",
            Self::EvLfuPaper { .. } => "ev-lfu-paper",
            Self::EvArc(_) => "ev-arc",
            Self::GroupAssoc(_) => "group-assoc",
        }
    }
}

/// Checks a capacity: at least 1, at most [`MAX_CAPACITY`].
pub(crate) fn check_capacity(capacity: usize) -> Result<()> {
    if capacity == 0 {
        return Err(Error::invalid("capacity must be at least 1, got 0"));
    }
    if capacity > MAX_CAPACITY {
        return Err(Error::invalid(format!(
            "capacity must be at most {MAX_CAPACITY}, got {capacity}"
        )));
    }
    Ok(())
}

/// Checks an optional aging factor α: finite and > 0.
pub(crate) fn check_alpha(name: &str, alpha: Option<f64>) -> Result<()> {
    match alpha {
        Some(a) if !(a.is_finite() && a > 0.0) => {
            Err(Error::invalid(format!("{name} must be finite and > 0, got {a}")))
        }
        _ => Ok(()),
    }
}

/// Insertions between aging steps: `max(1, round(α·C))`.
pub(crate) fn age_period(alpha: Option<f64>, capacity: usize) -> Option<u64> {
    alpha.map(|a| ((a * capacity as f64).round() as u64).max(1))
}

/// The request's group score: `⌊h·S/G⌋` (= `h` when `G = S`), §2.3 of the note.
#[inline]
pub(crate) fn score_of(h: usize, g: usize, max_score: u8) -> u8 {
    if g == 0 {
        return max_score;
    }
    ((h.min(g) as u64 * u64::from(max_score)) / g as u64) as u8
}

/// After a request: if it had more keys than the capacity, whether they could not all stay.
pub(crate) fn overflowed(p: &dyn Policy, keys: &[u64]) -> bool {
    keys.len() > p.capacity() && !keys.iter().all(|&k| p.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_configs() -> Vec<PolicyConfig> {
        vec![
            PolicyConfig::Lru,
            PolicyConfig::Lfu(LfuConfig::default()),
            PolicyConfig::GroupLfu(GroupLfuConfig::default()),
            PolicyConfig::EvLfuPaper { max_score: 3 },
            PolicyConfig::EvArc(EvArcConfig::default()),
            PolicyConfig::GroupAssoc(GroupAssocConfig::default()),
        ]
    }

    #[test]
    fn score_is_normalised() {
        assert_eq!(score_of(20, 26, 26), 20);
        assert_eq!(score_of(26, 26, 26), 26);
        assert_eq!(score_of(3, 4, 32), 24);
        assert_eq!(score_of(0, 4, 32), 0);
    }

    #[test]
    fn capacity_zero_is_a_typed_error() {
        for c in all_configs() {
            let e = c.build(0).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            assert_eq!(e.to_string(), "capacity must be at least 1, got 0");
            assert!(c.build(MAX_CAPACITY + 1).is_err());
        }
    }

    #[test]
    fn oversized_and_odd_requests_never_panic_and_respect_capacity() {
        for c in all_configs() {
            let mut p = c.build(3).unwrap();
            for r in [&[1u64, 2, 3, 4, 5][..], &[], &[7, 7, 7], &[1, 2], &[1, 2, 3, 4, 5, 6, 7]] {
                let o = p.access_request(r);
                assert_eq!(o.hit.len(), r.len());
                assert!(p.len() <= 3, "{}", p.name());
                if r.len() > 3 {
                    assert!(o.bypassed, "{} on {r:?}", p.name());
                }
            }
            let o = p.access_request(&[1, 2]);
            assert!(!o.bypassed, "{}", p.name());
        }
    }

    #[test]
    fn only_policies_that_leave_eviction_to_the_caller_are_evictable() {
        for c in all_configs() {
            let ok = c.build_evictable(4).is_ok();
            assert_eq!(ok, matches!(c.name(), "lru" | "lfu" | "group-lfu"), "{}", c.name());
        }
        let flush = GroupLfuConfig {
            flush: Flush::Incremental { trigger: 0.5, rate: 0.5, batch: 1 },
            ..GroupLfuConfig::default()
        };
        let e = PolicyConfig::GroupLfu(flush).build_evictable(4).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("flush"), "{e}");
        assert!(PolicyConfig::Lru.build_evictable(0).is_err());
    }

    /// Random operations on every evictable policy (seeds printed; replay one with
    /// `EMBSTORE_CACHE_SEED=<seed>`): `victims` names resident, unskipped, distinct keys, as
    /// many as asked or as there are, in the order the policy's own commits evict them (a
    /// one-key miss on a full policy evicts `victims(1)`); `remove`, `rename` and `grow` keep
    /// every other key and the eviction order.
    #[test]
    fn evictable_victims_follow_the_policys_own_order() {
        let seeds: Vec<u64> = match std::env::var("EMBSTORE_CACHE_SEED") {
            Ok(s) => vec![s.parse().expect("EMBSTORE_CACHE_SEED must be a u64")],
            Err(_) => (0..60).collect(),
        };
        let configs = [
            PolicyConfig::Lru,
            PolicyConfig::Lfu(LfuConfig::default()),
            PolicyConfig::Lfu(LfuConfig { age_alpha: None }),
            PolicyConfig::GroupLfu(GroupLfuConfig { max_score: 3, ..Default::default() }),
            PolicyConfig::GroupLfu(GroupLfuConfig { age_alpha: Some(0.5), ..Default::default() }),
        ];
        for seed in seeds {
            let mut rng = crate::rng::SplitMix64::new(seed);
            let config = &configs[rng.below(configs.len() as u64) as usize];
            let cap = 1 + rng.below(12) as usize;
            let mut p = config.build_evictable(cap).unwrap();
            let ctx = |step: usize| {
                format!("seed {seed} (replay: EMBSTORE_CACHE_SEED={seed}), {config:?}, step {step}")
            };
            let order = |p: &dyn Evictable| {
                let mut all = Vec::new();
                p.victims(usize::MAX, &|_| false, &mut all);
                all
            };
            for step in 0..400 {
                let key = rng.below(30);
                match rng.below(10) {
                    0..=4 => {
                        // A one-key request: when it misses on a full policy, it evicts
                        // exactly what `victims(1)` named.
                        let mut first = Vec::new();
                        p.victims(1, &|_| false, &mut first);
                        let full_miss = !p.contains(key) && p.len() == p.capacity();
                        let o = p.access_request(&[key]);
                        if full_miss {
                            assert_eq!(o.evicted, first, "{}", ctx(step));
                        } else {
                            assert!(o.evicted.is_empty(), "{}", ctx(step));
                        }
                    }
                    5 => {
                        let keys: Vec<u64> = (0..1 + rng.below(3)).map(|_| rng.below(30)).collect();
                        p.access_request(&keys);
                    }
                    6 => {
                        let (was, before) = (p.contains(key), order(p.as_ref()));
                        assert_eq!(p.remove(key), was, "{}", ctx(step));
                        let want: Vec<u64> = before.into_iter().filter(|&k| k != key).collect();
                        assert_eq!(order(p.as_ref()), want, "{}", ctx(step));
                    }
                    7 => {
                        let to = rng.below(30);
                        let ok = p.contains(key) && !p.contains(to);
                        let before = order(p.as_ref());
                        assert_eq!(p.rename(key, to), ok, "{}", ctx(step));
                        let want: Vec<u64> = if ok {
                            before.iter().map(|&k| if k == key { to } else { k }).collect()
                        } else {
                            before
                        };
                        assert_eq!(order(p.as_ref()), want, "{}", ctx(step));
                    }
                    8 => {
                        let before = order(p.as_ref());
                        let to = p.capacity() + rng.below(4) as usize;
                        p.grow(to).unwrap();
                        assert_eq!(p.capacity(), to, "{}", ctx(step));
                        assert_eq!(order(p.as_ref()), before, "{}", ctx(step));
                    }
                    _ => {
                        let n = rng.below(6) as usize;
                        let mask = rng.below(1 << 30);
                        let skip = |k: u64| mask >> (k % 30) & 1 == 1;
                        let mut got = vec![u64::MAX];
                        p.victims(n, &skip, &mut got);
                        assert_eq!(got[0], u64::MAX, "out was overwritten; {}", ctx(step));
                        let got = &got[1..];
                        let all = order(p.as_ref());
                        let want: Vec<u64> =
                            all.iter().copied().filter(|&k| !skip(k)).take(n).collect();
                        assert_eq!(got, &want[..], "{}", ctx(step));
                    }
                }
                let all = order(p.as_ref());
                assert_eq!(all.len(), p.len(), "{}", ctx(step));
                assert!(p.len() <= p.capacity(), "{}", ctx(step));
                assert!(all.iter().all(|&k| p.contains(k)), "{}", ctx(step));
                let distinct: std::collections::BTreeSet<u64> = all.iter().copied().collect();
                assert_eq!(distinct.len(), all.len(), "{}", ctx(step));
            }
        }
    }

    #[test]
    fn metadata_is_counted() {
        for c in all_configs() {
            let p = c.build(10_000).unwrap();
            let b = p.metadata_bytes_per_entry();
            // GroupAssoc: 8 B key + score + state, no index; the list-based ones >= 20 B.
            let floor = if p.name() == "group-assoc" { 10.0 } else { 20.0 };
            assert!((floor..200.0).contains(&b), "{}: {b}", p.name());
        }
    }
}
