//! The index's errors: the shared [`Error`] of `embstore-common`, and the ways an index
//! call fails, each with its kind and exact message. Every fallible call leaves the table
//! unchanged when it returns an error.

#[allow(unused_imports)]
// `Result` is here so that `crate::error::Result` reads as in other crates.
pub use embstore_common::{Error, ErrorKind, Result};

use crate::tune::BatchTuning;

/// A payload did not fit in the 52 payload bits of a bucket ([`ErrorKind::InvalidArgument`]).
pub(crate) fn payload_out_of_range(payload: u64) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "payload {payload} out of range: payloads must be < 2^52 ({})",
            crate::MAX_PAYLOAD + 1
        ),
    )
}

/// Two slices of a batch call had different lengths ([`ErrorKind::ShapeMismatch`]): `keys`
/// keys but `got` of `what` (`"payloads"`, `"out"`).
pub(crate) fn length_mismatch(what: &str, keys: usize, got: usize) -> Error {
    Error::new(ErrorKind::ShapeMismatch, format!("length mismatch: {keys} keys but {got} {what}"))
}

/// The table would need more buckets than can be addressed or allocated
/// ([`ErrorKind::Capacity`]): `slots` is the number of slots that was asked for.
pub(crate) fn capacity_overflow(slots: usize) -> Error {
    Error::new(
        ErrorKind::Capacity,
        format!("cannot allocate an index of {slots} slots: capacity overflow"),
    )
}

/// A batch tuning that is not one of [`BatchTuning::CANDIDATES`]
/// ([`ErrorKind::InvalidArgument`]).
pub(crate) fn invalid_tuning(tuning: BatchTuning) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("{tuning:?} is not a batch tuning: choose one of BatchTuning::CANDIDATES"),
    )
}
