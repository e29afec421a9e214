//! The disk side of a durable store: the file layer ([`vfs`]), the batched cold-read engine
//! ([`io`], public for `embstore-bench cold-reads`), parameter files (`segment`) and the
//! manifest (`manifest`). `docs/storage.md` documents the formats.

pub mod io;
pub(crate) mod manifest;
pub(crate) mod segment;
pub mod vfs;
