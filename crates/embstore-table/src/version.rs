//! Row versions and the clock that issues them.
//!
//! A version is Ekko's (`../shared/papers/ekko-osdi22.txt` §4.2) pair of a timestamp and a
//! replica id. The timestamp is hybrid: milliseconds since the Unix epoch in the high 48 bits
//! and a counter in the low 16, so two updates in the same millisecond on one replica still get
//! distinct, increasing timestamps, and a clock that steps backwards never makes versions go
//! backwards. The total order is (timestamp, replica id). Version 0 means "never updated": a row
//! that holds its initial value.

use std::sync::atomic::{AtomicU64, Ordering};

/// A row's version: hybrid timestamp, then replica id — the replication protocol's own type
/// (one `Version` for the table, the sync port and the protocol's state machine).
pub use embstore_replication::Version;

/// How far past the wall clock an observed version may move a [`Clock`]: one second, more
/// than the skew of NTP-synchronised machines.
pub(crate) const MAX_OBSERVE_AHEAD_MS: u64 = 1000;

/// Milliseconds since the Unix epoch (its home is `embstore-common`).
pub use embstore_common::now_ms;

/// Issues strictly increasing versions for one replica.
#[derive(Debug)]
pub(crate) struct Clock {
    replica: u32,
    last: AtomicU64,
}

impl Clock {
    pub(crate) fn new(replica: u32) -> Self {
        Self { replica, last: AtomicU64::new(0) }
    }

    /// The replica id this clock stamps into versions.
    pub(crate) fn replica(&self) -> u32 {
        self.replica
    }

    /// The next version: the physical time, or one past the last timestamp if that is later
    /// (the protocol's rule, [`embstore_replication::next_timestamp`], applied atomically).
    pub(crate) fn tick(&self) -> Version {
        let now = now_ms();
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = embstore_replication::next_timestamp(last, now).unwrap_or(u64::MAX);
            match self.last.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Version { timestamp: next, replica: self.replica },
                Err(seen) => last = seen,
            }
        }
    }

    /// Makes later ticks exceed `v` (after an import of newer rows) — but only up to
    /// [`MAX_OBSERVE_AHEAD_MS`] past the wall clock. A version further ahead (imported from a
    /// machine whose clock runs fast) would otherwise drag every later local write's timestamp,
    /// and with it `last_update_ms` and TTL expiry, into the future; the rows that carry such a
    /// version stay ordered because a write never lowers a row's version (see `PackedMeta::write`).
    pub(crate) fn observe(&self, v: Version) {
        let cap = (now_ms() + MAX_OBSERVE_AHEAD_MS) << 16;
        self.last.fetch_max(v.timestamp.min(cap), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_increase_strictly_and_carry_the_time() {
        let clock = Clock::new(3);
        let before = now_ms();
        let mut prev = Version::default();
        for _ in 0..10_000 {
            let v = clock.tick();
            assert!(v > prev && v.replica == 3);
            prev = v;
        }
        assert!(prev.ms() >= before && prev.ms() <= now_ms() + 1);
        let near = Version { timestamp: (now_ms() + 500) << 16, replica: 0 };
        clock.observe(near);
        assert!(clock.tick() > near);
    }

    #[test]
    fn a_version_far_ahead_does_not_drag_the_clock_into_the_future() {
        let clock = Clock::new(1);
        clock.observe(Version { timestamp: (now_ms() + 3_600_000) << 16, replica: 0 });
        let v = clock.tick();
        assert!(v.ms() <= now_ms() + MAX_OBSERVE_AHEAD_MS, "clock at {} ms", v.ms());
    }
}
