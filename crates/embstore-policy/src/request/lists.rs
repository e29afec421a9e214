//! The storage every L1 policy is built on: a fixed arena of 20-byte slots, a slot-only key
//! index, and intrusive doubly-linked FIFO lists ("buckets"), some of them score buckets with
//! O(S) aging by splicing (§2.3–2.4 of the design note).
//!
//! ```text
//! index   key -> slot (SlotIndex, 4 B per bucket)
//! slots   [ key | prev | next | score | epoch | flags | pad ]  20 B each, capacity preallocated
//! lists   0 ..= S        score buckets: FIFO by bucket entry, `min` <= lowest non-empty
//!         S+1 ..         extra plain lists (EV-ARC's R, R-ghost, F-ghost; never aged)
//! ```
//!
//! A slot in score bucket `b` stores `(score, epoch)` with `score >> (age_epoch - epoch) == b`
//! ("effective score", computed lazily): an aging step splices bucket `2j` then `2j+1` into
//! bucket `j` and bumps `age_epoch`, so no per-slot work is done. Every 128 aging steps one
//! O(len) pass rewrites `(score, epoch)` of all slots so the u8 epoch differences never wrap.
//!
//! Invariants (checked by `check`, used by the property tests): `len <= cap`;
//! `len == index.len() == Σ list lengths`; every live slot is in exactly the list named by its
//! (effective) score and reachable from the list's head; `min <=` the lowest non-empty score
//! bucket. Costs: find O(1) expected; insert, remove, move: O(1); `lowest_unpinned`: amortised
//! O(1) plus pinned slots skipped; `age`: O(S).

use crate::index::{SlotIndex, NIL};

/// Slot flag: part of the request being committed; never chosen as a victim.
pub(crate) const PINNED: u8 = 1;
/// Slot flag: a key of the request being committed (pinned or not), for self-eviction counts.
pub(crate) const CURRENT: u8 = 2;
/// Slot flag: on the free list.
const FREE: u8 = 4;

/// Aging steps between the O(len) passes that rebase epochs (differences stay below 256).
const EPOCH_REBASE: u8 = 128;

/// One cached entry's metadata. The key is two u32 halves so the struct has 4-byte alignment
/// and packs into 20 bytes (a `u64` field would pad it to 24).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Slot {
    key_lo: u32,
    key_hi: u32,
    prev: u32,
    next: u32,
    score: u8,
    epoch: u8,
    flags: u8,
    _pad: u8,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 20);

impl Slot {
    #[inline]
    fn key(&self) -> u64 {
        (u64::from(self.key_hi) << 32) | u64::from(self.key_lo)
    }
}

/// Head, tail and length of one intrusive list (12 bytes).
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

const EMPTY_LIST: List = List { head: NIL, tail: NIL, len: 0 };

/// The slot arena with its index and lists (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Lists {
    slots: Vec<Slot>,
    free: u32,
    index: SlotIndex,
    lists: Vec<List>,
    /// Number of score buckets (`S + 1`); lists at or above this index are plain lists.
    scored: usize,
    /// Lower bound on the lowest non-empty score bucket.
    min: usize,
    age_epoch: u8,
    len: usize,
    cap: usize,
    /// Slots marked (`PINNED`/`CURRENT`) by the request in progress, cleared by
    /// [`Lists::clear_marks`] when it ends.
    marked: Vec<u32>,
}

impl Lists {
    /// Room for `cap` live slots (at most `u32::MAX - 1`, checked by the policies), in
    /// `scored` score buckets plus `extra` plain lists; `scored + extra <= 256`.
    pub(crate) fn new(cap: usize, scored: usize, extra: usize) -> Self {
        debug_assert!(cap < NIL as usize && scored >= 1 && scored + extra <= 256);
        Self {
            slots: Vec::with_capacity(cap),
            free: NIL,
            index: SlotIndex::with_capacity(cap),
            lists: vec![EMPTY_LIST; scored + extra],
            scored,
            min: 0,
            age_epoch: 0,
            len: 0,
            cap,
            marked: Vec::new(),
        }
    }

    /// Live slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether every slot is live.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    /// Heap bytes of the arena (at its preallocated capacity), index and list heads.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.heap_bytes()
            + self.lists.capacity() * std::mem::size_of::<List>()
            + self.marked.capacity() * std::mem::size_of::<u32>()
    }

    /// Sets `f` on slot `i` until the request ends ([`Lists::clear_marks`]).
    #[inline]
    pub(crate) fn mark(&mut self, i: u32, f: u8) {
        self.set_flags(i, f);
        self.marked.push(i);
    }

    /// Ends a request: clears the marks it set.
    pub(crate) fn clear_marks(&mut self) {
        for i in std::mem::take(&mut self.marked) {
            self.clear_flags(i, PINNED | CURRENT);
        }
        debug_assert!(self.marked.is_empty());
    }

    /// A request's probe: `out.hit` (whether each key's slot is resident, as `resident` says)
    /// and `out.hits`, marking each resident slot `mark` for the request.
    pub(crate) fn probe(
        &mut self,
        keys: &[u64],
        mark: u8,
        out: &mut super::RequestOutcome,
        resident: impl Fn(&Self, u32) -> bool,
    ) {
        for &k in keys {
            let f = self.find(k).filter(|&i| resident(self, i));
            out.hit.push(f.is_some());
            if let Some(i) = f {
                self.mark(i, mark);
            }
        }
        out.hits = out.hit.iter().filter(|&&h| h).count();
    }

    /// Counts in `out` an eviction of slot `v`, and whether it takes a key of the request in
    /// progress (`CURRENT`); returns the latter.
    pub(crate) fn note_eviction(&self, v: u32, out: &mut super::RequestOutcome) -> bool {
        let current = self.flags(v) & CURRENT != 0;
        out.self_evicted += usize::from(current);
        out.evicted.push(self.key(v));
        out.evicted_slots.push(v);
        current
    }

    /// Evicts slot `v` ([`Lists::note_eviction`], then removes it); whether it took a key of
    /// the request in progress.
    pub(crate) fn evict(&mut self, v: u32, out: &mut super::RequestOutcome) -> bool {
        let current = self.note_eviction(v, out);
        self.remove(v);
        current
    }

    /// The slot holding `key`, if any.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(key, |s| slots[s as usize].key())
    }

    /// The key in slot `i`.
    #[inline]
    pub(crate) fn key(&self, i: u32) -> u64 {
        self.slots[i as usize].key()
    }

    /// The list slot `i` is in: its effective score for a score bucket, else the list id.
    #[inline]
    pub(crate) fn list_of(&self, i: u32) -> usize {
        let s = &self.slots[i as usize];
        let stored = usize::from(s.score);
        if stored >= self.scored {
            return stored;
        }
        let shift = self.age_epoch.wrapping_sub(s.epoch);
        if shift >= 8 {
            0
        } else {
            stored >> shift
        }
    }

    /// Length of list `b`.
    #[inline]
    pub(crate) fn list_len(&self, b: usize) -> usize {
        self.lists[b].len as usize
    }

    /// The oldest slot of list `b`.
    #[inline]
    pub(crate) fn head(&self, b: usize) -> Option<u32> {
        let h = self.lists[b].head;
        (h != NIL).then_some(h)
    }

    #[inline]
    pub(crate) fn flags(&self, i: u32) -> u8 {
        self.slots[i as usize].flags
    }

    #[inline]
    pub(crate) fn set_flags(&mut self, i: u32, f: u8) {
        self.slots[i as usize].flags |= f;
    }

    /// Clears `f` (never the free mark) on slot `i`.
    #[inline]
    pub(crate) fn clear_flags(&mut self, i: u32, f: u8) {
        self.slots[i as usize].flags &= !(f & !FREE);
    }

    /// Whether slot `i` is live (not on the free list).
    #[inline]
    pub(crate) fn is_live(&self, i: u32) -> bool {
        (i as usize) < self.slots.len() && self.slots[i as usize].flags & FREE == 0
    }

    fn unlink(&mut self, i: u32) {
        let b = self.list_of(i);
        let Slot { prev, next, .. } = self.slots[i as usize];
        if prev == NIL {
            self.lists[b].head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[b].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        self.lists[b].len -= 1;
    }

    /// Links slot `i` (already carrying list id `b`) at the tail (`back`) or head of `b`.
    fn link(&mut self, i: u32, b: usize, back: bool) {
        let list = self.lists[b];
        let s = &mut self.slots[i as usize];
        if back {
            s.prev = list.tail;
            s.next = NIL;
            if list.tail == NIL {
                self.lists[b].head = i;
            } else {
                self.slots[list.tail as usize].next = i;
            }
            self.lists[b].tail = i;
        } else {
            s.prev = NIL;
            s.next = list.head;
            if list.head == NIL {
                self.lists[b].tail = i;
            } else {
                self.slots[list.head as usize].prev = i;
            }
            self.lists[b].head = i;
        }
        self.lists[b].len += 1;
        if b < self.scored && b < self.min {
            self.min = b;
        }
    }

    fn set_list(&mut self, i: u32, b: usize) {
        debug_assert!(b < self.lists.len());
        let s = &mut self.slots[i as usize];
        s.score = b as u8;
        s.epoch = self.age_epoch;
    }

    /// Stores `key` in a new slot at the tail of list `b`; `None` when full. The caller
    /// guarantees that `key` is not stored.
    pub(crate) fn insert(&mut self, key: u64, b: usize) -> Option<u32> {
        if self.is_full() {
            return None;
        }
        let slot = Slot {
            key_lo: key as u32,
            key_hi: (key >> 32) as u32,
            prev: NIL,
            next: NIL,
            score: 0,
            epoch: 0,
            flags: 0,
            _pad: 0,
        };
        let i = if self.free != NIL {
            let i = self.free;
            self.free = self.slots[i as usize].next;
            self.slots[i as usize] = slot;
            i
        } else {
            self.slots.push(slot);
            (self.slots.len() - 1) as u32
        };
        self.set_list(i, b);
        self.link(i, b, true);
        self.index.insert(key, i);
        self.len += 1;
        Some(i)
    }

    /// Removes slot `i` (unlinks it, drops its key from the index, frees it); returns the key.
    pub(crate) fn remove(&mut self, i: u32) -> u64 {
        let key = self.key(i);
        self.unlink(i);
        let slots = &self.slots;
        let removed = self.index.remove(key, |s| slots[s as usize].key());
        debug_assert_eq!(removed, Some(i));
        let s = &mut self.slots[i as usize];
        s.flags = FREE;
        s.next = self.free;
        s.prev = NIL;
        self.free = i;
        self.len -= 1;
        key
    }

    /// Moves slot `i` to the tail of list `b` (the newest position; `b` may be its own list).
    pub(crate) fn move_to_back(&mut self, i: u32, b: usize) {
        self.unlink(i);
        self.set_list(i, b);
        self.link(i, b, true);
    }

    /// Moves slot `i` to the head of list `b` (the oldest position).
    pub(crate) fn move_to_front(&mut self, i: u32, b: usize) {
        self.unlink(i);
        self.set_list(i, b);
        self.link(i, b, false);
    }

    /// The oldest unpinned slot of list `b`.
    pub(crate) fn oldest_unpinned(&self, b: usize) -> Option<u32> {
        let mut i = self.lists[b].head;
        while i != NIL {
            if self.slots[i as usize].flags & PINNED == 0 {
                return Some(i);
            }
            i = self.slots[i as usize].next;
        }
        None
    }

    /// The victim of the score buckets: the oldest unpinned slot of the lowest score bucket
    /// that has one. Raises `min` past empty buckets only (a bucket of pinned slots stays).
    pub(crate) fn lowest_unpinned(&mut self) -> Option<u32> {
        while self.min + 1 < self.scored && self.lists[self.min].len == 0 {
            self.min += 1;
        }
        (self.min..self.scored).find_map(|b| self.oldest_unpinned(b))
    }

    /// One aging step: every effective score halves (score buckets only). Bucket `j` becomes
    /// bucket `2j` followed by bucket `2j+1`, so FIFO order within each old bucket is kept
    /// and the lower old score comes first. O(S), plus an O(len) rebase every 128 steps.
    pub(crate) fn age(&mut self) {
        let s = self.scored;
        for j in 0..s {
            let a = 2 * j;
            let lo = if a < s { self.lists[a] } else { EMPTY_LIST };
            let hi = if a + 1 < s { self.lists[a + 1] } else { EMPTY_LIST };
            let merged = if lo.len == 0 {
                hi
            } else if hi.len == 0 {
                lo
            } else {
                self.slots[lo.tail as usize].next = hi.head;
                self.slots[hi.head as usize].prev = lo.tail;
                List { head: lo.head, tail: hi.tail, len: lo.len + hi.len }
            };
            self.lists[j] = merged;
        }
        self.min >>= 1;
        self.age_epoch = self.age_epoch.wrapping_add(1);
        if self.age_epoch >= EPOCH_REBASE {
            self.rebase_epochs();
        }
    }

    /// Rewrites `(score, epoch)` of every live scored slot to `(effective score, 0)`.
    fn rebase_epochs(&mut self) {
        for i in 0..self.slots.len() as u32 {
            if self.slots[i as usize].flags & FREE != 0
                || usize::from(self.slots[i as usize].score) >= self.scored
            {
                continue;
            }
            let eff = self.list_of(i) as u8;
            let s = &mut self.slots[i as usize];
            s.score = eff;
            s.epoch = 0;
        }
        self.age_epoch = 0;
    }

    /// Removes `key`'s slot; whether `key` was stored.
    pub(crate) fn remove_key(&mut self, key: u64) -> bool {
        self.find(key).map(|i| self.remove(i)).is_some()
    }

    /// Gives `from`'s slot the key `to`, keeping its list, place, score and flags; whether it
    /// did (`from` stored, `to` not).
    pub(crate) fn rename_key(&mut self, from: u64, to: u64) -> bool {
        let Some(i) = self.find(from).filter(|_| self.find(to).is_none()) else {
            return false;
        };
        let slots = &self.slots;
        let removed = self.index.remove(from, |s| slots[s as usize].key());
        debug_assert_eq!(removed, Some(i));
        let s = &mut self.slots[i as usize];
        s.key_lo = to as u32;
        s.key_hi = (to >> 32) as u32;
        self.index.insert(to, i);
        true
    }

    /// Raises the capacity to `cap` (no-op when not above the current one): the arena
    /// reserves room, the index is rebuilt at its new size. Slots, lists and scores stay.
    /// O(len + new buckets).
    pub(crate) fn grow(&mut self, cap: usize) {
        if cap <= self.cap {
            return;
        }
        debug_assert!(cap < NIL as usize);
        self.slots.reserve_exact(cap - self.slots.len());
        let mut index = SlotIndex::with_capacity(cap);
        for i in 0..self.slots.len() as u32 {
            if self.is_live(i) {
                index.insert(self.key(i), i);
            }
        }
        self.index = index;
        self.cap = cap;
    }

    /// Appends to `out` up to `n` keys of lists `lists` (in that order, oldest first in each)
    /// that `skip` does not exclude: the order in which the policy would evict them. Pure.
    pub(crate) fn victims_in_order(
        &self,
        lists: impl Iterator<Item = usize>,
        n: usize,
        skip: &dyn Fn(u64) -> bool,
        out: &mut Vec<u64>,
    ) {
        let mut taken = 0;
        for b in lists {
            for i in self.iter_list(b) {
                if taken == n {
                    return;
                }
                let k = self.key(i);
                if !skip(k) {
                    out.push(k);
                    taken += 1;
                }
            }
        }
    }

    /// Slots of list `b`, oldest first.
    pub(crate) fn iter_list(&self, b: usize) -> impl Iterator<Item = u32> + '_ {
        let mut i = self.lists[b].head;
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let cur = i;
            i = self.slots[i as usize].next;
            Some(cur)
        })
    }

    /// Checks the invariants of the module docs; `Err` names the first violation.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.len > self.cap {
            return Err(format!("len {} > capacity {}", self.len, self.cap));
        }
        let mut seen = vec![false; self.slots.len()];
        let mut total = 0usize;
        for b in 0..self.lists.len() {
            let mut prev = NIL;
            let mut n = 0u32;
            for i in self.iter_list(b) {
                if !self.is_live(i) {
                    return Err(format!("free slot {i} linked in list {b}"));
                }
                if seen[i as usize] {
                    return Err(format!("slot {i} linked twice"));
                }
                seen[i as usize] = true;
                if self.slots[i as usize].prev != prev {
                    return Err(format!("slot {i} in list {b}: bad prev link"));
                }
                if self.list_of(i) != b {
                    return Err(format!(
                        "slot {i} in list {b} but its score says {}",
                        self.list_of(i)
                    ));
                }
                if self.find(self.key(i)) != Some(i) {
                    return Err(format!("slot {i} (key {}) not found by the index", self.key(i)));
                }
                prev = i;
                n += 1;
                if n > self.lists[b].len {
                    return Err(format!("list {b} longer than its length {}", self.lists[b].len));
                }
            }
            if n != self.lists[b].len || self.lists[b].tail != prev {
                return Err(format!("list {b}: length or tail wrong"));
            }
            if b < self.scored && n > 0 && b < self.min {
                return Err(format!("min {} above non-empty bucket {b}", self.min));
            }
            total += n as usize;
        }
        if total != self.len {
            return Err(format!("lists hold {total} slots, len is {}", self.len));
        }
        let live = (0..self.slots.len() as u32).filter(|&i| self.is_live(i)).count();
        if live != self.len {
            return Err(format!("{live} live slots, len is {}", self.len));
        }
        #[cfg(test)]
        {
            if self.index.len() != self.len {
                return Err(format!("index holds {}, len is {}", self.index.len(), self.len));
            }
            self.index.check(|s| self.slots[s as usize].key())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_move_remove_keep_invariants() {
        let mut l = Lists::new(4, 4, 1);
        let a = l.insert(10, 2).unwrap();
        let b = l.insert(11, 2).unwrap();
        let c = l.insert(12, 4).unwrap();
        l.check().unwrap();
        assert_eq!(l.iter_list(2).collect::<Vec<_>>(), vec![a, b]);
        l.move_to_back(a, 2);
        assert_eq!(l.iter_list(2).collect::<Vec<_>>(), vec![b, a]);
        l.move_to_front(c, 1);
        assert_eq!(l.lowest_unpinned(), Some(c));
        l.set_flags(c, PINNED);
        assert_eq!(l.lowest_unpinned(), Some(b));
        assert_eq!(l.remove(b), 11);
        assert_eq!(l.find(11), None);
        let d = l.insert(13, 0).unwrap();
        assert_eq!(d, b, "freed slot reused");
        l.insert(14, 3).unwrap();
        assert!(l.insert(15, 3).is_none());
        l.check().unwrap();
    }

    #[test]
    fn aging_splices_lower_bucket_first_and_halves() {
        let mut l = Lists::new(8, 6, 0); // scores 0..=5
        let k: Vec<u32> = [(1, 3), (2, 2), (3, 3), (4, 5), (5, 1), (6, 0)]
            .iter()
            .map(|&(key, s)| l.insert(key, s).unwrap())
            .collect();
        l.age();
        l.check().unwrap();
        // bucket 1 = old 2 then old 3 (in FIFO order): keys 2, 1, 3
        assert_eq!(l.iter_list(1).map(|i| l.key(i)).collect::<Vec<_>>(), vec![2, 1, 3]);
        assert_eq!(l.iter_list(0).map(|i| l.key(i)).collect::<Vec<_>>(), vec![6, 5]);
        assert_eq!(l.list_of(k[3]), 2);
        // A hundreds of agings wrap the u8 epoch only through a rebase; scores reach 0.
        for _ in 0..300 {
            l.age();
        }
        l.check().unwrap();
        assert_eq!(l.list_len(0), 6);
    }
}
