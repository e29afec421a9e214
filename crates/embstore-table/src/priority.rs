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
