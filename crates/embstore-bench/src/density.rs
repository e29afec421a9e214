//! `embstore-bench index --density`: the index's memory per key while it grows, measured as RSS.
//!
//! One `NeighborHash` (default configuration: load 0.8, huge pages) grows from empty to
//! `--density-max` keys (default 100M) by `insert_batch` of random keys made on the fly (no key
//! array, so the process holds little else). At sizes spaced evenly on a log scale from
//! `--density-min` (default 1M) — `--density-points` per decade (default 20) — it reads the
//! process's anonymous resident memory (`RssAnon`, after `malloc_trim` hands freed heap pages
//! back) and reports `(RSS - RSS before the index) / keys`. The mean over those sizes is the
//! average bytes per key over the range (each size weighs the same on a log scale). Beside it: the
//! bucket array alone (`capacity * 16 / keys`) and what growth by doubling would give (the
//! power-of-two slot count that a doubling table at the same maximum load has at that size).

use std::time::Instant;

use embstore_common::SplitMix64;
use embstore_index::NeighborHash;

/// One sample of the growth.
struct Sample {
    keys: usize,
    capacity: usize,
    rss_bytes: f64,
}

/// `RssAnon` of this process, in bytes.
fn rss_anon() -> Result<f64, String> {
    let text = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("{e}"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .ok_or("no RssAnon in /proc/self/status")?;
    let kb: f64 =
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).ok_or("unreadable RssAnon")?;
    Ok(kb * 1024.0)
}

/// Hands freed heap memory back to the kernel, so that RSS counts what is in use.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it has no other effect.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sizes from `min` to `max`, `per_decade` per factor of 10, rounded to whole keys.
pub(crate) fn sizes(min: usize, max: usize, per_decade: usize) -> Vec<usize> {
    let step = 10f64.powf(1.0 / per_decade.max(1) as f64);
    let mut v = vec![];
    let mut x = min.max(1) as f64;
    while x.round() as usize <= max {
        let n = x.round() as usize;
        if v.last() != Some(&n) {
            v.push(n);
        }
        x *= step;
    }
    v
}

/// Slots of a table that doubles from 8 and grows when `keys` would pass `load * slots`.
pub(crate) fn doubling_slots(keys: usize, load: f64) -> usize {
    let mut slots = 8usize;
    while (slots as f64 * load) < keys as f64 {
        slots *= 2;
    }
    slots
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    s / n.max(1) as f64
}

/// Runs the density measurement (see the module docs).
pub(crate) fn run(
    min: usize,
    max: usize,
    per_decade: usize,
    seed: u64,
    json: bool,
) -> Result<(), String> {
    if min == 0 || max < min {
        return Err(format!("--density-min {min} / --density-max {max}: need 0 < min <= max"));
    }
    let targets = sizes(min, max, per_decade);
    const CHUNK: usize = 1 << 16;
    let mut keys = vec![0u64; CHUNK];
    let payloads: Vec<u64> = (0..CHUNK as u64).collect();
    let mut rng = SplitMix64::new(seed);
    trim();
    let base = rss_anon()?;
    let mut index = NeighborHash::new();
    let load = index.config().max_load_factor;
    let t0 = Instant::now();
    let mut samples = Vec::with_capacity(targets.len());
    for &target in &targets {
        while index.len() < target {
            let n = (target - index.len()).min(CHUNK);
            for k in &mut keys[..n] {
                *k = rng.next_u64();
            }
            index.insert_batch(&keys[..n], &payloads[..n]).map_err(|e| e.to_string())?;
        }
        trim();
        let rss = rss_anon()? - base;
        samples.push(Sample { keys: index.len(), capacity: index.capacity(), rss_bytes: rss });
        if !json {
            eprintln!(
                "  {:>11} keys: {:>11} slots, RSS {:>8.1} MiB ({:.1} s)",
                index.len(),
                index.capacity(),
                rss / (1 << 20) as f64,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let rss_per_key = mean(samples.iter().map(|s| s.rss_bytes / s.keys as f64));
    let array_per_key = mean(samples.iter().map(|s| (s.capacity * 16) as f64 / s.keys as f64));
    let doubling_per_key =
        mean(samples.iter().map(|s| (doubling_slots(s.keys, load) * 16) as f64 / s.keys as f64));
    let max_rss = samples.iter().map(|s| s.rss_bytes / s.keys as f64).fold(0.0, f64::max);
    if json {
        for s in &samples {
            let line = serde_json::json!({
                "bench": "index_density_sample", "keys": s.keys, "capacity": s.capacity,
                "rss_bytes": s.rss_bytes, "rss_bytes_per_key": s.rss_bytes / s.keys as f64,
                "doubling_bytes_per_key": (doubling_slots(s.keys, load) * 16) as f64 / s.keys as f64,
            });
            println!("{line}");
        }
        let line = serde_json::json!({
            "bench": "index_density", "min_keys": min, "max_keys": max, "samples": samples.len(),
            "rss_bytes_per_key_mean": rss_per_key, "rss_bytes_per_key_max": max_rss,
            "array_bytes_per_key_mean": array_per_key,
            "doubling_bytes_per_key_mean": doubling_per_key, "insert_seconds": secs,
        });
        println!("{line}");
        return Ok(());
    }
    println!(
        "index density: {} sizes from {min} to {max} keys ({per_decade} per decade), load {load}, \
         inserts {:.1} s in all",
        samples.len(),
        secs
    );
    println!(
        "  bytes per key, mean over the sizes: RSS {rss_per_key:.2} (max {max_rss:.2}), \
         bucket array {array_per_key:.2}; growth by doubling would hold {doubling_per_key:.2}"
    );
    println!(
        "  goal: <= 22 B per key averaged over the range: {}",
        if rss_per_key <= 22.0 { "met" } else { "NOT met" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_log_spaced_and_bounded() {
        let s = sizes(1000, 100_000, 10);
        assert_eq!((s[0], s.len()), (1000, 21));
        assert_eq!(*s.last().unwrap(), 100_000);
        assert!(s.windows(2).all(|w| w[1] > w[0]));
        assert_eq!(sizes(5, 5, 3), vec![5]);
    }

    #[test]
    fn doubling_reference_is_a_power_of_two_at_the_load() {
        assert_eq!(doubling_slots(800, 0.8), 1024);
        assert_eq!(doubling_slots(820, 0.8), 2048);
        assert_eq!(doubling_slots(1, 0.8), 8);
    }

    /// A small run: the index's RSS per key is finite, and the sampled sizes are reached.
    #[test]
    fn a_small_density_run_completes() {
        run(10_000, 40_000, 4, 7, true).unwrap();
        assert!(run(0, 10, 4, 7, true).is_err());
    }
}
