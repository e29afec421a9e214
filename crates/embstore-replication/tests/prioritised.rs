//! Prioritised sync in simulation: a primary scores its writes with the default priority rule,
//! a DC leader and a follower pull normally and (while "congested") prioritised, with replies
//! lost, duplicated, delayed and reordered, and priority switched off and on at random. After
//! every step the invariants of Ekko Alg 2 hold (spec §5.4: P1–P5); at the end, normal sync
//! alone converges every replica to the primary's rows with empty significant stores (normal
//! sync never stops: eventual consistency). Every run names its seed (`EMBSTORE_SEED=N`
//! replays one).

use embstore_common::SplitMix64;
use embstore_replication::{
    EkkoPriority, PartMap, Prioritiser, PriorityConfig, Replica, Update, Vv,
};

const DIM: usize = 2;
const PARTS: u32 = 4;
const KEYS: u64 = 64;

enum Msg {
    Normal(usize, embstore_replication::Reply),
    Prioritised(usize, embstore_replication::PrioritisedReply),
}

fn check(r: &Replica, who: &str) -> Result<(), String> {
    for part in 0..r.parts() {
        let s = r.sync(part).map_err(|e| e.to_string())?;
        // P1
        if !s.vv.dominates(&s.svv) {
            return Err(format!("P1: {who} part {part}: svv {:?} not under vv {:?}", s.svv, s.vv));
        }
        if !s.tsvv.dominates(&s.svv) {
            return Err(format!(
                "P1: {who} part {part}: svv {:?} not under tsvv {:?}",
                s.svv, s.tsvv
            ));
        }
        // P2, and P4 when priority is off
        let store: std::collections::BTreeMap<u64, embstore_replication::Row> =
            r.rows(part).unwrap().map(|(k, row)| (k, row.clone())).collect();
        for (k, sig) in r.significant(part).unwrap() {
            if !r.priority() {
                return Err(format!("P4: {who} has priority off and a significant entry {k}"));
            }
            if store.get(&k).is_some_and(|row| sig.version <= row.version) {
                return Err(format!("P2: {who} key {k}: significant entry at or below the store"));
            }
            // P3: a read is the newer copy
            if r.read(k).map(|x| x.version) != Some(sig.version) {
                return Err(format!("P3: {who} key {k}: read is not the significant entry"));
            }
        }
        if !r.priority() && s.tsvv != s.svv {
            return Err(format!(
                "P4: {who} has priority off and tsvv {:?} != svv {:?}",
                s.tsvv, s.svv
            ));
        }
        // P5 (differential): the index's selection equals a scan of the sigv column, for the
        // knowledge of every other replica and for nothing known.
        if r.priority() {
            for tsvv in [Vv::new(), s.svv.clone(), s.tsvv.clone()] {
                let by_index = r.serve_prioritised(part, &tsvv).unwrap().rows;
                let by_scan = r.scan_prioritised(part, &tsvv).unwrap();
                if by_index != by_scan {
                    return Err(format!(
                        "P5: {who} part {part}: index selected {:?}, scan {:?}",
                        by_index.iter().map(|e| e.0).collect::<Vec<_>>(),
                        by_scan.iter().map(|e| e.0).collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    Ok(())
}

fn run(seed: u64) -> Result<(usize, usize), String> {
    let mut rng = SplitMix64::new(seed);
    let map = PartMap::new(1, PARTS).unwrap();
    // 0: the primary (trains), 1: a DC leader pulling from it, 2: a follower of the leader.
    let mut r: Vec<Replica> = (0..3).map(|i| Replica::new(i, map, DIM).unwrap()).collect();
    let names = ["primary", "leader", "follower"];
    let source = [None, Some(0usize), Some(1usize)];
    let mut pr =
        Prioritiser::new(PriorityConfig::with_k(90.0), std::sync::Arc::new(EkkoPriority)).unwrap();
    let mut in_flight: Vec<Msg> = Vec::new();
    let mut created = std::collections::HashMap::new();
    let (mut sig_writes, mut taken_ahead) = (0usize, 0usize);
    for step in 0..600u64 {
        let now = step * 10;
        let what = rng.below(100);
        let ctx = |e: String| format!("seed {seed} step {step}: {e}");
        if what < 40 {
            // The primary writes a few rows, scored.
            for _ in 0..1 + rng.below(4) {
                let key = rng.below(KEYS);
                let age = created.get(&key).map(|t: &u64| now - t);
                created.entry(key).or_insert(now);
                let writes = age.map_or(0, |_| 1);
                let u = Update { key, grad_l1: rng.normal().exp(), age_ms: age, writes, model: 0 };
                let s = pr.score(&u, now);
                sig_writes += s.significant as usize;
                let v = r[0]
                    .write_scored(key, vec![step as f32; DIM], now, s.significant)
                    .map_err(|e| ctx(e.to_string()))?;
                let row = r[0].read(key).unwrap();
                // P6: a significant write's row carries sigv = v.
                if s.significant && row.sigv != v {
                    return Err(ctx(format!(
                        "P6: key {key} written significantly at {v:?} has sigv {:?}",
                        row.sigv
                    )));
                }
            }
        } else if what < 65 {
            // A normal pull by the leader or the follower.
            let to = 1 + rng.below(2) as usize;
            let from = source[to].unwrap();
            let part = rng.below(PARTS as u64) as u32;
            let vv = r[to].sync(part).unwrap().vv.clone();
            let reply = r[from].serve_pull(part, &vv).map_err(|e| ctx(e.to_string()))?;
            in_flight.push(Msg::Normal(to, reply));
        } else if what < 85 {
            // A prioritised pull (the link is congested), when both ends prioritise.
            let to = 1 + rng.below(2) as usize;
            let from = source[to].unwrap();
            let part = rng.below(PARTS as u64) as u32;
            if r[to].priority() && r[from].priority() {
                let tsvv = r[to].sync(part).unwrap().tsvv.clone();
                let reply =
                    r[from].serve_prioritised(part, &tsvv).map_err(|e| ctx(e.to_string()))?;
                in_flight.push(Msg::Prioritised(to, reply));
            }
        } else if what < 97 {
            // Deliver a reply in flight: any of them (reordered), maybe twice, maybe lost.
            if !in_flight.is_empty() {
                let i = rng.below(in_flight.len() as u64) as usize;
                let fate = rng.below(10);
                let msg = in_flight.swap_remove(i);
                // 0: lost; 9: delivered twice.
                if fate >= 1 {
                    let again = fate == 9;
                    for _ in 0..1 + again as usize {
                        match &msg {
                            Msg::Normal(to, reply) => {
                                r[*to].apply_reply(reply).map_err(|e| ctx(e.to_string()))?;
                            }
                            Msg::Prioritised(to, reply) => {
                                if r[*to].priority() {
                                    taken_ahead += r[*to]
                                        .apply_prioritised(reply)
                                        .map_err(|e| ctx(e.to_string()))?;
                                } else if r[*to].apply_prioritised(reply).is_ok() {
                                    return Err(ctx(
                                        "a replica with priority off took a prioritised reply"
                                            .into(),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        } else {
            // Priority off or back on at a replica (a rollback switches it off, P4).
            let at = rng.below(3) as usize;
            let on = !r[at].priority();
            r[at].set_priority(on);
        }
        for (i, rep) in r.iter().enumerate() {
            check(rep, names[i]).map_err(ctx)?;
        }
    }
    // Quiesce: every replica back on, replies in flight dropped, normal sync until nothing
    // moves.
    for rep in &mut r {
        rep.set_priority(true);
    }
    for _ in 0..4 {
        for to in 1..3 {
            let from = source[to].unwrap();
            for part in 0..PARTS {
                let vv = r[to].sync(part).unwrap().vv.clone();
                let reply = r[from].serve_pull(part, &vv).unwrap();
                r[to].apply_reply(&reply).unwrap();
            }
        }
    }
    for to in 1..3 {
        for part in 0..PARTS {
            let want: Vec<_> = r[0].rows(part).unwrap().map(|(k, x)| (k, x.clone())).collect();
            let got: Vec<_> = r[to].rows(part).unwrap().map(|(k, x)| (k, x.clone())).collect();
            if want != got {
                return Err(format!("seed {seed}: {} did not converge on part {part}", names[to]));
            }
            if r[to].significant(part).unwrap().next().is_some() {
                return Err(format!(
                    "seed {seed}: {} keeps significant entries after convergence",
                    names[to]
                ));
            }
            let (a, b) = (r[0].sync(part).unwrap(), r[to].sync(part).unwrap());
            if a.svv != b.svv {
                return Err(format!(
                    "seed {seed}: {} svv {:?} != primary's {:?}",
                    names[to], b.svv, a.svv
                ));
            }
        }
    }
    Ok((sig_writes, taken_ahead))
}

#[test]
fn prioritised_sync_keeps_p1_to_p5_and_normal_sync_converges() {
    let seeds: Vec<u64> = match std::env::var("EMBSTORE_SEED") {
        Ok(s) => vec![s.parse().expect("EMBSTORE_SEED is a number")],
        Err(_) => (0..60).collect(),
    };
    let (mut sig, mut ahead) = (0, 0);
    for seed in seeds {
        let (s, a) = run(seed).unwrap_or_else(|e| panic!("{e} (replay: EMBSTORE_SEED={seed})"));
        sig += s;
        ahead += a;
    }
    println!("significant writes {sig}, entries taken ahead of normal sync {ahead}");
    assert!(sig > 0 && ahead > 0, "the runs exercised nothing: {sig} significant, {ahead} ahead");
}

/// A prioritised pull carries significant writes only, ahead of the rest; normal sync then
/// supersedes the entry (P2) and the read moves to the store.
#[test]
fn a_significant_write_overtakes_the_rest_and_normal_sync_supersedes_it() {
    let map = PartMap::new(1, 1).unwrap();
    let mut p = Replica::new(0, map, 1).unwrap();
    let mut f = Replica::new(1, map, 1).unwrap();
    for k in 0..100 {
        p.write_scored(k, vec![k as f32], 10, false).unwrap();
    }
    let v = p.write_scored(7, vec![70.0], 11, true).unwrap();
    let reply = p.serve_prioritised(0, &f.sync(0).unwrap().tsvv).unwrap();
    assert_eq!(reply.rows.len(), 1, "only the significant row is prioritised");
    assert_eq!(f.apply_prioritised(&reply).unwrap(), 1);
    assert_eq!(f.read(7).unwrap().values, vec![70.0]);
    assert!(f.rows(0).unwrap().next().is_none(), "the store holds nothing yet");
    assert_eq!(f.sync(0).unwrap().tsvv.get(0), v.timestamp);
    assert_eq!(f.sync(0).unwrap().svv, Vv::new());
    // Nothing more to take ahead.
    assert!(p.serve_prioritised(0, &f.sync(0).unwrap().tsvv).unwrap().rows.is_empty());
    f.apply_reply(&p.serve_pull(0, &f.sync(0).unwrap().vv).unwrap()).unwrap();
    assert!(f.significant(0).unwrap().next().is_none());
    assert_eq!(f.rows(0).unwrap().count(), 100);
    assert_eq!(f.sync(0).unwrap().svv.get(0), v.timestamp);
    // Off: refused both ways, and the state is as P4 says.
    f.set_priority(false);
    assert!(f.apply_prioritised(&reply).is_err());
    assert!(f.serve_prioritised(0, &Vv::new()).is_err());
}
