//! The disk side of a durable store: the file layer ([`vfs`]), the batched cold-read engine
//! ([`io`], public for `embstore-bench cold-reads`) and its read planning (`plan`), parameter files (`segment`) and the
//! manifest (`manifest`). `docs/storage.md` documents the formats.

pub mod io;
pub(crate) mod manifest;
pub(crate) mod plan;
pub(crate) mod segment;
pub mod vfs;
