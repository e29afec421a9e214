//! What a flush reports: below the flush, the compaction steps and the segment writes that
//! fill it in.

/// What one flush wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlushStats {
    pub segments: u64,
    pub records: u64,
    pub bytes: u64,
    /// Tables rewritten whole: by `Store::compact`, or by a flush for a table past
    /// [`MAX_SEGMENTS`](super::MAX_SEGMENTS) files, a tiered table past twice its live rows, or a table whose keys
    /// without a row (tombstones) pass a quarter of its rows.
    pub compactions: u64,
    /// Segment files whose live rows a compaction step moved out, deleted.
    pub compacted_segments: u64,
    /// Evictions' segments (spills) written since the last flush, fsynced and recorded by this
    /// one (or, rewritten, superseded).
    pub spills_adopted: u64,
}
