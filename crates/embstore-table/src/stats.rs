//! Counters and sizes of a table: [`TableStats`] (O(shards), cheap enough to poll) and
//! [`IndexStats`] (a full scan of every shard's index, for diagnosis).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::tier::Gate;
use crate::Table;

/// Counters and sizes of a table (see [`Table::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Rows stored (in memory and, with a memory budget, on disk).
    pub rows: usize,
    /// Of those, rows held only on disk (0 without a memory budget).
    pub rows_on_disk: usize,
    /// Rows read back from disk, the reads that brought them (records that share a block or
    /// lie close are read together) and the bytes those reads moved (each read is whole
    /// logical blocks of the device, 512 B on most disks), rows moved from memory to disk, and
    /// the eviction rounds that ran (each may move none: its victims turned out pinned or dirty
    /// again), so far.
    pub cold_reads: u64,
    pub cold_read_ios: u64,
    pub cold_read_bytes: u64,
    pub evicted_to_disk: u64,
    pub eviction_rounds: u64,
    /// Evictions that failed (a full disk, say: their rows stayed in memory, and the next call
    /// over the budget failed with the same error), and the last one's message, kept after
    /// later evictions succeed.
    pub eviction_errors: u64,
    pub last_eviction_error: Option<String>,
    /// Bytes allocated: indexes, arenas, metadata, free lists, the admission sketch. An
    /// upper bound on resident memory (zeroed pages that were never touched are not resident).
    pub bytes_reserved: usize,
    /// Bytes that hold live rows: their values, optimizer state, metadata (16 B) and index
    /// bucket (16 B).
    pub bytes_used: usize,
    /// Looked-up ids that had a row.
    pub hits: u64,
    /// Looked-up ids that had no row.
    pub misses: u64,
    /// Rows created.
    pub inserts: u64,
    /// Row writes: optimizer steps and assignments.
    pub updates: u64,
    /// Rows removed by `remove`.
    pub removed: u64,
    /// Rows removed by `evict_expired`.
    pub evicted: u64,
    /// Gradients dropped because their id was not admitted yet.
    pub dropped_unadmitted: u64,
    /// Ids skipped for a non-finite gradient (with [`NonFinite::Skip`](crate::NonFinite)), or
    /// whose step would have made their row non-finite.
    pub skipped_non_finite: u64,
    /// Rows read by `load` whose values or optimizer state were not finite (written by an
    /// older embstore): their state was reset and, for non-finite values, the row re-initialised.
    pub repaired_on_load: u64,
    /// `apply_gradients` calls so far (Adam's `t`).
    pub step: u64,
    /// Rows per shard.
    pub rows_per_shard: Vec<usize>,
}

/// The structure of a table's indexes, from a full scan (see [`Table::index_stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct IndexStats {
    /// Keys over all shards.
    pub len: usize,
    /// Buckets over all shards.
    pub capacity: usize,
    /// Average probed cachelines per successful lookup, over every key (`None`: no key).
    pub apcl: Option<f64>,
    /// Keys in the longest chain of any shard.
    pub longest_chain: usize,
    /// Keys stored away from their home bucket.
    pub displaced: usize,
}

impl Table {
    /// Counters and sizes: O(shards), each shard's lock held only to read a few sizes.
    pub fn stats(&self) -> TableStats {
        let mut rows_per_shard = Vec::with_capacity(self.shards.len());
        let mut reserved = self.sketch_bytes();
        let mut used = 0;
        for shard in self.shards.iter() {
            let shard = shard.read();
            rows_per_shard.push(shard.len());
            reserved += shard.bytes_reserved() + shard.cold_bytes();
            used += shard.bytes_used();
        }
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows_on_disk = self.cold_rows();
        let tier = self.tier_counts();
        TableStats {
            rows: rows_per_shard.iter().sum::<usize>() + rows_on_disk,
            bytes_reserved: reserved,
            bytes_used: used,
            hits: get(&c.hits),
            misses: get(&c.misses),
            inserts: get(&c.inserts),
            updates: get(&c.updates),
            removed: get(&c.removed),
            evicted: get(&c.evicted),
            dropped_unadmitted: get(&c.dropped_unadmitted),
            skipped_non_finite: get(&c.skipped_non_finite),
            repaired_on_load: get(&c.repaired_on_load),
            rows_on_disk,
            cold_reads: tier.cold_reads,
            cold_read_ios: tier.cold_ios,
            cold_read_bytes: tier.cold_bytes,
            evicted_to_disk: tier.evicted_rows,
            eviction_rounds: tier.eviction_rounds,
            eviction_errors: tier.errors,
            last_eviction_error: tier.last_error,
            step: self.step(),
            rows_per_shard,
        }
    }

    /// Scans every shard's index (O(capacity), each under its shard's read lock): load, exact
    /// APCL, longest chain. For diagnosis; [`Table::stats`] is the one to poll.
    pub fn index_stats(&self) -> IndexStats {
        let mut out = IndexStats::default();
        let mut lines = 0.0;
        for shard in self.shards.iter() {
            let s = shard.read().index.stats();
            out.len += s.len;
            out.capacity += s.capacity;
            out.longest_chain = out.longest_chain.max(s.longest_chain);
            out.displaced += s.displaced;
            lines += s.apcl.unwrap_or(0.0) * s.len as f64;
        }
        out.apcl = (out.len > 0).then(|| lines / out.len as f64);
        out
    }
}
