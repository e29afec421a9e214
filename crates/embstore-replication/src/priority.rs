//! SLO-aware priority of updates (Ekko §5.2): which row writes are *significant*, so that a
//! congested link carries them ahead of the rest.
//!
//! Each row update gets a priority `p` when it is written; the writes at or above `p_k`, the
//! `k`-th percentile of the priorities over a sliding window, are significant (their row takes
//! `sigv = v`, [`crate::steps::note_significant`]). The default rule is the paper's
//! ([`EkkoPriority`]): `p = (p_g + p_u) · p_m`, where
//!
//! - `p_g = |g|₁ / ḡ`: the gradient's 1-norm over its running mean (models with different
//!   gradient scales compare);
//! - `p_u = f / f̄` with `f = 1 / (1 + age / τ_u)` (1 for a row created by this write): new rows
//!   first, normalised like `p_g` so the two add. embstore's tables keep the creation time of
//!   the rows they created in the last ten minutes and give any other row's age as ten minutes
//!   (`f` ≤ 1/11: the row metadata's 16 bytes hold no creation time); a store that tells no
//!   age at all (`age_ms: None`) gets the row's write count instead, `f = 1 / (1 + writes /
//!   n_u)`: a row's first writes are its freshest;
//! - `p_m`: the model's share of inference requests (`1 / M` until known).
//!
//! Any other rule is a [`PriorityFn`]. The running means decay with a half-life (10 s by
//! default); `p_k` comes from a ring of DDSketches (`sketches-ddsketch`, relative accuracy α)
//! over `slots` slots of `window / slots` each, refreshed every `refresh_ms` of the caller's
//! time (and every 1,024 updates over the first 100,000). Nothing here reads a clock: callers
//! pass `now_ms`.
//!
//! [`Congestion`] is the link side: a link whose replies arrive later than the time-out (1 s)
//! three times in a row is congested (prioritised pulls run beside the normal ones) until its
//! lag has stayed under half the time-out for 30 s.

use embstore_common::{Error, ErrorKind, Result};
use sketches_ddsketch::{Config, DDSketch};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// What the priority of one row update is computed from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Update {
    /// The row's key.
    pub key: u64,
    /// The update's 1-norm: the gradient's (or, for an assignment, the change's).
    pub grad_l1: f64,
    /// How long ago the row was created, in ms, where the store knows it (`None`: it does not,
    /// or this write creates the row).
    pub age_ms: Option<u64>,
    /// The row's writes before this one (0: this write creates it).
    pub writes: u64,
    /// The model (a group of tables) the row belongs to.
    pub model: u32,
}

/// The running statistics a priority rule normalises by, as of the update being scored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Running mean of the updates' 1-norms (`ḡ`, 0 before any update).
    pub g_mean: f64,
    /// Running mean of the updates' freshness `f` (`f̄`).
    pub f_mean: f64,
    /// The update's model's share of inference requests (`p_m`).
    pub p_m: f64,
    /// The freshness `f` of the update being scored: 1 for a row's first write, then
    /// `1 / (1 + age / τ_u)` where the row's age is known, else `1 / (1 + writes / n_u)`.
    pub freshness: f64,
}

/// A priority rule: the larger, the sooner the update should reach the replicas. A user's
/// rule implements this (and `Debug`, for the store's `describe`); it is called on every row
/// write, so it must be cheap and must not block.
pub trait PriorityFn: Send + Sync + fmt::Debug {
    /// The priority of update `u` (finite and ≥ 0; anything else counts as 0).
    fn priority(&self, u: &Update, stats: &Stats) -> f64;

    /// The priorities of a batch of updates (`stats[i]` for `updates[i]`), into `out` (cleared
    /// first): one call per write step, for a rule that pays per call (a Python callable).
    /// By default, [`PriorityFn::priority`] of each.
    fn priorities(&self, updates: &[Update], stats: &[Stats], out: &mut Vec<f64>) {
        out.clear();
        out.extend(updates.iter().zip(stats).map(|(u, s)| self.priority(u, s)));
    }
}

/// The paper's rule, `p = (p_g + p_u) · p_m` (Ekko §5.2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EkkoPriority;

impl PriorityFn for EkkoPriority {
    fn priority(&self, u: &Update, s: &Stats) -> f64 {
        let p_g = if s.g_mean > 0.0 { u.grad_l1 / s.g_mean } else { 1.0 };
        let p_u = if s.f_mean > 0.0 { s.freshness / s.f_mean } else { 1.0 };
        (p_g + p_u) * s.p_m
    }
}

/// How the priorities are thresholded; [`PriorityConfig::default`] is the spec's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityConfig {
    /// The percentile `k` (0 < k < 100): updates at or above the `k`-th are significant
    /// (99: the top 1 %).
    pub k: f64,
    /// The window `p_k` is taken over, in ms (60 s).
    pub window_ms: u64,
    /// Slots in the window's ring (6: 10 s each).
    pub slots: usize,
    /// Half-life of the running means `ḡ` and `f̄`, in ms (10 s).
    pub half_life_ms: u64,
    /// `τ_u` of the freshness `f = 1 / (1 + age / τ_u)`, in ms (60 s).
    pub tau_u_ms: u64,
    /// `n_u` of the freshness `f = 1 / (1 + writes / n_u)` of a row whose age the store does
    /// not know (8: a row's first few writes count as fresh).
    pub fresh_writes: u64,
    /// `p_k` is recomputed this often, in ms of the caller's time (1 s; over the first
    /// 100,000 updates also after every 1,024).
    pub refresh_ms: u64,
    /// The sketch's relative accuracy α (0.01: `p_k` within ±1 %).
    pub alpha: f64,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            k: 99.0,
            window_ms: 60_000,
            slots: 6,
            half_life_ms: 10_000,
            tau_u_ms: 60_000,
            fresh_writes: 8,
            refresh_ms: 1_000,
            alpha: 0.01,
        }
    }
}

impl PriorityConfig {
    /// The spec's configuration with percentile `k`.
    pub fn with_k(k: f64) -> Self {
        Self { k, ..Self::default() }
    }

    /// Refuses a configuration that cannot work, saying which field and why.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, what));
        if !(self.k > 0.0 && self.k < 100.0) {
            return bad(format!("priority percentile k must be in (0, 100), got {}", self.k));
        }
        if self.slots == 0 || self.window_ms < self.slots as u64 {
            return bad(format!(
                "priority window must hold its {} slots (window {} ms)",
                self.slots, self.window_ms
            ));
        }
        if self.half_life_ms == 0 || self.tau_u_ms == 0 || self.fresh_writes == 0 {
            return bad("priority half-life, τ_u and n_u must be positive".into());
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return bad(format!("sketch accuracy alpha must be in (0, 1), got {}", self.alpha));
        }
        Ok(())
    }
}

/// What [`Prioritiser::score`] decided for one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    /// The update's priority.
    pub p: f64,
    /// Whether it is at or above `p_k` (significant).
    pub significant: bool,
}

/// An exponentially decayed mean: each sample weighs `0.5^(age / half_life)`.
#[derive(Clone, Copy, Debug, Default)]
struct Decayed {
    sum: f64,
    weight: f64,
    at_ms: u64,
}

impl Decayed {
    fn add(&mut self, x: f64, now_ms: u64, half_life_ms: u64) {
        if now_ms > self.at_ms {
            let d = 0.5f64.powf((now_ms - self.at_ms) as f64 / half_life_ms as f64);
            self.sum *= d;
            self.weight *= d;
            self.at_ms = now_ms;
        }
        self.sum += x;
        self.weight += 1.0;
    }

    fn mean(&self) -> f64 {
        if self.weight > 0.0 {
            self.sum / self.weight
        } else {
            0.0
        }
    }
}

/// Scores updates and keeps `p_k` over a sliding window: one per server (all models share
/// the threshold, so `p_m` matters). Pure: time is the caller's `now_ms`.
pub struct Prioritiser {
    cfg: PriorityConfig,
    rule: Arc<dyn PriorityFn>,
    sketch_cfg: Config,
    /// `ring[i]` holds the priorities of slot `slot_start[i]`.
    ring: Vec<DDSketch>,
    slot_start: Vec<u64>,
    g: Decayed,
    f: Decayed,
    shares: HashMap<u32, f64>,
    p_k: Option<f64>,
    refreshed_ms: u64,
    since_refresh: u32,
    scored: u64,
    significant: u64,
    /// Priorities each slot's sketch took (each standing for `stride` updates).
    slot_adds: Vec<usize>,
    /// One update in `stride` goes into the sketch, counted `stride` times: chosen at each
    /// refresh from the rate of updates, so that the sketch takes about [`SKETCH_RATE`] a
    /// second however fast the writer goes.
    stride: u64,
    phase: u64,
}

impl fmt::Debug for Prioritiser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prioritiser")
            .field("cfg", &self.cfg)
            .field("rule", &self.rule)
            .field("p_k", &self.p_k)
            .field("scored", &self.scored)
            .field("significant", &self.significant)
            .finish()
    }
}

/// Sketches hold positive values; a priority of 0 is stored as this.
const MIN_P: f64 = 1e-9;
/// While fewer than [`WARM_UPDATES`] updates were scored, `p_k` is recomputed after this many
/// even within `refresh_ms`.
const REFRESH_EVERY: u32 = 1024;
const WARM_UPDATES: u64 = 100_000;
/// Priorities the threshold is taken over at least (from the newest slots back): 100 of
/// them above the 99th percentile.
const ENOUGH: usize = 10_000;
/// Priorities a second the sketch takes at most (about): a faster writer's updates go in as an
/// even sample (a logarithm per add was half of what scoring cost the trainer); the threshold
/// is still taken over [`ENOUGH`] of them, a few seconds of a fast writer's updates.
const SKETCH_RATE: u64 = 4_000;
/// The sparsest sample.
const MAX_STRIDE: u64 = 64;

impl Prioritiser {
    /// A prioritiser with `rule` (the paper's: [`EkkoPriority`]) under `cfg` (checked).
    pub fn new(cfg: PriorityConfig, rule: Arc<dyn PriorityFn>) -> Result<Self> {
        cfg.check()?;
        let sketch_cfg = Config::new(cfg.alpha, 2048, MIN_P);
        Ok(Self {
            ring: (0..cfg.slots).map(|_| DDSketch::new(sketch_cfg)).collect(),
            slot_start: vec![u64::MAX; cfg.slots],
            cfg,
            rule,
            sketch_cfg,
            g: Decayed::default(),
            f: Decayed::default(),
            shares: HashMap::new(),
            p_k: None,
            refreshed_ms: 0,
            since_refresh: 0,
            scored: 0,
            significant: 0,
            slot_adds: vec![0; cfg.slots],
            stride: 1,
            phase: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PriorityConfig {
        &self.cfg
    }

    /// Sets each model's share of inference requests (`p_m`; they need not sum to 1: they are
    /// normalised). A model not listed gets `1 / M` of the listed count + 1.
    pub fn set_model_shares(&mut self, counts: &HashMap<u32, f64>) {
        let total: f64 = counts.values().filter(|c| c.is_finite() && **c > 0.0).sum();
        self.shares = counts
            .iter()
            .filter(|(_, c)| c.is_finite() && **c > 0.0)
            .map(|(m, c)| (*m, c / total))
            .collect();
    }

    fn p_m(&self, model: u32) -> f64 {
        match self.shares.get(&model) {
            Some(s) => *s,
            None => 1.0 / (self.shares.len() + 1) as f64,
        }
    }

    /// The current threshold `p_k` (None before the first update).
    pub fn p_k(&self) -> Option<f64> {
        self.p_k
    }

    /// Updates scored and how many of them were significant.
    pub fn counts(&self) -> (u64, u64) {
        (self.scored, self.significant)
    }

    fn slot_len(&self) -> u64 {
        self.cfg.window_ms / self.cfg.slots as u64
    }

    /// The sketch of `now_ms`'s slot, emptied first when it still holds an older slot.
    /// The ring index of the slot of `now_ms` (emptied when it held an older slot).
    fn slot(&mut self, now_ms: u64) -> usize {
        let len = self.slot_len();
        let start = now_ms / len * len;
        let i = ((now_ms / len) % self.cfg.slots as u64) as usize;
        if self.slot_start[i] != start {
            self.ring[i] = DDSketch::new(self.sketch_cfg);
            self.slot_start[i] = start;
            self.slot_adds[i] = 0;
        }
        i
    }

    /// Recomputes `p_k` over the slots inside the window ending at `now_ms`.
    fn refresh(&mut self, now_ms: u64) {
        let len = self.slot_len();
        let oldest = (now_ms / len).saturating_sub(self.cfg.slots as u64 - 1) * len;
        // The newest slots first, as many as hold enough priorities for the percentile's tail
        // (at least `ENOUGH`), up to the whole window: a busy writer's threshold follows its
        // priorities within seconds (they drift as rows age and gradients shrink), a quiet
        // one's is taken over the window.
        let mut order: Vec<usize> = (0..self.ring.len())
            .filter(|&i| {
                let start = self.slot_start[i];
                start != u64::MAX && start >= oldest && start <= now_ms
            })
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.slot_start[i]));
        let mut all = DDSketch::new(self.sketch_cfg);
        let mut adds = 0;
        for i in order {
            // Same configuration on both sides: merging cannot fail.
            let _ = all.merge(&self.ring[i]);
            adds += self.slot_adds[i];
            if adds >= ENOUGH {
                break;
            }
        }
        if let Ok(Some(q)) = all.quantile(self.cfg.k / 100.0) {
            self.p_k = Some(q);
        }
        // The rate since the last refresh sets how sparse the sample goes on.
        let elapsed = now_ms.saturating_sub(self.refreshed_ms).max(1);
        if self.refreshed_ms > 0 && elapsed >= 100 {
            let per_s = u64::from(self.since_refresh) * 1000 / elapsed;
            self.stride = (per_s / SKETCH_RATE).clamp(1, MAX_STRIDE);
        }
        self.refreshed_ms = now_ms;
        self.since_refresh = 0;
    }

    /// What scoring needs, as of now, for updates of `model`: a writer takes one per batch
    /// (under no lock of its own) and scores each row with [`Snapshot::score`]; the samples go
    /// back through [`Prioritiser::record`] after the batch, off the write path.
    pub fn snapshot(&self, model: u32) -> Snapshot {
        Snapshot {
            p_k: self.p_k,
            g_mean: self.g.mean(),
            f_mean: self.f.mean(),
            p_m: self.p_m(model),
            cfg: self.cfg,
            rule: Arc::clone(&self.rule),
        }
    }

    /// Takes a batch's samples (scored at `now_ms`) into the running means and the window's
    /// sketch, and recomputes `p_k` when it is due.
    pub fn record(&mut self, samples: &[Sample], now_ms: u64) {
        let half_life_ms = self.cfg.half_life_ms;
        for x in samples {
            self.g.add(x.l1, now_ms, half_life_ms);
            self.f.add(x.freshness, now_ms, half_life_ms);
            self.significant += x.significant as u64;
        }
        // One slot for the whole batch (finding it divides: per sample it cost as much as the
        // rest of the scoring); one update in `stride` goes in, standing for `stride`.
        let i = self.slot(now_ms);
        let (stride, mut phase, mut adds) = (self.stride, self.phase, 0);
        for x in samples {
            phase += 1;
            if phase >= stride {
                self.ring[i].add_with_count(x.p.max(MIN_P), stride);
                adds += 1;
                phase = 0;
            }
        }
        self.phase = phase;
        self.slot_adds[i] += adds;
        self.scored += samples.len() as u64;
        self.since_refresh = self.since_refresh.saturating_add(samples.len() as u32);
        // Every `refresh_ms`; while the first updates come in (a threshold from few of them
        // moves fast), every 1,024 as well.
        let warming = self.scored < WARM_UPDATES && self.since_refresh >= REFRESH_EVERY;
        if !samples.is_empty()
            && (self.p_k.is_none()
                || now_ms >= self.refreshed_ms.saturating_add(self.cfg.refresh_ms)
                || warming)
        {
            self.refresh(now_ms);
        }
    }

    /// Scores one update written at `now_ms` and records it ([`Prioritiser::snapshot`],
    /// [`Snapshot::score`], [`Prioritiser::record`] in one).
    pub fn score(&mut self, u: &Update, now_ms: u64) -> Scored {
        let (scored, sample) = self.snapshot(u.model).score(u);
        self.record(&[sample], now_ms);
        scored
    }
}

/// One scored update, for [`Prioritiser::record`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Its priority.
    pub p: f64,
    /// Its 1-norm (for `ḡ`).
    pub l1: f64,
    /// Its freshness (for `f̄`).
    pub freshness: f64,
    /// Whether it was significant.
    pub significant: bool,
}

/// The threshold and running statistics of a [`Prioritiser`] at one moment, with its rule:
/// scoring is a few flops and no lock.
#[derive(Clone)]
pub struct Snapshot {
    p_k: Option<f64>,
    g_mean: f64,
    f_mean: f64,
    p_m: f64,
    cfg: PriorityConfig,
    rule: Arc<dyn PriorityFn>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot").field("p_k", &self.p_k).field("p_m", &self.p_m).finish()
    }
}

impl Snapshot {
    /// The threshold `p_k` of the moment (None before any update).
    pub fn p_k(&self) -> Option<f64> {
        self.p_k
    }

    /// The freshness of update `u`: 1 for a row's first write, `1 / (1 + age / τ_u)` where its
    /// age is known, else `1 / (1 + writes / n_u)`.
    pub fn freshness(&self, u: &Update) -> f64 {
        if u.writes == 0 {
            return 1.0;
        }
        match u.age_ms {
            Some(age) => 1.0 / (1.0 + age as f64 / self.cfg.tau_u_ms as f64),
            None => 1.0 / (1.0 + u.writes as f64 / self.cfg.fresh_writes as f64),
        }
    }

    /// Update `u`'s priority and whether it is significant (`p ≥ p_k`, within the sketch's
    /// accuracy: the sketch names a bucket's value, so equal priorities at the threshold, as a
    /// rule with ties gives, are all significant), and its sample for the record.
    pub fn score(&self, u: &Update) -> (Scored, Sample) {
        let stats = self.stats(u);
        let p = self.rule.priority(u, &stats);
        self.judge(u, &stats, p)
    }

    /// [`Snapshot::score`] of a batch, with one call of the rule
    /// ([`PriorityFn::priorities`]); into `out` (cleared first).
    pub fn score_batch(&self, updates: &[Update], out: &mut Vec<(Scored, Sample)>) {
        let stats: Vec<Stats> = updates.iter().map(|u| self.stats(u)).collect();
        let mut ps = Vec::with_capacity(updates.len());
        self.rule.priorities(updates, &stats, &mut ps);
        out.clear();
        out.extend(updates.iter().zip(&stats).enumerate().map(|(i, (u, s))| {
            // A rule that returns too few priorities scores the rest 0.
            self.judge(u, s, ps.get(i).copied().unwrap_or(0.0))
        }));
    }

    fn stats(&self, u: &Update) -> Stats {
        let freshness = self.freshness(u);
        Stats { g_mean: self.g_mean, f_mean: self.f_mean, p_m: self.p_m, freshness }
    }

    fn judge(&self, u: &Update, stats: &Stats, p: f64) -> (Scored, Sample) {
        let l1 = if u.grad_l1.is_finite() { u.grad_l1.max(0.0) } else { 0.0 };
        let p = if p.is_finite() && p > 0.0 { p } else { 0.0 };
        let significant = self.p_k.is_some_and(|k| p >= k * (1.0 - self.cfg.alpha) && p > 0.0);
        (Scored { p, significant }, Sample { p, l1, freshness: stats.freshness, significant })
    }
}

/// When a link counts as congested (Ekko's "update time-outs", spec §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CongestionConfig {
    /// The time-out `T_to`, in ms (1 s): a lag above it is always late; below it, a lag
    /// three times the link's usual one is late (at least 200 ms): a link's lag under a cut is
    /// bounded by coalescing, so a fixed time-out far above it (the paper's 5 s, twice its
    /// 2.6-s target) would never see the cut.
    pub timeout_ms: u64,
    /// Consecutive late rounds that make a link congested (3).
    pub late_rounds: u32,
    /// How long the lag must stay under `T_to / 2` before the link is normal again, in ms
    /// (30 s).
    pub calm_ms: u64,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        Self { timeout_ms: 1_000, late_rounds: 3, calm_ms: 30_000 }
    }
}

/// One link's congestion state, fed the lag of each round (the age of the oldest change still
/// pending, on the responder's clock plus the time since its reply, so clock skew does not
/// count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Congestion {
    cfg: CongestionConfig,
    late: u32,
    congested: bool,
    calm_since: Option<u64>,
    switches: u64,
    /// The running mean of the lag while the link is not congested (ms; 0 before any).
    usual_ms: u64,
}

/// A reply is late when its lag passes this many times the link's usual lag (and at least
/// [`MIN_LATE_MS`], at most the configured time-out).
const LATE_FACTOR: u64 = 3;
const MIN_LATE_MS: u64 = 200;

impl Congestion {
    /// A link that is not congested.
    pub fn new(cfg: CongestionConfig) -> Self {
        Self { cfg, ..Self::default() }
    }

    /// Whether prioritised pulls should run on this link.
    pub fn congested(&self) -> bool {
        self.congested
    }

    /// How many times the state changed.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// A round ended at `now_ms` with the oldest pending change `lag_ms` old (0: none
    /// pending). Returns whether the link is congested now.
    /// The lag above which a reply is late now: three times the link's usual lag (its running
    /// mean while not congested), within [200 ms, the time-out].
    pub fn late_ms(&self) -> u64 {
        if self.usual_ms == 0 {
            return self.cfg.timeout_ms; // no usual lag yet
        }
        (LATE_FACTOR * self.usual_ms)
            .clamp(MIN_LATE_MS.min(self.cfg.timeout_ms), self.cfg.timeout_ms)
    }

    pub fn observe(&mut self, lag_ms: u64, now_ms: u64) -> bool {
        let late_ms = self.late_ms();
        if !self.congested {
            // The usual lag follows the replies that are not late while the link is not
            // congested.
            if lag_ms > late_ms {
                self.late += 1;
            } else {
                self.late = 0;
                // A lag within twice the usual one moves it at a tenth a reply; a higher one
                // (a link slowing down: the start of a cut, whose lag climbs over a few rounds)
                // at a hundredth, so the mark does not climb away with it while a lag that
                // stays higher (more load) still becomes the usual one over ~100 replies.
                let weight = if self.usual_ms == 0 {
                    1
                } else if lag_ms <= 2 * self.usual_ms {
                    10
                } else {
                    100
                };
                self.usual_ms = (self.usual_ms * (weight - 1) + lag_ms) / weight;
            }
            if self.late >= self.cfg.late_rounds {
                self.congested = true;
                self.calm_since = None;
                self.switches += 1;
            }
        } else if lag_ms < late_ms / 2 {
            let since = *self.calm_since.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= self.cfg.calm_ms {
                self.congested = false;
                self.late = 0;
                self.switches += 1;
            }
        } else {
            self.calm_since = None;
        }
        self.congested
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream: 1-norms lognormal-ish from a xorshift, 0.5 % creations.
    fn stream(n: usize, seed: u64) -> Vec<Update> {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|i| {
                // Box-Muller from two uniforms: exp(N(0, 1)).
                let (u1, u2) = (next().max(1e-12), next());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let created = next() < 0.005;
                Update {
                    key: i as u64,
                    grad_l1: z.exp(),
                    age_ms: if created { None } else { Some((next() * 3_600_000.0) as u64) },
                    writes: if created { 0 } else { 1 + (next() * 100.0) as u64 },
                    model: 0,
                }
            })
            .collect()
    }

    #[test]
    fn bad_configurations_are_refused_with_the_field_named() {
        for (cfg, says) in [
            (PriorityConfig::with_k(100.0), "percentile k"),
            (PriorityConfig::with_k(f64::NAN), "percentile k"),
            (PriorityConfig { slots: 0, ..PriorityConfig::default() }, "slots"),
            (PriorityConfig { half_life_ms: 0, ..PriorityConfig::default() }, "half-life"),
            (PriorityConfig { alpha: 0.0, ..PriorityConfig::default() }, "alpha"),
        ] {
            let e = Prioritiser::new(cfg, Arc::new(EkkoPriority)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    /// P6: once the window is full, the share of significant updates is `1 − k/100` within
    /// half a point.
    #[test]
    fn the_top_percentile_is_significant_once_the_window_is_full() {
        for (k, seed) in [(99.0, 7u64), (95.0, 11), (90.0, 13)] {
            let mut pr =
                Prioritiser::new(PriorityConfig::with_k(k), Arc::new(EkkoPriority)).unwrap();
            let updates = stream(400_000, seed);
            // 2,000 updates/s: the window (60 s) is full after 120,000.
            let mut sig = 0usize;
            let mut counted = 0usize;
            for (i, u) in updates.iter().enumerate() {
                let now = i as u64 / 2;
                let s = pr.score(u, now);
                if i >= 150_000 {
                    counted += 1;
                    sig += s.significant as usize;
                }
            }
            let share = sig as f64 / counted as f64 * 100.0;
            let want = 100.0 - k;
            assert!(
                (share - want).abs() <= 0.5,
                "k {k} seed {seed}: {share:.3} % significant, want {want}"
            );
        }
    }

    /// P6 for a fast writer that records its samples in batches (a table's shard steps): one
    /// update in `stride` goes into the sketch, and the share stays within half a point.
    #[test]
    fn the_top_percentile_holds_when_a_fast_writer_is_sampled_into_the_sketch() {
        for (k, seed, per_s, stride) in [(99.0, 17u64, 4, 3), (99.0, 23, 20, 15), (95.0, 19, 4, 3)]
        {
            let mut pr =
                Prioritiser::new(PriorityConfig::with_k(k), Arc::new(EkkoPriority)).unwrap();
            let updates = stream(900_000, seed);
            let (mut sig, mut counted) = (0usize, 0usize);
            let mut out = Vec::new();
            // Batches of 3,000 rows, `per_s` a second: 12,000 or 60,000 updates/s.
            for (b, batch) in updates.chunks(3_000).enumerate() {
                let now = 1 + b as u64 * 1000 / per_s;
                pr.snapshot(0).score_batch(batch, &mut out);
                let samples: Vec<Sample> = out.iter().map(|s| s.1).collect();
                pr.record(&samples, now);
                if b * 3_000 >= 300_000 {
                    counted += out.len();
                    sig += out.iter().filter(|s| s.0.significant).count();
                }
            }
            assert_eq!(pr.stride, stride, "k {k} seed {seed}");
            let share = sig as f64 / counted as f64 * 100.0;
            let want = 100.0 - k;
            assert!(
                (share - want).abs() <= 0.5,
                "k {k} seed {seed} stride {stride}: {share:.3} % significant, want {want}"
            );
        }
    }

    /// Creations score high under the default rule (new rows first): a mostly-old stream's
    /// creations enter the top 1 % far more often than 1 %.
    #[test]
    fn new_rows_come_first() {
        let mut pr = Prioritiser::new(PriorityConfig::default(), Arc::new(EkkoPriority)).unwrap();
        let (mut new_sig, mut new_n) = (0, 0);
        for (i, u) in stream(200_000, 5).iter().enumerate() {
            let s = pr.score(u, i as u64 / 2);
            if i > 50_000 && u.writes == 0 {
                new_n += 1;
                new_sig += s.significant as usize;
            }
        }
        assert!(new_n > 100);
        assert!(new_sig * 10 > new_n, "{new_sig} of {new_n} creations significant");
    }

    /// `p_m`: a model with no traffic is never significant when another model has it all.
    #[test]
    fn the_models_share_of_traffic_weighs_in() {
        let mut pr = Prioritiser::new(PriorityConfig::default(), Arc::new(EkkoPriority)).unwrap();
        pr.set_model_shares(&HashMap::from([(0, 99.0), (1, 1.0)]));
        let mut sig = [0usize; 2];
        for (i, mut u) in stream(100_000, 3).into_iter().enumerate() {
            u.model = (i % 2) as u32;
            sig[u.model as usize] += pr.score(&u, i as u64 / 2).significant as usize;
        }
        assert!(sig[1] == 0 && sig[0] > 500, "{sig:?}");
    }

    /// A user's rule replaces the default (here 2 % of keys at 10, the rest at 1: the 99th
    /// percentile is 10, ties included); a rule returning NaN counts as 0 and is never
    /// significant.
    #[test]
    fn a_user_rule_decides() {
        #[derive(Debug)]
        struct ByKey;
        impl PriorityFn for ByKey {
            fn priority(&self, u: &Update, _: &Stats) -> f64 {
                if u.key.is_multiple_of(50) {
                    10.0
                } else if u.key % 50 == 1 {
                    f64::NAN
                } else {
                    1.0
                }
            }
        }
        let mut pr = Prioritiser::new(PriorityConfig::default(), Arc::new(ByKey)).unwrap();
        for (i, u) in stream(20_000, 1).iter().enumerate() {
            let s = pr.score(u, i as u64);
            if i > 2_000 {
                assert_eq!(s.significant, u.key.is_multiple_of(50), "key {}", u.key);
            }
        }
    }

    /// Late is relative to the link's usual lag: a link at 80 ms is late at 400 ms (a cut that
    /// coalescing keeps under a second is still seen), one at 300 ms is not (its mark is 900).
    #[test]
    fn late_follows_the_links_usual_lag() {
        let mut fast = Congestion::new(CongestionConfig::default());
        let mut slow = Congestion::new(CongestionConfig::default());
        for t in 0..100 {
            fast.observe(80, t * 100);
            slow.observe(300, t * 100);
        }
        assert_eq!((fast.late_ms(), slow.late_ms()), (240, 900));
        for t in 100..103 {
            fast.observe(400, t * 100);
            slow.observe(400, t * 100);
        }
        assert!(fast.congested() && !slow.congested());
        assert_eq!(
            Congestion::new(CongestionConfig::default()).late_ms(),
            1_000,
            "no usual lag yet"
        );
    }

    /// A cut whose lag climbs over a few rounds (rounds grow as the link slows) is seen: the
    /// usual lag does not climb with it. A lag that stays higher becomes the usual one.
    #[test]
    fn a_lag_that_climbs_is_late_before_the_usual_lag_follows_it() {
        let mut c = Congestion::new(CongestionConfig::default());
        for t in 0..100 {
            c.observe(100, t * 100);
        }
        // 100 ms → 700 ms over 12 replies (50 ms a step), then 700 ms.
        let mut congested_at = None;
        for i in 0..40u64 {
            if c.observe((100 + 50 * (i + 1)).min(700), 10_000 + i * 200) && congested_at.is_none()
            {
                congested_at = Some(i);
            }
        }
        assert!(congested_at.is_some_and(|i| i < 12), "{congested_at:?}");
        // A link whose lag rose for good (250 ms, under the late mark of 300) is the usual one
        // after a few hundred replies: its late mark follows.
        let mut d = Congestion::new(CongestionConfig::default());
        for t in 0..100 {
            d.observe(100, t * 100);
        }
        for t in 100..600 {
            d.observe(250, t * 100);
        }
        assert!(d.late_ms() >= 700 && !d.congested(), "{}", d.late_ms());
    }

    #[test]
    fn a_link_is_congested_after_three_late_rounds_and_calm_after_thirty_seconds() {
        let mut c = Congestion::new(CongestionConfig { timeout_ms: 5_000, ..Default::default() });
        assert!(!c.observe(6_000, 0));
        assert!(!c.observe(6_000, 100));
        assert!(!c.observe(100, 200), "a round in time resets the count");
        assert!(!c.observe(6_000, 300));
        assert!(!c.observe(6_000, 400));
        assert!(c.observe(6_000, 500));
        // Calm for 30 s with lag under half the late mark (3 × the usual 100 ms); a late round
        // in between restarts it.
        assert_eq!(c.late_ms(), 300);
        assert!(c.observe(100, 1_000));
        assert!(c.observe(3_000, 20_000), "not under half the late mark");
        assert!(c.observe(100, 21_000));
        assert!(c.observe(100, 50_999));
        assert!(!c.observe(100, 51_000));
        assert_eq!(c.switches(), 2);
    }
}
