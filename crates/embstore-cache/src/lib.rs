//! # embstore-cache: the inference cache's L1 (EVStore's EVCache, done our way)
//!
//! An inference request needs one embedding row from each of its tables; the forward pass
//! waits for the slowest one. What this cache maximises is therefore the **perfect-hit
//! rate** — the share of requests whose rows are *all* in memory — not the per-key hit rate
//! (design note `evstore.md` §1; EVStore, ASPLOS '23, §4.1).
//!
//! ## Parts
//! - [`policy`] (re-exported from `embstore-policy`, where the store's eviction lives too) —
//!   the [`Policy`] trait (one call per request: probe all keys, then commit) and its
//!   implementations: [`GroupLfu`] (the design note's L1: EV-LFU's group score with
//!   request pinning and O(S) aging), [`GroupAssoc`] (the cache's default: the group score
//!   plus a hit counter in a set-associative arena, 10 B of metadata per entry),
//!   [`EvLfuPaper`] (the faithful EV-LFU, an ablation), [`EvArc`] (EV-ARC, an ablation), and
//!   the per-key baselines [`Lru`] and [`Lfu`]. [`Evictable`] lets `Lru`, `Lfu` and
//!   `GroupLfu` also run a store's hot-row cache (`embstore_policy::PolicyEviction`).
//! - [`trace`] — [`Trace`] (`[N, G]` or ragged requests of table-qualified u64 keys,
//!   `table << 48 | id`) and the [`Synthetic`] Criteo-like generator (26 tables, Zipf contexts,
//!   co-access ρ), seeded and deterministic.
//! - [`evaluate`](mod@evaluate) — [`evaluate()`] in [`Mode::Online`], [`Mode::Prefix`]
//!   (primary) and [`Mode::Replay`], giving a [`Report`] with perfect, served-perfect and
//!   individual hit rates, the compulsory-miss bound, the misses-per-request histogram and
//!   bypasses.
//!
//! ## Invariants (every policy)
//! - Hit flags are taken before the request changes anything (probe-first), so "perfect" means
//!   "all keys resident at probe time".
//! - At most `capacity` keys are resident; a request that cannot be kept whole is served
//!   partially and reported as a bypass; nothing panics on any input.
//! - Single-threaded and deterministic: the outcome depends only on (configuration, trace).
//!   Sharding and concurrent probe/commit (note §5) are a layer above this one.
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
    Backing, CacheConfig, CachePolicy, CacheStats, InferenceCache, L3Fill, Source, TierConfig,
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
