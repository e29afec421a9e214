//! The one error type of embstore: an [`ErrorKind`] to branch on and an exact message.
//!
//! Every crate returns this [`Error`]; each boundary maps the kind by one table (gRPC code in
//! the server, gRPC status back to a kind in the client, a Python class in the bindings), so
//! adding a kind means adding one row to each of those tables and their tests.
//!
//! Messages are lowercase and exact (`ids must be 1-D int64, got 2-D float32`); the message is
//! the whole `Display`, so a kind never appears in the text a user sees.

use std::fmt;
use std::sync::Arc;

/// What went wrong, for code that handles errors (each boundary maps each kind to one code or
/// class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument has a value the call cannot accept (a payload of 2^52 or more in the index,
    /// a capacity of 0 in the cache, …).
    InvalidArgument,
    /// Lengths or shapes of the arguments do not agree (`keys.len()` not a multiple of `G`,
    /// offsets that do not cover the keys, an empty request, two slices of a batch call).
    ShapeMismatch,
    /// No table has that name.
    TableNotFound,
    /// A table with that name exists already.
    TableExists,
    /// An id is not stored and the call asked for an error on a miss.
    KeyNotFound,
    /// A value or gradient is NaN or infinite.
    NonFinite,
    /// A file is not what it claims to be (bad magic, checksum, version, sizes, truncated).
    Corruption,
    /// The operating system refused an I/O call.
    Io,
    /// Memory for rows or the index could not be had (an index beyond addressable size).
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
    /// A name the call uses is not known: a policy, a codec, a table id beyond the cache's
    /// tables. (Unlike [`ErrorKind::NotFound`], nothing on disk is involved.)
    UnknownName,
    /// The backing store behind a cache failed to read rows.
    Backing,
    /// The model is being rolled back to a healthy state: its training writes are stopped
    /// until the rollback ends (retry after it, or wait for the model to be healthy).
    RollingBack,
}

impl ErrorKind {
    /// Every kind, for the tests of the boundary mappings (each must map every kind).
    pub const ALL: [ErrorKind; 19] = [
        ErrorKind::InvalidArgument,
        ErrorKind::ShapeMismatch,
        ErrorKind::TableNotFound,
        ErrorKind::TableExists,
        ErrorKind::KeyNotFound,
        ErrorKind::NonFinite,
        ErrorKind::Corruption,
        ErrorKind::Io,
        ErrorKind::Capacity,
        ErrorKind::NoSpace,
        ErrorKind::Locked,
        ErrorKind::Unsupported,
        ErrorKind::Unavailable,
        ErrorKind::Closed,
        ErrorKind::NotFound,
        ErrorKind::PermissionDenied,
        ErrorKind::UnknownName,
        ErrorKind::Backing,
        ErrorKind::RollingBack,
    ];
}

impl ErrorKind {
    /// The kind's one-byte code on every binary wire (the sync port's and the framed path's
    /// ERROR frames). Codes are a contract: a kind keeps its code forever, and a new kind
    /// takes the next free one (a peer that does not know it reads it as [`ErrorKind::Io`]).
    pub const fn code(self) -> u8 {
        match self {
            ErrorKind::InvalidArgument => 0,
            ErrorKind::ShapeMismatch => 1,
            ErrorKind::TableNotFound => 2,
            ErrorKind::NonFinite => 3,
            ErrorKind::Corruption => 4,
            ErrorKind::Io => 5,
            ErrorKind::Capacity => 6,
            ErrorKind::NoSpace => 7,
            ErrorKind::Unsupported => 8,
            ErrorKind::Unavailable => 9,
            ErrorKind::Closed => 10,
            ErrorKind::PermissionDenied => 11,
            ErrorKind::TableExists => 12,
            ErrorKind::KeyNotFound => 13,
            ErrorKind::Locked => 14,
            ErrorKind::NotFound => 15,
            ErrorKind::UnknownName => 16,
            ErrorKind::Backing => 17,
            ErrorKind::RollingBack => 18,
        }
    }

    /// The kind of a wire `code`; `None` for a code this build does not know (a newer peer's).
    pub fn from_code(code: u8) -> Option<ErrorKind> {
        ErrorKind::ALL.iter().copied().find(|k| k.code() == code)
    }
}

/// An error: a kind plus a lowercase, exact message (and the I/O error behind it, if any).
///
/// Two errors are equal when kind and message are; the I/O source is not compared (it is
/// shared behind an `Arc` so that errors stay `Clone`).
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<std::io::Error>>,
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

    /// An [`ErrorKind::InvalidArgument`] error.
    pub fn invalid(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// An [`ErrorKind::ShapeMismatch`] error.
    pub fn shape(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::ShapeMismatch, message)
    }

    /// An [`ErrorKind::Corruption`] error.
    pub fn corrupt(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Corruption, message)
    }

    /// An [`ErrorKind::UnknownName`] error.
    pub fn unknown_name(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::UnknownName, message)
    }

    /// An [`ErrorKind::Backing`] error.
    pub fn backing(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Backing, message)
    }

    /// An I/O error with message `"{context}: {err}"`; a full disk or quota (`ENOSPC`,
    /// `EDQUOT`) becomes [`ErrorKind::NoSpace`], anything else [`ErrorKind::Io`].
    pub fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                ErrorKind::NoSpace
            }
            _ => ErrorKind::Io,
        };
        Self { kind, message: format!("{context}: {err}"), source: Some(Arc::new(err)) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for Error {}

/// The result of every fallible embstore call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn kind_and_message_round_trip() {
        let e = Error::invalid("capacity must be at least 1, got 0");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "capacity must be at least 1, got 0");
        assert_eq!(e.message(), "capacity must be at least 1, got 0");
        assert_eq!(Error::shape("x").kind(), ErrorKind::ShapeMismatch);
        assert_eq!(Error::corrupt("x").kind(), ErrorKind::Corruption);
        assert_eq!(Error::unknown_name("x").kind(), ErrorKind::UnknownName);
        assert_eq!(Error::backing("x").kind(), ErrorKind::Backing);
    }

    #[test]
    fn io_maps_a_full_disk_to_no_space_and_keeps_the_source() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = Error::io("write segment 3", full);
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.to_string().starts_with("write segment 3: "), "{e}");
        assert!(e.source().is_some());
        let quota = std::io::Error::from(std::io::ErrorKind::QuotaExceeded);
        assert_eq!(Error::io("x", quota).kind(), ErrorKind::NoSpace);
        let other = std::io::Error::other("boom");
        let e = Error::io("read manifest", other);
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.to_string(), "read manifest: boom");
    }

    #[test]
    fn equality_is_kind_and_message_and_clones_are_equal() {
        let a = Error::io("x", std::io::Error::other("y"));
        assert_eq!(a.clone(), a);
        assert_eq!(a, Error::new(ErrorKind::Io, "x: y"));
        assert_ne!(a, Error::new(ErrorKind::Corruption, "x: y"));
    }

    #[test]
    fn every_kind_has_its_own_wire_code_and_reads_back() {
        let codes: std::collections::HashSet<_> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes.len(), ErrorKind::ALL.len());
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k), "{k:?}");
        }
        // The first twelve are the codes the sync port has always sent: pinned.
        assert_eq!(ErrorKind::PermissionDenied.code(), 11);
        assert_eq!(ErrorKind::Backing.code(), 17);
        assert_eq!(ErrorKind::RollingBack.code(), 18);
        assert_eq!(ErrorKind::from_code(ErrorKind::ALL.len() as u8), None);
        assert_eq!(ErrorKind::from_code(255), None);
    }

    #[test]
    fn all_lists_every_kind_once() {
        let set: std::collections::HashSet<_> = ErrorKind::ALL.iter().collect();
        assert_eq!(set.len(), ErrorKind::ALL.len());
    }
}
