//! The one error type of the policy and cache crates: an [`ErrorKind`] to branch on and an
//! exact message. `embstore_cache::Error` is this type (re-exported), so the bindings map it once.

use std::fmt;

/// What went wrong, for code that handles errors (bindings map each kind to one class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument has a value the call cannot accept (capacity 0, a NaN fraction, …).
    InvalidArgument,
    /// Lengths or shapes of the arguments do not agree (`keys.len()` not a multiple of `G`,
    /// offsets that do not cover the keys, an empty request).
    ShapeMismatch,
    /// A file could not be read or written (surrogate files).
    Io,
    /// A file is not what it claims to be: bad magic, checksum, version or sizes.
    Corrupt,
    /// A name (table, policy, codec) that is not known.
    NotFound,
    /// The backing store failed to read rows.
    Backing,
}

/// An error from the policy or cache crate: a kind plus a lowercase, exact message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self { kind, message: message.to_string() }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// An [`ErrorKind::InvalidArgument`] error.
    pub fn invalid(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// An [`ErrorKind::ShapeMismatch`] error.
    pub fn shape(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::ShapeMismatch, message)
    }

    /// An [`ErrorKind::Io`] error.
    pub fn io(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Io, message)
    }

    /// An [`ErrorKind::Corrupt`] error.
    pub fn corrupt(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    /// An [`ErrorKind::Backing`] error.
    pub fn backing(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Backing, message)
    }

    /// An [`ErrorKind::NotFound`] error.
    pub fn not_found(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_message_round_trip() {
        let e = Error::invalid("capacity must be at least 1, got 0");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "capacity must be at least 1, got 0");
        assert_eq!(Error::shape("x").kind(), ErrorKind::ShapeMismatch);
    }
}
