//! [`EvArc`]: ARC whose frequency list is EV-LFU's score buckets (paper §4.3, design note
//! §2.5), an ablation that keeps individual hits while adding group awareness.
//!
//! ## Lists
//! ```text
//! R  (T1)  LRU list: keys seen once since admission            cached
//! F  (T2)  score buckets 0..=S, max rule, evict lowest/oldest    cached
//! B1, B2   ghosts (keys only) of R and F victims                 not cached
//! p        ARC's adaptive target for |R|
//! ```
//! Per key, in request order, with `s = ⌊h·S/G⌋` from the probe (ARC's cases, Megiddo and
//! Modha 2003, with F's recency replaced by the group score):
//! - hit in R: move to F at score `s` (R→F promotion carries the request's `h`);
//! - hit in F: max rule (`s > score` moves it to the tail of bucket `s`);
//! - ghost hit in B1 (B2): `p += max(|B2|/|B1|, 1)` (`p -= max(|B1|/|B2|, 1)`), REPLACE,
//!   the key enters F at score `s`;
//! - miss: if `|R| + |B1| ≥ C`: drop B1's oldest and REPLACE if `|R| < C`, else evict R's
//!   oldest; otherwise, if `|R| + |F| + |B1| + |B2| ≥ C`: drop B2's oldest when that total
//!   reaches `2C`, and REPLACE. Then the key enters R.
//! - REPLACE (only when the cache is full): R's oldest goes to B1 if `|R| > p` (or `= p` on a
//!   B2 hit), else F's lowest/oldest goes to B2.
//!
//! **Flush** (after each request, default on): when F's top bucket holds `≥ ⌊0.95·C⌋` keys,
//! its `⌊0.10·C⌋` oldest move back to R — to R's LRU end (note §2.5's recommendation, so
//! they leave next unless used again; the artifact leaves them mid-list), not evicted — as
//! many of B1's oldest ghosts move to B2, and `p` rises by the same count, capped at `C` (the
//! artifact leaves it uncapped). `|R| + |B1| ≥ C` (not `= C`) in the miss case keeps the
//! ghost lists bounded when a flush has grown R. No pinning (the paper's variant).
//!
//! Memory: ghosts are slots too, so the arena holds `2C` slots: about twice GroupLfu's bytes
//! per cached entry.

use crate::request::lists::{Lists, CURRENT};
use crate::request::{check_capacity, overflowed, score_of, Policy, RequestOutcome};
use crate::{Error, Result};

/// Parameters of [`EvArc`].
#[derive(Clone, Debug, PartialEq)]
pub struct EvArcConfig {
    /// Maximum score `S` of F's buckets (`T` for one-hot requests), at least 1. Default 26.
    pub max_score: u8,
    /// Whether the flush runs (default true, as in the paper).
    pub flush: bool,
    /// Fraction of the capacity in F's top bucket that triggers a flush, in (0, 1]; 0.95.
    pub flush_trigger: f64,
    /// Fraction of the capacity moved from F to R per flush, in (0, 1]; 0.10.
    pub flush_rate: f64,
}

impl Default for EvArcConfig {
    fn default() -> Self {
        Self { max_score: 26, flush: true, flush_trigger: 0.95, flush_rate: 0.10 }
    }
}

impl EvArcConfig {
    /// Checks the parameters (see each field).
    pub fn validate(&self) -> Result<()> {
        if self.max_score == 0 {
            return Err(Error::invalid("max_score must be at least 1, got 0"));
        }
        for (name, v) in [("flush_trigger", self.flush_trigger), ("flush_rate", self.flush_rate)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(Error::invalid(format!("{name} must be in (0, 1], got {v}")));
            }
        }
        Ok(())
    }
}

/// EV-ARC; see the module docs.
#[derive(Clone, Debug)]
pub struct EvArc {
    cfg: EvArcConfig,
    lists: Lists,
    c: usize,
    s: usize,
    p: usize,
    trigger_count: usize,
    flush_count: usize,
}

impl EvArc {
    /// An empty EV-ARC for `capacity` cached keys (plus up to `capacity` ghosts).
    pub fn new(capacity: usize, config: EvArcConfig) -> Result<Self> {
        check_capacity(capacity)?;
        config.validate()?;
        let s = usize::from(config.max_score);
        let c = capacity as f64;
        Ok(Self {
            lists: Lists::new(2 * capacity, s + 1, 3),
            c: capacity,
            s,
            p: 0,
            trigger_count: ((config.flush_trigger * c).floor() as usize).max(1),
            flush_count: ((config.flush_rate * c).floor() as usize).max(1),
            cfg: config,
        })
    }

    fn r(&self) -> usize {
        self.s + 1
    }
    fn b1(&self) -> usize {
        self.s + 2
    }
    fn b2(&self) -> usize {
        self.s + 3
    }

    /// ARC's adaptive target size of R.
    pub fn target(&self) -> usize {
        self.p
    }

    /// `(|R|, |F|, |B1|, |B2|)`.
    pub fn list_sizes(&self) -> (usize, usize, usize, usize) {
        let r = self.lists.list_len(self.r());
        let b1 = self.lists.list_len(self.b1());
        let b2 = self.lists.list_len(self.b2());
        (r, self.lists.len() - r - b1 - b2, b1, b2)
    }

    fn cached(&self) -> usize {
        let (r, f, _, _) = self.list_sizes();
        r + f
    }

    /// Checks the structural invariants: lists consistent, `|R| + |F| ≤ C`, all lists
    /// together ≤ 2C, `p ≤ C`. O(C); for tests.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.lists.check()?;
        let (r, f, b1, b2) = self.list_sizes();
        if r + f > self.c {
            return Err(format!("{} cached > capacity {}", r + f, self.c));
        }
        if r + f + b1 + b2 > 2 * self.c || self.p > self.c {
            return Err(format!("lists {r}/{f}/{b1}/{b2}, p {} out of bounds", self.p));
        }
        Ok(())
    }

    /// Moves a cached slot to a ghost list, reporting it as evicted.
    fn demote_to_ghost(&mut self, v: u32, ghost: usize, out: &mut RequestOutcome) {
        self.lists.note_eviction(v, out);
        self.lists.move_to_back(v, ghost);
    }

    /// ARC's REPLACE: frees one cached place (only called when the cache is full).
    fn replace(&mut self, in_b2: bool, out: &mut RequestOutcome) {
        let r = self.lists.list_len(self.r());
        if r >= 1 && (r > self.p || (in_b2 && r == self.p)) {
            if let Some(v) = self.lists.head(self.r()) {
                self.demote_to_ghost(v, self.b1(), out);
            }
        } else if let Some(v) = self.lists.lowest_unpinned() {
            self.demote_to_ghost(v, self.b2(), out);
        } else if let Some(v) = self.lists.head(self.r()) {
            self.demote_to_ghost(v, self.b1(), out);
        }
    }

    fn drop_oldest(&mut self, list: usize) {
        if let Some(v) = self.lists.head(list) {
            self.lists.remove(v);
        }
    }

    fn flush(&mut self) {
        let s = self.s;
        if !self.cfg.flush || self.lists.list_len(s) < self.trigger_count {
            return;
        }
        let moved: Vec<u32> = self.lists.iter_list(s).take(self.flush_count).collect();
        let r = self.r();
        for &v in moved.iter().rev() {
            self.lists.move_to_front(v, r);
        }
        for _ in 0..moved.len() {
            let Some(v) = self.lists.head(self.b1()) else { break };
            let b2 = self.b2();
            self.lists.move_to_back(v, b2);
        }
        self.p = (self.p + moved.len()).min(self.c);
    }
}

impl Policy for EvArc {
    fn name(&self) -> &'static str {
        "ev-arc"
    }

    fn capacity(&self) -> usize {
        self.c
    }

    fn len(&self) -> usize {
        self.cached()
    }

    fn contains(&self, key: u64) -> bool {
        matches!(self.lists.find(key), Some(i) if self.lists.list_of(i) <= self.r())
    }

    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        if keys.is_empty() {
            return;
        }
        let (r_id, b1_id, b2_id) = (self.r(), self.b1(), self.b2());
        self.lists.probe(keys, CURRENT, out, |l, i| l.list_of(i) <= r_id);
        let sc = usize::from(score_of(out.hits, keys.len(), self.cfg.max_score));
        for &k in keys {
            if let Some(i) = self.lists.find(k) {
                let b = self.lists.list_of(i);
                if b <= self.s {
                    if sc > b {
                        self.lists.move_to_back(i, sc);
                    }
                } else if b == r_id {
                    self.lists.move_to_back(i, sc);
                } else {
                    // Ghost hit: adapt p, make room, revive into F.
                    let (b1, b2) = (self.lists.list_len(b1_id), self.lists.list_len(b2_id));
                    let in_b2 = b == b2_id;
                    if in_b2 {
                        self.p = self.p.saturating_sub((b1 / b2.max(1)).max(1));
                    } else {
                        self.p = (self.p + (b2 / b1.max(1)).max(1)).min(self.c);
                    }
                    if self.cached() >= self.c {
                        self.replace(in_b2, out);
                    }
                    self.lists.move_to_back(i, sc);
                    self.lists.mark(i, CURRENT);
                    out.admitted += 1;
                }
                continue;
            }
            let (r, _, b1, _) = self.list_sizes();
            if r + b1 >= self.c {
                if r < self.c {
                    self.drop_oldest(b1_id);
                    if self.cached() >= self.c {
                        self.replace(false, out);
                    }
                } else if let Some(v) = self.lists.head(r_id) {
                    self.lists.evict(v, out);
                }
            } else if self.lists.len() >= self.c {
                if self.lists.len() >= 2 * self.c {
                    self.drop_oldest(b2_id);
                }
                if self.cached() >= self.c {
                    self.replace(false, out);
                }
            }
            if self.lists.is_full() {
                // Safety net (not reached while the ARC bounds hold): drop a ghost.
                let g = if self.lists.list_len(b2_id) > 0 { b2_id } else { b1_id };
                self.drop_oldest(g);
            }
            if let Some(i) = self.lists.insert(k, r_id) {
                self.lists.mark(i, CURRENT);
                out.admitted += 1;
            }
        }
        self.lists.clear_marks();
        self.flush();
        out.bypassed = overflowed(self, keys);
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.lists.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn arc(c: usize) -> EvArc {
        EvArc::new(c, EvArcConfig { max_score: 2, flush: false, ..Default::default() }).unwrap()
    }

    #[test]
    fn second_use_promotes_to_f_with_the_request_score() {
        let mut p = arc(4);
        p.access_request(&[1, 2]);
        assert_eq!(p.list_sizes(), (2, 0, 0, 0));
        p.access_request(&[1, 3]); // h = 1, s = 1: 1 goes to F at score 1
        assert_eq!(p.list_sizes(), (2, 1, 0, 0));
        assert_eq!(p.lists.list_of(p.lists.find(1).unwrap()), 1);
    }

    #[test]
    fn ghost_hit_adapts_the_target() {
        let mut p = arc(2);
        p.access_request(&[1]);
        p.access_request(&[1]); // 1 in F
        p.access_request(&[2]);
        let o = p.access_request(&[3]); // full: R(2) > p=0 -> 2 to B1
        assert_eq!(o.evicted, vec![2]);
        assert_eq!(p.list_sizes(), (1, 1, 1, 0));
        let o = p.access_request(&[2]); // B1 hit: p = 1, REPLACE: R(1) = p -> F's 1 to B2
        assert!(!o.hit[0]);
        assert_eq!(p.target(), 1);
        assert_eq!(o.evicted, vec![1]);
        assert!(p.contains(2) && p.contains(3) && !p.contains(1));
        p.check_invariants().unwrap();
    }

    #[test]
    fn flush_moves_top_bucket_back_to_r_lru_end() {
        let mut p = EvArc::new(
            4,
            EvArcConfig { max_score: 2, flush: true, flush_trigger: 0.5, flush_rate: 0.25 },
        )
        .unwrap();
        p.access_request(&[1, 2]);
        p.access_request(&[1, 2]); // both to F at score 2 -> |top| = 2 >= 2: flush 1 key
        assert_eq!(p.list_sizes(), (1, 1, 0, 0));
        assert_eq!(p.lists.head(p.r()).map(|i| p.lists.key(i)), Some(1));
        assert_eq!(p.target(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn random_traces_keep_the_bounds() {
        for seed in 0..20u64 {
            let mut rng = SplitMix64::new(seed);
            let c = 1 + rng.below(16) as usize;
            let mut p = EvArc::new(
                c,
                EvArcConfig { max_score: 3, flush_trigger: 0.3, ..Default::default() },
            )
            .unwrap();
            for _ in 0..500 {
                let g = 1 + rng.below(4) as usize;
                let keys: Vec<u64> = (0..g).map(|_| rng.below(40)).collect();
                let mut probe = Vec::new();
                p.probe(&keys, &mut probe);
                let o = p.access_request(&keys);
                assert_eq!(o.hit, probe, "seed {seed}");
                if let Err(e) = p.check_invariants() {
                    panic!("seed {seed}: {e}");
                }
            }
        }
    }
}
