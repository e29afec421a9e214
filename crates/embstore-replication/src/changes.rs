//! The change index: which segments' shard versions changed since a cursor (spec §3.2).
//!
//! Every sv change of a segment takes the next sequence number; the index maps each segment's
//! latest number to the segment, so [`ChangeIndex::since`] lists the segments changed after a
//! cursor in O(changed · log) and idle segments cost nothing. A segment appears once, at its
//! latest change; a change made after a listing gets a larger number and shows in the next.

use std::collections::BTreeMap;

/// Per replica: a sequence counter, each segment's latest change and the index over them.
#[derive(Clone, Debug, Default)]
pub struct ChangeIndex {
    seq: u64,
    chg_seq: Vec<u64>,
    index: BTreeMap<u64, u32>,
}

impl ChangeIndex {
    /// An index over `segments` segments, none changed.
    pub fn new(segments: u32) -> Self {
        Self { seq: 0, chg_seq: vec![0; segments as usize], index: BTreeMap::new() }
    }

    /// Records a change of `seg` (ignored for a segment out of range).
    pub fn bump(&mut self, seg: u32) {
        let Some(c) = self.chg_seq.get_mut(seg as usize) else {
            return;
        };
        if *c != 0 {
            self.index.remove(c);
        }
        self.seq += 1;
        *c = self.seq;
        self.index.insert(self.seq, seg);
    }

    /// The segments changed after `cursor`, oldest change first, and the cursor to pass next.
    pub fn since(&self, cursor: u64) -> (Vec<u32>, u64) {
        let segs = self.index.range(cursor.saturating_add(1)..).map(|(_, s)| *s).collect();
        (segs, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against a model (the list of all bumps): `since(cursor)` is exactly the set of
        /// segments bumped after the cursor, each once.
        #[test]
        fn since_lists_the_segments_changed_after_the_cursor(
            ops in proptest::collection::vec((any::<bool>(), 0u32..8), 1..100)
        ) {
            let mut ix = ChangeIndex::new(6);
            let mut log: Vec<u32> = Vec::new();
            let mut cursors: Vec<(u64, usize)> = vec![(0, 0)];
            for (list, seg) in ops {
                if list {
                    let (_, upto) = ix.since(0);
                    cursors.push((upto, log.len()));
                } else {
                    ix.bump(seg);
                    if seg < 6 { log.push(seg); }
                }
                for &(cursor, at) in &cursors {
                    let (mut got, _) = ix.since(cursor);
                    got.sort_unstable();
                    let mut want: Vec<u32> = log[at..].to_vec();
                    want.sort_unstable();
                    want.dedup();
                    prop_assert_eq!(got, want, "cursor {}", cursor);
                }
            }
        }
    }
}
