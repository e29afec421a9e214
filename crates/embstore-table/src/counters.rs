//! A table's event counters (hits, misses, inserts, …): relaxed atomics bumped on the call
//! paths and read by `Table::stats`. A leaf, so the table and its calls name it without naming
//! the stats that report it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Events since the table was made; each a relaxed atomic (a count, never a synchronisation).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) inserts: AtomicU64,
    pub(crate) updates: AtomicU64,
    pub(crate) removed: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) dropped_unadmitted: AtomicU64,
    pub(crate) skipped_non_finite: AtomicU64,
    pub(crate) repaired_on_load: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        if n > 0 {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}
