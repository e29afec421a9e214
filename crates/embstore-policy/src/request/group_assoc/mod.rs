//! [`GroupAssoc`]: EV-LFU's group score in a **set-associative** arena, with a small hit
//! counter, request pinning and lazy aging: 10 bytes of metadata per entry and no index for a
//! fixed rule; the adaptive default adds its shadows of sampled sets (~2 B an entry, see
//! [`MIN_SAMPLE`]) and, once sets fill, a frequency sketch for admission.
//!
//! ## Why set-associative
//! At D = 16 an int4 row is 12 B, and [`super::GroupLfu`]'s metadata (a 20 B slot with list
//! links plus a 4 B-per-bucket index) is another ~26 B: two thirds of an entry. Here a key can
//! only live in the `ways` slots of one set (a fixed hash of the key picks it), so there is no
//! index (the set's keys are scanned), and eviction order is a per-set hand instead of linked
//! lists. An entry is its key (8 B), its group score (1 B) and a state byte (occupied, pin
//! marks, a 4-bit hit counter); a set adds 2 B (hand, aging epoch). Same bytes, ~1.7× the
//! entries of GroupLfu; at 32 ways the set restriction costs ~0.3–0.6 points of perfect hits
//! at equal entries on the synthetic trace (measured against a fully associative run).
//!
//! ## One request
//! ```text
//! probe   hit[j] = key j resident; h = Σ hit (+ other shards/tiers); s = ⌊h·S/G⌋  (pure)
//! pin     every resident key of the request (pin_request)
//! commit  for each key, in the order given:
//!           resident: score = max(score, s) (max rule); hits += 1 (saturates at 15)
//!           missing:  in the key's set, take an empty way, else the unpinned way of least
//!                     priority = score/S + ½·hits/15 (score alone without count_hits), scanning
//!                     from the set's hand (ties: the first after the hand); the hand moves
//!                     past the victim. The key enters there with score s, hits 0, pinned.
//!                     No unpinned way in the set: not admitted, bypass.
//! after   unpin; every α·C admissions halve every score and hit counter (lazily, per set)
//! ```
//! The hand makes ties go to the way that has waited longest since the hand last passed
//! (a CLOCK within the set): a key just admitted sits right behind the hand, so it is the last
//! of its priority to go — the recency that pure EV-LFU lacks, without timestamps. The hit
//! counter adds frequency to the max-rule score, which on its own cannot tell a key seen once
//! in a good request from one seen a hundred times.
//!
//! ## Aging (lazy, O(1) per step)
//! An aging step bumps a global epoch; a set whose epoch lags by `d` halves its ways' scores
//! and counters `d` times (`>> d`) the next time a commit touches it, so a step costs nothing
//! up front. Every 128 steps one O(C) pass brings every set up to date and rebases the epochs,
//! so the u8 differences never wrap. Reads of a score (for inspection) apply the lag too.
//!
//! ## Contract notes
//! Slots are stable: a key never moves while resident, and slot `i` holds row `i` of a tier's
//! arena ([`Policy::has_slots`]). Deterministic for a given (configuration, trace); unlike the
//! list-based policies, the outcome depends on a fixed hash of the keys (the set mapping), so
//! relabelling keys changes it. With `C ≥ G` a request can still be bypassed if more of its
//! keys fall in one set than that set has unpinned ways (negligible at 32 ways and C ≫ G; a
//! cache smaller than `ways` is one fully associative set).

use crate::index::fmix64;
use crate::request::{
    age_period, check_alpha, check_capacity, overflowed, score_of, Group, Policy, RequestOutcome,
    NO_SLOT,
};
use crate::{Error, Result};

mod sketch;

use sketch::FreqSketch;

/// State bit: the way holds a key.
const OCC: u8 = 1;
/// State bit: a key of the request being committed, never chosen as a victim.
const PINNED: u8 = 2;
/// State bit: a key of the request being committed (pinned or not), for self-eviction counts.
const CURRENT: u8 = 4;
/// State bit: hit since the CLOCK hand last passed (the reference bit of [`Rule::Clock`]).
const REF: u8 = 8;
/// The hit counter lives in the state byte's high nibble.
const HITS_SHIFT: u32 = 4;
/// Largest hit count.
const HITS_MAX: u8 = 15;
/// Aging steps between the O(C) passes that rebase set epochs (differences stay below 256).
const EPOCH_REBASE: u8 = 128;

/// Largest `ways` accepted: a set holds fewer than `2·ways` slots, and its hand is a `u8`.
pub const MAX_WAYS: usize = 128;

/// Parameters of [`GroupAssoc`].
#[derive(Clone, Debug, PartialEq)]
pub struct GroupAssocConfig {
    /// Maximum score `S`, at least 1: `T` for one-hot requests (26 for Criteo), 32 with bags.
    pub max_score: u8,
    /// Slots per set (associativity), 1 to [`MAX_WAYS`]; default 32. Sets get `ways` to
    /// `2·ways − 1` slots (the capacity need not be a multiple); a capacity below `ways` is
    /// one set.
    pub ways: usize,
    /// Halve all scores and hit counters every `α·C` admissions; `None` = never. Default 2.
    pub age_alpha: Option<f64>,
    /// Evict by `score/S + ½·hits/15` (default true); false: by score alone (set-associative
    /// GroupLfu with CLOCK ties; better on MovieLens, worse on the synthetic trace).
    pub count_hits: bool,
    /// Never evict a key of the request being committed (default true).
    pub pin_request: bool,
    /// The replacement rule: `None` (default) adapts — shadow copies of a sample of the sets
    /// run every [`Rule`] on the same keys, and the cache follows the one whose sub-requests
    /// missed least recently; `Some(rule)` fixes it.
    pub rule: Option<Rule>,
}

/// The replacement rules an adaptive [`GroupAssoc`] chooses between. All keep the same
/// per-way state (score, hit counter, reference bit), so a switch needs no conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Least `score/S + ½·hits/15` goes; every missing key is admitted (the group rule).
    Group,
    /// The group rule behind a TinyLFU admission filter: a missing key replaces a way only if
    /// it was seen more often recently (static popularity, scans).
    GroupAdmit,
    /// CLOCK: the first unreferenced way after the hand goes (recency; moving working sets).
    Clock,
}

impl Rule {
    /// Every rule, in the order the shadows run them.
    pub const ALL: [Rule; 3] = [Rule::Group, Rule::GroupAdmit, Rule::Clock];

    /// Its name (`policy_params={"rule": ...}`, `stats()`).
    pub fn name(self) -> &'static str {
        match self {
            Rule::Group => "group",
            Rule::GroupAdmit => "group_admission",
            Rule::Clock => "clock",
        }
    }

    /// The rule of a name; `None` for an unknown one.
    pub fn parse(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl Default for GroupAssocConfig {
    fn default() -> Self {
        Self {
            max_score: 26,
            ways: 32,
            age_alpha: Some(2.0),
            count_hits: true,
            pin_request: true,
            rule: None,
        }
    }
}

impl GroupAssocConfig {
    /// Checks the parameters (see each field).
    pub fn validate(&self) -> Result<()> {
        if self.max_score == 0 {
            return Err(Error::invalid("max_score must be at least 1, got 0"));
        }
        if self.ways == 0 || self.ways > MAX_WAYS {
            return Err(Error::invalid(format!(
                "ways must be in 1..={MAX_WAYS}, got {}",
                self.ways
            )));
        }
        check_alpha("age_alpha", self.age_alpha)
    }
}

/// Counters of one [`GroupAssoc`] since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupAssocStats {
    /// Keys evicted.
    pub evictions: u64,
    /// Evictions that took a key of the request being committed (only without pinning).
    pub self_evictions: u64,
    /// Aging steps (all scores and counters halved).
    pub aging_steps: u64,
    /// Requests that could not be kept whole.
    pub bypasses: u64,
    /// Missing keys the admission filter kept out (seen less often than their victim).
    pub rejected: u64,
    /// Times an adaptive cache changed its rule.
    pub switches: u64,
}

/// Per-set state: the CLOCK hand (a way offset) and the aging epoch the set is at.
#[derive(Clone, Copy, Debug, Default)]
struct SetMeta {
    hand: u8,
    epoch: u8,
}

/// Set-associative group-score policy; see the module docs.
#[derive(Clone, Debug)]
pub struct GroupAssoc {
    cfg: GroupAssocConfig,
    cap: usize,
    nsets: usize,
    /// Key of each slot (stale when the slot is empty).
    keys: Vec<u64>,
    /// Raw group score of each slot (effective = raw >> the set's aging lag).
    score: Vec<u8>,
    /// OCC | PINNED | CURRENT, hit counter in the high nibble (aged like the score).
    state: Vec<u8>,
    sets: Vec<SetMeta>,
    len: usize,
    age_period: Option<u64>,
    ins_since_age: u64,
    age_epoch: u8,
    /// Slots marked by the request in progress.
    marked: Vec<u32>,
    /// Access frequencies for admission (kept by an adaptive cache whatever its rule, so the
    /// filter has a history when it is chosen; empty when no rule admits by frequency). An
    /// adaptive cache counts a key once its set has been full: the filter only ever compares
    /// a key with a victim of its own set, and a cache whose sets never fill pays nothing.
    sketch: Option<Box<FreqSketch>>,
    /// The rule in force.
    rule: Rule,
    /// The shadows that choose the rule; `None` for a fixed rule or a small cache.
    adaptive: Option<Box<Adaptive>>,
    stats: GroupAssocStats,
}

/// What an adaptive [`GroupAssoc`] keeps beside its own state.
#[derive(Clone, Debug)]
struct Adaptive {
    /// One metadata-only cache per [`Rule`] (in [`Rule::ALL`]'s order), fed the keys of the
    /// sampled sets (it spreads them over its own sets).
    shadows: Vec<Shadow>,
    /// Every `sample`-th set of the cache is sampled.
    sample: usize,
    /// The request's keys in sampled sets, gathered for the shadows.
    sub: Vec<u64>,
    /// Sub-requests the shadows ran since their counts last halved.
    requests: u64,
}

/// One rule run on the sampled sets: its misses decide which rule the cache follows.
#[derive(Clone, Debug)]
struct Shadow {
    cache: GroupAssoc,
    /// Sampled sub-requests that were not all hits, decayed.
    misses: f64,
}

/// Keys of a request whose scratch (each key's set and slot) lives on the stack; a larger
/// request allocates it.
const STACK_KEYS: usize = 64;

/// Sets shadowed at most: their keys are what an adaptive cache learns from.
const SHADOW_SETS: usize = 64;

/// Sets an adaptive cache needs (64 × 32 ways: 2,048 entries, 4 sets shadowed); smaller ones
/// keep the group rule.
const MIN_ADAPTIVE_SETS: usize = 64;

/// At most one set in this many is shadowed: three shadows of 1/16 of the sets cost ~2 B an
/// entry (1/4 cost ~8 B: a third more entries at equal bytes with 4-bit rows, which the
/// choosing did not win back).
const MIN_SAMPLE: usize = 8;

/// Keys of one request the shadows see at most (`2·S`, at least 64: a request's sampled
/// keys, bags included as a rule), so their buffers are allocated once and counted in the
/// metadata from the start.
fn shadow_keys(cfg: &GroupAssocConfig) -> usize {
    (2 * usize::from(cfg.max_score)).max(64)
}

impl GroupAssoc {
    /// An empty cache for `capacity` keys. Errors: capacity out of range, bad parameters.
    pub fn new(capacity: usize, config: GroupAssocConfig) -> Result<Self> {
        check_capacity(capacity)?;
        config.validate()?;
        let nsets = (capacity / config.ways).max(1);
        let rule = config.rule.unwrap_or(Rule::Group);
        // Every 16th set at most (at most SHADOW_SETS of them), so that the shadows' work and
        // bytes stay a small fraction of the cache's own. A cache of fewer than
        // MIN_ADAPTIVE_SETS sets keeps the group rule: its shadows would cost more of a small
        // byte budget than choosing can win back.
        let sample = nsets.div_ceil(SHADOW_SETS).max(MIN_SAMPLE).min(nsets);
        let adaptive = config.rule.is_none() && nsets >= MIN_ADAPTIVE_SETS;
        let adaptive = if adaptive {
            let sets = nsets.div_ceil(sample);
            let cap = (sets as u64 * capacity as u64 / nsets as u64).max(1) as usize;
            let shadows = Rule::ALL
                .iter()
                .map(|&r| {
                    let cfg = GroupAssocConfig { rule: Some(r), ..config.clone() };
                    let mut c = GroupAssoc::new(cap, cfg)?;
                    c.marked.reserve(shadow_keys(&config));
                    Ok(Shadow { cache: c, misses: 0.0 })
                })
                .collect::<Result<Vec<_>>>()?;
            let sub = Vec::with_capacity(shadow_keys(&config));
            Some(Box::new(Adaptive { shadows, sample, sub, requests: 0 }))
        } else {
            None
        };
        let sketch_on = adaptive.is_some() || config.rule == Some(Rule::GroupAdmit);
        Ok(Self {
            age_period: age_period(config.age_alpha, capacity),
            cap: capacity,
            nsets,
            keys: vec![0; capacity],
            score: vec![0; capacity],
            state: vec![0; capacity],
            sets: vec![SetMeta::default(); nsets],
            len: 0,
            ins_since_age: 0,
            age_epoch: 0,
            marked: Vec::new(),
            sketch: sketch_on.then(|| {
                let from_start = config.rule == Some(Rule::GroupAdmit);
                Box::new(FreqSketch::new(capacity, nsets, from_start))
            }),
            rule,
            adaptive,
            cfg: config,
            stats: GroupAssocStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GroupAssocConfig {
        &self.cfg
    }

    /// Counters since construction.
    pub fn stats(&self) -> GroupAssocStats {
        self.stats
    }

    /// The replacement rule in force (an adaptive cache's current choice).
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// Number of sets.
    pub fn sets(&self) -> usize {
        self.nsets
    }

    /// The set `key` maps to (a fixed hash of the key).
    #[inline]
    pub fn set_of(&self, key: u64) -> usize {
        ((u128::from(fmix64(key)) * self.nsets as u128) >> 64) as usize
    }

    /// The slots of set `s`: `start..end`.
    #[inline]
    pub fn set_slots(&self, s: usize) -> std::ops::Range<usize> {
        let (c, n) = (self.cap as u64, self.nsets as u64);
        (s as u64 * c / n) as usize..((s as u64 + 1) * c / n) as usize
    }

    /// Aging steps set `s` has not applied yet.
    #[inline]
    fn lag(&self, s: usize) -> u32 {
        u32::from(self.age_epoch.wrapping_sub(self.sets[s].epoch))
    }

    /// The effective score of `key`, if resident.
    pub fn score(&self, key: u64) -> Option<u8> {
        let i = self.find(key)?;
        Some(shr(self.score[i as usize], self.lag(self.set_of(key))))
    }

    /// The effective hit counter of `key`, if resident.
    pub fn hits(&self, key: u64) -> Option<u8> {
        let i = self.find(key)?;
        Some(shr(self.state[i as usize] >> HITS_SHIFT, self.lag(self.set_of(key))))
    }

    #[inline]
    fn find(&self, key: u64) -> Option<u32> {
        self.find_in(self.set_of(key), key)
    }

    /// Whether slot `i` holds `key`.
    #[inline]
    fn holds(&self, i: u32, key: u64) -> bool {
        i != NO_SLOT && self.keys[i as usize] == key && self.state[i as usize] & OCC != 0
    }

    /// The slot of `key` in set `s` (its set), if resident.
    #[inline]
    fn find_in(&self, s: usize, key: u64) -> Option<u32> {
        let r = self.set_slots(s);
        let start = r.start;
        self.keys[r]
            .iter()
            .zip(&self.state[start..])
            .position(|(&k, &st)| k == key && st & OCC != 0)
            .map(|j| (start + j) as u32)
    }

    #[inline]
    fn mark(&mut self, i: u32, f: u8) {
        self.state[i as usize] |= f;
        self.marked.push(i);
    }

    /// Applies set `s`'s pending aging steps to its ways.
    fn sync_set(&mut self, s: usize) {
        let d = self.lag(s);
        if d == 0 {
            return;
        }
        for i in self.set_slots(s) {
            self.score[i] = shr(self.score[i], d);
            let st = self.state[i];
            self.state[i] = (st & 0x0f) | (shr(st >> HITS_SHIFT, d) << HITS_SHIFT);
        }
        self.sets[s].epoch = self.age_epoch;
    }

    /// One aging step when `α·C` admissions have passed since the last.
    fn age_if_due(&mut self) {
        let Some(p) = self.age_period else { return };
        if self.ins_since_age < p {
            return;
        }
        self.ins_since_age = 0;
        self.age_epoch = self.age_epoch.wrapping_add(1);
        self.stats.aging_steps += 1;
        if self.age_epoch >= EPOCH_REBASE {
            for s in 0..self.nsets {
                self.sync_set(s);
            }
            self.age_epoch = 0;
            for m in &mut self.sets {
                m.epoch = 0;
            }
        }
    }

    /// The way a new key of set `s` takes: an empty one, else the unpinned way of least
    /// priority, scanning from the hand (first of equals wins); moves the hand past it.
    /// `None` when every way is pinned. The set must be synced.
    fn victim(&mut self, s: usize) -> Option<usize> {
        if self.rule == Rule::Clock {
            return self.clock_victim(s);
        }
        let r = self.set_slots(s);
        let (a, n) = (r.start, r.len());
        let h = usize::from(self.sets[s].hand) % n;
        let mut best: Option<(u16, usize)> = None;
        for j in 0..n {
            let i = a + (h + j) % n;
            let st = self.state[i];
            if st & OCC == 0 {
                best = Some((0, i));
                break;
            }
            if st & PINNED != 0 {
                continue;
            }
            let p = self.priority(self.score[i], st >> HITS_SHIFT);
            if best.is_none_or(|(bp, _)| p < bp) {
                best = Some((p, i));
            }
        }
        let (_, v) = best?;
        self.sets[s].hand = ((v - a + 1) % n) as u8;
        Some(v)
    }

    /// CLOCK within set `s`: an empty way, else the first unpinned way after the hand without
    /// its reference bit, clearing the bits it passes (a second sweep finds one unless every
    /// way is pinned); moves the hand past it.
    fn clock_victim(&mut self, s: usize) -> Option<usize> {
        let r = self.set_slots(s);
        let (a, n) = (r.start, r.len());
        let h = usize::from(self.sets[s].hand) % n;
        if let Some(j) = (0..n).find(|&j| self.state[a + (h + j) % n] & OCC == 0) {
            let v = a + (h + j) % n;
            self.sets[s].hand = ((v - a + 1) % n) as u8;
            return Some(v);
        }
        for j in 0..2 * n {
            let i = a + (h + j) % n;
            let st = self.state[i];
            if st & PINNED != 0 {
                continue;
            }
            if st & REF != 0 {
                self.state[i] = st & !REF;
                continue;
            }
            self.sets[s].hand = ((i - a + 1) % n) as u8;
            return Some(i);
        }
        None
    }

    /// Eviction priority of a way with score `score` and hit counter `hits` (least goes
    /// first): `score/S + ½·hits/15`, scaled by `30·S` to integers; `score` alone without
    /// `count_hits`. Normalising by `S` keeps the weight of frequency the same whatever the
    /// number of tables.
    #[inline]
    fn priority(&self, score: u8, hits: u8) -> u16 {
        if self.cfg.count_hits {
            30 * u16::from(score) + u16::from(self.cfg.max_score) * u16::from(hits)
        } else {
            u16::from(score)
        }
    }

    /// Empties slot `v`, reporting the eviction.
    fn evict(&mut self, v: usize, out: &mut RequestOutcome) {
        let current = self.state[v] & CURRENT != 0;
        out.evicted.push(self.keys[v]);
        out.evicted_slots.push(v as u32);
        out.self_evicted += usize::from(current);
        self.stats.self_evictions += u64::from(current);
        self.stats.evictions += 1;
        self.state[v] = 0;
        self.len -= 1;
    }

    /// Admits `key` (not resident) into its set with score `s`; marks it `mark`. The slot it
    /// took (`None`: every way of its set is pinned, or the filter kept it out).
    fn admit_key(
        &mut self,
        key: u64,
        set: usize,
        s: u8,
        mark: u8,
        filter: bool,
        out: &mut RequestOutcome,
    ) -> Option<usize> {
        self.sync_set(set);
        let v = self.victim(set)?;
        if self.state[v] & OCC != 0 {
            if let Some(f) = self.sketch.as_deref_mut() {
                f.set_filled(set);
            }
            let kept_out = |f: &FreqSketch| f.estimate(key) <= f.estimate(self.keys[v]);
            if filter
                && self.rule == Rule::GroupAdmit
                && self.sketch.as_deref().is_some_and(kept_out)
            {
                self.stats.rejected += 1;
                return None;
            }
            self.evict(v, out);
        }
        self.keys[v] = key;
        self.score[v] = s;
        self.state[v] = OCC;
        self.len += 1;
        if mark != 0 {
            self.mark(v as u32, mark);
        }
        out.admitted += 1;
        self.ins_since_age += 1;
        Some(v)
    }

    /// Adaptive: runs the request's keys that fall in sampled sets through every shadow (the
    /// rest of the request counts as hits elsewhere, as the real cache saw them), counts each
    /// shadow's imperfect sub-requests, and follows the rule with the fewest. The counts halve
    /// every `8·C'` sub-requests (`C'`: a shadow's capacity) so they follow the recent trace.
    fn run_shadows(&mut self, keys: &[u64], sets: &[u32], group: Group) {
        let Some(mut a) = self.adaptive.take() else { return };
        a.sub.clear();
        let most = shadow_keys(&self.cfg);
        for (&k, &s) in keys.iter().zip(sets) {
            if a.sub.len() == most {
                break; // a huge request: its first keys are sample enough
            }
            if (s as usize).is_multiple_of(a.sample) {
                a.sub.push(k);
            }
        }
        if !a.sub.is_empty() {
            let size = group.size.max(keys.len());
            let other = Group { other_hits: size - a.sub.len(), size };
            let mut out = RequestOutcome::default();
            for sh in &mut a.shadows {
                sh.cache.access_group_into(&a.sub, other, &mut out);
                if !out.is_perfect() {
                    sh.misses += 1.0;
                }
            }
            a.requests += 1;
            if a.requests >= 8 * a.shadows[0].cache.cap as u64 {
                a.requests = 0;
                for sh in &mut a.shadows {
                    sh.misses *= 0.5;
                }
            }
            let cur = Rule::ALL.iter().position(|&r| r == self.rule).unwrap_or(0);
            let (best, m) = a
                .shadows
                .iter()
                .map(|sh| sh.misses)
                .enumerate()
                .fold((cur, a.shadows[cur].misses), |x, y| if y.1 < x.1 { y } else { x });
            // A small margin so that near-ties do not flap.
            if best != cur && m + 2.0 < 0.97 * a.shadows[cur].misses {
                self.rule = Rule::ALL[best];
                self.stats.switches += 1;
            }
        }
        self.adaptive = Some(a);
    }

    /// Checks the structural invariants: `len` matches the occupied ways, every key sits in
    /// its own set at most once, no marks survive a request, hands and epochs in range,
    /// effective scores ≤ S. O(C); for tests.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut n = 0;
        for s in 0..self.nsets {
            let r = self.set_slots(s);
            let sized = if self.nsets == 1 {
                r.len() == self.cap
            } else {
                (self.cfg.ways..2 * self.cfg.ways).contains(&r.len())
            };
            if !sized {
                return Err(format!("set {s} has {} ways", r.len()));
            }
            if usize::from(self.sets[s].hand) >= r.len() {
                return Err(format!("set {s}: hand {} out of range", self.sets[s].hand));
            }
            if self.lag(s) >= 256 - u32::from(EPOCH_REBASE) {
                return Err(format!("set {s}: epoch lag {} too large", self.lag(s)));
            }
            for i in r.clone() {
                let st = self.state[i];
                if st & OCC == 0 {
                    continue;
                }
                n += 1;
                if st & (PINNED | CURRENT) != 0 {
                    return Err(format!("slot {i} still marked after the request"));
                }
                let k = self.keys[i];
                if self.set_of(k) != s {
                    return Err(format!("key {k} in set {s}, hashes to {}", self.set_of(k)));
                }
                if self.find(k) != Some(i as u32) {
                    return Err(format!("key {k} stored twice in set {s}"));
                }
                if shr(self.score[i], self.lag(s)) > self.cfg.max_score {
                    return Err(format!("slot {i}: score above S"));
                }
            }
        }
        if n != self.len {
            return Err(format!("{n} occupied slots, len is {}", self.len));
        }
        if self.len > self.cap {
            return Err(format!("len {} > capacity {}", self.len, self.cap));
        }
        Ok(())
    }
}

/// `x >> d`, 0 for `d ≥ 8`.
#[inline]
fn shr(x: u8, d: u32) -> u8 {
    x.checked_shr(d).unwrap_or(0)
}

impl Policy for GroupAssoc {
    fn name(&self) -> &'static str {
        "group-assoc"
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, key: u64) -> bool {
        self.find(key).is_some()
    }

    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        self.access_group_into(keys, Group { other_hits: 0, size: keys.len() }, out)
    }

    fn access_group_into(&mut self, keys: &[u64], group: Group, out: &mut RequestOutcome) {
        out.reset(keys.len());
        if keys.is_empty() {
            return;
        }
        let mark = if self.cfg.pin_request { PINNED | CURRENT } else { CURRENT };
        // The request's scratch: each key's set, then the slot the probe found it in
        // (NO_SLOT when missing), so the commit checks a slot instead of scanning the set.
        let mut stack = [NO_SLOT; 2 * STACK_KEYS];
        let mut heap = Vec::new();
        let req: &mut [u32] = match keys.len() <= STACK_KEYS {
            true => &mut stack[..2 * keys.len()],
            false => {
                heap.resize(2 * keys.len(), NO_SLOT);
                &mut heap
            }
        };
        let (sets, slots) = req.split_at_mut(keys.len());
        for (s, &k) in sets.iter_mut().zip(keys) {
            *s = self.set_of(k) as u32;
        }
        if let Some(f) = self.sketch.as_deref_mut() {
            for (&k, &s) in keys.iter().zip(sets.iter()) {
                if f.counts(s as usize) {
                    f.add(k);
                }
            }
        }
        self.run_shadows(keys, sets, group);
        // Probe: pure apart from the marks, which are cleared below.
        for (j, (&k, &s)) in keys.iter().zip(sets.iter()).enumerate() {
            let f = self.find_in(s as usize, k);
            out.hit.push(f.is_some());
            slots[j] = f.unwrap_or(NO_SLOT);
            if let Some(i) = f {
                self.mark(i, mark);
            }
        }
        out.hits = out.hit.iter().filter(|&&h| h).count();
        let size = group.size.max(keys.len());
        let h = (out.hits + group.other_hits).min(size);
        let s = score_of(h, size, self.cfg.max_score);
        // Commit, in the order given (a repeated key counts as a hit). A key the probe found
        // is still in its slot unless an earlier admission took the slot (only without
        // pinning); a missing key may have come in with an earlier copy of itself.
        for (j, &k) in keys.iter().enumerate() {
            let (set, slot) = (sets[j] as usize, slots[j]);
            let found = if self.holds(slot, k) { Some(slot) } else { self.find_in(set, k) };
            if let Some(i) = found {
                slots[j] = i;
                self.sync_set(set);
                let i = i as usize;
                self.score[i] = self.score[i].max(s);
                let hits = self.state[i] >> HITS_SHIFT;
                if hits < HITS_MAX {
                    self.state[i] += 1 << HITS_SHIFT;
                }
                self.state[i] |= REF;
                continue;
            }
            match self.admit_key(k, set, s, mark, true, out) {
                Some(v) => slots[j] = v as u32,
                // Every way of its set pinned, or kept out by the filter: served uncached.
                None => {
                    slots[j] = NO_SLOT;
                    out.bypassed = true;
                }
            }
        }
        // The slots after the commit. A later admission may have taken an earlier key's slot
        // (only without pinning), and a later copy of a key the commit left out may have
        // come in: those are looked up again.
        for (j, &k) in keys.iter().enumerate() {
            let i = slots[j];
            let now = if self.holds(i, k) { Some(i) } else { self.find_in(sets[j] as usize, k) };
            out.slots.push(now.unwrap_or(NO_SLOT));
        }
        for i in std::mem::take(&mut self.marked) {
            self.state[i as usize] &= !(PINNED | CURRENT);
        }
        self.age_if_due();
        out.bypassed = out.bypassed || overflowed(self, keys);
        self.stats.bypasses += u64::from(out.bypassed);
    }

    fn admit(&mut self, key: u64, score: u8, out: &mut RequestOutcome) {
        out.reset(0);
        if self.find(key).is_some() {
            return;
        }
        let set = self.set_of(key);
        if self.admit_key(key, set, score.min(self.cfg.max_score), 0, false, out).is_none() {
            out.bypassed = true;
        }
        self.age_if_due();
    }

    fn slot_of(&self, key: u64) -> Option<u32> {
        self.find(key)
    }

    fn has_slots(&self) -> bool {
        true
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.keys.capacity() * std::mem::size_of::<u64>()
            + self.score.capacity()
            + self.state.capacity()
            + self.sets.capacity() * std::mem::size_of::<SetMeta>()
            + self.marked.capacity() * std::mem::size_of::<u32>()
            + self.sketch.as_ref().map_or(0, |f| std::mem::size_of::<FreqSketch>() + f.bytes())
            + self.adaptive.as_ref().map_or(0, |a| {
                std::mem::size_of::<Adaptive>()
                    + a.sub.capacity() * 8
                    + a.shadows.iter().map(|s| s.cache.metadata_bytes()).sum::<usize>()
            })
    }
}

#[cfg(test)]
mod tests;
