//! [`LruLfu`], the store's default eviction: a CLOCK recency segment in front of a sampled-LFU
//! frequency segment (spec E.3, after Baidu's App. D "LRU in front of LFU").
//!
//! ## Structure
//! Per slot (15 bytes, see [`Eviction::bytes_per_slot`]):
//!
//! ```text
//! bit   AtomicU8  CLOCK "used since the hand last passed"  set by on_access (&self)
//! freq  AtomicU8  Morris log counter, 8 steps per doubling  bumped by on_access (&self)
//! seg   u8        Empty | Recency | Frequency
//! pos   u32       index of the slot in its segment's list
//! born  u32       insertion number (wrapping), for "oldest first" among equal counters
//! +4              the slot's entry in one of the two lists below
//!
//! recency   [s7 s2 s9 s4 …]   dense list, a CLOCK hand walks it in order and wraps
//!                ^hand
//! frequency [s1 s5 s3 …]      dense list, sampled uniformly by index
//! ```
//!
//! - **Insert**: the row joins the recency list with its bit set (a second chance, like the
//!   MRU end of an LRU) and `freq = 0`.
//! - **Access**: sets the bit and bumps `freq` from `c` with probability `2^(-c/8)`, drawn
//!   from a hash of the slot and the access number. The counter then stands for
//!   `(2^(c/8) - 1) / (2^(1/8) - 1)` accesses: 1 → 1, 10 → 7, 1000 → 52, 10^6 → 132, and it
//!   saturates at 255 ≈ 4.4 × 10^10 (see [`STEPS_PER_DOUBLING`] for why not `2^-c`). Both
//!   are `Relaxed` atomics; a lost bump is harmless.
//! - **Recency → frequency** (inside `victims`, where the pinned set is known): while the
//!   recency list holds more than `recency_fraction` of the live rows, the hand looks at the
//!   row under it: bit set → clear it and move on; pinned → move on; otherwise the row moves to
//!   the frequency list, keeping its counter.
//! - **Frequency → recency** (lazy): an access to a frequency row only sets its bit. When
//!   sampling draws a frequency row whose bit is set, the row goes back to the recency list
//!   instead of being a candidate, so a row used since it was demoted is never evicted.
//! - **Victims**: sampled LFU. Draw `sample` rows from the frequency list (seeded xorshift);
//!   the least `freq`, then the oldest `born`, is a victim unless it is pinned (then it
//!   leaves the range and the draw is made again). Repeat until
//!   `n`. Pinned and chosen rows are swapped past the end of the sampled range for the rest
//!   of the call, so they are drawn at most once and the range only shrinks. When the range is
//!   empty (frequency segment empty or all pinned), the hand takes victims from the recency
//!   list by CLOCK. Chosen recency rows move to the frequency list (past the range).
//! - **Aging** (an O(live) pass at the start of `victims`, the lazy choice: counters only
//!   matter there): once `age_every` accesses have passed since the last pass (`0` = auto,
//!   100 × the live rows), every counter is halved once per elapsed period. Halving acts on
//!   the count the counter stands for, through a 256-entry table built for the pass: `c`
//!   becomes the nearest `c'` with `2^(c'/8) = (2^(c/8) + 1) / 2` (about `c - 8`), and at
//!   least one step less, so a counter of 1 reaches 0. With the auto period the pass costs
//!   1/100 of a list entry per access.
//!
//! ## Invariants
//! - Every live slot is in exactly one list, at `pos[slot]`, and `seg[slot]` names that list;
//!   an empty slot is in none.
//! - `victims` appends only live, unpinned slots, each once, at most `n` of them; it appends
//!   `min(n, unpinned live rows)` of them (a caller that gets fewer knows everything left is
//!   pinned).
//! - The same sequence of calls on policies built with the same seed gives the same victims.
//!
//! ## Costs
//! `on_insert`, `on_access`, `on_remove`, `on_move`: O(1) (amortised for the growth of the
//! per-slot vectors). `victims`: O(n × sample) draws, plus CLOCK steps that clear a bit (paid
//! for by the access that set it) or move a row (paid for by its insertion), plus at most
//! about three revolutions over pinned recency rows, plus the aging pass.

use std::cmp::Reverse;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

use super::Eviction;
use crate::index::fmix64;

/// App. D leaves the LRU/LFU split open; E.3 takes a quarter for recency: the rows of the
/// current pass (and the pinned working sets, which the caller sizes the budget for) churn
/// there, while three quarters keep the rows that stay hot across passes.
pub const DEFAULT_RECENCY_FRACTION: f64 = 0.25;
/// Rows drawn per victim. The least of 16 uniform draws is in the lowest 1/17 of the segment
/// on average and outside its lowest 25 % with probability 0.75^16 = 1 %; 16 draws are 16
/// cache misses, cheap next to the disk write an eviction costs.
pub const DEFAULT_SAMPLE: usize = 16;
/// With `age_every = 0`, counters halve every `AUTO_AGE_ROWS` × live rows accesses. E.3
/// proposes 10; 100 measured better. Between halvings a row with an average share of the
/// accesses gets 100 of them, so counts stay well past 1–3, where a log counter is coarse; a
/// row that goes cold loses half its count every 100 passes over the live rows. Benchmark 1
/// (Zipf 1.05, a cache of 7.5 % of the rows) shows why the period must be long: the rows at
/// the edge of the cache are used once per ~4,400 batches while the cache turns over every
/// ~1,300, so with a period of 10 passes (~500 batches) their counts age away before they
/// come back, and the policy cannot tell them from one-off rows: hit rate 0.756 with 10, 0.780
/// with 100 and with 1,000 (the static oracle for the same rows: 0.826).
pub const AUTO_AGE_ROWS: u64 = 100;

/// Which list a slot is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Seg {
    Empty,
    Recency,
    Frequency,
}

/// Slots at or above this are ignored: lists and positions are u32 (4 G rows per shard, far
/// past any memory budget: 4 G rows of 64 f32 are 1 TiB).
const SLOT_LIMIT: usize = u32::MAX as usize;

/// Mixed into the seed for the sampling generator, so that it and the access hash differ.
const RNG_SALT: u64 = 0x243f_6a88_85a3_08d3;
/// Odd multiplier (2^64 / golden ratio) spreading access numbers before the hash.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// CLOCK recency segment in front of a sampled-LFU frequency segment (spec E.3); see the
/// module docs for the structure.
pub struct LruLfu {
    recency_fraction: f64,
    sample: usize,
    age_every: u64,
    seed: u64,
    bit: Vec<AtomicU8>,
    freq: Vec<AtomicU8>,
    seg: Vec<Seg>,
    pos: Vec<u32>,
    born: Vec<u32>,
    recency: Vec<u32>,
    frequency: Vec<u32>,
    /// The CLOCK hand: an index into `recency` (wrapped lazily).
    hand: usize,
    /// Insertions so far (wrapping): the next `born`.
    inserts: u32,
    /// Accesses so far: the epoch clock for aging and the per-call input of the access hash.
    accesses: AtomicU64,
    /// `accesses` at the last aging period boundary.
    aged_at: u64,
    /// xorshift64* state for sampling; never 0.
    rng: u64,
    /// In an eviction round ([`Eviction::victim_round`]): the frequency entries the round's
    /// next call still draws from, `[0, k)` (the rest were chosen, refused or appended since
    /// the round opened); `None` outside a round.
    round: Option<usize>,
}

impl fmt::Debug for LruLfu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LruLfu")
            .field("recency_fraction", &self.recency_fraction)
            .field("sample", &self.sample)
            .field("age_every", &self.age_every)
            .field("slots", &self.seg.len())
            .field("recency", &self.recency.len())
            .field("frequency", &self.frequency.len())
            .field("accesses", &self.accesses.load(Relaxed))
            .finish()
    }
}

impl LruLfu {
    /// A policy with the given parameters, clamped as in
    /// [`EvictionConfig::build`](super::EvictionConfig::build).
    pub fn new(recency_fraction: f64, sample: usize, age_every: u64, seed: u64) -> Self {
        let recency_fraction = if recency_fraction.is_nan() {
            DEFAULT_RECENCY_FRACTION
        } else {
            recency_fraction.clamp(0.0, 1.0)
        };
        Self {
            recency_fraction,
            sample: sample.max(1),
            age_every,
            seed,
            bit: Vec::new(),
            freq: Vec::new(),
            seg: Vec::new(),
            pos: Vec::new(),
            born: Vec::new(),
            recency: Vec::new(),
            frequency: Vec::new(),
            hand: 0,
            inserts: 0,
            accesses: AtomicU64::new(0),
            aged_at: 0,
            rng: fmix64(seed ^ RNG_SALT) | 1,
            round: None,
        }
    }

    /// Rows held (live slots).
    pub fn len(&self) -> usize {
        self.recency.len() + self.frequency.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows in the recency segment (frequency rows accessed since their demotion count as
    /// frequency rows until sampling finds them).
    pub fn recency_len(&self) -> usize {
        self.recency.len()
    }

    fn live(&self, slot: usize) -> bool {
        self.seg.get(slot).is_some_and(|&s| s != Seg::Empty)
    }

    fn grow(&mut self, slot: usize) {
        if slot >= self.seg.len() {
            let n = slot + 1;
            // `resize_with` reserves with doubling, so growth is amortised O(1) per slot.
            self.bit.resize_with(n, || AtomicU8::new(0));
            self.freq.resize_with(n, || AtomicU8::new(0));
            self.seg.resize(n, Seg::Empty);
            self.pos.resize(n, 0);
            self.born.resize(n, 0);
        }
    }

    /// Appends `slot` to the list of `seg`.
    fn link(&mut self, slot: usize, seg: Seg) {
        let list = match seg {
            Seg::Recency => &mut self.recency,
            Seg::Frequency => &mut self.frequency,
            Seg::Empty => return,
        };
        self.pos[slot] = list.len() as u32;
        list.push(slot as u32);
        self.seg[slot] = seg;
    }

    /// Takes `slot` out of its list (the list's last entry fills the hole).
    fn unlink(&mut self, slot: usize) {
        let list = match self.seg[slot] {
            Seg::Recency => &mut self.recency,
            Seg::Frequency => &mut self.frequency,
            Seg::Empty => return,
        };
        let i = self.pos[slot] as usize;
        list.swap_remove(i);
        if let Some(&moved) = list.get(i) {
            self.pos[moved as usize] = i as u32;
        }
        self.seg[slot] = Seg::Empty;
    }

    /// Swaps the frequency-list entry at `i` to the end of the sampled range `[0, k)` and
    /// shrinks the range past it.
    fn exclude(&mut self, i: usize, k: &mut usize) {
        *k -= 1;
        self.frequency.swap(i, *k);
        self.pos[self.frequency[i] as usize] = i as u32;
        self.pos[self.frequency[*k] as usize] = *k as u32;
    }

    /// A uniform index below `k` (k > 0), from xorshift64*.
    fn rand_below(&mut self, k: usize) -> usize {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((u128::from(r) * k as u128) >> 64) as usize
    }

    /// The pass that ages every counter once a period of accesses has passed (module docs).
    fn age(&mut self) {
        let period = match self.age_every {
            0 => AUTO_AGE_ROWS * (self.len() as u64).max(1),
            every => every,
        };
        let elapsed = self.accesses.get_mut().wrapping_sub(self.aged_at);
        let periods = elapsed / period;
        if periods == 0 {
            return;
        }
        self.aged_at = self.aged_at.wrapping_add(periods * period);
        let table = halving_table(periods);
        for &slot in self.recency.iter().chain(&self.frequency) {
            let f = self.freq[slot as usize].get_mut();
            *f = table[usize::from(*f)];
        }
    }

    /// Moves unpinned, unused recency rows to the frequency segment by CLOCK until the
    /// recency segment holds at most `recency_fraction` of the live rows.
    fn sweep(&mut self, pinned: &dyn Fn(usize) -> bool) {
        let limit = (self.recency_fraction * self.len() as f64) as usize;
        while self.recency.len() > limit && self.clock_step(pinned).is_some() {}
    }

    /// Advances the CLOCK hand over the recency list until it moves one unpinned row whose
    /// bit is clear to the end of the frequency list (returned), clearing set bits on the
    /// way; `None` once a whole revolution met only pinned rows (or the list is empty).
    fn clock_step(&mut self, pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        // Steps since the hand last cleared a bit: past a whole revolution every row left is
        // pinned.
        let mut idle = 0;
        while !self.recency.is_empty() && idle <= self.recency.len() {
            if self.hand >= self.recency.len() {
                self.hand = 0;
            }
            let slot = self.recency[self.hand] as usize;
            let bit = self.bit[slot].get_mut();
            if *bit != 0 {
                *bit = 0;
                self.hand += 1;
                idle = 0;
            } else if pinned(slot) {
                self.hand += 1;
                idle += 1;
            } else {
                // The last entry fills the hole under the hand; the hand stays to look at it.
                self.unlink(slot);
                self.link(slot, Seg::Frequency);
                return Some(slot);
            }
        }
        None
    }

    /// One sampled-LFU victim from the frequency range `[0, k)`, or `None` once the range is
    /// empty. Draws that hit a pinned row shrink the range; draws that hit a row accessed
    /// since its demotion return it to the recency segment.
    fn sample_frequency(&mut self, k: &mut usize, pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        while *k > 0 {
            let mut best: Option<(u8, Reverse<u32>, usize)> = None;
            for _ in 0..self.sample {
                if *k == 0 {
                    break;
                }
                let i = self.rand_below(*k);
                let slot = self.frequency[i] as usize;
                if *self.bit[slot].get_mut() != 0 {
                    // Past the range first, so the entry that `unlink` moves into its place
                    // comes from past the range too.
                    self.exclude(i, k);
                    self.unlink(slot);
                    self.link(slot, Seg::Recency);
                } else {
                    let age = self.inserts.wrapping_sub(self.born[slot]);
                    let key = (*self.freq[slot].get_mut(), Reverse(age), slot);
                    if best.is_none_or(|b| (key.0, key.1) < (b.0, b.1)) {
                        best = Some(key);
                    }
                }
            }
            // Only the least of the draws is checked for a pin (a hash probe, paid once per
            // victim rather than per draw); a pinned one leaves the range and the draw is
            // made again.
            if let Some((_, _, slot)) = best {
                self.exclude(self.pos[slot] as usize, k);
                if !pinned(slot) {
                    return Some(slot);
                }
            }
        }
        None
    }

    /// Up to `m` victims from the recency segment by CLOCK; each moves to the end of the
    /// frequency list (past any sampled range).
    fn clock_victims(&mut self, m: usize, pinned: &dyn Fn(usize) -> bool, out: &mut Vec<usize>) {
        for _ in 0..m {
            match self.clock_step(pinned) {
                Some(slot) => out.push(slot),
                None => break,
            }
        }
    }
}

/// Counter steps per doubling of the count a Morris counter stands for: it goes up from `c`
/// with probability `2^(-c/8)`. LFU ranks mostly rows seen a handful of times, where a
/// base-2 counter (`2^-c`, 1 step per doubling) cannot tell 2 accesses from 3: in the
/// hit-rate test (Zipf 0.9, capacity 10k) it trails the exact reference by 1.65 points,
/// 8 steps by 0.33. 8 steps still reach 4.4 × 10^10 accesses in 8 bits, and the halving
/// that aging needs stays one table lookup.
pub const STEPS_PER_DOUBLING: u8 = 8;

/// `2^64 × 2^(-r/8)` for `r` in 0..8 (the first saturated to `u64::MAX`): a counter at `c`
/// goes up when 64 random bits fall below `BUMP_THRESHOLD[c % 8] >> (c / 8)`.
const BUMP_THRESHOLD: [u64; STEPS_PER_DOUBLING as usize] = [
    0xffff_ffff_ffff_ffff,
    0xeac0_c6e7_dd24_392e,
    0xd744_fcca_d69d_6af4,
    0xc567_2a11_5506_dadd,
    0xb504_f333_f9de_6484,
    0xa5fe_d6a9_b151_38ea,
    0x9837_f051_8db8_a96f,
    0x8b95_c1e3_ea8b_d6e6,
];

/// Whether a Morris counter at `c` goes up, given 64 random bits `h`: probability
/// `2^(-c/8)`.
#[inline]
fn morris_bump(h: u64, c: u8) -> bool {
    let (q, r) = (c / STEPS_PER_DOUBLING, c % STEPS_PER_DOUBLING);
    h < BUMP_THRESHOLD[r as usize] >> q
}

/// The counter that stands for half the count of `c`: the nearest `c'` with
/// `2^(c'/8) = (2^(c/8) + 1) / 2`, and at most `c - 1` so that every count fades to 0.
fn halved(c: u8) -> u8 {
    let steps = f64::from(STEPS_PER_DOUBLING);
    let exact = steps * (((f64::from(c) / steps).exp2() + 1.0) / 2.0).log2();
    (exact.round() as u8).min(c.saturating_sub(1))
}

/// `table[c]`: `c` halved `times` times.
fn halving_table(times: u64) -> [u8; 256] {
    let mut table: [u8; 256] = std::array::from_fn(|c| c as u8);
    // Every halving takes at least one step off, so 255 of them zero any counter.
    for _ in 0..times.min(255) {
        for t in &mut table {
            *t = halved(*t);
        }
    }
    table
}

impl Eviction for LruLfu {
    fn on_insert(&mut self, slot: usize) {
        if slot >= SLOT_LIMIT {
            debug_assert!(false, "slot {slot} past the policy's limit");
            return;
        }
        if self.live(slot) {
            self.unlink(slot);
        }
        self.grow(slot);
        *self.bit[slot].get_mut() = 1;
        *self.freq[slot].get_mut() = 0;
        self.born[slot] = self.inserts;
        self.inserts = self.inserts.wrapping_add(1);
        self.link(slot, Seg::Recency);
    }

    fn on_access(&self, slot: usize) {
        let (Some(bit), Some(freq)) = (self.bit.get(slot), self.freq.get(slot)) else {
            return;
        };
        // Read first: a set bit stays in a shared cache line instead of being written again.
        if bit.load(Relaxed) == 0 {
            bit.store(1, Relaxed);
        }
        let n = self.accesses.fetch_add(1, Relaxed);
        let c = freq.load(Relaxed);
        if c < u8::MAX && morris_bump(fmix64(self.seed ^ n.wrapping_mul(GOLDEN) ^ slot as u64), c) {
            // One try: losing a bump to a concurrent one is harmless, and a failed exchange
            // never moves the counter backwards.
            let _ = freq.compare_exchange(c, c + 1, Relaxed, Relaxed);
        }
    }

    fn on_remove(&mut self, slot: usize) {
        if self.live(slot) {
            self.unlink(slot);
        }
    }

    fn on_move(&mut self, from: usize, to: usize) {
        if from == to || !self.live(from) || to >= SLOT_LIMIT {
            return;
        }
        if self.live(to) {
            self.unlink(to);
        }
        self.grow(to);
        let seg = self.seg[from];
        let i = self.pos[from] as usize;
        match seg {
            Seg::Recency => self.recency[i] = to as u32,
            Seg::Frequency => self.frequency[i] = to as u32,
            Seg::Empty => return,
        }
        let (bit, freq) = (*self.bit[from].get_mut(), *self.freq[from].get_mut());
        *self.bit[to].get_mut() = bit;
        *self.freq[to].get_mut() = freq;
        self.born[to] = self.born[from];
        self.pos[to] = i as u32;
        self.seg[to] = seg;
        self.seg[from] = Seg::Empty;
    }

    fn victims(&mut self, n: usize, pinned: &dyn Fn(usize) -> bool, out: &mut Vec<usize>) {
        if n == 0 {
            return;
        }
        self.age();
        self.sweep(pinned);
        let mut taken = 0;
        // In a round, what earlier calls excluded (their victims, which the caller still
        // refuses, and pinned rows) stays out of the range: otherwise each call of a round
        // draws again every victim of the calls before it, and a round that takes most of
        // the segment in chunks costs the square of its victims.
        let mut k = self.round.map_or(self.frequency.len(), |k| k.min(self.frequency.len()));
        while taken < n {
            match self.sample_frequency(&mut k, pinned) {
                Some(slot) => {
                    out.push(slot);
                    taken += 1;
                }
                None => break,
            }
        }
        if self.round.is_some() {
            self.round = Some(k);
        }
        if taken < n {
            self.clock_victims(n - taken, pinned, out);
        }
    }

    fn victim_round(&mut self, open: bool) {
        self.round = open.then_some(usize::MAX);
    }

    fn bytes_per_slot(&self) -> usize {
        // bit + freq + seg + pos + born, plus the slot's entry in one list.
        2 * size_of::<AtomicU8>() + size_of::<Seg>() + 3 * size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use super::super::testkit::{
        hit_rate, never, test_seed, zipf_trace, Cache, ExactLru, PolicyCache, ACCESSES, CAPACITY,
        KEYS,
    };
    use super::super::EvictionConfig;
    use super::*;

    impl LruLfu {
        /// Checks the structure against the set of live slots the caller believes in.
        pub(crate) fn check(&self, live: &BTreeSet<usize>) -> std::result::Result<(), String> {
            let mut seen = BTreeSet::new();
            for (list, seg) in [(&self.recency, Seg::Recency), (&self.frequency, Seg::Frequency)] {
                for (i, &slot) in list.iter().enumerate() {
                    let slot = slot as usize;
                    if self.seg[slot] != seg || self.pos[slot] as usize != i {
                        return Err(format!("slot {slot} at {i} of {seg:?} list is out of place"));
                    }
                    if !seen.insert(slot) {
                        return Err(format!("slot {slot} is listed twice"));
                    }
                }
            }
            let marked: BTreeSet<usize> = (0..self.seg.len()).filter(|&s| self.live(s)).collect();
            if seen != *live || marked != *live {
                return Err(format!("listed {seen:?}, marked {marked:?}, live {live:?}"));
            }
            Ok(())
        }
    }

    #[test]
    fn config_is_checked_and_clamped() {
        assert!(EvictionConfig::default().validate().is_ok());
        let bad = EvictionConfig::LruLfu { recency_fraction: 1.5, sample: 16, age_every: 0 };
        let err = bad.validate().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(err.message(), "recency_fraction must be in [0, 1], got 1.5");
        let bad = EvictionConfig::LruLfu { recency_fraction: 0.5, sample: 0, age_every: 0 };
        assert_eq!(bad.validate().unwrap_err().message(), "sample must be at least 1, got 0");
        let p = LruLfu::new(f64::NAN, 0, 0, 0);
        assert_eq!((p.recency_fraction, p.sample), (DEFAULT_RECENCY_FRACTION, 1));
        assert_eq!(LruLfu::new(-3.0, 4, 0, 0).recency_fraction, 0.0);
    }

    #[test]
    fn cold_rows_go_before_hot_ones() {
        let seed = test_seed(7);
        // No recency segment: every row is demoted on the first victims() call. 64 draws
        // from at most 7 rows miss the last cold one with probability (4/5)^64 < 10^-6.
        let mut p = LruLfu::new(0.0, 64, 1 << 40, seed);
        for s in 0..8 {
            p.on_insert(s);
        }
        for s in 0..4 {
            for _ in 0..1000 {
                p.on_access(s);
            }
        }
        let mut out = Vec::new();
        p.victims(1, &never, &mut out); // clears the insertion bits, demotes 4..8
        p.on_remove(out[0]);
        p.victims(3, &never, &mut out);
        out.sort_unstable();
        assert_eq!(out, [4, 5, 6, 7]);
        // 1000 accesses stand for a counter of 8 log2(1000 (2^(1/8) - 1) + 1) = 52.
        assert!((46..=58).contains(p.freq[0].get_mut()), "counter {:?}", p.freq[0]);
    }

    #[test]
    fn an_access_returns_a_row_to_recency() {
        let seed = test_seed(11);
        let mut p = LruLfu::new(0.0, 16, 1 << 40, seed);
        for s in 0..4 {
            p.on_insert(s);
        }
        let mut out = Vec::new();
        p.victims(1, &never, &mut out); // the hand clears all bits, then demotes all four
        assert_eq!(p.recency_len(), 0);
        let first = out[0];
        p.on_remove(first);
        let hot = (0..4).find(|&s| s != first).unwrap();
        p.on_access(hot);
        out.clear();
        p.victims(2, &never, &mut out);
        assert!(!out.contains(&hot), "{out:?}");
        assert_eq!(p.seg[hot], Seg::Recency);
        // Pinned everywhere but `hot`: the recency fallback finds it (after clearing its bit).
        out.clear();
        p.victims(3, &|s| s != hot, &mut out);
        assert_eq!(out, [hot]);
    }

    /// Victims of one eviction in chunks, the caller refusing the earlier chunks' victims (still
    /// listed until it demotes them): the policy's work (here: how often it asks whether a
    /// slot is held) grows with the victims inside a round, with their square outside one.
    #[test]
    fn a_round_in_chunks_costs_what_its_victims_do() {
        fn chunked(round: bool) -> (usize, usize) {
            let mut p = LruLfu::new(0.0, 16, 1 << 40, test_seed(5));
            for s in 0..60_000 {
                p.on_insert(s);
            }
            let chosen = std::cell::RefCell::new(BTreeSet::new());
            let asked = std::cell::Cell::new(0usize);
            let held = |s: usize| {
                asked.set(asked.get() + 1);
                chosen.borrow().contains(&s)
            };
            if round {
                p.victim_round(true);
            }
            let mut out = Vec::new();
            while chosen.borrow().len() < 50_000 {
                out.clear();
                p.victims(1024, &held, &mut out);
                assert!(!out.is_empty());
                for &s in &out {
                    assert!(chosen.borrow_mut().insert(s), "slot {s} chosen twice");
                }
            }
            p.victim_round(false);
            let n = chosen.borrow().len();
            (n, asked.get())
        }
        let (n, with) = chunked(true);
        // One question per row the sweep demotes (60,000) and per victim.
        assert!(with <= 3 * n, "{with} questions for {n} victims in a round");
        let (_, without) = chunked(false);
        assert!(without > 10 * with, "without a round {without}, with {with}");
    }

    #[test]
    fn counters_halve_every_age_every_accesses() {
        let mut p = LruLfu::new(0.25, 16, 100, 3);
        p.on_insert(0);
        p.on_insert(1);
        // 80 stands for (2^10 - 1) / (2^(1/8) - 1) = 11303 accesses; 3 halvings: 1413 → 56.
        *p.freq[0].get_mut() = 80;
        for _ in 0..99 {
            p.on_access(1); // 99 accesses: the period has not passed
        }
        let before = *p.freq[1].get_mut();
        let mut out = Vec::new();
        p.victims(1, &|_| true, &mut out);
        assert_eq!(*p.freq[0].get_mut(), 80);
        for _ in 0..201 {
            p.on_access(1); // 300 in all: three periods
        }
        let after_bumps = *p.freq[1].get_mut();
        assert!(after_bumps >= before);
        p.victims(1, &|_| true, &mut out);
        assert_eq!(*p.freq[0].get_mut(), 56);
        assert_eq!(*p.freq[1].get_mut(), halving_table(3)[usize::from(after_bumps)]);
        assert!(out.is_empty());
    }

    #[test]
    fn morris_constants_match_their_formula() {
        for (r, &t) in BUMP_THRESHOLD.iter().enumerate() {
            let want = (-(r as f64) / f64::from(STEPS_PER_DOUBLING)).exp2() * 2f64.powi(64);
            assert!((t as f64 / want - 1.0).abs() < 1e-12, "r = {r}: {t:#x} vs {want}");
        }
        // Halving: about 8 steps off high counters, exactly one off the lowest, 0 stays.
        assert_eq!((halved(0), halved(1), halved(2), halved(3)), (0, 0, 1, 2));
        assert_eq!((halved(80), halved(255)), (72, 247));
        assert!((1..=255).all(|c| halved(c) < c));
        assert_eq!(halving_table(255), [0; 256]);
        // Counts reached by bumping agree with the formula: 4096 accesses → about 68.
        let mut p = LruLfu::new(0.25, 16, 1 << 40, test_seed(99));
        p.on_insert(0);
        for _ in 0..4096 {
            p.on_access(0);
        }
        let c = *p.freq[0].get_mut();
        assert!((62..=74).contains(&c), "counter {c}");
    }

    #[test]
    fn a_move_carries_the_row_state() {
        let mut p = LruLfu::new(0.0, 16, 1 << 40, 5);
        for s in 0..3 {
            p.on_insert(s);
        }
        for _ in 0..100 {
            p.on_access(2);
        }
        let freq = *p.freq[2].get_mut();
        p.on_move(2, 10);
        assert!(!p.live(2) && p.live(10));
        assert_eq!(*p.freq[10].get_mut(), freq);
        p.check(&BTreeSet::from([0, 1, 10])).unwrap();
        let mut out = Vec::new();
        p.victims(2, &never, &mut out);
        out.sort_unstable();
        assert_eq!(out, [0, 1]);
    }

    /// Exact "LRU in front of LFU" (App. D): an LRU of `recency` keys whose evictees go to an
    /// LFU ordered by (exact accesses since the key entered the cache, insertion number); a
    /// hit in the LFU moves the key back to the LRU; a miss in a full cache evicts the LFU
    /// minimum (the LRU tail when the LFU is empty).
    struct ExactLruLfu {
        capacity: usize,
        recency: usize,
        tick: u64,
        lru: BTreeMap<u64, u32>,
        lfu: BTreeSet<(u64, u64, u32)>,
        /// key → (last-access tick, count, insertion number, in the LRU)
        state: HashMap<u32, (u64, u64, u64, bool)>,
    }

    impl ExactLruLfu {
        fn demote_overflow(&mut self) {
            while self.lru.len() > self.recency {
                let (_, k) = self.lru.pop_first().unwrap();
                let st = self.state.get_mut(&k).unwrap();
                st.3 = false;
                self.lfu.insert((st.1, st.2, k));
            }
        }
    }

    impl Cache for ExactLruLfu {
        fn access(&mut self, key: u32) -> bool {
            self.tick += 1;
            let hit = if let Some(st) = self.state.get_mut(&key) {
                if st.3 {
                    self.lru.remove(&st.0);
                } else {
                    self.lfu.remove(&(st.1, st.2, key));
                }
                st.0 = self.tick;
                st.1 += 1;
                st.3 = true;
                true
            } else {
                if self.state.len() == self.capacity {
                    let victim = match self.lfu.pop_first() {
                        Some((_, _, k)) => k,
                        None => self.lru.pop_first().unwrap().1,
                    };
                    self.state.remove(&victim);
                }
                self.state.insert(key, (self.tick, 1, self.tick, true));
                false
            };
            self.lru.insert(self.tick, key);
            self.demote_overflow();
            hit
        }
    }

    #[test]
    fn hit_rate_is_near_the_exact_lru_lfu() {
        let seed = test_seed(0x21bf_0a57);
        let config = EvictionConfig::default();
        let EvictionConfig::LruLfu { recency_fraction, .. } = config else { unreachable!() };
        for s in [0.9, 1.05] {
            let trace = zipf_trace(s, KEYS, ACCESSES, seed);
            let ours = hit_rate(&mut PolicyCache::new(config.build(seed), CAPACITY), &trace);
            let lru = hit_rate(&mut ExactLru::new(CAPACITY), &trace);
            let reference = hit_rate(
                &mut ExactLruLfu {
                    capacity: CAPACITY,
                    recency: (recency_fraction * CAPACITY as f64) as usize,
                    tick: 0,
                    lru: BTreeMap::new(),
                    lfu: BTreeSet::new(),
                    state: HashMap::new(),
                },
                &trace,
            );
            eprintln!(
                "zipf({s}) {ACCESSES} accesses over {KEYS} keys, capacity {CAPACITY}: \
                 LruLfu {:.2} %, exact LRU→LFU {:.2} %, exact LRU {:.2} %",
                100.0 * ours,
                100.0 * reference,
                100.0 * lru
            );
            assert!(ours >= reference - 0.02, "zipf({s}): {ours} vs exact LRU→LFU {reference}");
            assert!(ours >= lru - 0.01, "zipf({s}): {ours} vs exact LRU {lru}");
        }
    }
}
