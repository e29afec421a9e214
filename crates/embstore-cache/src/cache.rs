//! The inference cache: L1 (group-aware replacement) + L2 (lower-precision rows) + L3
//! (surrogate keys) in one byte budget, over a backing store, sharded for concurrency.
//!
//! ```text
//!  lookup(batch of requests; one request = the keys of its tables: (table, any u64 id))
//!    P1 probe    per shard, read lock: L1? exact : L2? exact(low precision) : miss
//!                misses, per request up to `max_approx`: L3 surrogate resident? approx
//!    P2 fetch    the batch's distinct full misses, one backing read per table, no lock
//!    P3 commit   per request, per shard in ascending order, write lock:
//!                  L2 hits: scores max-updated        L1 hits + misses: GroupLfu commit
//!                  L1 victims -> demoted into L2 (decode, re-encode: no I/O)
//!                  last-tier victims with a surrogate -> L3 (CLOCK map); from a build on
//!                  disk, its block is read inline or by the background filler thread
//!    P4 copy     every key's row (decoded) into `out`, its source into `sources`
//! ```
//!
//! Budget: every byte is counted — each tier's rows (`capacity × codec bytes per row`) and
//! its policy metadata (slots, index, lists), L3's map, surrogate builds held in memory (18 B a
//! row; a build on disk holds 8 B per 227 rows) and the filler's queues. Tier `i` gets
//! `C_i = ⌊share_i · B / (row_i + meta)⌋` entries, then is shrunk until its measured bytes fit.
//!
//! Keys: a key is a table number and a raw 64-bit id (hashed, negative as int64: any bits).
//! The policies see a u64 per key, the id XOR a constant of its table ([`policy_key`]):
//! within a table distinct ids stay distinct, so no id bit is given up for the table. Two keys
//! of different tables share a policy key only when their ids differ by exactly their tables'
//! constants (a 2^-64 chance for hashed ids); every slot also holds its key's table (a tag:
//! none for one table, 1 B for up to 256, else 2 B, counted as metadata), a probe checks it,
//! so such a pair is never served the other's row: while one holds the entry, the other is a
//! miss served from the backing store.
//!
//! Invariants: a key is in at most one of L1/L2 (exclusive tiers); an L1/L2 hit returns
//! exactly `decode(encode(row))` of its tier; a full miss returns the backing store's row
//! exactly; a surrogate is served only if resident at probe time, at most `max_approx` per
//! request, never inserts the missing key and changes no score; a request that cannot be
//! kept whole (every slot pinned) is served uncached and counted as a bypass, never blocked.
//! Requests of one batch are probed against the state before the batch (they are concurrent)
//! and committed in order; with one shard and one caller the cache is deterministic.

use std::fmt;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::codec::{Codec, CodecKind};
use crate::index::fmix64;
use crate::policy::{Group, Policy, PolicyConfig, RequestOutcome};
use crate::surrogate::{ClockMap, SurrogateFile, SurrogateTable};
use crate::trace::split_key;
use crate::{Error, Result};

/// One key of the cache: table `t` and its raw id as one u128, `t << 64 | id` (every id bit
/// is the caller's).
type Key = u128;

/// The key of row `id` of table `table`.
#[inline]
fn key_of(table: u16, id: u64) -> Key {
    u128::from(table) << 64 | u128::from(id)
}

/// The table of `key`.
#[inline]
fn table_of(key: Key) -> u16 {
    (key >> 64) as u16
}

/// The raw id of `key`.
#[inline]
fn id_of(key: Key) -> u64 {
    key as u64
}

/// Table `t`'s constant: `(t + 1)` times 2^64/φ (odd, so distinct tables get distinct
/// constants), spread over all 64 bits; one multiply on the lookup path.
#[inline]
fn table_salt(table: u16) -> u64 {
    (u64::from(table) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The u64 the policies know `key` by: its id XOR its table's constant, so for one table a
/// bijection of the ids (see the module docs for keys of two tables).
#[inline]
fn policy_key(key: Key) -> u64 {
    id_of(key) ^ table_salt(table_of(key))
}

/// The key of table `table` whose policy key is `pk` (the inverse of [`policy_key`]).
#[inline]
fn key_from_policy(table: u16, pk: u64) -> Key {
    key_of(table, pk ^ table_salt(table))
}

/// Bytes of the table tag of each slot of a tier: none for one table (nothing to tell apart),
/// 1 for up to 256 tables, else 2. In an array of their own: beside a 64-byte row a tag would
/// make every row straddle two cache lines, while the dense array of 1 B tags stays cached.
fn tag_bytes(num_tables: usize) -> usize {
    match num_tables {
        0 | 1 => 0,
        2..=256 => 1,
        _ => 2,
    }
}

/// The rows behind the cache (a store on disk, a remote client, …).
pub trait Backing: Send + Sync {
    /// Reads the rows of `ids` in table number `table` into `out` (`[ids.len() × dim]`).
    fn read(&self, table: usize, ids: &[u64], out: &mut [f32]) -> std::result::Result<(), String>;
}

/// Where a key's row came from, per key of a lookup (`sources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Source {
    /// L1, the first tier (exact for an f32 tier).
    L1 = 0,
    /// L2, the second tier (its codec's precision).
    L2 = 1,
    /// A surrogate's row (L3): an approximation.
    Surrogate = 2,
    /// The backing store (a full miss; exact).
    Store = 3,
}

impl Source {
    /// The names of the sources, by discriminant.
    pub const NAMES: [&'static str; 4] = ["l1", "l2", "surrogate", "store"];
}

/// How L3 learns the surrogates of keys evicted from the last tier when their table's build is
/// on disk ([`SurrogateTable::Disk`]; a build in memory is always read inline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum L3Fill {
    /// A filler thread reads the blocks in batches, off the request path (the paper's I/O
    /// threads); what it found enters L3 at the start of a later lookup, or at
    /// [`InferenceCache::sync_l3`]. Keys beyond its bounded queue are dropped and counted.
    #[default]
    Background,
    /// The commit that evicts a key reads its block (one disk read on the request path):
    /// deterministic, so results equal those of the build held in memory.
    Inline,
}

impl L3Fill {
    /// The names [`L3Fill::parse`] takes.
    pub const NAMES: [&'static str; 2] = ["background", "inline"];

    /// By name (InvalidArgument otherwise).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "background" => Ok(Self::Background),
            "inline" => Ok(Self::Inline),
            _ => Err(Error::invalid(format!(
                "unknown l3_fill {name:?}; expected one of {:?}",
                Self::NAMES
            ))),
        }
    }
}

/// One tier: a codec and its share of the budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierConfig {
    /// How rows are stored.
    pub codec: CodecKind,
    /// Share of the budget, in (0, 1].
    pub share: f64,
}

/// Everything an [`InferenceCache`] is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Number of tables; a key's table must be below it.
    pub num_tables: usize,
    /// Embedding dimension of every table.
    pub dim: usize,
    /// Bytes for everything: rows, metadata, indexes, L3.
    pub memory_budget_bytes: usize,
    /// The replacement policy of each tier (it must keep rows in slots: not EV-ARC).
    pub policy: PolicyConfig,
    /// One or two tiers (L1, then L2), in order. Shares sum to at most 1.
    pub tiers: Vec<TierConfig>,
    /// Share of the budget for L3's map when surrogates are given (taken before the tiers'
    /// shares are applied to the rest).
    pub surrogate_share: f64,
    /// Most surrogates served in one request.
    pub max_approx_per_request: usize,
    /// Largest stored surrogate distance served (the build's own threshold applies too).
    pub max_surrogate_dist: f32,
    /// Demote L1 victims into L2 (a victim cache; no I/O).
    pub demote: bool,
    /// Shards (each a full L1/L2/L3 with `1/shards` of the budget); 1 = deterministic.
    pub shards: usize,
    /// How L3 is fed from surrogate builds on disk.
    pub l3_fill: L3Fill,
}

impl CacheConfig {
    /// One f32 tier, [`GroupAssoc`](crate::GroupAssoc) with `S = num_tables` (more perfect
    /// hits per byte than GroupLfu in every configuration measured: docs/benchmarks.md,
    /// issue 10, "The default policy"), 1 shard, no surrogates.
    pub fn new(num_tables: usize, dim: usize, memory_budget_bytes: usize) -> Self {
        Self {
            num_tables,
            dim,
            memory_budget_bytes,
            policy: PolicyConfig::GroupAssoc(crate::GroupAssocConfig {
                max_score: num_tables.clamp(1, 255) as u8,
                ..crate::GroupAssocConfig::default()
            }),
            tiers: vec![TierConfig { codec: CodecKind::F32, share: 1.0 }],
            surrogate_share: 0.04,
            max_approx_per_request: 2,
            max_surrogate_dist: f32::INFINITY,
            demote: true,
            shards: 1,
            l3_fill: L3Fill::Background,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.num_tables == 0 || self.num_tables > 1 << 16 {
            return Err(Error::invalid(format!(
                "the cache needs 1 to 65536 tables, got {}",
                self.num_tables
            )));
        }
        if self.dim == 0 {
            return Err(Error::invalid("embedding dim must be at least 1, got 0"));
        }
        if self.tiers.is_empty() || self.tiers.len() > 2 {
            return Err(Error::invalid(format!(
                "the cache takes 1 or 2 tiers, got {}",
                self.tiers.len()
            )));
        }
        let sum: f64 = self.tiers.iter().map(|t| t.share).sum();
        for t in &self.tiers {
            if !(t.share.is_finite() && t.share > 0.0) {
                return Err(Error::invalid(format!(
                    "tier {} share must be in (0, 1], got {}",
                    t.codec.name(),
                    t.share
                )));
            }
        }
        if sum > 1.0 + 1e-9 {
            return Err(Error::invalid(format!("tier shares must sum to at most 1, got {sum}")));
        }
        if !(0.0..1.0).contains(&self.surrogate_share) {
            return Err(Error::invalid(format!(
                "surrogate share must be in [0, 1), got {}",
                self.surrogate_share
            )));
        }
        if self.max_surrogate_dist.is_nan() || self.max_surrogate_dist < 0.0 {
            return Err(Error::invalid(format!(
                "max surrogate distance must be >= 0, got {}",
                self.max_surrogate_dist
            )));
        }
        if self.shards == 0 || self.shards > 1024 {
            return Err(Error::invalid(format!("shards must be 1 to 1024, got {}", self.shards)));
        }
        Ok(())
    }
}

/// Counters since the cache was built (or [`InferenceCache::reset_stats`]).
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
    /// Entries evicted from the last tier (dropped).
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
    fn add(&mut self, o: &Self) {
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

    fn note_request(&mut self, misses: usize) {
        if self.misses_per_request.len() <= misses {
            self.misses_per_request.resize(misses + 1, 0);
        }
        self.misses_per_request[misses] += 1;
    }
}

/// Bytes and entries of one tier (all shards together).
#[derive(Clone, Debug, PartialEq)]
pub struct TierMemory {
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
    pub tiers: Vec<TierMemory>,
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

struct Tier {
    codec: &'static dyn Codec,
    policy: Box<dyn Policy>,
    /// Slot `i`'s row: `code` bytes at `i * code`.
    rows: Vec<u8>,
    /// Slot `i`'s key's table: `tag` bytes at `i * tag` ([`tag_bytes`]; the policy knows
    /// only [`policy_key`]).
    tags: Vec<u8>,
    code: usize,
    tag: usize,
}

impl Tier {
    fn new(cfg: &CacheConfig, codec: CodecKind, capacity: usize) -> Result<Self> {
        let codec = codec.codec();
        let (code, tag) = (codec.bytes_per_row(cfg.dim), tag_bytes(cfg.num_tables));
        let policy = cfg.policy.build(capacity)?;
        if !policy.has_slots() {
            return Err(Error::invalid(format!(
                "policy {} has no stable slots to hold rows (ev-arc keeps ghost entries): \
                 use it with evaluate() only",
                policy.name()
            )));
        }
        let (rows, tags) = (vec![0u8; capacity * code], vec![0u8; capacity * tag]);
        Ok(Self { codec, policy, rows, tags, code, tag })
    }

    fn bytes(&self) -> usize {
        self.rows.len() + self.metadata_bytes()
    }

    /// Bytes of the rows proper.
    fn row_bytes(&self) -> usize {
        self.rows.len()
    }

    /// The policy's bytes and the slots' tags.
    fn metadata_bytes(&self) -> usize {
        self.policy.metadata_bytes() + self.tags.len()
    }

    /// The table of the key in `slot`.
    #[inline]
    fn tag_of(&self, slot: u32) -> u16 {
        let s = slot as usize * self.tag;
        match self.tag {
            0 => 0,
            1 => u16::from(self.tags[s]),
            _ => u16::from_le_bytes([self.tags[s], self.tags[s + 1]]),
        }
    }

    /// The slot holding `key` (its policy key resident, with `key`'s table).
    #[inline]
    fn slot_of(&self, key: Key) -> Option<u32> {
        self.slot_of_pk(policy_key(key), table_of(key))
    }

    /// The slot holding the key of table `table` with policy key `pk`.
    #[inline]
    fn slot_of_pk(&self, pk: u64, table: u16) -> Option<u32> {
        self.policy.slot_of(pk).filter(|&s| self.tag_of(s) == table)
    }

    /// The key held in `slot`, whose policy key is `pk`.
    #[inline]
    fn key_in(&self, slot: u32, pk: u64) -> Key {
        key_from_policy(self.tag_of(slot), pk)
    }

    fn row(&self, slot: u32) -> &[u8] {
        let s = slot as usize * self.code;
        &self.rows[s..s + self.code]
    }

    /// Gives `slot` the tag of `key`.
    fn set_tag(&mut self, slot: u32, key: Key) {
        let s = slot as usize * self.tag;
        // The table is below the cache's table count (checked at lookup), so it fits the tag.
        let t = table_of(key).to_le_bytes();
        self.tags[s..s + self.tag].copy_from_slice(&t[..self.tag]);
    }

    /// Writes `key`'s row into `slot`.
    fn write(&mut self, slot: u32, key: Key, row: &[f32]) {
        let s = slot as usize * self.code;
        self.codec.encode(row, &mut self.rows[s..s + self.code]);
        self.set_tag(slot, key);
    }

    /// Writes `key`'s row already in this tier's code (`code` bytes).
    fn write_coded(&mut self, slot: u32, key: Key, coded: &[u8]) {
        let s = slot as usize * self.code;
        self.rows[s..s + self.code].copy_from_slice(coded);
        self.set_tag(slot, key);
    }

    /// Decodes `key`'s row into `out` if resident.
    fn get(&self, key: Key, out: &mut [f32]) -> bool {
        self.get_pk(policy_key(key), table_of(key), out)
    }

    /// [`get`](Self::get) for the key of table `table` with policy key `pk`.
    #[inline]
    fn get_pk(&self, pk: u64, table: u16, out: &mut [f32]) -> bool {
        match self.slot_of_pk(pk, table) {
            Some(slot) => {
                self.codec.decode(self.row(slot), out);
                true
            }
            None => false,
        }
    }
}

struct Shard {
    tiers: Vec<Tier>,
    l3: Option<ClockMap>,
    out: RequestOutcome,
    out2: RequestOutcome,
    tmp: Vec<f32>,
}

/// Per-request scratch of one lookup: the request's distinct keys and what each got.
#[derive(Default)]
struct Scratch {
    /// Distinct keys of every request, request after request.
    keys: Vec<Key>,
    /// Their policy keys ([`policy_key`]).
    pks: Vec<u64>,
    /// `keys[offsets[r]..offsets[r + 1]]` belong to request `r`.
    offsets: Vec<usize>,
    /// For each input position, its distinct key's index in `keys`.
    map: Vec<u32>,
    /// Each distinct key's source at probe time.
    src: Vec<Source>,
    /// Each distinct key's shard.
    shard: Vec<u32>,
    /// Each distinct key's row (`[keys.len() × dim]`).
    vals: Vec<f32>,
    /// For a surrogate-served key: its surrogate's key (for L3's reference bit).
    approx_of: Vec<Key>,
}

/// The inference cache (see the module docs).
pub struct InferenceCache {
    cfg: CacheConfig,
    backing: Arc<dyn Backing>,
    surrogates: Vec<Option<SurrogateTable>>,
    shards: Vec<RwLock<Shard>>,
    stats: Mutex<CacheStats>,
    /// Reads surrogate blocks off the request path ([`L3Fill::Background`] with a build on
    /// disk).
    filler: Option<Filler>,
}

/// Keys a filler read takes at once.
const FILL_BATCH: usize = 64;

/// The L3 filler: a thread that reads the surrogates of evicted keys from builds on disk. It
/// touches no shard: what it finds waits in `ready` until a lookup (or `sync_l3`) moves it
/// into L3 under the shard's lock. Both queues are bounded by `cap`, allocated up front.
struct Filler {
    shared: Arc<FillShared>,
    worker: Option<std::thread::JoinHandle<()>>,
}

struct FillShared {
    state: Mutex<FillState>,
    /// Signalled when keys arrive or on stop.
    wake: Condvar,
    /// Signalled when the worker has nothing pending and is not reading.
    idle: Condvar,
    files: Vec<Option<Arc<SurrogateFile>>>,
    cap: usize,
}

#[derive(Default)]
struct FillState {
    pending: Vec<Key>,
    ready: Vec<(Key, u64, f32)>,
    busy: bool,
    stop: bool,
    /// Counters the next `apply_ready` adds to the cache's stats.
    reads: u64,
    errors: u64,
    drops: u64,
}

impl Filler {
    fn start(files: Vec<Option<Arc<SurrogateFile>>>, cap: usize) -> Result<Self> {
        let shared = Arc::new(FillShared {
            state: Mutex::new(FillState {
                pending: Vec::with_capacity(cap),
                ready: Vec::with_capacity(cap),
                ..FillState::default()
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
            files,
            cap,
        });
        let sh = shared.clone();
        let worker = std::thread::Builder::new()
            .name("embstore-l3-fill".into())
            .spawn(move || sh.run())
            .map_err(|e| Error::io("cannot start the L3 filler thread", e))?;
        Ok(Self { shared, worker: Some(worker) })
    }

    /// Bytes of both queues.
    fn bytes(&self) -> usize {
        Self::bytes_for(self.shared.cap)
    }

    /// Bytes of both queues for `cap` keys each.
    fn bytes_for(cap: usize) -> usize {
        cap * (std::mem::size_of::<Key>() + std::mem::size_of::<(Key, u64, f32)>())
    }

    /// Queues `key`; false when the queue is full (the key is dropped).
    fn push(&self, key: Key) -> bool {
        let mut st = self.shared.state.lock();
        if st.pending.len() == self.shared.cap {
            return false;
        }
        st.pending.push(key);
        self.shared.wake.notify_one();
        true
    }
}

impl FillShared {
    fn run(&self) {
        let mut keys = Vec::with_capacity(FILL_BATCH);
        let mut found = Vec::new();
        loop {
            {
                let mut st = self.state.lock();
                while st.pending.is_empty() && !st.stop {
                    self.wake.wait(&mut st);
                }
                if st.stop {
                    return;
                }
                let n = st.pending.len().min(FILL_BATCH);
                keys.clear();
                keys.extend(st.pending.drain(..n));
                st.busy = true;
            }
            let (mut reads, mut errors) = (0, 0);
            let mut results = Vec::with_capacity(keys.len());
            let mut ids = Vec::new();
            let mut tables: Vec<u16> = keys.iter().map(|&k| table_of(k)).collect();
            tables.sort_unstable();
            tables.dedup();
            for t in tables {
                let Some(Some(file)) = self.files.get(usize::from(t)) else { continue };
                ids.clear();
                ids.extend(keys.iter().filter(|&&k| table_of(k) == t).map(|&k| id_of(k)));
                match file.get_many(&ids, &mut found) {
                    Ok(n) => {
                        reads += n as u64;
                        for (&id, f) in ids.iter().zip(&found) {
                            if let Some((alt, dist)) = *f {
                                results.push((key_of(t, id), alt, dist));
                            }
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            let mut st = self.state.lock();
            let room = self.cap - st.ready.len();
            st.drops += results.len().saturating_sub(room) as u64;
            results.truncate(room);
            st.ready.extend(results);
            st.reads += reads;
            st.errors += errors;
            st.busy = false;
            if st.pending.is_empty() {
                self.idle.notify_all();
            }
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl fmt::Debug for InferenceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InferenceCache").field("config", &self.cfg).finish_non_exhaustive()
    }
}

/// Entries of a tier with `bytes` for rows of `row` bytes and ~`meta` bytes of metadata each.
fn entries_for(bytes: f64, row: usize, meta: usize) -> usize {
    (bytes / (row + meta) as f64).floor().max(0.0) as usize
}

/// Bytes the distinct surrogate builds hold in memory (one shared by two tables counts once).
fn surrogate_table_bytes(surrogates: &[Option<SurrogateTable>]) -> usize {
    let mut seen: Vec<&SurrogateTable> = Vec::new();
    let mut bytes = 0;
    for s in surrogates.iter().flatten() {
        if !seen.iter().any(|o| o.same(s)) {
            seen.push(s);
            bytes += s.heap_bytes();
        }
    }
    bytes
}

impl InferenceCache {
    /// A cache over `backing` per `cfg`; `surrogates[t]` is table `t`'s surrogate build (or
    /// `None`; an empty vector means none at all), in memory or on disk. The builds' bytes in
    /// memory come out of the budget first, then L3's share (its map and, for builds on disk
    /// fed in the background, the filler's queues), then the tiers'. Errors: bad
    /// configuration, a budget too small for one request in every shard (fewer L1 entries
    /// than tables) or for the builds held in memory, surrogates of a different count or
    /// dimension.
    pub fn new(
        cfg: CacheConfig,
        backing: Arc<dyn Backing>,
        surrogates: Vec<Option<SurrogateTable>>,
    ) -> Result<Self> {
        cfg.validate()?;
        if !surrogates.is_empty() && surrogates.len() != cfg.num_tables {
            return Err(Error::shape(format!(
                "surrogates must be given for {} tables, got {}",
                cfg.num_tables,
                surrogates.len()
            )));
        }
        if let Some((t, s)) = surrogates
            .iter()
            .enumerate()
            .filter_map(|(t, s)| Some((t, s.as_ref()?)))
            .find(|(_, s)| s.dim() != cfg.dim)
        {
            return Err(Error::shape(format!(
                "the surrogates of table {t} were built from rows of dim {}, the cache's is {}",
                s.dim(),
                cfg.dim
            )));
        }
        let with_l3 = surrogates.iter().any(Option::is_some);
        let files: Vec<Option<Arc<SurrogateFile>>> = surrogates
            .iter()
            .map(|s| match s {
                Some(SurrogateTable::Disk(f)) => Some(f.clone()),
                _ => None,
            })
            .collect();
        let background = cfg.l3_fill == L3Fill::Background && files.iter().any(Option::is_some);
        // The filler's queues: about a quarter of the entries L3's share holds, 4 to 1,024
        // (at 4 %, a budget of 11 KB gives 4 keys: 128 B).
        let queue_cap = background.then(|| {
            ((cfg.memory_budget_bytes as f64 * cfg.surrogate_share
                / ClockMap::BYTES_PER_ENTRY_ESTIMATE as f64
                / 4.0) as usize)
                .clamp(4, 1024)
        });
        let fixed = surrogate_table_bytes(&surrogates) + queue_cap.map_or(0, Filler::bytes_for);
        if with_l3 && fixed >= cfg.memory_budget_bytes {
            return Err(Error::invalid(format!(
                "the surrogate builds and the L3 filler's queues hold {fixed} B in memory, not \
                 less than the {} B budget: open the builds from disk (SurrogateFile::open, \
                 Python Surrogates.open) so that L3 reads a block when it is fed",
                cfg.memory_budget_bytes
            )));
        }
        let n = cfg.shards;
        // Without surrogates `fixed` is 0.
        let avail = (cfg.memory_budget_bytes - fixed) as f64;
        let l3_total = if with_l3 { avail * cfg.surrogate_share } else { 0.0 };
        let l3_cap = entries_for(l3_total / n as f64, 0, ClockMap::BYTES_PER_ENTRY_ESTIMATE);
        let rest = (avail - l3_total) / n as f64;
        let mut shards = Vec::with_capacity(n);
        for _ in 0..n {
            let mut tiers = Vec::with_capacity(cfg.tiers.len());
            for t in &cfg.tiers {
                let share = rest * t.share;
                let row = t.codec.codec().bytes_per_row(cfg.dim);
                // Size with an estimate of the metadata, measure the real figure at that
                // capacity (the index is a power of two), size again with it, then shrink
                // until the measured bytes fit the share.
                let mut cap = entries_for(share, row, 32).max(1);
                if let Ok(probe) = cfg.policy.build(cap) {
                    let meta = probe.metadata_bytes().div_ceil(cap) + tag_bytes(cfg.num_tables);
                    cap = entries_for(share, row, meta);
                }
                let tier = loop {
                    if cap < cfg.num_tables.max(1) {
                        return Err(Error::invalid(format!(
                            "memory budget {} B gives the {} tier {cap} entries per shard, \
                             fewer than one request's {} keys: raise the budget or use fewer \
                             shards",
                            cfg.memory_budget_bytes,
                            t.codec.name(),
                            cfg.num_tables
                        )));
                    }
                    let tier = Tier::new(&cfg, t.codec, cap)?;
                    if tier.bytes() as f64 <= share {
                        break tier;
                    }
                    cap = ((cap as f64) * 0.99) as usize;
                };
                tiers.push(tier);
            }
            let l3 = (with_l3 && l3_cap > 0).then(|| ClockMap::new(l3_cap));
            shards.push(RwLock::new(Shard {
                tiers,
                l3,
                out: RequestOutcome::default(),
                out2: RequestOutcome::default(),
                tmp: vec![0.0; cfg.dim],
            }));
        }
        // Started last, once nothing else can fail.
        let filler = match queue_cap {
            Some(cap) => Some(Filler::start(files, cap)?),
            None => None,
        };
        Ok(Self {
            surrogates: if surrogates.is_empty() { vec![None; cfg.num_tables] } else { surrogates },
            cfg,
            backing,
            shards,
            stats: Mutex::new(CacheStats::default()),
            filler,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Counters since construction or the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> CacheStats {
        self.stats.lock().clone()
    }

    /// Zeroes the counters (the cached rows stay).
    pub fn reset_stats(&self) {
        *self.stats.lock() = CacheStats::default();
    }

    /// Entries L1 and L2 can hold, all shards together.
    pub fn capacity(&self) -> usize {
        self.memory().tiers.iter().map(|t| t.capacity).sum()
    }

    /// Where the budget went.
    pub fn memory(&self) -> CacheMemory {
        let mut tiers: Vec<TierMemory> = self
            .cfg
            .tiers
            .iter()
            .map(|t| TierMemory {
                codec: t.codec.name(),
                capacity: 0,
                len: 0,
                row_bytes: 0,
                metadata_bytes: 0,
            })
            .collect();
        let (mut l3_capacity, mut l3_len, mut l3_bytes) = (0, 0, 0);
        for s in &self.shards {
            let s = s.read();
            for (m, t) in tiers.iter_mut().zip(&s.tiers) {
                m.capacity += t.policy.capacity();
                m.len += t.policy.len();
                m.row_bytes += t.row_bytes();
                m.metadata_bytes += t.metadata_bytes();
            }
            if let Some(l3) = &s.l3 {
                l3_capacity += l3.capacity();
                l3_len += l3.len();
                l3_bytes += l3.heap_bytes();
            }
        }
        let meta: usize = tiers.iter().map(|t| t.metadata_bytes).sum();
        let cap: usize = tiers.iter().map(|t| t.capacity).sum();
        let surrogate_table_bytes = surrogate_table_bytes(&self.surrogates);
        let l3_queue_bytes = self.filler.as_ref().map_or(0, Filler::bytes);
        let total = tiers.iter().map(|t| t.row_bytes + t.metadata_bytes).sum::<usize>()
            + l3_bytes
            + surrogate_table_bytes
            + l3_queue_bytes;
        CacheMemory {
            budget_bytes: self.cfg.memory_budget_bytes,
            tiers,
            l3_capacity,
            l3_len,
            l3_bytes,
            surrogate_table_bytes,
            l3_queue_bytes,
            total_bytes: total,
            metadata_bytes_per_entry: meta as f64 / cap.max(1) as f64,
        }
    }

    /// Drops every cached row and L3 entry (after the backing table changed). Counters stay.
    pub fn clear(&self) -> Result<()> {
        for s in &self.shards {
            let mut s = s.write();
            for t in &mut s.tiers {
                let cap = t.policy.capacity();
                t.policy = self.cfg.policy.build(cap)?;
            }
            if let Some(l3) = &mut s.l3 {
                *l3 = ClockMap::new(l3.capacity());
            }
        }
        if let Some(f) = &self.filler {
            self.sync_l3();
            f.shared.state.lock().ready.clear();
        }
        Ok(())
    }

    /// Waits until the L3 filler has read every key queued so far, then moves what it found
    /// into L3. A no-op without a filler. After `sync_l3` following every lookup, a cache fed
    /// in the background is in the state [`L3Fill::Inline`] gives.
    pub fn sync_l3(&self) {
        if let Some(f) = &self.filler {
            let mut st = f.shared.state.lock();
            while !st.pending.is_empty() || st.busy {
                f.shared.idle.wait(&mut st);
            }
        }
        self.apply_ready();
    }

    /// Moves the filler's findings into L3 (under each shard's write lock) and its counters
    /// into the stats.
    fn apply_ready(&self) {
        let Some(f) = &self.filler else { return };
        let (ready, reads, errors, drops) = {
            let mut st = f.shared.state.lock();
            if st.ready.is_empty() && st.reads + st.errors + st.drops == 0 {
                return;
            }
            let ready: Vec<(Key, u64, f32)> = st.ready.drain(..).collect();
            let counters = (std::mem::take(&mut st.reads), std::mem::take(&mut st.errors));
            (ready, counters.0, counters.1, std::mem::take(&mut st.drops))
        };
        let mut inserts = 0;
        for (key, alt, dist) in ready {
            if let Some(l3) = &mut self.shards[self.shard_of(key)].write().l3 {
                l3.insert_tagged(policy_key(key), table_of(key), alt, dist);
                inserts += 1;
            }
        }
        let mut st = self.stats.lock();
        st.l3_inserts += inserts;
        st.l3_reads += reads;
        st.l3_read_errors += errors;
        st.l3_queue_drops += drops;
    }

    fn shard_of(&self, key: Key) -> usize {
        self.shard_of_pk(policy_key(key))
    }

    fn shard_of_pk(&self, pk: u64) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            (fmix64(pk) % self.shards.len() as u64) as usize
        }
    }

    /// The u64 this cache's policies know row `id` of table `table` by: the id XOR a constant
    /// of its table (the module docs). A bare policy evaluated on keys mapped through this
    /// sees what the cache's policies see ([`crate::GroupAssoc`] places a key by a hash of it).
    pub fn policy_key(table: u16, id: u64) -> u64 {
        policy_key(key_of(table, id))
    }

    /// [`lookup_ids`](Self::lookup_ids) with trace keys, `table << 48 | id` ([`split_key`]):
    /// ids below 2^48 only, as [`crate::Trace`] and [`crate::evaluate`] carry them.
    pub fn lookup(
        &self,
        keys: &[u64],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        let keys: Vec<Key> = keys
            .iter()
            .map(|&k| {
                let (t, id) = split_key(k);
                key_of(t, id)
            })
            .collect();
        self.serve(&keys, offsets, out, sources)
    }

    /// Serves a batch of requests: key `j` is row `ids[j]` (any 64-bit id: hashed, or a
    /// negative int64 as its two's complement) of table `tables[j]`, and request `r` is keys
    /// `offsets[r]..offsets[r + 1]`. Writes each key's row into `out` (`[ids.len() × dim]`)
    /// and, when given, its [`Source`] into `sources`. Errors (nothing changes): `tables` and
    /// `ids` of different lengths, offsets that do not cover them, an empty request, a table
    /// number out of range, a wrong output length, a backing-store failure.
    pub fn lookup_ids(
        &self,
        tables: &[u16],
        ids: &[u64],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        if tables.len() != ids.len() {
            return Err(Error::shape(format!(
                "tables and ids must have the same length, got {} and {}",
                tables.len(),
                ids.len()
            )));
        }
        let keys: Vec<Key> = tables.iter().zip(ids).map(|(&t, &id)| key_of(t, id)).collect();
        self.serve(&keys, offsets, out, sources)
    }

    fn serve(
        &self,
        keys: &[Key],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        let d = self.cfg.dim;
        self.check(keys, offsets, out, sources.as_deref())?;
        self.apply_ready();
        let mut sc = Scratch::default();
        self.dedup(keys, offsets, &mut sc);
        let mut stats = CacheStats::default();
        self.probe(&mut sc);
        self.approximate(&mut sc);
        let fetched = self.fetch(&mut sc, &mut stats)?;
        self.commit(&sc, &fetched, &mut stats)?;
        for (i, &u) in sc.map.iter().enumerate() {
            let u = u as usize;
            out[i * d..(i + 1) * d].copy_from_slice(&sc.vals[u * d..(u + 1) * d]);
        }
        if let Some(src) = sources {
            for (s, &u) in src.iter_mut().zip(&sc.map) {
                *s = sc.src[u as usize];
            }
        }
        for r in 0..sc.offsets.len() - 1 {
            let srcs = &sc.src[sc.offsets[r]..sc.offsets[r + 1]];
            let count = |x: Source| srcs.iter().filter(|&&s| s == x).count();
            let (l1, l2, ap, miss) = (
                count(Source::L1),
                count(Source::L2),
                count(Source::Surrogate),
                count(Source::Store),
            );
            stats.requests += 1;
            stats.keys += srcs.len() as u64;
            stats.l1_hits += l1 as u64;
            stats.l2_hits += l2 as u64;
            stats.approximated += ap as u64;
            stats.misses += miss as u64;
            stats.perfect += u64::from(ap + miss == 0);
            stats.served_perfect += u64::from(miss == 0);
            stats.note_request(miss);
        }
        self.stats.lock().add(&stats);
        Ok(())
    }

    fn check(
        &self,
        keys: &[Key],
        offsets: &[usize],
        out: &[f32],
        sources: Option<&[Source]>,
    ) -> Result<()> {
        if offsets.first() != Some(&0) || offsets.last() != Some(&keys.len()) {
            return Err(Error::shape(format!(
                "offsets must run from 0 to the number of keys ({}), got {:?}..{:?}",
                keys.len(),
                offsets.first(),
                offsets.last()
            )));
        }
        if let Some(r) = offsets.windows(2).position(|w| w[1] <= w[0]) {
            return Err(Error::shape(format!(
                "request {r} is empty (or offsets decrease): every request needs at least one key"
            )));
        }
        if let Some(&k) = keys.iter().find(|&&k| usize::from(table_of(k)) >= self.cfg.num_tables) {
            return Err(Error::unknown_name(format!(
                "id {} names table {}, but the cache has {} tables",
                id_of(k),
                table_of(k),
                self.cfg.num_tables
            )));
        }
        if out.len() != keys.len() * self.cfg.dim {
            return Err(Error::shape(format!(
                "output must hold {} x {} values, got {}",
                keys.len(),
                self.cfg.dim,
                out.len()
            )));
        }
        if let Some(s) = sources {
            if s.len() != keys.len() {
                return Err(Error::shape(format!(
                    "sources must hold {} entries, got {}",
                    keys.len(),
                    s.len()
                )));
            }
        }
        Ok(())
    }

    fn dedup(&self, keys: &[Key], offsets: &[usize], sc: &mut Scratch) {
        sc.offsets.reserve(offsets.len());
        sc.keys.reserve(keys.len());
        sc.pks.reserve(keys.len());
        sc.map.reserve(keys.len());
        sc.offsets.push(0);
        // By policy key (a u64 hashes faster than the u128 key); two keys of a request that
        // share one (different tables) are told apart by a scan of the request.
        let mut seen = hashbrown::HashMap::<u64, u32>::new();
        for w in offsets.windows(2) {
            seen.clear();
            let start = sc.keys.len();
            for &k in &keys[w[0]..w[1]] {
                let pk = policy_key(k);
                let fresh = |sc: &mut Scratch| {
                    sc.keys.push(k);
                    sc.pks.push(pk);
                    (sc.keys.len() - 1) as u32
                };
                let u = match seen.entry(pk) {
                    hashbrown::hash_map::Entry::Vacant(e) => *e.insert(fresh(sc)),
                    hashbrown::hash_map::Entry::Occupied(e) if sc.keys[*e.get() as usize] == k => {
                        *e.get()
                    }
                    hashbrown::hash_map::Entry::Occupied(_) => {
                        match sc.keys[start..].iter().position(|&x| x == k) {
                            Some(p) => (start + p) as u32,
                            None => fresh(sc),
                        }
                    }
                };
                sc.map.push(u);
            }
            sc.offsets.push(sc.keys.len());
        }
        let n = sc.keys.len();
        sc.src = vec![Source::Store; n];
        sc.shard = sc.pks.iter().map(|&pk| self.shard_of_pk(pk) as u32).collect();
        sc.vals = vec![0.0; n * self.cfg.dim];
        sc.approx_of = vec![Key::MAX; n];
    }

    /// P1: exact hits, against the state before the batch.
    fn probe(&self, sc: &mut Scratch) {
        let d = self.cfg.dim;
        for (si, shard) in self.shards.iter().enumerate() {
            let s = shard.read();
            for u in 0..sc.keys.len() {
                if sc.shard[u] as usize != si {
                    continue;
                }
                let v = &mut sc.vals[u * d..(u + 1) * d];
                for (ti, t) in s.tiers.iter().enumerate() {
                    if t.get_pk(sc.pks[u], table_of(sc.keys[u]), v) {
                        sc.src[u] = if ti == 0 { Source::L1 } else { Source::L2 };
                        break;
                    }
                }
            }
        }
    }

    /// P1 continued: surrogates for misses, at most `max_approx` per request.
    fn approximate(&self, sc: &mut Scratch) {
        if self.shards[0].read().l3.is_none() || self.cfg.max_approx_per_request == 0 {
            return;
        }
        let d = self.cfg.dim;
        for r in 0..sc.offsets.len() - 1 {
            let mut used = 0;
            for u in sc.offsets[r]..sc.offsets[r + 1] {
                if used == self.cfg.max_approx_per_request {
                    break;
                }
                if sc.src[u] != Source::Store {
                    continue;
                }
                let key = sc.keys[u];
                let (table, id) = (table_of(key), id_of(key));
                let entry = self.shards[sc.shard[u] as usize]
                    .read()
                    .l3
                    .as_ref()
                    .and_then(|l3| l3.peek_tagged(sc.pks[u]));
                // An entry of another table's key with the same policy key is not this key's.
                let Some((alt, dist)) = entry.and_then(|(t, a, d)| (t == table).then_some((a, d)))
                else {
                    continue;
                };
                if alt == id || dist > self.cfg.max_surrogate_dist {
                    continue;
                }
                let alt_key = key_of(table, alt);
                let s = self.shards[self.shard_of(alt_key)].read();
                let v = &mut sc.vals[u * d..(u + 1) * d];
                if s.tiers.iter().any(|t| t.get(alt_key, v)) {
                    sc.src[u] = Source::Surrogate;
                    sc.approx_of[u] = alt_key;
                    used += 1;
                }
            }
        }
    }

    /// P2: the batch's distinct full misses, one backing read per table. Returns key → row
    /// index into the rows written into `sc.vals` of the first request that missed it.
    fn fetch(
        &self,
        sc: &mut Scratch,
        stats: &mut CacheStats,
    ) -> Result<hashbrown::HashMap<Key, u32>> {
        let d = self.cfg.dim;
        let mut first = hashbrown::HashMap::<Key, u32>::new();
        let mut by_table: Vec<Vec<u64>> = vec![Vec::new(); self.cfg.num_tables];
        for u in 0..sc.keys.len() {
            if sc.src[u] == Source::Store && !first.contains_key(&sc.keys[u]) {
                first.insert(sc.keys[u], u as u32);
                by_table[usize::from(table_of(sc.keys[u]))].push(id_of(sc.keys[u]));
            }
        }
        let mut rows = Vec::new();
        for (t, ids) in by_table.iter().enumerate() {
            if ids.is_empty() {
                continue;
            }
            rows.resize(ids.len() * d, 0.0);
            self.read_backing(t, ids, &mut rows, stats)?;
            for (j, &id) in ids.iter().enumerate() {
                let u = first[&key_of(t as u16, id)] as usize;
                sc.vals[u * d..(u + 1) * d].copy_from_slice(&rows[j * d..(j + 1) * d]);
            }
        }
        for u in 0..sc.keys.len() {
            if sc.src[u] == Source::Store {
                let f = first[&sc.keys[u]] as usize;
                if f != u {
                    sc.vals.copy_within(f * d..(f + 1) * d, u * d);
                }
            }
        }
        Ok(first)
    }

    fn read_backing(
        &self,
        table: usize,
        ids: &[u64],
        out: &mut [f32],
        stats: &mut CacheStats,
    ) -> Result<()> {
        stats.backing_reads += 1;
        self.backing
            .read(table, ids, out)
            .map_err(|e| Error::backing(format!("backing store read of table {table} failed: {e}")))
    }

    /// P3: requests in order, shards in ascending order.
    fn commit(
        &self,
        sc: &Scratch,
        fetched: &hashbrown::HashMap<Key, u32>,
        stats: &mut CacheStats,
    ) -> Result<()> {
        // The policies' keys of L1's and L2's part of a request, and L1's as keys.
        let mut l1_keys = Vec::new();
        let mut l1_full = Vec::new();
        let mut l2_keys = Vec::new();
        for r in 0..sc.offsets.len() - 1 {
            let (lo, hi) = (sc.offsets[r], sc.offsets[r + 1]);
            let g = hi - lo;
            let h = sc.src[lo..hi].iter().filter(|&&s| s != Source::Store).count();
            for (si, shard) in self.shards.iter().enumerate() {
                if !(lo..hi).any(|u| sc.shard[u] as usize == si) {
                    continue;
                }
                let mut guard = shard.write();
                let s = &mut *guard;
                l1_keys.clear();
                l1_full.clear();
                l2_keys.clear();
                let mut l1_probe_hits = 0;
                let mut l2_probe_hits = 0;
                for u in lo..hi {
                    if sc.shard[u] as usize != si || sc.src[u] == Source::Surrogate {
                        continue;
                    }
                    let pk = sc.pks[u];
                    if s.tiers.len() > 1 && s.tiers[1].policy.contains(pk) {
                        l2_keys.push(pk);
                        l2_probe_hits += usize::from(sc.src[u] != Source::Store);
                    } else {
                        l1_keys.push(pk);
                        l1_full.push(sc.keys[u]);
                        l1_probe_hits += usize::from(sc.src[u] != Source::Store);
                    }
                }
                if !l2_keys.is_empty() {
                    let group = Group { other_hits: h - l2_probe_hits, size: g };
                    let Shard { tiers, out2, .. } = s;
                    tiers[1].policy.access_group_into(&l2_keys, group, out2);
                    // Hits only: nothing is admitted or evicted.
                }
                if !l1_keys.is_empty() {
                    // Keys this commit will admit that the batch did not fetch (an earlier
                    // request of the batch evicted them after they hit at probe): read them
                    // first, so a failed read changes nothing.
                    let extra = self.refetch(s, &l1_full, fetched, stats)?;
                    let group = Group { other_hits: h - l1_probe_hits, size: g };
                    {
                        let Shard { tiers, out, .. } = s;
                        tiers[0].policy.access_group_into(&l1_keys, group, out);
                    }
                    stats.bypasses += u64::from(s.out.bypassed);
                    self.settle_l1(s, &l1_keys, &l1_full, sc, fetched, &extra, stats);
                }
                // L3 reference bits of the surrogates used.
                if let Some(l3) = &mut s.l3 {
                    for u in lo..hi {
                        if sc.shard[u] as usize == si && sc.src[u] == Source::Surrogate {
                            l3.get(sc.pks[u]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// After an L1 commit of `keys` (policy keys; `full[j]` is `keys[j]`'s key): demote its
    /// victims, then write the rows of the keys it admitted (from this batch's fetch, or read
    /// again if an earlier request of the batch evicted a key that hit at probe). Victims are
    /// named by their slots' tags before any slot is written.
    #[allow(clippy::too_many_arguments)]
    fn settle_l1(
        &self,
        s: &mut Shard,
        keys: &[u64],
        full: &[Key],
        sc: &Scratch,
        fetched: &hashbrown::HashMap<Key, u32>,
        extra: &hashbrown::HashMap<Key, Vec<f32>>,
        stats: &mut CacheStats,
    ) {
        let d = self.cfg.dim;
        let evicted = std::mem::take(&mut s.out.evicted);
        let slots = std::mem::take(&mut s.out.evicted_slots);
        stats.l1_evictions += evicted.len() as u64;
        // Keys of this call that hit, were evicted by the commit and admitted again (policies
        // that do not pin a request: a miss evicted the key before its own turn): their coded
        // row, still in the old slot, moves to the new one below; they are not demoted.
        let mut moved: Vec<(u64, Key, Vec<u8>)> = Vec::new();
        for (&pk, &slot) in evicted.iter().zip(&slots) {
            let k = s.tiers[0].key_in(slot, pk);
            // A request has a few dozen keys: a scan beats building a set per request.
            if let Some(j) = keys.iter().position(|&a| a == pk) {
                // A miss admitted and evicted within this call never had its row written.
                if !s.out.hit[j] {
                    continue;
                }
                if s.tiers[0].policy.contains(pk) {
                    moved.push((pk, k, s.tiers[0].row(slot).to_vec()));
                    continue;
                }
            }
            if !self.cfg.demote || s.tiers.len() < 2 {
                self.feed_l3(s, k, stats);
                continue;
            }
            let Shard { tiers, out2, tmp, .. } = s;
            tiers[0].codec.decode(tiers[0].row(slot), tmp);
            tiers[1].policy.admit(pk, 0, out2);
            let dropped: Vec<Key> = out2
                .evicted
                .iter()
                .zip(&out2.evicted_slots)
                .map(|(&p, &sl)| tiers[1].key_in(sl, p))
                .collect();
            if let Some(slot2) = tiers[1].policy.slot_of(pk) {
                tiers[1].write(slot2, k, tmp);
                stats.demotions += 1;
            }
            for k2 in dropped {
                self.feed_l3(s, k2, stats);
            }
        }
        for (pk, k, row) in &moved {
            if let Some(slot) = s.tiers[0].policy.slot_of(*pk) {
                s.tiers[0].write_coded(slot, *k, row);
            }
        }
        for (j, &pk) in keys.iter().enumerate() {
            if s.out.hit[j] {
                continue;
            }
            let Some(slot) = s.tiers[0].policy.slot_of(pk) else { continue };
            let k = full[j];
            let row = match fetched.get(&k) {
                Some(&f) => &sc.vals[f as usize * d..(f as usize + 1) * d],
                None => &extra[&k][..],
            };
            s.tiers[0].write(slot, k, row);
        }
        s.out.evicted = evicted;
        s.out.evicted_slots = slots;
    }

    /// Rows of `keys` that are not in L1 now and were not fetched by the batch.
    fn refetch(
        &self,
        s: &Shard,
        keys: &[Key],
        fetched: &hashbrown::HashMap<Key, u32>,
        stats: &mut CacheStats,
    ) -> Result<hashbrown::HashMap<Key, Vec<f32>>> {
        let mut extra = hashbrown::HashMap::new();
        for &k in keys {
            if !fetched.contains_key(&k) && !s.tiers[0].policy.contains(policy_key(k)) {
                let mut row = vec![0.0; self.cfg.dim];
                self.read_backing(usize::from(table_of(k)), &[id_of(k)], &mut row, stats)?;
                stats.refetches += 1;
                extra.insert(k, row);
            }
        }
        Ok(extra)
    }

    fn feed_l3(&self, s: &mut Shard, key: Key, stats: &mut CacheStats) {
        stats.drops += 1;
        let Some(l3) = &mut s.l3 else { return };
        let (t, id) = (table_of(key), id_of(key));
        let found = match &self.surrogates[usize::from(t)] {
            None => None,
            Some(SurrogateTable::Memory(m)) => m.get(id),
            Some(SurrogateTable::Disk(f)) => match &self.filler {
                Some(filler) => {
                    stats.l3_queue_drops += u64::from(!filler.push(key));
                    None
                }
                None => {
                    stats.l3_reads += 1;
                    f.get(id).unwrap_or_else(|_| {
                        stats.l3_read_errors += 1;
                        None
                    })
                }
            },
        };
        if let Some((alt, dist)) = found {
            l3.insert_tagged(policy_key(key), t, alt, dist);
            stats.l3_inserts += 1;
        }
    }
}

/// An [`InferenceCache`] seen as a [`Policy`], so [`crate::evaluate_with`] scores the whole
/// system (L1 + L2 + L3, rows and all) with the same evaluator as a bare policy. Each
/// request is one [`InferenceCache::lookup`]; surrogate-served keys count as
/// `approximated`. A backing-store error ends the hit flags as misses and is kept in
/// [`CachePolicy::error`].
#[derive(Debug)]
pub struct CachePolicy<'a> {
    cache: &'a InferenceCache,
    rows: Vec<f32>,
    sources: Vec<Source>,
    offsets: [usize; 2],
    /// The first lookup error, if any.
    pub error: Option<Error>,
}

impl<'a> CachePolicy<'a> {
    /// Wraps `cache`.
    pub fn new(cache: &'a InferenceCache) -> Self {
        Self { cache, rows: Vec::new(), sources: Vec::new(), offsets: [0, 0], error: None }
    }
}

impl Policy for CachePolicy<'_> {
    fn name(&self) -> &'static str {
        "inference-cache"
    }
    fn capacity(&self) -> usize {
        self.cache.capacity()
    }
    fn len(&self) -> usize {
        self.cache.memory().tiers.iter().map(|t| t.len).sum()
    }
    fn contains(&self, key: u64) -> bool {
        let (t, id) = split_key(key);
        let key = key_of(t, id);
        let s = self.cache.shards[self.cache.shard_of(key)].read();
        s.tiers.iter().any(|t| t.slot_of(key).is_some())
    }
    fn access_into(&mut self, keys: &[u64], out: &mut RequestOutcome) {
        out.reset(keys.len());
        if keys.is_empty() {
            return;
        }
        self.rows.resize(keys.len() * self.cache.cfg.dim, 0.0);
        self.sources.resize(keys.len(), Source::Store);
        self.offsets[1] = keys.len();
        let before = self.cache.stats.lock().bypasses;
        let result =
            self.cache.lookup(keys, &self.offsets, &mut self.rows, Some(&mut self.sources));
        // Deterministic figures: what the L3 filler reads is in L3 before the next request.
        self.cache.sync_l3();
        match result {
            Ok(()) => {
                for &s in &self.sources {
                    out.hit.push(matches!(s, Source::L1 | Source::L2));
                    out.approximated += usize::from(s == Source::Surrogate);
                }
                out.hits = out.hit.iter().filter(|&&h| h).count();
                out.bypassed = self.cache.stats.lock().bypasses > before;
            }
            Err(e) => {
                out.hit.resize(keys.len(), false);
                self.error.get_or_insert(e);
            }
        }
    }
    fn metadata_bytes(&self) -> usize {
        let m = self.cache.memory();
        m.tiers.iter().map(|t| t.metadata_bytes).sum::<usize>()
            + m.l3_bytes
            + m.surrogate_table_bytes
            + m.l3_queue_bytes
    }
}

impl InferenceCache {
    /// Checks invariants: L1 ∩ L2 = ∅, every tier within its capacity, total bytes within
    /// the budget. O(C) with `keys` (trace keys, `table << 48 | id`) the keys to check
    /// exclusivity for; for tests.
    pub fn check_invariants(&self, keys: &[u64]) -> std::result::Result<(), String> {
        let pks: Vec<u64> = keys
            .iter()
            .map(|&k| {
                let (t, id) = split_key(k);
                policy_key(key_of(t, id))
            })
            .collect();
        let m = self.memory();
        if m.total_bytes > m.budget_bytes {
            return Err(format!(
                "{} bytes counted over a budget of {}",
                m.total_bytes, m.budget_bytes
            ));
        }
        for s in &self.shards {
            let s = s.read();
            for t in &s.tiers {
                if t.policy.len() > t.policy.capacity() {
                    return Err(format!(
                        "tier over capacity: {} > {}",
                        t.policy.len(),
                        t.policy.capacity()
                    ));
                }
            }
            if s.tiers.len() == 2 {
                if let Some(j) = pks
                    .iter()
                    .position(|&k| s.tiers[0].policy.contains(k) && s.tiers[1].policy.contains(k))
                {
                    return Err(format!("key {:#x} is in L1 and L2", keys[j]));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{table_key, SplitMix64, Synthetic, Trace};
    use crate::{
        evaluate, evaluate_with, ErrorKind, EvalOptions, GroupLfuConfig, Mode, PolicyConfig,
    };
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Row of (table, id): a deterministic function, so every returned row can be checked.
    fn row_of(t: usize, id: u64, d: usize) -> Vec<f32> {
        let mut r = SplitMix64::new((t as u64) << 40 ^ id);
        (0..d).map(|_| (r.next_f64() as f32 - 0.5) * 0.2).collect()
    }

    #[derive(Default)]
    struct Mem {
        dim: usize,
        reads: AtomicU64,
        fail: AtomicBool,
    }

    impl Backing for Mem {
        fn read(&self, t: usize, ids: &[u64], out: &mut [f32]) -> std::result::Result<(), String> {
            if self.fail.load(Ordering::Relaxed) {
                return Err("disk on fire".into());
            }
            self.reads.fetch_add(ids.len() as u64, Ordering::Relaxed);
            for (j, &id) in ids.iter().enumerate() {
                out[j * self.dim..(j + 1) * self.dim].copy_from_slice(&row_of(t, id, self.dim));
            }
            Ok(())
        }
    }

    fn mem(dim: usize) -> Arc<Mem> {
        Arc::new(Mem { dim, ..Default::default() })
    }

    fn one(keys: &[u64]) -> [usize; 2] {
        [0, keys.len()]
    }

    /// `trace` with each key replaced by the u64 the cache's policies know it by.
    fn as_policy_keys(trace: &Trace) -> Trace {
        let keys: Vec<u64> = trace
            .keys()
            .iter()
            .map(|&k| {
                let (t, id) = split_key(k);
                policy_key(key_of(t, id))
            })
            .collect();
        Trace::from_ragged(&keys, trace.offsets()).unwrap()
    }

    /// Every returned row is what its source promises.
    fn check_rows(c: &InferenceCache, keys: &[u64], rows: &[f32], src: &[Source]) {
        let d = c.cfg.dim;
        for (j, (&k, &s)) in keys.iter().zip(src).enumerate() {
            let (t, id) = split_key(k);
            let exact = row_of(usize::from(t), id, d);
            let got = &rows[j * d..(j + 1) * d];
            let tier = match s {
                Source::Store => {
                    assert_eq!(got, &exact[..], "a store row is exact");
                    continue;
                }
                Source::Surrogate => continue,
                Source::L1 => 0,
                Source::L2 => 1,
            };
            let codec = c.cfg.tiers[tier].codec.codec();
            let mut code = vec![0u8; codec.bytes_per_row(d)];
            codec.encode(&exact, &mut code);
            let mut want = vec![0f32; d];
            codec.decode(&code, &mut want);
            assert_eq!(got, &want[..], "a tier-{tier} hit is decode(encode(row)) of its codec");
        }
    }

    /// The row-holding policies, as the tests below build caches with them (S = `t` tables).
    fn slot_policies(t: u8) -> Vec<PolicyConfig> {
        vec![
            PolicyConfig::GroupLfu(GroupLfuConfig { max_score: t, ..Default::default() }),
            PolicyConfig::GroupAssoc(crate::GroupAssocConfig {
                max_score: t,
                ..Default::default()
            }),
            // Per-key policies do not pin a request: a miss may evict a key of the same
            // request that hit, and a later key of it admit that key again (a new slot).
            PolicyConfig::Lru,
            PolicyConfig::Lfu(Default::default()),
        ]
    }

    #[test]
    fn rows_are_exact_or_their_codecs_and_tiers_stay_exclusive() {
        for policy in slot_policies(5) {
            rows_exact_and_exclusive(policy);
        }
    }

    fn rows_exact_and_exclusive(policy: PolicyConfig) {
        let seed = 0x5eed_cace;
        println!("seed {seed:#x}, {}", policy.name());
        let d = 8;
        let trace = Synthetic {
            num_requests: 3_000,
            num_tables: 5,
            num_contexts: 400,
            max_table_size: 2_000,
            seed,
            ..Default::default()
        }
        .generate()
        .unwrap();
        let mut cfg = CacheConfig::new(5, d, 40_000);
        cfg.policy = policy;
        cfg.tiers = vec![
            TierConfig { codec: CodecKind::F32, share: 0.5 },
            TierConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let mut seen = Vec::new();
        let mut l2_hits = 0;
        for r in trace.iter() {
            let mut rows = vec![0.0; r.len() * d];
            let mut src = vec![Source::Store; r.len()];
            c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
            check_rows(&c, r, &rows, &src);
            l2_hits += src.iter().filter(|&&s| s == Source::L2).count();
            seen.extend_from_slice(r);
        }
        seen.sort_unstable();
        seen.dedup();
        c.check_invariants(&seen).unwrap();
        let s = c.stats();
        assert_eq!(s.requests, 3_000);
        assert!(l2_hits > 0 && s.demotions > 0, "L2 is used: {s:?}");
        let m = c.memory();
        assert!(m.total_bytes <= 40_000 && m.total_bytes > 30_000, "{m:?}");
        assert!(m.metadata_bytes_per_entry <= 48.0, "{m:?}");
    }

    #[test]
    fn one_f32_tier_scores_like_the_bare_policy() {
        // The cache with one f32 tier and one shard is GroupLfu plus rows: the evaluator must
        // give the same perfect hits for both, the bare policy seeing the keys the cache's
        // policy sees (GroupAssoc's sets are a hash of them).
        let trace = Synthetic {
            num_requests: 4_000,
            num_tables: 6,
            num_contexts: 500,
            max_table_size: 3_000,
            seed: 7,
            ..Default::default()
        }
        .generate()
        .unwrap();
        let d = 4;
        for policy in slot_policies(6) {
            let mut cfg = CacheConfig::new(6, d, 30_000);
            cfg.policy = policy.clone();
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let cap = c.capacity();
            let mut p = CachePolicy::new(&c);
            let sys = evaluate_with(&trace, &mut p, Mode::Prefix, &EvalOptions::default()).unwrap();
            assert!(p.error.is_none());
            let bare = evaluate(&as_policy_keys(&trace), &policy, cap, Mode::Prefix).unwrap();
            assert_eq!((sys.perfect, sys.hits), (bare.perfect, bare.hits), "{}", policy.name());
            assert!(sys.perfect > 0);
        }
    }

    #[test]
    fn bad_input_is_a_typed_error_and_changes_nothing() {
        let d = 4;
        let m = mem(d);
        let c = InferenceCache::new(CacheConfig::new(2, d, 10_000), m.clone(), vec![]).unwrap();
        let k = |t, id| table_key(t, id).unwrap();
        let mut out = vec![0.0; 2 * d];
        let cases: Vec<(Vec<u64>, Vec<usize>, usize, ErrorKind)> = vec![
            (vec![k(0, 1), k(1, 1)], vec![0, 0, 2], 2, ErrorKind::ShapeMismatch), // empty request
            (vec![k(0, 1), k(5, 1)], vec![0, 2], 2, ErrorKind::UnknownName),      // unknown table
            (vec![k(0, 1), k(1, 1)], vec![0, 1], 2, ErrorKind::ShapeMismatch),    // offsets short
            (vec![k(0, 1), k(1, 1)], vec![0, 2], 1, ErrorKind::ShapeMismatch),    // output short
        ];
        for (keys, offs, rows, kind) in cases {
            let e = c.lookup(&keys, &offs, &mut out[..rows * d], None).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
        }
        assert_eq!(c.stats(), CacheStats::default());
        m.fail.store(true, Ordering::Relaxed);
        let keys = [k(0, 1), k(1, 1)];
        let e = c.lookup(&keys, &one(&keys), &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backing);
        assert!(e.to_string().contains("disk on fire"), "{e}");
        assert_eq!(c.memory().tiers[0].len, 0, "a failed read caches nothing");
        m.fail.store(false, Ordering::Relaxed);
        c.lookup(&keys, &one(&keys), &mut out, None).unwrap();
        assert_eq!(&out[..d], &row_of(0, 1, d)[..]);
        // Budgets and configurations.
        let small = InferenceCache::new(CacheConfig::new(26, 64, 2_000), mem(64), vec![]);
        assert_eq!(small.unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut arc = CacheConfig::new(2, 4, 10_000);
        arc.policy = PolicyConfig::EvArc(Default::default());
        assert_eq!(
            InferenceCache::new(arc, mem(4), vec![]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn a_request_larger_than_the_cache_is_served_uncached_and_counted() {
        for policy in slot_policies(2) {
            larger_than_the_cache(policy);
        }
    }

    fn larger_than_the_cache(policy: PolicyConfig) {
        let d = 2;
        let mut cfg = CacheConfig::new(2, d, 4_000);
        cfg.policy = policy;
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let cap = c.capacity();
        let keys: Vec<u64> =
            (0..cap as u64 + 10).map(|i| table_key((i % 2) as u16, i).unwrap()).collect();
        let mut rows = vec![0.0; keys.len() * d];
        let mut src = vec![Source::L1; keys.len()];
        c.lookup(&keys, &one(&keys), &mut rows, Some(&mut src)).unwrap();
        check_rows(&c, &keys, &rows, &src);
        assert_eq!(c.stats().bypasses, 1);
        c.check_invariants(&keys).unwrap();
    }

    #[test]
    fn batches_and_duplicates_serve_every_position() {
        for policy in slot_policies(2) {
            batches_and_duplicates(policy);
        }
    }

    fn batches_and_duplicates(policy: PolicyConfig) {
        let d = 3;
        let m = mem(d);
        let mut cfg = CacheConfig::new(2, d, 8_000);
        cfg.policy = policy;
        let c = InferenceCache::new(cfg, m.clone(), vec![]).unwrap();
        let k = |t, id| table_key(t, id).unwrap();
        // Three requests; the first repeats a key, the second and third share keys.
        let keys = [k(0, 1), k(0, 1), k(1, 2), k(0, 3), k(1, 4), k(0, 3), k(1, 4)];
        let offs = [0, 3, 5, 7];
        let mut rows = vec![0.0; keys.len() * d];
        let mut src = vec![Source::L1; keys.len()];
        c.lookup(&keys, &offs, &mut rows, Some(&mut src)).unwrap();
        check_rows(&c, &keys, &rows, &src);
        // Requests of a batch are concurrent: all missed, each distinct key read once.
        assert!(src.iter().all(|&s| s == Source::Store));
        assert_eq!(m.reads.load(Ordering::Relaxed), 4);
        let s = c.stats();
        assert_eq!((s.requests, s.keys, s.misses), (3, 6, 6));
        c.lookup(&keys, &offs, &mut rows, Some(&mut src)).unwrap();
        assert!(src.iter().all(|&s| s == Source::L1));
        assert_eq!(c.stats().perfect, 3);
    }

    #[test]
    fn shards_serve_correct_rows_from_many_threads() {
        for policy in slot_policies(4) {
            shards_from_threads(policy);
        }
    }

    fn shards_from_threads(policy: PolicyConfig) {
        let d = 4;
        let mut cfg = CacheConfig::new(4, d, 200_000);
        cfg.policy = policy;
        cfg.shards = 4;
        cfg.tiers = vec![
            TierConfig { codec: CodecKind::F32, share: 0.4 },
            TierConfig { codec: CodecKind::F16, share: 0.6 },
        ];
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let trace = Synthetic {
            num_requests: 4_000,
            num_tables: 4,
            num_contexts: 300,
            max_table_size: 5_000,
            seed: 11,
            ..Default::default()
        }
        .generate()
        .unwrap();
        std::thread::scope(|s| {
            for part in 0..4 {
                let (c, trace) = (&c, &trace);
                s.spawn(move || {
                    for (i, r) in trace.iter().enumerate() {
                        if i % 4 != part {
                            continue;
                        }
                        let mut rows = vec![0.0; r.len() * d];
                        let mut src = vec![Source::Store; r.len()];
                        c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                        check_rows(c, r, &rows, &src);
                    }
                });
            }
        });
        assert_eq!(c.stats().requests, 4_000);
        assert!(c.stats().perfect > 0);
        c.check_invariants(trace.keys()).unwrap();
    }

    /// Surrogates over row_of rows of every table, nearest neighbour within a loose bound.
    fn surrogates(tables: usize, rows: u64, d: usize) -> Vec<Option<SurrogateTable>> {
        let cfg = crate::surrogate::SurrogateConfig {
            max_dist: 1.5,
            popularity: false,
            ..Default::default()
        };
        (0..tables)
            .map(|t| {
                let ids: Vec<u64> = (0..rows).collect();
                let flat: Vec<f32> = ids.iter().flat_map(|&i| row_of(t, i, d)).collect();
                Some(crate::surrogate::build(&ids, &flat, d, None, &cfg, 1).unwrap().into())
            })
            .collect()
    }

    /// The synthetic trace of the surrogate tests: 4 tables of up to 400 ids, 300 contexts.
    fn four_tables(seed: u64, num_requests: usize) -> Trace {
        Synthetic {
            num_requests,
            num_tables: 4,
            num_contexts: 300,
            max_table_size: 400,
            seed,
            ..Default::default()
        }
        .generate()
        .unwrap()
    }

    #[test]
    fn surrogates_are_resident_capped_and_change_nothing() {
        for policy in slot_policies(4) {
            surrogates_resident_capped(policy);
        }
    }

    fn surrogates_resident_capped(policy: PolicyConfig) {
        let seed = 0xa1_7e;
        println!("seed {seed:#x}, {}", policy.name());
        let (t, d) = (4, 6);
        let trace = four_tables(seed, 3_000);
        let sur = surrogates(t, 400, d);
        // The surrogate builds in memory are counted: 18 B a row of every table.
        let builds = 4 * 400 * 18;
        let mut cfg = CacheConfig::new(t, d, 12_000 + builds);
        cfg.policy = policy;
        cfg.tiers = vec![
            TierConfig { codec: CodecKind::F32, share: 0.5 },
            TierConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        cfg.surrogate_share = 0.1;
        cfg.max_approx_per_request = 1;
        let with = InferenceCache::new(cfg.clone(), mem(d), sur.clone()).unwrap();
        assert_eq!(with.memory().surrogate_table_bytes, builds);
        let mut tight = cfg.clone();
        tight.memory_budget_bytes = builds;
        let e = InferenceCache::new(tight, mem(d), sur.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("open the builds from disk"), "{e}");
        // A build of another dim, in any table (here the second), is a ShapeMismatch.
        let mut odd = sur.clone();
        odd[1] = surrogates(1, 50, d + 1).pop().unwrap();
        let e = InferenceCache::new(cfg.clone(), mem(d), odd).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        assert!(e.message().contains("table 1 were built from rows of dim 7"), "{e}");
        let mut zero = cfg.clone();
        zero.max_approx_per_request = 0;
        let capped_off = InferenceCache::new(zero, mem(d), sur.clone()).unwrap();
        let mut plain = cfg.clone();
        plain.memory_budget_bytes = 10_800; // the budget less builds and L3's 10 %: same tiers
        let without = InferenceCache::new(plain, mem(d), vec![]).unwrap();
        let mut approx = 0;
        for r in trace.iter() {
            let run = |c: &InferenceCache| {
                let mut rows = vec![0.0; r.len() * d];
                let mut src = vec![Source::Store; r.len()];
                c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                (rows, src)
            };
            // Which surrogates are resident before the request (probe-time residency), with
            // their rows then: a commit may evict a surrogate (it is not a key of the request,
            // so nothing pins it), but the row served is the one read at probe time.
            let resident: Vec<Option<(Key, Option<Vec<f32>>)>> = r
                .iter()
                .map(|&k| {
                    let (t, id) = split_key(k);
                    let k = key_of(t, id);
                    let s = with.shards[with.shard_of(k)].read();
                    let alt = s.l3.as_ref().and_then(|l3| l3.peek(policy_key(k)))?.0;
                    let alt = key_of(t, alt);
                    let sh = with.shards[with.shard_of(alt)].read();
                    let mut v = vec![0.0; d];
                    Some((alt, sh.tiers.iter().any(|tier| tier.get(alt, &mut v)).then_some(v)))
                })
                .collect();
            let (rows, src) = run(&with);
            check_rows(&with, r, &rows, &src);
            let n = src.iter().filter(|&&s| s == Source::Surrogate).count();
            assert!(n <= 1, "at most max_approx surrogates per request");
            approx += n;
            for (j, &s) in src.iter().enumerate() {
                if s == Source::Surrogate {
                    let (alt, row) = resident[j].clone().expect("a surrogate comes from L3");
                    let (t, id) = split_key(r[j]);
                    let k = key_of(t, id);
                    assert_ne!(alt, k);
                    let want = row.expect("the surrogate was resident at probe time");
                    assert_eq!(&rows[j * d..(j + 1) * d], &want[..], "the surrogate's own row");
                    let sh = with.shards[with.shard_of(k)].read();
                    assert!(!sh.tiers.iter().any(|tier| tier.slot_of(k).is_some()), "not inserted");
                }
            }
            // max_approx = 0 is L1 + L2 alone, bit for bit (same tier sizes: L3's share of
            // the budget is taken in both, so compare against capped_off, not `without`).
            let (a, sa) = run(&capped_off);
            assert!(sa.iter().all(|&s| s != Source::Surrogate));
            let (b, sb) = run(&without);
            assert_eq!((a, sa), (b, sb));
        }
        assert_eq!(capped_off.capacity(), without.capacity());
        assert!(approx > 0, "some surrogates served");
        let s = with.stats();
        assert_eq!(s.approximated as usize, approx);
        assert!(s.served_perfect >= s.perfect);
        let m = with.memory();
        assert!(m.l3_len <= m.l3_capacity && m.total_bytes <= cfg.memory_budget_bytes, "{m:?}");
    }

    /// Surrogate builds on disk serve exactly what the same builds in memory serve, read
    /// inline or by the filler thread (synced after every request), at the same tier and L3
    /// sizes; the bytes in memory drop from 18 a row to the fences.
    #[test]
    fn surrogates_on_disk_serve_what_the_build_in_memory_serves() {
        let seed = 0xd15c;
        println!("seed {seed:#x}");
        let (t, d) = (4, 6);
        let trace = four_tables(seed, 2_000);
        let dir = tempfile::tempdir().unwrap();
        let in_memory = surrogates(t, 400, d);
        let on_disk: Vec<Option<SurrogateTable>> = in_memory
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let Some(SurrogateTable::Memory(m)) = s else { unreachable!() };
                let path = dir.path().join(format!("t{i}.surr"));
                m.save(&path).unwrap();
                Some(SurrogateFile::open(&path).unwrap().into())
            })
            .collect();
        let base = 12_000;
        let mut cfg = CacheConfig::new(t, d, base + surrogate_table_bytes(&in_memory));
        cfg.tiers = vec![
            TierConfig { codec: CodecKind::F32, share: 0.5 },
            TierConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        cfg.surrogate_share = 0.1;
        let reference = InferenceCache::new(cfg.clone(), mem(d), in_memory).unwrap();
        let disk_bytes = surrogate_table_bytes(&on_disk);
        assert!(disk_bytes < 4 * 1_000, "fences, not rows: {disk_bytes} B");
        cfg.memory_budget_bytes = base + disk_bytes;
        cfg.l3_fill = L3Fill::Inline;
        let inline = InferenceCache::new(cfg.clone(), mem(d), on_disk.clone()).unwrap();
        cfg.l3_fill = L3Fill::Background;
        // The filler's 10 keys: a 16 B key pending, a 32 B (key, alt, dist) ready.
        cfg.memory_budget_bytes = base + disk_bytes + 10 * 48;
        let background = InferenceCache::new(cfg.clone(), mem(d), on_disk).unwrap();
        assert_eq!(background.memory().l3_queue_bytes, 10 * 48);
        for c in [&inline, &background] {
            let (a, b) = (reference.memory(), c.memory());
            assert_eq!((&a.tiers, a.l3_capacity), (&b.tiers, b.l3_capacity));
            assert!(b.total_bytes <= b.budget_bytes, "{b:?}");
        }
        for r in trace.iter() {
            let run = |c: &InferenceCache| {
                let mut rows = vec![0.0; r.len() * d];
                let mut src = vec![Source::Store; r.len()];
                c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                (rows, src)
            };
            let want = run(&reference);
            assert_eq!(run(&inline), want);
            assert_eq!(run(&background), want);
            background.sync_l3();
        }
        let (a, b, c) = (reference.stats(), inline.stats(), background.stats());
        assert!(a.approximated > 0 && a.l3_inserts > 0, "{a:?}");
        assert_eq!((a.approximated, a.l3_inserts), (b.approximated, b.l3_inserts));
        assert_eq!((a.approximated, a.l3_inserts), (c.approximated, c.l3_inserts));
        assert_eq!(a.l3_reads, 0);
        assert!(b.l3_reads > 0 && c.l3_reads > 0 && c.l3_reads <= b.l3_reads, "{b:?} {c:?}");
        assert_eq!(b.l3_read_errors + c.l3_read_errors + c.l3_queue_drops, 0);
    }

    /// A surrogate file damaged after it was opened: the read errors are counted and those keys
    /// get no L3 entry, and every request is still served with its exact rows.
    #[test]
    fn a_damaged_surrogate_file_is_counted_and_serving_goes_on() {
        let (t, d) = (2, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.surr");
        let ids: Vec<u64> = (0..300).collect();
        let flat: Vec<f32> = ids.iter().flat_map(|&i| row_of(0, i, d)).collect();
        let sc = crate::surrogate::SurrogateConfig { max_dist: 2.0, ..Default::default() };
        crate::surrogate::build(&ids, &flat, d, None, &sc, 1).unwrap().save(&path).unwrap();
        // Flip a byte of the first data block: open checks only the header and the fences.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[crate::surrogate::BLOCK + 10] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        for fill in [L3Fill::Inline, L3Fill::Background] {
            let mut cfg = CacheConfig::new(t, d, 4_000);
            cfg.l3_fill = fill;
            let sur = vec![Some(SurrogateFile::open(&path).unwrap().into()), None];
            let c = InferenceCache::new(cfg, mem(d), sur).unwrap();
            for i in 0..300u64 {
                let r = [table_key(0, i).unwrap(), table_key(1, i).unwrap()];
                let mut rows = vec![0.0; 2 * d];
                c.lookup(&r, &one(&r), &mut rows, None).unwrap();
                assert_eq!(&rows[..d], &row_of(0, i, d)[..]);
                c.sync_l3();
            }
            let s = c.stats();
            assert!(s.l3_read_errors > 0, "{fill:?}: {s:?}");
            assert!(s.drops > 0);
        }
    }

    /// What `src` promises for row `id` of table `t`: exact from the store or an f32 tier, the
    /// codec's `decode(encode(row))` from the others.
    fn promised(c: &InferenceCache, t: u16, id: u64, src: Source) -> Vec<f32> {
        let d = c.cfg.dim;
        let exact = row_of(usize::from(t), id, d);
        let tier = match src {
            Source::L1 => 0,
            Source::L2 => 1,
            Source::Store | Source::Surrogate => return exact,
        };
        let codec = c.cfg.tiers[tier].codec.codec();
        let mut code = vec![0u8; codec.bytes_per_row(d)];
        codec.encode(&exact, &mut code);
        let mut want = vec![0f32; d];
        codec.decode(&code, &mut want);
        want
    }

    /// Raw 64-bit ids, as int64 users (TorchRec, HugeCTR: hashed, negative) and uint64 users
    /// have them: -1 (= 2^64 - 1 as uint64), -2, -2^63, 2^63 - 1, 2^48, a hashed id are cached and
    /// served exactly, and the same raw id in two tables is two keys with two rows. (Before,
    /// the cache's keys were `table << 48 | id`: no id at or past 2^48 could be given.)
    #[test]
    fn any_64_bit_id_is_cached_and_served_exactly_in_each_table() {
        let d = 4;
        let ids: [u64; 7] =
            [-1i64 as u64, -2i64 as u64, i64::MIN as u64, i64::MAX as u64, 1 << 48, fmix64(42), 0];
        for policy in slot_policies(2) {
            for two_tiers in [false, true] {
                let mut cfg = CacheConfig::new(2, d, 100_000);
                cfg.policy = policy.clone();
                if two_tiers {
                    cfg.tiers = vec![
                        TierConfig { codec: CodecKind::F32, share: 0.5 },
                        TierConfig { codec: CodecKind::Int8, share: 0.5 },
                    ];
                }
                let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
                for round in 0..2 {
                    for &id in &ids {
                        let (tables, both) = ([0u16, 1], [id, id]);
                        let mut rows = vec![0.0; 2 * d];
                        let mut src = [Source::Store; 2];
                        c.lookup_ids(&tables, &both, &[0, 2], &mut rows, Some(&mut src)).unwrap();
                        let want = if round == 0 { Source::Store } else { Source::L1 };
                        let ctx = format!("{}, two tiers {two_tiers}, id {id:#x}", policy.name());
                        assert_eq!(src, [want; 2], "{ctx}");
                        assert_eq!(&rows[..d], &row_of(0, id, d)[..], "{ctx}");
                        assert_eq!(&rows[d..], &row_of(1, id, d)[..], "{ctx}");
                    }
                }
                assert_eq!(c.stats().perfect, ids.len() as u64, "{}", policy.name());
            }
        }
    }

    /// Random wide ids through evictions, demotions and drops (a budget of a few dozen entries,
    /// two tiers, three tables; seed printed): every row is exactly what its source promises.
    #[test]
    fn wide_ids_through_eviction_and_demotion_keep_their_rows() {
        let seed = 0x64_b175;
        println!("seed {seed:#x}");
        let (t, d) = (3usize, 4);
        let mut rng = SplitMix64::new(seed);
        let pool: Vec<u64> = (0..1_000).map(|_| rng.next_u64()).collect();
        for policy in slot_policies(t as u8) {
            let mut cfg = CacheConfig::new(t, d, 12_000);
            cfg.policy = policy.clone();
            cfg.tiers = vec![
                TierConfig { codec: CodecKind::F32, share: 0.5 },
                TierConfig { codec: CodecKind::Int8, share: 0.5 },
            ];
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let mut seen = [0u64; 4];
            for _ in 0..400 {
                let batch = 1 + rng.below(3) as usize;
                let tables: Vec<u16> = (0..batch * t).map(|j| (j % t) as u16).collect();
                // A small pool per table, skewed: hits, misses, evictions and demotions.
                let ids: Vec<u64> = (0..batch * t)
                    .map(|_| {
                        let top = rng.below(pool.len() as u64) + 1;
                        pool[rng.below(top) as usize]
                    })
                    .collect();
                let offsets: Vec<usize> = (0..=batch).map(|r| r * t).collect();
                let mut rows = vec![0.0; ids.len() * d];
                let mut src = vec![Source::Store; ids.len()];
                c.lookup_ids(&tables, &ids, &offsets, &mut rows, Some(&mut src)).unwrap();
                for j in 0..ids.len() {
                    seen[src[j] as usize] += 1;
                    let want = promised(&c, tables[j], ids[j], src[j]);
                    assert_eq!(&rows[j * d..(j + 1) * d], &want[..], "{} {j}", policy.name());
                }
            }
            let s = c.stats();
            assert!(seen[0] > 0 && seen[1] > 0 && seen[3] > 0, "{}: {seen:?}", policy.name());
            assert!(s.l1_evictions > 0 && s.demotions > 0 && s.drops > 0, "{s:?}");
        }
    }

    /// Two keys of different tables whose ids differ by exactly their tables' constants share
    /// one policy key: each is still served only its own row (a probe checks the slot's table),
    /// in separate requests and in one, while one holds the entry and after.
    #[test]
    fn keys_sharing_a_policy_key_are_never_served_each_others_row() {
        let d = 4;
        let a = 0x1234_5678_9abc_def0u64;
        let b = a ^ table_salt(0) ^ table_salt(1);
        assert_eq!(policy_key(key_of(0, a)), policy_key(key_of(1, b)));
        for policy in slot_policies(2) {
            let mut cfg = CacheConfig::new(2, d, 100_000);
            cfg.policy = policy.clone();
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let requests: [[u64; 2]; 5] = [[a, 7], [5, b], [a, b], [a, 7], [5, b]];
            let mut sources = Vec::new();
            for ids in requests {
                let mut rows = vec![0.0; 2 * d];
                let mut src = [Source::Store; 2];
                c.lookup_ids(&[0, 1], &ids, &[0, 2], &mut rows, Some(&mut src)).unwrap();
                assert_eq!(&rows[..d], &row_of(0, ids[0], d)[..], "{}", policy.name());
                assert_eq!(&rows[d..], &row_of(1, ids[1], d)[..], "{}", policy.name());
                sources.push(src);
            }
            // (0, a) was cached first and keeps the entry; (1, b) is served from the store.
            assert_eq!(sources[2], [Source::L1, Source::Store], "{}", policy.name());
            assert_eq!(sources[3], [Source::L1, Source::L1], "{}", policy.name());
            assert_eq!(sources[4][1], Source::Store, "{}", policy.name());
        }
    }

    #[test]
    fn lookup_ids_refuses_tables_and_ids_of_different_lengths() {
        let d = 4;
        let c = InferenceCache::new(CacheConfig::new(2, d, 10_000), mem(d), vec![]).unwrap();
        let mut out = vec![0.0; 2 * d];
        let e = c.lookup_ids(&[0], &[1, 2], &[0, 2], &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        let e = c.lookup_ids(&[0, 2], &[1, 2], &[0, 2], &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownName);
        assert_eq!(c.stats().requests, 0);
    }
}
