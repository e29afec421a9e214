//! [`NeighborHash`]: the map, its insert/delete algorithms, growth and statistics.

use std::marker::PhantomData;

use crate::bucket::{
    same_line, Bucket, Buckets, BUCKETS_PER_LINE, MAX_OFFSET, PAYLOAD_MASK, STOP_MASK,
};
use crate::error::{capacity_overflow, length_mismatch, payload_out_of_range};
use crate::hash::{reduce, KeyHash, MulXor};
use crate::Error;

/// The smallest table: two cachelines.
const MIN_SLOTS: usize = 8;
/// The largest table: 2^32 − 4 slots (64 GiB of buckets, 3.4 billion keys at load 0.8), so that
/// the batch path can compute homes with 32-bit multiplies (see [`reduce`]); the table layer
/// shards larger key sets over several indexes.
const MAX_SLOTS: usize = crate::hash::MAX_SLOTS;
/// Tables below this many slots (1 MiB of buckets) double when they grow; larger ones grow by
/// [`GROWTH`], so that the average table stays close to the maximum load (dense memory), at the
/// price of more frequent, streaming rehashes.
const DOUBLE_BELOW: usize = 1 << 16;
/// The growth factor of tables of [`DOUBLE_BELOW`] slots and more, as `(numerator, denominator)`:
/// 1.15x. Over sizes spread evenly on a log scale, the average load is then
/// `max_load * ln(1.15) / 0.15` = 0.93 of the maximum (0.75 of the slots at the default 0.8:
/// 21.5 B per key with 16-byte buckets), where doubling gives 0.69 of it (0.55: 28.9 B). The
/// price: each key is moved by about 1 / 0.15 = 6.7 rehashes over its table's growth, against 1
/// with doubling (rehashes stream through both tables: the old one is read in home order).
const GROWTH: (usize, usize) = (23, 20);

/// The buckets of a cacheline in order of distance from the one at position `i` in the line,
/// ties to the lower one: `NEAREST[i]`.
const NEAREST: [[usize; BUCKETS_PER_LINE]; BUCKETS_PER_LINE] =
    [[0, 1, 2, 3], [1, 0, 2, 3], [2, 1, 3, 0], [3, 2, 1, 0]];

/// `n` slots rounded as a table is sized: at least [`MIN_SLOTS`], a whole number of cachelines.
fn round_slots(n: usize) -> Result<usize, Error> {
    let slots = n.max(MIN_SLOTS).checked_next_multiple_of(BUCKETS_PER_LINE);
    slots.filter(|&s| s <= MAX_SLOTS).ok_or_else(|| capacity_overflow(n))
}

/// The slot count a table of `slots` grows to.
fn grown(slots: usize) -> Result<usize, Error> {
    let next = if slots < DOUBLE_BELOW {
        slots.checked_mul(2)
    } else {
        slots.checked_mul(GROWTH.0).map(|x| x.div_ceil(GROWTH.1))
    };
    round_slots(next.ok_or_else(|| capacity_overflow(slots))?)
}

/// How a [`NeighborHash`] is sized and backed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Initial number of slots (buckets); rounded up to a multiple of 4 (one cacheline), at
    /// least 8. Any such count works: the home is `(hash * slots) >> 64`.
    pub slots: usize,
    /// The table grows (2x while small, then 1.15x) when an insert would push `len / slots` past
    /// this. Default 0.8: the load the 12-bit offsets reach comfortably (NeighborHash paper,
    /// §2.1.1).
    pub max_load_factor: f64,
    /// Advise the kernel to back arrays of 2 MiB and more with transparent huge pages.
    /// Default true: multi-GB tables are TLB-bound without them.
    pub huge_pages: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { slots: MIN_SLOTS, max_load_factor: 0.8, huge_pages: true }
    }
}

/// Figures from a full scan of the table (see [`NeighborHash::stats`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Number of keys.
    pub len: usize,
    /// Number of slots (buckets).
    pub capacity: usize,
    /// `len / capacity`.
    pub load_factor: f64,
    /// Average probed cachelines per successful lookup, over every key: the cacheline of the
    /// key's home bucket plus one for each hop along its chain that crosses into another
    /// cacheline (the loads a lookup waits for). `None` for an empty table.
    pub apcl: Option<f64>,
    /// Number of keys in the longest chain.
    pub longest_chain: usize,
    /// Keys stored away from their home bucket (chain members after the head).
    pub displaced: usize,
    /// Bytes of the bucket array.
    pub bytes: usize,
    /// Lodgers moved out of a newly claimed home bucket since the table was last resized.
    pub relocations: u64,
}

/// A map from any `u64` key to a payload below 2^52, stored as NeighborHash: coalesced
/// hashing in one flat array, with lodger relocation, cacheline-aware neighbour probing and
/// 12-bit inline chain offsets.
///
/// `H` is the key hash (default [`MulXor`]: one multiply; [`Fmix64`](crate::hash::Fmix64) is
/// the alternative, e.g. to compare chain lengths).
///
/// Invariant: for every home bucket `h` that some key hashes to, bucket `h` holds one of those
/// keys (the *host*), and every key hashing to `h` is on the chain that starts at `h`. A key
/// therefore lives on exactly one chain, and a lookup walks at most one chain from its home.
///
/// # Concurrency
/// Readers share `&self` (`get`, `get_batch`, `contains_batch`, `stats` may run on many threads
/// at once); writers hold `&mut self`. There is no interior locking: the table layer shards
/// keys over several indexes and puts each behind its own lock.
///
/// # Example
/// ```
/// use embstore_index::NeighborHash;
/// let mut index = NeighborHash::new();
/// index.insert(u64::MAX, 7).unwrap();
/// index.insert(0, 1).unwrap();
/// let mut out = [0u64; 3];
/// let found = index.get_batch(&[0, 5, u64::MAX], &mut out).unwrap();
/// assert_eq!((found, out), (2, [1, embstore_index::MISSING, 7]));
/// assert!(index.insert(1, 1 << 52).is_err()); // payloads are 52 bits
/// ```
pub struct NeighborHash<H: KeyHash = MulXor> {
    pub(crate) buckets: Buckets,
    len: usize,
    /// Largest `len` allowed before growing.
    grow_at: usize,
    relocations: u64,
    config: Config,
    /// How `get_batch` prefetches on this table (chosen by timing its first batches).
    pub(crate) tuner: crate::tune::Tuner,
    hash: PhantomData<fn() -> H>,
}

impl Default for NeighborHash {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: KeyHash> std::fmt::Debug for NeighborHash<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighborHash")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("config", &self.config)
            .finish()
    }
}

impl NeighborHash {
    /// An empty table of 8 slots that grows as needed.
    pub fn new() -> Self {
        Self::with_config(Config::default()).expect("the default config allocates")
    }

    /// An empty table that holds `n` keys without growing.
    pub fn with_capacity(n: usize) -> Result<Self, Error> {
        let config = Config::default();
        let slots = (n as f64 / config.max_load_factor).ceil() as usize;
        Self::with_config(Config { slots, ..config })
    }

    /// An empty table with `slots` slots (rounded up to a multiple of 4, at least 8).
    pub fn with_slots(slots: usize) -> Result<Self, Error> {
        Self::with_config(Config { slots, ..Config::default() })
    }

    /// An empty table as configured. `max_load_factor` is clamped to `[0.05, 0.95]`.
    pub fn with_config(config: Config) -> Result<Self, Error> {
        Self::with_hash(config)
    }
}

impl<H: KeyHash> NeighborHash<H> {
    /// An empty table as configured, hashing keys with `H` (e.g.
    /// `NeighborHash::<Fmix64>::with_hash(config)`).
    pub fn with_hash(config: Config) -> Result<Self, Error> {
        let slots = round_slots(config.slots)?;
        let max_load_factor = if config.max_load_factor.is_nan() {
            Config::default().max_load_factor
        } else {
            config.max_load_factor.clamp(0.05, 0.95)
        };
        let config = Config { slots, max_load_factor, ..config };
        Ok(NeighborHash {
            buckets: Buckets::zeroed(slots, config.huge_pages)?,
            len: 0,
            grow_at: (slots as f64 * max_load_factor) as usize,
            relocations: 0,
            config,
            tuner: Default::default(),
            hash: PhantomData,
        })
    }

    /// Bytes of the bucket array (O(1); [`NeighborHash::stats`] scans).
    pub fn bytes(&self) -> usize {
        self.capacity() * crate::BUCKET_BYTES
    }

    /// Number of keys.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no key.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of slots (buckets).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.buckets.len()
    }

    /// `len / capacity`.
    pub fn load_factor(&self) -> f64 {
        self.len as f64 / self.capacity() as f64
    }

    /// The configuration in force (slots as currently sized).
    pub fn config(&self) -> Config {
        Config { slots: self.capacity(), ..self.config }
    }

    /// The home bucket of `key`: the high bits of its hash, scaled to the slot count.
    #[inline(always)]
    pub(crate) fn home(&self, key: u64) -> usize {
        reduce(H::hash(key), self.buckets.len())
    }

    #[inline(always)]
    fn bucket(&self, i: usize) -> Bucket {
        self.buckets.as_slice()[i]
    }

    #[inline(always)]
    fn set(&mut self, i: usize, b: Bucket) {
        self.buckets.as_mut_slice()[i] = b;
    }

    /// The payload stored for `key`.
    ///
    /// Walks the chain from the key's home: compare the key, stop at an empty bucket or a chain
    /// end (one test of the link bits), else hop by the offset. At the home, an
    /// empty bucket ends the walk, and a lodger (a key from another home) leads down the lodger's
    /// chain, which never holds `key` (chains never mix homes) and ends soon; telling a lodger
    /// from a host would cost a hash on every head mismatch. An empty bucket is all zero, so
    /// key 0, which could match one at its home, takes a separate path.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        if key == 0 {
            return self.get_zero();
        }
        let base = self.buckets.as_ptr();
        // SAFETY: the home is below `len` (`reduce`), and every link leads to a bucket in bounds
        // (the chain invariant, kept by every writer: `find_free` and `claim_in_line` only pick
        // buckets inside the array); `&self` excludes writers while the walk runs.
        unsafe {
            let mut p = base.add(self.home(key));
            loop {
                let b = *p;
                if b.key == key {
                    return Some(b.word & PAYLOAD_MASK);
                }
                if b.word & STOP_MASK == 0 {
                    return None;
                }
                p = p.offset(b.offset());
            }
        }
    }

    /// [`get`](Self::get) of key 0, which an empty bucket (all zero) also carries.
    #[cold]
    #[inline(never)]
    fn get_zero(&self) -> Option<u64> {
        let buckets = self.buckets.as_slice();
        let mut pos = self.home(0);
        loop {
            let b = buckets[pos];
            if b.is_empty() {
                return None;
            }
            if b.key == 0 {
                return Some(b.payload());
            }
            match b.offset() {
                0 => return None,
                offset => pos = pos.wrapping_add_signed(offset),
            }
        }
    }

    /// Whether `key` is stored.
    #[inline]
    pub fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Stores `payload` for `key` and returns the payload it replaced. Grows the table when
    /// the load factor would pass the maximum, or when no free bucket is within the 12-bit offset
    /// range of the chain. Fails, changing nothing, if `payload >= 2^52` or the table cannot grow.
    pub fn insert(&mut self, key: u64, payload: u64) -> Result<Option<u64>, Error> {
        check_payload(payload)?;
        loop {
            if let Some(old) = self.try_insert(key, payload) {
                return Ok(old);
            }
            self.grow()?;
        }
    }

    /// Inserts every `(keys[i], payloads[i])`, later pairs overwriting earlier ones. Lengths and
    /// all payloads are checked before anything is stored, so an invalid batch leaves the table
    /// as it was. Should growing fail midway (a capacity error: out of memory), the pairs before
    /// the failing one stay stored and nothing else changes.
    pub fn insert_batch(&mut self, keys: &[u64], payloads: &[u64]) -> Result<(), Error> {
        if keys.len() != payloads.len() {
            return Err(length_mismatch("payloads", keys.len(), payloads.len()));
        }
        if let Some(&payload) = payloads.iter().find(|&&p| p > PAYLOAD_MASK) {
            return Err(payload_out_of_range(payload));
        }
        // Look this many keys ahead: the prefetched home bucket arrives while the keys in
        // between are inserted.
        const AHEAD: usize = 8;
        for i in 0..keys.len() {
            if let Some(&ahead) = keys.get(i + AHEAD) {
                crate::bucket::prefetch(&self.buckets.as_slice()[self.home(ahead)]);
            }
            loop {
                if self.try_insert(keys[i], payloads[i]).is_some() {
                    break;
                }
                self.grow()?;
            }
        }
        Ok(())
    }

    /// One insert attempt. `None`: the table must grow first (nothing was changed).
    fn try_insert(&mut self, key: u64, payload: u64) -> Option<Option<u64>> {
        let h = self.home(key);
        let head = self.bucket(h);
        let full = self.len >= self.grow_at;
        if head.is_empty() {
            if full {
                return None;
            }
            self.set(h, Bucket::new(key, payload, 0));
        } else if self.home(head.key) != h {
            // A lodger sits in our home: the key is absent. Move the lodger out, take the home.
            if full {
                return None;
            }
            self.relocate_lodger(h)?;
            self.set(h, Bucket::new(key, payload, 0));
        } else {
            // A host: overwrite on the chain, or append to its tail.
            let mut tail = h;
            loop {
                let b = self.bucket(tail);
                if b.key == key {
                    self.set(tail, b.with_payload(payload));
                    return Some(Some(b.payload()));
                }
                match b.offset() {
                    0 => break,
                    offset => tail = tail.wrapping_add_signed(offset),
                }
            }
            if full {
                return None;
            }
            let head_next = match head.offset() {
                0 => None,
                offset => Some(h.wrapping_add_signed(offset)),
            };
            if let Some(at) = self.claim_in_line(h, head_next, h) {
                // Link right after the head: the new node costs one cacheline like the head,
                // and no other node gains a hop (the head's old successor is one hop away
                // either way, and `at` shares the head's cacheline).
                let head = self.bucket(h);
                let after = match head.offset() {
                    0 => 0,
                    offset => h.wrapping_add_signed(offset) as isize - at as isize,
                };
                self.set(at, Bucket::new(key, payload, after));
                self.set(h, head.with_offset(at as isize - h as isize));
            } else {
                let free = self.find_free(tail, None)?;
                self.set(free, Bucket::new(key, payload, 0));
                let t = self.bucket(tail);
                self.set(tail, t.with_offset(free as isize - tail as isize));
            }
        }
        self.len += 1;
        Some(None)
    }

    /// Moves the lodger at bucket `at` to a free bucket near its chain predecessor and relinks
    /// its chain. `None` (nothing changed) when no free bucket is in offset range.
    fn relocate_lodger(&mut self, at: usize) -> Option<()> {
        let pred = self.pred_of(at).expect("a lodger has a predecessor");
        self.move_node(at, pred, true)
    }

    /// The chain predecessor of the node at `at`; `None` for a chain head.
    fn pred_of(&self, at: usize) -> Option<usize> {
        let mut pos = self.home(self.bucket(at).key);
        if pos == at {
            return None;
        }
        loop {
            let next = pos.wrapping_add_signed(self.bucket(pos).offset());
            if next == at {
                return Some(pos);
            }
            pos = next;
        }
    }

    /// Moves the non-head node at `at` (predecessor `pred`) to a bucket near `pred` that still
    /// reaches its successor, leaving `at` empty: first a free or vacatable bucket in `pred`'s
    /// own cacheline (see [`claim_in_line`](Self::claim_in_line); only when `claim` is set, which
    /// bounds the recursion to one level), then the nearest free bucket. `None`: no such bucket,
    /// nothing changed.
    fn move_node(&mut self, at: usize, pred: usize, claim: bool) -> Option<()> {
        let node = self.bucket(at);
        let succ = match node.offset() {
            0 => None,
            offset => Some(at.wrapping_add_signed(offset)),
        };
        let claimed = if claim { self.claim_in_line(pred, succ, at) } else { None };
        let free = match claimed {
            Some(free) => free,
            None => self.find_free(pred, succ)?,
        };
        let link = succ.map_or(0, |s| s as isize - free as isize);
        self.set(free, node.with_offset(link));
        let p = self.bucket(pred);
        self.set(pred, p.with_offset(free as isize - pred as isize));
        self.set(at, Bucket::EMPTY);
        self.relocations += 1;
        Some(())
    }

    /// A bucket in `anchor`'s cacheline for a chain node that is linked from `anchor` (and, with
    /// `reach`, links on to that bucket): a free one, nearest first; else one whose occupant can
    /// leave at no cost to anyone — a non-head node whose chain neighbours are both outside this
    /// cacheline, so its lookups already paid for a hop into the line and pay at most that after
    /// moving. `keep` (and `reach`) are never vacated. `None` when neither exists.
    fn claim_in_line(&mut self, anchor: usize, reach: Option<usize>, keep: usize) -> Option<usize> {
        let line = anchor - anchor % BUCKETS_PER_LINE;
        let fits = |x: usize| {
            x != anchor
                && x != keep
                && Some(x) != reach
                && reach.is_none_or(|r| r.abs_diff(x) <= MAX_OFFSET)
        };
        let candidates = NEAREST[anchor - line].map(|k| line + k);
        if let Some(&x) = candidates.iter().find(|&&x| fits(x) && self.bucket(x).is_empty()) {
            return Some(x);
        }
        for &x in candidates.iter().filter(|&&x| fits(x)) {
            let node = self.bucket(x);
            let Some(pred) = self.pred_of(x) else { continue };
            let succ_in_line =
                node.offset() != 0 && same_line(x, x.wrapping_add_signed(node.offset()));
            if !same_line(pred, x) && !succ_in_line && self.move_node(x, pred, false).is_some() {
                return Some(x);
            }
        }
        None
    }

    /// Cacheline-aware neighbour probing: the nearest free bucket to `anchor`, looking first in
    /// `anchor`'s own cacheline (both directions), then outward both ways, nearest first, up to
    /// the offset range. With `also_near`, the bucket must be within range of it too (a relocated
    /// lodger must reach its successor).
    fn find_free(&self, anchor: usize, also_near: Option<usize>) -> Option<usize> {
        let buckets = self.buckets.as_slice();
        let fits = |i: usize| {
            buckets[i].is_empty() && also_near.is_none_or(|s| s.abs_diff(i) <= MAX_OFFSET)
        };
        let line = anchor - anchor % BUCKETS_PER_LINE;
        for d in 1..BUCKETS_PER_LINE {
            if anchor >= line + d && fits(anchor - d) {
                return Some(anchor - d);
            }
            if anchor + d < line + BUCKETS_PER_LINE && fits(anchor + d) {
                return Some(anchor + d);
            }
        }
        for d in 1..=MAX_OFFSET {
            let (lo, hi) = (anchor.checked_sub(d), anchor + d);
            if let Some(lo) = lo.filter(|&lo| lo < line && fits(lo)) {
                return Some(lo);
            }
            if hi >= line + BUCKETS_PER_LINE && hi < buckets.len() && fits(hi) {
                return Some(hi);
            }
            if lo.is_none() && hi >= buckets.len() {
                break;
            }
        }
        None
    }

    /// Removes `key` and returns its payload. The chain stays intact: the chain's tail moves
    /// into the removed node's bucket and the tail's bucket is freed, so every offset on the
    /// chain stays valid and in range.
    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let h = self.home(key);
        let head = self.bucket(h);
        if head.is_empty() {
            return None;
        }
        let (mut found, mut pos, mut pred) = (None, h, None);
        loop {
            let b = self.bucket(pos);
            if b.key == key {
                found = Some(pos);
            }
            match b.offset() {
                0 => break,
                offset => {
                    pred = Some(pos);
                    pos = pos.wrapping_add_signed(offset);
                }
            }
        }
        // `pos` is the tail, `pred` the tail's predecessor. When the home holds a lodger the walk
        // covers another home's chain, where `key` is never found.
        let node = found?;
        let tail = self.bucket(pos);
        let old = self.bucket(node).payload();
        if node != pos {
            let n = self.bucket(node);
            self.set(node, Bucket::new(tail.key, tail.payload(), n.offset()));
        }
        if let Some(p) = pred {
            let pb = self.bucket(p);
            self.set(p, pb.with_offset(0));
        }
        self.set(pos, Bucket::EMPTY);
        self.len -= 1;
        Some(old)
    }

    /// Removes every key; keeps the capacity.
    pub fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }

    /// Makes room for `additional` more keys without growing.
    pub fn reserve(&mut self, additional: usize) -> Result<(), Error> {
        let want = self.len.saturating_add(additional);
        let lf = self.config.max_load_factor;
        let mut slots =
            round_slots((want as f64 / lf).ceil().min(MAX_SLOTS as f64 + 1.0) as usize)?;
        while ((slots as f64 * lf) as usize) < want {
            slots = round_slots(slots + BUCKETS_PER_LINE)?;
        }
        if slots > self.capacity() {
            self.rehash(slots)?;
        }
        Ok(())
    }

    fn grow(&mut self) -> Result<(), Error> {
        self.rehash(grown(self.capacity())?)
    }

    /// Moves every key into a fresh table of at least `slots` slots (growing once more in the
    /// unlikely case that a chain finds no free bucket in range). The old table is read in bucket
    /// order, which is home order, so the new table is written nearly sequentially.
    fn rehash(&mut self, mut slots: usize) -> Result<(), Error> {
        'attempt: loop {
            let mut next = NeighborHash::<H>::with_hash(Config { slots, ..self.config })?;
            next.grow_at = usize::MAX; // all of `self` must fit
            for b in self.buckets.as_slice().iter().filter(|b| !b.is_empty()) {
                if next.try_insert(b.key, b.payload()).is_none() {
                    slots = grown(slots)?;
                    continue 'attempt;
                }
            }
            next.grow_at = (next.capacity() as f64 * next.config.max_load_factor) as usize;
            *self = next;
            return Ok(());
        }
    }

    /// Every `(key, payload)`, in bucket order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets.as_slice().iter().filter(|b| !b.is_empty()).map(|b| (b.key, b.payload()))
    }

    /// Scans the whole table (O(capacity)): load, exact APCL over every key, longest chain.
    pub fn stats(&self) -> Stats {
        let buckets = self.buckets.as_slice();
        let (mut lines_total, mut longest, mut displaced) = (0usize, 0usize, 0usize);
        for (h, b) in buckets.iter().enumerate() {
            if b.is_empty() || self.home(b.key) != h {
                continue;
            }
            // A host: walk its chain, counting the cachelines a lookup of each node loads.
            let (mut pos, mut lines, mut nodes) = (h, 1, 1);
            lines_total += 1;
            while buckets[pos].offset() != 0 {
                let next = pos.wrapping_add_signed(buckets[pos].offset());
                lines += usize::from(!same_line(pos, next));
                pos = next;
                nodes += 1;
                lines_total += lines;
            }
            displaced += nodes - 1;
            longest = longest.max(nodes);
        }
        Stats {
            len: self.len,
            capacity: self.capacity(),
            load_factor: self.load_factor(),
            apcl: (self.len > 0).then(|| lines_total as f64 / self.len as f64),
            longest_chain: longest,
            displaced,
            bytes: self.capacity() * std::mem::size_of::<Bucket>(),
            relocations: self.relocations,
        }
    }

    /// Checks the structural invariants: every key is reachable from its home bucket along a
    /// chain of keys with that home, chains are acyclic and in bounds, keys are unique, and
    /// `len` is right. O(capacity); for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let buckets = self.buckets.as_slice();
        let occupied = buckets.iter().filter(|b| !b.is_empty()).count();
        if occupied != self.len {
            return Err(format!("len is {} but {occupied} buckets are occupied", self.len));
        }
        let mut on_chains = 0usize;
        for (h, b) in buckets.iter().enumerate() {
            if b.is_empty() || self.home(b.key) != h {
                continue;
            }
            let mut chain = vec![b.key];
            let mut pos = h;
            loop {
                let offset = buckets[pos].offset();
                if offset == 0 {
                    break;
                }
                let next = pos
                    .checked_add_signed(offset)
                    .filter(|&n| n < buckets.len())
                    .ok_or_else(|| format!("bucket {pos}: offset {offset} leaves the array"))?;
                let nb = buckets[next];
                if nb.is_empty() {
                    return Err(format!("bucket {pos} links to empty bucket {next}"));
                }
                if self.home(nb.key) != h {
                    return Err(format!("key {} at {next} is on the chain of home {h}", nb.key));
                }
                if chain.contains(&nb.key) {
                    return Err(format!("key {} twice (or a cycle) on chain {h}", nb.key));
                }
                if chain.len() > self.len {
                    return Err(format!("chain {h} is longer than the table"));
                }
                chain.push(nb.key);
                pos = next;
            }
            on_chains += chain.len();
        }
        if on_chains != self.len {
            return Err(format!("{} keys are stored but {on_chains} are reachable", self.len));
        }
        Ok(())
    }
}

#[inline]
fn check_payload(payload: u64) -> Result<(), Error> {
    if payload > PAYLOAD_MASK {
        return Err(payload_out_of_range(payload));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MISSING;

    #[test]
    fn extreme_keys_and_payloads() {
        let mut t = NeighborHash::new();
        for key in [0, u64::MAX, 1, u64::MAX - 1] {
            assert_eq!(t.insert(key, PAYLOAD_MASK), Ok(None));
        }
        assert_eq!(t.get(0), Some(PAYLOAD_MASK));
        assert_eq!(t.get(u64::MAX), Some(PAYLOAD_MASK));
        assert_eq!(t.insert(0, 5), Ok(Some(PAYLOAD_MASK)));
        assert_eq!(t.remove(u64::MAX), Some(PAYLOAD_MASK));
        assert_eq!(t.get(u64::MAX), None);
        assert_eq!(t.len(), 3);
        t.check_invariants().unwrap();
    }

    #[test]
    fn payload_out_of_range_changes_nothing() {
        let mut t = NeighborHash::new();
        t.insert(9, 1).unwrap();
        let err = t.insert(9, 1 << 52).unwrap_err();
        assert_eq!(err, payload_out_of_range(1 << 52));
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(
            err.to_string(),
            format!(
                "payload {} out of range: payloads must be < 2^52 ({})",
                1u64 << 52,
                1u64 << 52
            )
        );
        assert!(err.to_string().starts_with("payload 4503599627370496 out of range"));
        assert_eq!(t.insert(10, u64::MAX), Err(payload_out_of_range(u64::MAX)));
        assert_eq!((t.get(9), t.get(10), t.len()), (Some(1), None, 1));
        // A batch with one bad payload stores none of its pairs.
        let err = t.insert_batch(&[1, 2, 3], &[1, 1 << 60, 3]).unwrap_err();
        assert_eq!(err, payload_out_of_range(1 << 60));
        assert_eq!((t.get(1), t.get(3), t.len()), (None, None, 1));
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let mut t = NeighborHash::new();
        let err = t.insert_batch(&[1, 2], &[1]).unwrap_err();
        assert_eq!(err, length_mismatch("payloads", 2, 1));
        assert_eq!(err.kind(), crate::ErrorKind::ShapeMismatch);
        assert_eq!(err.to_string(), "length mismatch: 2 keys but 1 payloads");
        assert_eq!(err.to_string(), "length mismatch: 2 keys but 1 payloads");
        assert!(t.is_empty());
        let mut out = [7u64; 3];
        assert!(
            matches!(t.get_batch(&[1, 2], &mut out), Err(e) if e.kind() == crate::ErrorKind::ShapeMismatch)
        );
        assert_eq!(out, [7; 3], "nothing written on error");
        let mut flags = [false; 1];
        assert!(t.contains_batch(&[1, 2], &mut flags).is_err());
    }

    #[test]
    fn empty_batches() {
        let mut t = NeighborHash::new();
        t.insert_batch(&[], &[]).unwrap();
        assert_eq!(t.get_batch(&[], &mut []), Ok(0));
        assert_eq!(t.contains_batch(&[], &mut []), Ok(0));
        assert!(t.is_empty());
    }

    #[test]
    fn batch_results_match_scalar_across_ring_widths() {
        let mut t = NeighborHash::new();
        let keys: Vec<u64> = (0..5000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let payloads: Vec<u64> = (0..5000).collect();
        t.insert_batch(&keys, &payloads).unwrap();
        // Removed keys leave empty buckets (all zero, like key 0's) inside chains and lines.
        for &k in keys.iter().skip(3).step_by(7) {
            t.remove(k).unwrap();
        }
        let present = t.len();
        let queries: Vec<u64> =
            (0..7001u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let expect: Vec<u64> = queries.iter().map(|&k| t.get(k).unwrap_or(MISSING)).collect();
        assert_eq!(expect[0], 0, "key 0 is stored, with payload 0");
        let mut out = vec![0; queries.len()];
        assert_eq!(t.get_batch(&queries, &mut out), Ok(present));
        assert_eq!(out, expect);
        for n in [1, 2, 31, 33, 255, 256, 257, 289, 1000] {
            let q = &queries[..n];
            type Engine = fn(&NeighborHash, &[u64], &mut [u64]) -> Result<usize, Error>;
            let runs: [Engine; 10] = [
                |t, q, o| t.get_batch_ring::<1, false>(q, o),
                |t, q, o| t.get_batch_ring::<7, false>(q, o),
                |t, q, o| t.get_batch_ring::<64, false>(q, o),
                |t, q, o| t.get_batch_ring::<1, true>(q, o),
                |t, q, o| t.get_batch_ring::<64, true>(q, o),
                |t, q, o| t.get_batch(q, o),
                |t, q, o| t.get_batch_with(crate::BatchTuning::CANDIDATES[0], q, o),
                |t, q, o| t.get_batch_with(crate::BatchTuning::CANDIDATES[1], q, o),
                |t, q, o| t.get_batch_with(crate::BatchTuning::CANDIDATES[2], q, o),
                |t, q, o| t.get_batch_with(crate::BatchTuning::CANDIDATES[3], q, o),
            ];
            for (r, run) in runs.iter().enumerate() {
                let mut o = vec![0; n];
                let hits = run(&t, q, &mut o).unwrap();
                assert_eq!(&o[..], &expect[..n], "engine {r}, {n} keys");
                assert_eq!(hits, o.iter().filter(|&&p| p != MISSING).count());
            }
        }
        let mut flags = vec![false; queries.len()];
        t.contains_batch(&queries, &mut flags).unwrap();
        assert!(flags.iter().zip(&expect).all(|(&f, &e)| f == (e != MISSING)));
    }

    #[test]
    fn a_large_table_times_its_first_batches_and_keeps_a_candidate() {
        use crate::{BatchTuning, TUNE_FROM_SLOTS, TUNE_MIN_KEYS, TUNE_ROUNDS};
        let mut t = NeighborHash::with_slots(TUNE_FROM_SLOTS).unwrap();
        let keys: Vec<u64> =
            (1..=40_000u64).map(|i| i.wrapping_mul(0x2545_f491_4f6c_dd1d)).collect();
        t.insert_batch(&keys, &(0..40_000).collect::<Vec<_>>()).unwrap();
        assert_eq!(t.capacity(), TUNE_FROM_SLOTS);
        let queries: Vec<u64> = (0..TUNE_MIN_KEYS as u64 * 2)
            .map(|i| {
                if i % 5 == 0 {
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                } else {
                    keys[i as usize * 7]
                }
            })
            .collect();
        let expect: Vec<u64> = queries.iter().map(|&k| t.get(k).unwrap_or(MISSING)).collect();
        let mut out = vec![0; queries.len()];
        // Short batches are never timed.
        for _ in 0..4 * TUNE_ROUNDS {
            t.get_batch(&queries[..TUNE_MIN_KEYS - 1], &mut out[..TUNE_MIN_KEYS - 1]).unwrap();
        }
        assert_eq!(t.batch_tuning(), None);
        // Timed batches, from two threads at once: right answers all along, then a choice.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut out = vec![0; queries.len()];
                    for _ in 0..4 * TUNE_ROUNDS {
                        t.get_batch(&queries, &mut out).unwrap();
                        assert_eq!(out, expect);
                    }
                });
            }
        });
        let mut rounds = 0;
        while t.batch_tuning().is_none() && rounds < 8 * TUNE_ROUNDS {
            t.get_batch(&queries, &mut out).unwrap();
            rounds += 1;
        }
        let chosen = t.batch_tuning().expect("a choice after every candidate was timed");
        assert!(BatchTuning::CANDIDATES.contains(&chosen));
        // Batches after the choice, some of them split between two candidates to compare them.
        for _ in 0..4 * crate::EXPLORE_EVERY {
            t.get_batch(&queries, &mut out).unwrap();
            assert_eq!(out, expect);
            assert!(t.batch_tuning().is_some_and(|c| BatchTuning::CANDIDATES.contains(&c)));
        }
        // A table that grows starts over; a bad tuning is refused.
        t.reserve(t.capacity()).unwrap();
        assert_eq!(t.batch_tuning(), None);
        let bad = BatchTuning { ring: 3, prefetch_l2: true };
        let err = t.get_batch_with(bad, &queries, &mut out).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("CANDIDATES"), "{err}");
    }

    #[test]
    fn a_small_table_keeps_the_default_pipeline() {
        let mut t = NeighborHash::with_slots(crate::TUNE_FROM_SLOTS / 2).unwrap();
        let keys: Vec<u64> = (0..1000u64).collect();
        t.insert_batch(&keys, &keys).unwrap();
        let mut out = vec![0; 1000];
        for _ in 0..8 * crate::TUNE_ROUNDS {
            assert_eq!(t.get_batch(&keys, &mut out), Ok(1000));
        }
        assert_eq!(out, keys);
        assert_eq!(t.batch_tuning(), None);
    }

    #[test]
    fn grows_at_the_maximum_load_factor_and_not_before() {
        let mut t = NeighborHash::with_slots(1024).unwrap();
        let max = (1024.0 * 0.8) as u64;
        for k in 0..max {
            t.insert(k, k).unwrap();
        }
        assert_eq!(t.capacity(), 1024, "filled to exactly 0.8 without growing");
        t.check_invariants().unwrap();
        t.insert(max, max).unwrap();
        assert_eq!(t.capacity(), 2048);
        t.check_invariants().unwrap();
        assert!((0..=max).all(|k| t.get(k) == Some(k)));
    }

    #[test]
    fn large_tables_grow_by_the_fine_step_and_reserve_exactly() {
        let mut t = NeighborHash::with_slots(1 << 17).unwrap();
        let max = (131_072.0 * 0.8) as u64;
        t.insert_batch(&(0..max).collect::<Vec<_>>(), &(0..max).collect::<Vec<_>>()).unwrap();
        assert_eq!(t.capacity(), 1 << 17);
        t.insert(max, max).unwrap();
        assert_eq!(t.capacity(), 150_736, "131072 * 1.15, rounded up to a whole cacheline");
        t.check_invariants().unwrap();
        assert!((0..=max).all(|k| t.get(k) == Some(k)));
        // Reserve sizes to the load exactly (no power-of-two rounding).
        let mut r = NeighborHash::new();
        r.reserve(1_000_000).unwrap();
        assert_eq!(r.capacity(), 1_250_000);
        assert_eq!(NeighborHash::with_slots(1001).unwrap().capacity(), 1004);
    }

    #[test]
    fn nearest_order_in_a_line_is_by_distance_ties_low_first() {
        for (anchor, order) in NEAREST.iter().enumerate() {
            let mut by_sort: Vec<usize> = (0..BUCKETS_PER_LINE).collect();
            by_sort.sort_by_key(|&x| x.abs_diff(anchor)); // stable: ties keep the lower first
            assert_eq!(&by_sort[..], &order[..], "anchor {anchor}");
        }
    }

    #[test]
    fn key_zero_and_empty_buckets() {
        // An empty bucket is all zero; key 0 must not be found in one, at its home or anywhere.
        let mut t = NeighborHash::with_slots(64).unwrap();
        assert_eq!(t.get(0), None);
        let mut out = [7u64; 2];
        assert_eq!(t.get_batch(&[0, 0], &mut out), Ok(0));
        assert_eq!(out, [MISSING; 2]);
        for k in 1..40u64 {
            t.insert(k, k).unwrap();
        }
        assert_eq!(t.get(0), None);
        t.insert(0, 0).unwrap();
        assert_eq!(t.get(0), Some(0));
        assert_eq!(t.get_batch(&[0, 5], &mut out), Ok(2));
        assert_eq!(out, [0, 5]);
        t.remove(0);
        assert_eq!(t.get(0), None);
        assert_eq!(t.get_batch(&[0, 5], &mut out), Ok(1));
        assert_eq!(out, [MISSING, 5]);
    }

    #[test]
    fn clear_reserve_iter_and_config() {
        let mut t = NeighborHash::with_capacity(100).unwrap();
        assert!(t.capacity() >= 125);
        t.reserve(10_000).unwrap();
        assert!(t.capacity() as f64 * 0.8 >= 10_000.0);
        let cap = t.capacity();
        for k in 0..10_000u64 {
            t.insert(k << 32, k).unwrap();
        }
        assert_eq!(t.capacity(), cap, "reserve made room");
        let mut seen: Vec<(u64, u64)> = t.iter().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..10_000u64).map(|k| (k << 32, k)).collect::<Vec<_>>());
        t.clear();
        assert_eq!((t.len(), t.get(0), t.capacity()), (0, None, cap));
        t.check_invariants().unwrap();
        assert!(NeighborHash::with_slots(usize::MAX).is_err());
        let c =
            NeighborHash::with_config(Config { max_load_factor: f64::NAN, ..Config::default() })
                .unwrap()
                .config();
        assert_eq!(c.max_load_factor, 0.8);
    }

    #[test]
    fn huge_page_and_small_tables_behave_alike() {
        for huge_pages in [true, false] {
            let mut t = NeighborHash::with_config(Config {
                slots: 1 << 18,
                huge_pages,
                ..Config::default()
            })
            .unwrap();
            for k in 0..100_000u64 {
                t.insert(k * 3, k).unwrap();
            }
            assert!((0..100_000u64).all(|k| t.get(k * 3) == Some(k) && t.get(k * 3 + 1).is_none()));
            t.check_invariants().unwrap();
        }
    }

    #[test]
    fn lodgers_are_relocated_and_deletes_keep_chains() {
        // A tiny table forces lodgers, relocations and long chains.
        let mut t = NeighborHash::with_config(Config {
            slots: 64,
            max_load_factor: 0.95,
            ..Config::default()
        })
        .unwrap();
        let keys: Vec<u64> = (0..60u64).map(|i| i * 0x1234_5678_9abc).collect();
        for (i, &k) in keys.iter().enumerate() {
            t.insert(k, i as u64).unwrap();
            t.check_invariants().unwrap();
        }
        assert_eq!(t.capacity(), 64);
        assert!(t.stats().displaced > 0);
        assert!(t.stats().relocations > 0, "no lodger was relocated");
        for (i, &k) in keys.iter().enumerate().step_by(2) {
            assert_eq!(t.remove(k), Some(i as u64));
            assert_eq!(t.remove(k), None);
            t.check_invariants().unwrap();
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), (i % 2 == 1).then_some(i as u64), "key {k}");
        }
    }

    #[test]
    fn stats_on_empty_and_tiny_tables() {
        let t = NeighborHash::new();
        let s = t.stats();
        assert_eq!((s.len, s.capacity, s.apcl, s.longest_chain, s.bytes), (0, 8, None, 0, 128));
        let mut t = NeighborHash::new();
        t.insert(42, 1).unwrap();
        let s = t.stats();
        assert_eq!((s.apcl, s.longest_chain, s.displaced), (Some(1.0), 1, 0));
    }
}
