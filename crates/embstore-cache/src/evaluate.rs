//! The one evaluator every policy is measured with (design note §1): perfect hits, served
//! perfect hits, individual hits, the compulsory-miss bound and the misses-per-request
//! histogram, in three modes. The store's own eviction (`LruLfu`) is scored here too, wrapped
//! as a request-level policy by `embstore_policy::EvictionPolicy` ([`evaluate_with`]).
//!
//! ```text
//! Online   every request counted, cold start                  (worst case)
//! Prefix   warm on requests [0, ⌈f·N⌉), count the rest        (primary; f = warm_frac = 0.5)
//! Replay   warm on the whole trace, then count a second pass   (the EVStore artifact's method)
//!
//! for each request r of the stream:
//!     flags = policy.access_request(r).hit     # resident before r changed anything
//!     if counted: perfect += all(flags); hits += Σ flags; hist[|r| - Σ flags] += 1
//!                 bound += all(k in seen for k in r)    # infinite cache: compulsory misses only
//!     seen |= r                                         # seen includes the warm-up
//! ```
//!
//! How to read a [`Report`]: `perfect_hit` is the share of counted requests that needed no
//! backing-store read; `compulsory_bound` is the most any cache could reach on the same stream
//! (first occurrences must miss), so `perfect_hit / compulsory_bound` is how much of the
//! reachable share a policy gets. `individual_hit` is the per-key figure classical caches
//! optimise; a policy can win it and lose perfect hits (note §1 \[M1\]). `misses_per_request`
//! matters because misses are fetched with bounded parallelism: 1 miss and 5 do not cost the
//! same. In Replay every key has been seen, so the bound is 1 by construction; quote the
//! Online or Prefix bound next to it. Replay favours EV-LFU (its pass-1 scores are exactly
//! right for pass 2), so read the paper's gains as replay gains.

use std::fmt;

use crate::trace::Trace;
use crate::{Error, Result};
use embstore_policy::index::KeySet;
use embstore_policy::{Policy, PolicyConfig, RequestOutcome};

/// How the trace is turned into a warm-up stream and a measured stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One pass from a cold cache; everything counted.
    Online,
    /// Warm on the first `warm_frac` of the requests, count the rest (primary).
    Prefix,
    /// Warm on the whole trace, then count a second full pass.
    Replay,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Online => "online",
            Self::Prefix => "prefix",
            Self::Replay => "replay",
        })
    }
}

/// Evaluator options.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalOptions {
    /// Share of the requests used to warm up in [`Mode::Prefix`], in [0, 1). Default 0.5.
    pub warm_frac: f64,
    /// Accept a capacity below the largest request (those requests are bypassed and
    /// counted in [`Report::bypasses`]); by default that is an error, as the note asks for
    /// `C ≥ max G`.
    pub allow_small_capacity: bool,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self { warm_frac: 0.5, allow_small_capacity: false }
    }
}

/// The figures of one evaluation; rates are over the counted requests (or their keys).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The policy's name.
    pub policy: String,
    /// The mode.
    pub mode: Mode,
    /// Capacity in entries.
    pub capacity: usize,
    /// Counted requests.
    pub requests: u64,
    /// Keys of the counted requests (after per-request deduplication).
    pub keys: u64,
    /// Counted requests whose keys were all resident at probe time.
    pub perfect: u64,
    /// Counted requests served without a backing-store read, surrogates included (equal to
    /// `perfect` until L3 surrogates exist).
    pub served_perfect: u64,
    /// Resident keys at probe time.
    pub hits: u64,
    /// Missed keys served by a surrogate (L3); not in `hits`.
    pub approximated: u64,
    /// Counted requests whose keys had all been seen before (infinite-cache bound).
    pub bound: u64,
    /// Counted requests the policy could not keep whole (see [`RequestOutcome::bypassed`]).
    pub bypasses: u64,
    /// Keys evicted during the counted requests.
    pub evictions: u64,
    /// Of those, keys of the request being committed (self-eviction).
    pub self_evictions: u64,
    /// `perfect / requests`.
    pub perfect_hit: f64,
    /// `served_perfect / requests`.
    pub served_perfect_hit: f64,
    /// `hits / keys`.
    pub individual_hit: f64,
    /// `bound / requests`: the perfect-hit rate of an infinite cache on the same stream.
    pub compulsory_bound: f64,
    /// `(keys - hits) / requests`.
    pub mean_misses: f64,
    /// `misses_per_request[m]` = counted requests with exactly `m` keys that went to the
    /// backing store (missed and not served by a surrogate).
    pub misses_per_request: Vec<u64>,
    /// The policy's metadata bytes per entry of capacity at the end of the run.
    pub metadata_bytes_per_entry: f64,
}

/// Builds `policy` with `capacity` entries and evaluates it on `trace` in `mode` with the
/// default [`EvalOptions`]. Errors: empty trace, capacity 0 or below the largest request,
/// prefix mode with nothing to measure, bad policy parameters.
pub fn evaluate(
    trace: &Trace,
    policy: &PolicyConfig,
    capacity: usize,
    mode: Mode,
) -> Result<Report> {
    check_inputs(trace, capacity, &EvalOptions::default())?;
    let mut p = policy.build(capacity)?;
    evaluate_with(trace, p.as_mut(), mode, &EvalOptions::default())
}

fn check_inputs(trace: &Trace, capacity: usize, opts: &EvalOptions) -> Result<()> {
    if trace.is_empty() {
        return Err(Error::shape("trace must hold at least one request, got 0"));
    }
    if capacity == 0 {
        return Err(Error::invalid("capacity must be at least 1, got 0"));
    }
    let g = trace.max_request_len();
    if capacity < g && !opts.allow_small_capacity {
        return Err(Error::invalid(format!(
            "capacity must be at least the largest request ({g} keys), got {capacity}"
        )));
    }
    if !(0.0..1.0).contains(&opts.warm_frac) {
        return Err(Error::invalid(format!("warm_frac must be in [0, 1), got {}", opts.warm_frac)));
    }
    Ok(())
}

/// Evaluates an already built `policy` (which may be warm) on `trace` in `mode`.
pub fn evaluate_with(
    trace: &Trace,
    policy: &mut dyn Policy,
    mode: Mode,
    opts: &EvalOptions,
) -> Result<Report> {
    check_inputs(trace, policy.capacity(), opts)?;
    let n = trace.len();
    let (passes, first_counted) = match mode {
        Mode::Online => (1, 0),
        Mode::Prefix => (1, (opts.warm_frac * n as f64).ceil() as usize),
        Mode::Replay => (2, n),
    };
    if first_counted >= passes * n {
        return Err(Error::invalid(format!(
            "prefix mode measures no request: {n} requests with warm_frac {}",
            opts.warm_frac
        )));
    }
    let mut r = Report {
        policy: policy.name().to_string(),
        mode,
        capacity: policy.capacity(),
        requests: 0,
        keys: 0,
        perfect: 0,
        served_perfect: 0,
        hits: 0,
        approximated: 0,
        bound: 0,
        bypasses: 0,
        evictions: 0,
        self_evictions: 0,
        perfect_hit: 0.0,
        served_perfect_hit: 0.0,
        individual_hit: 0.0,
        compulsory_bound: 0.0,
        mean_misses: 0.0,
        misses_per_request: vec![0; trace.max_request_len() + 1],
        metadata_bytes_per_entry: 0.0,
    };
    let mut seen = KeySet::default();
    let mut out = RequestOutcome::default();
    for step in 0..passes * n {
        let keys = trace.request(step % n);
        policy.access_into(keys, &mut out);
        if step >= first_counted {
            let misses = keys.len() - out.hits;
            r.requests += 1;
            r.keys += keys.len() as u64;
            r.hits += out.hits as u64;
            r.approximated += out.approximated as u64;
            r.perfect += u64::from(misses == 0);
            r.served_perfect += u64::from(misses == out.approximated);
            r.misses_per_request[misses - out.approximated] += 1;
            r.bound += u64::from(keys.iter().all(|k| seen.contains(k)));
            r.bypasses += u64::from(out.bypassed);
            r.evictions += out.evicted.len() as u64;
            r.self_evictions += out.self_evicted as u64;
        }
        if step < n {
            seen.extend(keys.iter().copied());
        }
    }
    let req = r.requests as f64;
    r.perfect_hit = r.perfect as f64 / req;
    r.served_perfect_hit = r.served_perfect as f64 / req;
    r.individual_hit = r.hits as f64 / r.keys as f64;
    r.compulsory_bound = r.bound as f64 / req;
    r.mean_misses = (r.keys - r.hits) as f64 / req;
    r.metadata_bytes_per_entry = policy.metadata_bytes_per_entry();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// A trace small enough to follow by hand, LRU with capacity 2:
    ///
    /// ```text
    /// i  request  LRU before (old→new)  hits  perfect  seen-before
    /// 0  [1,2]    []                    0     no       no
    /// 1  [1,2]    [1,2]                 2     yes      yes
    /// 2  [3,1]    [1,2]                 1     no       no   (3 new; 3 evicts 1, 1 evicts 2)
    /// 3  [1,2]    [3,1]                 1     no       yes  (2 evicts 3)
    /// 4  [1,2]    [1,2]                 2     yes      yes
    /// ```
    /// Replay's second pass starts from `[1,2]` (after request 4):
    /// `[1,2]` 2 hits perfect; `[1,2]` perfect; `[3,1]` 1 hit; `[1,2]` 1 hit; `[1,2]` perfect.
    fn hand_trace() -> Trace {
        Trace::from_requests([[1u64, 2], [1, 2], [3, 1], [1, 2], [1, 2]]).unwrap()
    }

    #[test]
    fn online_matches_hand_computation() {
        let r = evaluate(&hand_trace(), &PolicyConfig::Lru, 2, Mode::Online).unwrap();
        assert_eq!((r.requests, r.keys, r.hits, r.perfect, r.bound), (5, 10, 6, 2, 3));
        assert_eq!(r.misses_per_request, vec![2, 2, 1]);
        assert_eq!(r.perfect_hit, 0.4);
        assert_eq!(r.served_perfect_hit, r.perfect_hit);
        assert_eq!(r.individual_hit, 0.6);
        assert_eq!(r.compulsory_bound, 0.6);
        assert_eq!(r.mean_misses, 0.8);
        assert_eq!(r.bypasses, 0);
        assert_eq!(r.evictions, 3);
    }

    #[test]
    fn prefix_matches_hand_computation() {
        // N = 5, warm_frac 0.5: requests 0..3 warm (⌈2.5⌉ = 3), 3 and 4 counted.
        let r = evaluate(&hand_trace(), &PolicyConfig::Lru, 2, Mode::Prefix).unwrap();
        assert_eq!((r.requests, r.keys, r.hits, r.perfect, r.bound), (2, 4, 3, 1, 2));
        assert_eq!(r.misses_per_request, vec![1, 1, 0]);
        assert_eq!(r.compulsory_bound, 1.0);
    }

    #[test]
    fn replay_matches_hand_computation() {
        let r = evaluate(&hand_trace(), &PolicyConfig::Lru, 2, Mode::Replay).unwrap();
        assert_eq!((r.requests, r.keys, r.hits, r.perfect, r.bound), (5, 10, 8, 3, 5));
        assert_eq!(r.misses_per_request, vec![3, 2, 0]);
    }

    #[test]
    fn group_lfu_hand_trace() {
        // S = 2 (G = 2), no aging, capacity 2:
        // 0 [1,2] h0 s0: 1,2 at 0            1 [1,2] h2 s2: both to 2 (perfect)
        // 2 [3,1] h1 s1: 3 evicts 2 (1 pinned), 3 at 1; 1 stays 2
        // 3 [1,2] h1 s1: 2 evicts 3 (1 pinned); 2 at 1     4 [1,2] h2: perfect
        let c =
            embstore_policy::GroupLfuConfig { max_score: 2, age_alpha: None, ..Default::default() };
        let r = evaluate(&hand_trace(), &PolicyConfig::GroupLfu(c), 2, Mode::Online).unwrap();
        assert_eq!((r.hits, r.perfect), (6, 2));
        assert_eq!(r.misses_per_request, vec![2, 2, 1]);
    }

    #[test]
    fn bad_input_gets_typed_errors() {
        let t = hand_trace();
        let e = evaluate(&t, &PolicyConfig::Lru, 0, Mode::Online).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "capacity must be at least 1, got 0");
        let e = evaluate(&t, &PolicyConfig::Lru, 1, Mode::Online).unwrap_err();
        assert_eq!(e.to_string(), "capacity must be at least the largest request (2 keys), got 1");
        let empty = Trace::from_requests(Vec::<Vec<u64>>::new()).unwrap();
        let e = evaluate(&empty, &PolicyConfig::Lru, 4, Mode::Online).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        let one = Trace::from_requests([[1u64]]).unwrap();
        let e = evaluate(&one, &PolicyConfig::Lru, 4, Mode::Prefix).unwrap_err();
        assert_eq!(e.to_string(), "prefix mode measures no request: 1 requests with warm_frac 0.5");
        let mut p = PolicyConfig::Lru.build(4).unwrap();
        for f in [1.0, -0.1, f64::NAN] {
            let o = EvalOptions { warm_frac: f, ..Default::default() };
            let e = evaluate_with(&t, p.as_mut(), Mode::Prefix, &o).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
        let bad = PolicyConfig::GroupLfu(embstore_policy::GroupLfuConfig {
            age_alpha: Some(0.0),
            ..Default::default()
        });
        let e = evaluate(&t, &bad, 4, Mode::Online).unwrap_err();
        assert_eq!(e.to_string(), "age_alpha must be finite and > 0, got 0");
    }

    #[test]
    fn small_capacity_is_counted_as_bypass_when_allowed() {
        let t = Trace::from_requests([[1u64, 2, 3], [1, 2, 3], [4, 5, 6]]).unwrap();
        let o = EvalOptions { allow_small_capacity: true, ..Default::default() };
        for c in [
            PolicyConfig::Lru,
            PolicyConfig::GroupLfu(Default::default()),
            PolicyConfig::EvArc(Default::default()),
            PolicyConfig::GroupAssoc(Default::default()),
        ] {
            let mut p = c.build(2).unwrap();
            let r = evaluate_with(&t, p.as_mut(), Mode::Online, &o).unwrap();
            assert_eq!(r.bypasses, 3, "{}", r.policy);
            assert_eq!(r.perfect, 0);
        }
    }

    /// The evaluator's small Synthetic trace: 3,000 requests over 8 tables.
    fn small_trace() -> crate::trace::Trace {
        crate::trace::Synthetic {
            num_requests: 3_000,
            num_tables: 8,
            num_contexts: 2_000,
            max_table_size: 5_000,
            ..Default::default()
        }
        .generate()
        .unwrap()
    }

    /// What every report keeps: perfect hits under the compulsory bound and the per-key hit
    /// rate, and a misses-per-request histogram that adds up to the requests.
    fn assert_report_bounds(r: &Report, mode: Mode) {
        assert!(r.perfect_hit <= r.compulsory_bound, "{} {mode}", r.policy);
        assert!(r.perfect_hit <= r.individual_hit, "{} {mode}", r.policy);
        assert_eq!(r.misses_per_request.iter().sum::<u64>(), r.requests);
        assert_eq!(r.misses_per_request[0], r.perfect);
    }

    #[test]
    fn every_policy_stays_under_its_bound() {
        let t = small_trace();
        let cap = t.unique_keys() / 20;
        for c in [
            PolicyConfig::Lru,
            PolicyConfig::Lfu(Default::default()),
            PolicyConfig::GroupLfu(embstore_policy::GroupLfuConfig {
                max_score: 8,
                ..Default::default()
            }),
            PolicyConfig::EvLfuPaper { max_score: 8 },
            PolicyConfig::EvArc(embstore_policy::EvArcConfig {
                max_score: 8,
                ..Default::default()
            }),
            PolicyConfig::GroupAssoc(embstore_policy::GroupAssocConfig {
                max_score: 8,
                ..Default::default()
            }),
        ] {
            for mode in [Mode::Online, Mode::Prefix, Mode::Replay] {
                let r = evaluate(&t, &c, cap, mode).unwrap();
                assert_report_bounds(&r, mode);
            }
        }
    }

    /// The store's own policy (its default `LruLfu`, and `Noop`) scored by this evaluator
    /// through `EvictionPolicy`, on the same trace as the cache's policies: the report keeps
    /// every invariant, and LruLfu keeps some requests whole.
    #[test]
    fn the_store_default_policy_can_be_scored() {
        use embstore_policy::{EvictionConfig, EvictionPolicy};
        let t = small_trace();
        let cap = t.unique_keys() / 20;
        for config in [EvictionConfig::default(), EvictionConfig::Noop] {
            for mode in [Mode::Online, Mode::Prefix, Mode::Replay] {
                let mut p = EvictionPolicy::new(&config, cap, 7).unwrap();
                let r = evaluate_with(&t, &mut p, mode, &EvalOptions::default()).unwrap();
                let name = config.name();
                eprintln!(
                    "{name} {mode}: perfect {:.3}, bound {:.3}",
                    r.perfect_hit, r.compulsory_bound
                );
                assert_eq!((r.policy.as_str(), r.capacity), (name, cap));
                assert_report_bounds(&r, mode);
                assert_eq!(r.self_evictions, 0, "{name} {mode}");
                assert!(r.metadata_bytes_per_entry > 0.0);
                if config == EvictionConfig::Noop {
                    // Never evicts: whatever arrives after the cache fills is bypassed.
                    assert_eq!(r.evictions, 0);
                } else {
                    assert_eq!(r.bypasses, 0, "{name} {mode}");
                    assert!(r.evictions > 0 && r.perfect > 0, "{name} {mode}: {r:?}");
                }
            }
        }
    }
}
