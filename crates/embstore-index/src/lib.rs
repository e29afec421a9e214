//! # embstore-index: NeighborHash
//!
//! The map every embstore row is found through: any `u64` key (0 and `u64::MAX` included) to a
//! payload below 2^52 (a memory slot or a file location). It is the NeighborHash of
//! "NeighborHash: an efficient cache-friendly hash table for recommendation systems"
//! (CIKM '24, §2.1), built for batch lookups of feature ids.
//!
//! ## Parts
//! - [`bucket`](crate::bucket) — one flat, 64-byte-aligned array of 16-byte buckets (key, value
//!   word), four to a cacheline, mapped with transparent huge pages when large. The value word's
//!   high 12 bits hold the signed offset to the next node of the bucket's chain (*inline
//!   chaining*); the low 52 bits hold the payload. An empty bucket is marked by a zero link field,
//!   so all keys stay storable and zeroed memory is an empty table.
//! - [`neighbor_hash`](crate::neighbor_hash) — [`NeighborHash`]: insert with *lodger relocation* (a key whose home
//!   bucket is held by a key from another home evicts that lodger to a free bucket and relinks
//!   its chain; a key whose home holds a host joins the host's chain), *cacheline-aware neighbour
//!   probing* for free buckets (the head's cacheline first, then the tail's, then outward both
//!   ways, nearest first), chain-preserving delete, growth (doubling while under 1 MiB, then
//!   steps of 1.15x, so that the average table stays 93 % as full as the maximum load allows),
//!   [`Stats`] and an invariant checker. Any slot count works: a key's home is the high bits of
//!   its hash scaled to the slot count (`(hash * slots) >> 64`).
//! - [`batch`](crate::batch) — [`NeighborHash::get_batch`] and
//!   [`NeighborHash::contains_batch`]: a software pipeline that hashes and prefetches 64 or 128
//!   keys ahead, with the rare lookups that leave their home cacheline deferred in a small FIFO.
//! - [`tune`](crate::tune) — [`BatchTuning`]: how far ahead the pipeline prefetches and into
//!   which cache level, chosen by each large table from the timings of its own batches.
//! - [`hash`] — the home hash [`MulXor`](hash::MulXor) (one multiply, one shift-xor; the
//!   default), [`Fmix64`](hash::Fmix64), and `fmix64` for blocks of keys, scalar and AVX2
//!   (runtime-detected).
//! - [`mem`] — zeroed, 2 MiB-aligned maps with transparent-huge-page advice, for this table's
//!   buckets and any other large array read at random.
//!
//! ## Invariants
//! - Every key sits on the chain that starts at its home bucket, and that bucket holds a key of
//!   that home (no cellar; chains never mix homes), so a present key is found on its own chain,
//!   and a lookup walks at most one chain.
//! - Neighbouring chain nodes are at most [`MAX_OFFSET`] (2047) buckets apart; chains are acyclic.
//! - `len` never exceeds `max_load_factor × capacity`.
//! - An empty bucket is all zero, and an occupied bucket's value word never is.
//! - Every fallible call validates its input first and changes nothing when it fails.
//!
//! ## Concurrency
//! Readers share `&self`; writers hold `&mut self`. The table layer shards keys across indexes.

mod batch;
mod bucket;
mod error;
pub mod hash;
pub mod mem;
mod neighbor_hash;
mod tune;

pub use batch::MISSING;
pub use bucket::{BUCKET_BYTES, MAX_OFFSET};
pub use error::{Error, ErrorKind};
pub use neighbor_hash::{Config, NeighborHash, Stats};
pub use tune::{
    BatchTuning, DEFAULT_RING, EXPLORE_EVERY, EXPLORE_WINDOW, SWITCH_BELOW, TUNE_FROM_SLOTS,
    TUNE_MIN_KEYS, TUNE_ROUNDS,
};

/// The largest payload: 2^52 − 1.
pub const MAX_PAYLOAD: u64 = (1 << 52) - 1;
