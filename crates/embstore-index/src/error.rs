//! The index's error type.

use std::fmt;

/// What went wrong in an index call. Every fallible call leaves the table unchanged when it
/// returns an error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A payload did not fit in the 52 payload bits of a bucket.
    PayloadOutOfRange {
        /// The rejected payload.
        payload: u64,
    },
    /// Two slices of a batch call had different lengths.
    LengthMismatch {
        /// What the second slice holds (`"payloads"`, `"out"`).
        what: &'static str,
        /// Number of keys.
        keys: usize,
        /// Length of the second slice.
        got: usize,
    },
    /// The table would need more buckets than can be addressed or allocated.
    CapacityOverflow {
        /// The number of slots that was asked for.
        slots: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::PayloadOutOfRange { payload } => write!(
                f,
                "payload {payload} out of range: payloads must be < 2^52 ({})",
                crate::MAX_PAYLOAD + 1
            ),
            Error::LengthMismatch { what, keys, got } => {
                write!(f, "length mismatch: {keys} keys but {got} {what}")
            }
            Error::CapacityOverflow { slots } => {
                write!(f, "cannot allocate an index of {slots} slots: capacity overflow")
            }
        }
    }
}

impl std::error::Error for Error {}
