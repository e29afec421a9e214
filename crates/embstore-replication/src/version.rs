//! Parameter versions and the clock that issues them (Ekko Def 1).
//!
//! A [`Version`] is `(timestamp, replica)` with `timestamp = ms << 16 | ctr`, ordered by
//! timestamp and then replica, so two replicas never issue equal versions and the larger one
//! wins a conflict (last-writer-wins). The [`Clock`] keeps one replica's timestamps strictly
//! increasing (V1) and, through [`Clock::observe`], above every version it has applied, so a
//! new primary's writes beat the old primary's after failover.
//!
//! The clock is pure: callers pass the wall-clock milliseconds, which keeps the state machine
//! and the simulation deterministic.

use embstore_common::{Error, ErrorKind, Result};

/// Bits of the timestamp below the milliseconds: the counter that separates writes issued in
/// one millisecond (65,536 per ms before the clock runs ahead of wall time).
pub const CTR_BITS: u32 = 16;

/// The largest wall-clock millisecond a timestamp can hold (`2^48 - 1`, about 8,900 years).
pub const MAX_MS: u64 = (1 << (64 - CTR_BITS)) - 1;

/// A parameter version: the derived order compares `timestamp` first, then `replica`
/// (the field order is the order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// `ms << 16 | ctr`, strictly increasing per replica.
    pub timestamp: u64,
    /// The replica that issued the version (its origin).
    pub replica: u32,
}

impl Version {
    /// The version below every issued one (an absent row).
    pub const ZERO: Version = Version { timestamp: 0, replica: 0 };

    /// A version.
    pub fn new(timestamp: u64, replica: u32) -> Self {
        Self { timestamp, replica }
    }

    /// The wall-clock milliseconds of the timestamp.
    pub fn ms(&self) -> u64 {
        self.timestamp >> CTR_BITS
    }
}

/// The timestamp a clock issues next, after `last`, at wall-clock `now_ms`: `now_ms << 16` if
/// that is larger, else `last + 1` (the counter absorbs bursts and a wall clock that steps
/// back); `None` once the timestamps are exhausted. The one rule of every clock that stamps
/// versions: this crate's [`Clock`] and the table's concurrent one.
pub fn next_timestamp(last: u64, now_ms: u64) -> Option<u64> {
    let wall = now_ms.min(MAX_MS) << CTR_BITS;
    if wall > last {
        Some(wall)
    } else {
        last.checked_add(1)
    }
}

/// One replica's hybrid clock: the last timestamp issued or observed.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    last: u64,
}

impl Clock {
    /// A clock that has issued nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last timestamp issued or observed.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// A fresh timestamp above every earlier one: `now_ms << 16` if that is larger, else the
    /// last plus one (the counter absorbs bursts and a wall clock that steps back).
    pub fn tick(&mut self, now_ms: u64) -> Result<u64> {
        if now_ms > MAX_MS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("now_ms must be at most {MAX_MS}, got {now_ms}"),
            ));
        }
        let next = next_timestamp(self.last, now_ms).ok_or_else(|| {
            Error::new(ErrorKind::Capacity, "the clock's timestamps are exhausted")
        })?;
        self.last = next;
        Ok(next)
    }

    /// Makes later ticks exceed `timestamp` (a version applied from a peer).
    pub fn observe(&mut self, timestamp: u64) {
        self.last = self.last.max(timestamp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn order_is_timestamp_then_replica() {
        assert!(Version::new(1, 9) < Version::new(2, 0));
        assert!(Version::new(2, 0) < Version::new(2, 1));
        assert_eq!(Version::new(5 << 16 | 3, 1).ms(), 5);
    }

    #[test]
    fn a_bad_now_is_an_error_not_a_panic() {
        let mut c = Clock::new();
        let e = c.tick(MAX_MS + 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(c.last(), 0);
        c.observe(u64::MAX);
        assert_eq!(c.tick(1).unwrap_err().kind(), ErrorKind::Capacity);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// V1: ticks strictly increase whatever the wall clock does, and exceed every observed
        /// timestamp.
        #[test]
        fn ticks_increase_and_pass_observed(ops in proptest::collection::vec((0u64..1000, any::<bool>(), 0u64..(2000 << 16)), 1..200)) {
            let mut c = Clock::new();
            let mut floor = 0u64;
            for (now, obs, ts) in ops {
                if obs {
                    c.observe(ts);
                    floor = floor.max(ts);
                } else {
                    let t = c.tick(now).unwrap();
                    prop_assert!(t > floor, "tick {} not above {}", t, floor);
                    floor = t;
                }
            }
        }
    }
}
