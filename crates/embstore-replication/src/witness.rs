//! A witness's store (Ekko §5.3.2, spec §6.2): a replica that takes part in sync but keeps
//! what it receives out of its store, in logs bucketed by the time it arrived, and flushes a
//! bucket into its *healthy* store only once the model was judged healthy past the bucket's
//! end. A rollback then writes only the difference between the healthy store and the keys
//! changed since (the logs), not the model.
//!
//! - [`WitnessLog::log`]: a row taken from a pull reply at `now_ms` goes into bucket
//!   `now / bucket` (the newest version per key and bucket); [`WitnessLog::knew`] records the
//!   live knowledge (VV per part) after the reply, for the bucket.
//! - [`WitnessLog::flush`]: at a healthy decision `t_healthy` (with the corrupted intervals
//!   known), `t_max` = [`choose_t_max`]; every bucket ending by `t_max` is written into the
//!   healthy store last-writer-wins and its knowledge becomes the healthy VV (RB1).
//! - [`WitnessLog::diff`]: what a rollback writes: per key of the remaining logs, its healthy
//!   row, or a removal when the healthy store lacks it (new rows deleted; kept with
//!   `keep_new_rows`) (RB3).
//! - [`WitnessLog::restart`]: a witness that restarts keeps its healthy store and VV and drops
//!   every log (possibly corrupted updates are never flushed: RB4); it pulls again from its
//!   healthy VV and what arrives lands in fresh buckets.
//!
//! Pure: no clock, no I/O; the caller passes times in ms.

use crate::map::PartMap;
use crate::part::{Held, PartStore, PartSync, PartView, ReplyRows};
use crate::replica::Reply;
use crate::steps;
use crate::sv::Sv;
use crate::version::{Clock, Version};
use crate::vv::Vv;
use embstore_common::{Error, ErrorKind, Result};
use std::collections::BTreeMap;

/// A row as a witness keeps it: its version and values (`None`: a removal).
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    /// The write's version.
    pub version: Version,
    /// The values, or `None` for a removal's tombstone.
    pub values: Option<Vec<f32>>,
}

impl Logged {
    /// Whether this entry supersedes `other` for the same key: a newer version, or a removal
    /// of the same version (a key dropped by a complete reply is logged at the version held).
    fn supersedes(&self, other: &Logged) -> bool {
        self.version > other.version
            || (self.version == other.version && self.values.is_none() && other.values.is_some())
    }
}

/// A span of time the model was corrupted, `[start_ms, end_ms)`; `end_ms` None: still is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupted {
    /// Start (ms), inclusive.
    pub start_ms: u64,
    /// End (ms), exclusive; `None` while the model is still corrupted.
    pub end_ms: Option<u64>,
}

impl Corrupted {
    /// Whether the time `t_ms` is inside the span.
    pub fn contains(&self, t_ms: u64) -> bool {
        t_ms >= self.start_ms && self.end_ms.is_none_or(|e| t_ms < e)
    }
}

/// `t_max` for a healthy decision at `t_healthy_ms`: the end of the latest bucket (of
/// `bucket_ms`) that ends by `t_healthy_ms` and whose span `[end − bucket, end)` meets no
/// corrupted interval, provided no bucket after the last flush (`after_ms`) and before it
/// does either (a corrupted bucket is never flushed). `None`: nothing new can be flushed.
pub fn choose_t_max(
    t_healthy_ms: u64,
    bucket_ms: u64,
    after_ms: u64,
    corrupted: &[Corrupted],
) -> Option<u64> {
    if bucket_ms == 0 {
        return None;
    }
    let meets = |start: u64, end: u64| {
        corrupted.iter().any(|c| c.start_ms < end && c.end_ms.is_none_or(|e| e > start))
    };
    let last_end = t_healthy_ms / bucket_ms * bucket_ms;
    if last_end <= after_ms {
        return None;
    }
    // The first corrupted instant after the last flush bounds how far a flush may go.
    let first_bad = corrupted
        .iter()
        .filter(|c| c.end_ms.is_none_or(|e| e > after_ms))
        .map(|c| c.start_ms.max(after_ms))
        .min();
    let end = match first_bad {
        Some(bad) if bad < last_end => bad / bucket_ms * bucket_ms,
        _ => last_end,
    };
    (end > after_ms && !meets(end.saturating_sub(bucket_ms), end)).then_some(end)
}

/// A witness's logs and healthy store, over `parts` sync parts.
#[derive(Clone, Debug)]
pub struct WitnessLog {
    bucket_ms: u64,
    /// Unflushed rows by bucket start, newest per key.
    logs: BTreeMap<u64, BTreeMap<u64, Logged>>,
    /// Per bucket start, the live knowledge of each part after the bucket's last reply.
    knew: BTreeMap<u64, BTreeMap<u32, Vv>>,
    healthy: BTreeMap<u64, Logged>,
    vv_healthy: Vec<Vv>,
    t_max: u64,
    /// Per key the newest version of the healthy store and the logs together.
    newest: BTreeMap<u64, Version>,
}

impl WitnessLog {
    /// An empty witness over `parts` parts, logging in buckets of `bucket_ms` (1 s by the
    /// spec).
    pub fn new(parts: u32, bucket_ms: u64) -> Result<Self> {
        if bucket_ms == 0 || parts == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("a witness needs parts and a bucket length, got {parts} parts of {bucket_ms} ms"),
            ));
        }
        Ok(Self {
            bucket_ms,
            logs: BTreeMap::new(),
            knew: BTreeMap::new(),
            healthy: BTreeMap::new(),
            vv_healthy: vec![Vv::new(); parts as usize],
            t_max: 0,
            newest: BTreeMap::new(),
        })
    }

    /// A witness restarted from its healthy store and healthy VV (what it persisted).
    pub fn from_healthy(
        bucket_ms: u64,
        healthy: BTreeMap<u64, Logged>,
        vv_healthy: Vec<Vv>,
        t_max: u64,
    ) -> Result<Self> {
        let mut w = Self::new(vv_healthy.len() as u32, bucket_ms)?;
        w.newest = healthy.iter().map(|(k, r)| (*k, r.version)).collect();
        w.healthy = healthy;
        w.vv_healthy = vv_healthy;
        w.t_max = t_max;
        Ok(w)
    }

    /// The bucket length, ms.
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    fn bucket(&self, now_ms: u64) -> u64 {
        now_ms / self.bucket_ms * self.bucket_ms
    }

    /// Logs a row received at `now_ms` (kept when newer than the bucket's entry for `key`).
    pub fn log(&mut self, now_ms: u64, key: u64, row: Logged) {
        let b = self.bucket(now_ms);
        if self.newest.get(&key).is_none_or(|v| *v < row.version) {
            self.newest.insert(key, row.version);
        }
        let bucket = self.logs.entry(b).or_default();
        if bucket.get(&key).is_none_or(|old| row.supersedes(old)) {
            bucket.insert(key, row);
        }
    }

    /// Records the live knowledge `vv` of `part` after a reply applied at `now_ms`: it covers
    /// the healthy store and every bucket up to this one.
    pub fn knew(&mut self, now_ms: u64, part: u32, vv: &Vv) {
        let b = self.bucket(now_ms);
        self.knew.entry(b).or_default().insert(part, vv.clone());
    }

    /// Flushes the buckets that end by `t_max` = [`choose_t_max`]`(t_healthy_ms, ...)` into
    /// the healthy store, last writer wins, and takes their knowledge as the healthy VV.
    /// Returns the new `t_max`, or `None` when nothing could be flushed (it stays).
    pub fn flush(&mut self, t_healthy_ms: u64, corrupted: &[Corrupted]) -> Option<u64> {
        self.flush_changed(t_healthy_ms, corrupted).map(|(t, _)| t)
    }

    /// [`WitnessLog::flush`], answering also the keys whose healthy row it changed (in key
    /// order), so that a caller that persists the healthy store writes only those.
    pub fn flush_changed(
        &mut self,
        t_healthy_ms: u64,
        corrupted: &[Corrupted],
    ) -> Option<(u64, Vec<u64>)> {
        let t_max = choose_t_max(t_healthy_ms, self.bucket_ms, self.t_max, corrupted)?;
        let ends_by = |b: &u64| b + self.bucket_ms <= t_max;
        let flushed: Vec<u64> = self.logs.keys().copied().filter(ends_by).collect();
        let mut changed = Vec::new();
        for b in flushed {
            for (key, row) in self.logs.remove(&b).unwrap_or_default() {
                if self.healthy.get(&key).is_none_or(|old| row.supersedes(old)) {
                    self.healthy.insert(key, row);
                    changed.push(key);
                }
            }
        }
        changed.sort_unstable();
        changed.dedup();
        let known: Vec<u64> = self.knew.keys().copied().filter(ends_by).collect();
        for b in known {
            for (part, vv) in self.knew.remove(&b).unwrap_or_default() {
                if let Some(h) = self.vv_healthy.get_mut(part as usize) {
                    h.merge(&vv);
                }
            }
        }
        self.t_max = t_max;
        Some((t_max, changed))
    }

    /// The last `t_max` flushed to (0: none).
    pub fn t_max(&self) -> u64 {
        self.t_max
    }

    /// The healthy store.
    pub fn healthy(&self) -> &BTreeMap<u64, Logged> {
        &self.healthy
    }

    /// The healthy VV of each part.
    pub fn vv_healthy(&self) -> &[Vv] {
        &self.vv_healthy
    }

    /// The distinct keys of the unflushed logs, in key order.
    pub fn logged_keys(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.logs.values().flat_map(|b| b.keys().copied()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Unflushed buckets.
    pub fn buckets(&self) -> usize {
        self.logs.len()
    }

    /// What a rollback to `t_max` writes (step ③): per key of the remaining logs, its healthy
    /// values; a key the healthy store lacks (created after `t_max`) is removed (`None`), or
    /// left as it is with `keep_new_rows`. In key order.
    pub fn diff(&self, keep_new_rows: bool) -> Vec<(u64, Option<Vec<f32>>)> {
        self.logged_keys()
            .into_iter()
            .filter_map(|k| match self.healthy.get(&k) {
                Some(row) => Some((k, row.values.clone())),
                None if keep_new_rows => None,
                None => Some((k, None)),
            })
            .collect()
    }

    /// Drops every log (step ④: the rollback's writes supersede them).
    pub fn clear_logs(&mut self) {
        self.logs.clear();
        self.knew.clear();
    }

    /// The witness after a restart: the healthy store, its VV and `t_max` only (RB4: logs from
    /// before the restart are never flushed).
    pub fn restart(&self) -> Self {
        Self {
            bucket_ms: self.bucket_ms,
            logs: BTreeMap::new(),
            knew: BTreeMap::new(),
            healthy: self.healthy.clone(),
            vv_healthy: self.vv_healthy.clone(),
            t_max: self.t_max,
            newest: self.healthy.iter().map(|(k, r)| (*k, r.version)).collect(),
        }
    }

    /// The newest version `key` has in the healthy store and the logs together.
    pub fn newest(&self, key: u64) -> Option<Version> {
        self.newest.get(&key).copied()
    }

    /// The keys of the healthy store and the logs together, in key order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.newest.keys().copied()
    }
}

/// A witness replica: it pulls like any follower (the same [`steps::apply`]), but what it
/// takes goes into its [`WitnessLog`], not into a store it serves; its knowledge covers the
/// healthy store and the logs. It never prioritises (spec §5.3).
#[derive(Clone, Debug)]
pub struct Witness {
    id: u32,
    dim: usize,
    map: PartMap,
    clock: Clock,
    log: WitnessLog,
    parts: Vec<(PartSync, Vv)>,
}

/// A witness's part as the steps see it, at the time a reply arrives.
struct WitnessAt<'a> {
    log: &'a mut WitnessLog,
    part: &'a mut (PartSync, Vv),
    clock: &'a mut Clock,
    id: u32,
    map: PartMap,
    index: u32,
    now_ms: u64,
}

impl PartView for WitnessAt<'_> {
    fn sync(&self) -> &PartSync {
        &self.part.0
    }

    fn floor(&self) -> &Vv {
        &self.part.1
    }

    fn keys(&self, out: &mut Vec<u64>) {
        out.extend(self.log.keys().filter(|k| self.map.part_of(*k) == self.index));
    }
}

impl PartStore for WitnessAt<'_> {
    type Reply = Reply;
    type Slot = ();

    fn sync_mut(&mut self) -> &mut PartSync {
        &mut self.part.0
    }

    fn floor_mut(&mut self) -> &mut Vv {
        &mut self.part.1
    }

    fn held(&self, key: u64) -> Option<Held<()>> {
        self.log.newest(key).map(|v| Held::Row(v, ()))
    }

    fn put(&mut self, reply: &Reply, i: usize, key: u64, _at: Option<()>) -> Result<()> {
        let row = &reply.rows[i].1;
        let values = (!row.deleted).then(|| row.values.clone());
        self.log.log(self.now_ms, key, Logged { version: row.version, values });
        Ok(())
    }

    fn drop_key(&mut self, key: u64, held: Held<()>) {
        // Removed at the responder: a change like any other, logged as a removal.
        self.log.log(self.now_ms, key, Logged { version: held.version(), values: None });
    }

    fn observe(&mut self, v: Version) {
        self.clock.observe(v.timestamp);
    }

    fn fresh_sv(&mut self) -> Sv {
        Sv::new(self.clock.tick(0).unwrap_or(u64::MAX), self.id)
    }
}

impl Witness {
    /// A witness named `id` over the parts of `map`, rows of `dim` floats, logging in buckets
    /// of `bucket_ms`.
    pub fn new(id: u32, map: PartMap, dim: usize, bucket_ms: u64) -> Result<Self> {
        let log = WitnessLog::new(map.parts(), bucket_ms)?;
        Ok(Self::with_log(id, map, dim, log))
    }

    fn with_log(id: u32, map: PartMap, dim: usize, log: WitnessLog) -> Self {
        let parts = log
            .vv_healthy()
            .iter()
            .map(|vv| {
                let sync = PartSync {
                    vv: vv.clone(),
                    sv: Sv::new(0, id),
                    cache: crate::cache::UpdateCache::covering(vv.clone()),
                    ..PartSync::default()
                };
                (sync, Vv::new())
            })
            .collect();
        let mut clock = Clock::new();
        for r in log.healthy().values() {
            clock.observe(r.version.timestamp);
        }
        Self { id, dim, map, clock, log, parts }
    }

    /// The witness's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The number of parts.
    pub fn parts(&self) -> u32 {
        self.parts.len() as u32
    }

    /// Part `part`'s knowledge: the healthy store's and the logs' (what a pull sends).
    pub fn vv(&self, part: u32) -> Result<&Vv> {
        self.parts.get(part as usize).map(|p| &p.0.vv).ok_or_else(|| {
            Error::new(ErrorKind::InvalidArgument, format!("part {part} out of range"))
        })
    }

    /// The logs and the healthy store.
    pub fn log(&self) -> &WitnessLog {
        &self.log
    }

    /// Applies a pull's reply that arrived at `now_ms` ([`steps::apply`]): its rows go to the
    /// logs' bucket of `now_ms`, and the bucket records the part's knowledge after it.
    pub fn apply_reply(&mut self, reply: &Reply, now_ms: u64) -> Result<usize> {
        let index = reply.part;
        if index as usize >= self.parts.len() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("part {index} out of range"),
            ));
        }
        for (k, r) in &reply.rows {
            if !r.deleted && r.values.len() != self.dim {
                return Err(Error::new(
                    ErrorKind::ShapeMismatch,
                    format!("values must have {} floats, got {}", self.dim, r.values.len()),
                ));
            }
            if self.map.part_of(*k) != index {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("key {k} is not in part {index}"),
                ));
            }
        }
        let mut at = WitnessAt {
            log: &mut self.log,
            part: &mut self.parts[index as usize],
            clock: &mut self.clock,
            id: self.id,
            map: self.map,
            index,
            now_ms,
        };
        let missing = steps::missing(&at, reply);
        let applied = steps::apply(&mut at, reply, &missing)?;
        if !reply.partial() {
            let vv = self.parts[index as usize].0.vv.clone();
            self.log.knew(now_ms, index, &vv);
        }
        Ok(applied.written)
    }

    /// A healthy decision at `t_healthy_ms`: [`WitnessLog::flush`].
    pub fn flush(&mut self, t_healthy_ms: u64, corrupted: &[Corrupted]) -> Option<u64> {
        self.log.flush(t_healthy_ms, corrupted)
    }

    /// Step ③ of a rollback: [`WitnessLog::diff`].
    pub fn diff(&self, keep_new_rows: bool) -> Vec<(u64, Option<Vec<f32>>)> {
        self.log.diff(keep_new_rows)
    }

    /// Step ④'s end: the logs are superseded by the rollback's writes.
    pub fn clear_logs(&mut self) {
        self.log.clear_logs();
    }

    /// The witness after a restart (RB4): its healthy store and healthy VV, no log; it pulls
    /// again from that knowledge.
    pub fn restart(&self) -> Self {
        Self::with_log(self.id, self.map, self.dim, self.log.restart())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ts: u64, x: f32) -> Logged {
        Logged { version: Version::new(ts, 0), values: Some(vec![x]) }
    }

    #[test]
    fn t_max_stays_out_of_corrupted_time() {
        let open = |s| Corrupted { start_ms: s, end_ms: None };
        let closed = |s, e| Corrupted { start_ms: s, end_ms: Some(e) };
        assert_eq!(choose_t_max(10_500, 1_000, 0, &[]), Some(10_000));
        assert_eq!(choose_t_max(10_500, 1_000, 10_000, &[]), None, "nothing new");
        assert_eq!(choose_t_max(10_500, 1_000, 0, &[open(7_300)]), Some(7_000));
        assert_eq!(choose_t_max(10_500, 1_000, 0, &[open(7_000)]), Some(7_000));
        // A corrupted span after the last flush bounds the flush even once it has ended.
        assert_eq!(choose_t_max(20_500, 1_000, 0, &[closed(7_300, 9_000)]), Some(7_000));
        // ... but one before the last flush does not.
        assert_eq!(choose_t_max(20_500, 1_000, 9_000, &[closed(7_300, 9_000)]), Some(20_000));
        assert_eq!(choose_t_max(20_500, 1_000, 7_000, &[open(7_300)]), None);
        assert_eq!(choose_t_max(20_500, 0, 0, &[]), None);
    }

    #[test]
    fn a_flush_takes_whole_buckets_up_to_t_max_and_a_restart_drops_the_rest() {
        let mut w = WitnessLog::new(1, 1_000).unwrap();
        w.log(100, 1, row(1, 1.0));
        w.log(900, 1, row(2, 2.0));
        w.log(1_500, 2, row(3, 3.0));
        w.log(2_100, 1, row(4, 4.0));
        let mut vv = Vv::new();
        vv.raise(0, 2);
        w.knew(900, 0, &vv);
        vv.raise(0, 4);
        w.knew(2_100, 0, &vv);
        assert_eq!(w.flush(2_050, &[]), Some(2_000));
        assert_eq!(w.healthy().get(&1), Some(&row(2, 2.0)));
        assert_eq!(w.healthy().get(&2), Some(&row(3, 3.0)));
        assert_eq!(w.vv_healthy()[0].get(0), 2);
        assert_eq!(w.logged_keys(), vec![1]);
        assert_eq!(w.diff(false), vec![(1, Some(vec![2.0]))]);
        w.log(2_200, 9, row(5, 9.0));
        assert_eq!(w.diff(false), vec![(1, Some(vec![2.0])), (9, None)]);
        assert_eq!(w.diff(true), vec![(1, Some(vec![2.0]))]);
        let r = w.restart();
        assert_eq!(r.buckets(), 0);
        assert_eq!(r.healthy(), w.healthy());
        let mut r = r;
        assert_eq!(r.flush(10_000, &[]), Some(10_000));
        assert_eq!(r.healthy().get(&1), Some(&row(2, 2.0)), "pre-restart logs never flushed");
    }

    #[test]
    fn a_witness_without_parts_or_buckets_is_refused() {
        assert_eq!(WitnessLog::new(0, 1_000).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(WitnessLog::new(4, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
