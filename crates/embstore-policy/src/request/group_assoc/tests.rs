//! [`super::GroupAssoc`]'s tests: the rules, aging, the adaptive default, and seeded random
//! traces against the contract.

use super::*;
use crate::rng::SplitMix64;
use proptest::prelude::*;
use std::collections::HashMap;

fn cfg(s: u8) -> GroupAssocConfig {
    GroupAssocConfig {
        max_score: s,
        age_alpha: None,
        rule: Some(Rule::Group),
        ..GroupAssocConfig::default()
    }
}

const RULES: [Option<Rule>; 4] =
    [None, Some(Rule::Group), Some(Rule::GroupAdmit), Some(Rule::Clock)];

/// Perfect hits of `trace`'s second half after warming on the first.
fn perfect_share(p: &mut GroupAssoc, trace: &[Vec<u64>]) -> f64 {
    let half = trace.len() / 2;
    let mut perfect = 0;
    for (n, req) in trace.iter().enumerate() {
        let o = p.access_request(req);
        perfect += usize::from(n >= half && o.is_perfect());
    }
    perfect as f64 / (trace.len() - half) as f64
}

/// Two traces that want different rules: a skewed static popularity cut by one-time scans
/// (the admission filter keeps the scans out) and a working set that slides (recency).
/// The adaptive default comes within 10 % of the best fixed rule on each, and its choice
/// is the best one where the gap between rules is large.
#[test]
fn adaptive_follows_the_best_rule_on_traces_that_want_different_ones() {
    let seed = 0x5eed_ada9;
    println!("seed {seed:#x}");
    let mut rng = SplitMix64::new(seed);
    let mut scan_key = 1u64 << 40;
    let skewed: Vec<Vec<u64>> = (0..60_000)
        .map(|i| {
            if i % 3 == 0 {
                (0..4)
                    .map(|_| {
                        scan_key += 1;
                        scan_key
                    })
                    .collect()
            } else {
                (0..4)
                    .map(|t| {
                        (t << 32)
                            | ((rng.below(1 << 20) as f64 / f64::from(1u32 << 20)).powi(3) * 4000.0)
                                as u64
                    })
                    .collect()
            }
        })
        .collect();
    let sliding: Vec<Vec<u64>> = (0..60_000u64)
        .map(|i| (0..4).map(|t| (t << 32) | (i / 20 + rng.below(300))).collect())
        .collect();
    for (name, trace, want) in
        [("skewed+scans", &skewed, Rule::GroupAdmit), ("sliding", &sliding, Rule::Clock)]
    {
        let shares: Vec<(Option<Rule>, f64, Rule)> = RULES
            .iter()
            .map(|&rule| {
                let c = GroupAssocConfig { max_score: 4, rule, ..GroupAssocConfig::default() };
                let mut p = GroupAssoc::new(2048, c).unwrap();
                let share = perfect_share(&mut p, trace);
                p.check_invariants().unwrap();
                (rule, share, p.rule())
            })
            .collect();
        println!("{name}: {shares:?}");
        let best = shares[1..].iter().map(|s| s.1).fold(0.0, f64::max);
        let (_, adaptive, chosen) = shares[0];
        assert!(adaptive >= 0.9 * best, "{name}: adaptive {adaptive} vs best {best}");
        assert_eq!(chosen, want, "{name}: {shares:?}");
    }
}

#[test]
fn max_rule_hit_counter_and_hand_ties() {
    // One set of 3 ways (capacity < ways), S = 3, no aging.
    let mut p = GroupAssoc::new(3, cfg(3)).unwrap();
    assert_eq!(p.sets(), 1);
    let o = p.access_request(&[1, 2, 3]); // cold: h = 0, all at score 0 in ways 0, 1, 2
    assert_eq!((o.hits, o.admitted), (0, 3));
    assert_eq!([1, 2, 3].map(|k| p.slot_of(k)), [Some(0), Some(1), Some(2)]);
    // [1,2,4]: h = 2, s = 2: 1 and 2 rise to 2 (one hit each); 4 takes the only unpinned
    // way (3's), enters at its siblings' score 2.
    let o = p.access_request(&[1, 2, 4]);
    assert_eq!(o.hit, vec![true, true, false]);
    assert_eq!((o.evicted.clone(), o.evicted_slots.clone()), (vec![3], vec![2]));
    assert_eq!(p.slot_of(4), Some(2));
    assert_eq!(
        (p.score(1), p.hits(1), p.score(4), p.hits(4)),
        (Some(2), Some(1), Some(2), Some(0))
    );
    // [5]: priorities (30·score + S·hits) 1: 63, 2: 63, 4: 60 -> 4 goes (the hit counter
    // breaks the tie).
    let o = p.access_request(&[5]);
    assert_eq!(o.evicted, vec![4]);
    assert_eq!(p.score(5), Some(0));
    // [1,2,5] is perfect: everything to S.
    let o = p.access_request(&[1, 2, 5]);
    assert!(o.is_perfect());
    assert_eq!([1, 2, 5].map(|k| p.score(k)), [Some(3); 3]);
    // Priorities 1 and 2: 90 + 3·2 = 96; 5: 90 + 3·1 = 93: 5 goes; then 1 and 2 tie at 96
    // and the hand (past 5's way 2, so at way 0) takes way 0 = key 1 first.
    let o = p.access_request(&[6]);
    assert_eq!(o.evicted, vec![5]);
    p.access_request(&[6]); // 6: score 3 (h = 1 of 1), hits 1: priority 93 < 96
    let o = p.access_request(&[7, 8]);
    assert_eq!(o.evicted, vec![6, 1]);
    p.check_invariants().unwrap();
}

#[test]
fn group_hits_elsewhere_raise_the_score() {
    let mut p = GroupAssoc::new(8, cfg(4)).unwrap();
    let mut out = RequestOutcome::default();
    // Two keys here, two more of the request hit in another tier: h = 2 of 4, s = 2.
    p.access_group_into(&[1, 2], Group { other_hits: 2, size: 4 }, &mut out);
    assert_eq!((p.score(1), p.score(2)), (Some(2), Some(2)));
    p.access_group_into(&[1, 2], Group { other_hits: 2, size: 4 }, &mut out);
    assert!(out.is_perfect());
    assert_eq!(p.score(1), Some(4));
}

#[test]
fn admit_takes_the_lowest_and_reports_its_slot() {
    let mut p = GroupAssoc::new(2, cfg(4)).unwrap();
    let mut out = RequestOutcome::default();
    p.admit(10, 3, &mut out);
    p.admit(11, 1, &mut out);
    assert_eq!(out.admitted, 1);
    p.admit(11, 4, &mut out); // resident: nothing happens
    assert_eq!((out.admitted, p.score(11)), (0, Some(1)));
    p.admit(12, 9, &mut out); // score capped at S; evicts 11 (score 1)
    assert_eq!((out.evicted.clone(), out.evicted_slots.clone()), (vec![11], vec![1]));
    assert_eq!((p.slot_of(12), p.score(12)), (Some(1), Some(4)));
    p.check_invariants().unwrap();
}

#[test]
fn lazy_aging_halves_scores_and_counters() {
    // α = 1 with C = 4: a step every 4 admissions.
    let c = GroupAssocConfig { age_alpha: Some(1.0), ..cfg(4) };
    let mut p = GroupAssoc::new(4, c).unwrap();
    p.access_request(&[1, 2]);
    p.access_request(&[1, 2]); // perfect: score 4, one hit each
    p.access_request(&[3]);
    assert_eq!((p.score(1), p.hits(1), p.stats().aging_steps), (Some(4), Some(1), 0));
    p.access_request(&[4]); // fourth admission: every score halves
    assert_eq!(p.stats().aging_steps, 1);
    assert_eq!((p.score(1), p.hits(1), p.score(4)), (Some(2), Some(0), Some(0)));
    p.check_invariants().unwrap();
}

#[test]
fn an_adaptive_sketch_counts_only_keys_of_sets_that_have_filled() {
    let mut p = GroupAssoc::new(4096, GroupAssocConfig::default()).unwrap();
    assert!(p.adaptive.is_some() && p.sketch.is_some());
    let counted = |p: &GroupAssoc| p.sketch.as_ref().unwrap().counted_any();
    // 1,300 keys over 128 sets of 32 ways: no set fills, nothing is counted.
    for r in 0..50u64 {
        let keys: Vec<u64> = (0..26).map(|j| r * 26 + j).collect();
        p.access_request(&keys);
    }
    assert_eq!(p.stats().evictions, 0);
    assert!(!counted(&p), "a cache that never filled a set counted keys");
    for r in 50..1000u64 {
        let keys: Vec<u64> = (0..26).map(|j| r * 26 + j).collect();
        p.access_request(&keys);
    }
    assert!(p.stats().evictions > 0 && counted(&p));
    // A fixed admission rule counts from the first request.
    let c = GroupAssocConfig { rule: Some(Rule::GroupAdmit), ..GroupAssocConfig::default() };
    let mut p = GroupAssoc::new(4096, c).unwrap();
    p.access_request(&[1, 2, 3]);
    assert!(counted(&p));
    p.check_invariants().unwrap();
}

#[test]
fn metadata_is_about_ten_bytes_per_entry() {
    // A fixed rule: 10 B. Adaptive (the default): + the frequency sketch (2–4 B) + the
    // shadows of a quarter of the sets at most (3 × 10 B / 4 + a sketch): ~22 B for a
    // thousand entries, ~12 B for a million.
    for (rule, small, large) in [(Some(Rule::Group), 10.5, 10.5), (None, 22.5, 22.5)] {
        for cap in [1_000, 1_024, 14_429, 100_000, 1 << 20] {
            let c = GroupAssocConfig { rule, ..GroupAssocConfig::default() };
            let mut p = GroupAssoc::new(cap, c).unwrap();
            let keys: Vec<u64> = (0..26).collect();
            p.access_request(&keys); // the request's marks grow to G
            let b = p.metadata_bytes_per_entry();
            eprintln!("group-assoc {rule:?} capacity {cap}: {b:.2} B/entry");
            let limit = if p.sets() < 32 { small } else { large };
            assert!((10.0..=limit).contains(&b), "{rule:?} capacity {cap}: {b} B/entry");
        }
    }
}

#[test]
fn bad_parameters_are_typed_errors() {
    for c in [
        GroupAssocConfig { ways: 0, ..Default::default() },
        GroupAssocConfig { ways: MAX_WAYS + 1, ..Default::default() },
        GroupAssocConfig { max_score: 0, ..Default::default() },
        GroupAssocConfig { age_alpha: Some(f64::NAN), ..Default::default() },
    ] {
        let e = GroupAssoc::new(10, c).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
    }
    assert!(GroupAssoc::new(0, GroupAssocConfig::default()).is_err());
}

#[test]
fn sets_partition_the_capacity() {
    for (cap, ways) in [(1, 1), (5, 32), (32, 32), (33, 32), (63, 32), (64, 32), (1_000, 7)] {
        let p = GroupAssoc::new(cap, GroupAssocConfig { ways, ..Default::default() }).unwrap();
        let mut next = 0;
        for s in 0..p.sets() {
            let r = p.set_slots(s);
            assert_eq!(r.start, next);
            assert!(p.sets() == 1 || (ways..2 * ways).contains(&r.len()), "{cap} {ways}");
            next = r.end;
        }
        assert_eq!(next, cap);
    }
}

/// A plain model of the same policy, written from the module docs: each set a `Vec` of
/// `Option<(key, score, hits)>`, eager aging of every entry, linear scans. Used to check
/// the lazy per-set aging, the epoch rebase and the hand.
/// A model set: its first slot, its ways (`(key, score, hits)` or empty) and its hand.
type ModelSet = (usize, Vec<Option<(u64, u8, u8)>>, usize);

struct Model {
    cfg: GroupAssocConfig,
    sets: Vec<ModelSet>,
    period: Option<u64>,
    admissions: u64,
}

impl Model {
    fn new(p: &GroupAssoc) -> Self {
        let sets = (0..p.sets())
            .map(|s| {
                let r = p.set_slots(s);
                (r.start, vec![None; r.len()], 0)
            })
            .collect();
        Self { cfg: p.cfg.clone(), sets, period: p.age_period, admissions: 0 }
    }

    fn find(&self, s: usize, key: u64) -> Option<usize> {
        self.sets[s].1.iter().position(|w| matches!(w, Some((k, _, _)) if *k == key))
    }

    /// (hit flags, evicted keys, evicted slots, bypassed)
    fn access(&mut self, p: &GroupAssoc, keys: &[u64]) -> (Vec<bool>, Vec<u64>, Vec<u32>, bool) {
        let hit: Vec<bool> = keys.iter().map(|&k| self.find(p.set_of(k), k).is_some()).collect();
        let g = keys.len();
        let h = hit.iter().filter(|&&x| x).count();
        let s = score_of(h, g, self.cfg.max_score);
        let mut pinned: Vec<u64> = if self.cfg.pin_request {
            keys.iter().zip(&hit).filter(|(_, &x)| x).map(|(&k, _)| k).collect()
        } else {
            Vec::new()
        };
        let (mut ev, mut ev_slots, mut bypassed) = (Vec::new(), Vec::new(), false);
        for &k in keys {
            let set = p.set_of(k);
            if let Some(j) = self.find(set, k) {
                let e = self.sets[set].1[j].as_mut().unwrap();
                e.1 = e.1.max(s);
                e.2 = (e.2 + 1).min(15);
                continue;
            }
            let (first, ways, hand) = &mut self.sets[set];
            let n = ways.len();
            let mut best: Option<(u16, usize)> = None;
            for step in 0..n {
                let j = (*hand + step) % n;
                match ways[j] {
                    None => {
                        best = Some((0, j));
                        break;
                    }
                    Some((key, sc, hits)) => {
                        if pinned.contains(&key) {
                            continue;
                        }
                        let pr = if self.cfg.count_hits {
                            30 * u16::from(sc) + u16::from(self.cfg.max_score) * u16::from(hits)
                        } else {
                            u16::from(sc)
                        };
                        if best.is_none_or(|(b, _)| pr < b) {
                            best = Some((pr, j));
                        }
                    }
                }
            }
            let Some((_, j)) = best else {
                bypassed = true;
                continue;
            };
            *hand = (j + 1) % n;
            if let Some((key, _, _)) = ways[j] {
                ev.push(key);
                ev_slots.push((*first + j) as u32);
            }
            ways[j] = Some((k, s, 0));
            if self.cfg.pin_request {
                pinned.push(k);
            }
            self.admissions += 1;
        }
        if let Some(per) = self.period {
            if self.admissions >= per {
                self.admissions = 0;
                for (_, ways, _) in &mut self.sets {
                    for (_, sc, hits) in ways.iter_mut().flatten() {
                        *sc >>= 1;
                        *hits >>= 1;
                    }
                }
            }
        }
        (hit, ev, ev_slots, bypassed)
    }
}

/// Runs `trace` through the policy, the model, and a resident-set ledger, checking after
/// every request: probe-first flags, victims and their slots, slot stability and
/// uniqueness, capacity, scores, invariants, and that the probe is pure.
fn check_trace(cap: usize, c: GroupAssocConfig, trace: &[Vec<u64>]) -> Result<(), String> {
    let mut p = GroupAssoc::new(cap, c.clone()).map_err(|e| e.to_string())?;
    let mut m = Model::new(&p);
    let mut slots: HashMap<u64, u32> = HashMap::new(); // the ledger: resident key -> slot
    let mut flags = Vec::new();
    for (n, req) in trace.iter().enumerate() {
        let ctx = |what: &str| format!("request {n} {req:?}: {what}");
        p.probe(req, &mut flags);
        let want: Vec<bool> = req.iter().map(|k| slots.contains_key(k)).collect();
        if flags != want {
            return Err(ctx(&format!("probe {flags:?}, ledger says {want:?}")));
        }
        let o = p.access_request(req);
        let (mh, mev, mslots, mby) = m.access(&p, req);
        if o.hit != want || o.hits != want.iter().filter(|&&x| x).count() {
            return Err(ctx("hit flags are not probe-first"));
        }
        // The model is the group rule's; the other rules keep the rest of the contract.
        if p.rule() == Rule::Group
            && c.rule == Some(Rule::Group)
            && (o.hit.clone(), o.evicted.clone(), o.evicted_slots.clone(), o.bypassed)
                != (mh, mev, mslots, mby || overflowed(&p, req))
        {
            return Err(ctx(&format!("outcome {o:?} differs from the model")));
        }
        // Each victim resident before the request held exactly the slot reported (keys
        // admitted and evicted again within the request, possible without pinning, are
        // checked against the model above).
        for (&k, &s) in o.evicted.iter().zip(&o.evicted_slots) {
            if let Some(prev) = slots.remove(&k) {
                if prev != s {
                    return Err(ctx(&format!("{k} evicted from slot {s}, it held {prev}")));
                }
            }
        }
        // Slot stability: every ledger key still resident kept its slot.
        for (&k, &s) in &slots {
            if p.slot_of(k) != Some(s) {
                return Err(ctx(&format!("{k} moved or vanished from slot {s}")));
            }
        }
        for (j, &k) in req.iter().enumerate() {
            let reported = o.slots.get(j).copied().filter(|&s| s != NO_SLOT);
            if reported != p.slot_of(k) || o.slots.len() != req.len() {
                return Err(ctx(&format!(
                    "{k}: slot reported {reported:?}, holds {:?}",
                    p.slot_of(k)
                )));
            }
            if let Some(s) = p.slot_of(k) {
                slots.insert(k, s);
            }
        }
        // Slots unique and below the capacity; len and capacity.
        let mut seen = vec![false; cap];
        for &s in slots.values() {
            if s as usize >= cap || std::mem::replace(&mut seen[s as usize], true) {
                return Err(ctx(&format!("slot {s} out of range or shared")));
            }
        }
        if slots.len() != p.len() || p.len() > cap {
            return Err(ctx(&format!("ledger {} keys, policy {}", slots.len(), p.len())));
        }
        for &k in slots.keys() {
            if p.score(k).is_none_or(|s| s > c.max_score) {
                return Err(ctx(&format!("score of {k} out of range")));
            }
        }
        p.check_invariants().map_err(|e| ctx(&e))?;
        // With pinning and the request fitting one set, the request stays resident.
        let mut distinct = req.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // (The admission filter may keep a missing key out: that request is a bypass.)
        if c.pin_request
            && p.rule() != Rule::GroupAdmit
            && p.sets() == 1
            && distinct.len() <= cap
            && !req.iter().all(|&k| p.contains(k))
        {
            return Err(ctx("a key of the request is not resident after it"));
        }
    }
    Ok(())
}

fn random_case(seed: u64) -> (usize, GroupAssocConfig, Vec<Vec<u64>>) {
    let mut rng = SplitMix64::new(seed);
    let cap = 1 + rng.below(80) as usize;
    let g = 1 + rng.below(8) as usize;
    let universe = 2 + rng.below(120);
    let c = GroupAssocConfig {
        max_score: 1 + rng.below(8) as u8,
        ways: [1, 2, 4, 8, 32][rng.below(5) as usize],
        age_alpha: [None, Some(0.1), Some(0.5), Some(2.0)][rng.below(4) as usize],
        count_hits: rng.below(3) != 0,
        pin_request: rng.below(4) != 0,
        rule: RULES[rng.below(4) as usize],
    };
    // Skewed keys (squares of uniforms) so some keys recur and reach high scores.
    let trace = (0..400)
        .map(|_| {
            (0..g)
                .map(|_| {
                    let u = rng.below(universe * universe);
                    (u as f64).sqrt() as u64 * 1_000_003
                })
                .collect()
        })
        .collect();
    (cap, c, trace)
}

/// Random traces from printed seeds (replay one with `EMBSTORE_CACHE_SEED=<seed>`):
/// every check of `check_trace`, then determinism (a second run gives the same outcomes).
#[test]
fn seeded_random_traces_keep_the_contract() {
    let seeds: Vec<u64> = match std::env::var("EMBSTORE_CACHE_SEED") {
        Ok(s) => vec![s.parse().expect("EMBSTORE_CACHE_SEED must be a u64")],
        Err(_) => (0..60).collect(),
    };
    for seed in seeds {
        let (cap, c, trace) = random_case(seed);
        println!("seed {seed}: capacity {cap}, {c:?}");
        if let Err(e) = check_trace(cap, c.clone(), &trace) {
            panic!("seed {seed} (replay: EMBSTORE_CACHE_SEED={seed}), cap {cap}, {c:?}: {e}");
        }
        let run = || {
            let mut p = GroupAssoc::new(cap, c.clone()).unwrap();
            trace.iter().map(|r| p.access_request(r)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run(), "seed {seed}: not deterministic");
    }
}

#[test]
fn many_aging_steps_rebase_epochs() {
    // α small enough for > 2 × 128 aging steps: the lazy lag must never wrap.
    let c = GroupAssocConfig { age_alpha: Some(0.05), ways: 4, ..cfg(5) };
    let mut rng = SplitMix64::new(99);
    let trace: Vec<Vec<u64>> =
        (0..3_000).map(|_| (0..3).map(|_| rng.below(200)).collect()).collect();
    check_trace(40, c.clone(), &trace).unwrap();
    let mut p = GroupAssoc::new(40, c).unwrap();
    for r in &trace {
        p.access_request(r);
    }
    assert!(p.stats().aging_steps > 300, "{:?}", p.stats());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// The same checks on proptest's traces, duplicates within a request included.
    #[test]
    fn keeps_the_contract(
        cap in 1usize..24,
        ways in prop::sample::select(vec![1usize, 2, 3, 8, 32]),
        max_score in 1u8..6,
        alpha in prop::option::of(prop::sample::select(vec![0.25, 1.0])),
        count_hits in any::<bool>(),
        pin_request in any::<bool>(),
        rule in prop::sample::select(RULES.to_vec()),
        trace in prop::collection::vec(prop::collection::vec(0u64..30, 1..7), 1..80),
    ) {
        let c = GroupAssocConfig {
            max_score, ways, age_alpha: alpha, count_hits, pin_request, rule
        };
        check_trace(cap, c, &trace).map_err(TestCaseError::fail)?;
    }
}
