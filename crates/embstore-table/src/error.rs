//! The table layer's errors: the one [`Error`] of `embstore-common` (an [`ErrorKind`] to branch
//! on and an exact message), re-exported so that `crate::error::…` and `embstore_table::Error`
//! keep naming it. Index errors pass through unchanged: the index reports a capacity overflow
//! as [`ErrorKind::Capacity`], and the table never hands it a payload or slice it would reject.

pub use embstore_common::{Error, ErrorKind, Result};
