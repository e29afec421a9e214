//! The cache crate's errors: the one [`Error`] of `embstore-common` (an [`ErrorKind`] to branch
//! on and an exact message), re-exported so that `crate::error::…` and `embstore_cache::Error`
//! keep naming it. The cache raises `InvalidArgument`, `ShapeMismatch`, `Io`, `Corruption`
//! (surrogate files), `UnknownName` (a policy, codec or table the cache does not know) and
//! `Backing` (the backing store failed to read rows).

pub use embstore_common::{Error, ErrorKind, Result};
