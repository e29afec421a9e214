//! The change index: which parts' shard versions changed since a cursor (spec §3.2).
//!
//! Every sv change of a part takes the next sequence number; the index maps each part's
//! latest number to the part, so [`ChangeIndex::since`] lists the parts changed after a
//! cursor in O(changed · log) and idle parts cost nothing. A part appears once, at its
//! latest change; a change made after a listing gets a larger number and shows in the next.

use std::collections::BTreeMap;

use crate::sv::Sv;

/// The parts changed since a cursor: a responder's answer to a change list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// The responder's epoch: a cursor from another epoch lists every part.
    pub epoch: u64,
    /// The cursor to pass next.
    pub upto: u64,
    /// `(part, sv)` of every part changed after the cursor.
    pub parts: Vec<(u32, Sv)>,
}

/// Per replica: a sequence counter, each part's latest change and the index over them.
#[derive(Clone, Debug, Default)]
pub struct ChangeIndex {
    seq: u64,
    chg_seq: Vec<u64>,
    index: BTreeMap<u64, u32>,
}

impl ChangeIndex {
    /// An index over `parts` parts, none changed.
    pub fn new(parts: u32) -> Self {
        Self { seq: 0, chg_seq: vec![0; parts as usize], index: BTreeMap::new() }
    }

    /// Records a change of `part` (ignored for a part out of range).
    pub fn bump(&mut self, part: u32) {
        let Some(c) = self.chg_seq.get_mut(part as usize) else {
            return;
        };
        if *c != 0 {
            self.index.remove(c);
        }
        self.seq += 1;
        *c = self.seq;
        self.index.insert(self.seq, part);
    }

    /// The parts changed after `cursor`, oldest change first, and the cursor to pass next.
    pub fn since(&self, cursor: u64) -> (Vec<u32>, u64) {
        let changed_parts = self.index.range(cursor.saturating_add(1)..).map(|(_, s)| *s).collect();
        (changed_parts, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against a model (the list of all bumps): `since(cursor)` is exactly the set of
        /// parts bumped after the cursor, each once.
        #[test]
        fn since_lists_the_parts_changed_after_the_cursor(
            ops in proptest::collection::vec((any::<bool>(), 0u32..8), 1..100)
        ) {
            let mut ix = ChangeIndex::new(6);
            let mut log: Vec<u32> = Vec::new();
            let mut cursors: Vec<(u64, usize)> = vec![(0, 0)];
            for (list, part) in ops {
                if list {
                    let (_, upto) = ix.since(0);
                    cursors.push((upto, log.len()));
                } else {
                    ix.bump(part);
                    if part < 6 { log.push(part); }
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
