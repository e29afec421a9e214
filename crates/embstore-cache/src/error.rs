//! The cache's error type is the policy crate's: one type, so a policy's error is the cache's.
pub use embstore_policy::{Error, ErrorKind, Result};
