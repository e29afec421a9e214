//! The update cache of one part, with its dominator version vector (Ekko §4.4.1, Alg 1).
//!
//! The cache holds `key -> version` of recently written rows, so a pull whose requester is
//! nearly up to date selects from the cache instead of scanning the part. Invariants, for
//! every row p of the part:
//!
//! - (i) p uncached: `p.version.timestamp <= dvv.get(p.version.replica)` (C1);
//! - (ii) p cached: `p.version.timestamp > t_prune_to >= every timestamp in dvv` (C2).
//!
//! Hence the hit rule: when the requester's VV dominates the DVV, no uncached row can pass
//! `v > vv_r[v.replica]`, and selecting from the cache yields exactly the full-scan set (C3).
//! Keys are kept in a `BTreeMap` so selections come out in key order, the same order a scan
//! gives, and runs replay exactly.

use crate::version::{Version, CTR_BITS};
use crate::vv::Vv;
use std::collections::BTreeMap;

/// One part's update cache.
#[derive(Clone, Debug, Default)]
pub struct UpdateCache {
    entries: BTreeMap<u64, Version>,
    dvv: Vv,
    t_prune_to: u64,
}

impl UpdateCache {
    /// An empty cache (no rows, so both invariants hold).
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache with nothing cached whose DVV is `dvv`, for a part whose existing rows are all
    /// at or below `dvv` (C1): `t_prune_to` starts at the DVV's largest timestamp (C2), so
    /// only writes after it are cached.
    pub fn covering(dvv: Vv) -> Self {
        Self { t_prune_to: dvv.max_timestamp(), dvv, entries: BTreeMap::new() }
    }

    /// Forgets `key` (its row left without a tombstone): C1 concerns existing rows only.
    pub fn forget(&mut self, key: u64) {
        self.entries.remove(&key);
    }

    /// Records a write of `key` at version `v` (local or applied from a peer). A cached key
    /// stays cached: versions only grow, so its new version is still above `t_prune_to`.
    pub fn on_write(&mut self, key: u64, v: Version) {
        if let Some(e) = self.entries.get_mut(&key) {
            *e = v;
        } else if v.timestamp <= self.t_prune_to {
            self.dvv.raise(v.replica, v.timestamp);
        } else {
            self.entries.insert(key, v);
        }
    }

    /// Raises `t_prune_to` to the end of millisecond `now_ms - d_prop_ms` and moves every
    /// cached row at or below it into the DVV. `t_prune_to` never goes down (C4).
    pub fn prune(&mut self, now_ms: u64, d_prop_ms: u64) {
        let Some(ms) = now_ms.checked_sub(d_prop_ms) else {
            return;
        };
        let cut = ms.min(crate::version::MAX_MS) << CTR_BITS | ((1 << CTR_BITS) - 1);
        self.advance(cut);
    }

    /// Prunes until at most `cap` rows stay cached: `t_prune_to` rises to the timestamp of the
    /// `len - cap`-th oldest cached row (rows sharing that timestamp go too, so the cache may
    /// end below `cap`).
    pub fn prune_to_cap(&mut self, cap: usize) {
        if self.entries.len() <= cap {
            return;
        }
        let mut ts: Vec<u64> = self.entries.values().map(|v| v.timestamp).collect();
        let k = self.entries.len() - cap - 1;
        let (_, cut, _) = ts.select_nth_unstable(k);
        let cut = *cut;
        self.advance(cut);
    }

    /// Raises `t_prune_to` to `cut` (never lowers it) and moves the rows at or below it into
    /// the DVV.
    fn advance(&mut self, cut: u64) {
        self.t_prune_to = self.t_prune_to.max(cut);
        let t = self.t_prune_to;
        let dvv = &mut self.dvv;
        self.entries.retain(|_, v| {
            if v.timestamp <= t {
                dvv.raise(v.replica, v.timestamp);
                false
            } else {
                true
            }
        });
    }

    /// Whether a pull from a requester knowing `vv_r` can be answered from the cache alone.
    pub fn hits(&self, vv_r: &Vv) -> bool {
        vv_r.dominates(&self.dvv)
    }

    /// The cached keys a requester knowing `vv_r` lacks, in key order (valid on a hit).
    pub fn select(&self, vv_r: &Vv) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(_, v)| v.timestamp > vv_r.get(v.replica))
            .map(|(k, _)| *k)
            .collect()
    }

    /// The cached version of `key`, if cached.
    pub fn get(&self, key: u64) -> Option<Version> {
        self.entries.get(&key).copied()
    }

    /// Rows cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The dominator version vector.
    pub fn dvv(&self) -> &Vv {
        &self.dvv
    }

    /// The prune horizon: every timestamp at or below it has left the cache.
    pub fn t_prune_to(&self) -> u64 {
        self.t_prune_to
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Write { key: u64, origin: u32, dt: u64 },
        Prune { d_prop: u64 },
        Cap { cap: usize },
        Pull { lag: Vec<u64> },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..12, 0u32..3, 0u64..40).prop_map(|(key, origin, dt)| Op::Write { key, origin, dt }),
            1 => (0u64..200).prop_map(|d_prop| Op::Prune { d_prop }),
            1 => (0usize..6).prop_map(|cap| Op::Cap { cap }),
            2 => proptest::collection::vec(0u64..300, 3).prop_map(|lag| Op::Pull { lag }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against a model part (a map of key -> version): C1 and C2 after every step, C4's
        /// monotone `t_prune_to` and `|cache| <= cap` after a prune to a cap, and C3: on every hit, the cache's selection equals the full
        /// scan's.
        #[test]
        fn invariants_and_differential(ops in proptest::collection::vec(op(), 1..150)) {
            let mut cache = UpdateCache::new();
            let mut rows: BTreeMap<u64, Version> = BTreeMap::new();
            let mut clocks = [0u64; 3];
            let mut now = 1000u64;
            for op in ops {
                let before = cache.t_prune_to();
                match op {
                    Op::Write { key, origin, dt } => {
                        now += dt;
                        // Each origin's clock: strictly increasing, near wall time.
                        let c = &mut clocks[origin as usize];
                        *c = (*c + 1).max((now - origin as u64 * 30) << CTR_BITS);
                        let v = Version::new(*c, origin);
                        // LWW, as the replica applies it: only newer versions are written.
                        if rows.get(&key).is_none_or(|old| v > *old) {
                            rows.insert(key, v);
                            cache.on_write(key, v);
                        }
                    }
                    Op::Prune { d_prop } => cache.prune(now, d_prop),
                    Op::Cap { cap } => {
                        cache.prune_to_cap(cap);
                        prop_assert!(cache.len() <= cap, "C4: {} cached over the cap {}", cache.len(), cap);
                    }
                    Op::Pull { lag } => {
                        let mut vv_r = Vv::new();
                        for (o, l) in lag.iter().enumerate() {
                            vv_r.raise(o as u32, clocks[o].saturating_sub(l << CTR_BITS));
                        }
                        if cache.hits(&vv_r) {
                            let scan: Vec<u64> = rows.iter()
                                .filter(|(_, v)| v.timestamp > vv_r.get(v.replica))
                                .map(|(k, _)| *k).collect();
                            prop_assert_eq!(cache.select(&vv_r), scan);
                        }
                    }
                }
                prop_assert!(cache.t_prune_to() >= before, "t_prune_to went down");
                for (k, v) in &rows {
                    match cache.get(*k) {
                        Some(c) => {
                            prop_assert_eq!(c, *v);
                            prop_assert!(v.timestamp > cache.t_prune_to(), "C2: cached {:?} at or below t_prune_to", v);
                        }
                        None => prop_assert!(v.timestamp <= cache.dvv().get(v.replica), "C1: uncached {:?} above dvv", v),
                    }
                }
                prop_assert!(cache.dvv().max_timestamp() <= cache.t_prune_to(), "C2: dvv above t_prune_to");
                prop_assert!(cache.len() <= rows.len());
            }
        }
    }

    /// C4: a requester whose VV equals the responder's VV as of at most `D_prop` ago hits,
    /// when the responder's versions follow its wall clock (a primary's own writes).
    #[test]
    fn a_requester_d_prop_behind_hits() {
        let mut cache = UpdateCache::new();
        let mut vv_s = Vv::new();
        let mut snapshots: Vec<(u64, Vv)> = Vec::new();
        let d_prop = 50;
        for now in 1..400u64 {
            let v = Version::new(now << CTR_BITS, 0);
            cache.on_write(now % 7, v);
            vv_s.raise(0, v.timestamp);
            snapshots.push((now, vv_s.clone()));
            cache.prune(now, d_prop);
            for (t, vv) in &snapshots {
                if t + d_prop >= now {
                    assert!(cache.hits(vv), "vv from {t} misses at {now}");
                }
            }
        }
    }
}
