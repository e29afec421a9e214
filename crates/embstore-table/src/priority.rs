//! A table's prioritiser ([`TablePriority`]): the state its write steps score rows with when
//! it prioritises its writes (`sync::prioritised` holds what the table does with it). Below
//! the table: the table keeps one, and only scores through it.

use embstore_replication::{Prioritiser, Sample, Snapshot};
use parking_lot::Mutex;

use crate::version::now_ms;

/// A table's prioritiser (shared by its shards' write steps).
pub(crate) struct TablePriority {
    prioritiser: Mutex<Prioritiser>,
    pub(crate) model: u32,
}

impl std::fmt::Debug for TablePriority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TablePriority").field("model", &self.model).finish_non_exhaustive()
    }
}

impl TablePriority {
    /// The threshold and statistics of the moment: a write step scores its rows with it,
    /// under no lock of the prioritiser.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.prioritiser.lock().snapshot(self.model)
    }

    /// A write step's samples, taken after it (off the shard's lock).
    pub(crate) fn record(&self, samples: &[Sample]) {
        if !samples.is_empty() {
            self.prioritiser.lock().record(samples, now_ms());
        }
    }
}

impl TablePriority {
    /// A prioritiser for the table's writes, of model `model`.
    pub(crate) fn new(prioritiser: Mutex<Prioritiser>, model: u32) -> Self {
        Self { prioritiser, model }
    }

    /// The prioritiser (its threshold, counts, model shares).
    pub(crate) fn prioritiser(&self) -> &Mutex<Prioritiser> {
        &self.prioritiser
    }
}

/// A write call's scoring: the threshold taken once at the start, each shard step's written
/// rows noted ([`Notes`], no lock shared with other shards), then [`Scoring::finish`] once
/// after every shard stepped, with no lock held: the rule scores all the call's rows in one
/// call, the significant ones are marked in their shards if they still hold that write, and the
/// samples go to the sketch in one batch (one pass through the prioritiser's lock a call, not
/// two a shard).
pub(crate) struct Scoring {
    priority: std::sync::Arc<TablePriority>,
    snapshot: Snapshot,
    shards: parking_lot::Mutex<Vec<(usize, Notes)>>,
}

/// The rows one shard step wrote, for [`Scoring`].
#[derive(Default)]
pub(crate) struct Notes {
    updates: Vec<embstore_replication::Update>,
    written: Vec<crate::Version>,
    model: u32,
    now_ms: u64,
}

impl Notes {
    /// A row written: `key`, its update's 1-norm, its writes before this one, the version the
    /// write left it at, and the shard's young rows (which learn of a creation here and tell
    /// the row's age; `None`: the shard does not sync, so its age is not known).
    #[inline]
    pub(crate) fn note(
        &mut self,
        key: u64,
        l1: f64,
        writes: u64,
        version: crate::Version,
        young: Option<&mut crate::shard::young::YoungRows>,
    ) {
        let age_ms = young.map(|y| y.age(key, writes, self.now_ms));
        self.updates.push(embstore_replication::Update {
            key,
            grad_l1: l1,
            age_ms,
            writes,
            model: self.model,
        });
        self.written.push(version);
    }
}

impl Scoring {
    /// Scoring for a write call of a table with `priority` (None: the table does not score).
    pub(crate) fn start(priority: Option<std::sync::Arc<TablePriority>>) -> Option<Self> {
        let priority = priority?;
        let snapshot = priority.snapshot();
        Some(Self { priority, snapshot, shards: parking_lot::Mutex::new(Vec::new()) })
    }

    /// Empty notes for one shard step.
    pub(crate) fn notes(&self) -> Notes {
        Notes { model: self.priority.model, now_ms: now_ms(), ..Notes::default() }
    }

    /// Shard `s`'s step is done: its notes wait for [`Scoring::finish`].
    pub(crate) fn done(&self, s: usize, notes: Notes) {
        if !notes.updates.is_empty() {
            self.shards.lock().push((s, notes));
        }
    }

    /// Scores the call's rows (no lock held), marks the significant ones in their shards if
    /// they still hold this call's write, and records the samples.
    pub(crate) fn finish(self, shards: &[parking_lot::RwLock<crate::shard::Shard>]) {
        let mut per_shard = self.shards.into_inner();
        if per_shard.is_empty() {
            return;
        }
        per_shard.sort_unstable_by_key(|(s, _)| *s);
        let updates: Vec<embstore_replication::Update> =
            per_shard.iter().flat_map(|(_, n)| n.updates.iter().copied()).collect();
        let mut scored = Vec::with_capacity(updates.len());
        self.snapshot.score_batch(&updates, &mut scored);
        let mut at = 0;
        let mut learnt = None;
        for (s, n) in &per_shard {
            let mine = &scored[at..at + n.updates.len()];
            at += n.updates.len();
            if mine.iter().any(|x| x.0.significant) {
                let mut shard = shards[*s].write();
                for ((u, (sc, _)), v) in n.updates.iter().zip(mine).zip(&n.written) {
                    if sc.significant {
                        shard.note_significant(u.key, *v);
                    }
                }
                learnt = learnt.or_else(|| shard.sync_shared());
            }
        }
        if let Some(shared) = learnt {
            shared.significant_learnt(); // prioritised pulls waiting for one leave now
        }
        let samples: Vec<Sample> = scored.into_iter().map(|s| s.1).collect();
        self.priority.record(&samples);
    }
}
