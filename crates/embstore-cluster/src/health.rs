//! The model health detector (docs: spec `ekko.md` §6.2, "Detector"): from per-window reports of
//! a rate (clicks per impression, say) for the live model and its baseline, it decides whether
//! the live model is healthy, corrupted or uncertain. It is pure: no I/O and no clock; event
//! times and the watermark come in as milliseconds, so a run replays exactly.
//!
//! - Windows are `window_ms` of event time, aligned to multiples of `window_ms`. Reports for a
//!   window add up (several servers report the same window). A window fires once the
//!   watermark reaches its end plus `lateness_ms`; a report for a window that has fired is
//!   late: counted ([`Detector::late_reports`]) and ignored.
//! - A fired window is *bad* when `r = rate_live / rate_baseline < 1 − delta_bad` and a pooled
//!   two-proportion z-test says the live rate is lower (`z > z_bad`); *ok* when
//!   `r ≥ 1 − delta_ok`; otherwise, or with too few trials, neither.
//! - The state starts [`Health::Uncertain`] and changes only when confident: to
//!   [`Health::Corrupted`] after `n_bad` bad windows in a row, to [`Health::Healthy`] after
//!   `n_ok` ok windows in a row. A window without any report breaks a run.
//! - Each corruption is recorded as an [`Interval`] from the start of its first bad window,
//!   closed at the start of the ok run that made the model healthy again; a witness picks its
//!   `t_max` outside them (`embstore_replication::choose_t_max`, through `Corrupted::from`).

use std::collections::BTreeMap;
use std::str::FromStr;

use embstore_common::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// The two variants whose rates are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The model serving almost all traffic, with the latest updates.
    Live,
    /// The baseline: a copy with delayed state serving a small share of traffic, the ground
    /// truth the live model is measured against.
    Baseline,
}

impl FromStr for Variant {
    type Err = Error;

    /// `"live"` or `"baseline"`; any other name is `InvalidArgument`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "live" => Ok(Variant::Live),
            "baseline" => Ok(Variant::Baseline),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown variant '{s}': expected 'live' or 'baseline'"),
            )),
        }
    }
}

/// What the detector believes about the live model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// `n_ok` ok windows in a row, and no confident corruption since.
    Healthy,
    /// Not known yet: the state before the first confident decision.
    #[default]
    Uncertain,
    /// `n_bad` bad windows in a row, and no confident recovery since.
    Corrupted,
}

/// A span of event time in which the live model was corrupted: from `start_ms` to `end_ms`
/// (`None` while it still is). A time `t` is inside it when `start_ms < t < end_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    /// The start of the first bad window of the run that found the corruption.
    pub start_ms: u64,
    /// The start of the ok run that found the model healthy again; `None`: still corrupted.
    pub end_ms: Option<u64>,
}

impl Interval {
    /// Whether `t_ms` lies strictly inside the interval (its ends are outside: logs up to the
    /// start hold no corrupted update).
    pub fn contains(&self, t_ms: u64) -> bool {
        self.start_ms < t_ms && self.end_ms.is_none_or(|end| t_ms < end)
    }
}

/// How one fired window was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The live rate is lower than the baseline's by more than `delta_bad`, significantly.
    Bad,
    /// The live rate is within `delta_ok` of the baseline's, or above it.
    Ok,
    /// Neither: a drop too small or not significant, or too few trials.
    Neither,
}

/// The detector's answer for one fired window (one per window that had a report).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The window's start (event time, ms).
    pub window_start_ms: u64,
    /// The time the decision is made at: the window's end.
    pub t_ms: u64,
    /// How the window was judged.
    pub verdict: Verdict,
    /// `rate_live / rate_baseline` (infinite when only the baseline rate is 0); `None` when it
    /// cannot be computed (too few trials, or both rates 0).
    pub ratio: Option<f64>,
    /// The z statistic, positive when the live rate is lower; `None` as for `ratio`.
    pub z: Option<f64>,
    /// The state after this window.
    pub state: Health,
    /// Whether this window changed the state.
    pub changed: bool,
    /// Set when the state is [`Health::Healthy`] and this window was ok: the model state
    /// propagated by then is healthy, `t_ms − latency_p99_ms` (what witnesses flush up to).
    pub t_healthy_ms: Option<u64>,
    /// Set when the state is [`Health::Corrupted`]: the start of the open corrupted interval.
    pub corrupted_since_ms: Option<u64>,
}

/// What became of one report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Report {
    /// Added to its window's counts.
    Counted,
    /// Its window had fired already: ignored, and counted as late.
    Late,
}

/// A pluggable health detector: reports in, decisions out as the watermark moves.
pub trait Detector: Send + std::fmt::Debug {
    /// Adds `successes` out of `trials` for `variant` to the window starting at
    /// `window_start_ms`. `InvalidArgument` for bad input (more successes than trials, a start
    /// not aligned to the window length); [`Report::Late`] if that window has fired.
    fn report(
        &mut self,
        variant: Variant,
        window_start_ms: u64,
        successes: u64,
        trials: u64,
    ) -> Result<Report>;

    /// Moves the watermark to `watermark_ms` (a lower one is ignored) and fires every window
    /// it has passed, in order: one [`Decision`] per fired window that had a report.
    fn advance(&mut self, watermark_ms: u64) -> Vec<Decision>;

    /// The current state.
    fn state(&self) -> Health;

    /// Every corrupted interval recorded so far, oldest first (the last may be open).
    fn corrupted(&self) -> &[Interval];

    /// How many reports came too late and were ignored.
    fn late_reports(&self) -> u64;
}

/// The settings of [`RatioDetector`]; the defaults are the spec's (§6.2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DetectorConfig {
    /// The length of a window of event time (default 30 s).
    pub window_ms: u64,
    /// How long after a window's end its reports may still arrive (default 30 s).
    pub lateness_ms: u64,
    /// A window is bad below `1 − delta_bad` (default 0.05) ...
    pub delta_bad: f64,
    /// ... with `z > z_bad` (default 3): the live rate is lower beyond chance.
    pub z_bad: f64,
    /// A window is ok at `1 − delta_ok` (default 0.02) or above.
    pub delta_ok: f64,
    /// Bad windows in a row that make the model corrupted (default 3).
    pub n_bad: u32,
    /// Ok windows in a row that make the model healthy (default 3).
    pub n_ok: u32,
    /// Fewer trials than this for either variant make a window neither bad nor ok (default 1).
    pub min_trials: u64,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            window_ms: 30_000,
            lateness_ms: 30_000,
            delta_bad: 0.05,
            z_bad: 3.0,
            delta_ok: 0.02,
            n_bad: 3,
            n_ok: 3,
            min_trials: 1,
        }
    }
}

impl DetectorConfig {
    /// `InvalidArgument` unless every setting is usable: `window_ms`, `n_bad`, `n_ok` and
    /// `min_trials` above 0, `0 ≤ delta_ok ≤ delta_bad < 1` and `z_bad ≥ 0`, all finite
    /// (`delta_ok > delta_bad` would let one window be both bad and ok).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, what));
        if self.window_ms == 0 {
            return bad("window_ms must be above 0, got 0".into());
        }
        if self.n_bad == 0 || self.n_ok == 0 {
            return bad(format!(
                "n_bad and n_ok must be above 0, got {} and {}",
                self.n_bad, self.n_ok
            ));
        }
        if self.min_trials == 0 {
            return bad("min_trials must be above 0, got 0".into());
        }
        let unit = |x: f64| x.is_finite() && (0.0..1.0).contains(&x);
        if !unit(self.delta_bad) || !unit(self.delta_ok) || self.delta_ok > self.delta_bad {
            return bad(format!(
                "deltas must satisfy 0 <= delta_ok <= delta_bad < 1, got delta_ok {} and \
                 delta_bad {}",
                self.delta_ok, self.delta_bad
            ));
        }
        if !self.z_bad.is_finite() || self.z_bad < 0.0 {
            return bad(format!("z_bad must be finite and >= 0, got {}", self.z_bad));
        }
        Ok(())
    }
}

/// Successes and trials of one variant in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    successes: u64,
    trials: u64,
}

/// The default [`Detector`]: the ratio of rates with a z-test, window by window (see the
/// module docs).
#[derive(Debug)]
pub struct RatioDetector {
    cfg: DetectorConfig,
    latency_p99_ms: u64,
    /// Windows not fired yet, by start: `[live, baseline]`.
    pending: BTreeMap<u64, [Counts; 2]>,
    /// The highest watermark seen.
    watermark_ms: Option<u64>,
    /// The end of the last window fired with a report (a later one starting after it means
    /// windows without reports fired in between).
    last_end_ms: Option<u64>,
    state: Health,
    /// Bad windows in a row so far, and the start of the first.
    bad_run: (u32, u64),
    /// Ok windows in a row so far, and the start of the first.
    ok_run: (u32, u64),
    corrupted: Vec<Interval>,
    late: u64,
}

impl RatioDetector {
    /// A detector with `cfg` (validated: see [`DetectorConfig::validate`]), uncertain, with a
    /// dissemination latency of 0 until [`RatioDetector::set_latency_p99_ms`].
    pub fn new(cfg: DetectorConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            latency_p99_ms: 0,
            pending: BTreeMap::new(),
            watermark_ms: None,
            last_end_ms: None,
            state: Health::Uncertain,
            bad_run: (0, 0),
            ok_run: (0, 0),
            corrupted: Vec::new(),
            late: 0,
        })
    }

    /// The settings it was made with.
    pub fn config(&self) -> &DetectorConfig {
        &self.cfg
    }

    /// Sets the measured p99 latency of update dissemination: a window ending at `b` vouches
    /// for the state propagated by `b − latency` (`t_healthy`).
    pub fn set_latency_p99_ms(&mut self, latency_ms: u64) {
        self.latency_p99_ms = latency_ms;
    }

    /// Whether the window starting at `start` has fired (the watermark has passed its end plus
    /// the lateness).
    fn fired(&self, start: u64) -> bool {
        let due = start.saturating_add(self.cfg.window_ms).saturating_add(self.cfg.lateness_ms);
        self.watermark_ms.is_some_and(|w| due <= w)
    }

    /// Judges one window from its counts: the verdict, the ratio and z.
    fn judge(&self, [live, base]: [Counts; 2]) -> (Verdict, Option<f64>, Option<f64>) {
        if live.trials < self.cfg.min_trials || base.trials < self.cfg.min_trials {
            return (Verdict::Neither, None, None);
        }
        let (sl, nl) = (live.successes as f64, live.trials as f64);
        let (sb, nb) = (base.successes as f64, base.trials as f64);
        let (pl, pb) = (sl / nl, sb / nb);
        let ratio = if pb > 0.0 {
            pl / pb
        } else if pl > 0.0 {
            f64::INFINITY
        } else {
            return (Verdict::Neither, None, None); // no success at all: nothing to compare
        };
        let pooled = (sl + sb) / (nl + nb);
        let se = (pooled * (1.0 - pooled) * (1.0 / nl + 1.0 / nb)).sqrt();
        // se is 0 only when every trial of both succeeded: the rates are equal.
        let z = if se > 0.0 { (pb - pl) / se } else { 0.0 };
        let verdict = if ratio < 1.0 - self.cfg.delta_bad && z > self.cfg.z_bad {
            Verdict::Bad
        } else if ratio >= 1.0 - self.cfg.delta_ok {
            Verdict::Ok
        } else {
            Verdict::Neither
        };
        (verdict, Some(ratio), Some(z))
    }

    /// Applies one fired window to the runs and the state.
    fn fire(&mut self, start: u64, counts: [Counts; 2]) -> Decision {
        let end = start + self.cfg.window_ms; // checked when the report was taken
        if self.last_end_ms.is_some_and(|last| start > last) {
            // Windows without any report fired in between: they were neither.
            self.bad_run = (0, 0);
            self.ok_run = (0, 0);
        }
        self.last_end_ms = Some(end);
        let (verdict, ratio, z) = self.judge(counts);
        match verdict {
            Verdict::Bad => {
                self.ok_run = (0, 0);
                if self.bad_run.0 == 0 {
                    self.bad_run.1 = start;
                }
                self.bad_run.0 += 1;
            }
            Verdict::Ok => {
                self.bad_run = (0, 0);
                if self.ok_run.0 == 0 {
                    self.ok_run.1 = start;
                }
                self.ok_run.0 += 1;
            }
            Verdict::Neither => {
                self.bad_run = (0, 0);
                self.ok_run = (0, 0);
            }
        }
        let before = self.state;
        if self.bad_run.0 >= self.cfg.n_bad && self.state != Health::Corrupted {
            self.state = Health::Corrupted;
            self.corrupted.push(Interval { start_ms: self.bad_run.1, end_ms: None });
        } else if self.ok_run.0 >= self.cfg.n_ok && self.state != Health::Healthy {
            self.state = Health::Healthy;
            if let Some(open) = self.corrupted.last_mut().filter(|i| i.end_ms.is_none()) {
                open.end_ms = Some(self.ok_run.1);
            }
        }
        let t_healthy_ms = (self.state == Health::Healthy && verdict == Verdict::Ok)
            .then(|| end.saturating_sub(self.latency_p99_ms));
        let corrupted_since_ms = (self.state == Health::Corrupted)
            .then(|| self.corrupted.last().map(|i| i.start_ms))
            .flatten();
        Decision {
            window_start_ms: start,
            t_ms: end,
            verdict,
            ratio,
            z,
            state: self.state,
            changed: self.state != before,
            t_healthy_ms,
            corrupted_since_ms,
        }
    }
}

impl Detector for RatioDetector {
    fn report(
        &mut self,
        variant: Variant,
        window_start_ms: u64,
        successes: u64,
        trials: u64,
    ) -> Result<Report> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, what));
        if successes > trials {
            return bad(format!("successes ({successes}) exceed trials ({trials})"));
        }
        if !window_start_ms.is_multiple_of(self.cfg.window_ms) {
            return bad(format!(
                "window start {window_start_ms} is not a multiple of window_ms {}",
                self.cfg.window_ms
            ));
        }
        if window_start_ms.checked_add(self.cfg.window_ms).is_none() {
            return bad(format!("window start {window_start_ms} is too large"));
        }
        if self.fired(window_start_ms) {
            self.late += 1;
            return Ok(Report::Late);
        }
        let slot = &mut self.pending.entry(window_start_ms).or_default()[match variant {
            Variant::Live => 0,
            Variant::Baseline => 1,
        }];
        match (slot.successes.checked_add(successes), slot.trials.checked_add(trials)) {
            (Some(s), Some(n)) => {
                *slot = Counts { successes: s, trials: n };
                Ok(Report::Counted)
            }
            _ => bad(format!("trials of window {window_start_ms} overflow u64")),
        }
    }

    fn advance(&mut self, watermark_ms: u64) -> Vec<Decision> {
        if self.watermark_ms.is_some_and(|w| watermark_ms <= w) {
            return Vec::new();
        }
        self.watermark_ms = Some(watermark_ms);
        let mut out = Vec::new();
        while let Some((&start, _)) = self.pending.first_key_value() {
            if !self.fired(start) {
                break;
            }
            let counts = self.pending.remove(&start).unwrap_or_default();
            out.push(self.fire(start, counts));
        }
        out
    }

    fn state(&self) -> Health {
        self.state
    }

    fn corrupted(&self) -> &[Interval] {
        &self.corrupted
    }

    fn late_reports(&self) -> u64 {
        self.late
    }
}

impl From<Interval> for embstore_replication::Corrupted {
    /// The span as a witness reads it to choose its `t_max`
    /// ([`embstore_replication::choose_t_max`]: no bucket that meets it is flushed).
    fn from(i: Interval) -> Self {
        Self { start_ms: i.start_ms, end_ms: i.end_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: u64 = 30_000;

    fn detector() -> RatioDetector {
        RatioDetector::new(DetectorConfig::default()).unwrap()
    }

    /// Reports one window: `live` and `base` as (successes, trials).
    fn window(d: &mut RatioDetector, i: u64, live: (u64, u64), base: (u64, u64)) {
        assert_eq!(d.report(Variant::Live, i * W, live.0, live.1).unwrap(), Report::Counted);
        assert_eq!(d.report(Variant::Baseline, i * W, base.0, base.1).unwrap(), Report::Counted);
    }

    /// Fires window `i` (and every one before it): the watermark at its end plus the lateness.
    fn fire(d: &mut RatioDetector, i: u64) -> Vec<Decision> {
        d.advance((i + 1) * W + 30_000)
    }

    #[test]
    fn a_clean_run_becomes_healthy_after_three_windows() {
        let mut d = detector();
        d.set_latency_p99_ms(4_000);
        for i in 0..3 {
            window(&mut d, i, (1_000, 20_000), (1_000, 20_000));
            let out = fire(&mut d, i);
            assert_eq!(out.len(), 1);
            let dec = &out[0];
            assert_eq!(dec.verdict, Verdict::Ok);
            assert_eq!(dec.t_ms, (i + 1) * W);
            if i < 2 {
                assert_eq!(
                    (dec.state, dec.changed, dec.t_healthy_ms),
                    (Health::Uncertain, false, None)
                );
            } else {
                assert_eq!(dec.state, Health::Healthy);
                assert!(dec.changed);
                assert_eq!(dec.t_healthy_ms, Some(3 * W - 4_000));
            }
        }
        assert_eq!(d.state(), Health::Healthy);
        assert!(d.corrupted().is_empty());
    }

    #[test]
    fn a_20_percent_drop_is_corrupted_after_exactly_three_bad_windows() {
        let mut d = detector();
        for i in 0..3 {
            window(&mut d, i, (1_000, 20_000), (1_000, 20_000));
        }
        assert_eq!(fire(&mut d, 2).last().unwrap().state, Health::Healthy);
        // CTR 5 % → 4 % with 20,000 impressions each: z ≈ 4.8.
        for i in 3..6 {
            window(&mut d, i, (800, 20_000), (1_000, 20_000));
            let dec = fire(&mut d, i).pop().unwrap();
            assert_eq!(dec.verdict, Verdict::Bad, "{dec:?}");
            assert!(dec.z.unwrap() > 3.0 && (dec.ratio.unwrap() - 0.8).abs() < 1e-9);
            assert_eq!(dec.t_healthy_ms, None);
            if i < 5 {
                assert_eq!(dec.state, Health::Healthy, "corrupted after {} windows", i - 2);
            } else {
                assert_eq!(dec.state, Health::Corrupted);
                assert!(dec.changed);
                assert_eq!(dec.corrupted_since_ms, Some(3 * W));
            }
        }
        assert_eq!(d.corrupted(), [Interval { start_ms: 3 * W, end_ms: None }]);
        // Healthy again after three ok windows: the interval closes where that run began.
        for i in 6..9 {
            window(&mut d, i, (1_000, 20_000), (1_000, 20_000));
            let dec = fire(&mut d, i).pop().unwrap();
            assert_eq!(dec.state, if i < 8 { Health::Corrupted } else { Health::Healthy });
        }
        assert_eq!(d.corrupted(), [Interval { start_ms: 3 * W, end_ms: Some(6 * W) }]);
    }

    #[test]
    fn a_small_noisy_drop_with_few_trials_stays_uncertain() {
        let mut d = detector();
        // CTR 5 % → 4 % with 500 impressions: r = 0.8 but z ≈ 0.77, not significant.
        for i in 0..10 {
            window(&mut d, i, (20, 500), (25, 500));
            let dec = fire(&mut d, i).pop().unwrap();
            assert_eq!(dec.verdict, Verdict::Neither, "{dec:?}");
            assert!(dec.z.unwrap() < 3.0);
            assert_eq!(dec.state, Health::Uncertain);
        }
        // No trials for one variant: neither, with no ratio.
        d.report(Variant::Live, 10 * W, 0, 0).unwrap();
        d.report(Variant::Baseline, 10 * W, 5, 100).unwrap();
        let dec = fire(&mut d, 10).pop().unwrap();
        assert_eq!((dec.verdict, dec.ratio), (Verdict::Neither, None));
    }

    #[test]
    fn a_late_report_is_counted_and_ignored() {
        let mut d = detector();
        window(&mut d, 0, (1_000, 20_000), (1_000, 20_000));
        // Before end + lateness the window still takes reports.
        assert!(d.advance(W + 29_999).is_empty());
        assert_eq!(d.report(Variant::Live, 0, 0, 1_000).unwrap(), Report::Counted);
        assert_eq!(fire(&mut d, 0).len(), 1);
        assert_eq!(d.report(Variant::Live, 0, 0, 100_000).unwrap(), Report::Late);
        assert_eq!(d.report(Variant::Baseline, 0, 0, 1).unwrap(), Report::Late);
        assert_eq!(d.late_reports(), 2);
        assert!(fire(&mut d, 0).is_empty(), "a window fired twice");
        // A lower watermark changes nothing: the window stays fired.
        assert!(d.advance(0).is_empty());
        assert_eq!(d.report(Variant::Live, 0, 0, 1).unwrap(), Report::Late);
        assert_eq!(d.late_reports(), 3);
    }

    #[test]
    fn reports_of_one_window_add_up() {
        let mut d = detector();
        // Four servers each see a part; only the sum is significant (z ≈ 4.8).
        for _ in 0..4 {
            window(&mut d, 0, (200, 5_000), (250, 5_000));
        }
        let dec = fire(&mut d, 0).pop().unwrap();
        assert_eq!(dec.verdict, Verdict::Bad);
        assert!((dec.ratio.unwrap() - 0.8).abs() < 1e-9);
        // One server's part alone: not significant.
        let mut one = detector();
        window(&mut one, 0, (200, 5_000), (250, 5_000));
        assert_eq!(fire(&mut one, 0).pop().unwrap().verdict, Verdict::Neither);
    }

    #[test]
    fn a_window_without_reports_breaks_a_run() {
        let mut d = detector();
        window(&mut d, 0, (800, 20_000), (1_000, 20_000));
        window(&mut d, 1, (800, 20_000), (1_000, 20_000));
        window(&mut d, 3, (800, 20_000), (1_000, 20_000));
        let out = fire(&mut d, 3);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|x| x.verdict == Verdict::Bad && x.state == Health::Uncertain));
        window(&mut d, 4, (800, 20_000), (1_000, 20_000));
        window(&mut d, 5, (800, 20_000), (1_000, 20_000));
        let out = fire(&mut d, 5);
        assert_eq!(out[1].state, Health::Corrupted);
        assert_eq!(out[1].corrupted_since_ms, Some(3 * W));
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let mut d = detector();
        let e = d.report(Variant::Live, 0, 5, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "successes (5) exceed trials (4)");
        assert_eq!(
            d.report(Variant::Live, 1, 0, 4).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!("shadow".parse::<Variant>().unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!("baseline".parse::<Variant>().unwrap(), Variant::Baseline);
        let base = DetectorConfig::default();
        for cfg in [
            DetectorConfig { window_ms: 0, ..base },
            DetectorConfig { delta_bad: f64::NAN, ..base },
            DetectorConfig { delta_ok: f64::INFINITY, ..base },
            DetectorConfig { delta_ok: 0.1, ..base },
            DetectorConfig { delta_bad: 1.0, ..base },
            DetectorConfig { z_bad: f64::NAN, ..base },
            DetectorConfig { z_bad: -1.0, ..base },
            DetectorConfig { n_bad: 0, ..base },
            DetectorConfig { n_ok: 0, ..base },
            DetectorConfig { min_trials: 0, ..base },
        ] {
            let e = RatioDetector::new(cfg).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{cfg:?}");
        }
        // Overflowing sums are refused, and the window keeps what it had.
        d.report(Variant::Live, 0, 0, u64::MAX).unwrap();
        assert_eq!(
            d.report(Variant::Live, 0, 0, 1).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let last = u64::MAX / W * W;
        assert_eq!(
            d.report(Variant::Live, last, 0, 1).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn an_interval_is_a_witness_s_corrupted_span() {
        let c: embstore_replication::Corrupted = Interval { start_ms: 10_500, end_ms: None }.into();
        assert_eq!(embstore_replication::choose_t_max(12_345, 1_000, 0, &[c]), Some(10_000));
        let c: embstore_replication::Corrupted =
            Interval { start_ms: 4_200, end_ms: Some(9_000) }.into();
        assert_eq!(embstore_replication::choose_t_max(9_500, 1_000, 0, &[c]), Some(4_000));
    }

    /// One window's inputs in the property test.
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        /// A 20 % drop with many trials: always bad.
        Drop,
        /// Equal rates with many trials: always ok.
        Clean,
        /// Few trials and some drop: anything.
        Noise(u64, u64),
        /// No report at all.
        Gap,
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            3 => Just(Kind::Drop),
            3 => Just(Kind::Clean),
            2 => (0u64..30, 0u64..30).prop_map(|(a, b)| Kind::Noise(a, b)),
            1 => Just(Kind::Gap),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The state changes only after N consecutive bad (or ok) windows with reports, always
        /// does then, and matches a model run over the verdicts.
        #[test]
        fn states_change_only_after_n_consecutive_windows(
            kinds in proptest::collection::vec(kind(), 1..60),
            n_bad in 1u32..5,
            n_ok in 1u32..5,
            fire_every in 1usize..4,
        ) {
            let cfg = DetectorConfig { n_bad, n_ok, ..DetectorConfig::default() };
            let mut d = RatioDetector::new(cfg).unwrap();
            let mut decisions = Vec::new();
            for (i, k) in kinds.iter().enumerate() {
                let i = i as u64;
                match *k {
                    Kind::Drop => window(&mut d, i, (800, 20_000), (1_000, 20_000)),
                    Kind::Clean => window(&mut d, i, (1_000, 20_000), (1_000, 20_000)),
                    Kind::Noise(a, b) => window(&mut d, i, (a, 30), (b, 30)),
                    Kind::Gap => {}
                }
                if (i as usize + 1).is_multiple_of(fire_every) {
                    decisions.extend(fire(&mut d, i));
                }
            }
            decisions.extend(fire(&mut d, kinds.len() as u64));
            let reported = kinds.iter().filter(|k| !matches!(k, Kind::Gap)).count();
            prop_assert_eq!(decisions.len(), reported);

            // The model: runs over the windows in order, a gap being neither.
            let (mut state, mut bad, mut ok, mut next) = (Health::Uncertain, 0u32, 0u32, 0usize);
            let mut opened = Vec::new();
            for (i, k) in kinds.iter().enumerate() {
                let verdict = match k {
                    Kind::Gap => Verdict::Neither,
                    _ => {
                        let dec = &decisions[next];
                        next += 1;
                        prop_assert_eq!(dec.window_start_ms, i as u64 * W);
                        dec.verdict
                    }
                };
                match (k, verdict) {
                    (Kind::Drop, v) => prop_assert_eq!(v, Verdict::Bad),
                    (Kind::Clean, v) => prop_assert_eq!(v, Verdict::Ok),
                    _ => {}
                }
                (bad, ok) = match verdict {
                    Verdict::Bad => (bad + 1, 0),
                    Verdict::Ok => (0, ok + 1),
                    Verdict::Neither => (0, 0),
                };
                let before = state;
                if bad >= n_bad && state != Health::Corrupted {
                    state = Health::Corrupted;
                    opened.push((i as u64 + 1 - n_bad as u64) * W);
                } else if ok >= n_ok && state != Health::Healthy {
                    state = Health::Healthy;
                }
                if !matches!(k, Kind::Gap) {
                    let dec = &decisions[next - 1];
                    prop_assert_eq!(dec.state, state, "window {}", i);
                    prop_assert_eq!(dec.changed, state != before);
                    if dec.changed {
                        // The change came after exactly N windows of its kind in a row.
                        let (need, want) = match state {
                            Health::Corrupted => (n_bad, Verdict::Bad),
                            _ => (n_ok, Verdict::Ok),
                        };
                        let run = decisions[..next].iter().rev().take(need as usize);
                        prop_assert!(run.clone().count() == need as usize);
                        prop_assert!(run.clone().all(|x| x.verdict == want));
                        let first = decisions[next - need as usize].window_start_ms;
                        let end = first + u64::from(need) * W;
                        prop_assert_eq!(end, dec.t_ms, "a gap inside the run");
                    }
                }
            }
            prop_assert_eq!(d.state(), state);
            let starts: Vec<u64> = d.corrupted().iter().map(|i| i.start_ms).collect();
            prop_assert_eq!(starts, opened);
            prop_assert_eq!(d.late_reports(), 0);
        }
    }
}
