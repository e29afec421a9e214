//! Read planning for the memory tier's cold reads: [`merged_reads`] turns the aligned page
//! ranges of many records ([`DirectRange`]) into the fewest [`PageRead`]s the I/O engine
//! ([`super::io`]) performs, merging records that share a page or lie close in one file.
//!
//! Invariants: every record's pages lie inside exactly one read; reads stay page-aligned, never
//! overlap in one file, and stay within [`MAX_READ`] but for one record sharing a page.

use super::io::PageRead;

/// Records whose pages lie at most this many bytes apart in one file are read together: one
/// more request costs this disk about as long as moving ~20 KiB more in a larger one (fio:
/// 81k IOPS of 4 KiB at queue depth 32, 1.6 GB/s sequential), so a gap below that is cheaper
/// to read through than to skip.
pub(crate) const MERGE_GAP: u64 = 16 << 10;
/// The longest merged read, but for the pages of one more record that shares a page with it
/// (records that share a page are always read together: reads never overlap).
pub(crate) const MAX_READ: u64 = 256 << 10;

/// A record's aligned pages in a file opened for direct reads: the record is at `offset +
/// skip`, and is entry `n` of the caller's list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirectRange {
    pub(crate) fd: std::os::fd::RawFd,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) skip: usize,
    pub(crate) n: usize,
}

/// The reads that cover `ranges` (sorted here by file and offset): records that share a page
/// with the previous read in the same file join it; those within [`MERGE_GAP`] of it join
/// while it stays within [`MAX_READ`] bytes. Returns the reads and, per record, `(n, read,
/// byte offset in it)`.
pub(crate) fn merged_reads(
    ranges: &mut [DirectRange],
) -> (Vec<PageRead>, Vec<(usize, usize, usize)>) {
    ranges.sort_unstable_by_key(|r| (r.fd, r.offset));
    let mut reqs: Vec<PageRead> = Vec::new();
    let mut at = Vec::with_capacity(ranges.len());
    for r in ranges.iter() {
        let end = r.offset + r.len as u64;
        let joins = reqs.last().is_some_and(|q| {
            let q_end = q.offset + q.len as u64;
            q.fd == r.fd
                && (r.offset < q_end
                    || r.offset <= q_end + MERGE_GAP && end.max(q_end) - q.offset <= MAX_READ)
        });
        if joins {
            let q = reqs.last_mut().expect("joins a read");
            q.len = (end.max(q.offset + q.len as u64) - q.offset) as usize;
        } else {
            reqs.push(PageRead { fd: r.fd, offset: r.offset, len: r.len });
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

    proptest! {
        /// Every record's pages lie inside its read, reads stay page-aligned and within
        /// MAX_READ (but for one record sharing a page), two reads never overlap in one file,
        /// and records that share a page (or lie within MERGE_GAP) share a read.
        #[test]
        fn merged_reads_cover_every_record_once(
            recs in proptest::collection::vec((0i32..3, 0u64..400, 1usize..3, 0usize..4096), 0..300)
        ) {
            let mut ranges: Vec<DirectRange> = recs
                .iter()
                .enumerate()
                .map(|(n, &(fd, page, pages, skip))| DirectRange {
                    fd,
                    offset: page * 4096,
                    len: pages * 4096,
                    skip: skip.min(pages * 4096 - 1),
                    n,
                })
                .collect();
            let by_n: Vec<DirectRange> = ranges.clone();
            let (reqs, at) = merged_reads(&mut ranges);
            prop_assert_eq!(at.len(), recs.len());
            for q in &reqs {
                prop_assert!(q.offset % 4096 == 0 && q.len % 4096 == 0);
                // Past MAX_READ only by one record's pages (at most 2) that share a page.
                prop_assert!(q.len as u64 <= MAX_READ + 2 * 4096);
            }
            for (i, a) in reqs.iter().enumerate() {
                for b in &reqs[i + 1..] {
                    let disjoint = a.fd != b.fd
                        || a.offset + a.len as u64 <= b.offset
                        || b.offset + b.len as u64 <= a.offset;
                    prop_assert!(disjoint, "{:?} and {:?} overlap", (a.fd, a.offset, a.len), (b.fd, b.offset, b.len));
                }
            }
            let mut seen = vec![false; recs.len()];
            for &(n, req, from) in &at {
                let (r, q) = (by_n[n], &reqs[req]);
                seen[n] = true;
                prop_assert_eq!(q.fd, r.fd);
                prop_assert_eq!(q.offset + from as u64, r.offset + r.skip as u64);
                prop_assert!(r.offset >= q.offset);
                prop_assert!(r.offset + r.len as u64 <= q.offset + q.len as u64);
            }
            prop_assert!(seen.iter().all(|&s| s));
            // Adjacent reads of one file are apart by more than MERGE_GAP, or the second
            // would have made the first longer than MAX_READ.
            let mut sorted: Vec<_> = reqs.iter().collect();
            sorted.sort_by_key(|q| (q.fd, q.offset));
            for w in sorted.windows(2) {
                if w[0].fd == w[1].fd {
                    let gap = w[1].offset - (w[0].offset + w[0].len as u64);
                    let merged = w[1].offset + w[1].len as u64 - w[0].offset;
                    prop_assert!(gap > MERGE_GAP || merged > MAX_READ);
                }
            }
        }
    }
}
