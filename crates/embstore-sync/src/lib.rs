//! # embstore-sync: dissemination between processes
//!
//! Fresh rows move from the store that trains to every inference replica by *pulling*: a
//! replica asks a peer which sync parts changed since its cursor, pulls the rows of those parts
//! newer than its version vectors, and applies them last-writer-wins (Ekko, OSDI '22; the
//! protocol's state lives in `embstore-table`'s `sync` module, its pure model and simulation in
//! `embstore-replication`). This crate is the wire between processes:
//!
//! - [`SyncServer`]: a store's sync port (one thread per connection);
//! - [`Follower`]: keeps a store's tables current from a peer's port, one pulling thread per
//!   table, and reports where each stands ([`TableSync`]);
//! - [`discovery`]: membership in etcd and the WAN-aware choice of source (a leader per data
//!   centre and table pulls from a primary; the others pull from their leader);
//! - [`wire`]: the framed, checksummed format (length, kind, CRC-32, body); bulk rows travel as
//!   raw little-endian columns, not protobuf, which costs 2–3× the CPU for the same rows.

pub mod discovery;
pub mod follower;
pub mod server;
pub mod tls;
pub mod wire;

pub use discovery::{Directory, Member};
pub use embstore_proto::tls::{ClientTls, ServerTls};
pub use embstore_table::sync::Target;
pub use follower::{CatchUpMark, FollowOptions, Follower, Source, StatusView, TableSync};
pub use server::{ServeOptions, ServerStats, SyncServer};
