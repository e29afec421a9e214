//! Read planning for the memory tier's cold reads: [`aligned_range`] gives the blocks that hold
//! one record, at the alignment its file takes (the device's logical block, found by
//! [`read_alignment`](super::io::read_alignment)), and [`merged_reads`] turns the block ranges
//! of many records ([`DirectRange`]) into the [`PageRead`]s the I/O engine ([`super::io`])
//! performs.
//!
//! Sizing: a cold read is what its records need, not a 4 KiB page. A 140-byte record is one or
//! two 512-byte blocks on a disk with 512-byte logical blocks (one 4 KiB page, or two, before):
//! the device's IOPS bound random reads, and a request of 512 B costs it no more than one of
//! 4 KiB, so the smaller reads cost no rows/s and move up to 8× fewer bytes. Two records' reads
//! merge when they share a block (they must: reads never overlap), touch, or lie close enough
//! that reading through the gap keeps the merged read within 2× the blocks its records occupy
//! (and the gap within [`MERGE_GAP`]): a merge saves a request, and never doubles the bytes.
//!
//! Invariants: every record's blocks lie inside exactly one read; reads stay aligned to their
//! records' alignment, never overlap in one file, hold at most twice the bytes of the blocks
//! their records occupy, and stay within [`MAX_READ`] but for one record sharing a block.

use super::io::PageRead;

/// The longest gap between two records' blocks that a read goes through to serve both: one more
/// request costs this disk about as long as moving ~20 KiB more in a larger one (fio: 81k IOPS
/// of 4 KiB at queue depth 32, 1.6 GB/s sequential), so a longer gap is cheaper to skip.
pub(crate) const MERGE_GAP: u64 = 16 << 10;
/// The longest merged read, but for the blocks of one more record that shares a block with it
/// (records that share a block are always read together: reads never overlap).
pub(crate) const MAX_READ: u64 = 256 << 10;

/// A record's aligned blocks in a file opened for direct reads: the record is at `offset +
/// skip`, and is entry `n` of the caller's list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirectRange {
    pub(crate) fd: std::os::fd::RawFd,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) skip: usize,
    pub(crate) n: usize,
}

/// The blocks of `align` bytes (a power of two) that hold bytes `[at, at + len)` of a file of
/// `file_len` bytes: `(offset, length, skip)` with the record at `offset + skip`; `None` when
/// the last block would pass the end of the file (a direct read of it would come back short).
pub(crate) fn aligned_range(
    at: u64,
    len: u64,
    align: u64,
    file_len: u64,
) -> Option<(u64, usize, usize)> {
    debug_assert!(align.is_power_of_two() && len > 0);
    let start = at & !(align - 1);
    let end = (at + len).next_multiple_of(align);
    (end <= file_len).then_some((start, (end - start) as usize, (at - start) as usize))
}

/// The reads that cover `ranges` (sorted here by file and offset): a record whose blocks share
/// a block with the previous read in the same file, or touch it, joins it; one that lies within
/// [`MERGE_GAP`] of it joins when the merged read stays within 2× the bytes of the blocks its
/// records occupy and within [`MAX_READ`]. Returns the reads and, per record, `(n, read, byte
/// offset in it)`.
pub(crate) fn merged_reads(
    ranges: &mut [DirectRange],
) -> (Vec<PageRead>, Vec<(usize, usize, usize)>) {
    ranges.sort_unstable_by_key(|r| (r.fd, r.offset));
    let mut reqs: Vec<PageRead> = Vec::new();
    // Bytes of each read that lie in its records' blocks.
    let mut useful: Vec<u64> = Vec::new();
    let mut at = Vec::with_capacity(ranges.len());
    for r in ranges.iter() {
        let end = r.offset + r.len as u64;
        let joins = reqs.last().is_some_and(|q| {
            let q_end = q.offset + q.len as u64;
            let merged = end.max(q_end) - q.offset;
            let used = useful.last().expect("a read") + (end.max(q_end) - r.offset.max(q_end));
            q.fd == r.fd
                && (r.offset < q_end
                    || r.offset <= q_end + MERGE_GAP && merged <= MAX_READ && merged <= 2 * used)
        });
        if joins {
            let q = reqs.last_mut().expect("joins a read");
            let q_end = q.offset + q.len as u64;
            *useful.last_mut().expect("a read") += end.max(q_end) - r.offset.max(q_end);
            q.len = (end.max(q_end) - q.offset) as usize;
        } else {
            reqs.push(PageRead { fd: r.fd, offset: r.offset, len: r.len });
            useful.push(r.len as u64);
        }
        let q = reqs.last().expect("a read");
        at.push((r.n, reqs.len() - 1, (r.offset - q.offset) as usize + r.skip));
    }
    (reqs, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records of `record` bytes from `first` on, as a segment lays them out, at alignment
    /// `align` in a file of `file_len` bytes: the wanted ones' ranges (`n` = index in `wanted`)
    /// and their byte offsets, `None` for those `aligned_range` leaves to buffered reads.
    fn ranges_of(
        fd: i32,
        wanted: &[u64],
        first: u64,
        record: u64,
        align: u64,
        file_len: u64,
    ) -> Vec<(Option<DirectRange>, u64)> {
        wanted
            .iter()
            .enumerate()
            .map(|(n, &i)| {
                let at = first + i * record;
                let r = aligned_range(at, record, align, file_len)
                    .map(|(offset, len, skip)| DirectRange { fd, offset, len, skip, n });
                (r, at)
            })
            .collect()
    }

    proptest! {
        /// For any logical block from 512 B to 4 KiB and any records: every record's bytes lie
        /// inside exactly one read (the one it is mapped to, at the right offset); reads are
        /// aligned, end before the end of the file, never overlap in one file, hold at most
        /// twice the bytes of their records' blocks, and stay within MAX_READ (but for one
        /// record sharing a block); adjacent reads of one file could not have merged.
        #[test]
        fn reads_cover_every_record_once_aligned_and_within_the_file(
            align_log in 9u32..=12,
            record in prop_oneof![Just(64u64), Just(128), Just(192), Just(320), Just(1088), 1u64..5000],
            first in 0u64..5000,
            count in 1u64..2000,
            tail in 0u64..8192,
            wanted in proptest::collection::vec((0i32..2, 0u64..2000), 0..300),
        ) {
            let align = 1u64 << align_log;
            let file_len = first + count * record + tail;
            let mut recs: Vec<(i32, u64)> =
                wanted.into_iter().map(|(fd, i)| (fd, i % count)).collect();
            recs.sort_unstable();
            recs.dedup();
            let mut all = Vec::new();
            let mut bytes_at = Vec::new();
            for fd in 0..2 {
                let idx: Vec<u64> = recs.iter().filter(|r| r.0 == fd).map(|r| r.1).collect();
                for (r, at) in ranges_of(fd, &idx, first, record, align, file_len) {
                    if let Some(mut r) = r {
                        r.n = bytes_at.len();
                        all.push(r);
                        bytes_at.push((fd, at));
                    } else {
                        // Left to buffered reads only where its last block passes the end.
                        prop_assert!((at + record).next_multiple_of(align) > file_len);
                    }
                }
            }
            let by_n = all.clone();
            let (reqs, at) = merged_reads(&mut all);
            prop_assert_eq!(at.len(), by_n.len());
            for q in &reqs {
                prop_assert!(q.offset.is_multiple_of(align) && (q.len as u64).is_multiple_of(align));
                prop_assert!(q.offset + q.len as u64 <= file_len, "read past the end");
            }
            for (i, a) in reqs.iter().enumerate() {
                for b in &reqs[i + 1..] {
                    let disjoint = a.fd != b.fd
                        || a.offset + a.len as u64 <= b.offset
                        || b.offset + b.len as u64 <= a.offset;
                    prop_assert!(disjoint, "{:?} and {:?} overlap", (a.fd, a.offset, a.len), (b.fd, b.offset, b.len));
                }
            }
            let mut seen = vec![0; by_n.len()];
            let mut blocks: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); reqs.len()];
            for &(n, req, from) in &at {
                let (r, q) = (by_n[n], &reqs[req]);
                seen[n] += 1;
                let (fd, byte) = bytes_at[n];
                prop_assert_eq!(q.fd, fd);
                // The record's bytes, at the offset the caller decodes from, lie in the read.
                prop_assert_eq!(q.offset + from as u64, byte);
                prop_assert!(byte + record <= q.offset + q.len as u64);
                prop_assert!(r.offset >= q.offset && r.offset + r.len as u64 <= q.offset + q.len as u64);
                // Exactly one read holds them: no other read of the file overlaps them.
                for (j, o) in reqs.iter().enumerate() {
                    if j != req && o.fd == fd {
                        prop_assert!(o.offset + o.len as u64 <= byte || byte + record <= o.offset);
                    }
                }
                blocks[req].extend((r.offset..r.offset + r.len as u64).step_by(align as usize));
            }
            prop_assert!(seen.iter().all(|&s| s == 1));
            // A record takes a read past MAX_READ only by sharing a block with it.
            let mut members: Vec<Vec<DirectRange>> = vec![Vec::new(); reqs.len()];
            for &(n, req, _) in &at {
                members[req].push(by_n[n]);
            }
            for (q, m) in reqs.iter().zip(&mut members) {
                m.sort_by_key(|r| r.offset);
                let mut end = 0;
                for (k, r) in m.iter().enumerate() {
                    let r_end = r.offset + r.len as u64;
                    if k > 0 && r.offset >= end {
                        prop_assert!(r_end - q.offset <= MAX_READ);
                    }
                    end = end.max(r_end);
                }
            }
            for (q, b) in reqs.iter().zip(&blocks) {
                prop_assert!(q.len as u64 <= 2 * b.len() as u64 * align, "{} B for {} blocks", q.len, b.len());
            }
            let mut sorted: Vec<_> = reqs.iter().collect();
            sorted.sort_by_key(|q| (q.fd, q.offset));
            for w in sorted.windows(2) {
                if w[0].fd == w[1].fd {
                    let gap = w[1].offset - (w[0].offset + w[0].len as u64);
                    let merged = w[1].offset + w[1].len as u64 - w[0].offset;
                    prop_assert!(gap > 0 || merged > MAX_READ, "touching reads were not merged");
                }
            }
        }

        /// Records that share a block or touch are always in one read; records far apart
        /// (more than MERGE_GAP) never are.
        #[test]
        fn touching_records_merge_and_distant_ones_do_not(
            align_log in 9u32..=12,
            blocks in proptest::collection::vec(0u64..64, 1..40),
        ) {
            let align = 1u64 << align_log;
            let mut all: Vec<DirectRange> = blocks
                .iter()
                .enumerate()
                .map(|(n, &b)| DirectRange { fd: 0, offset: b * (MERGE_GAP + 2 * align), len: align as usize, skip: 0, n })
                .collect();
            let distinct: std::collections::BTreeSet<u64> = blocks.iter().copied().collect();
            let (reqs, _) = merged_reads(&mut all);
            prop_assert_eq!(reqs.len(), distinct.len());
            let mut run: Vec<DirectRange> = (0..blocks.len())
                .map(|n| DirectRange { fd: 0, offset: n as u64 * align, len: align as usize, skip: 0, n })
                .collect();
            let (reqs, _) = merged_reads(&mut run);
            prop_assert_eq!(reqs.len(), 1);
        }
    }

    #[test]
    fn a_small_record_reads_one_or_two_logical_blocks() {
        // 140 B at 512-byte blocks: 512 B inside a block, 1 KiB across a boundary.
        assert_eq!(aligned_range(4096 + 64, 140, 512, 1 << 20), Some((4096, 512, 64)));
        assert_eq!(aligned_range(4096 + 448, 140, 512, 1 << 20), Some((4096, 1024, 448)));
        // The same records where the device's block is 4 KiB.
        assert_eq!(aligned_range(4096 + 64, 140, 4096, 1 << 20), Some((4096, 4096, 64)));
        // The last block would pass the end of the file.
        assert_eq!(aligned_range(1000, 140, 512, 1100), None);
        assert_eq!(aligned_range(1000, 24, 512, 1024), Some((512, 512, 488)));
    }
}
