//! # embstore-common: the shared vocabulary
//!
//! What two or more embstore crates must agree on lives here, below all of them, so that the
//! data-plane client does not link the storage engine for one function. The parts:
//!
//! - [`error`]: the one [`Error`] (`kind` + exact lowercase message) and its
//!   `#[non_exhaustive]` [`ErrorKind`]; every boundary (gRPC, Python) maps it by one table,
//!   and every binary wire carries it by one code ([`ErrorKind::code`]).
//! - [`bytes`]: the little-endian [`Writer`](bytes::Writer) and [`Reader`](bytes::Reader) of
//!   every binary frame and file record, and the constant-time [`same_secret`].
//! - [`shard`]: [`shard_of_key`], the sharding contract client and server agree on, and
//!   [`owner_of`], the process of a distributed training store that owns an id (twin of the
//!   Python package's). Their placements are pinned by tests: changing them would misroute a
//!   running cluster or strand a distributed checkpoint's rows.
//! - [`hash`]: MurmurHash3's 64-bit finaliser [`fmix64`] and a `Hasher` over it.
//! - [`clock`]: [`now_ms`], wall-clock milliseconds.
//! - [`rand`]: [`SplitMix64`], the seeded generator that traces, benchmarks and tests share, so
//!   a printed seed replays a run on every platform.
//!
//! Invariants: no dependency beyond std, no other embstore crate, and nothing here changes an
//! output for a given input across versions (hashes, placements and streams are contracts).

pub mod bytes;
pub mod clock;
pub mod error;
pub mod hash;
pub mod rand;
pub mod shard;

pub use bytes::same_secret;
pub use clock::now_ms;
pub use error::{Error, ErrorKind, Result};
pub use hash::{fmix64, FmixHasher};
pub use rand::SplitMix64;
pub use shard::{owner_of, shard_of_key};
