//! # embstore-cache: the inference cache (EVStore's EVCache, EVMix and EVProx, done our way)
//!
//! An inference request needs one embedding row from each of its tables; the forward pass
//! waits for the slowest one. What this cache maximises is therefore the **perfect-hit
//! rate** — the share of requests whose rows are *all* in memory — not the per-key hit rate
//! (design note `evstore.md` §1; EVStore, ASPLOS '23, §4.1).
//!
//! ## Parts
//! - [`cache`] — [`InferenceCache`]: L1 and L2, each a level ([`LevelConfig`]: a codec and a
//!   share of the byte budget) of rows kept by a request-level policy, and L3's surrogates,
//!   over a [`Backing`] store, sharded; one folder with a file per part (config, keys,
//!   levels, the lookup pipeline, the L3 filler thread, stats, and [`CachePolicy`], the whole
//!   cache seen as a policy by the evaluator).
//! - [`policy`] — the request-level replacement policies, from the `embstore-policy` crate
//!   (re-exported here under the same names): the [`Policy`] trait (one call per request:
//!   probe all keys, then commit), [`GroupAssoc`] (the cache's default: the group score plus
//!   a hit counter in a set-associative arena, 10 B of metadata per entry), [`GroupLfu`] (the
//!   design note's L1: EV-LFU's group score with request pinning and O(S) aging),
//!   [`EvLfuPaper`] and [`EvArc`] (ablations) and the per-key baselines [`Lru`] and [`Lfu`].
//! - [`codec`] — how a level stores rows: [`F32`], [`F16`], [`Int8Row`], [`Int4Row`] (and,
//!   with feature `compat`, the paper's EV-16/8/4).
//! - [`surrogate`] — L3: the offline k-NN build ([`surrogate::build`] → [`Surrogates`]), the
//!   file's two formats, [`SurrogateFile`] (a build read a block per lookup) and the CLOCK map
//!   L3 keeps at run time.
//! - [`trace`] — [`Trace`] (`[N, G]` or ragged requests of table-qualified u64 keys,
//!   `table << 48 | id`) and the [`Synthetic`] Criteo-like generator (26 tables, Zipf contexts,
//!   co-access ρ), seeded and deterministic.
//! - [`evaluate`](mod@evaluate) — [`evaluate()`] in [`Mode::Online`], [`Mode::Prefix`]
//!   (primary) and [`Mode::Replay`], giving a [`Report`] with perfect, served-perfect and
//!   individual hit rates, the compulsory-miss bound, the misses-per-request histogram and
//!   bypasses; a bare policy or, through [`CachePolicy`], the whole cache.
//!
//! ## Invariants (every policy)
//! - Hit flags are taken before the request changes anything (probe-first), so "perfect" means
//!   "all keys resident at probe time".
//! - At most `capacity` keys are resident; a request that cannot be kept whole is served
//!   partially and reported as a bypass; nothing panics on any input.
//! - Single-threaded and deterministic: the outcome depends only on (configuration, trace).
//!   Sharding and concurrent probe/commit (note §5) are the [`cache`]'s, a layer above the
//!   policies (one shard and one caller: deterministic too).
//!
//! ```
//! use embstore_cache::{evaluate, GroupLfuConfig, Mode, PolicyConfig, Synthetic};
//!
//! let trace = Synthetic { num_requests: 2_000, num_contexts: 2_000, ..Default::default() }
//!     .generate()?;
//! let capacity = trace.unique_keys() / 20; // 5 % of the unique keys
//! let policy = PolicyConfig::GroupLfu(GroupLfuConfig::default()); // S = 26 tables
//! let report = evaluate(&trace, &policy, capacity, Mode::Prefix)?;
//! assert!(report.perfect_hit <= report.compulsory_bound);
//! # Ok::<(), embstore_cache::Error>(())
//! ```

pub mod cache;
pub mod codec;
mod error;
pub mod evaluate;
/// The request-level policies, which live in `embstore-policy` (the store's eviction runs
/// them too); `embstore_cache::policy::…` paths keep working.
pub use embstore_policy::request as policy;
pub mod surrogate;
pub mod trace;

pub use cache::{
    Backing, CacheConfig, CachePolicy, CacheStats, InferenceCache, L3Fill, LevelConfig, Source,
};
pub use codec::{relative_rmse, Codec, CodecKind, Int4Row, Int8Row, F16, F32};
#[cfg(feature = "compat")]
pub use codec::{Ev16, Ev4, Ev8, EV4_CODEBOOK};
pub use error::{Error, ErrorKind, Result};
pub use evaluate::{evaluate, evaluate_with, EvalOptions, Mode, Report};
pub use policy::{
    EvArc, EvArcConfig, EvLfuPaper, Evictable, Flush, Group, GroupAssoc, GroupAssocConfig,
    GroupAssocStats, GroupLfu, GroupLfuConfig, GroupLfuStats, Lfu, LfuConfig, Lru, Policy,
    PolicyConfig, RequestOutcome,
};
pub use surrogate::{SurrogateFile, SurrogateTable, Surrogates};
pub use trace::{split_key, table_key, Synthetic, Trace};
