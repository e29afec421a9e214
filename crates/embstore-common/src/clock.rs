//! Wall-clock time as embstore records it: milliseconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is set before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::now_ms;

    #[test]
    fn now_ms_is_after_2020_and_does_not_run_backwards_within_a_call_pair() {
        let a = now_ms();
        let b = now_ms();
        assert!(a > 1_577_836_800_000, "{a} is before 2020");
        assert!(b >= a.saturating_sub(1_000), "{b} is far before {a}");
    }
}
