//! L3's runtime map: a bounded key -> (surrogate, distance) map replaced by CLOCK.

use half::f16;

use super::f16_up;
use embstore_policy::index::{SlotIndex, NIL};

/// A ring slot of [`ClockMap`]: u32 halves give 4-byte alignment, so it packs into 20 bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Slot {
    key_lo: u32,
    key_hi: u32,
    /// The alt id; in a free slot, `alt_lo` is the next free slot.
    alt_lo: u32,
    alt_hi: u32,
    /// The distance as f16 bits; a distance is never negative, so the sign bit is free and
    /// holds the reference bit ([`REFERENCED`]).
    dist: u16,
    /// The caller's tag of the entry (the inference cache: the key's table).
    tag: u16,
}

/// The reference bit, in the sign bit of [`Slot::dist`].
const REFERENCED: u16 = 0x8000;

const _: () = assert!(std::mem::size_of::<Slot>() == 20);

impl Slot {
    fn key(&self) -> u64 {
        u64::from(self.key_hi) << 32 | u64::from(self.key_lo)
    }

    fn value(&self) -> (u64, f32) {
        let dist = f16::from_bits(self.dist & !REFERENCED).to_f32();
        (u64::from(self.alt_hi) << 32 | u64::from(self.alt_lo), dist)
    }

    fn referenced(&self) -> bool {
        self.dist & REFERENCED != 0
    }

    fn set_referenced(&mut self, on: bool) {
        self.dist = if on { self.dist | REFERENCED } else { self.dist & !REFERENCED };
    }

    fn new(key: u64, tag: u16, alt: u64, dist: f32) -> Self {
        Self {
            key_lo: key as u32,
            key_hi: (key >> 32) as u32,
            alt_lo: alt as u32,
            alt_hi: (alt >> 32) as u32,
            // `max(0.0)` also turns NaN into 0: the sign bit stays clear.
            dist: f16_up(f64::from(dist).max(0.0)).to_bits() & !REFERENCED,
            tag,
        }
    }
}

/// The L3 map: key → (alt key, distance), at most `capacity` entries, replaced by CLOCK.
///
/// A new entry takes a free slot, else the victim's slot, with its reference bit clear; the
/// hand then points past it, so it is the last the next sweep reaches. [`ClockMap::get`]
/// sets the bit; a sweep clears set bits as it passes and evicts the first clear one. All
/// slots are allocated up front, so [`ClockMap::heap_bytes`] is exact from the start.
#[derive(Clone, Debug)]
pub struct ClockMap {
    slots: Vec<Slot>,
    index: SlotIndex,
    /// Head of the free-slot list (chained through `alt_lo`), `NIL` if empty.
    free: u32,
    hand: usize,
    len: usize,
    cap: usize,
}

impl ClockMap {
    /// An upper bound on [`ClockMap::bytes_per_entry`] for capacities of 2 or more (a 20-byte
    /// slot plus at most 8/3 index buckets of 4 bytes), for sizing the map from a byte budget.
    pub const BYTES_PER_ENTRY_ESTIMATE: usize = 31;

    /// An empty map for up to `capacity` entries (0 keeps nothing; at most `2^32 - 2`, larger
    /// values are clamped: slots are u32 numbers). Allocates all of it now, about
    /// [`ClockMap::BYTES_PER_ENTRY_ESTIMATE`] bytes an entry.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(NIL as usize - 1);
        Self {
            slots: Vec::with_capacity(capacity),
            index: SlotIndex::with_capacity(capacity),
            free: NIL,
            hand: 0,
            len: 0,
            cap: capacity,
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index.find(key, |s| slots[s as usize].key()).map(|s| s as usize)
    }

    /// The (alt, dist) of `key`, setting its reference bit.
    pub fn get(&mut self, key: u64) -> Option<(u64, f32)> {
        let i = self.find(key)?;
        let s = &mut self.slots[i];
        s.set_referenced(true);
        Some(s.value())
    }

    /// The (alt, dist) of `key`, leaving its reference bit alone.
    pub fn peek(&self, key: u64) -> Option<(u64, f32)> {
        self.find(key).map(|s| self.slots[s].value())
    }

    /// The (tag, alt, dist) of `key`, leaving its reference bit alone.
    pub fn peek_tagged(&self, key: u64) -> Option<(u16, u64, f32)> {
        self.find(key).map(|s| {
            let (alt, dist) = self.slots[s].value();
            (self.slots[s].tag, alt, dist)
        })
    }

    /// Maps `key` to `(alt, dist)` (dist rounded up to f16), tag 0. An existing entry is
    /// updated in place (position and bit unchanged). Returns the key that left the map: the
    /// CLOCK victim, or `key` itself when the capacity is 0.
    pub fn insert(&mut self, key: u64, alt: u64, dist: f32) -> Option<u64> {
        self.insert_tagged(key, 0, alt, dist)
    }

    /// [`insert`](Self::insert) with the caller's `tag` kept beside the entry
    /// ([`peek_tagged`](Self::peek_tagged)).
    pub fn insert_tagged(&mut self, key: u64, tag: u16, alt: u64, dist: f32) -> Option<u64> {
        if let Some(s) = self.find(key) {
            let r = self.slots[s].referenced();
            self.slots[s] = Slot::new(key, tag, alt, dist);
            self.slots[s].set_referenced(r);
            return None;
        }
        if self.cap == 0 {
            return Some(key);
        }
        let (s, evicted) = if self.free != NIL {
            let s = self.free as usize;
            self.free = self.slots[s].alt_lo;
            (s, None)
        } else if self.slots.len() < self.cap {
            self.slots.push(Slot::new(0, 0, 0, 0.0));
            (self.slots.len() - 1, None)
        } else {
            let s = self.sweep();
            let old = self.slots[s].key();
            let slots = &self.slots;
            self.index.remove(old, |s| slots[s as usize].key());
            self.len -= 1;
            (s, Some(old))
        };
        self.slots[s] = Slot::new(key, tag, alt, dist);
        self.index.insert(key, s as u32);
        self.len += 1;
        evicted
    }

    /// Moves the hand to the victim (the map is full, so every slot is live) and past it.
    fn sweep(&mut self) -> usize {
        loop {
            let h = self.hand;
            self.hand = if h + 1 == self.cap { 0 } else { h + 1 };
            let was = self.slots[h].referenced();
            self.slots[h].set_referenced(false);
            if !was {
                return h;
            }
        }
    }

    /// Removes `key`, returning its (alt, dist).
    pub fn remove(&mut self, key: u64) -> Option<(u64, f32)> {
        let slots = &self.slots;
        let s = self.index.remove(key, |s| slots[s as usize].key())? as usize;
        let v = self.slots[s].value();
        self.slots[s] = Slot { alt_lo: self.free, ..Slot::new(0, 0, 0, 0.0) };
        self.free = s as u32;
        self.len -= 1;
        Some(v)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Heap bytes: the 20-byte slots and the index (4 B a bucket, load at most 3/4).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.index.heap_bytes()
    }

    /// [`ClockMap::heap_bytes`] per entry of capacity: 25.3 to 30.7 B for large capacities,
    /// depending on where the capacity falls against the index's power-of-two size.
    pub fn bytes_per_entry(&self) -> f64 {
        self.heap_bytes() as f64 / self.cap.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn clock_gives_referenced_entries_a_second_chance() {
        let mut m = ClockMap::new(4);
        for k in 1..=4 {
            assert_eq!(m.insert(k, k + 100, 0.25), None);
        }
        assert_eq!(m.get(1), Some((101, 0.25)));
        assert_eq!(m.peek(2), Some((102, 0.25))); // peek sets no bit
        assert_eq!(m.insert(5, 105, 0.0), Some(2)); // 1 was referenced: passed, bit cleared
        assert_eq!(m.insert(6, 106, 0.0), Some(3));
        assert_eq!(m.insert(7, 107, 0.0), Some(4));
        assert_eq!(m.insert(8, 108, 0.0), Some(1)); // the second sweep reaches 1 unreferenced
        assert_eq!(m.remove(6), Some((106, 0.0)));
        assert_eq!(m.insert(9, 109, 0.3), None); // takes the free slot
        assert_eq!(m.peek(9), Some((109, f16_up(0.3).to_f32())));
        assert!(m.peek(9).unwrap().1 >= 0.3);
        assert_eq!((m.len(), m.capacity()), (4, 4));
        let mut z = ClockMap::new(0);
        assert_eq!((z.insert(1, 2, 0.0), z.len()), (Some(1), 0));
    }

    /// A tag rides with its entry; the reference bit (in the distance's sign bit) never shows
    /// in a distance, and a re-insert keeps the bit while replacing the tag.
    #[test]
    fn tags_ride_with_entries_and_the_reference_bit_stays_out_of_distances() {
        let mut m = ClockMap::new(2);
        assert_eq!(m.insert_tagged(1, 65_535, 11, 2.5), None);
        assert_eq!(m.insert_tagged(2, 7, 12, 0.0), None);
        assert_eq!(m.get(1), Some((11, 2.5)));
        assert_eq!(m.peek_tagged(1), Some((65_535, 11, 2.5)));
        assert_eq!(m.insert_tagged(1, 3, 13, 1.0), None); // in place: bit kept, tag replaced
        assert_eq!(m.peek_tagged(1), Some((3, 13, 1.0)));
        assert_eq!(m.insert(3, 14, f32::NAN), Some(2)); // 1 is referenced: 2 goes
        assert_eq!(m.peek_tagged(3), Some((0, 14, 0.0)));
        assert_eq!(m.insert(4, 15, 0.5), Some(1)); // 1's bit was cleared by the last sweep
    }

    #[test]
    fn clock_is_bounded_and_counts_its_bytes() {
        let mut m = ClockMap::new(1000);
        let bytes = m.heap_bytes();
        for k in 0..10_000u64 {
            m.insert(k * 7919, k, 0.1);
            assert!(m.len() <= 1000);
            if k % 3 == 0 {
                m.get(k * 7919 / 2);
            }
        }
        assert_eq!((m.len(), m.heap_bytes()), (1000, bytes));
        assert_eq!(bytes, 1000 * 20 + 2048 * 4);
        assert!((25.0..=31.0).contains(&m.bytes_per_entry()));
        for cap in 2..3000 {
            let b = ClockMap::new(cap).bytes_per_entry();
            assert!(b <= ClockMap::BYTES_PER_ENTRY_ESTIMATE as f64, "cap {cap}: {b} B");
        }
    }

    /// The naive CLOCK the model test compares against: linear scans, a LIFO free list.
    #[derive(Default)]
    struct Model {
        slots: Vec<Option<(u64, u64, f32, bool)>>,
        free: Vec<usize>,
        hand: usize,
        cap: usize,
    }

    impl Model {
        fn pos(&self, key: u64) -> Option<usize> {
            self.slots.iter().position(|s| s.is_some_and(|s| s.0 == key))
        }

        fn peek(&self, key: u64) -> Option<(u64, f32)> {
            self.pos(key).and_then(|p| self.slots[p]).map(|s| (s.1, s.2))
        }

        fn insert(&mut self, key: u64, alt: u64, dist: f32) -> Option<u64> {
            if let Some(p) = self.pos(key) {
                let r = self.slots[p].unwrap().3;
                self.slots[p] = Some((key, alt, dist, r));
                return None;
            }
            if self.cap == 0 {
                return Some(key);
            }
            if let Some(p) = self.free.pop() {
                self.slots[p] = Some((key, alt, dist, false));
                return None;
            }
            if self.slots.len() < self.cap {
                self.slots.push(Some((key, alt, dist, false)));
                return None;
            }
            loop {
                let h = self.hand;
                self.hand = (h + 1) % self.cap;
                let s = self.slots[h].as_mut().unwrap();
                if s.3 {
                    s.3 = false;
                } else {
                    let old = s.0;
                    *s = (key, alt, dist, false);
                    return Some(old);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128, failure_persistence: None, ..ProptestConfig::default()
        })]
        /// Model-based: ClockMap agrees with the naive CLOCK on every result and every entry.
        #[test]
        fn clock_agrees_with_naive_model(
            cap in 0usize..8,
            ops in proptest::collection::vec((0u8..4, 0u64..16, 0u64..8), 1..300),
        ) {
            let mut m = ClockMap::new(cap);
            let mut r = Model { cap, ..Model::default() };
            for (op, key, alt) in ops {
                let dist = alt as f32 * 0.125;
                match op {
                    0 => prop_assert_eq!(m.insert(key, alt, dist), r.insert(key, alt, dist)),
                    1 => {
                        let want = r.pos(key).map(|p| {
                            let s = r.slots[p].as_mut().unwrap();
                            s.3 = true;
                            (s.1, s.2)
                        });
                        prop_assert_eq!(m.get(key), want);
                    }
                    2 => prop_assert_eq!(m.peek(key), r.peek(key)),
                    _ => {
                        let want = r.pos(key).map(|p| {
                            let s = r.slots[p].take().unwrap();
                            r.free.push(p);
                            (s.1, s.2)
                        });
                        prop_assert_eq!(m.remove(key), want);
                    }
                }
                let live = r.slots.iter().flatten().count();
                prop_assert_eq!(m.len(), live);
                prop_assert!(m.len() <= cap);
                for k in 0..16 {
                    prop_assert_eq!(m.peek(k), r.peek(k));
                }
            }
        }
    }
}
