//! The batch-query server (docs/serving.md): it hosts shards of table versions and answers
//! `Lookup` for exactly the (table, version, shard) a request names, with its `ServerInfo`
//! on every answer, OK or not, so that shard and version facts travel in the protocol.
//!
//! ## Parts
//! - [`Server`] — what this process hosts: per table, the versions and shards it holds
//!   ([`Hosted`]), each in a [`State`]; `host`, `drain`, `unload` change it and raise `gen`.
//! - [`Serving`] — the tonic service over a `Server` (`Lookup`, `Describe`).
//! - [`Admin`] — the tonic service a roll's coordinator calls (`Load` from a checkpoint,
//!   `Drain`, `Unload`), served only when asked for.
//! - [`serve`] — runs the services on a listener until a shutdown future resolves.
//! - [`serve_framed`] — the framed lookup path (binary frames on TCP or a Unix socket), through
//!   the same checks, rows and metrics as `Lookup`.
//! - [`serve_metrics`] — `GET /metrics` in Prometheus' text format.
//! - [`to_status`] — the one mapping from table errors to gRPC codes.
//! - [`process`] — a serving process from one [`ServeConfig`](process::ServeConfig): the
//!   store, these services, membership, the sync port and a follower (`embstore serve`).
//!
//! ## Invariants
//! - A lookup is answered from the named version only; no answer mixes versions, and a server
//!   that lacks the version (or holds it under another shard count or shard) answers
//!   `FAILED_PRECONDITION` with its `ServerInfo` encoded in the status details.
//! - Missing ids get zero rows and `found = 0`; serving never inserts.
//! - A bad request gets a typed status; the server keeps serving.
//! - Every request of up to `max_batch` ids decodes ([`request_limit`]); a batch over it, or
//!   one whose answer no gRPC frame can carry, is refused `RESOURCE_EXHAUSTED` before any row
//!   is read, and counted as such, never as `ok`.
//! - A TLS identity that cannot serve (certificate and key swapped, or of two pairs) is
//!   refused by [`ServerTls::check`], naming the cause.
//!
//! ## Files
//! - `hosting` — [`Server`], [`Hosted`], [`State`], [`RowSource`], [`TierOptions`]: what is held,
//!   and loading it from checkpoints.
//! - `service` — [`Serving`], [`Admin`], the lookup path, [`to_status`], [`serve`].
//! - `framed` — [`serve_framed`], [`serve_framed_with`], [`FramedLimits`], [`FramedListener`]:
//!   the framed lookup path and its limits.
//! - `metrics` — the Prometheus metrics and [`serve_metrics`].
//! - `tls` — [`ServerTls`], the metrics port's TLS listener, and [`Tokens`].
//! - [`member`] — membership in a cluster in etcd: registration under a lease, and the
//!   reconciler that loads what the control records assign here.
//! - [`process`] — [`ServerProcess`](process::ServerProcess) composes all of the above (and
//!   `embstore-sync`'s sync port and follower) as `embstore serve` runs them.

mod endpoint;
mod framed;
mod hosting;
pub mod member;
mod metrics;
pub mod process;
mod service;
mod tls;

pub use endpoint::{serve_metrics, serve_metrics_with, MetricsText};
pub use framed::{serve_framed, serve_framed_with, FramedLimits, FramedListener};
pub use hosting::{
    Followed, FollowedReport, Hosted, RowSource, Server, State, SyncLoads, TierOptions,
};
pub use service::{
    request_limit, serve, to_status, Admin, ServeOptions, Serving, DEFAULT_MAX_BATCH,
};
pub use tls::{ServerTls, Tokens};
