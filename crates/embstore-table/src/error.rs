//! The one error type of the table layer: an [`ErrorKind`] to branch on and an exact message.

use std::fmt;

/// What went wrong, for code that handles errors (the bindings map each kind to one class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument has a value the call cannot accept.
    InvalidArgument,
    /// Lengths or shapes of the arguments do not agree.
    ShapeMismatch,
    /// No table has that name.
    TableNotFound,
    /// A table with that name exists already.
    TableExists,
    /// An id is not stored and the call asked for an error on a miss.
    KeyNotFound,
    /// A value or gradient is NaN or infinite.
    NonFinite,
    /// A file is not what it claims to be (bad magic, checksum, truncated).
    Corruption,
    /// The operating system refused an I/O call.
    Io,
    /// Memory for rows or the index could not be had.
    Capacity,
    /// The disk is full (or over quota): nothing acknowledged was lost, and the store stays
    /// readable; writing resumes once space is freed.
    NoSpace,
    /// The store directory is open in another process (or another `Store` of this one).
    Locked,
    /// A file was written by a newer format version than this build reads.
    Unsupported,
    /// A server could not be reached or could not serve the request (no replica holds the
    /// version, a deadline passed); retrying later may succeed.
    Unavailable,
    /// The table's store was closed: its handles take no more calls (open the store again).
    Closed,
    /// A file or directory the call names does not exist (a checkpoint path with a typo).
    NotFound,
    /// A server refused the call: no token, a wrong one, or a read-only token for an admin
    /// call.
    PermissionDenied,
}

/// An error from the table layer: a kind plus a lowercase, exact message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<std::io::Error>,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self { kind, message: message.to_string(), source: None }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn shape(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::ShapeMismatch, message)
    }

    pub(crate) fn corrupt(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Corruption, message)
    }

    /// An I/O error; a full disk or quota (`ENOSPC`, `EDQUOT`) becomes [`ErrorKind::NoSpace`].
    pub(crate) fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                ErrorKind::NoSpace
            }
            _ => ErrorKind::Io,
        };
        Self { kind, message: format!("{context}: {err}"), source: Some(err) }
    }
}

impl From<embstore_index::Error> for Error {
    fn from(err: embstore_index::Error) -> Self {
        Self::new(ErrorKind::Capacity, err)
    }
}

/// A replacement policy's error (an eviction config that does not validate), same message.
/// An unknown policy name is an invalid argument here, as in the bindings.
impl From<embstore_policy::Error> for Error {
    fn from(err: embstore_policy::Error) -> Self {
        use embstore_policy::ErrorKind as P;
        let kind = match err.kind() {
            P::ShapeMismatch => ErrorKind::ShapeMismatch,
            P::Corrupt => ErrorKind::Corruption,
            P::Io | P::Backing => ErrorKind::Io,
            _ => ErrorKind::InvalidArgument,
        };
        Self::new(kind, err.message())
    }
}

/// The result of every fallible table call.
pub type Result<T, E = Error> = std::result::Result<T, E>;
