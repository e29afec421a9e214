//! [`YoungRows`]: when a shard's recently created rows were created, for the freshness term
//! of the update priority (`p_u`, `embstore_replication::priority`).
//!
//! A row's metadata keeps the time of its last write, not of its creation (16 bytes a row:
//! `meta`). Most rows are old, and for an old row the freshness `f = 1 / (1 + age / τ_u)` is
//! near 0 whatever its exact age; what the priority must tell apart is a row created a few
//! seconds or minutes ago. So a shard of a table that scores its writes keeps the creation
//! time of the rows it created in the last [`YOUNG_MS`] (10 τ_u: `f` ≤ 1/11 past it), keyed
//! by row, oldest first for expiry, up to a cap; a row not in it is at least that old. About
//! 40 bytes a young row, counted with the shard's sync state.

use std::collections::VecDeque;

use hashbrown::HashMap;

/// How long a row counts as young (ms): ten times the default `τ_u` of 60 s.
pub(crate) const YOUNG_MS: u64 = 10 * 60 * 1000;

/// The creation times of a shard's young rows.
#[derive(Debug, Default)]
pub(crate) struct YoungRows {
    born: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    cap: usize,
}

impl YoungRows {
    /// At most `cap` young rows (the oldest leave first when more are created).
    pub(crate) fn new(cap: usize) -> Self {
        Self { born: HashMap::new(), order: VecDeque::new(), cap: cap.max(1) }
    }

    /// The age in ms, at `now_ms`, of `key`'s row, which had `writes` writes before the one
    /// being scored: 0 for its first write (which records its creation), the time since then
    /// for a young row, and [`YOUNG_MS`] (at least) for any other.
    #[inline]
    pub(crate) fn age(&mut self, key: u64, writes: u64, now_ms: u64) -> u64 {
        if writes == 0 {
            self.created(key, now_ms);
            return 0;
        }
        match self.born.get(&key) {
            Some(&at) => now_ms.saturating_sub(at).min(YOUNG_MS),
            None => YOUNG_MS,
        }
    }

    /// `key`'s row was created at `now_ms`.
    fn created(&mut self, key: u64, now_ms: u64) {
        self.born.insert(key, now_ms);
        self.order.push_back((now_ms, key));
        while self.order.len() > self.cap {
            self.forget_oldest();
        }
    }

    /// Forgets the rows created before `now_ms - YOUNG_MS`.
    pub(crate) fn expire(&mut self, now_ms: u64) {
        let before = now_ms.saturating_sub(YOUNG_MS);
        while self.order.front().is_some_and(|&(at, _)| at < before) {
            self.forget_oldest();
        }
        if self.born.capacity() > 4 * self.born.len().max(64) {
            self.born.shrink_to_fit();
            self.order.shrink_to_fit();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((at, key)) = self.order.pop_front() {
            // A row removed and created again since has a newer entry: keep that one.
            if self.born.get(&key) == Some(&at) {
                self.born.remove(&key);
            }
        }
    }

    /// Forgets every row (the shard was cleared).
    pub(crate) fn clear(&mut self) {
        self.born = HashMap::new();
        self.order = VecDeque::new();
    }

    /// Young rows held.
    pub(crate) fn len(&self) -> usize {
        self.born.len()
    }

    /// Bytes held (the map at its capacity, the queue at its).
    pub(crate) fn bytes(&self) -> usize {
        self.born.capacity() * (std::mem::size_of::<(u64, u64)>() + 1)
            + self.order.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_write_is_age_0_then_its_age_grows_until_it_is_old() {
        let mut y = YoungRows::new(100);
        assert_eq!(y.age(7, 0, 1_000), 0);
        assert_eq!(y.age(7, 1, 31_000), 30_000);
        assert_eq!(y.age(8, 5, 31_000), YOUNG_MS, "a row never seen created is old");
        y.expire(1_000 + YOUNG_MS + 1);
        assert_eq!(y.len(), 0);
        assert_eq!(y.age(7, 2, 1_000 + YOUNG_MS + 1), YOUNG_MS);
    }

    #[test]
    fn the_cap_forgets_the_oldest_and_a_row_created_again_keeps_its_new_time() {
        let mut y = YoungRows::new(2);
        y.age(1, 0, 10);
        y.age(2, 0, 20);
        y.age(1, 0, 30); // removed and created again: two queue entries, the map holds 30
        assert_eq!(y.len(), 2);
        assert_eq!(y.age(1, 1, 40), 10, "the newer creation counts");
        y.age(3, 0, 50); // over the cap: the oldest entries leave
        assert_eq!(y.age(2, 1, 60), YOUNG_MS, "forgotten: old");
        assert_eq!(y.age(1, 1, 60), 30);
        assert!(y.bytes() > 0);
        y.clear();
        assert_eq!(y.len(), 0);
    }
}
