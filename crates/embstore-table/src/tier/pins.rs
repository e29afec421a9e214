//! Pins: rows a caller keeps in memory until it lets go ([`Table::pin`](crate::Table::pin),
//! counted), so that no eviction drops the rows of a batch between its prefetch and its step. The
//! pinned rows of all the tables under one budget together may take at most [`MAX_PINNED_FRACTION`]
//! of it.

use std::sync::atomic::Ordering;

use super::keys::Pins;
use super::reclaim::{Evict, Report, Share};
use super::Host;
use crate::{Error, ErrorKind, Result};

/// Pinned rows, of all the tables under a budget together, may take at most this share of it
/// (the rest is for the cache).
const MAX_PINNED_FRACTION: f64 = 0.6;

/// Takes one pin of each of `ids` (counts that reach 0 leave the map).
fn unpin_locked(pins: &mut Pins, ids: &[u64]) {
    for k in ids {
        if let Some(n) = pins.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                pins.remove(k);
            }
        }
    }
}

/// Pins, for the table above the tier ([`Host`]).
pub(crate) trait Pinning: Host {
    /// Pins the rows of `ids` in memory until [`Table::unpin`](crate::Table::unpin) (counted: pin
    /// twice, unpin twice). Fails with `Capacity` if the rows pinned in all the tables under the
    /// budget would exceed 60 % of it. Returns the bytes of the rows it pinned that no pin held
    /// before (what the pins of all the tables under the budget grew by).
    fn pin(&self, ids: &[u64]) -> Result<u64> {
        let Some(tier) = self.tier() else { return Ok(0) };
        let mut pins = tier.pins.lock();
        // Optimistic: count every id in (one hash probe each, the common case), and take the
        // counts back out if the pinned rows would pass the limit.
        let before = pins.len();
        for &k in ids {
            *pins.entry(k).or_insert(0) += 1;
        }
        let row = self.evict_row_bytes();
        let limit = (tier.budget.limit() as f64 * MAX_PINNED_FRACTION) as u64;
        let added = (pins.len() - before) as u64 * row;
        // The pins of every table under the budget count (when each table checked only its
        // own, seven tables pinned 1.8 times the budget between them).
        let total = tier.budget.add_pinned(added);
        if added > 0 && total > limit {
            tier.budget.sub_pinned(added);
            let rows = pins.len() - before;
            unpin_locked(&mut pins, ids);
            return Err(Error::new(
                ErrorKind::Capacity,
                format!(
                    "pinning {rows} more rows would take {total} bytes of pinned rows, over 60 % \
                     of the memory budget ({} bytes); raise memory_budget_bytes or use smaller \
                     batches",
                    tier.budget.limit()
                ),
            ));
        }
        tier.pinned_bytes.fetch_add(added, Ordering::Relaxed);
        Ok(added)
    }

    /// Releases pins taken by [`Table::pin`](crate::Table::pin). Where the rows they held leave the
    /// store over its budget (pinned rows may pass it), evicts the excess here, so that a store
    /// comes back under its budget when training stops, with no later call.
    fn unpin(&self, ids: &[u64]) {
        let Some(tier) = self.tier() else { return };
        {
            let mut pins = tier.pins.lock();
            let before = pins.len();
            unpin_locked(&mut pins, ids);
            let freed = (before - pins.len()) as u64 * self.evict_row_bytes();
            tier.pinned_bytes.fetch_sub(freed, Ordering::Relaxed);
            tier.budget.sub_pinned(freed);
        }
        let Report { used, .. } = self.report(tier);
        let (_, over, _) = tier.budget.marks();
        if used > over {
            // A failure is noted; the next call meets it in `make_room`.
            let _ = self.evict_share(tier, false, u64::MAX, Share::Mine);
            tier.trim_if_due();
        }
    }
}

impl<H: Host> Pinning for H {}
