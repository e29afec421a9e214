//! The whole cache seen as a policy, for the perfect-hit evaluator.

use super::key::key_of;
use super::{InferenceCache, Source};
use crate::trace::split_key;
use crate::Error;
use embstore_policy::{Policy, RequestOutcome};

/// An [`InferenceCache`] seen as a [`Policy`], so [`crate::evaluate_with`] scores the whole
/// system (L1 + L2 + L3, rows and all) with the same evaluator as a bare policy. Each
/// request is one [`InferenceCache::lookup`]; surrogate-served keys count as
/// `approximated`. A backing-store error ends the hit flags as misses and is kept in
/// [`CachePolicy::error`].
#[derive(Debug)]
pub struct CachePolicy<'a> {
    cache: &'a InferenceCache,
    rows: Vec<f32>,
    sources: Vec<Source>,
    offsets: [usize; 2],
    /// The first lookup error, if any.
    pub error: Option<Error>,
}

impl<'a> CachePolicy<'a> {
    /// Wraps `cache`.
    pub fn new(cache: &'a InferenceCache) -> Self {
        Self { cache, rows: Vec::new(), sources: Vec::new(), offsets: [0, 0], error: None }
    }
}

impl Policy for CachePolicy<'_> {
    fn name(&self) -> &'static str {
        "inference-cache"
    }
    fn capacity(&self) -> usize {
        self.cache.capacity()
    }
    fn len(&self) -> usize {
        self.cache.memory().levels.iter().map(|t| t.len).sum()
    }
    fn contains(&self, key: u64) -> bool {
        let (t, id) = split_key(key);
        let key = key_of(t, id);
        let s = self.cache.shards[self.cache.shard_of(key)].read();
        s.levels.iter().any(|t| t.slot_of(key).is_some())
    }
    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        if keys.is_empty() {
            return;
        }
        self.rows.resize(keys.len() * self.cache.cfg.dim, 0.0);
        self.sources.resize(keys.len(), Source::Store);
        self.offsets[1] = keys.len();
        let before = self.cache.stats.lock().bypasses;
        let result =
            self.cache.lookup(keys, &self.offsets, &mut self.rows, Some(&mut self.sources));
        // Deterministic figures: what the L3 filler reads is in L3 before the next request.
        self.cache.sync_l3();
        match result {
            Ok(()) => {
                for &s in &self.sources {
                    out.hit.push(matches!(s, Source::L1 | Source::L2));
                    out.approximated += usize::from(s == Source::Surrogate);
                }
                out.hits = out.hit.iter().filter(|&&h| h).count();
                out.bypassed = self.cache.stats.lock().bypasses > before;
            }
            Err(e) => {
                out.hit.resize(keys.len(), false);
                self.error.get_or_insert(e);
            }
        }
    }
    fn metadata_bytes(&self) -> usize {
        let m = self.cache.memory();
        m.levels.iter().map(|t| t.metadata_bytes).sum::<usize>()
            + m.l3_bytes
            + m.surrogate_table_bytes
            + m.l3_queue_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::testing::*;
    use crate::cache::*;
    use crate::trace::Synthetic;
    use crate::{evaluate, evaluate_with, EvalOptions, Mode};

    #[test]
    fn one_f32_tier_scores_like_the_bare_policy() {
        // The cache with one f32 level and one shard is GroupLfu plus rows: the evaluator must
        // give the same perfect hits for both, the bare policy seeing the keys the cache's
        // policy sees (GroupAssoc's sets are a hash of them).
        let trace = Synthetic {
            num_requests: 4_000,
            num_tables: 6,
            num_contexts: 500,
            max_table_size: 3_000,
            seed: 7,
            ..Default::default()
        }
        .generate()
        .unwrap();
        let d = 4;
        for policy in slot_policies(6) {
            let mut cfg = CacheConfig::new(6, d, 30_000);
            cfg.policy = policy.clone();
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let cap = c.capacity();
            let mut p = CachePolicy::new(&c);
            let sys = evaluate_with(&trace, &mut p, Mode::Prefix, &EvalOptions::default()).unwrap();
            assert!(p.error.is_none());
            let bare = evaluate(&as_policy_keys(&trace), &policy, cap, Mode::Prefix).unwrap();
            assert_eq!((sys.perfect, sys.hits), (bare.perfect, bare.hits), "{}", policy.name());
            assert!(sys.perfect > 0);
        }
    }
}
