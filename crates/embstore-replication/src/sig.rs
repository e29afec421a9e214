//! A part's significant versions (Ekko Alg 2's `sigv`): per key, the version of its newest
//! significant write, indexed by origin and timestamp so that a prioritised pull selects the
//! keys a requester lacks without scanning the part.
//!
//! Only significant writes enter (about 1 − k/100 of them), so the index stays small; entries
//! older than a horizon can be pruned ([`SigIndex::prune`]): their rows still travel by normal
//! sync, only no longer ahead of the rest.

use crate::version::Version;
use crate::vv::Vv;
use std::collections::{BTreeMap, BTreeSet};

/// Per key its significant version, and the same entries ordered by `(origin, timestamp)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SigIndex {
    by_key: BTreeMap<u64, Version>,
    by_sigv: BTreeSet<(u32, u64, u64)>,
}

impl SigIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `key`'s newest significant write is at `sigv` (an older one than what is
    /// recorded is ignored; `Version::ZERO` is no significant write).
    pub fn note(&mut self, key: u64, sigv: Version) {
        if sigv == Version::ZERO {
            return;
        }
        match self.by_key.get(&key) {
            Some(old) if *old >= sigv => return,
            Some(old) => {
                self.by_sigv.remove(&(old.replica, old.timestamp, key));
            }
            None => {}
        }
        self.by_key.insert(key, sigv);
        self.by_sigv.insert((sigv.replica, sigv.timestamp, key));
    }

    /// `key`'s significant version, if it has one.
    pub fn get(&self, key: u64) -> Option<Version> {
        self.by_key.get(&key).copied()
    }

    /// Forgets `key` (its row left the part without a tombstone).
    pub fn forget(&mut self, key: u64) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_sigv.remove(&(old.replica, old.timestamp, key));
        }
    }

    /// The keys whose significant version is newer than what `tsvv_r` knows of its origin,
    /// in key order.
    pub fn select(&self, tsvv_r: &Vv) -> Vec<u64> {
        let mut out = Vec::new();
        let mut next = self.by_sigv.iter().next().map(|e| e.0);
        while let Some(origin) = next {
            let from = (origin, tsvv_r.get(origin).saturating_add(1), 0);
            let to = (origin, u64::MAX, u64::MAX);
            if from <= to {
                out.extend(self.by_sigv.range(from..=to).map(|e| e.2));
            }
            next = origin
                .checked_add(1)
                .and_then(|o| self.by_sigv.range((o, 0, 0)..).next().map(|e| e.0));
        }
        out.sort_unstable();
        out
    }

    /// Drops the entries written before `before_ms` (their rows still go by normal sync).
    /// Returns how many were dropped.
    pub fn prune(&mut self, before_ms: u64) -> usize {
        let cut = before_ms << crate::version::CTR_BITS;
        let mut old = Vec::new();
        let mut next = self.by_sigv.iter().next().map(|e| e.0);
        while let Some(origin) = next {
            old.extend(self.by_sigv.range((origin, 0, 0)..(origin, cut, 0)).copied());
            next = origin
                .checked_add(1)
                .and_then(|o| self.by_sigv.range((o, 0, 0)..).next().map(|e| e.0));
        }
        for e in &old {
            self.by_sigv.remove(e);
            self.by_key.remove(&e.2);
        }
        old.len()
    }

    /// Keys indexed.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Every `(key, sigv)`, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Version)> + '_ {
        self.by_key.iter().map(|(k, v)| (*k, *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against a map model: the newest sigv per key is kept, `select` returns exactly the
        /// keys whose sigv is newer than the requester's knowledge of its origin.
        #[test]
        fn select_matches_a_scan(notes in proptest::collection::vec((0u64..40, 0u64..30, 0u32..4), 0..80),
                                 forget in proptest::collection::vec(0u64..40, 0..10),
                                 tsvv in proptest::collection::vec((0u32..4, 0u64..30), 0..4)) {
            let mut idx = SigIndex::new();
            let mut model: BTreeMap<u64, Version> = BTreeMap::new();
            for &(k, t, r) in &notes {
                let v = Version::new(t, r);
                idx.note(k, v);
                if v != Version::ZERO && model.get(&k).is_none_or(|o| *o < v) {
                    model.insert(k, v);
                }
            }
            for k in &forget {
                idx.forget(*k);
                model.remove(k);
            }
            let mut vv = Vv::new();
            for &(r, t) in &tsvv { vv.raise(r, t); }
            let want: Vec<u64> = model.iter().filter(|(_, v)| v.timestamp > vv.get(v.replica)).map(|(k, _)| *k).collect();
            prop_assert_eq!(idx.select(&vv), want);
            prop_assert_eq!(idx.len(), model.len());
            prop_assert_eq!(idx.iter().collect::<Vec<_>>(), model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn prune_drops_old_entries_only() {
        let mut idx = SigIndex::new();
        let at = |ms: u64| Version::new(ms << crate::version::CTR_BITS, 1);
        idx.note(1, at(100));
        idx.note(2, at(200));
        idx.note(3, at(300));
        assert_eq!(idx.prune(201), 2);
        assert_eq!(idx.iter().map(|e| e.0).collect::<Vec<_>>(), vec![3]);
        assert_eq!(idx.select(&Vv::new()), vec![3]);
    }
}
