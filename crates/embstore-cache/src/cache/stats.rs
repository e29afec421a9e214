//! The cache's counters and where its budget went.

/// Counters since the cache was built (or
/// [`InferenceCache::reset_stats`](super::InferenceCache::reset_stats)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    /// Requests served.
    pub requests: u64,
    /// Requests whose keys were all exact hits (L1 or L2).
    pub perfect: u64,
    /// Requests with no backing-store read (exact hits and surrogates).
    pub served_perfect: u64,
    /// Distinct keys looked up (per request).
    pub keys: u64,
    /// Keys served from L1.
    pub l1_hits: u64,
    /// Keys served from L2.
    pub l2_hits: u64,
    /// Keys served by a surrogate.
    pub approximated: u64,
    /// Keys read from the backing store (full misses).
    pub misses: u64,
    /// `misses_per_request[m]`: requests with `m` backing-store keys.
    pub misses_per_request: Vec<u64>,
    /// Requests that could not be kept whole (served, partly uncached).
    pub bypasses: u64,
    /// Entries evicted from L1.
    pub l1_evictions: u64,
    /// L1 victims demoted into L2.
    pub demotions: u64,
    /// Entries evicted from the last level (dropped).
    pub drops: u64,
    /// Keys added to L3's map.
    pub l3_inserts: u64,
    /// Blocks of surrogate files read to feed L3 (inline or by the filler).
    pub l3_reads: u64,
    /// Failed or corrupt surrogate-file reads (those keys get no L3 entry; serving goes on).
    pub l3_read_errors: u64,
    /// Evicted keys the filler's full queue could not take (they get no L3 entry).
    pub l3_queue_drops: u64,
    /// Rows read again at commit because a key hit at probe was evicted by an earlier request
    /// of the batch before its own commit.
    pub refetches: u64,
    /// Backing-store read calls.
    pub backing_reads: u64,
}

impl CacheStats {
    pub(super) fn add(&mut self, o: &Self) {
        self.requests += o.requests;
        self.perfect += o.perfect;
        self.served_perfect += o.served_perfect;
        self.keys += o.keys;
        self.l1_hits += o.l1_hits;
        self.l2_hits += o.l2_hits;
        self.approximated += o.approximated;
        self.misses += o.misses;
        if self.misses_per_request.len() < o.misses_per_request.len() {
            self.misses_per_request.resize(o.misses_per_request.len(), 0);
        }
        for (a, b) in self.misses_per_request.iter_mut().zip(&o.misses_per_request) {
            *a += b;
        }
        self.bypasses += o.bypasses;
        self.l1_evictions += o.l1_evictions;
        self.demotions += o.demotions;
        self.drops += o.drops;
        self.l3_inserts += o.l3_inserts;
        self.l3_reads += o.l3_reads;
        self.l3_read_errors += o.l3_read_errors;
        self.l3_queue_drops += o.l3_queue_drops;
        self.refetches += o.refetches;
        self.backing_reads += o.backing_reads;
    }

    pub(super) fn note_request(&mut self, misses: usize) {
        if self.misses_per_request.len() <= misses {
            self.misses_per_request.resize(misses + 1, 0);
        }
        self.misses_per_request[misses] += 1;
    }
}

/// Bytes and entries of one level (all shards together).
#[derive(Clone, Debug, PartialEq)]
pub struct LevelMemory {
    /// The codec's name.
    pub codec: &'static str,
    /// Entries it can hold.
    pub capacity: usize,
    /// Entries it holds.
    pub len: usize,
    /// Row bytes (`capacity × bytes per row`).
    pub row_bytes: usize,
    /// Policy metadata bytes (slots, index, lists).
    pub metadata_bytes: usize,
}

/// Where the budget went.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheMemory {
    /// The budget.
    pub budget_bytes: usize,
    /// L1, then L2 if configured.
    pub levels: Vec<LevelMemory>,
    /// L3's map: capacity, entries, bytes.
    pub l3_capacity: usize,
    /// Entries in L3's map.
    pub l3_len: usize,
    /// Bytes of L3's map.
    pub l3_bytes: usize,
    /// Bytes the surrogate builds hold in memory, counted in the budget: 18 B a row of a build
    /// in memory, 8 B per 227 rows (its fences) of a build on disk.
    pub surrogate_table_bytes: usize,
    /// Bytes of the L3 filler's queues (background fill from builds on disk), counted.
    pub l3_queue_bytes: usize,
    /// Everything counted against the budget: L1 and L2 (rows and metadata), L3's map, the
    /// surrogate builds' bytes in memory and the filler's queues.
    pub total_bytes: usize,
    /// Policy metadata bytes per entry of capacity (L1 and L2 together).
    pub metadata_bytes_per_entry: f64,
}
