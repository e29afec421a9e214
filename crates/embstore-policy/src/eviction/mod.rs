//! The store's side of replacement: which rows leave a shard's memory for disk when the tier is
//! full (spec E.3, after Baidu's App. D "LRU in front of LFU").
//!
//! ## Parts
//! - [`Eviction`] — the policy trait one shard drives. The shard tells it, by slot, that a row
//!   entered memory (`on_insert`), was used (`on_access`, under the shard's *read* lock), left
//!   (`on_remove`) or was relocated by compaction (`on_move`), and asks it for `victims`.
//! - [`EvictionConfig`] — picks and parameterises a policy; [`EvictionConfig::build`] makes one
//!   per shard from a seed; [`EvictionConfig::parse`] takes the policy's name.
//! - [`Noop`] (`noop.rs`) — keeps every row: never names a victim, costs no memory.
//! - [`LruLfu`] (`lru_lfu.rs`) — a CLOCK recency segment in front of a sampled-LFU frequency
//!   segment; the default.
//! - [`PolicyEviction`] (`adapter.rs`) — an inference-cache policy
//!   ([`Evictable`](crate::Evictable): `lru`, `lfu`, `group_lfu`) as a shard's `Eviction`.
//! - [`EvictionPolicy`] (`as_policy.rs`) — the other way round: an `Eviction` (the default
//!   `LruLfu`) as a request-level [`Policy`](crate::Policy), so the cache's evaluator can score
//!   the store's own policy.
//!
//! ## Concurrency contract
//! `on_access` runs concurrently with itself under the shard's read lock, so it takes `&self`:
//! what it changes per slot is atomics (`LruLfu`) or a striped buffer replayed later
//! (`PolicyEviction`). Every other call holds the shard's write lock (`&mut self`). The cache's
//! request-level [`Policy`](crate::Policy) has no shared-access path at all; that difference is
//! why the two roles are two traits.
//!
//! ## Invariants (every implementation but [`Noop`], which names no victim)
//! - `victims` appends only live, unpinned slots, each once, at most `n` of them; it appends
//!   `min(n, unpinned live rows)` of them (a caller that gets fewer knows everything left is
//!   pinned).
//! - The same sequence of calls on policies built with the same seed gives the same victims.
//!
//! The model-based test below drives every configuration through the trait against a set of
//! live slots; each implementation's own tests sit at the bottom of its file.

mod adapter;
mod as_policy;
mod lru_lfu;
mod noop;
#[cfg(test)]
mod testkit;

pub use adapter::PolicyEviction;
pub use as_policy::EvictionPolicy;
pub use lru_lfu::{
    LruLfu, AUTO_AGE_ROWS, DEFAULT_RECENCY_FRACTION, DEFAULT_SAMPLE, STEPS_PER_DOUBLING,
};
pub use noop::Noop;

use crate::{Error, Result};

/// Per-shard replacement policy over slots 0..n (a slot = a row held in memory).
pub trait Eviction: Send + Sync + std::fmt::Debug {
    /// A row entered memory at `slot` (inserted, or read back from disk).
    fn on_insert(&mut self, slot: usize);
    /// The row at `slot` was read or written. Called concurrently under a shared (read) lock:
    /// takes `&self`, so per-slot state it changes here must be atomics (Relaxed is fine).
    fn on_access(&self, slot: usize);
    /// The row at `slot` left memory (evicted or removed).
    fn on_remove(&mut self, slot: usize);
    /// The row at `from` now lives at `to` (the shard compacted its storage); `from` is gone.
    fn on_move(&mut self, from: usize, to: usize);
    /// Appends up to `n` victims to `out`: slots holding rows (as told by on_insert/on_remove)
    /// that `pinned(slot)` says are not pinned, the least valuable first. Deterministic for a
    /// given sequence of calls (seeded sampling is fine).
    fn victims(&mut self, n: usize, pinned: &dyn Fn(usize) -> bool, out: &mut Vec<usize>);
    /// Opens (`true`) or closes (`false`) an eviction round: `victims` called several times
    /// in a row (in chunks), the slots it returned still held and refused by `pinned` until
    /// the round closes. Within a round a policy may skip what its earlier calls already
    /// passed over (so a round costs what one call for all its victims would, not a redraw of
    /// every earlier victim per chunk); outside one every call starts afresh. The default
    /// ignores rounds.
    fn victim_round(&mut self, _open: bool) {}
    /// Bytes of policy metadata per slot (for memory accounting).
    fn bytes_per_slot(&self) -> usize;
}

/// Which replacement policy a shard's memory tier runs, and its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum EvictionConfig {
    /// Keep every row in memory; never name a victim.
    Noop,
    /// [`LruLfu`]: a CLOCK recency segment of `recency_fraction` of the live rows in front of
    /// a sampled-LFU frequency segment; `sample` draws per victim; counters halve every
    /// `age_every` accesses (`0` = every 100 × live rows).
    LruLfu {
        /// Share of the live rows the recency segment may hold, in [0, 1].
        recency_fraction: f64,
        /// Frequency-segment rows drawn per victim, at least 1.
        sample: usize,
        /// Accesses between halvings of every counter; `0` = 100 × live rows.
        age_every: u64,
    },
    /// One of the inference cache's policies (`lru`, `lfu`, `group_lfu`; see
    /// [`crate::Evictable`]) run through [`PolicyEviction`]. In the store every
    /// access is a request of one key: `group_lfu` then scores a hit `S` and a newcomer 0,
    /// halving scores every α × rows insertions.
    Policy(crate::PolicyConfig),
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self::LruLfu {
            recency_fraction: DEFAULT_RECENCY_FRACTION,
            sample: DEFAULT_SAMPLE,
            age_every: 0,
        }
    }
}

impl EvictionConfig {
    /// Checks the parameters: `recency_fraction` in [0, 1] and `sample` at least 1.
    pub fn validate(&self) -> Result<()> {
        if let Self::Policy(p) = self {
            p.build_evictable(1).map_err(|e| Error::invalid(e.to_string()))?;
        }
        if let Self::LruLfu { recency_fraction, sample, .. } = *self {
            if !(0.0..=1.0).contains(&recency_fraction) {
                return Err(Error::invalid(format!(
                    "recency_fraction must be in [0, 1], got {recency_fraction}"
                )));
            }
            if sample == 0 {
                return Err(Error::invalid("sample must be at least 1, got 0"));
            }
        }
        Ok(())
    }

    /// A policy for one shard. Out-of-range parameters are clamped (a NaN fraction becomes the
    /// default), so this never fails; call [`validate`](Self::validate) where a config comes
    /// in from outside to reject them instead.
    pub fn build(&self, seed: u64) -> Box<dyn Eviction> {
        match self {
            Self::Noop => Box::new(Noop),
            &Self::LruLfu { recency_fraction, sample, age_every } => {
                Box::new(LruLfu::new(recency_fraction, sample, age_every, seed))
            }
            Self::Policy(p) => match PolicyEviction::new(p) {
                Ok(e) => Box::new(e),
                Err(_) => Self::default().build(seed),
            },
        }
    }

    /// The config named `name`: `lru_lfu` (the default [`LruLfu`]), `none` ([`Noop`]), or an
    /// inference-cache policy that can run here (`lru`, `lfu`, `group_lfu`) with its default
    /// parameters (`group_lfu`: S = 26). `-` and `_` alike, any case.
    pub fn parse(name: &str) -> Result<Self> {
        let norm = name.to_ascii_lowercase().replace('-', "_");
        let config = match norm.as_str() {
            "lru_lfu" => Self::default(),
            "none" | "noop" => Self::Noop,
            _ => match crate::PolicyConfig::parse(&norm, 26) {
                Ok(p) => Self::Policy(p),
                Err(_) => {
                    return Err(Error::invalid(format!(
                        "unknown eviction policy {name:?}: expected one of {:?}",
                        Self::NAMES
                    )))
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// A short name for reports: `lru-lfu`, `none`, or the cache policy's own
    /// ([`PolicyConfig::name`](crate::PolicyConfig::name)).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Noop => "none",
            Self::LruLfu { .. } => "lru-lfu",
            Self::Policy(p) => p.name(),
        }
    }

    /// The names [`parse`](Self::parse) accepts.
    pub const NAMES: [&'static str; 5] = ["lru_lfu", "none", "lru", "lfu", "group_lfu"];
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed, TestRunner};

    use super::testkit::test_seed;
    use super::*;

    // ---- model-based property test ----

    const SLOTS: usize = 40;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(usize),
        Access(usize),
        Remove(usize),
        Move(usize, usize),
        /// `n`, pinned-slot mask, whether the caller then evicts what it got.
        Victims(usize, u64, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        let mask = prop_oneof![
            Just(0u64),
            any::<u64>(),
            (any::<u64>(), any::<u64>()).prop_map(|(a, b)| a & b),
            (any::<u64>(), any::<u64>()).prop_map(|(a, b)| a | b),
            Just(u64::MAX),
        ];
        prop_oneof![
            6 => (0..SLOTS).prop_map(Op::Insert),
            8 => (0..SLOTS).prop_map(Op::Access),
            2 => (0..SLOTS).prop_map(Op::Remove),
            1 => (0..SLOTS, 0..SLOTS + 8).prop_map(|(f, t)| Op::Move(f, t)),
            3 => (0usize..12, mask, any::<bool>()).prop_map(|(n, m, e)| Op::Victims(n, m, e)),
        ]
    }

    fn config() -> impl Strategy<Value = EvictionConfig> {
        prop_oneof![
            Just(EvictionConfig::Noop),
            Just(EvictionConfig::default()),
            (0.0f64..=1.0, 1usize..20, prop_oneof![Just(0u64), 1u64..50]).prop_map(
                |(recency_fraction, sample, age_every)| EvictionConfig::LruLfu {
                    recency_fraction,
                    sample,
                    age_every
                }
            ),
            Just(EvictionConfig::LruLfu { recency_fraction: 0.0, sample: 1, age_every: 1 }),
            Just(EvictionConfig::LruLfu { recency_fraction: 1.0, sample: 16, age_every: 0 }),
            Just(EvictionConfig::parse("lru").unwrap()),
            Just(EvictionConfig::parse("lfu").unwrap()),
            Just(EvictionConfig::parse("group_lfu").unwrap()),
        ]
    }

    /// The policy a config builds and, for LruLfu, the same made directly (to check its
    /// structure), driven alike.
    struct Both {
        built: Box<dyn Eviction>,
        direct: Option<LruLfu>,
    }

    impl Both {
        fn each(&mut self, f: impl Fn(&mut dyn Eviction)) {
            f(self.built.as_mut());
            if let Some(q) = self.direct.as_mut() {
                f(q);
            }
        }
    }

    /// Drives the policy `config` builds and, for LruLfu, one made directly with the same seed
    /// through `ops`; checks each `victims` answer against the model (a set of live slots),
    /// the direct one's structure after every call, and that both answer alike (determinism).
    fn run_model(
        config: &EvictionConfig,
        seed: u64,
        ops: &[Op],
    ) -> std::result::Result<(), TestCaseError> {
        let noop = *config == EvictionConfig::Noop;
        let direct = match *config {
            EvictionConfig::LruLfu { recency_fraction, sample, age_every } => {
                Some(LruLfu::new(recency_fraction, sample, age_every, seed))
            }
            EvictionConfig::Noop | EvictionConfig::Policy(_) => None,
        };
        let mut both = Both { built: config.build(seed), direct };
        let mut live = BTreeSet::new();
        for op in ops {
            match *op {
                Op::Insert(s) if !live.contains(&s) => {
                    live.insert(s);
                    both.each(|p| p.on_insert(s));
                }
                Op::Access(s) if live.contains(&s) => both.each(|p| p.on_access(s)),
                Op::Remove(s) if live.contains(&s) => {
                    live.remove(&s);
                    both.each(|p| p.on_remove(s));
                }
                Op::Move(f, t) if live.contains(&f) && !live.contains(&t) => {
                    live.remove(&f);
                    live.insert(t);
                    both.each(|p| p.on_move(f, t));
                }
                Op::Victims(n, mask, evict) => {
                    let pinned = |s: usize| s < 64 && mask >> s & 1 == 1;
                    // `out` is appended to, never cleared: a marker stays in front.
                    let outs = std::cell::RefCell::new(Vec::new());
                    both.each(|p| {
                        let mut out = vec![usize::MAX];
                        p.victims(n, &pinned, &mut out);
                        outs.borrow_mut().push(out);
                    });
                    let outs = outs.into_inner();
                    let out = &outs[0];
                    if let Some(other) = outs.get(1) {
                        prop_assert_eq!(out, other, "not deterministic");
                    }
                    prop_assert_eq!(out[0], usize::MAX, "out was overwritten");
                    let got = &out[1..];
                    let unpinned = live.iter().filter(|&&s| !pinned(s)).count();
                    prop_assert!(got.len() <= n, "{} victims for n = {}", got.len(), n);
                    let distinct: BTreeSet<usize> = got.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), got.len(), "repeated victim in {:?}", got);
                    for &v in got {
                        prop_assert!(live.contains(&v), "victim {} holds no row", v);
                        prop_assert!(!pinned(v), "victim {} is pinned", v);
                    }
                    if noop {
                        prop_assert!(got.is_empty(), "noop named victims {:?}", got);
                    } else {
                        prop_assert_eq!(got.len(), n.min(unpinned), "too few victims");
                    }
                    if evict {
                        for &v in got {
                            live.remove(&v);
                            both.each(|p| p.on_remove(v));
                        }
                    }
                }
                _ => {} // a call the shard would not make (insert into a full slot, ...)
            }
            if let Some(q) = &both.direct {
                q.check(&live).map_err(TestCaseError::fail)?;
            }
        }
        let bytes = both.built.bytes_per_slot();
        match config {
            EvictionConfig::Noop => prop_assert_eq!(bytes, 0),
            EvictionConfig::LruLfu { .. } => prop_assert_eq!(bytes, 15),
            // 20 B slot + 4 B index buckets at load <= 3/4, spread over the capacity.
            EvictionConfig::Policy(_) => prop_assert!((20..=40).contains(&bytes), "{bytes}"),
        }
        Ok(())
    }

    #[test]
    fn victims_are_live_unpinned_distinct_and_bounded() {
        let seed = test_seed(0x0e71_c7ed);
        let mut runner = TestRunner::new(Config {
            cases: 400,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (config(), any::<u64>(), prop::collection::vec(op(), 1..300));
        runner
            .run(&strategy, |(config, seed, ops)| run_model(&config, seed, &ops))
            .unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }

    #[test]
    fn unknown_or_unfit_policies_are_refused_by_name() {
        for name in EvictionConfig::NAMES {
            assert!(EvictionConfig::parse(name).is_ok(), "{name}");
        }
        assert_eq!(
            EvictionConfig::parse("Group-LFU").unwrap(),
            EvictionConfig::parse("group_lfu").unwrap()
        );
        let e = EvictionConfig::parse("mru").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.message().contains("unknown eviction policy \"mru\""), "{}", e.message());
        let e = EvictionConfig::parse("group_assoc").unwrap_err();
        assert!(e.message().contains("cannot run a store's hot-row cache"), "{}", e.message());
    }

    /// One config namespace: both configs take the same string forms as before they shared a
    /// crate (`-` and `_` alike, any case, default parameters), and a report's name parses
    /// back to the config it came from.
    #[test]
    fn both_configs_parse_names_the_same_way() {
        use crate::{GroupLfuConfig, LfuConfig, PolicyConfig};
        let group_lfu =
            |s| PolicyConfig::GroupLfu(GroupLfuConfig { max_score: s, ..Default::default() });
        for (name, want) in [
            ("lru_lfu", EvictionConfig::default()),
            ("LRU-LFU", EvictionConfig::default()),
            ("none", EvictionConfig::Noop),
            ("noop", EvictionConfig::Noop),
            ("lru", EvictionConfig::Policy(PolicyConfig::Lru)),
            ("Lfu", EvictionConfig::Policy(PolicyConfig::Lfu(LfuConfig::default()))),
            ("group-lfu", EvictionConfig::Policy(group_lfu(26))),
        ] {
            assert_eq!(EvictionConfig::parse(name).unwrap(), want, "{name}");
            assert_eq!(EvictionConfig::parse(want.name()).unwrap(), want, "{name}");
        }
        assert_eq!(PolicyConfig::parse("Group-LFU", 8).unwrap(), group_lfu(8));
        assert_eq!(PolicyConfig::parse("group_lfu", 0).unwrap(), group_lfu(1));
        for name in PolicyConfig::NAMES {
            let c = PolicyConfig::parse(name, 8).unwrap();
            assert_eq!(PolicyConfig::parse(c.name(), 8).unwrap(), c, "{name}");
            assert_eq!(PolicyConfig::parse(&name.to_ascii_uppercase(), 8).unwrap(), c, "{name}");
        }
        let e = PolicyConfig::parse("lru_lfu", 8).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::UnknownName);
    }
}
