//! SLO-aware priority in a table (`docs/dissemination.md`, "Priority when the WAN is short"):
//! the table scores its own writes ([`Table::set_priority`]; `apply_gradients` scores each
//! row from its gradient's 1-norm and its write count), marks the significant ones (their
//! sigv), and answers and applies prioritised pulls ([`Table::sync_pull_prioritised`],
//! [`Table::sync_apply_prioritised`]) with the protocol's steps
//! (`embstore_replication::prioritised`). Reads consult the significant store: a row taken
//! ahead of normal sync is served until normal sync brings it (or a newer one).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use embstore_replication::{prioritised, PartView, Prioritiser, PriorityConfig, PriorityFn};
use parking_lot::Mutex;

use super::part::TablePart;
use super::{PrioritisedReply, Vv};
use crate::priority::TablePriority;
use crate::tier::Gate;
use crate::write::clock_horizon;
use crate::{Error, ErrorKind, Result, RowMeta, Table, Version, MAX_REPLICA};

/// How a table prioritises its writes: the threshold's configuration, the rule, and the model
/// (a group of tables that share request counts) the table belongs to.
#[derive(Clone, Debug)]
pub struct Priority {
    /// The percentile and windows ([`PriorityConfig::default`]: k = 99).
    pub config: PriorityConfig,
    /// The rule (`embstore_replication::EkkoPriority`, or the user's).
    pub rule: Arc<dyn PriorityFn>,
    /// The table's model, for `p_m`.
    pub model: u32,
}

/// What a responder sent one requester by prioritised pulls of the whole table
/// ([`Table::sync_pull_prioritised_all`]): per part the TSVV the requester has at least, and
/// where the table stood then. Kept per connection.
#[derive(Clone, Debug, Default)]
pub struct PrioritisedSent {
    seq: Option<u64>,
    asked: Vv,
    parts: Vec<Vv>,
}

/// What a table's prioritiser has seen, and its significant stores.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PriorityStats {
    /// The percentile `k` (None: the table does not score its writes, a follower).
    pub k: Option<f64>,
    /// The current threshold `p_k` (None before any write).
    pub p_k: Option<f64>,
    /// Row writes scored, and how many were significant.
    pub scored: u64,
    pub significant: u64,
    /// Entries in the significant stores (rows taken ahead of normal sync).
    pub significant_entries: usize,
    /// Whether prioritised sync runs (off during a rollback).
    pub enabled: bool,
    /// Rows created in the last ten minutes whose creation time the table keeps (the
    /// freshness term of their writes' priority).
    pub young_rows: usize,
}

impl Table {
    /// Scores this table's writes from now on (`Some`), or stops (`None`): rows written by
    /// `apply_gradients` with a priority at or above the `k`-th percentile of the recent ones
    /// are significant, and travel ahead of the rest on a congested link. A table that does
    /// not sync takes it and scores nothing until it syncs.
    pub fn set_priority(&self, priority: Option<Priority>) -> Result<()> {
        let p = match priority {
            Some(p) => Some(Arc::new(TablePriority::new(
                Mutex::new(Prioritiser::new(p.config, p.rule)?),
                p.model,
            ))),
            None => None,
        };
        *self.priority.write() = p;
        Ok(())
    }

    /// The prioritiser of the write steps, when the table scores its writes and syncs.
    pub(crate) fn prioritiser(&self) -> Option<Arc<TablePriority>> {
        self.sync.get()?;
        self.priority.read().clone()
    }

    /// What the table's prioritiser has seen and what its significant stores hold (`None`:
    /// the table neither scores its writes nor syncs).
    pub fn priority_stats(&self) -> Option<PriorityStats> {
        let p = self.priority.read().clone();
        if p.is_none() && self.sync.get().is_none() {
            return None;
        }
        let (mut entries, mut young) = (0, 0);
        for s in self.shards.iter() {
            if let Some(sy) = s.read().sync.as_ref() {
                entries += sy.significant_len;
                young += sy.young.len();
            }
        }
        let mut out = PriorityStats {
            significant_entries: entries,
            young_rows: young,
            enabled: !self.priority_off.load(Ordering::Relaxed),
            ..PriorityStats::default()
        };
        if let Some(p) = p {
            let pr = p.prioritiser().lock();
            (out.scored, out.significant) = pr.counts();
            (out.k, out.p_k) = (Some(pr.config().k), pr.p_k());
        }
        Some(out)
    }

    /// Sets each model's share of inference requests (`p_m`), from counts.
    pub fn set_model_shares(&self, counts: &std::collections::HashMap<u32, f64>) {
        if let Some(p) = self.priority.read().clone() {
            p.prioritiser().lock().set_model_shares(counts);
        }
    }

    /// Switches prioritised sync off (a rollback: every significant store emptied, `tsvv =
    /// svv`, prioritised pulls refused either way) or back on.
    pub fn set_prioritised_sync(&self, on: bool) -> Result<()> {
        self.priority_off.store(!on, Ordering::Relaxed);
        if !on {
            for shard in self.shards.iter() {
                if let Some(sy) = shard.write().sync.as_mut() {
                    sy.disable_priority();
                }
            }
        }
        Ok(())
    }

    /// Part `part`'s significant knowledge: its SVV (significant writes its rows hold) and
    /// TSVV (those and the ones taken ahead), what a prioritised pull sends.
    pub fn sync_significant_knowledge(&self, part: u32) -> Result<(Vv, Vv)> {
        let (s, sub) = self.check_part(part)?;
        let shard = self.shards[s].read();
        let p = &shard.sync.as_ref().expect("a syncing table's shards sync").parts[sub];
        Ok((p.svv.clone(), p.tsvv.clone()))
    }

    /// Per id of `ids`, the version of its newest significant write here (`None`: none): a
    /// write was significant when its row's version equals this. For measuring and debugging.
    pub fn significant_versions(&self, ids: &[u64]) -> Result<Vec<Option<Version>>> {
        self.sync_shared()?;
        Ok(ids
            .iter()
            .map(|&k| {
                let shard = self.shards[self.shard_of(k)].read();
                let sy = shard.sync.as_ref().expect("a syncing table's shards sync");
                sy.parts[sy.sub(k)].sig.get(k)
            })
            .collect())
    }

    fn check_prioritised(&self) -> Result<()> {
        if self.priority_off.load(Ordering::Relaxed) {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("table '{}' has prioritised sync off (a rollback runs)", self.name()),
            ));
        }
        Ok(())
    }

    /// The rows of `part` with significant writes that a requester whose TSVV is `tsvv_r`
    /// lacks, each the newest of this table's row and significant entry, with the part's
    /// TSVV read before selecting (no scan: the part's sigv index and its significant store).
    pub fn sync_pull_prioritised(&self, part: u32, tsvv_r: &Vv) -> Result<PrioritisedReply> {
        self.check_live()?;
        self.check_prioritised()?;
        let (s, sub) = self.check_part(part)?;
        let d = self.dim();
        let mut r = PrioritisedReply { part, ..PrioritisedReply::default() };
        let mut cold = Vec::new();
        let files = self.cold_files();
        {
            let shard = self.shards[s].read();
            let view = TablePart::view(self, &shard, sub);
            r.tsvv = prioritised::plan_prioritised(&view).tsvv;
            let sy = shard.sync.as_ref().expect("a syncing table's shards sync");
            let entries = sy.significant[sub].iter().map(|(k, e)| (*k, e.sigv));
            let keys = prioritised::prioritised_keys(&view, tsvv_r, entries);
            for k in keys {
                let sigv_row = view.sync().sig.get(k).unwrap_or_default();
                let entry = sy.significant(k);
                let row = shard.slot(k).map(|slot| (slot, shard.meta[slot].unpack()));
                let tomb = sy.tombs.get(&k).copied();
                let store_v = row.map(|r| r.1.version).or(tomb).unwrap_or_default();
                match entry {
                    Some(e) if e.version > store_v => {
                        let meta = RowMeta {
                            version: e.version,
                            update_count: 0,
                            last_update_ms: e.version.ms(),
                        };
                        push(&mut r, k, meta, e.sigv.max(sigv_row), e.values.as_deref(), d);
                    }
                    _ => match (row, tomb) {
                        (Some((slot, meta)), _) => shard.values.with_row(slot, |values| {
                            push(&mut r, k, meta, sigv_row, Some(values), d)
                        }),
                        (None, _) if shard.cold_loc(k).is_some() => {
                            cold.push((k, shard.cold_loc(k).expect("checked"), sigv_row));
                        }
                        (None, Some(v)) => {
                            let meta =
                                RowMeta { version: v, update_count: 0, last_update_ms: v.ms() };
                            push(&mut r, k, meta, sigv_row, None, d);
                        }
                        (None, None) => {}
                    },
                }
            }
        }
        if let (false, Some(files)) = (cold.is_empty(), &files) {
            let locs: Vec<_> = cold.iter().map(|(k, l, _)| (*k, *l)).collect();
            for ((k, _, sigv), rec) in cold.iter().zip(self.read_cold(files, &locs)?) {
                push(&mut r, *k, rec.meta, *sigv, Some(&rec.values), d);
            }
            r.sort_by_key();
        }
        Ok(r)
    }

    /// What every part's TSVV knows (their pointwise min): a requester that sends it in one
    /// prioritised pull of the whole table ([`Table::sync_pull_prioritised_all`]) gets every
    /// significant write it lacks in any part (and some it has, in parts that know more).
    pub fn sync_tsvv_min(&self) -> Result<Vv> {
        let parts = self.sync_shared()?.layout.parts();
        let mut out: Option<Vv> = None;
        for part in 0..parts {
            let tsvv = self.sync_significant_knowledge(part)?.1;
            out = Some(match out {
                None => tsvv,
                Some(o) => o.meet(&tsvv),
            });
        }
        Ok(out.unwrap_or_default())
    }

    /// A prioritised pull of every part for a requester knowing at least `tsvv_r` in each,
    /// and `known[part]` where given (what earlier pulls of this requester sent it: a
    /// responder keeps it per connection, so that a request stays a few bytes and nothing is
    /// sent twice). Each part's reply that carries rows is handed to `emit`, in part order, and
    /// `known` is updated as if the requester applied them (it is resized to the parts).
    /// Returns this table's [`Table::sync_tsvv_min`] read before any row (R1): once the
    /// replies are applied the requester knows at least that in every part
    /// ([`Table::sync_learn_tsvv_all`]).
    ///
    /// With nothing learnt since the requester's last pull, it waits up to `wait` for a
    /// significant write (a long-poll: a row taken ahead leaves as soon as it is written,
    /// not at the requester's next poll).
    pub fn sync_pull_prioritised_all(
        &self,
        tsvv_r: &Vv,
        known: &mut PrioritisedSent,
        wait: Duration,
        emit: &mut dyn FnMut(PrioritisedReply) -> Result<()>,
    ) -> Result<Vv> {
        self.check_prioritised()?;
        let shared = self.sync_shared()?;
        // Read before anything else: a significant write learnt from now on moves it on.
        let mut seq = shared.sig_seq.load(Ordering::Acquire);
        let mut min = self.sync_tsvv_min()?;
        if known.seq == Some(seq) && tsvv_r.dominates(&known.asked) {
            // Nothing learnt since the last pull, which sent all there was.
            if wait.is_zero() || !shared.wait_significant(seq, wait) {
                return Ok(min);
            }
            seq = shared.sig_seq.load(Ordering::Acquire);
            min = self.sync_tsvv_min()?;
        }
        let parts = shared.layout.parts() as usize;
        known.parts.resize(parts, Vv::new());
        known.seq = Some(seq);
        known.asked = tsvv_r.clone();
        for (part, knows) in known.parts.iter_mut().enumerate() {
            knows.merge(tsvv_r);
            let r = self.sync_pull_prioritised(part as u32, knows)?;
            knows.merge(&r.tsvv);
            if !r.is_empty() {
                emit(r)?;
            }
        }
        Ok(min)
    }

    /// After every reply of [`Table::sync_pull_prioritised_all`] was applied: each part's TSVV
    /// learns `tsvv` (the responder's, read before its rows).
    pub fn sync_learn_tsvv_all(&self, tsvv: &Vv) -> Result<()> {
        self.check_live()?;
        self.check_prioritised()?;
        for shard in self.shards.iter() {
            if let Some(sy) = shard.write().sync.as_mut() {
                for p in &mut sy.parts {
                    p.tsvv.merge(tsvv);
                }
            }
        }
        Ok(())
    }

    /// Applies a prioritised reply (from [`Table::sync_pull_prioritised`] at a peer): each
    /// row newer than both this table's row and its significant entry becomes the entry (read
    /// ahead of the row until normal sync supersedes it); then the part's TSVV merges the
    /// responder's. A reply that fails a check changes nothing. Returns the entries written.
    pub fn sync_apply_prioritised(&self, reply: &PrioritisedReply) -> Result<usize> {
        self.check_live()?;
        self.check_prioritised()?;
        let sync = self.sync_shared()?.clone();
        self.check_prioritised_reply(reply)?;
        let (s, sub) = sync.layout.split(reply.part);
        // A tiered table brings the rows into memory first, so each key's version is at hand.
        let _entered = self.enter(&reply.keys)?;
        let mut guard = self.shards[s].write();
        let written =
            prioritised::apply_prioritised(&mut TablePart::store(self, &mut guard, sub), reply)?;
        drop(guard);
        drop(_entered);
        if written > 0 {
            sync.significant_learnt(); // wake the prioritised pulls of this table's followers
        }
        Ok(written)
    }

    fn check_prioritised_reply(&self, r: &PrioritisedReply) -> Result<()> {
        let layout = self.sync_shared()?.layout;
        self.check_part(r.part)?;
        let n = r.keys.len();
        if r.tombstone.len() != n || r.sigv.len() != n {
            return Err(Error::shape(format!(
                "a prioritised reply of {n} keys carries {} tombstone flags and {} sigvs",
                r.tombstone.len(),
                r.sigv.len()
            )));
        }
        self.check_rows("values", n, r.values.len(), self.dim())?;
        self.check_meta(&r.keys, &r.meta)?;
        self.check_finite(&r.keys, &r.values, crate::write::StateIn::Init)?;
        let horizon = clock_horizon();
        for (k, (m, sigv)) in r.keys.iter().zip(r.meta.iter().zip(&r.sigv)) {
            if layout.part_of(*k) != r.part {
                return Err(Error::invalid(format!(
                    "key {k} is not in sync part {}; nothing was applied",
                    r.part
                )));
            }
            if m.version == Version::default() || *sigv > m.version {
                return Err(Error::invalid(format!(
                    "key {k} carries version {:?} with significant version {sigv:?}; nothing \
                     was applied",
                    m.version
                )));
            }
        }
        for &(o, t) in r.tsvv.entries() {
            if t > horizon || o > MAX_REPLICA {
                return Err(Error::invalid(format!(
                    "the reply's TSVV holds ({o}, {t}), past this clock by more than a day or \
                     from a replica id over 2^31 - 1; nothing was applied"
                )));
            }
        }
        Ok(())
    }
}

/// Appends a row (or a removal, `values` None) to a prioritised reply.
fn push(
    r: &mut PrioritisedReply,
    key: u64,
    meta: RowMeta,
    sigv: Version,
    values: Option<&[f32]>,
    d: usize,
) {
    r.keys.push(key);
    r.meta.push(meta);
    r.sigv.push(sigv);
    r.tombstone.push(values.is_none());
    match values {
        Some(v) => r.values.extend_from_slice(v),
        None => r.values.resize(r.values.len() + d, 0.0),
    }
}

impl PrioritisedReply {
    /// Rows in the reply.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the reply carries no row.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Puts the rows in key order.
    fn sort_by_key(&mut self) {
        let n = self.len();
        let d = self.values.len() / n.max(1);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| self.keys[i]);
        self.values = order.iter().flat_map(|&i| self.values[i * d..][..d].to_vec()).collect();
        self.keys = order.iter().map(|&i| self.keys[i]).collect();
        self.meta = order.iter().map(|&i| self.meta[i]).collect();
        self.sigv = order.iter().map(|&i| self.sigv[i]).collect();
        self.tombstone = order.iter().map(|&i| self.tombstone[i]).collect();
    }
}
