//! Version vectors: a part's knowledge (Ekko §4.3).
//!
//! A [`Vv`] maps each origin replica to a timestamp; an absent origin reads 0. Its meaning for
//! a part: the part's rows equal an empty part after applying every write from each
//! origin `o` whose timestamp is `<= vv.get(o)`. Entries stay sorted by replica with no zero
//! entries, so two vectors with the same knowledge compare equal with `==`.

/// A version vector: `(replica, timestamp)` pairs sorted by replica, no zero timestamps.
/// Replication has a handful of origins (one primary per table, a few after failovers), so a
/// sorted vec beats a map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Vv {
    entries: Vec<(u32, u64)>,
}

impl Vv {
    /// The empty vector (knows nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// The timestamp known for `origin` (0 when absent).
    pub fn get(&self, origin: u32) -> u64 {
        match self.entries.binary_search_by_key(&origin, |e| e.0) {
            Ok(i) => self.entries[i].1,
            Err(_) => 0,
        }
    }

    /// Raises `origin`'s entry to at least `timestamp`.
    pub fn raise(&mut self, origin: u32, timestamp: u64) {
        if timestamp == 0 {
            return;
        }
        match self.entries.binary_search_by_key(&origin, |e| e.0) {
            Ok(i) => self.entries[i].1 = self.entries[i].1.max(timestamp),
            Err(i) => self.entries.insert(i, (origin, timestamp)),
        }
    }

    /// Pointwise max with `other`.
    pub fn merge(&mut self, other: &Vv) {
        for &(o, t) in &other.entries {
            self.raise(o, t);
        }
    }

    /// Whether every entry of `self` is at least `other`'s.
    pub fn dominates(&self, other: &Vv) -> bool {
        other.entries.iter().all(|&(o, t)| self.get(o) >= t)
    }

    /// The `(replica, timestamp)` entries, sorted by replica.
    pub fn entries(&self) -> &[(u32, u64)] {
        &self.entries
    }

    /// Pointwise min with `other` (an origin absent from either reads 0): what both know.
    pub fn meet(&self, other: &Vv) -> Vv {
        let mut out = Vv::new();
        for &(o, t) in &self.entries {
            out.raise(o, t.min(other.get(o)));
        }
        out
    }

    /// The largest timestamp of any origin (0 when empty).
    pub fn max_timestamp(&self) -> u64 {
        self.entries.iter().map(|e| e.1).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn model(v: &Vv) -> BTreeMap<u32, u64> {
        v.entries().iter().copied().collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against a BTreeMap model: raise, merge and dominates agree, and entries stay sorted
        /// without zeros.
        #[test]
        fn matches_a_map_model(a in proptest::collection::vec((0u32..6, 0u64..20), 0..12),
                               b in proptest::collection::vec((0u32..6, 0u64..20), 0..12)) {
            let (mut va, mut vb) = (Vv::new(), Vv::new());
            let (mut ma, mut mb) = (BTreeMap::<u32, u64>::new(), BTreeMap::<u32, u64>::new());
            for &(o, t) in &a { va.raise(o, t); if t > 0 { let e = ma.entry(o).or_default(); *e = (*e).max(t); } }
            for &(o, t) in &b { vb.raise(o, t); if t > 0 { let e = mb.entry(o).or_default(); *e = (*e).max(t); } }
            prop_assert_eq!(model(&va), ma.clone());
            let dom = mb.iter().all(|(o, t)| ma.get(o).copied().unwrap_or(0) >= *t);
            prop_assert_eq!(va.dominates(&vb), dom);
            let mut m = va.clone();
            m.merge(&vb);
            prop_assert!(m.dominates(&va) && m.dominates(&vb));
            for (o, t) in &mb { let e = ma.entry(*o).or_default(); *e = (*e).max(*t); }
            prop_assert_eq!(model(&m), ma);
            prop_assert!(m.entries().windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}
