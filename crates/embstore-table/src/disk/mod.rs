//! The disk side of a durable store: the file layer ([`vfs`]), parameter files
//! ([`segment`]) and the manifest ([`manifest`]). `docs/storage.md` documents the formats.

pub(crate) mod io;
pub(crate) mod manifest;
pub(crate) mod segment;
pub mod vfs;
