//! Witnesses and rollback in simulation (spec §6.2, RB1–RB5): a primary trains, an inference
//! replica and three witnesses pull from it (the replica's replies lost at random); the model
//! is healthy, then a burst of bad writes (and new rows) corrupts it, and the rollback's five
//! steps run. After each healthy flush a witness's healthy store equals what it had received
//! before `t_max` (RB1); after the rollback every replica's rows equal the witness's state at
//! `t_max`, at versions above every earlier one (RB2), written once per key changed since
//! (RB3); a witness that restarts never flushes what it logged before (RB4); a rollback cut by
//! a witness's failure and rerun ends where an uninterrupted one does (RB5). Every run names
//! its seed (`EMBSTORE_SEED=N` replays one).

use embstore_common::{ErrorKind, SplitMix64};
use embstore_replication::{Corrupted, PartMap, Replica, Witness};
use std::collections::BTreeMap;

const PARTS: u32 = 4;
const KEYS: u64 = 48;
const BUCKET: u64 = 100;
const STEP: u64 = 10;

/// One row as it arrived: `(time, version, values)` (`None`: a removal).
type Arrival = (u64, embstore_replication::Version, Option<Vec<f32>>);

/// What a witness received and when: per key, its arrivals.
#[derive(Clone, Default)]
struct Arrivals(BTreeMap<u64, Vec<Arrival>>);

impl Arrivals {
    /// Per key, the newest row received before `t` (a bucket boundary).
    fn at(&self, t: u64) -> BTreeMap<u64, Option<Vec<f32>>> {
        self.0
            .iter()
            .filter_map(|(k, xs)| {
                xs.iter().filter(|x| x.0 < t).max_by_key(|x| x.1).map(|x| (*k, x.2.clone()))
            })
            .collect()
    }

    /// Keys received at or after `t`.
    fn changed_since(&self, t: u64) -> usize {
        self.0.values().filter(|xs| xs.iter().any(|x| x.0 >= t)).count()
    }

    /// Forgets what arrived at or after `t` (a restart drops the logs after the last flush).
    fn drop_since(&mut self, t: u64) {
        for xs in self.0.values_mut() {
            xs.retain(|x| x.0 < t);
        }
    }
}

#[derive(Clone)]
struct World {
    primary: Replica,
    replica: Replica,
    witnesses: Vec<Witness>,
    arrivals: Vec<Arrivals>,
    now: u64,
}

impl World {
    /// Witness `w` pulls every part from the primary now.
    fn witness_pulls(&mut self, w: usize) {
        for part in 0..PARTS {
            let vv = self.witnesses[w].vv(part).unwrap().clone();
            let reply = self.primary.serve_pull(part, &vv).unwrap();
            for (k, row) in &reply.rows {
                let values = (!row.deleted).then(|| row.values.clone());
                self.arrivals[w].0.entry(*k).or_default().push((self.now, row.version, values));
            }
            self.witnesses[w].apply_reply(&reply, self.now).unwrap();
        }
    }

    fn replica_pulls(&mut self) {
        for part in 0..PARTS {
            let vv = self.replica.sync(part).unwrap().vv.clone();
            let reply = self.primary.serve_pull(part, &vv).unwrap();
            self.replica.apply_reply(&reply).unwrap();
        }
    }

    /// Rollback step ①'s and ④'s wait: pull until every replica and witness knows what the
    /// primary knows.
    fn converge(&mut self) -> Result<(), String> {
        for _ in 0..8 {
            self.now += STEP;
            self.replica_pulls();
            for w in 0..self.witnesses.len() {
                self.witness_pulls(w);
            }
            let same = (0..PARTS).all(|p| {
                let vv = &self.primary.sync(p).unwrap().vv;
                self.replica.sync(p).unwrap().vv == *vv
                    && self.witnesses.iter().all(|w| w.vv(p).unwrap() == vv)
            });
            if same {
                return Ok(());
            }
        }
        Err("did not converge in 8 rounds".into())
    }

    /// Steps ③ and ④ with witness `w`, writing at most `limit` rows (a failure cuts it).
    fn write_diff(&mut self, w: usize, limit: usize) -> usize {
        let diff = self.witnesses[w].diff(false);
        let n = diff.len().min(limit);
        for (k, values) in diff.into_iter().take(n) {
            self.primary.rollback_write(k, values, self.now).unwrap();
        }
        n
    }
}

fn values_of(r: &Replica) -> BTreeMap<u64, Option<Vec<f32>>> {
    (0..PARTS)
        .flat_map(|p| {
            r.rows(p)
                .unwrap()
                .map(|(k, row)| (k, (!row.deleted).then(|| row.values.clone())))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Rows equal `want` (a key `want` lacks: absent or removed).
fn same_rows(r: &Replica, want: &BTreeMap<u64, Option<Vec<f32>>>) -> Result<(), String> {
    let got = values_of(r);
    for (k, v) in &got {
        match (v, want.get(k)) {
            (None, None) | (None, Some(None)) => {}
            (v, w) if Some(v) == w => {}
            (v, w) => return Err(format!("key {k}: holds {v:?}, the state at t_max is {w:?}")),
        }
    }
    for (k, w) in want {
        if w.is_some() && got.get(k).is_none_or(|v| v != w) {
            return Err(format!("key {k}: missing {w:?}"));
        }
    }
    Ok(())
}

fn run(seed: u64) -> Result<(usize, usize), String> {
    let mut rng = SplitMix64::new(seed);
    let map = PartMap::new(1, PARTS).unwrap();
    let mut world = World {
        primary: Replica::new(0, map, 1).unwrap(),
        replica: Replica::new(1, map, 1).unwrap(),
        witnesses: (0..3).map(|i| Witness::new(10 + i, map, 1, BUCKET).unwrap()).collect(),
        arrivals: vec![Arrivals::default(); 3],
        now: 0,
    };
    let restart_at = 40 + rng.below(200);
    let mut last_flush = [0u64; 3];
    // Healthy training, then corruption from `bad_from` on.
    let bad_from = 300;
    for step in 0..400u64 {
        world.now = step * STEP;
        let bad = step >= bad_from;
        for _ in 0..1 + rng.below(3) {
            let key = if bad && rng.below(4) == 0 { KEYS + rng.below(16) } else { rng.below(KEYS) };
            let x = if bad { 999.0 } else { (step % 97) as f32 };
            world.primary.local_write(key, vec![x], world.now).unwrap();
        }
        if rng.below(3) > 0 {
            world.replica_pulls();
        }
        if rng.below(2) == 0 {
            // Witnesses 0 and 1 pull together (twins, for RB5); witness 2 on its own.
            world.witness_pulls(0);
            world.witness_pulls(1);
        }
        if rng.below(2) == 0 {
            world.witness_pulls(2);
        }
        if step == restart_at {
            // RB4: the restart drops the logs; what arrived since the last flush is gone.
            world.witnesses[2] = world.witnesses[2].restart();
            let t = world.witnesses[2].log().t_max();
            world.arrivals[2].drop_since(t.max(last_flush[2]));
        }
        if step % 20 == 19 {
            // A healthy decision (with the corrupted span once it is detected: 50 ms late).
            let corrupted: Vec<Corrupted> = if world.now >= bad_from * STEP + 50 {
                vec![Corrupted { start_ms: bad_from * STEP, end_ms: None }]
            } else {
                vec![]
            };
            let t_healthy = world.now.saturating_sub(50);
            for (w, last) in last_flush.iter_mut().enumerate() {
                if let Some(t_max) = world.witnesses[w].flush(t_healthy, &corrupted) {
                    *last = t_max;
                    // RB1: the healthy store is what arrived before t_max, no more.
                    let healthy: BTreeMap<u64, Option<Vec<f32>>> = world.witnesses[w]
                        .log()
                        .healthy()
                        .iter()
                        .map(|(k, r)| (*k, r.values.clone()))
                        .collect();
                    if healthy != world.arrivals[w].at(t_max) {
                        return Err(format!("seed {seed} step {step}: RB1/RB4: witness {w}'s healthy store is not what arrived before t_max {t_max}"));
                    }
                }
            }
        }
    }
    let t_max: Vec<u64> = world.witnesses.iter().map(|w| w.log().t_max()).collect();
    if t_max.iter().any(|t| *t > bad_from * STEP) {
        return Err(format!("seed {seed}: a witness flushed corrupted time: t_max {t_max:?}"));
    }

    // ① Stop training writes, priority off, converge.
    world.primary.set_writes_stopped(true);
    let e = world.primary.local_write(0, vec![1.0], world.now).unwrap_err();
    if e.kind() != ErrorKind::RollingBack {
        return Err(format!("seed {seed}: a write during the rollback failed with {e}"));
    }
    for r in [&mut world.primary, &mut world.replica] {
        r.set_priority(false);
    }
    world.converge().map_err(|e| format!("seed {seed} ①: {e}"))?;
    // ② Witnesses whose t_max are within two buckets of the median.
    let mut sorted = t_max.clone();
    sorted.sort_unstable();
    let median = sorted[1];
    let chosen: Vec<usize> = (0..3).filter(|w| t_max[*w].abs_diff(median) <= 2 * BUCKET).collect();
    if !chosen.contains(&0) || !chosen.contains(&1) {
        return Err(format!("seed {seed}: the twins were not chosen: t_max {t_max:?}"));
    }
    let before = world.primary.clock_last();
    let twin = world.clone();

    // ③ ④ with witness 0, cut after half its diff by the witness's failure (RB5) ...
    let diff0 = world.witnesses[0].diff(false);
    let changed = world.arrivals[0].changed_since(t_max[0]);
    if diff0.len() > changed {
        return Err(format!(
            "seed {seed}: RB3: diff of {} rows for {changed} keys changed",
            diff0.len()
        ));
    }
    world.write_diff(0, diff0.len() / 2);
    world.witnesses[0] = world.witnesses[0].restart();
    // ... rerun from ①: converge, then witness 1 writes its diff in full.
    world.converge().map_err(|e| format!("seed {seed} rerun ①: {e}"))?;
    world.write_diff(1, usize::MAX);
    for w in &mut world.witnesses {
        w.clear_logs();
    }
    world.converge().map_err(|e| format!("seed {seed} ④: {e}"))?;

    // RB2: every replica holds the state at t_max, at versions above every earlier one.
    let want = world.arrivals[1].at(t_max[1]);
    for (name, r) in [("primary", &world.primary), ("replica", &world.replica)] {
        same_rows(r, &want).map_err(|e| format!("seed {seed}: RB2: {name}: {e}"))?;
        for (k, _) in &diff0 {
            let v = r.row(*k).map(|row| row.version.timestamp).unwrap_or(0);
            if v <= before {
                return Err(format!("seed {seed}: RB2: {name} key {k} at {v}, not above {before}"));
            }
        }
    }
    // RB5: the same end as a rollback by witness 1 alone, uncut.
    let mut alone = twin;
    let written = alone.write_diff(1, usize::MAX);
    if written != diff0.len() {
        return Err(format!(
            "seed {seed}: RB3: twins' diffs differ ({written} vs {})",
            diff0.len()
        ));
    }
    alone.converge().map_err(|e| format!("seed {seed} alone ④: {e}"))?;
    if values_of(&alone.primary) != values_of(&world.primary) {
        return Err(format!("seed {seed}: RB5: the rerun ended elsewhere than an uncut rollback"));
    }
    // ⑤ Writes resume.
    world.primary.set_writes_stopped(false);
    world
        .primary
        .local_write(0, vec![1.0], world.now)
        .map_err(|e| format!("seed {seed} ⑤: {e}"))?;
    Ok((diff0.len(), changed))
}

#[test]
fn a_rollback_restores_the_state_at_t_max_and_survives_a_witness_failing() {
    let seeds: Vec<u64> = match std::env::var("EMBSTORE_SEED") {
        Ok(s) => vec![s.parse().expect("EMBSTORE_SEED is a number")],
        Err(_) => (0..30).collect(),
    };
    let mut rows = 0;
    for seed in seeds {
        let (n, _) = run(seed).unwrap_or_else(|e| panic!("{e} (replay: EMBSTORE_SEED={seed})"));
        rows += n;
    }
    assert!(rows > 0, "no rollback wrote anything");
}
