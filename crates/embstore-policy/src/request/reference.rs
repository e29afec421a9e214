//! A naive reference for [`GroupLfu`](super::GroupLfu), written from the design note's
//! semantics (§2.4) and nothing else: a `Vec<(key, score, seq)>` whose victim is the minimum of
//! `(score, seq)` over unpinned entries; `seq` is the time the entry entered its score bucket.
//! Aging halves every score and re-sequences the entries in `(old score, old seq)` order, which
//! is what splicing bucket `2j` before `2j+1` means. Everything is O(C) per operation.

use super::{score_of, GroupLfuConfig};
use crate::request::Flush;

#[derive(Clone, Debug)]
struct Entry {
    key: u64,
    score: usize,
    seq: u64,
}

/// What one request did in the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RefOutcome {
    pub hit: Vec<bool>,
    pub evicted: Vec<u64>,
    pub bypassed: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct RefGroupLfu {
    cfg: GroupLfuConfig,
    cap: usize,
    s: usize,
    entries: Vec<Entry>,
    next_seq: u64,
    age_period: Option<u64>,
    ins_since_age: u64,
    trigger_count: usize,
    quota: usize,
    flush_pending: usize,
    top_at_last_perfect: usize,
}

impl RefGroupLfu {
    pub(crate) fn new(cap: usize, cfg: GroupLfuConfig) -> Self {
        let c = cap as f64;
        let (trigger_count, quota) = match cfg.flush {
            Flush::Off => (usize::MAX, 0),
            Flush::Incremental { trigger, rate, .. } => {
                (((trigger * c).floor() as usize).max(1), ((rate * c).floor() as usize).max(1))
            }
            Flush::Compat { trigger, rate } => {
                (((trigger * c).floor() as usize).max(1), ((rate * c).ceil() as usize).max(1))
            }
        };
        Self {
            s: usize::from(cfg.max_score),
            age_period: cfg.age_alpha.map(|a| ((a * c).round() as u64).max(1)),
            cfg,
            cap,
            entries: Vec::new(),
            next_seq: 0,
            ins_since_age: 0,
            trigger_count,
            quota,
            flush_pending: 0,
            top_at_last_perfect: 0,
        }
    }

    fn pos(&self, key: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.key == key)
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn count_score(&self, s: usize) -> usize {
        self.entries.iter().filter(|e| e.score == s).count()
    }

    /// The unpinned entry with the least `(score, seq)`, optionally only of score `only`.
    fn victim(&self, pinned: &[u64], only: Option<usize>) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !pinned.contains(&e.key) && only.is_none_or(|s| e.score == s))
            .min_by_key(|(_, e)| (e.score, e.seq))
            .map(|(i, _)| i)
    }

    pub(crate) fn access(&mut self, keys: &[u64]) -> RefOutcome {
        let hit: Vec<bool> = keys.iter().map(|&k| self.pos(k).is_some()).collect();
        let mut evicted = Vec::new();
        let mut bypassed = false;
        if keys.is_empty() {
            return RefOutcome { hit, evicted, bypassed };
        }
        let h = hit.iter().filter(|&&x| x).count();
        let s = usize::from(score_of(h, keys.len(), self.cfg.max_score));
        let mut pinned: Vec<u64> = Vec::new();
        if self.cfg.pin_request {
            pinned.extend(keys.iter().zip(&hit).filter(|(_, &x)| x).map(|(&k, _)| k));
        }
        let mut flushed_now = 0usize;
        for &k in keys {
            if let Some(p) = self.pos(k) {
                let cur = self.entries[p].score;
                if s > cur || (self.cfg.refresh_equal && s == cur) {
                    let q = self.seq();
                    self.entries[p].score = s;
                    self.entries[p].seq = q;
                }
                continue;
            }
            // flush
            match self.cfg.flush {
                Flush::Off => {}
                Flush::Incremental { batch, .. } => {
                    if self.flush_pending == 0 && self.count_score(self.s) >= self.trigger_count {
                        self.flush_pending = self.quota;
                    }
                    while self.flush_pending > 0 && flushed_now < batch {
                        let Some(v) = self.victim(&pinned, Some(self.s)) else {
                            self.flush_pending = 0;
                            break;
                        };
                        evicted.push(self.entries.remove(v).key);
                        self.flush_pending -= 1;
                        flushed_now += 1;
                    }
                }
                Flush::Compat { .. } => {
                    if self.top_at_last_perfect >= self.trigger_count {
                        for _ in 0..self.quota {
                            let Some(v) = self.victim(&pinned, Some(self.s)) else { break };
                            evicted.push(self.entries.remove(v).key);
                        }
                        self.top_at_last_perfect = self.count_score(self.s);
                    }
                }
            }
            if self.entries.len() >= self.cap {
                let Some(v) = self.victim(&pinned, None) else {
                    bypassed = true;
                    continue;
                };
                evicted.push(self.entries.remove(v).key);
            }
            let q = self.seq();
            self.entries.push(Entry { key: k, score: s, seq: q });
            if self.cfg.pin_request {
                pinned.push(k);
            }
            self.ins_since_age += 1;
        }
        if h == keys.len() {
            self.top_at_last_perfect = self.count_score(self.s);
        }
        if let Some(p) = self.age_period {
            if self.ins_since_age >= p {
                self.ins_since_age = 0;
                self.entries.sort_by_key(|e| (e.score, e.seq));
                for i in 0..self.entries.len() {
                    let q = self.seq();
                    let e = &mut self.entries[i];
                    e.score >>= 1;
                    e.seq = q;
                }
            }
        }
        if keys.len() > self.cap && !keys.iter().all(|&k| self.pos(k).is_some()) {
            bypassed = true;
        }
        RefOutcome { hit, evicted, bypassed }
    }

    /// `(key, score)` in eviction order.
    pub(crate) fn eviction_order(&self) -> Vec<(u64, u8)> {
        let mut v: Vec<&Entry> = self.entries.iter().collect();
        v.sort_by_key(|e| (e.score, e.seq));
        v.into_iter().map(|e| (e.key, e.score as u8)).collect()
    }
}
