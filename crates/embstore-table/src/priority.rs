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

/// A write step's scoring: the threshold taken once before the step, each written row noted
/// (its key, the 1-norm of its update, its earlier writes and the version the write left),
/// then [`Scoring::finish`] after the step, with no lock held: the rule scores the rows in one
/// call, the significant ones are marked if they still hold that write, and the samples go to
/// the sketch.
pub(crate) struct Scoring {
    priority: std::sync::Arc<TablePriority>,
    snapshot: Snapshot,
    updates: Vec<embstore_replication::Update>,
    written: Vec<crate::Version>,
}

impl Scoring {
    /// Scoring for a write step of a table with `priority` (None: the table does not score).
    pub(crate) fn start(priority: Option<std::sync::Arc<TablePriority>>) -> Option<Self> {
        let priority = priority?;
        let snapshot = priority.snapshot();
        Some(Self { priority, snapshot, updates: Vec::new(), written: Vec::new() })
    }

    /// A row written: `key`, its update's 1-norm, its writes before this one, and the version
    /// the write left it at.
    #[inline]
    pub(crate) fn note(&mut self, key: u64, l1: f64, writes: u64, version: crate::Version) {
        let model = self.priority.model;
        self.updates.push(embstore_replication::Update {
            key,
            grad_l1: l1,
            age_ms: None,
            writes,
            model,
        });
        self.written.push(version);
    }

    /// Scores the step's rows (no lock held), marks the significant ones in `shard` if they
    /// still hold this step's write, and records the samples.
    pub(crate) fn finish(self, shard: &parking_lot::RwLock<crate::shard::Shard>) {
        if self.updates.is_empty() {
            return;
        }
        let mut scored = Vec::with_capacity(self.updates.len());
        self.snapshot.score_batch(&self.updates, &mut scored);
        if scored.iter().any(|s| s.0.significant) {
            let mut shard = shard.write();
            for ((u, (sc, _)), v) in self.updates.iter().zip(&scored).zip(&self.written) {
                if sc.significant {
                    shard.note_significant(u.key, *v);
                }
            }
        }
        let samples: Vec<Sample> = scored.into_iter().map(|s| s.1).collect();
        self.priority.record(&samples);
    }
}
