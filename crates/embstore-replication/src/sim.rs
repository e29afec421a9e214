//! A deterministic simulation of pull-based sync, and the checker of its invariants.
//!
//! The replicas ([`Replica`]) run the production steps ([`crate::steps`], the functions the
//! table's `sync_pull` / `sync_apply` call) and place keys by the table's [`PartMap`], so a
//! check that fails here fails for the production protocol; the mutants of
//! `steps::Mutant` break those steps from inside.
//!
//! `N` replicas; one primary writes. A replica pulls from another in the production follower's
//! round ([`crate::round::round`]) over a [`SimLink`], the simulator's [`Link`]: its change list
//! may be lost, and its pulls and their replies travel as messages through a simulated network
//! that drops, duplicates, reorders and delays them, and that can be partitioned into two
//! sides and healed. A reply that arrives waits in its requester's inbox for the requester's
//! next round (late replies are stale ones, in any order). Every choice comes from one seeded
//! [`SplitMix64`], so a seed replays a run exactly; a failure names its seed and step.
//!
//! After every step [`Sim::check`] compares the replicas with the global history of committed
//! writes: V3 (a VV covers only writes the rows hold), V4 (VVs and row versions only grow),
//! C1/C2 (the update cache's invariants), S1/S2 (shard versions name knowledge); V1 and V6 are checked as each write is made, C3 on
//! every pull the cache answers. [`Sim::heal_and_quiesce`] then checks V5 (convergence).

use crate::changes::Changes;
use crate::link::{Link, ListAsk};
use crate::map::PartMap;
use crate::replica::{Replica, Reply};
use crate::round::{round, Book, RoundOptions};
use crate::version::Version;
use crate::vv::Vv;
use embstore_common::{Error, ErrorKind, SplitMix64};
use std::collections::BTreeMap;

/// The knobs of one simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Replicas (at least 2); replica 0 starts as the primary.
    pub replicas: usize,
    /// Sync parts per replica (a power of two), over `shards` shards placed as a table
    /// places them ([`PartMap`]).
    pub parts: u32,
    /// Shards per replica (a power of two).
    pub shards: u32,
    /// Keys drawn from `0..keys`.
    pub keys: u64,
    /// Percent of delivered messages dropped.
    pub drop_pct: u64,
    /// Percent of delivered messages also kept in flight for a second delivery.
    pub dup_pct: u64,
    /// Whether the primary moves now and then to another replica (a failover).
    pub failover: bool,
    /// Whether quiescence skips a pull when the requester's sv succeeds the responder's (the
    /// rounds before it always do, as the production follower does by default).
    pub skip_by_sv: bool,
    /// Whether a replica now and then loses its state (restarts empty under a new id, its
    /// messages in flight lost with its connections).
    pub loss: bool,
    /// Percent of the primary's writes that remove their key (a tombstone).
    pub delete_pct: u64,
    /// Whether replicas now and then collect tombstones older than a random horizon (then
    /// requesters behind them get whole parts).
    pub collect: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            replicas: 4,
            parts: 4,
            shards: 2,
            keys: 32,
            drop_pct: 15,
            dup_pct: 10,
            failover: false,
            skip_by_sv: true,
            loss: false,
            delete_pct: 20,
            collect: true,
        }
    }
}

/// A message on the simulated network.
#[derive(Clone, Debug)]
enum Msg {
    Pull { from: usize, to: usize, part: u32, vv: Vv },
    Reply { to: usize, from: usize, reply: Reply },
}

impl Msg {
    fn link(&self) -> (usize, usize) {
        match self {
            Msg::Pull { from, to, .. } | Msg::Reply { from, to, .. } => (*from, *to),
        }
    }
}

/// The simulated cluster: replicas, messages in flight, the partition and the history.
#[derive(Debug)]
pub struct Sim {
    cfg: SimConfig,
    /// Where keys are: the table's map.
    map: PartMap,
    rng: SplitMix64,
    now_ms: u64,
    primary: usize,
    replicas: Vec<Replica>,
    in_flight: Vec<(u64, Msg)>,
    /// Per replica, the replies that arrived and wait for its next round.
    inbox: Vec<Vec<Reply>>,
    /// Per (requester, responder), the requester's book of the responder's parts.
    books: BTreeMap<(usize, usize), Book>,
    /// The side of each replica; a message between different sides is lost.
    side: Vec<u8>,
    /// Every committed write: `(key, version)`.
    history: Vec<(u64, Version)>,
    /// The writes of `history` that removed their key.
    deletes: Vec<(u64, Version)>,
    /// Per replica and part, the last local write's version (V6).
    last_local: Vec<Vec<Version>>,
    /// The state at the last check, for V4: per replica, the VVs and row versions.
    seen: Vec<(Vec<Vv>, BTreeMap<u64, Version>)>,
    /// Pulls the update cache answered.
    pub hits: u64,
    /// Pulls answered by a scan.
    pub misses: u64,
    /// Pulls answered with the whole part (the requester was behind collected tombstones).
    pub completes: u64,
    /// Quiescence pulls skipped because the requester's sv succeeded the responder's.
    pub skipped: u64,
    /// The next replica id (ids are never reused: a replica that lost its state takes a new one).
    next_id: u32,
    /// Replicas that lost their state so far.
    pub lost: u64,
}

impl Sim {
    /// A cluster of empty replicas.
    pub fn new(cfg: SimConfig, seed: u64) -> Result<Self, String> {
        if cfg.replicas < 2 {
            return Err(format!("a simulation needs at least 2 replicas, got {}", cfg.replicas));
        }
        let map = PartMap::new(cfg.shards, cfg.parts).map_err(|e| e.to_string())?;
        let replicas = (0..cfg.replicas)
            .map(|i| Replica::new(i as u32, map, 1).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let n = cfg.replicas;
        let nparts = map.parts() as usize;
        Ok(Self {
            rng: SplitMix64::new(seed),
            now_ms: 1_000,
            primary: 0,
            in_flight: Vec::new(),
            inbox: vec![Vec::new(); n],
            books: BTreeMap::new(),
            side: vec![0; n],
            history: Vec::new(),
            deletes: Vec::new(),
            last_local: vec![vec![Version::ZERO; nparts]; n],
            seen: vec![(vec![Vv::new(); nparts], BTreeMap::new()); n],
            hits: 0,
            misses: 0,
            completes: 0,
            skipped: 0,
            next_id: n as u32,
            lost: 0,
            replicas,
            map,
            cfg,
        })
    }

    /// The replicas.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Committed writes so far.
    pub fn history(&self) -> &[(u64, Version)] {
        &self.history
    }

    #[cfg(test)]
    pub(crate) fn replicas_mut(&mut self) -> &mut [Replica] {
        &mut self.replicas
    }

    fn pick(&mut self, n: usize) -> usize {
        self.rng.below(n as u64) as usize
    }

    fn send(&mut self, msg: Msg) {
        let delay = self.rng.below(40);
        self.in_flight.push((self.now_ms + delay, msg));
    }

    /// Replica `r` runs one production round pulling from `s` over a [`SimLink`]: with
    /// `faults`, through the faulty network (and always skipping by sv), else answered at once
    /// (skipping by sv as configured). A round the network broke is no failure; a reply the
    /// replica refused, or a broken check, is. Returns the round, if it ran.
    fn pull_round(
        &mut self,
        r: usize,
        s: usize,
        faults: bool,
    ) -> Result<Option<crate::round::Round>, String> {
        let (me, them) = pair(&mut self.replicas, r, s);
        let mut link = SimLink {
            them,
            faults,
            lose_pct: if self.side[r] != self.side[s] { 100 } else { self.cfg.drop_pct },
            now_ms: self.now_ms,
            rng: &mut self.rng,
            in_flight: &mut self.in_flight,
            inbox: &mut self.inbox[r],
            from: r,
            to: s,
        };
        let book = self.books.entry((r, s)).or_default();
        let options =
            RoundOptions { skip_by_sv: faults || self.cfg.skip_by_sv, ..RoundOptions::default() };
        match round(me, &mut link, book, &options, &mut |_, _, _| Ok(())) {
            Ok(done) => Ok(Some(done)),
            Err(e) if e.kind() == ErrorKind::Unavailable => Ok(None),
            Err(e) => Err(format!("replica {r} pulling from {s}: {e}")),
        }
    }

    /// One random step, then the checks.
    pub fn step(&mut self) -> Result<(), String> {
        let roll = self.rng.below(100);
        match roll {
            0..=24 => self.write()?,
            25..=49 => {
                let r = self.pick(self.cfg.replicas);
                let s = (r + 1 + self.pick(self.cfg.replicas - 1)) % self.cfg.replicas;
                self.pull_round(r, s, true)?;
            }
            50..=84 => {
                self.deliver_one(true)?;
            }
            85..=91 => self.now_ms += 1 + self.rng.below(30),
            92..=94 => {
                let r = self.pick(self.cfg.replicas);
                let d_prop = self.rng.below(120);
                self.replicas[r].prune(self.now_ms, d_prop);
                if self.cfg.collect {
                    // The horizon's premise: a tombstone is collected only once every write
                    // older than it has reached this replica (a real horizon must exceed the
                    // longest time a write takes to reach every replica, partitions included).
                    let stable = self.stable_ms(r)?;
                    let horizon = self.rng.below(60).max(self.now_ms.saturating_sub(stable) + 1);
                    self.replicas[r].collect(self.now_ms, horizon);
                }
            }
            95..=96 => {
                for i in 0..self.side.len() {
                    self.side[i] = (self.rng.below(2)) as u8;
                }
            }
            97..=98 => self.side.iter_mut().for_each(|s| *s = 0),
            _ => {
                if self.cfg.failover {
                    self.primary = self.pick(self.cfg.replicas);
                }
                if self.cfg.loss && self.rng.below(2) == 0 {
                    self.lose()?;
                }
            }
        }
        self.check()
    }

    /// A replica loses its state: it restarts empty under a new id, and what was in flight to
    /// or from it is lost with its connections (a reply to the old incarnation selected rows
    /// against knowledge the new one does not have).
    fn lose(&mut self) -> Result<(), String> {
        let r = self.pick(self.cfg.replicas);
        let id = self.next_id;
        self.next_id += 1;
        self.replicas[r] = Replica::new(id, self.map, 1).map_err(|e| e.to_string())?;
        self.in_flight.retain(|(_, m)| {
            let (a, b) = m.link();
            a != r && b != r
        });
        // A restarted follower starts with empty books (its peers see a new epoch in it).
        self.inbox[r].clear();
        self.books.retain(|&(a, _), _| a != r);
        let nparts = self.map.parts() as usize;
        self.seen[r] = (vec![Vv::new(); nparts], BTreeMap::new());
        self.last_local[r] = vec![Version::ZERO; nparts];
        self.lost += 1;
        Ok(())
    }

    fn write(&mut self) -> Result<(), String> {
        let p = self.primary;
        let key = self.rng.below(self.cfg.keys);
        let x = self.rng.below(1000) as f32;
        let delete = self.rng.below(100) < self.cfg.delete_pct;
        let r = &mut self.replicas[p];
        // V1: the new version exceeds every version the replica issued or applied.
        let floor = r.clock_last();
        let v = if delete {
            r.local_delete(key, self.now_ms)
        } else {
            r.local_write(key, vec![x], self.now_ms)
        };
        let v = v.map_err(|e| e.to_string())?;
        if delete {
            self.deletes.push((key, v));
        }
        if v.timestamp <= floor {
            return Err(format!("V1: replica {p} issued {v:?} not above {floor}"));
        }
        let part = r.part_of(key) as usize;
        // V6: local writes enter each part in version order.
        if v <= self.last_local[p][part] {
            return Err(format!(
                "V6: part {part} of replica {p} got {v:?} after {:?}",
                self.last_local[p][part]
            ));
        }
        self.last_local[p][part] = v;
        self.history.push((key, v));
        Ok(())
    }

    /// Delivers one due message (a random one, so messages reorder), maybe dropping or
    /// duplicating it. Returns whether one was delivered.
    fn deliver_one(&mut self, faults: bool) -> Result<bool, String> {
        let due: Vec<usize> = (0..self.in_flight.len())
            .filter(|&i| !faults || self.in_flight[i].0 <= self.now_ms)
            .collect();
        if due.is_empty() {
            self.now_ms += 1;
            return Ok(false);
        }
        let i = due[self.pick(due.len())];
        let (_, msg) = if faults && self.rng.below(100) < self.cfg.dup_pct {
            self.in_flight[i].clone()
        } else {
            self.in_flight.swap_remove(i)
        };
        let (a, b) = msg.link();
        if faults && (self.rng.below(100) < self.cfg.drop_pct || self.side[a] != self.side[b]) {
            return Ok(true);
        }
        match msg {
            Msg::Pull { from, to, part, vv } => {
                let s = &self.replicas[to];
                let reply = s.serve_pull(part, &vv).map_err(|e| e.to_string())?;
                self.completes += u64::from(reply.complete.is_some());
                if reply.from_cache {
                    self.hits += 1;
                    // C3: on a hit, the cache selects exactly what a full scan selects.
                    let scan = s.scan_pull(part, &vv).map_err(|e| e.to_string())?;
                    if scan != reply.rows {
                        return Err(format!(
                            "C3: replica {to} part {part}: cache {:?} != scan {:?}",
                            reply.rows, scan
                        ));
                    }
                } else {
                    self.misses += 1;
                }
                if faults {
                    self.send(Msg::Reply { to: from, from: to, reply });
                } else {
                    self.in_flight.push((self.now_ms, Msg::Reply { to: from, from: to, reply }));
                }
            }
            // The requester applies it in its next round.
            Msg::Reply { to, reply, .. } => self.inbox[to].push(reply),
        }
        Ok(true)
    }

    /// V3, V4, C1, C2 over every replica and part; S1 and S2 over every pair.
    pub fn check(&mut self) -> Result<(), String> {
        for (ai, a) in self.replicas.iter().enumerate() {
            for (bi, b) in self.replicas.iter().enumerate() {
                for part in 0..a.parts() {
                    let (x, y) = (
                        a.sync(part).map_err(|e| e.to_string())?,
                        b.sync(part).map_err(|e| e.to_string())?,
                    );
                    if x.sv.succeq(&y.sv) && !x.vv.dominates(&y.vv) {
                        return Err(format!("S1: part {part}: sv of {ai} {:?} succeeds {bi}'s {:?} but its vv does not dominate", x.sv, y.sv));
                    }
                    if x.sv == y.sv && x.vv != y.vv {
                        return Err(format!("S2: part {part}: replicas {ai} and {bi} share sv {:?} with different vvs", x.sv));
                    }
                }
            }
        }
        for (ri, r) in self.replicas.iter().enumerate() {
            for &(key, v) in &self.history {
                let part = r.part_of(key);
                let vv = &r.sync(part).map_err(|e| e.to_string())?.vv;
                if v.timestamp <= vv.get(v.replica) {
                    let have = r.row(key).map_or(Version::ZERO, |row| row.version);
                    let floor = r.floor(part).map_err(|e| e.to_string())?;
                    // A row that is gone must be gone by a removal at least as new, whose
                    // tombstone was collected (here or at a responder whose floor it took).
                    let collected = r.row(key).is_none() && self.collected(key, v, floor);
                    if have < v && !collected {
                        return Err(format!(
                            "V3: replica {ri} part {part} knows {v:?} of key {key} (vv {:?}) but holds {have:?}",
                            vv.entries()
                        ));
                    }
                }
            }
            let (old_vvs, old_rows) = &self.seen[ri];
            let mut vvs = Vec::with_capacity(old_vvs.len());
            let mut rows = BTreeMap::new();
            for part in 0..r.parts() {
                let sync = r.sync(part).map_err(|e| e.to_string())?;
                if !sync.vv.dominates(&old_vvs[part as usize]) {
                    return Err(format!("V4: replica {ri} part {part}'s vv went down"));
                }
                vvs.push(sync.vv.clone());
                for (k, row) in r.rows(part).map_err(|e| e.to_string())? {
                    let v = row.version;
                    match sync.cache.get(k) {
                        Some(c) if c != v || v.timestamp <= sync.cache.t_prune_to() => {
                            return Err(format!(
                                "C2: replica {ri} key {k}: cached {c:?}, row {v:?}"
                            ));
                        }
                        None if v.timestamp > sync.cache.dvv().get(v.replica) => {
                            return Err(format!(
                                "C1: replica {ri} key {k}: uncached {v:?} above the dvv"
                            ));
                        }
                        _ => {}
                    }
                    rows.insert(k, v);
                }
            }
            for (k, v) in old_rows {
                let part = r.part_of(*k);
                let floor = r.floor(part).map_err(|e| e.to_string())?;
                let gone = !rows.contains_key(k) && self.collected(*k, *v, floor);
                if !gone && rows.get(k).is_none_or(|now| now < v) {
                    return Err(format!("V4: replica {ri} key {k} went below {v:?}"));
                }
            }
            self.seen[ri] = (vvs, rows);
        }
        Ok(())
    }

    /// The time (ms) before which every committed write has reached replica `r` (its VVs
    /// cover it); `u64::MAX` when all have.
    fn stable_ms(&self, r: usize) -> Result<u64, String> {
        let rep = &self.replicas[r];
        let mut stable = u64::MAX;
        for &(key, v) in &self.history {
            let vv = &rep.sync(rep.part_of(key)).map_err(|e| e.to_string())?.vv;
            if v.timestamp > vv.get(v.replica) {
                stable = stable.min(v.ms());
            }
        }
        Ok(stable)
    }

    /// Whether a removal of `key` at least as new as `v` is in the history, below `floor`.
    fn collected(&self, key: u64, v: Version, floor: &Vv) -> bool {
        self.deletes.iter().any(|&(k, d)| k == key && d >= v && d.timestamp <= floor.get(d.replica))
    }

    /// Heals the partition, delivers everything in flight without faults, then has every
    /// replica run fault-free rounds pulling from every other (with the books the faulty rounds
    /// left) until nothing changes; checks V5.
    pub fn heal_and_quiesce(&mut self) -> Result<(), String> {
        self.side.iter_mut().for_each(|s| *s = 0);
        while self.deliver_one(false)? {}
        let n = self.replicas.len();
        for _pass in 0..n {
            let mut changed = false;
            for r in 0..n {
                for s in 0..n {
                    if r == s {
                        continue;
                    }
                    let before = self.vvs(r)?;
                    let done = self
                        .pull_round(r, s, false)?
                        .ok_or_else(|| format!("a fault-free round of {r} from {s} failed"))?;
                    // S1: a part whose sv here succeeds the responder's is not pulled.
                    self.skipped += done.skipped;
                    changed |= done.written > 0 || self.vvs(r)? != before;
                }
            }
            self.check()?;
            if !changed {
                break;
            }
        }
        let first = &self.replicas[0];
        for (ri, r) in self.replicas.iter().enumerate().skip(1) {
            for part in 0..first.parts() {
                let (a, b) = (
                    first.sync(part).map_err(|e| e.to_string())?,
                    r.sync(part).map_err(|e| e.to_string())?,
                );
                if a.vv != b.vv {
                    return Err(format!(
                        "V5: part {part}: vv of replica 0 {:?} != replica {ri} {:?}",
                        a.vv.entries(),
                        b.vv.entries()
                    ));
                }
                // Rows, not tombstones: each replica collects its own when it does.
                let live = |(_, row): &(u64, &crate::replica::Row)| !row.deleted;
                let ra: Vec<_> =
                    first.rows(part).map_err(|e| e.to_string())?.filter(live).collect();
                let rb: Vec<_> = r.rows(part).map_err(|e| e.to_string())?.filter(live).collect();
                if ra != rb {
                    return Err(format!(
                        "V5: part {part}: rows of replica 0 and replica {ri} differ"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Replica `r`'s VVs, per part.
    fn vvs(&self, r: usize) -> Result<Vec<Vv>, String> {
        let rep = &self.replicas[r];
        (0..rep.parts()).map(|p| Ok(rep.sync(p).map_err(|e| e.to_string())?.vv.clone())).collect()
    }

    /// `steps` random steps with checks after each, then heal and quiesce (V5).
    pub fn run(&mut self, steps: usize) -> Result<(), String> {
        for i in 0..steps {
            self.step().map_err(|e| format!("step {i}: {e}"))?;
        }
        self.heal_and_quiesce().map_err(|e| format!("after heal: {e}"))
    }
}

/// `v[a]` to change and `v[b]` to read (`a != b`).
fn pair<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &T) {
    assert_ne!(a, b, "a replica does not pull from itself");
    if a < b {
        let (x, y) = v.split_at_mut(b);
        (&mut x[a], &y[0])
    } else {
        let (x, y) = v.split_at_mut(a);
        (&mut y[0], &x[b])
    }
}

/// The simulator's [`Link`]: from replica `from` to replica `to` over the simulated network.
///
/// With faults, a change list (or its answer) is lost with the network's drop rate, always
/// across a partition; each pull travels as a message that the network delays, drops,
/// duplicates or reorders ([`Sim`]'s delivery steps), is answered by `to` when delivered, and
/// its reply travels back the same way into `from`'s inbox. [`Link::next`] hands out what the
/// inbox holds, in a random order: replies of earlier rounds, duplicates, late and stale ones.
/// Without faults (quiescence), pulls are answered at once.
#[derive(Debug)]
pub struct SimLink<'a> {
    them: &'a Replica,
    faults: bool,
    /// Percent of change lists lost.
    lose_pct: u64,
    now_ms: u64,
    rng: &'a mut SplitMix64,
    in_flight: &'a mut Vec<(u64, Msg)>,
    inbox: &'a mut Vec<Reply>,
    from: usize,
    to: usize,
}

impl Link for SimLink<'_> {
    type Reply = Reply;

    fn list(&mut self, ask: &ListAsk) -> embstore_common::Result<Changes> {
        if self.faults && self.rng.below(100) < self.lose_pct {
            return Err(Error::new(ErrorKind::Unavailable, "the change list was lost"));
        }
        // A replica's id names its incarnation (one that lost its state takes a new one).
        let epoch = u64::from(self.them.id()) + 1;
        let since = if ask.epoch == epoch { ask.cursor } else { 0 };
        let (parts, upto) = self.them.changed_since(since);
        Ok(Changes { epoch, upto, parts })
    }

    fn pull(&mut self, parts: &[(u32, Vv)]) -> embstore_common::Result<()> {
        for (part, vv) in parts {
            if self.faults {
                let msg = Msg::Pull { from: self.from, to: self.to, part: *part, vv: vv.clone() };
                let delay = self.rng.below(40);
                self.in_flight.push((self.now_ms + delay, msg));
            } else {
                self.inbox.push(self.them.serve_pull(*part, vv)?);
            }
        }
        Ok(())
    }

    fn next(&mut self) -> embstore_common::Result<Option<Reply>> {
        if self.inbox.is_empty() {
            return Ok(None);
        }
        let i = if self.faults { self.rng.below(self.inbox.len() as u64) as usize } else { 0 };
        Ok(Some(self.inbox.swap_remove(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::Mutant;

    fn run_seeds(cfg: &SimConfig, seeds: std::ops::Range<u64>, steps: usize) -> (u64, u64) {
        let (mut hits, mut misses) = (0, 0);
        for seed in seeds {
            let mut sim = Sim::new(cfg.clone(), seed).unwrap();
            if let Err(e) = sim.run(steps) {
                panic!("seed {seed}: {e}");
            }
            assert!(!sim.history().is_empty(), "seed {seed}: no writes");
            hits += sim.hits;
            misses += sim.misses;
        }
        (hits, misses)
    }

    /// V1, V3, V4, V5, V6, C1-C3 over many seeds with drops, duplicates, reordering, delays
    /// and partitions; both cache paths are exercised.
    #[test]
    fn the_invariants_hold_under_faults() {
        let (hits, misses) = run_seeds(&SimConfig::default(), 0..60, 400);
        assert!(hits > 0 && misses > 0, "hits {hits}, misses {misses}");
    }

    #[test]
    fn the_invariants_hold_with_failovers_and_heavy_loss() {
        let cfg = SimConfig {
            replicas: 5,
            parts: 2,
            shards: 2,
            keys: 12,
            drop_pct: 40,
            dup_pct: 30,
            failover: true,
            skip_by_sv: true,
            loss: true,
            ..SimConfig::default()
        };
        run_seeds(&cfg, 1000..1040, 400);
    }

    #[test]
    fn one_part_two_replicas() {
        let cfg = SimConfig { replicas: 2, parts: 1, shards: 1, keys: 4, ..SimConfig::default() };
        run_seeds(&cfg, 2000..2040, 300);
    }

    /// The checker catches a broken R2: replicas that merge a reply's VV without applying all
    /// of its rows fail V3 on some seed.
    #[test]
    fn the_checker_catches_a_merge_before_all_rows() {
        let mut caught = None;
        for seed in 0..60 {
            let mut sim = Sim::new(SimConfig::default(), seed).unwrap();
            sim.replicas_mut().iter_mut().for_each(|r| r.mutant = Mutant::DropLastRow);
            if let Err(e) = sim.run(400) {
                caught = Some((seed, e));
                break;
            }
        }
        let (seed, e) = caught.expect("no seed caught the mutant");
        assert!(e.contains("V3:"), "seed {seed}: {e}");
    }

    /// S3 (differential): with the sv skip on or off, the same seed ends in the same rows and
    /// VVs, and the skip did skip pulls.
    #[test]
    fn skipping_by_shard_version_loses_nothing() {
        let mut skipped = 0;
        for seed in 3000..3030 {
            let mut on = Sim::new(SimConfig::default(), seed).unwrap();
            let mut off =
                Sim::new(SimConfig { skip_by_sv: false, ..SimConfig::default() }, seed).unwrap();
            on.run(300).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            off.run(300).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            skipped += on.skipped;
            assert_eq!(off.skipped, 0);
            for (a, b) in on.replicas().iter().zip(off.replicas()) {
                for part in 0..a.parts() {
                    assert_eq!(a.sync(part).unwrap().vv, b.sync(part).unwrap().vv, "seed {seed}");
                    assert!(a.rows(part).unwrap().eq(b.rows(part).unwrap()), "seed {seed}");
                }
            }
        }
        assert!(skipped > 0);
    }

    /// A replica that lost its state and rejoined under a new id catches up: after quiescence
    /// every replica holds the same rows and VVs, with no invariant broken on the way.
    #[test]
    fn replicas_that_lose_their_state_rejoin_and_converge() {
        let cfg = SimConfig { loss: true, ..SimConfig::default() };
        let mut lost = 0;
        for seed in 4000..4040 {
            let mut sim = Sim::new(cfg.clone(), seed).unwrap();
            sim.run(400).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            lost += sim.lost;
        }
        assert!(lost > 5, "replicas lost: {lost}");
    }

    /// Removals whose tombstones were collected reach every replica: some pulls were answered
    /// with whole parts, and the invariants and convergence hold.
    #[test]
    fn collected_tombstones_reach_replicas_behind_them() {
        let (mut completes, mut deletes) = (0, 0);
        for seed in 5000..5040 {
            let mut sim =
                Sim::new(SimConfig { delete_pct: 40, ..SimConfig::default() }, seed).unwrap();
            sim.run(400).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            completes += sim.completes;
            deletes += sim.deletes.len();
        }
        assert!(completes > 20 && deletes > 100, "completes {completes}, deletes {deletes}");
    }

    /// The checker catches a responder that ignores its floor: a requester behind collected
    /// tombstones then keeps rows removed elsewhere, and fails V3 (or V5) on some seed.
    #[test]
    fn the_checker_catches_a_pull_that_ignores_the_floor() {
        let e = first_failure(Mutant::IgnoreFloor);
        assert!(["V3:", "V5:"].iter().any(|v| e.contains(v)), "{e}");
    }

    /// The checker catches a replica that applies a write it already knows of: a stale reply
    /// brings back a row whose removal it collected, and V3 fails on some seed.
    #[test]
    fn the_checker_catches_a_stale_row_brought_back() {
        let e = first_failure(Mutant::ReapplyKnown);
        assert!(e.contains("V3:"), "{e}");
    }

    /// The checker catches a broken hit rule: a responder that answers from its cache without
    /// checking the requester's VV against the DVV fails C3 on some seed.
    #[test]
    fn the_checker_catches_a_cache_answer_without_the_dvv_check() {
        let e = first_failure(Mutant::SkipDvvCheck);
        assert!(e.contains("C3:"), "{e}");
    }

    /// The checker catches a tick outside the write step (W1): a write that lands with a
    /// version drawn before another's fails V1 (the version is below what the replica had
    /// issued when it wrote), V6 or V3 on some seed.
    #[test]
    fn the_checker_catches_a_tick_outside_the_lock() {
        let e = first_failure(Mutant::TickOutsideLock);
        assert!(["V1:", "V6:", "V3:"].iter().any(|v| e.contains(v)), "{e}");
    }

    /// The checker catches a broken round (the production follower's, run over the
    /// simulator's link): a round that ends a listed part's pull on a late reply of an earlier
    /// pull never pulls the listed change, and replicas fail to converge (V5) on some seed.
    #[test]
    fn the_checker_catches_a_round_that_takes_a_late_reply_for_the_listed_change() {
        let e = first_failure(Mutant::UnpendOnAnyReply);
        assert!(e.contains("V5:"), "{e}");
    }

    /// The first failure of a run with every replica mutated, over seeds 0..60.
    fn first_failure(mutant: Mutant) -> String {
        for seed in 0..60 {
            let mut sim = Sim::new(SimConfig::default(), seed).unwrap();
            sim.replicas_mut().iter_mut().for_each(|r| r.mutant = mutant);
            if let Err(e) = sim.run(400) {
                return format!("seed {seed}: {e}");
            }
        }
        panic!("no seed caught {mutant:?}");
    }

    /// The checker catches a broken sv rule: replicas that adopt the responder's sv whatever
    /// their merged VV fail S2 (or S1) on some seed.
    #[test]
    fn the_checker_catches_an_sv_adopted_for_other_knowledge() {
        let mut caught = None;
        for seed in 0..60 {
            let mut sim = Sim::new(SimConfig::default(), seed).unwrap();
            sim.replicas_mut().iter_mut().for_each(|r| r.mutant = Mutant::AlwaysAdoptSv);
            if let Err(e) = sim.run(400) {
                caught = Some((seed, e));
                break;
            }
        }
        let (seed, e) = caught.expect("no seed caught the mutant");
        assert!(e.contains("S1:") || e.contains("S2:"), "seed {seed}: {e}");
    }

    #[test]
    fn a_seed_replays_exactly() {
        let mut a = Sim::new(SimConfig::default(), 7).unwrap();
        let mut b = Sim::new(SimConfig::default(), 7).unwrap();
        a.run(300).unwrap();
        b.run(300).unwrap();
        assert_eq!(a.history(), b.history());
        assert_eq!((a.hits, a.misses), (b.hits, b.misses));
    }

    #[test]
    fn too_few_replicas_is_an_error() {
        assert_eq!(
            Sim::new(SimConfig { replicas: 1, ..SimConfig::default() }, 0).unwrap_err(),
            "a simulation needs at least 2 replicas, got 1"
        );
    }
}
