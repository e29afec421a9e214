//! The policy crate's errors: the one [`Error`] of `embstore-common` (an [`ErrorKind`] to
//! branch on and an exact message), re-exported so that `crate::error::…` and
//! `embstore_policy::Error` name it. Policies raise `InvalidArgument` (a bad parameter),
//! `ShapeMismatch` (a request that does not fit its shape) and `UnknownName` (a policy name
//! that is not known).

pub use embstore_common::{Error, ErrorKind, Result};
